"""Consumer fetch sessions (KIP-227) on a real broker process: FetchPartitions over gRPC (issue 24).

One standalone broker with max.incremental.fetch.session.cache.slots=2. A full request opens a
session and answers every partition; an incremental one names only what changed and is answered
only with partitions that have news (records, moved watermarks, errors), parking until one has;
forgotten partitions are no longer answered; a wrong epoch is INVALID_FETCH_SESSION_EPOCH, an
unknown or evicted session FETCH_SESSION_ID_NOT_FOUND; read_committed stops at the LSO and gets the
aborted transactions; leader epochs are checked per partition (KIP-320); fetch.max.bytes bounds the
response. Then a consumer of many partitions reads them all with a handful of FetchPartitions calls
and no single-partition Fetch, counted by the broker's gregor_requests_total.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any, Iterator

import grpc
import pytest

from gregor.cli.local_cluster import Process
from gregor.client import Consumer
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.helpers.batches import make_batch, record_values
from tests.helpers.cluster import broker_process
from tests.helpers.wait import until
from tests.integration.test_idempotence import create_topic, init_producer_id
from tests.integration.test_txn_broker import markers, txn_batch

RC, RU = common_pb2.READ_COMMITTED, common_pb2.READ_UNCOMMITTED
SLOTS = 2
MANY = 300  # partitions of the consumer test (CI form; bench/bench_consumer_partitions.py reads 1,000)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with broker_process(str(tmp_path_factory.mktemp("fetch-sessions")),
                        overrides={"max.incremental.fetch.session.cache.slots": str(SLOTS)}) as proc:
        yield proc


async def produce(address: str, topic: str, partition: int, values: list[bytes]) -> None:
    async with channel(address) as ch:
        await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=partition, records=make_batch(values), acks=1, timeout_ms=10000), timeout=15)


def part(topic: str, partition: int, offset: int, epoch: int = -1, max_bytes: int = 1 << 20) -> broker_pb2.FetchPartition:
    return broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset, current_leader_epoch=epoch,
                                     partition_max_bytes=max_bytes)


async def fetch(address: str, session_id: int, epoch: int, parts: list[broker_pb2.FetchPartition],
                forgotten: list[tuple[str, int]] = (), max_wait_ms: int = 0, isolation: int = RU,
                max_bytes: int = 1 << 24) -> broker_pb2.FetchPartitionsResponse:
    async with channel(address) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).FetchPartitions(broker_pb2.FetchPartitionsRequest(
            min_bytes=1, max_wait_ms=max_wait_ms, max_bytes=max_bytes, isolation_level=isolation,  # type: ignore[arg-type]
            session_id=session_id, session_epoch=epoch, partitions=parts,
            forgotten=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in forgotten]), timeout=30)


def by_partition(r: broker_pb2.FetchPartitionsResponse) -> dict[int, broker_pb2.FetchPartitionData]:
    return {p.partition: p for p in r.partitions}


def scrape(metrics_url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


async def test_incremental_requests_answer_only_partitions_with_news(broker: Process) -> None:
    await create_topic(broker.grpc, "inc", 3)
    await produce(broker.grpc, "inc", 0, [b"a", b"b"])
    full = await fetch(broker.grpc, 0, 0, [part("inc", p, 0) for p in range(3)])
    sid = full.session_id
    assert sid > 0 and not full.HasField("error")
    got = by_partition(full)
    assert set(got) == {0, 1, 2}, "a full answer lists every partition"
    assert record_values(got[0].records) == [b"a", b"b"] and got[0].high_watermark == 2
    assert (got[1].records, got[1].high_watermark) == (b"", 0)

    # Epoch 1 moves partition 0 past its records: nothing is new anywhere.
    quiet = await fetch(broker.grpc, sid, 1, [part("inc", 0, 2)])
    assert (quiet.session_id, list(quiet.partitions)) == (sid, [])

    # Epoch 2 names nothing and parks; a write to partition 1 wakes it with partition 1 only.
    parked = asyncio.ensure_future(fetch(broker.grpc, sid, 2, [], max_wait_ms=20000))
    await asyncio.sleep(0.3)
    assert not parked.done(), "nothing new: the fetch waits in purgatory"
    await produce(broker.grpc, "inc", 1, [b"c"])
    woke = await parked
    assert list(by_partition(woke)) == [1]
    assert record_values(by_partition(woke)[1].records) == [b"c"]

    # Forget partition 2: its records are no longer answered; partition 1 at its new offset is quiet.
    await fetch(broker.grpc, sid, 3, [part("inc", 1, 1)], forgotten=[("inc", 2)])
    await produce(broker.grpc, "inc", 2, [b"d"])
    after = await fetch(broker.grpc, sid, 4, [], max_wait_ms=300)
    assert list(after.partitions) == [], "a forgotten partition is not in the session any more"


async def test_session_epoch_and_id_errors_then_a_full_fetch_starts_over(broker: Process) -> None:
    await create_topic(broker.grpc, "ep", 1)
    await produce(broker.grpc, "ep", 0, [b"x"])
    sid = (await fetch(broker.grpc, 0, 0, [part("ep", 0, 0)])).session_id
    wrong = await fetch(broker.grpc, sid, 5, [])
    assert wrong.error.code == errors.Code.INVALID_FETCH_SESSION_EPOCH and not wrong.partitions
    assert not (await fetch(broker.grpc, sid, 1, [])).HasField("error"), "a refused epoch does not move the session"
    unknown = await fetch(broker.grpc, 987654, 1, [part("ep", 0, 0)])
    assert unknown.error.code == errors.Code.FETCH_SESSION_ID_NOT_FOUND
    again = await fetch(broker.grpc, 0, 0, [part("ep", 0, 0)])
    assert record_values(by_partition(again)[0].records) == [b"x"]


async def test_the_least_recently_used_session_is_evicted_from_a_full_cache(broker: Process) -> None:
    await create_topic(broker.grpc, "ev", 1)
    before = scrape(broker.metrics, "gregor_broker_fetch_session_evictions_total")
    sids = [(await fetch(broker.grpc, 0, 0, [part("ev", 0, 0)])).session_id for _ in range(SLOTS + 1)]
    first = await fetch(broker.grpc, sids[0], 1, [])
    assert first.error.code == errors.Code.FETCH_SESSION_ID_NOT_FOUND
    assert not (await fetch(broker.grpc, sids[-1], 1, [])).HasField("error")
    assert scrape(broker.metrics, "gregor_broker_fetch_session_evictions_total") >= before + 1


async def test_read_committed_sessions_stop_at_the_lso_and_carry_aborted_transactions(broker: Process) -> None:
    await create_topic(broker.grpc, "rc", 1)
    pid, _ = await init_producer_id(broker.grpc)
    async with channel(broker.grpc) as ch:
        await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic="rc", partition=0, records=txn_batch([b"t1", b"t2"], pid, 0, 0), acks=1, timeout_ms=10000),
            timeout=15)
    full = await fetch(broker.grpc, 0, 0, [part("rc", 0, 0)], isolation=RC)
    p = by_partition(full)[0]
    assert (p.high_watermark, p.last_stable_offset, p.records) == (2, 0, b""), "the open transaction is not readable"
    sid = full.session_id
    parked = asyncio.ensure_future(fetch(broker.grpc, sid, 1, [], max_wait_ms=20000, isolation=RC))
    await asyncio.sleep(0.3)
    assert not parked.done()
    assert (await markers(broker.grpc, pid, 0, False, 1, "rc")).error.code == 0  # abort
    p = by_partition(await parked)[0]
    assert p.last_stable_offset == 3 and p.records
    assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == [(pid, 0)]


async def test_leader_epochs_bounds_and_byte_limits_are_per_partition(broker: Process) -> None:
    await create_topic(broker.grpc, "lim", 2)
    for p in range(2):
        await produce(broker.grpc, "lim", p, [b"v" * 2000])
    r = await fetch(broker.grpc, 0, -1, [part("lim", 0, 0, epoch=7), part("lim", 1, 0, max_bytes=0),
                                         part("nope", 0, 0)])
    assert r.session_id == 0, "epoch -1 without a session: a sessionless full fetch"
    got = by_partition(broker_pb2.FetchPartitionsResponse(partitions=[p for p in r.partitions if p.topic == "lim"]))
    assert got[0].error.code == errors.Code.UNKNOWN_LEADER_EPOCH
    assert got[1].error.code == errors.Code.INVALID_FETCH_SIZE
    assert [p.error.code for p in r.partitions if p.topic == "nope"] == [errors.Code.UNKNOWN_TOPIC_OR_PARTITION]
    # fetch.max.bytes of 1: the first partition still gets its whole batch, the second waits for the next fetch.
    small = await fetch(broker.grpc, 0, 0, [part("lim", 0, 0), part("lim", 1, 0)], max_bytes=1)
    sizes = {p.partition: len(p.records) for p in small.partitions}
    assert sizes.get(0, 0) > 2000 and sizes.get(1, 0) == 0
    nxt = await fetch(broker.grpc, small.session_id, 1, [part("lim", 0, 1)], max_bytes=1)
    assert [p.partition for p in nxt.partitions if p.records] == [1]
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await fetch(broker.grpc, 0, 0, [part("lim", 0, 0)], max_bytes=0)
    assert errors.from_rpc_error(bad.value).code == errors.Code.INVALID_FETCH_SIZE


async def test_a_consumer_of_many_partitions_reads_them_with_a_few_fetch_requests(broker: Process) -> None:
    await create_topic(broker.grpc, "many", MANY)
    async with channel(broker.grpc) as ch:
        await broker_pb2_grpc.BrokerServiceStub(ch).ProducePartitions(broker_pb2.ProducePartitionsRequest(
            acks=1, timeout_ms=10000, partitions=[broker_pb2.ProducePartitionData(
                topic="many", partition=p, records=make_batch([b"r%d" % p])) for p in range(MANY)]), timeout=30)

    def count(api: str) -> float:
        return scrape(broker.metrics, "gregor_requests_total", service="BrokerService", api=api)

    single, multi = count("Fetch"), count("FetchPartitions")
    seen: dict[tuple[str, int], Any] = {}
    async with Consumer({"bootstrap.servers": broker.grpc, "fetch.max.wait.ms": 200}) as c:
        c.assign([("many", p) for p in range(MANY)])
        for p in range(MANY):
            c.seek(("many", p), 0)

        async def read_all() -> bool:
            for rec in await c.poll(500):
                seen[(rec.topic, rec.partition)] = rec.value
            return len(seen) == MANY
        await until(read_all, 60, f"all {MANY} records")
        reading = count("FetchPartitions") - multi
        # Idle: every partition read, the consumer polls on for a while; each round is one request per broker.
        await c.poll(1000)
        idle = count("FetchPartitions") - multi - reading
    assert seen == {("many", p): b"r%d" % p for p in range(MANY)}
    assert count("Fetch") == single, "no single-partition Fetch"
    assert 1 <= reading <= 20, f"{reading} FetchPartitions calls to read {MANY} partitions"
    assert idle <= 20, f"{idle} FetchPartitions calls while idle (one per partition would be ~{MANY * 5})"


async def test_consumers_whose_sessions_are_evicted_start_over_with_full_fetches(broker: Process) -> None:
    """Three consumers, two session slots: each one's session is evicted again and again; each answers
    FETCH_SESSION_ID_NOT_FOUND with a full fetch and still reads every record, none twice."""
    await create_topic(broker.grpc, "evict", 4)
    before = scrape(broker.metrics, "gregor_broker_fetch_session_evictions_total")
    consumers = [Consumer({"bootstrap.servers": broker.grpc, "fetch.max.wait.ms": 50}) for _ in range(3)]
    seen: list[list[bytes]] = [[] for _ in consumers]
    try:
        for c in consumers:
            c.assign([("evict", p) for p in range(4)])
            for p in range(4):
                c.seek(("evict", p), 0)
        for i in range(20):
            await produce(broker.grpc, "evict", i % 4, [b"e%d" % i])

        async def read(k: int) -> bool:
            seen[k] += [r.value or b"" for r in await consumers[k].poll(100)]
            return len(seen[k]) >= 20
        for k in range(len(consumers)):
            await until(lambda k=k: read(k), 60, f"consumer {k} reads all 20 records")
    finally:
        for c in consumers:
            await c.close()
    for values in seen:
        assert sorted(values) == sorted(b"e%d" % i for i in range(20))
    assert scrape(broker.metrics, "gregor_broker_fetch_session_evictions_total") > before
    assert sum(c._fetchers.session_errors for c in consumers if c._fetchers is not None) > 0


async def test_a_topic_deleted_under_a_parked_session_fetch_is_that_partitions_error(broker: Process) -> None:
    """The parked fetch holds the deleted partition, whose log is closed: the answer names it
    UNKNOWN_TOPIC_OR_PARTITION and the other partitions go on (it once failed the whole call with
    UNKNOWN_SERVER_ERROR 'log is closed', found by test_topic_ids)."""
    from gregor.client import AdminClient

    await create_topic(broker.grpc, "gone", 1)
    await create_topic(broker.grpc, "stays", 1)
    full = await fetch(broker.grpc, 0, 0, [part("gone", 0, 0), part("stays", 0, 0)])
    parked = asyncio.ensure_future(fetch(broker.grpc, full.session_id, 1, [], max_wait_ms=1500))
    await asyncio.sleep(0.3)
    async with AdminClient({"bootstrap.servers": broker.grpc}) as admin:
        await admin.delete_topic("gone")
    answer = await parked
    assert [(p.topic, p.error.code) for p in answer.partitions] == [("gone", errors.Code.UNKNOWN_TOPIC_OR_PARTITION)]
    await produce(broker.grpc, "stays", 0, [b"s"])
    later = await fetch(broker.grpc, full.session_id, 2, [], max_wait_ms=5000)
    got = {p.topic: p for p in later.partitions}
    assert record_values(got["stays"].records) == [b"s"]
    assert got["gone"].error.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
