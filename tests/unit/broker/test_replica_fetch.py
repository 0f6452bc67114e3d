"""DelayedSessionFetch: a follower's session fetch parked in the purgatory wakes when any watched
partition grows past the follower's offset or changes leadership, not on other appends, waits for
min_bytes over the partitions with news, and answers only those."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gregor.broker.purgatory import DelayedOperationPurgatory
from gregor.broker.replica_fetch_server import (DelayedSessionFetch, ReplicaFetchPart, ReplicaFetchSession, _SessionEntry,
                                         _Watched)
from gregor.common import errors


@dataclass
class FakeSlice:
    length: int


@dataclass
class FakeResult:
    slice: FakeSlice
    high_watermark: int = 10
    log_start_offset: int = 0


@dataclass
class FakeLog:
    log_start_offset: int = 0


@dataclass
class FakePartition:
    key: tuple[str, int]
    log_end_offset: int = 10
    is_leader: bool = True
    leader_epoch: int = 3
    high_watermark: int = 10
    log: FakeLog = field(default_factory=FakeLog)
    reads: list[int] = field(default_factory=list)

    def read(self, fetch_offset: int) -> FakeResult:
        self.reads.append(fetch_offset)
        if not self.is_leader:
            raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved")
        return FakeResult(FakeSlice(100 * (self.log_end_offset - fetch_offset)), self.high_watermark,
                          self.log.log_start_offset)


def watched(p: FakePartition, offset: int) -> _Watched:
    return _Watched(p, offset, p.leader_epoch, lambda: p.read(offset))  # type: ignore[arg-type,return-value]


async def park(ps: list[FakePartition], min_bytes: int = 1, delay_ms: int = 5000) -> tuple[
        DelayedOperationPurgatory, DelayedSessionFetch]:  # type: ignore[type-arg]
    """A session whose every partition was answered at its HW, parked at each partition's log end."""
    purgatory: DelayedOperationPurgatory = DelayedOperationPurgatory(f"rf-{id(ps)}")  # type: ignore[type-arg]
    session = ReplicaFetchSession()
    for p in ps:
        part = ReplicaFetchPart(p.key[0], p.key[1], p.log_end_offset, p.leader_epoch, 1 << 20)
        e = session.entries[p.key] = _SessionEntry(part, watched(p, p.log_end_offset))
        e.sent_hw, e.sent_log_start = p.high_watermark, p.log.log_start_offset
    op = DelayedSessionFetch(delay_ms, session, min_bytes, {p.key: p for p in ps})  # type: ignore[misc]
    assert purgatory.try_complete_else_watch(op, [p.key for p in ps]) is False
    return purgatory, op


def answered(results: list) -> dict[tuple[str, int], object]:  # type: ignore[type-arg]
    return {(e.part.topic, e.part.partition): o for e, o in results}


async def test_wakes_on_an_append_to_any_watched_partition_and_reads_all() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    purgatory, op = await park([a, b])
    assert purgatory.check_and_complete(("t", 0)) == 0  # nothing moved: no read at all
    assert a.reads == [] and b.reads == []
    b.log_end_offset = 12
    assert purgatory.check_and_complete(("t", 1)) == 1
    results = answered(await op.future)
    assert list(results) == [("t", 1)] and results[("t", 1)].slice.length == 200  # a had no news
    assert a.reads == [] and b.reads == [10]
    assert purgatory.size() == 0


async def test_leadership_change_completes_with_that_partitions_error() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    purgatory, op = await park([a, b])
    a.is_leader = False
    assert purgatory.check_and_complete(("t", 0)) == 1
    results = answered(await op.future)
    assert list(results) == [("t", 0)]
    err = results[("t", 0)]
    assert isinstance(err, errors.GregorError) and err.code == errors.Code.NOT_LEADER_OR_FOLLOWER


async def test_min_bytes_over_all_partitions() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    purgatory, op = await park([a, b], min_bytes=250)
    a.log_end_offset = 12  # 200 bytes: not enough
    assert purgatory.check_and_complete(("t", 0)) == 0
    b.log_end_offset = 11  # 300 in total
    assert purgatory.check_and_complete(("t", 1)) == 1
    assert sorted(r.slice.length for r in answered(await op.future).values()) == [100, 200]


async def test_expires_after_max_wait_with_empty_reads() -> None:
    a = FakePartition(("t", 0))
    _purgatory, op = await park([a], delay_ms=20)
    assert await asyncio.wait_for(op.future, 5) == []  # nothing moved: nothing to answer
    a.high_watermark = 12  # a HW move alone is news once the wait is over
    _purgatory, op = await park([a], delay_ms=20)
    op.session.entries[a.key].sent_hw = 10
    results = answered(await asyncio.wait_for(op.future, 5))
    assert results[a.key].high_watermark == 12 and results[a.key].slice.length == 0


async def test_a_change_reported_for_one_partition_looks_at_that_partition_only() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    purgatory, op = await park([a, b])
    b.log_end_offset = 12  # not reported yet: the append to b reports ("t", 1) itself
    assert purgatory.check_and_complete(("t", 0)) == 0  # a HW move or append on a: a did not move
    assert not op.is_completed
    assert purgatory.check_and_complete(("t", 1)) == 1
    assert [r.slice.length for r in answered(await op.future).values()] == [200]
