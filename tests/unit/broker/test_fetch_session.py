"""Fetch sessions on the ReplicaFetch stream (KIP-227): what the leader remembers and answers, what the
follower lists, and the repeat-fetch rule that lets an unchanged partition skip the HW recompute."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gregor.broker.purgatory import DelayedOperationPurgatory
from gregor.broker.replica_fetch import (
    IDLE,
    DelayedReplicaFetch,
    FetchSessionCache,
    Quiet,
    ReplicaFetchPart,
    ReplicaFetchSession,
    _Watched,
)
from gregor.broker.replica_fetcher import _FetchStream
from gregor.broker.replica_state import HighWatermarkChanged, ReplicaState
from gregor.common import errors
from tests.unit.broker import test_replica_fetch
from tests.unit.broker.test_replica_fetch import FakeSlice


@dataclass
class FakeResult(test_replica_fetch.FakeResult):
    high_watermark: int = 5
    log_start_offset: int = 0


def part(p: int, offset: int = 10) -> ReplicaFetchPart:
    return ReplicaFetchPart("t", p, offset, 3, 1 << 20)


# -- the leader's session ------------------------------------------------------------------


def test_a_full_request_starts_over_and_an_incremental_one_updates_only_what_it_lists() -> None:
    s = ReplicaFetchSession()
    a, b = part(0), part(1)
    assert s.update([a, b], incremental=False) == [a, b]
    b2 = part(1, 12)
    assert s.update([b2], incremental=True) == [a, b2]  # a is fetched again at its last offset
    c = part(2)
    assert s.update([c], incremental=False) == [c]  # a new full request forgets the others


def test_the_answer_lists_records_errors_and_changed_watermarks_only() -> None:
    s = ReplicaFetchSession()
    parts = [part(0), part(1), part(2), part(3)]
    s.update(parts, incremental=False)
    first = [Quiet(5, 0), FakeResult(FakeSlice(0)), Quiet(5, 0), IDLE]
    # First answer: every partition the follower has not been told about (IDLE ones never).
    assert [q.partition for q, _ in s.changed(parts, first)] == [0, 1, 2]  # type: ignore[arg-type]
    moved = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved")
    second = [Quiet(5, 0), FakeResult(FakeSlice(100)), Quiet(6, 0), moved]
    answered = s.changed(parts, second)  # type: ignore[arg-type]
    # p0 unchanged is left out; p1 has records; p2's HW moved; p3 failed.
    assert [q.partition for q, _ in answered] == [1, 2, 3]
    assert s.changed(parts, second[:3] + [IDLE]) == [(parts[1], second[1])]  # type: ignore[arg-type]


def test_the_cache_hands_out_at_most_its_slots() -> None:
    cache = FetchSessionCache(1)
    first = cache.open()
    assert first is not None and cache.open() is None  # full: that stream is answered in full
    cache.close(first)
    assert cache.open() is not None
    assert FetchSessionCache(0).open() is None  # max.incremental.fetch.session.cache.slots=0: no sessions


# -- the parked fetch in a session ---------------------------------------------------------


@dataclass
class FakeLog:
    log_start_offset: int = 0


@dataclass
class FakePartition(test_replica_fetch.FakePartition):
    high_watermark: int = 10
    log: FakeLog = field(default_factory=FakeLog)

    def read_all(self) -> FakeResult:
        self.reads.append(10)
        return FakeResult(FakeSlice(100 * (self.log_end_offset - 10)), self.high_watermark)


async def test_a_parked_session_fetch_reads_only_what_moved() -> None:
    a, b, c = (FakePartition(("t", i)) for i in range(3))
    slots = [_Watched(p, 10, 3, p.read_all) for p in (a, b, c)]  # type: ignore[arg-type]
    op = DelayedReplicaFetch(5000, slots, 1, quiet=True, idle=[False, True, False])  # type: ignore[arg-type]
    purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory("session-test")
    assert purgatory.try_complete_else_watch(op, [p.key for p in (a, b, c)], checked=True) is False
    c.high_watermark = 9
    assert purgatory.check_and_complete(("t", 2)) == 0  # a HW change alone does not wake a follower
    a.log_end_offset = 11
    assert purgatory.check_and_complete(("t", 0)) == 1
    out = await op.future
    assert out[0].slice.length == 100 and len(a.reads) == 1
    assert out[1] is IDLE and b.reads == []  # idle when parked, still unmoved: left out
    assert out[2] == Quiet(9, 0) and c.reads == []  # unmoved: what a read would say, unread


# -- the follower's side -------------------------------------------------------------------


class FakeCall:
    def __init__(self) -> None:
        self.cancelled = False

    def done(self) -> bool:
        return self.cancelled

    def cancel(self) -> None:
        self.cancelled = True


def test_the_follower_lists_only_changed_partitions_while_the_leader_keeps_a_session() -> None:
    stream = _FetchStream(stub=None)  # type: ignore[arg-type]
    k0, k1 = ("t", 0), ("t", 1)
    assert stream.to_send({k0: (10, 3), k1: (20, 3)}) == ([k0, k1], False)  # no stream yet: full
    call = stream.call = FakeCall()
    assert stream.to_send({k0: (10, 3), k1: (20, 3)}) == ([k0, k1], False)  # the leader said no session
    stream.incremental = True
    assert stream.to_send({k0: (12, 3), k1: (20, 3)}) == ([k0], True)
    assert stream.to_send({k0: (12, 3), k1: (20, 4)}) == ([k1], True)  # a new leader epoch is a change
    assert stream.to_send({k0: (12, 3), k1: (20, 4)}) == ([], True)  # nothing new: a long poll
    # k1 leaves (backing off, truncating, moved): a new stream, whose first request is full.
    assert stream.to_send({k0: (12, 3)}) == ([k0], False)
    assert call.cancelled and stream.call is None and not stream.incremental


# -- repeat follower fetches ---------------------------------------------------------------


def leader(isr: tuple[int, ...]) -> ReplicaState:
    s = ReplicaState(1, 1_000, "t", 0)
    assert s.on_leader_and_isr(1, 5, isr, [1, 2, 3], 10, 0, 0, 0).applied
    return s


def test_a_repeat_fetch_in_a_full_isr_records_the_times_and_changes_nothing_else() -> None:
    s = leader((1, 2, 3))
    assert s.on_follower_fetch(2, 0, 7, 10, 100) == []
    assert hw_after(s.on_follower_fetch(2, 10, 7, 10, 200)) is None  # 3 still at 0
    assert s.repeat_fetch(2, 10, 7, 10, 300)
    st = s.follower_states[2]
    assert st.last_fetch_time_ms == 300 and st.last_caught_up_time_ms == 300 and st.log_end_offset == 10
    assert not s.repeat_fetch(2, 11, 7, 11, 400)  # a new offset: the full path decides
    assert not s.repeat_fetch(2, 10, 7, 11, 400)  # the leader's LEO moved since
    assert not s.repeat_fetch(2, 10, 8, 10, 400)  # a new broker epoch
    assert hw_after(s.on_follower_fetch(3, 10, 7, 10, 500)) == 10


def test_no_repeat_shortcut_while_a_replica_is_out_of_the_isr() -> None:
    s = leader((1, 2))
    s.on_follower_fetch(2, 0, 7, 0, 100)
    assert not s.repeat_fetch(2, 0, 7, 0, 200)  # replica 3 may join: the HW and ISR rules must run
    assert not s.repeat_fetch(3, 0, 7, 0, 200)


def hw_after(effects: list[object]) -> int | None:
    return next((e.high_watermark for e in effects if isinstance(e, HighWatermarkChanged)), None)
