"""Topic compression.type with a real broker: the leader recompresses into the topic's codec (LogValidator).

SDK producers send gzip, uncompressed and lz4 batches to topics with
compression.type=zstd, =uncompressed and =producer; the log on disk (gregor log
dump) and fetched batches carry the topic's codec on every batch (the
producer's on the `producer` topic), consumers read the same records, and an
idempotent retry of a recompressed batch is still recognised as a duplicate.
"""

from __future__ import annotations

import glob
import os

import gregor_native as native
import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client import AdminClient, Producer
from gregor.common import errors
from gregor.common.records import build_batch, iter_records
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.cluster import Process, tear_down
from tests.integration.test_cli import gregor, json_lines, ok
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until
from tests.integration.test_idempotence import create_topic, init_producer_id, raw_produce

SOURCES = ("gzip", "none", "lz4")


async def fetch_all(address: str, topic: str) -> bytes:
    data, pos = b"", 0
    async with channel(address) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        while True:
            resp = await stub.Fetch(broker_pb2.FetchRequest(topic=topic, partition=0, fetch_offset=pos,
                                                            max_bytes=1 << 22, min_bytes=0, max_wait_ms=0), timeout=10)
            if not resp.records:
                return data
            data += resp.records
            pos = native.parse_batches(resp.records)[-1].next_offset


async def produce_with(address: str, topic: str, codec: str, rows: list[tuple[bytes, bytes]]) -> None:
    cfg = {"bootstrap.servers": address, "compression.type": codec, "linger.ms": 5, "batch.size": 4096,
           "enable.idempotence": True}
    async with Producer(cfg) as p:
        for k, v in rows:
            await p.send(topic, v, key=k, partition=0)
        await p.flush()


def dumped_codecs(broker: Process, topic: str) -> list[str]:
    pdir = os.path.join(broker.data_dir, f"{topic}-0")
    return [b["compresscodec"] for b in json_lines(ok(gregor("-o", "json", "log", "dump", pdir)))]


@pytest.mark.parametrize("topic_type,stored", [("zstd", "zstd"), ("uncompressed", "none"), ("producer", None)])
async def test_batches_are_stored_in_the_topic_codec(broker: Process, topic_type: str, stored: str | None) -> None:
    topic = f"t-{topic_type}"
    await create_topic(broker.grpc, topic, configs={"compression.type": topic_type})
    expected: list[tuple[bytes, bytes]] = []
    for codec in SOURCES:
        rows = [(b"k%d" % (i % 7), b"%s value %d " % (codec.encode(), i) * (1 + i % 4)) for i in range(300)]
        await produce_with(broker.grpc, topic, codec, rows)
        expected += rows

    data = await fetch_all(broker.grpc, topic)
    headers = native.parse_batches(data)
    assert len(headers) >= 3
    got = [(r.key, r.value) for r in iter_records(data)]
    assert got == expected  # every record once, in order, identical
    codecs = dumped_codecs(broker, topic)
    assert len(codecs) == len(headers)
    if stored is not None:
        assert set(codecs) == {stored}, codecs
        assert {h.compression for h in headers} == {{"zstd": 4, "none": 0}[stored]}
    else:  # compression.type=producer: every producer's codec kept as sent
        assert set(codecs) == {"gzip", "none", "lz4"}, codecs
    assert all(h.producer_id >= 0 for h in headers)  # idempotent producer fields survived the rewrite

    consumed = json_lines(ok(gregor("-o", "json", "consume", topic, "--from-beginning", "--max-messages",
                                    str(len(expected)), "--timeout-ms", "10000", bootstrap=broker.grpc)))
    assert [(c["key"], c["value"]) for c in consumed] == [(k.decode(), v.decode()) for k, v in expected]


async def test_idempotent_retry_is_a_duplicate_on_a_recompressing_topic(broker: Process) -> None:
    await create_topic(broker.grpc, "zs", configs={"compression.type": "zstd", "compression.zstd.level": "7"})
    pid, epoch = await init_producer_id(broker.grpc)
    batch = build_batch([(None, b"v%d" % i, [], 1_700_000_000_000 + i) for i in range(20)], compression="gzip",
                        producer_id=pid, producer_epoch=epoch, base_sequence=0)
    first = await raw_produce(broker.grpc, "zs", batch)
    again = await raw_produce(broker.grpc, "zs", batch)
    assert (first.base_offset, first.duplicate) == (0, False)
    assert (again.base_offset, again.last_offset, again.duplicate) == (0, 19, True)
    nxt = build_batch([(None, b"w", [], 1_700_000_000_100)], compression="lz4", producer_id=pid,
                      producer_epoch=epoch, base_sequence=20)
    assert (await raw_produce(broker.grpc, "zs", nxt)).base_offset == 20
    with pytest.raises(errors.GregorError) as gap:
        await raw_produce(broker.grpc, "zs", build_batch([(None, b"x", [], 1)], compression="gzip", producer_id=pid,
                                                         producer_epoch=epoch, base_sequence=40))
    assert errors.code_name(gap.value.code) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    data = await fetch_all(broker.grpc, "zs")
    hs = native.parse_batches(data)
    assert [(h.base_offset, h.compression, h.producer_id, h.base_sequence) for h in hs] == [
        (0, 4, pid, 0), (20, 4, pid, 20)]
    assert [r.value for r in iter_records(data)] == [b"v%d" % i for i in range(20)] + [b"w"]


