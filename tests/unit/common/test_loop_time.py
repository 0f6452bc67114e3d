"""Timed (common/loop_time.py): the loop time of a coroutine's steps, never the time it is suspended."""

from __future__ import annotations

import asyncio

import pytest

from gregor.common import loop_time
from gregor.common.loop_time import Timed


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(loop_time.time, "perf_counter", fake)
    return fake


def test_counts_the_steps_and_not_the_waits(clock: FakeClock) -> None:
    async def handler() -> str:
        clock.now += 5  # work in the first step
        await asyncio.sleep(0)  # suspended: the other task's time passes meanwhile
        clock.now += 3
        await asyncio.sleep(0)
        return "done"

    async def other() -> None:
        for _ in range(3):
            clock.now += 100
            await asyncio.sleep(0)

    async def main() -> tuple[str, float]:
        timed = Timed(handler())
        result, _ = await asyncio.gather(timed, other())
        return result, timed.seconds

    assert asyncio.run(main()) == ("done", 8)


def test_an_exception_is_raised_through_and_its_time_kept(clock: FakeClock) -> None:
    async def handler() -> None:
        clock.now += 2
        await asyncio.sleep(0)
        clock.now += 1
        raise ValueError("bad request")

    async def main() -> float:
        timed = Timed(handler())
        with pytest.raises(ValueError, match="bad request"):
            await timed
        return timed.seconds

    assert asyncio.run(main()) == 3


def test_cancellation_reaches_the_coroutine() -> None:
    cleaned: list[bool] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)

    async def main() -> None:
        task = asyncio.ensure_future(Timed(handler()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cleaned == [True]


def test_a_future_result_reaches_the_coroutine() -> None:
    async def handler(fut: "asyncio.Future[int]") -> int:
        return await fut + 1

    async def main() -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 41)
        return await Timed(handler(fut))

    assert asyncio.run(main()) == 42
