"""DelayedOperationPurgatory: completion on check, expiry on timeout, errors reach the waiter."""

from __future__ import annotations

import asyncio

import pytest

from gregor.broker.purgatory import DelayedOperation, DelayedOperationPurgatory


class WaitFor(DelayedOperation[str]):
    def __init__(self, delay_ms: int, state: dict[str, int], target: int) -> None:
        super().__init__(delay_ms)
        self.state, self.target, self.expired = state, target, False

    def try_complete(self) -> bool:
        return self.force_complete() if self.state["value"] >= self.target else False

    def on_expiration(self) -> None:
        self.expired = True

    def on_complete(self) -> str:
        if self.state.get("boom"):
            raise ValueError("boom")
        return "expired" if self.expired else f"reached {self.state['value']}"


async def test_completes_at_once_when_condition_already_holds() -> None:
    p: DelayedOperationPurgatory[str] = DelayedOperationPurgatory("t1")
    op = WaitFor(1000, {"value": 5}, 3)
    assert p.try_complete_else_watch(op, ["k"]) is True
    assert await op.future == "reached 5"
    assert p.size() == 0


async def test_check_and_complete_wakes_only_satisfied_watchers() -> None:
    p: DelayedOperationPurgatory[str] = DelayedOperationPurgatory("t2")
    state = {"value": 0}
    low, high = WaitFor(5000, state, 1), WaitFor(5000, state, 10)
    assert not p.try_complete_else_watch(low, ["k"])
    assert not p.try_complete_else_watch(high, ["k"])
    assert p.size() == 2
    state["value"] = 2
    assert p.check_and_complete("k") == 1
    assert await low.future == "reached 2"
    assert not high.is_completed and p.size() == 1
    assert p.check_and_complete("other") == 0
    state["value"] = 10
    assert p.check_and_complete("k") == 1
    await high.future
    assert p.size() == 0


async def test_expiry_completes_with_expiration_result() -> None:
    p: DelayedOperationPurgatory[str] = DelayedOperationPurgatory("t3")
    op = WaitFor(50, {"value": 0}, 1)
    p.try_complete_else_watch(op, ["k"])
    assert await asyncio.wait_for(op.future, 2) == "expired"
    assert p.size() == 0


async def test_error_in_on_complete_goes_to_the_waiter_and_cancel_all_fails_everyone() -> None:
    p: DelayedOperationPurgatory[str] = DelayedOperationPurgatory("t4")
    state = {"value": 0, "boom": 1}
    op = WaitFor(5000, state, 1)
    p.try_complete_else_watch(op, ["k"])
    state["value"] = 1
    p.check_and_complete("k")
    with pytest.raises(ValueError):
        await op.future
    stuck = WaitFor(5000, {"value": 0}, 1)
    p.try_complete_else_watch(stuck, ["a", "b"])
    p.cancel_all(RuntimeError("shutdown"))
    with pytest.raises(RuntimeError):
        await stuck.future


class Counted(WaitFor):
    """WaitFor that counts its checks, and is told which key changed."""

    def __init__(self, delay_ms: int, state: dict[str, int], target: int) -> None:
        super().__init__(delay_ms, state, target)
        self.checks: list[object] = []

    def try_complete(self) -> bool:
        self.checks.append("all")
        return super().try_complete()

    def try_complete_for(self, key: object) -> bool:
        self.checks.append(key)
        return super().try_complete_for(key)


async def test_a_checked_watch_skips_both_checks_and_a_key_change_names_its_key() -> None:
    p: DelayedOperationPurgatory[str] = DelayedOperationPurgatory("t5")
    state = {"value": 0}
    op = Counted(5000, state, 1)
    assert p.try_complete_else_watch(op, ["a", "b"], checked=True) is False
    assert op.checks == [] and p.size() == 2  # watched under both keys, never checked
    state["value"] = 1
    assert p.check_and_complete("b") == 1
    assert op.checks == ["b", "all"]  # the default try_complete_for falls back to the whole check
    assert await op.future == "reached 1"
