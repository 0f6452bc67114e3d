"""A follower's fetch session fed by the leader's fetch purgatory (issue 24, the low-rate floor): the
session listens to its partitions' changes once, a fetch looks only at the partitions it names or that
reported a change, a parked fetch is woken by the listener as soon as a watched partition grows (not by
a change to another partition or a HW move alone), and the listening ends with the stream.

Driven through the production handle_replica_fetch and DelayedOperationPurgatory over fake partitions
(the fakes count their reads: "looked at" is observable as a read or its absence)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gregor.broker.purgatory import DelayedOperationPurgatory
from gregor.broker.replica_fetch_server import ReplicaFetchPart, ReplicaFetchSession, handle_replica_fetch
from gregor.common import errors


@dataclass
class FakeSlice:
    length: int


@dataclass
class FakeResult:
    slice: FakeSlice
    high_watermark: int
    log_start_offset: int = 0


@dataclass
class FakeLog:
    log_start_offset: int = 0


@dataclass(eq=False)
class FakePartition:
    key: tuple[str, int]
    log_end_offset: int = 10
    is_leader: bool = True
    leader_epoch: int = 3
    high_watermark: int = 10
    log: FakeLog = field(default_factory=FakeLog)
    reads: list[int] = field(default_factory=list)

    def check_topic_id(self, _topic_id: bytes) -> None:
        pass

    def check_follower_broker_epoch(self, *_args: Any) -> None:
        pass


@dataclass
class FakeConfig:
    fetch_max_bytes: int = 1 << 20


class FakeReplicaManager:
    """What handle_replica_fetch uses of the ReplicaManager, with the real fetch purgatory."""

    def __init__(self, ps: list[FakePartition]) -> None:
        self.partitions = {p.key: p for p in ps}
        self.config = FakeConfig()
        self.fetch_purgatory: DelayedOperationPurgatory[Any] = DelayedOperationPurgatory(f"rf-changes-{id(self)}")
        self.events: list[str] = []

    def get_partition(self, topic: str, partition: int) -> FakePartition:
        return self.partitions[(topic, partition)]

    def live_broker_epoch(self, _broker_id: int) -> int | None:
        return None

    def read(self, p: FakePartition, fetch_offset: int, _max_bytes: int, _is_follower: bool,
             _epoch: int) -> FakeResult:
        p.reads.append(fetch_offset)
        if not p.is_leader:
            raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved")
        return FakeResult(FakeSlice(100 * (p.log_end_offset - fetch_offset)), p.high_watermark,
                          p.log.log_start_offset)

    def on_follower_fetch(self, *_args: Any) -> None:
        pass

    def append(self, p: FakePartition, n: int = 1) -> None:
        """A leader append: the log grows, then the purgatory hears of it (ReplicaManager.after_leader_append)."""
        p.log_end_offset += n
        self.events.append(f"append {p.key[1]}")
        self.fetch_purgatory.check_and_complete(p.key)


def parts(ps: list[FakePartition], offsets: dict[tuple[str, int], int] | None = None) -> list[ReplicaFetchPart]:
    return [ReplicaFetchPart(p.key[0], p.key[1], (offsets or {}).get(p.key, p.log_end_offset), p.leader_epoch, 1 << 20)
            for p in ps]


async def fetch(rm: FakeReplicaManager, session: ReplicaFetchSession, ps: list[FakePartition],
                incremental: bool, max_wait_ms: int = 0) -> dict[tuple[str, int], Any]:
    answered = await handle_replica_fetch(rm, 1, -1, 1, max_wait_ms, parts(ps), session,  # type: ignore[arg-type]
                                          incremental)
    return {(q.topic, q.partition): o for q, o in answered}


async def test_an_incremental_fetch_looks_only_at_named_and_reported_partitions() -> None:
    ps = [FakePartition(("t", i)) for i in range(20)]
    rm = FakeReplicaManager(ps)
    session = ReplicaFetchSession(rm.fetch_purgatory)
    first = await fetch(rm, session, ps, incremental=False)
    assert len(first) == 20  # a new session: every partition's HW is news once
    for p in ps:
        p.reads.clear()
    rm.append(ps[7], 2)  # reported
    ps[3].high_watermark = 11  # not reported: nobody walks the session to find it
    answered = await fetch(rm, session, [], incremental=True)
    assert list(answered) == [("t", 7)] and answered[("t", 7)].slice.length == 200
    assert [p.key[1] for p in ps if p.reads] == [7]
    rm.fetch_purgatory.check_and_complete(ps[3].key)  # the HW move is reported: news once
    answered = await fetch(rm, session, [], incremental=True)
    assert list(answered) == [("t", 3)] and answered[("t", 3)].high_watermark == 11
    session.close()


async def test_a_parked_fetch_is_answered_by_the_append_that_grows_its_partition() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    rm = FakeReplicaManager([a, b])
    session = ReplicaFetchSession(rm.fetch_purgatory)
    await fetch(rm, session, [a, b], incremental=False)

    async def follower() -> None:
        answered = await fetch(rm, session, [], incremental=True, max_wait_ms=60_000)
        rm.events.append(f"answered {sorted(k[1] for k in answered)}")

    task = asyncio.create_task(follower())
    await asyncio.sleep(0)
    assert session.parked is not None and rm.fetch_purgatory.size() == 1  # parked, watched under no key
    a.high_watermark = 11
    assert rm.fetch_purgatory.check_and_complete(a.key) == 0  # a HW move alone does not wake it
    b.reads.clear()
    rm.append(b)
    rm.events.append("after append")
    await asyncio.wait_for(task, 5)
    # Completed inside the append's own check (before the appender went on), answered with b's record and
    # a's new HW (reported while parked), and b read once.
    assert rm.events == ["append 1", "after append", "answered [0, 1]"]
    assert b.reads == [10] and session.parked is None and rm.fetch_purgatory.size() == 0
    session.close()


async def test_close_and_a_full_request_end_the_listening() -> None:
    a, b = FakePartition(("t", 0)), FakePartition(("t", 1))
    rm = FakeReplicaManager([a, b])
    session = ReplicaFetchSession(rm.fetch_purgatory)
    await fetch(rm, session, [a, b], incremental=False)
    assert set(rm.fetch_purgatory._listeners) == {a.key, b.key}
    await fetch(rm, session, [b], incremental=False)  # a full request without a: a is no longer listened to
    assert set(rm.fetch_purgatory._listeners) == {b.key}
    await fetch(rm, session, [a, a, b], incremental=False)  # a named twice is listened to once
    assert {k: len(v) for k, v in rm.fetch_purgatory._listeners.items()} == {a.key: 1, b.key: 1}
    await fetch(rm, session, [b], incremental=False)
    rm.append(a)
    assert await fetch(rm, session, [], incremental=True) == {}
    session.close()
    assert not rm.fetch_purgatory._listeners
    rm.append(b)  # nothing listens: no error, nothing kept
    assert not session.entries


async def test_a_partition_deleted_while_unlisted_is_reported_as_an_error_once() -> None:
    a = FakePartition(("t", 0))
    rm = FakeReplicaManager([a])
    session = ReplicaFetchSession(rm.fetch_purgatory)
    await fetch(rm, session, [a], incremental=False)
    del rm.partitions[a.key]  # StopReplica(delete): the stop's CompleteDelayed reports the key
    rm.fetch_purgatory.check_and_complete(a.key)
    answered = await fetch(rm, session, [], incremental=True)
    err = answered[a.key]
    assert isinstance(err, errors.GregorError) and err.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    rm.fetch_purgatory.check_and_complete(a.key)
    assert await fetch(rm, session, [], incremental=True) == {}  # told once
    session.close()


class ClosedLogPartition(FakePartition):
    """A deleted partition: its log is closed, reading its end offset raises (the native LogClosedError)."""

    @property  # type: ignore[override]
    def log_end_offset(self) -> int:
        raise RuntimeError("log is closed")

    @log_end_offset.setter
    def log_end_offset(self, _value: int) -> None:
        pass


async def test_a_parked_fetch_on_a_deleted_then_re_created_partition_is_answered_without_its_closed_log() -> None:
    """The topic is deleted and created again under its name while a session still lists the old partition
    (its follower's next full request has not come): the re-creation's first change report wakes the parked
    fetch with UNKNOWN_TOPIC_OR_PARTITION for the follower, without reading the old partition's closed log,
    which used to raise into the reporter (the new topic's LeaderAndIsr and first produce)."""
    old, other = FakePartition(("t", 0)), FakePartition(("u", 0))
    rm = FakeReplicaManager([old, other])
    session = ReplicaFetchSession(rm.fetch_purgatory)
    await fetch(rm, session, [old, other], incremental=False)
    task = asyncio.create_task(fetch(rm, session, [], incremental=True, max_wait_ms=60_000))
    await asyncio.sleep(0)
    assert session.parked is not None
    old.__class__ = ClosedLogPartition  # deleted: its log closed
    new = FakePartition(("t", 0), log_end_offset=0, high_watermark=0)
    rm.partitions[new.key] = new  # created anew under the name
    rm.fetch_purgatory.check_and_complete(new.key)  # the new partition's first report: no error raised here
    answered = await asyncio.wait_for(task, 5)
    err = answered[old.key]
    assert isinstance(err, errors.GregorError) and err.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    session.close()
