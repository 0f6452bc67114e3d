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

Fetch sessions (Kafka's KIP-227, the stream being the session): with every partition in every
request and response, a follower copying ~50 partitions from a leader made each acks=all produce
cost the leader ~50 reads, ~100 protobuf entries and ~50 follower-side applies per follower, even
when one partition had data (issue 15: 0.53 cores at 2,000 rec/s with bench_vs_kafka's 150
partitions, 0.30 with the one partition alone). In a session a request carries only the partitions
whose fetch offset or epoch changed, the leader remembers the others, and a response carries only
the partitions with records, an error, or a HW / log start the follower has not been told; a
partition with nothing past the follower's offset is not read at all (Quiet). A partition nothing
changed for (same offset, caught up, full ISR: ReplicaFetchSession.idle_slot) is recorded as
fetched once per REPLICA_FETCH_SESSION_RECORD_S instead of on every request; others as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NamedTuple, Union

from gregor.broker.limits import REPLICA_FETCH_SESSION_RECORD_S
from gregor.broker.purgatory import DelayedOperation
from gregor.common import errors

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import FetchResult, ReplicaManager



class Quiet(NamedTuple):
    """A session partition with nothing past the follower's offset: what a read would answer, unread."""

    high_watermark: int
    log_start_offset: int


Outcome = Union["FetchResult", Quiet, errors.GregorError]
# An idle session partition's outcome (ReplicaFetchSession.idle_slot): not read, left out of the answer.
IDLE = Quiet(-1, -1)
Key = tuple[str, int]


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
    read: Callable[[], "FetchResult | Quiet"]


def _read_or_error(read: Callable[[], "FetchResult | Quiet"]) -> Outcome:
    try:
        return read()
    except errors.GregorError as err:
        return err


def _size(outcomes: list[Outcome]) -> int:
    return sum(o.slice.length for o in outcomes if not isinstance(o, (errors.GregorError, Quiet)))


class FetchSessionCache:
    """max.incremental.fetch.session.cache.slots: how many follower streams may hold a session at once
    (a session costs a dict entry per partition; past the limit a stream is answered in full)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.in_use = 0

    def open(self) -> ReplicaFetchSession | None:
        if self.in_use >= self.slots:
            return None
        self.in_use += 1
        return ReplicaFetchSession()

    def close(self, session: ReplicaFetchSession | None) -> None:
        if session is not None:
            self.in_use -= 1


class ReplicaFetchSession:
    """The leader's memory of one follower stream (Kafka's FetchSession): the partitions it fetches
    with their last request fields, and the (HW, log start) it last sent for each."""

    def __init__(self) -> None:
        self.parts: dict[Key, ReplicaFetchPart] = {}
        self._sent: dict[Key, tuple[int, int]] = {}
        # Per partition: (the request part, its slot, when it was last recorded as fetched).
        self._slots: dict[Key, tuple[ReplicaFetchPart, _Watched, float]] = {}

    def update(self, parts: list[ReplicaFetchPart], incremental: bool) -> list[ReplicaFetchPart]:
        """A request's partitions applied (a full request starts over); returns the whole session."""
        if not incremental:
            self.parts, self._sent, self._slots = {}, {}, {}
        for q in parts:
            self.parts[(q.topic, q.partition)] = q
        return list(self.parts.values())

    def changed(self, parts: list[ReplicaFetchPart], outcomes: list[Outcome]) -> list[tuple[ReplicaFetchPart, Outcome]]:
        """What the response carries: errors, records, and HW / log start changes since the last one."""
        out = []
        for q, o in zip(parts, outcomes):
            if o is IDLE:
                continue
            key = (q.topic, q.partition)
            if isinstance(o, errors.GregorError):
                self._sent.pop(key, None)
                out.append((q, o))
                continue
            mark = (o.high_watermark, o.log_start_offset)
            if (not isinstance(o, Quiet) and o.slice.length) or self._sent.get(key) != mark:
                self._sent[key] = mark
                out.append((q, o))
        return out


    def remember(self, part: ReplicaFetchPart, slot: _Watched, now: float) -> None:
        self._slots[(part.topic, part.partition)] = (part, slot, now)

    def idle_slot(self, rm: "ReplicaManager", part: ReplicaFetchPart, replica_id: int, now: float) -> _Watched | None:
        """The slot of an unchanged partition (same request part, nothing past its offset, same leader
        epoch, full ISR) recorded less than REPLICA_FETCH_SESSION_RECORD_S ago: it needs no read and no
        record (replica_state.repeat_fetch says what a record would change: the fetch times only), and
        stays out of the answer unless it moves while the fetch is parked; a HW or log start change of
        an idle partition reaches the follower with the next full pass, within that interval."""
        key = (part.topic, part.partition)
        entry = self._slots.get(key)
        if entry is None or entry[0] is not part or now - entry[2] >= REPLICA_FETCH_SESSION_RECORD_S:
            return None
        w = entry[1]
        p = w.partition
        if (rm.partitions.get(key) is not p or p.leader_epoch != w.leader_epoch or p.log_end_offset != w.fetch_offset
                or not p.state.in_sync_steady(replica_id)):
            return None
        return w


