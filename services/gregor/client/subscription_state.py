"""The consumer's assignment and each assigned partition's position (Kafka's SubscriptionState).

The Consumer owns one; GroupMember changes the assignment only through its public
methods (on a rebalance) and reads the consumed positions from it to commit.
Concurrency: event-loop owned, like the Consumer; the fetch tasks are the Consumer's,
started and stopped through the callbacks given here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from gregor.common import errors

if TYPE_CHECKING:
    from gregor.client.consumer import ConsumerRecord

TopicPartition = tuple[str, int]


class PartitionState:
    """Position and prefetched records of one assigned partition."""

    __slots__ = ("position", "fetch_offset", "buffer", "buffered_bytes", "task", "error", "high_watermark",
                 "log_start_offset", "generation", "reset", "committed_checked", "topic_id", "resetting")

    def __init__(self) -> None:
        self.position: Optional[int] = None  # next offset poll() returns
        self.fetch_offset: Optional[int] = None  # next offset to fetch (>= position)
        self.buffer: list["ConsumerRecord"] = []
        self.buffered_bytes = 0
        self.task: Optional[asyncio.Task[None]] = None
        self.error: Optional[errors.GregorError] = None
        self.high_watermark = -1
        self.log_start_offset = -1
        self.generation = 0  # bumped by seek: results of older fetches are dropped
        self.reset: Optional[int] = None  # EARLIEST/LATEST requested by seek_to_*
        self.committed_checked = False  # with a group.id, the committed offset is the first choice of position
        # The topic id (KIP-516) the position belongs to, pinned when fetching starts (None: not yet;
        # b"": the cluster sends no ids); a seek starts over.
        self.topic_id: Optional[bytes] = None
        # The one pending position reset of this partition (Kafka's SubscriptionState keeps one per
        # partition): the fetch task and position() both await it, neither starts a second one. A seek
        # or revocation cancels it (its offset belongs to the old generation).
        self.resetting: Optional[asyncio.Task[None]] = None


class SubscriptionState:
    """Assigned partitions in assignment order, each with its PartitionState."""

    def __init__(self, start: Callable[[TopicPartition], Any], stop: Callable[[PartitionState], Any],
                 on_change: Callable[[], Any]) -> None:
        self.states: dict[TopicPartition, PartitionState] = {}
        self.order: list[TopicPartition] = []
        self._start, self._stop, self._on_change = start, stop, on_change

    def assignment(self) -> list[TopicPartition]:
        return list(self.order)

    def assign(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Manual assignment: exactly these partitions (replacing the previous ones); returns the new ones."""
        wanted = list(dict.fromkeys((str(t), int(p)) for t, p in partitions))
        for tp in list(self.states):
            if tp not in wanted:
                self._stop(self.states.pop(tp))
        added = [tp for tp in wanted if tp not in self.states]
        for tp in added:
            self.states[tp] = PartitionState()
            self._start(tp)
        self.order = wanted
        return added

    def add_assigned(self, tps: Sequence[TopicPartition],
                     positions: Optional[Mapping[TopicPartition, Optional[int]]]) -> list[TopicPartition]:
        """Group assignment: start fetching tps at their committed offset (else auto.offset.reset). positions
        None: the OffsetFetch failed, so each partition's fetch task asks for its committed offset again
        (retrying, as Kafka's refreshCommittedOffsetsIfNeeded) before it falls back to auto.offset.reset."""
        added = []
        for tp in tps:
            if tp in self.states:
                continue
            state = self.states[tp] = PartitionState()
            if positions is not None:
                state.position = state.fetch_offset = positions.get(tp)
                state.committed_checked = True
            self._start(tp)
            self.order.append(tp)
            added.append(tp)
        return added

    def remove(self, tps: Sequence[TopicPartition]) -> None:
        """Revoked or lost partitions: their fetch tasks stop and their buffered records go."""
        gone = set(tps)
        for tp in gone:
            state = self.states.pop(tp, None)
            if state is not None:
                self._stop(state)
        self.order = [tp for tp in self.order if tp not in gone]

    def consumed_positions(self) -> dict[TopicPartition, int]:
        """The position of every partition that has one: what a commit stores."""
        return {tp: s.position for tp, s in self.states.items() if s.position is not None}

    def notify(self) -> None:
        """Wake a waiting poll() (the group's state changed, e.g. a rebalance needs the caller)."""
        self._on_change()
