"""A multi-partition produce wakes the followers' parked fetches after its last append (Kafka's ActionQueue,
run after the whole request): the follower's one answer carries every partition of the request. Woken at the
first append, the answer held that partition alone and the others waited for the follower's next fetch, one
more replication round trip before their acks=all could complete (issue 22).

A real ReplicaManager (native logs, the fetch purgatory, handle_replica_fetch and its session) leading two
partitions with ISR [0, 1, 2]; the follower's fetch is the production handler, parked before the produce."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gregor.broker.log_manager import LogManager
from gregor.broker.replica_fetch_server import ReplicaFetchPart, ReplicaFetchSession, handle_replica_fetch
from gregor.broker.replica_manager import FetchResult, ReplicaManager
from gregor.common import errors
from gregor.common.config import BrokerConfig
from tests.unit.native.support import values_batch


@dataclass
class State:
    topic: str
    partition: int
    leader: int = 0
    leader_epoch: int = 1
    isr: Iterable[int] = (0, 1, 2)
    replicas: Iterable[int] = (0, 1, 2)
    partition_epoch: int = 1


def leader_of(tmp_path: Path, partitions: int) -> ReplicaManager:
    rm = ReplicaManager(BrokerConfig(broker_id=0, log_dirs=str(tmp_path)), LogManager(BrokerConfig(
        broker_id=0, log_dirs=str(tmp_path))))
    assert rm.become_leader_or_follower([State("t", i) for i in range(partitions)], {"t": {}}) == {}
    return rm


async def parked_fetch(rm: ReplicaManager, partitions: int,
                       session: ReplicaFetchSession) -> "asyncio.Task[list[tuple[ReplicaFetchPart, object]]]":
    """Follower 1's session at offset 0 of every partition: the first (full) request is answered at once (a new
    session hears every partition's HW), the next (incremental, nothing moved) parks."""
    parts = [ReplicaFetchPart("t", i, 0, 1, 1 << 20) for i in range(partitions)]
    first = await handle_replica_fetch(rm, 1, -1, 1, 30_000, parts, session)
    assert all(isinstance(o, FetchResult) and o.slice.length == 0 for _, o in first)
    fetch = asyncio.create_task(handle_replica_fetch(rm, 1, -1, 1, 30_000, parts, session, incremental=True))
    await asyncio.sleep(0)
    assert not fetch.done() and session.parked is not None
    return fetch  # type: ignore[return-value]


async def follower_answers(rm: ReplicaManager, produce: list[tuple[str, int, bytes]]) -> list[tuple[int, int]]:
    """Park follower 1's session fetch at offset 0 of every partition, produce acks=all, and return what the
    fetch answered: (partition, bytes of records) per partition, in the answer's order."""
    session = ReplicaFetchSession(rm.fetch_purgatory)
    fetch = await parked_fetch(rm, len(rm.partitions), session)
    started = rm.start_produce_partitions(produce, -1, 30_000)
    assert all(isinstance(s, asyncio.Future) for s in started)  # acks=all waits for followers 1 and 2
    answered = await asyncio.wait_for(fetch, 10)
    session.close()
    out = []
    for part, outcome in answered:
        assert not isinstance(outcome, errors.GregorError), outcome
        assert isinstance(outcome, FetchResult)
        out.append((part.partition, outcome.slice.length))
    return out


def test_one_answer_carries_every_partition_of_a_produce(tmp_path: Path) -> None:
    async def run() -> None:
        rm = leader_of(tmp_path, 3)
        batches = [values_batch(4, 1000, tag=i) for i in range(3)]
        answered = await follower_answers(rm, [("t", i, b) for i, b in enumerate(batches)])
        assert sorted(answered) == [(i, len(b)) for i, b in enumerate(batches)]
        rm.shutdown()

    asyncio.run(run())


def test_a_single_partition_produce_still_wakes_the_follower_at_once(tmp_path: Path) -> None:
    async def run() -> None:
        rm = leader_of(tmp_path, 2)
        batch = values_batch(4, 1000)
        assert await follower_answers(rm, [("t", 1, batch)]) == [(1, len(batch))]
        assert rm._deferred_fetch_wakes is None
        rm.shutdown()

    asyncio.run(run())


def test_a_failed_partition_does_not_keep_the_others_from_the_followers(tmp_path: Path) -> None:
    """One partition of the request fails its append (an empty records field: CORRUPT_MESSAGE); the others
    still reach the follower in the same answer, and nothing stays deferred."""
    async def run() -> None:
        rm = leader_of(tmp_path, 3)
        session = ReplicaFetchSession(rm.fetch_purgatory)
        fetch = await parked_fetch(rm, 3, session)
        b0, b2 = values_batch(2, 500, tag=0), values_batch(2, 500, tag=2)
        started = rm.start_produce_partitions([("t", 0, b0), ("t", 1, b""), ("t", 2, b2)], -1, 30_000)
        assert isinstance(started[1], errors.GregorError) and started[1].code == errors.Code.CORRUPT_MESSAGE
        answered = await asyncio.wait_for(fetch, 10)
        assert sorted((q.partition, o.slice.length) for q, o in answered
                      if isinstance(o, FetchResult)) == [(0, len(b0)), (2, len(b2))]
        assert rm._deferred_fetch_wakes is None
        session.close()
        rm.shutdown()

    asyncio.run(run())
