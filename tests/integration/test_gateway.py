"""The producer gateway with real processes: etcd-less standalone broker + gateways started by the launcher.

Unary and streaming produce with per-record results (order per partition kept,
explicit and keyed partitions), typed per-record errors that never end the
stream, buffer.memory backpressure answered RESOURCE_EXHAUSTED /
THROTTLING_QUOTA_EXCEEDED, deadlines, compression, and the records read back
with the Python SDK consumer.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_gateway
from gregor.client.accumulator import record_size
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer, ConsumerRecord
from gregor.client.partitioner import murmur2, to_positive
from gregor.common import errors
from gregor.gateway.client import GatewayClient, record
from gregor.rpc.v1 import gateway_pb2
from tests.helpers.cluster import tear_down

Code = errors.Code
PARTITIONS = 3
LINGER_SLOW_MS = 2000  # the tiny-buffer gateway holds records this long before sending


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("gw")), brokers=1, gateways=1,
                        gateway_props={"compression.type": "lz4"})
    try:
        asyncio.run(_create(c.bootstrap, ["orders", "bad", "slow", "lz", "sb", "sbad", "sb-slow"]))
        yield c
    finally:
        tear_down(c)


@pytest.fixture(scope="module")
def tiny(cluster: LocalCluster) -> Iterator[Process]:
    """A second gateway with buffer.memory for ~3 records of 1 KiB and a long linger, so it fills up."""
    p = start_gateway(cluster.data_dir, 9, cluster.bootstrap,
                      props={"buffer.memory": "4000", "linger.ms": str(LINGER_SLOW_MS), "batch.size": "1000000"})
    cluster.processes.append(p)
    yield p


async def _create(bootstrap: str, topics: list[str]) -> None:
    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for t in topics:
            await admin.create_topic(t, PARTITIONS, 1)


def gateway(c: LocalCluster) -> str:
    return c.by_role("gateway")[0].grpc


async def read_back(bootstrap: str, topic: str, expected: int, timeout_s: float = 20.0) -> list[ConsumerRecord]:
    """Every record of topic (all partitions) read with the Python SDK consumer."""
    out: list[ConsumerRecord] = []
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            out += await consumer.poll(500)
        out += await consumer.poll(300)  # nothing more should come
    return out


async def stream(target: str, msgs: list[gateway_pb2.GatewayRecord]) -> list[gateway_pb2.GatewayRecordResult]:
    async def gen() -> AsyncIterator[gateway_pb2.GatewayRecord]:
        for m in msgs:
            yield m

    async with GatewayClient(target) as client:
        return [r async for r in client.stub().ProduceStream(gen(), timeout=60)]


async def stream_batches(target: str, batches: list[list[gateway_pb2.GatewayRecord]],
                         ) -> list[gateway_pb2.GatewayRecordResultBatch]:
    """ProduceStreamBatch: every batch written, every result message read."""
    async def gen() -> AsyncIterator[gateway_pb2.GatewayRecordBatch]:
        for b in batches:
            yield gateway_pb2.GatewayRecordBatch(records=b)

    async with GatewayClient(target) as client:
        return [r async for r in client.stub().ProduceStreamBatch(gen(), timeout=60)]


def metric(p: Process, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + labels + " "):
                return float(line.split()[1])
    return 0.0


def gw_msg(topic: str, cid: int, value: bytes, key: bytes | None = None, partition: int | None = None,
           headers: tuple[tuple[str, bytes], ...] = ()) -> gateway_pb2.GatewayRecord:
    msg = gateway_pb2.GatewayRecord(topic=topic, record=record(value, key=key, headers=headers), correlation_id=cid)
    if partition is not None:
        msg.partition = partition
    return msg


async def test_unary_produce_results_in_order_and_records_land(cluster: LocalCluster) -> None:
    keys = [b"user-%d" % i for i in range(30)]
    async with GatewayClient(gateway(cluster)) as client:
        results = await client.produce("orders", [record(b"v-" + k, key=k, headers=[("h", k)]) for k in keys])
        explicit = await client.produce("orders", [record(b"p2-%d" % i) for i in range(5)], partition=2)
    assert [r.correlation_id for r in results] == list(range(30))
    assert all(r.error.code == Code.NONE and r.offset >= 0 and r.timestamp_ms > 0 for r in results)
    # The default partitioner is Kafka's: murmur2 of the key.
    assert [r.partition for r in results] == [to_positive(murmur2(k)) % PARTITIONS for k in keys]
    assert {r.partition for r in explicit} == {2}
    assert [r.offset for r in explicit] == sorted(r.offset for r in explicit)
    got = {(r.partition, r.offset): r for r in await read_back(cluster.bootstrap, "orders", 35)}
    assert len(got) == 35
    for k, r in zip(keys, results):
        rec = got[(r.partition, r.offset)]
        assert (rec.key, rec.value, rec.headers) == (k, b"v-" + k, [("h", k)])
    assert [got[(2, r.offset)].value for r in explicit] == [b"p2-%d" % i for i in range(5)]


async def test_stream_keeps_order_per_partition(cluster: LocalCluster) -> None:
    msgs = [gw_msg("lz", i, b"s-%04d" % i, key=b"k%d" % (i % 4)) for i in range(400)]
    results = await stream(gateway(cluster), msgs)
    assert sorted(r.correlation_id for r in results) == list(range(400))
    assert all(r.error.code == Code.NONE for r in results)
    by_cid = {r.correlation_id: r for r in results}
    for key_no in range(4):  # one key -> one partition, offsets in send order
        mine = [by_cid[i] for i in range(key_no, 400, 4)]
        assert len({r.partition for r in mine}) == 1
        offsets = [r.offset for r in mine]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    got = await read_back(cluster.bootstrap, "lz", 400)
    assert sorted(r.value for r in got) == sorted(m.record.value for m in msgs)  # lz4 batches read back


async def test_stream_batch_keeps_order_per_partition_and_coalesces_results(cluster: LocalCluster) -> None:
    msgs = [gw_msg("sb", 1000 + i, b"b-%04d" % i, key=b"k%d" % (i % 4)) for i in range(1000)]
    replies = await stream_batches(gateway(cluster), [msgs[i:i + 250] for i in range(0, 1000, 250)])
    results = [r for reply in replies for r in reply.results]
    assert sorted(r.correlation_id for r in results) == list(range(1000, 2000))
    assert all(r.error.code == Code.NONE and r.offset >= 0 for r in results)
    assert len(replies) < len(results)  # results of one produce batch travel in one message
    by_cid = {r.correlation_id: r for r in results}
    for key_no in range(4):  # one key -> one partition, offsets in send order, also across messages
        mine = [by_cid[1000 + i] for i in range(key_no, 1000, 4)]
        assert len({r.partition for r in mine}) == 1
        offsets = [r.offset for r in mine]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    got = {(r.partition, r.offset): r.value for r in await read_back(cluster.bootstrap, "sb", 1000)}
    assert all(got[(by_cid[m.correlation_id].partition, by_cid[m.correlation_id].offset)] == m.record.value
               for m in msgs)


async def test_bad_records_get_typed_errors_and_the_stream_goes_on(cluster: LocalCluster) -> None:
    big = b"x" * (1048576 + 10)  # over max.request.size
    msgs = [gw_msg("bad", 0, b"ok-0"),
            gw_msg("no-such-topic", 1, b"lost"),
            gw_msg("bad", 2, big),
            gw_msg("bad", 3, b"ok-3", partition=2),
            gw_msg("bad", 4, b"bad partition", partition=PARTITIONS + 5),
            gw_msg("", 5, b"empty topic"),
            gw_msg("bad", 6, b"ok-6", key=b"k")]
    results = {r.correlation_id: r for r in await stream(gateway(cluster), msgs)}
    assert sorted(results) == list(range(7))
    code = {cid: r.error.code for cid, r in results.items()}
    assert code == {0: Code.NONE, 1: Code.UNKNOWN_TOPIC_OR_PARTITION, 2: Code.MESSAGE_TOO_LARGE, 3: Code.NONE,
                    4: Code.UNKNOWN_TOPIC_OR_PARTITION, 5: Code.INVALID_TOPIC_EXCEPTION, 6: Code.NONE}
    assert results[1].offset == -1 and results[1].error.topic == "no-such-topic" and results[1].error.retriable
    assert not results[2].error.retriable and "max.request.size" in results[2].error.message
    assert results[3].partition == 2
    got = await read_back(cluster.bootstrap, "bad", 3)
    assert sorted(r.value for r in got) == [b"ok-0", b"ok-3", b"ok-6"]
    # The same per-record answers on the unary RPC; the request itself succeeds.
    async with GatewayClient(gateway(cluster)) as client:
        unary = await client.produce("no-such-topic", [record(b"a"), record(b"b")])
    assert [r.error.code for r in unary] == [Code.UNKNOWN_TOPIC_OR_PARTITION] * 2
    gw = cluster.by_role("gateway")[0]
    assert metric(gw, "gregor_gateway_record_errors_total", '{code="MESSAGE_TOO_LARGE"}') >= 1
    assert metric(gw, "gregor_gateway_records_out_total") >= 3


async def test_full_buffer_answers_resource_exhausted(cluster: LocalCluster, tiny: Process) -> None:
    value = b"v" * 1000
    per_record = record_size(None, value, ())
    assert 3 * per_record <= 4000 < 4 * per_record
    async with GatewayClient(tiny.grpc) as client:
        # Three records fill buffer.memory; they sit there for linger.ms.
        first = asyncio.ensure_future(client.produce("slow", [record(value)] * 3, partition=0))
        await asyncio.sleep(0.5)
        assert not first.done()
        assert metric(tiny, "gregor_gateway_buffer_bytes") == 3 * per_record
        # Unary: the whole request is refused, nothing buffered.
        with pytest.raises(grpc.RpcError) as info:
            await client.stub().Produce(gateway_pb2.GatewayProduceRequest(topic="slow", records=[record(value)]),
                                        timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        err = errors.from_rpc_error(info.value)
        assert err.code == Code.THROTTLING_QUOTA_EXCEEDED and err.retriable and "buffer.memory" in err.message
        # Stream: per-record THROTTLING_QUOTA_EXCEEDED, answered at once (not after linger.ms).
        t0 = time.monotonic()
        results = await stream(tiny.grpc, [gw_msg("slow", i, value, partition=1) for i in range(3)])
        assert time.monotonic() - t0 < LINGER_SLOW_MS / 1000
        assert [r.error.code for r in results] == [Code.THROTTLING_QUOTA_EXCEEDED] * 3
        assert all(r.error.retriable for r in results)
        # Once the first records are sent the buffer has room again.
        assert all(r.error.code == Code.NONE for r in await first)
        later = await client.produce("slow", [record(value)], partition=1)
        assert later[0].error.code == Code.NONE
    assert metric(tiny, "gregor_gateway_record_errors_total", '{code="THROTTLING_QUOTA_EXCEEDED"}') == 3
    got = await read_back(cluster.bootstrap, "slow", 4)
    assert len(got) == 4


async def test_unary_deadline_answers_pending_records_request_timed_out(cluster: LocalCluster,
                                                                        tiny: Process) -> None:
    async with GatewayClient(tiny.grpc) as client:
        t0 = time.monotonic()
        results = await client.produce("slow", [record(b"d1"), record(b"d2")], partition=2, timeout=0.6)
        elapsed = time.monotonic() - t0
    assert elapsed < LINGER_SLOW_MS / 1000  # answered at the deadline, not after linger.ms
    assert [r.error.code for r in results] == [Code.REQUEST_TIMED_OUT] * 2
    assert "may still be written" in results[0].error.message


def test_cluster_json_lists_gateways_with_health(cluster: LocalCluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    saved: dict[str, Any] = LocalCluster.load(cluster.data_dir).to_json()
    gws = [p for p in saved["processes"] if p["role"] == "gateway"]
    assert len(gws) >= 1 and saved["gateways"].split(",")[0] == gws[0]["grpc"]

    async def check() -> int:
        async with grpc.aio.insecure_channel(gws[0]["grpc"]) as ch:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="gregor.rpc.v1.ProducerGatewayService"), timeout=5)
            return int(resp.status)

    assert asyncio.run(check()) == health_pb2.HealthCheckResponse.SERVING


async def test_stream_batch_answers_bad_records_per_record(cluster: LocalCluster, tiny: Process) -> None:
    big = b"x" * (1048576 + 10)
    batch = [gw_msg("sbad", 100, b"sb-ok-0"), gw_msg("no-such-topic", 101, b"lost"), gw_msg("sbad", 102, big),
             gw_msg("sbad", 103, b"sb-bad-partition", partition=PARTITIONS + 5), gw_msg("", 104, b"x"),
             gw_msg("sbad", 105, b"sb-ok-5", partition=1)]
    replies = await stream_batches(gateway(cluster), [batch, [], [gw_msg("sbad", 106, b"sb-ok-6", key=b"k")]])
    code = {r.correlation_id: r.error.code for reply in replies for r in reply.results}
    assert code == {100: Code.NONE, 101: Code.UNKNOWN_TOPIC_OR_PARTITION, 102: Code.MESSAGE_TOO_LARGE,
                    103: Code.UNKNOWN_TOPIC_OR_PARTITION, 104: Code.INVALID_TOPIC_EXCEPTION, 105: Code.NONE,
                    106: Code.NONE}
    got = await read_back(cluster.bootstrap, "sbad", 3)
    assert sorted(r.value for r in got) == [b"sb-ok-0", b"sb-ok-5", b"sb-ok-6"]
    # A full buffer.memory: the records it cannot take are answered THROTTLING_QUOTA_EXCEEDED at once.
    value = b"v" * 1000
    t0 = time.monotonic()
    replies = await stream_batches(tiny.grpc, [[gw_msg("sb-slow", i, value, partition=0) for i in range(5)]])
    results = sorted((r for reply in replies for r in reply.results), key=lambda r: r.correlation_id)
    assert [r.error.code for r in results] == [Code.NONE] * 3 + [Code.THROTTLING_QUOTA_EXCEEDED] * 2
    assert time.monotonic() - t0 >= LINGER_SLOW_MS / 1000 * 0.9  # the three accepted waited for linger.ms
    # An empty stream ends at once with no results.
    assert await stream_batches(gateway(cluster), []) == []
