"""A consumer's fetch of many partitions in one request, with an incremental fetch session (KIP-227).

Why: a consumer used to hold one long poll per assigned partition, so one consumer of 1,000 partitions
cost the leader 1,000 parked fetches and ~1,000 RPCs per fetch.max.wait.ms when idle, and as many
calls per round when busy: the cost the followers' ReplicaFetch sessions (replica_fetch_server.py)
already removed. Kafka's consumer sends one Fetch per leader naming all its partitions of that leader;
with a session, a partition whose position did not move is not named again, and the leader answers
only the partitions with news.

The same read and answer rules serve the gRPC FetchPartitions (broker/server.py) and the Kafka
listener's Fetch (kafka/handlers.py); the session bookkeeping is broker/fetch_session.py's cache,
which both share. Each partition is read as a single-partition consumer Fetch reads it
(ReplicaManager.read: leader epoch check, high watermark or LSO bound, aborted transactions);
records stay file slices, never decoded. Concurrency: one event loop, like the ReplicaManager.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Union

from gregor.broker.fetch_session import CachedPartition, FetchContext, TopicPartition
from gregor.broker.purgatory import DelayedOperation
from gregor.common import errors

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import FetchResult, ReplicaManager

Outcome = Union["FetchResult", errors.GregorError]
# A topic's authorization outcome for this request: None when the caller may Read it.
Authorize = Callable[[str], Optional[errors.GregorError]]


def check_fetch_bounds(min_bytes: int, max_wait_ms: int, max_bytes: int) -> None:
    """The request-wide bounds, checked before the session moves to its next epoch."""
    if max_bytes <= 0 or min_bytes < 0:
        raise errors.error_for(errors.Code.INVALID_FETCH_SIZE,
                               f"invalid fetch bounds: max_bytes={max_bytes} min_bytes={min_bytes}")
    if max_wait_ms < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST, f"invalid fetch: max_wait_ms={max_wait_ms}")


class _NoRecords:
    """The slice of a partition answered without records (duck-types native.FileSlice's length and read)."""

    length = 0

    @staticmethod
    def read() -> bytes:
        return b""


_NO_RECORDS = _NoRecords()


@dataclass
class _Slot:
    """One session partition in this request: the hosted partition, or why it cannot be read."""

    tp: TopicPartition
    cached: CachedPartition
    partition: Optional["Partition"]
    error: Optional[errors.GregorError] = None


@dataclass
class Answer:
    """One partition of the response: its error, or what was read."""

    tp: TopicPartition
    cached: CachedPartition
    outcome: Outcome


class DelayedConsumerFetch(DelayedOperation[None]):
    """A consumer fetch parked until one of its partitions has records readable past the consumer's offset
    (or changed leadership), then min_bytes over them, or its max wait (Kafka's DelayedFetch for many
    partitions). The wake-up check is offset comparisons on the partition that changed; only with
    min_bytes > 1 are the moved partitions read to count their bytes."""

    def __init__(self, delay_ms: int, fetch: "ConsumerFetch") -> None:
        super().__init__(delay_ms)
        self.fetch = fetch
        self._by_key = {s.tp: s for s in fetch.slots if s.partition is not None}

    def keys(self) -> list[TopicPartition]:
        return list(self._by_key)

    def try_complete_for(self, key: object) -> bool:
        slot = self._by_key.get(key)  # type: ignore[call-overload]
        if slot is not None and not self.fetch.moved(slot):
            return False
        return self.try_complete()

    def try_complete(self) -> bool:
        moved = [s for s in self._by_key.values() if self.fetch.moved(s)]
        if not moved:
            return False
        if self.fetch.min_bytes > 1 and self.fetch.readable_bytes(moved) < self.fetch.min_bytes:
            return False
        return self.force_complete()

    def on_complete(self) -> None:
        return None


class ConsumerFetch:
    """One consumer fetch request resolved against the session cache: read, maybe wait, answer.

    A full request (no session, or a new one) answers every session partition; an incremental one only
    partitions with news: records, a high watermark / LSO / log start other than the one last sent, or
    an error. Partitions are answered in session order, and those answered with records move to the
    end of the session (Kafka's round robin), so a response that fills max_bytes early does not starve
    the partitions behind it on the next request."""

    def __init__(self, rm: "ReplicaManager", ctx: FetchContext, isolation_level: int, min_bytes: int,
                 max_wait_ms: int, max_bytes: int, authorize: Optional[Authorize] = None) -> None:
        self.rm = rm
        self.ctx = ctx
        self.isolation_level = isolation_level
        self.min_bytes = min_bytes
        self.max_wait_ms = max_wait_ms
        self.max_bytes = min(max_bytes, rm.config.fetch_max_bytes)
        denied: dict[str, Optional[errors.GregorError]] = {}
        self.slots = [self._slot(tp, cp, authorize, denied) for tp, cp in ctx.partitions]

    def _slot(self, tp: TopicPartition, cp: CachedPartition, authorize: Optional[Authorize],
              denied: dict[str, Optional[errors.GregorError]]) -> _Slot:
        where = {"topic": tp[0], "partition": tp[1]}
        try:
            if authorize is not None:
                if tp[0] not in denied:
                    denied[tp[0]] = authorize(tp[0])
                err = denied[tp[0]]
                if err is not None:
                    raise err
            if cp.max_bytes <= 0:
                raise errors.error_for(errors.Code.INVALID_FETCH_SIZE, f"partition_max_bytes={cp.max_bytes}",
                                       **where)
            if cp.fetch_offset < 0:
                raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"negative fetch offset {cp.fetch_offset}",
                                       **where)
            p = self.rm.get_partition(tp[0], tp[1])
            p.check_topic_id(cp.topic_id)
            return _Slot(tp, cp, p)
        except errors.GregorError as err:
            return _Slot(tp, cp, None, err)

    # -- what a partition has for the consumer ------------------------------------------------------
    def moved(self, slot: _Slot) -> bool:
        """Records readable past the consumer's offset, or leadership changed: worth answering now."""
        p = slot.partition
        assert p is not None
        cp = slot.cached
        if self.rm.partitions.get(slot.tp) is not p:
            return True  # deleted or re-created since the request came (its log may be closed: touch nothing)
        if not p.is_leader or (cp.current_leader_epoch >= 0 and cp.current_leader_epoch != p.leader_epoch):
            return True
        if p.high_watermark <= cp.fetch_offset:
            return False  # the LSO is at or below the HW: nothing readable either way
        return self.isolation_level == 0 or p.last_stable_offset > cp.fetch_offset

    def _quiet(self, slot: _Slot) -> bool:
        """Nothing to tell the consumer about this partition (no read needed): an incremental answer skips it."""
        p = slot.partition
        assert p is not None
        cp = slot.cached
        if self.moved(slot):
            return False
        log_start = p.log.log_start_offset
        return (p.high_watermark == cp.high_watermark and log_start == cp.log_start_offset
                and log_start <= cp.fetch_offset <= p.log_end_offset)  # else the read says OFFSET_OUT_OF_RANGE

    def _read(self, slot: _Slot, max_bytes: int) -> Outcome:
        p = slot.partition
        assert p is not None
        if self.rm.partitions.get(slot.tp) is not p:
            return errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                                    "the partition was deleted or created anew since it was fetched",
                                    topic=slot.tp[0], partition=slot.tp[1])
        try:
            return self.rm.read(p, slot.cached.fetch_offset, max_bytes, False, slot.cached.current_leader_epoch,
                                self.isolation_level)
        except errors.GregorError as err:
            return err

    def _without_records(self, slot: _Slot) -> Outcome:
        """A partition's watermarks without its records (a full answer lists every partition, and those past
        max_bytes come this way, as Kafka's); its checks are the read's."""
        from gregor.broker.replica_manager import FetchResult

        p = slot.partition
        assert p is not None
        if self.rm.partitions.get(slot.tp) is not p:
            return errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                                    "the partition was deleted or created anew since it was fetched",
                                    topic=slot.tp[0], partition=slot.tp[1])
        try:
            p.check_leader(slot.cached.current_leader_epoch)
        except errors.GregorError as err:
            return err
        return FetchResult(_NO_RECORDS, p.high_watermark, p.last_stable_offset, p.log.log_start_offset,  # type: ignore[arg-type]
                           p.leader_epoch)

    def readable_bytes(self, slots: list[_Slot]) -> int:
        total = 0
        for s in slots:
            out = self._read(s, min(s.cached.max_bytes, self.max_bytes))
            if not isinstance(out, errors.GregorError):
                total += out.slice.length
        return total

    def answers(self) -> list[Answer]:
        """What to answer now, in session order, within max_bytes (one whole batch at least)."""
        out: list[Answer] = []
        remaining = self.max_bytes
        full = not self.ctx.incremental
        for s in self.slots:
            if s.error is not None:
                out.append(Answer(s.tp, s.cached, s.error))
                continue
            if not full and self._quiet(s):
                continue
            if remaining <= 0:
                # The response is full: this partition's records wait for the next request (a full answer
                # still lists it, as Kafka's clients check).
                if full:
                    out.append(Answer(s.tp, s.cached, self._without_records(s)))
                continue
            outcome = self._read(s, min(s.cached.max_bytes, remaining))
            if isinstance(outcome, errors.GregorError):
                out.append(Answer(s.tp, s.cached, outcome))
                continue
            size = outcome.slice.length
            if size > remaining and remaining < self.max_bytes:
                # Only the first partition with records may go past max_bytes (one whole batch).
                if full:
                    out.append(Answer(s.tp, s.cached, self._without_records(s)))
                continue
            if size or full or (outcome.high_watermark, outcome.last_stable_offset, outcome.log_start_offset) != (
                    s.cached.high_watermark, s.cached.last_stable_offset, s.cached.log_start_offset):
                out.append(Answer(s.tp, s.cached, outcome))
                remaining -= size
        return out

    async def run(self) -> list[Answer]:
        """Answer at once when there is enough (or an error, or no wait); else park until a session partition
        has readable records (min_bytes over them) or max_wait_ms passes, then answer."""
        answered = self.answers()
        if self.max_wait_ms <= 0 or any(isinstance(a.outcome, errors.GregorError) for a in answered):
            return answered
        size = sum(a.outcome.slice.length for a in answered if not isinstance(a.outcome, errors.GregorError))
        if size >= max(self.min_bytes, 1):
            return answered
        op = DelayedConsumerFetch(self.max_wait_ms, self)
        keys = op.keys()
        if not keys:
            return answered
        # Something may already be readable below min_bytes: let the purgatory check before parking.
        self.rm.fetch_purgatory.try_complete_else_watch(op, keys)  # type: ignore[arg-type]
        await op.future
        return self.answers()

    def sent(self, answered: list[Answer]) -> None:
        """The answer went out: remember what the consumer now knows, rotate answered partitions to the end."""
        from gregor.broker.replica_manager import BYTES_OUT, FAILED_FETCH

        by_topic: dict[str, int] = defaultdict(int)
        session = self.ctx.session
        for a in answered:
            o = a.outcome
            if isinstance(o, errors.GregorError):
                FAILED_FETCH.labels(error=o.name).inc()
                a.cached.changed(-1, -1, -1)  # once it recovers, its state is news again
                continue
            a.cached.changed(o.high_watermark, o.last_stable_offset, o.log_start_offset)
            if o.slice.length:
                by_topic[a.tp[0]] += o.slice.length
                if session is not None and a.tp in session.partitions:
                    session.partitions.move_to_end(a.tp)
        for topic, n in by_topic.items():
            BYTES_OUT.labels(topic=topic).inc(n)
