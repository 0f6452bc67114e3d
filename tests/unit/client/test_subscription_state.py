"""The consumer's SubscriptionState: assignment order, fetch tasks started/stopped once, positions to commit."""

from __future__ import annotations

from gregor.client.subscription_state import PartitionState, SubscriptionState


def make() -> tuple[SubscriptionState, list[tuple[str, object]]]:
    calls: list[tuple[str, object]] = []
    subs = SubscriptionState(start=lambda tp: calls.append(("start", tp)),
                             stop=lambda state: calls.append(("stop", state)),
                             on_change=lambda: calls.append(("wake", None)))
    return subs, calls


def test_manual_assignment_replaces_and_starts_only_new_partitions() -> None:
    subs, calls = make()
    assert subs.assign([("t", 1), ("t", 0), ("t", 1)]) == [("t", 1), ("t", 0)]
    kept = subs.states[("t", 0)]
    calls.clear()
    assert subs.assign([("t", 0), ("u", 0)]) == [("u", 0)]
    assert subs.assignment() == [("t", 0), ("u", 0)] and subs.states[("t", 0)] is kept
    assert [c[0] for c in calls] == ["stop", "start"] and calls[1][1] == ("u", 0)


def test_group_assignment_positions_and_revocation() -> None:
    subs, calls = make()
    assert subs.add_assigned([("t", 0), ("t", 1)], {("t", 0): 42}) == [("t", 0), ("t", 1)]
    assert subs.add_assigned([("t", 0)], {("t", 0): 7}) == []  # already owned: position kept
    assert subs.consumed_positions() == {("t", 0): 42}  # no position yet for t-1: nothing to commit
    assert subs.states[("t", 0)].committed_checked
    subs.remove([("t", 0)])
    assert subs.assignment() == [("t", 1)] and ("t", 0) not in subs.states
    assert isinstance(calls[-1][1], PartitionState) and calls[-1][0] == "stop"
    subs.notify()
    assert calls[-1] == ("wake", None)
