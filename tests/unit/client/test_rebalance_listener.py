"""Rebalance-listener sequencing of GroupMember (seed 003, 6.5.2-6.5.3): eager, cooperative, lost.

The member's RPCs are not involved: these drive the join-prepare / join-complete steps
directly with a recording consumer, so only the ordering logic is under test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import pytest

from gregor.client.config import consumer_config
from gregor.client.group_membership import ConsumerRebalanceListener, GroupMember
from gregor.client.metadata import ClusterMetadata
from gregor.client.subscription_state import SubscriptionState

A0, A1, A2 = ("a", 0), ("a", 1), ("a", 2)


class RecordingSubscriptions(SubscriptionState):
    """The real SubscriptionState, recording each assignment change into a shared event log (no fetch tasks)."""

    def __init__(self, events: list[tuple[str, list[Any]]]) -> None:
        super().__init__(start=lambda tp: None, stop=lambda state: None, on_change=lambda: None)
        self.events = events

    def add_assigned(self, tps: Sequence[tuple[str, int]],
                     positions: Optional[Mapping[tuple[str, int], Optional[int]]]) -> list[tuple[str, int]]:
        self.events.append(("fetch+", sorted(tps)))
        return super().add_assigned(tps, positions)

    def remove(self, tps: Sequence[tuple[str, int]]) -> None:
        self.events.append(("fetch-", sorted(tps)))
        super().remove(tps)

    def consumed_positions(self) -> dict[tuple[str, int], int]:
        return {tp: 10 for tp in self.states}


class RecordingConsumer:
    """Stands in for Consumer: its SubscriptionState is what GroupMember changes."""

    def __init__(self, events: list[tuple[str, list[Any]]]) -> None:
        self.metadata = ClusterMetadata(["127.0.0.1:1"], client_id="consumer-g-1")  # never connects
        self.events = events
        self.subscriptions = RecordingSubscriptions(events)

    @property
    def fetching(self) -> set[tuple[str, int]]:
        return set(self.subscriptions.states)


class Recorder(ConsumerRebalanceListener):
    def __init__(self, events: list[tuple[str, list[Any]]]) -> None:
        self.events = events

    def on_partitions_revoked(self, partitions: list[tuple[str, int]]) -> None:
        self.events.append(("revoked", partitions))

    def on_partitions_assigned(self, partitions: list[tuple[str, int]]) -> None:
        self.events.append(("assigned", partitions))

    def on_partitions_lost(self, partitions: list[tuple[str, int]]) -> None:
        self.events.append(("lost", partitions))


def member(strategy: str, events: list[tuple[str, list[Any]]], auto_commit: bool = True) -> GroupMember:
    cfg = consumer_config({"bootstrap.servers": "127.0.0.1:1", "group.id": "g",
                           "partition.assignment.strategy": strategy, "enable.auto.commit": auto_commit})
    consumer = RecordingConsumer(events)
    m = GroupMember(consumer.subscriptions, consumer.metadata, cfg)  # type: ignore[arg-type]
    m.consumer = consumer  # type: ignore[attr-defined]  # for the assertions on what it fetches
    m.listener = Recorder(events)
    m.generation = 3

    async def committed(tps: Any) -> dict[Any, Optional[int]]:
        return {tp: None for tp in tps}

    async def commit(offsets: Any, metadata: str = "") -> None:
        events.append(("commit", sorted(offsets)))

    m.committed = committed  # type: ignore[method-assign]
    m.commit = commit  # type: ignore[method-assign]
    return m


async def own(m: GroupMember, tps: list[tuple[str, int]]) -> None:
    await m._on_join_complete(tps)


def test_eager_revokes_everything_before_joining_then_assigns_the_whole_assignment() -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member("range", events)

    async def go() -> None:
        await own(m, [A0, A1])
        events.clear()
        await m._revoke_all(leaving=False)  # what _rebalance does before JoinGroup (eager)
        await m._on_join_complete([A1, A2])

    asyncio.run(go())
    # Commit first (auto-commit), revoke all while still assigned (Kafka: the listener may commit or read
    # positions of what it loses), then stop fetching; then fetch and announce the full new set.
    assert events == [("commit", [A0, A1]), ("revoked", [A0, A1]), ("fetch-", [A0, A1]),
                      ("fetch+", [A1, A2]), ("assigned", [A1, A2])]
    assert m.previous == [A0, A1]  # what the sticky assignors get as this member's previous ownership


def test_cooperative_revokes_only_what_moved_and_keeps_the_rest_fetching() -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member("cooperative-sticky", events)

    async def go() -> None:
        await own(m, [A0, A1])
        events.clear()
        m.need_rejoin = False
        await m._on_join_complete([A1, A2])

    asyncio.run(go())
    assert events == [("commit", [A0]), ("revoked", [A0]), ("fetch-", [A0]), ("fetch+", [A2]), ("assigned", [A2])]
    assert A1 in m.consumer.fetching  # type: ignore[attr-defined]
    assert m.owned == [A1, A2]
    assert m.need_rejoin  # revoked something: the follow-up rebalance hands it over


def test_cooperative_without_revocation_calls_assigned_with_only_the_new_and_no_rejoin() -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member("cooperative-sticky", events)

    async def go() -> None:
        await own(m, [A0])
        events.clear()
        m.need_rejoin = False
        await m._on_join_complete([A0, A1])
        await m._on_join_complete([A0, A1])

    asyncio.run(go())
    assert events == [("fetch+", [A1]), ("assigned", [A1]), ("fetch+", []), ("assigned", [])]
    assert not m.need_rejoin


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_lost_generation_calls_lost_without_committing(strategy: str) -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member(strategy, events)

    async def go() -> None:
        await own(m, [A0, A1])
        events.clear()
        m._reset_generation(forget_member_id=True)  # e.g. heartbeat answered UNKNOWN_MEMBER_ID
        assert m.lost_pending and m.need_rejoin and m.member_id == "" and m.generation == -1
        await m._lose_all()

    asyncio.run(go())
    assert events == [("lost", [A0, A1]), ("fetch-", [A0, A1])]
    assert m.owned == []


def test_default_on_partitions_lost_delegates_to_revoked() -> None:
    seen: list[list[tuple[str, int]]] = []

    class OnlyRevoked(ConsumerRebalanceListener):
        def on_partitions_revoked(self, partitions: list[tuple[str, int]]) -> None:
            seen.append(partitions)

    OnlyRevoked().on_partitions_lost([A0])
    assert seen == [[A0]]


def test_async_listener_is_awaited_and_listener_errors_surface_from_poll() -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member("range", events, auto_commit=False)

    class Async(ConsumerRebalanceListener):
        async def on_partitions_assigned(self, partitions: list[tuple[str, int]]) -> None:
            await asyncio.sleep(0)
            events.append(("async-assigned", partitions))
            raise ValueError("boom")

    m.listener = Async()

    async def go() -> None:
        await m._on_join_complete([A0])
        with pytest.raises(ValueError, match="boom"):
            await m.on_poll(0)

    asyncio.run(go())
    assert ("async-assigned", [A0]) in events
    assert m.owned == [A0]  # the rebalance completed despite the listener's failure


def test_eager_rebalance_calls_revoked_even_when_empty_but_not_before_the_first_join() -> None:
    events: list[tuple[str, list[Any]]] = []
    m = member("range", events)

    async def go() -> None:
        m.generation = -1
        await m._revoke_all(leaving=False)  # first join: no generation yet, no callback
        assert events == []
        m.generation = 1
        await m._revoke_all(leaving=False)  # a later eager rebalance: always called (Kafka's contract)
        await m._revoke_all(leaving=True)  # close/unsubscribe with nothing owned: not called

    asyncio.run(go())
    assert events == [("revoked", [])]


def test_a_failed_offset_fetch_leaves_the_committed_offset_to_be_asked_again_not_auto_offset_reset() -> None:
    """Kafka never falls back to auto.offset.reset because an OffsetFetch failed (that skips or repeats what the
    group committed): the partitions are assigned without a position and with their committed offset still to
    be looked up, which each fetch task does with retries (Consumer._initial_position)."""
    from gregor.common import errors

    events: list[tuple[str, list[Any]]] = []
    m = member("range", events)

    async def failing(tps: Any) -> dict[Any, Optional[int]]:
        raise errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE, "coordinator moving")

    async def committed_at_7(tps: Any) -> dict[Any, Optional[int]]:
        return {tp: 7 for tp in tps}

    async def go() -> None:
        m.committed = failing  # type: ignore[method-assign]
        await own(m, [A0])
        m.committed = committed_at_7  # type: ignore[method-assign]
        await own(m, [A1])

    asyncio.run(go())
    states = m.consumer.subscriptions.states  # type: ignore[attr-defined]
    assert states[A0].position is None and not states[A0].committed_checked  # asked again by its fetch task
    assert states[A1].position == 7 and states[A1].committed_checked
