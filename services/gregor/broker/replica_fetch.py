"""The leader's side of a multi-partition replica fetch (Kafka's Fetch with replica_id set).

Why: a follower used to hold one long poll per partition, so an idle 3-broker cluster with 100
partitions of RF 3 answered ~400 empty fetches a second (one per partition per
replica.fetch.wait.max.ms per follower), a third of a core of gRPC and Python for nothing. Kafka's
follower sends one Fetch for every partition it copies from a leader, and the leader parks it in
the fetch purgatory (DelayedFetch) until min_bytes are there over all partitions, a partition
fails, or max_wait_ms passes: an idle follower then costs one request per max_wait_ms per leader.

Each partition is read and recorded as the follower's progress exactly like a single-partition
follower Fetch (ReplicaManager._read / _on_follower_fetch); errors are per partition, so one moved
partition does not fail the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Union

from gregor.broker.purgatory import DelayedOperation
from gregor.common import errors

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import FetchResult, ReplicaManager

Outcome = Union["FetchResult", errors.GregorError]


@dataclass
class ReplicaFetchPart:
    """One partition of a replica fetch, as the follower asked for it."""

    topic: str
    partition: int
    fetch_offset: int
    current_leader_epoch: int
    max_bytes: int


@dataclass
class _Watched:
    """A partition the parked fetch waits on: what to read and what 'new data' means for it."""

    partition: "Partition"
    fetch_offset: int
    leader_epoch: int
    read: Callable[[], "FetchResult"]


def _read_or_error(read: Callable[[], "FetchResult"]) -> Outcome:
    try:
        return read()
    except errors.GregorError as err:
        return err


def _size(outcomes: list[Outcome]) -> int:
    return sum(o.slice.length for o in outcomes if not isinstance(o, errors.GregorError))


class DelayedReplicaFetch(DelayedOperation[list[Outcome]]):
    """A follower's fetch parked until a watched partition has data beyond the follower's offset
    (or changed leadership), then min_bytes over all of them, or its max wait.

    The wake-up check is an offset comparison per partition (no read): appends to a busy partition
    wake it often, and reading every partition on each wake-up would cost O(partitions) reads.
    """

    def __init__(self, delay_ms: int, slots: list[Union[_Watched, errors.GregorError]], min_bytes: int) -> None:
        super().__init__(delay_ms)
        self.slots = slots
        self.min_bytes = min_bytes

    def _moved(self) -> bool:
        for w in self.slots:
            if isinstance(w, errors.GregorError):
                continue
            p = w.partition
            if p.log_end_offset > w.fetch_offset or not p.is_leader or p.leader_epoch != w.leader_epoch:
                return True
        return False

    def try_complete(self) -> bool:
        if not self._moved():
            return False
        if self.min_bytes > 1 and _size(self.on_complete()) < self.min_bytes:
            return False
        return self.force_complete()

    def on_complete(self) -> list[Outcome]:
        return [w if isinstance(w, errors.GregorError) else _read_or_error(w.read) for w in self.slots]


async def handle_replica_fetch(rm: "ReplicaManager", replica_id: int, broker_epoch: int, min_bytes: int,
                               max_wait_ms: int, parts: list[ReplicaFetchPart]) -> list[Outcome]:
    """Read every part (recording the follower's fetch offset), answer at once when there is data or
    an error, else park one DelayedReplicaFetch watching all the partitions. One outcome per part."""
    if replica_id < 0 or min_bytes < 0 or max_wait_ms < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"invalid replica fetch: replica_id={replica_id} "
                               f"min_bytes={min_bytes} max_wait_ms={max_wait_ms}")
    live_epoch = rm.live_broker_epoch(replica_id)
    slots: list[Union[_Watched, errors.GregorError]] = []
    outcomes: list[Outcome] = []
    for part in parts:
        try:
            where = {"topic": part.topic, "partition": part.partition}
            if part.max_bytes <= 0:
                raise errors.error_for(errors.Code.INVALID_FETCH_SIZE, f"max_bytes={part.max_bytes}", **where)
            if part.fetch_offset < 0:
                raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"negative fetch offset {part.fetch_offset}",
                                       **where)
            p = rm.get_partition(part.topic, part.partition)
            p.check_follower_broker_epoch(replica_id, broker_epoch, live_epoch)
            max_bytes = min(part.max_bytes, rm.config.fetch_max_bytes)

            def read(p: "Partition" = p, part: ReplicaFetchPart = part, max_bytes: int = max_bytes) -> "FetchResult":
                return rm._read(p, part.fetch_offset, max_bytes, True, part.current_leader_epoch)

            result = read()
            rm._on_follower_fetch(p, replica_id, part.fetch_offset, broker_epoch)
            slots.append(_Watched(p, part.fetch_offset, p.leader_epoch, read))
            outcomes.append(result)
        except errors.GregorError as err:
            slots.append(err)
            outcomes.append(err)
    if (max_wait_ms == 0 or len(slots) != sum(isinstance(s, _Watched) for s in slots)
            or _size(outcomes) >= max(min_bytes, 1) or not parts):
        return outcomes
    op = DelayedReplicaFetch(max_wait_ms, slots, max(min_bytes, 1))
    keys = [s.partition.key for s in slots if isinstance(s, _Watched)]
    rm.fetch_purgatory.try_complete_else_watch(op, keys)  # type: ignore[arg-type]
    return await op.future