class DelayedReplicaFetch(DelayedOperation[list[Outcome]]):
    """A follower's fetch parked until a watched partition has data beyond the follower's offset
    (or changed leadership), then min_bytes over all of them, or its max wait.

    The wake-up check is an offset comparison per partition (no read): appends to a busy partition
    wake it often, and reading every partition on each wake-up would cost O(partitions) reads.
    """

    def __init__(self, delay_ms: int, slots: list[Union[_Watched, errors.GregorError]], min_bytes: int,
                 quiet: bool = False, idle: list[bool] | None = None) -> None:
        super().__init__(delay_ms)
        self.slots = slots
        self.min_bytes = min_bytes
        self.quiet = quiet  # a fetch session's: unmoved partitions answer Quiet
        self.idle = idle if idle is not None else [False] * len(slots)  # per slot: was idle when parked
        self._by_key = {w.partition.key: w for w in slots if isinstance(w, _Watched)}
        self._touched: set[object] = set()  # keys a change was reported for while parked

    @staticmethod
    def _slot_moved(w: _Watched) -> bool:
        p = w.partition
        return p.log_end_offset > w.fetch_offset or not p.is_leader or p.leader_epoch != w.leader_epoch

    def _moved(self) -> bool:
        return any(self._slot_moved(w) for w in self.slots if not isinstance(w, errors.GregorError))

    def try_complete_for(self, key: object) -> bool:
        """An append (or leadership change) on one partition: only its slot can have moved."""
        self._touched.add(key)
        w = self._by_key.get(key)  # type: ignore[call-overload]
        if w is None:
            return self.try_complete()
        if not self._slot_moved(w):
            return False
        return self.force_complete() if self.min_bytes <= 1 else self.try_complete()

    def try_complete(self) -> bool:
        if not self._moved():
            return False
        if self.min_bytes > 1 and _size(self.on_complete()) < self.min_bytes:
            return False
        return self.force_complete()

    def on_complete(self) -> list[Outcome]:
        """Read the partitions that moved; in a session, the others answer Quiet unread (same leader
        epoch, nothing past the offset: what their read would say), or IDLE if they were idle."""
        if not self.quiet:
            return [w if isinstance(w, errors.GregorError) else _read_or_error(w.read) for w in self.slots]
        touched = self._touched  # an idle partition nothing was reported for cannot have moved
        return [w if isinstance(w, errors.GregorError)
                else IDLE if idle and w.partition.key not in touched
                else _read_or_error(w.read) if self._slot_moved(w)
                else IDLE if idle else Quiet(w.partition.high_watermark, w.partition.log.log_start_offset)
                for w, idle in zip(self.slots, self.idle)]


async def handle_replica_fetch(rm: "ReplicaManager", replica_id: int, broker_epoch: int, min_bytes: int,
                               max_wait_ms: int, parts: list[ReplicaFetchPart],
                               session: ReplicaFetchSession | None = None) -> list[Outcome]:
    """Read every part (recording the follower's fetch offset), answer at once when there is data or
    an error, else park one DelayedReplicaFetch watching all the partitions. One outcome per part;
    in a fetch session, Quiet for a partition with nothing past its fetch offset, and an idle one
    (ReplicaFetchSession.idle_slot) is neither read nor recorded again."""
    quiet = session is not None
    now = time.monotonic()
    if replica_id < 0 or min_bytes < 0 or max_wait_ms < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"invalid replica fetch: replica_id={replica_id} "
                               f"min_bytes={min_bytes} max_wait_ms={max_wait_ms}")
    live_epoch = rm.live_broker_epoch(replica_id)
    slots: list[Union[_Watched, errors.GregorError]] = []
    outcomes: list[Outcome] = []
    for part in parts:
        if session is not None and (slot := session.idle_slot(rm, part, replica_id, now)) is not None:
            slots.append(slot)
            outcomes.append(IDLE)
            continue
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

            def read(p: "Partition" = p, part: ReplicaFetchPart = part,
                     max_bytes: int = max_bytes) -> "FetchResult | Quiet":
                if quiet and p.log_end_offset == part.fetch_offset:
                    p.check_leader(part.current_leader_epoch)  # the errors a read would raise
                    return Quiet(p.high_watermark, p.log.log_start_offset)
                return rm._read(p, part.fetch_offset, max_bytes, True, part.current_leader_epoch)

            result = read()
            rm._on_follower_fetch(p, replica_id, part.fetch_offset, broker_epoch)
            slot = _Watched(p, part.fetch_offset, p.leader_epoch, read)
            if session is not None:
                session.remember(part, slot, now)
            slots.append(slot)
            outcomes.append(result)
        except errors.GregorError as err:
            slots.append(err)
            outcomes.append(err)
    if (max_wait_ms == 0 or len(slots) != sum(isinstance(s, _Watched) for s in slots)
            or _size(outcomes) >= max(min_bytes, 1) or not parts):
        return outcomes
    op = DelayedReplicaFetch(max_wait_ms, slots, max(min_bytes, 1), quiet, [o is IDLE for o in outcomes])
    # Every partition was just read at its offset with nothing past it, and no await since: nothing moved.
    rm.fetch_purgatory.try_complete_else_watch(op, list(op._by_key), checked=True)  # type: ignore[arg-type]
    return await op.future
