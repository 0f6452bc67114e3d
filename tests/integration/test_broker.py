"""A real broker process over gRPC: produce, fetch (incl. long poll), offsets, metadata, admin, restart."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch, record_values, split_batches
from tests.helpers.cluster import broker_process, stop_process


async def create_topic(target: str, name: str, partitions: int = 1, **configs: str) -> None:
    async with channel(target) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1,
                                                  configs={k.replace("_", "."): v for k, v in configs.items()})]))
    assert resp.results[0].error.code == 0, resp


async def produce(stub: broker_pb2_grpc.BrokerServiceStub, topic: str, records: bytes, partition: int = 0,
                  acks: int = 1) -> broker_pb2.ProduceResponse:
    return await stub.Produce(broker_pb2.ProduceRequest(topic=topic, partition=partition, records=records,
                                                        acks=acks, timeout_ms=5000), timeout=10)


async def fetch(stub: broker_pb2_grpc.BrokerServiceStub, topic: str, offset: int, partition: int = 0,
                max_bytes: int = 1 << 20, min_bytes: int = 0, max_wait_ms: int = 0) -> broker_pb2.FetchResponse:
    return await stub.Fetch(broker_pb2.FetchRequest(topic=topic, partition=partition, fetch_offset=offset,
                                                    max_bytes=max_bytes, min_bytes=min_bytes,
                                                    max_wait_ms=max_wait_ms), timeout=30)


async def test_produce_assigns_contiguous_offsets_and_fetch_returns_them(broker) -> None:
    await create_topic(broker.grpc, "orders", partitions=2)
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        sent = [[f"r{i}-{j}".encode() for j in range(n)] for i, n in enumerate([3, 1, 5])]
        bases = [(await produce(stub, "orders", make_batch(v), acks=acks)).base_offset
                 for v, acks in zip(sent, [1, -1, 1])]
        assert bases == [0, 3, 4]
        resp = await fetch(stub, "orders", 0)
        assert resp.high_watermark == 9 and resp.log_start_offset == 0
        assert [h.base_offset for h, _ in split_batches(resp.records)] == [0, 3, 4]
        assert record_values(resp.records) == [v for batch in sent for v in batch]
        # A fetch from the middle of a batch returns that whole batch (Kafka semantics).
        mid = await fetch(stub, "orders", 5)
        assert [h.base_offset for h, _ in split_batches(mid.records)] == [4]
        # The other partition is independent.
        assert (await produce(stub, "orders", make_batch([b"x"]), partition=1)).base_offset == 0
        # max_bytes bounds the answer but never below one whole batch.
        one = await fetch(stub, "orders", 0, max_bytes=1)
        assert [h.base_offset for h, _ in split_batches(one.records)] == [0]


async def test_acks_zero_answers_without_offset(broker) -> None:
    await create_topic(broker.grpc, "fire")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        resp = await produce(stub, "fire", make_batch([b"a"]), acks=0)
        assert resp.base_offset == -1
        assert record_values((await fetch(stub, "fire", 0)).records) == [b"a"]


async def test_fetch_long_poll_is_woken_by_an_append(broker) -> None:
    await create_topic(broker.grpc, "poll")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        start = time.monotonic()
        waiting = asyncio.create_task(fetch(stub, "poll", 0, min_bytes=1, max_wait_ms=10000))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await produce(stub, "poll", make_batch([b"wake"]))
        resp = await asyncio.wait_for(waiting, 5)
        assert record_values(resp.records) == [b"wake"]
        assert time.monotonic() - start < 5


async def test_fetch_long_poll_expires_empty_after_max_wait(broker) -> None:
    await create_topic(broker.grpc, "idle")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        start = time.monotonic()
        resp = await fetch(stub, "idle", 0, min_bytes=1, max_wait_ms=400)
        assert resp.records == b""
        assert time.monotonic() - start >= 0.35


async def test_min_bytes_waits_for_enough_data(broker) -> None:
    await create_topic(broker.grpc, "minb")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        small = make_batch([b"s"])
        waiting = asyncio.create_task(fetch(stub, "minb", 0, min_bytes=len(small) * 3, max_wait_ms=10000))
        await produce(stub, "minb", small)
        await asyncio.sleep(0.3)
        assert not waiting.done(), "one small batch must not satisfy min_bytes of three"
        await produce(stub, "minb", make_batch([b"t"]))
        await produce(stub, "minb", make_batch([b"u"]))
        resp = await asyncio.wait_for(waiting, 5)
        assert record_values(resp.records) == [b"s", b"t", b"u"]


async def test_list_offsets_earliest_latest_and_by_time(broker) -> None:
    await create_topic(broker.grpc, "times")
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        for i, ts in enumerate([1000, 2000, 3000]):
            await produce(stub, "times", make_batch([b"a", b"b"], timestamp_ms=ts))

        async def lo(ts: int) -> tuple[int, int]:
            r = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic="times", partition=0, timestamp_ms=ts))
            return r.offset, r.timestamp_ms

        assert (await lo(-2))[0] == 0
        assert (await lo(-1))[0] == 6
        assert await lo(1500) == (2, 2000)
        assert await lo(500) == (0, 1000)
        assert (await lo(9999))[0] == -1


async def test_metadata_health_reflection_and_metrics(broker) -> None:
    await create_topic(broker.grpc, "meta", partitions=3)
    async with channel(broker.grpc) as ch:
        md = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest())
        (topic,) = [t for t in md.topics if t.name == "meta"]
        assert [(p.partition, p.leader, list(p.replicas), list(p.isr)) for p in topic.partitions] == [
            (0, 0, [0], [0]), (1, 0, [0], [0]), (2, 0, [0], [0])]
        assert md.brokers[0].data_port > 0
        missing = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=["nope"]))
        assert missing.topics[0].error == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
        health = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="gregor.rpc.v1.BrokerService"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in refl for s in r.list_services_response.service]
        assert {"gregor.rpc.v1.BrokerService", "gregor.rpc.v1.AdminService", "grpc.health.v1.Health"} <= set(names)
        await produce(broker_pb2_grpc.BrokerServiceStub(ch), "meta", make_batch([b"m"] * 10))
    text = urllib.request.urlopen(broker.metrics, timeout=5).read().decode()
    assert 'gregor_broker_topic_messages_in_total{topic="meta"} 10.0' in text
    assert 'gregor_request_latency_seconds_count{api="Produce",service="BrokerService"} 1.0' in text
    assert 'gregor_broker_purgatory_size{purgatory="Fetch"}' in text


async def test_topic_admin_lifecycle_and_errors(broker) -> None:
    async with channel(broker.grpc) as ch:
        admin = controller_pb2_grpc.AdminServiceStub(ch)

        async def create(name: str, n: int = 1, rf: int = 1, **cfg: str) -> controller_pb2.TopicResult:
            r = await admin.CreateTopics(controller_pb2.CreateTopicsRequest(topics=[controller_pb2.CreatableTopic(
                name=name, num_partitions=n, replication_factor=rf, configs=cfg)]))
            return r.results[0]

        assert (await create("t1", 2, **{"retention.ms": "60000"})).error.code == 0
        assert (await create("t1")).error.code == errors.Code.TOPIC_ALREADY_EXISTS
        rf = await create("t2", 1, 4)
        assert rf.error.code == errors.Code.INVALID_REPLICATION_FACTOR
        assert rf.error.message == "Replication factor: 4 larger than available brokers: 1."
        assert (await create("bad/name")).error.code == errors.Code.INVALID_TOPIC_EXCEPTION
        assert (await create("t3", 0)).error.code == errors.Code.INVALID_PARTITIONS
        assert (await create("t4", 1, **{"retention.ms": "soon"})).error.code == errors.Code.INVALID_CONFIG
        assert (await create("t5", 1, **{"no.such.config": "1"})).error.code == errors.Code.INVALID_CONFIG

        cfg = await admin.DescribeConfigs(controller_pb2.DescribeConfigsRequest(topics=["t1"]))
        entries = {e.name: e for e in cfg.results[0].entries}
        assert entries["retention.ms"].value == "60000" and not entries["retention.ms"].is_default
        assert entries["segment.bytes"].value == "1073741824" and entries["segment.bytes"].is_default
        altered = await admin.AlterConfigs(controller_pb2.AlterConfigsRequest(topic="t1", set={"segment.ms": "1000"},
                                                                              delete=["retention.ms"]))
        entries = {e.name: e for e in altered.result.entries}
        assert entries["segment.ms"].value == "1000" and entries["retention.ms"].is_default

        more = await admin.CreatePartitions(controller_pb2.CreatePartitionsRequest(topic="t1", count=4))
        assert more.result.num_partitions == 4
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        assert (await produce(stub, "t1", make_batch([b"p3"]), partition=3)).base_offset == 0
        with pytest.raises(grpc.aio.AioRpcError) as shrink:
            await admin.CreatePartitions(controller_pb2.CreatePartitionsRequest(topic="t1", count=2))
        assert errors.from_rpc_error(shrink.value).code == errors.Code.INVALID_PARTITIONS

        deleted = await admin.DeleteTopics(controller_pb2.DeleteTopicsRequest(topics=["t1", "ghost"]))
        assert [r.error.code for r in deleted.results] == [0, errors.Code.UNKNOWN_TOPIC_OR_PARTITION]
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await produce(stub, "t1", make_batch([b"x"]))
        assert errors.from_rpc_error(gone.value).code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    assert not any(name.startswith("t1-") for name in os.listdir(broker.data_dir))


def _segment_digest(data_dir: str, topic: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(os.path.join(data_dir, f"{topic}-0"))):
        if name.endswith(".log"):
            h.update(open(os.path.join(data_dir, f"{topic}-0", name), "rb").read())
    return h.hexdigest()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
async def test_acknowledged_records_survive_restart(tmp_path, sig) -> None:
    data_dir = str(tmp_path / "c")
    with broker_process(data_dir) as b:
        await create_topic(b.grpc, "durable")
        async with channel(b.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            for i in range(20):
                await produce(stub, "durable", make_batch([f"v{i}".encode()] * 5))
        stop_process(b, sig)
    with broker_process(data_dir) as b2:
        async with channel(b2.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            resp = await fetch(stub, "durable", 0)
            assert resp.high_watermark == 100
            assert record_values(resp.records) == [f"v{i}".encode() for i in range(20) for _ in range(5)]
            assert (await produce(stub, "durable", make_batch([b"after"]))).base_offset == 100