async def test_bad_batches_and_configs_are_typed_errors_and_leave_the_log(broker: Process) -> None:
    await create_topic(broker.grpc, "small", configs={"compression.type": "uncompressed", "max.message.bytes": "3000"})
    garbage = native.build_batch(b"this is not a gzip stream", 1, attributes=1)
    with pytest.raises(errors.GregorError) as corrupt:
        await raw_produce(broker.grpc, "small", garbage)
    assert errors.code_name(corrupt.value.code) == "CORRUPT_MESSAGE"
    # 1.5 kB of gzip that is ~20 kB uncompressed: max.message.bytes applies to the recompressed batch.
    big = build_batch([(None, b"z" * 200, [], 1)] * 100, compression="gzip")
    assert len(big) < 3000
    with pytest.raises(errors.GregorError) as too_large:
        await raw_produce(broker.grpc, "small", big)
    assert errors.code_name(too_large.value.code) == "MESSAGE_TOO_LARGE"
    assert await fetch_all(broker.grpc, "small") == b""
    ok_batch = build_batch([(None, b"fine", [], 1)], compression="snappy")
    assert (await raw_produce(broker.grpc, "small", ok_batch)).base_offset == 0
    assert dumped_codecs(broker, "small") == ["none"]

    with pytest.raises(errors.GregorError) as bad:
        await create_topic(broker.grpc, "brotli", configs={"compression.type": "brotli"})
    assert errors.code_name(bad.value.code) == "INVALID_CONFIG"
    assert "String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer" in bad.value.message
    with pytest.raises(errors.GregorError) as level:
        await create_topic(broker.grpc, "lvl", configs={"compression.type": "gzip", "compression.gzip.level": "12"})
    assert errors.code_name(level.value.code) == "INVALID_CONFIG"


async def test_altered_compression_type_applies_to_later_appends(broker: Process) -> None:
    await create_topic(broker.grpc, "alt")
    await raw_produce(broker.grpc, "alt", build_batch([(None, b"a", [], 1)], compression="gzip"))
    async with AdminClient({"bootstrap.servers": broker.grpc}) as admin:
        await admin.alter_configs("alt", {"compression.type": "lz4"})
    await raw_produce(broker.grpc, "alt", build_batch([(None, b"b", [], 2)], compression="gzip"))
    # Batches already written keep their codec; only new appends are recompressed (as in Kafka).
    assert dumped_codecs(broker, "alt") == ["gzip", "lz4"]
    assert [r.value for r in iter_records(await fetch_all(broker.grpc, "alt"))] == [b"a", b"b"]


async def test_followers_copy_the_leaders_recompressed_bytes(tmp_path: object) -> None:
    """RF 2, acks=all: the follower's log is byte-identical to the leader's (zstd), never recompressed again."""
    cluster = LocalCluster.up(str(tmp_path), brokers=2, controllers=1)
    try:
        b0, b1 = cluster.by_role("broker")[:2]
        await create_topic(b0.grpc, "rep", 1, 2, {"compression.type": "zstd", "min.insync.replicas": "2"})

        async def full_isr() -> bool:
            v = partitions(await metadata(b0, "rep"))
            return bool(v) and v[0][0] >= 0 and len(v[0][3]) == 2
        await until(full_isr, 30, "a leader with both replicas in sync")
        rows = [(b"k%d" % i, b"replicated %d " % i * 8) for i in range(500)]
        cfg = {"bootstrap.servers": cluster.bootstrap, "compression.type": "gzip", "acks": "all", "linger.ms": 5,
               "batch.size": 8192}
        async with Producer(cfg) as p:
            for k, v in rows:
                await p.send("rep", v, key=k, partition=0)
            await p.flush()

        def log_bytes(b: Process) -> bytes:
            files = sorted(glob.glob(os.path.join(b.data_dir, "rep-0", "*.log")))
            return b"".join(open(f, "rb").read() for f in files)

        async def same() -> bool:
            return log_bytes(b0) == log_bytes(b1) != b""
        await until(same, 20, "the follower caught up")
        data = log_bytes(b0)
        assert {h.compression for h in native.parse_batches(data)} == {4}
        assert [(r.key, r.value) for r in iter_records(data)] == rows
    finally:
        tear_down(cluster)
