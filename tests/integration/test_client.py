"""The client SDK against a real broker process: producer, consumer and admin client end to end."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import pytest

from gregor.client import AdminClient, Consumer, Producer, SyncAdminClient, SyncConsumer, SyncProducer
from gregor.client.partitioner import partition_for_key
from gregor.common import errors
from tests.helpers.cluster import broker_process, stop_process


def requests_served(broker, api: str) -> float:  # type: ignore[no-untyped-def]
    """The broker's gregor_requests_total for one BrokerService API (successful calls)."""
    want = f'gregor_requests_total{{api="{api}",code="NONE",service="BrokerService"}} '
    with urllib.request.urlopen(broker.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(want):
                return float(line.split()[1])
    return 0.0


async def create(bootstrap: str, name: str, partitions: int = 1, **configs: str) -> None:
    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        await admin.create_topic(name, partitions, 1, {k.replace("_", "."): v for k, v in configs.items()})


async def consume_all(bootstrap: str, tps: list[tuple[str, int]], expected: int, timeout_s: float = 20,
                      **config: object) -> list:  # type: ignore[type-arg]
    out: list = []  # type: ignore[type-arg]
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", **config}) as c:
        c.assign(tps)
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            out += await c.poll(timeout_ms=500)
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_produce_and_consume_back_identical_in_order_with_every_codec(broker, codec: str) -> None:
    await create(broker.grpc, "codec", partitions=3)
    n = 3000
    sent = []
    async with Producer({"bootstrap.servers": broker.grpc, "compression.type": codec, "linger.ms": 20}) as p:
        handles = []
        for i in range(n):
            key = f"key-{i % 17}".encode()
            value = f"value-{i}-".encode() * (1 + i % 5)
            headers = [("i", str(i).encode())] if i % 7 == 0 else []
            handles.append(await p.send("codec", value, key=key, headers=headers))
            sent.append((key, value, headers))
        mds = [await h for h in handles]
    # Keys land where Kafka's murmur2 partitioner puts them; offsets per partition are contiguous from 0.
    for (key, _, _), md in zip(sent, mds):
        assert md.partition == partition_for_key(key, 3)
    for part in range(3):
        assert sorted(md.offset for md in mds if md.partition == part) == list(range(sum(
            1 for md in mds if md.partition == part)))
    got = await consume_all(broker.grpc, [("codec", p) for p in range(3)], n)
    assert len(got) == n
    by_partition: dict[int, list] = {}  # type: ignore[type-arg]
    for r in got:
        by_partition.setdefault(r.partition, []).append(r)
    for part, recs in by_partition.items():
        assert [r.offset for r in recs] == list(range(len(recs))), "in offset order, no gaps"
        expected = [(k, v, h) for (k, v, h), md in zip(sent, mds) if md.partition == part]
        assert [(r.key, r.value, r.headers) for r in recs] == expected


async def test_null_keys_fill_one_partition_batch_at_a_time(broker) -> None:
    await create(broker.grpc, "sticky", partitions=4)
    async with Producer({"bootstrap.servers": broker.grpc, "batch.size": 2000, "linger.ms": 1000}) as p:
        handles = [await p.send("sticky", b"x" * 80) for _ in range(100)]
        mds = [await h for h in handles]
    runs = [mds[0].partition]
    for md in mds[1:]:
        if md.partition != runs[-1]:
            runs.append(md.partition)
    # ~19 records of ~101 bytes fill a 2000-byte batch: long runs, and more than one partition used.
    assert 3 <= len(runs) <= 8, runs
    assert all(a != b for a, b in zip(runs, runs[1:]))


async def test_consumer_seek_position_and_offset_reset(broker) -> None:
    await create(broker.grpc, "seek")
    async with Producer({"bootstrap.servers": broker.grpc}) as p:
        for i in range(10):
            await p.send("seek", b"%d" % i)
        await p.flush()
    tp = ("seek", 0)
    async with Consumer({"bootstrap.servers": broker.grpc, "auto.offset.reset": "latest"}) as c:
        c.assign([tp])
        assert await c.position(tp) == 10  # latest
        assert await c.end_offsets([tp]) == {tp: 10}
        assert await c.beginning_offsets([tp]) == {tp: 0}
        c.seek(tp, 7)
        recs = await c.poll(5000)
        assert [r.value for r in recs] == [b"7", b"8", b"9"]
        assert await c.position(tp) == 10
        c.seek_to_beginning(tp)
        recs = await c.poll(5000, max_records=4)
        assert [r.offset for r in recs] == [0, 1, 2, 3]
        assert await c.position(tp) == 4
        # Out of range: auto.offset.reset=latest moves to the end.
        c.seek(tp, 1000)
        assert await c.poll(1500) == []
        assert await c.position(tp) == 10
    async with Consumer({"bootstrap.servers": broker.grpc, "auto.offset.reset": "none"}) as c:
        c.assign([tp])
        c.seek(tp, 1000)
        with pytest.raises(errors.OffsetOutOfRangeError):  # type: ignore[attr-defined]
            for _ in range(10):
                await c.poll(1000)
    async with Consumer({"bootstrap.servers": broker.grpc, "auto.offset.reset": "earliest"}) as c:
        c.assign([tp])
        c.seek(tp, 1000)
        recs = []
        for _ in range(10):
            recs += await c.poll(1000)
            if len(recs) >= 10:
                break
        assert [r.offset for r in recs] == list(range(10))


async def test_poll_long_polls_until_a_record_arrives(broker) -> None:
    await create(broker.grpc, "wait")
    async with Consumer({"bootstrap.servers": broker.grpc, "fetch.max.wait.ms": 5000}) as c:
        c.assign([("wait", 0)])
        assert await c.position(("wait", 0)) == 0

        async def later() -> None:
            await asyncio.sleep(0.5)
            async with Producer({"bootstrap.servers": broker.grpc}) as p:
                await p.send_and_wait("wait", b"late")

        task = asyncio.ensure_future(later())
        start = time.monotonic()
        recs = await c.poll(10_000)
        await task
        assert [r.value for r in recs] == [b"late"]
        assert 0.4 < time.monotonic() - start < 5, "woken by the append, not by fetch.max.wait.ms"


async def test_data_port_transport_reads_the_same_records(broker) -> None:
    await create(broker.grpc, "zc", partitions=2)
    async with Producer({"bootstrap.servers": broker.grpc, "compression.type": "lz4"}) as p:
        for i in range(500):
            await p.send("zc", b"v%d" % i, key=b"%d" % i)
        await p.flush()
    grpc_recs = await consume_all(broker.grpc, [("zc", 0), ("zc", 1)], 500)
    data_recs = await consume_all(broker.grpc, [("zc", 0), ("zc", 1)], 500, **{"fetch.transport": "data"})
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert sorted(grpc_recs, key=key) == sorted(data_recs, key=key)
    assert len(data_recs) == 500


@pytest.mark.parametrize("transport", ["grpc", "data"])
async def test_consumer_closes_promptly_with_fetches_in_flight(broker, transport: str) -> None:
    # Regression: with the data port, close() hung when a fetch task missed its cancellation.
    await create(broker.grpc, "busy", partitions=3)
    value = b"x" * 1024
    async with Producer({"bootstrap.servers": broker.grpc, "acks": "1"}) as p:
        for _ in range(6000):
            await p.send("busy", value)
    tps = [("busy", i) for i in range(3)]
    for _ in range(3):
        c = Consumer({"bootstrap.servers": broker.grpc, "auto.offset.reset": "earliest", "fetch.transport": transport})
        c.assign(tps)
        got = 0
        while got < 1500:
            got += len(await c.poll(2000))
        await asyncio.wait_for(c.close(), 5)


async def test_producer_errors_are_typed(broker) -> None:
    await create(broker.grpc, "small")
    async with Producer({"bootstrap.servers": broker.grpc, "max.block.ms": 500}) as p:
        with pytest.raises(errors.UnknownTopicOrPartitionError):  # type: ignore[attr-defined]
            await p.send("no-such-topic", b"x")
        with pytest.raises(errors.MessageTooLargeError):  # type: ignore[attr-defined]
            await p.send("small", b"x" * 2_000_000)
        with pytest.raises(errors.UnknownTopicOrPartitionError):  # type: ignore[attr-defined]
            await p.send("small", b"x", partition=5)


async def test_a_partition_added_after_the_metadata_was_read_is_waited_for(broker) -> None:
    """Kafka's waitOnMetadata: a send to a partition beyond the known count refreshes the metadata
    (partitions may just have been added) instead of failing at once; the spark stream test hit this."""
    await create(broker.grpc, "grows", partitions=2)
    async with Producer({"bootstrap.servers": broker.grpc, "max.block.ms": 10_000}) as p:
        await p.send_and_wait("grows", b"a", partition=1)  # the producer now holds 2 partitions
        async with AdminClient({"bootstrap.servers": broker.grpc}) as admin:
            await admin.create_partitions("grows", 3)
        md = await p.send_and_wait("grows", b"b", partition=2)
        assert (md.partition, md.offset) == (2, 0)


async def test_topic_max_message_bytes_rejection_reaches_the_record(broker) -> None:
    await create(broker.grpc, "tiny", max_message_bytes="200")
    async with Producer({"bootstrap.servers": broker.grpc}) as p:
        handle = await p.send("tiny", b"y" * 500)
        with pytest.raises(errors.GregorError) as info:
            await handle
    assert info.value.name in ("MESSAGE_TOO_LARGE", "RECORD_LIST_TOO_LARGE")


async def test_unreachable_bootstrap_is_a_network_error() -> None:
    async with AdminClient({"bootstrap.servers": "127.0.0.1:1", "request.timeout.ms": 1000}) as admin:
        with pytest.raises(errors.GregorError) as info:
            await admin.list_topics()
    assert info.value.name == "NETWORK_EXCEPTION"


async def test_producer_retries_across_a_broker_restart(tmp_path) -> None:
    data_dir = str(tmp_path / "c")
    with broker_process(data_dir) as b:
        await create(b.grpc, "survive")
        port = int(b.grpc.rsplit(":", 1)[1])
        async with Producer({"bootstrap.servers": b.grpc, "retry.backoff.ms": 50}) as p:
            await p.send_and_wait("survive", b"before")
            stop_process(b)
            handle = await p.send("survive", b"during")
            await asyncio.sleep(0.5)
            assert not handle.done(), "the record waits in the accumulator while the broker is down"
            with broker_process(data_dir, port=port) as b2:
                md = await asyncio.wait_for(handle, 30)
                assert md.offset == 1
                got = await consume_all(b2.grpc, [("survive", 0)], 2)
                assert [r.value for r in got] == [b"before", b"during"]


def test_admin_client_lifecycle(broker) -> None:
    with SyncAdminClient({"bootstrap.servers": broker.grpc}) as admin:
        admin.create_topic("adm", 2, 1, {"retention.ms": "1000"})
        with pytest.raises(errors.TopicAlreadyExistsError):  # type: ignore[attr-defined]
            admin.create_topic("adm", 2, 1)
        assert "adm" in admin.list_topics()
        info = admin.describe_topics(["adm"])["adm"]
        assert [p.partition for p in info.partitions] == [0, 1]
        assert all(p.leader == 0 and p.isr == (0,) for p in info.partitions)
        configs = {e.name: e for e in admin.describe_configs(["adm"])["adm"]}
        assert configs["retention.ms"].value == "1000" and not configs["retention.ms"].is_default
        admin.alter_configs("adm", {"retention.ms": "5000"})
        configs = {e.name: e for e in admin.describe_configs(["adm"])["adm"]}
        assert configs["retention.ms"].value == "5000"
        admin.create_partitions("adm", 4)
        assert len(admin.describe_topics(["adm"])["adm"].partitions) == 4
        with pytest.raises(errors.InvalidPartitionsError):  # type: ignore[attr-defined]
            admin.create_partitions("adm", 2)
        with pytest.raises(errors.InvalidConfigError):  # type: ignore[attr-defined]
            admin.alter_configs("adm", {"no.such.config": "1"})
        cluster = admin.describe_cluster()
        assert [b.broker_id for b in cluster.brokers] == [0]
        admin.delete_topic("adm")
        with pytest.raises(errors.UnknownTopicOrPartitionError):  # type: ignore[attr-defined]
            admin.describe_topics(["adm"])


def test_admin_client_moves_past_an_unreachable_broker(broker) -> None:
    """A dead address first in bootstrap.servers (as a broker killed moments ago stays in the
    metadata): every admin call is answered by the live broker; with no live one the error is typed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # closed again: nothing listens there
    with SyncAdminClient({"bootstrap.servers": f"{dead},{broker.grpc}"}) as admin:
        for i in range(6):  # the order is shuffled per call only among known brokers; bootstrap order is kept
            admin.create_topic(f"via-live-{i}", 1, 1)
        assert {f"via-live-{i}" for i in range(6)} <= set(admin.list_topics())
    with SyncAdminClient({"bootstrap.servers": dead, "request.timeout.ms": 3000}) as admin:
        with pytest.raises(errors.NetworkExceptionError):  # type: ignore[attr-defined]
            admin.create_topic("nowhere", 1, 1)


def test_sync_producer_and_consumer(broker) -> None:
    with SyncAdminClient({"bootstrap.servers": broker.grpc}) as admin:
        admin.create_topic("sync", 1, 1)
    with SyncProducer({"bootstrap.servers": broker.grpc}) as p:
        futures = [p.send("sync", b"m%d" % i, timestamp_ms=1_000 + i) for i in range(50)]
        p.flush()
        mds = [f.result(10) for f in futures]
    assert [md.offset for md in mds] == list(range(50))
    assert mds[3].timestamp == 1003
    with SyncConsumer({"bootstrap.servers": broker.grpc, "auto.offset.reset": "earliest"}) as c:
        c.assign([("sync", 0)])
        got = []
        while len(got) < 50:
            got += c.poll(2000)
    assert [(r.value, r.timestamp) for r in got] == [(b"m%d" % i, 1_000 + i) for i in range(50)]


async def test_send_rejects_wrong_types_at_once_and_the_producer_keeps_working(broker) -> None:
    await create(broker.grpc, "types")
    async with Producer({"bootstrap.servers": broker.grpc, "linger.ms": 5}) as p:
        bad = [dict(value="text"), dict(value=b"v", key="k"), dict(value=b"v", headers=[("h", "not bytes")]),
               dict(value=b"v", headers=[(b"h", b"v")]), dict(value=b"v", headers="h"), dict(value=12)]
        for kwargs in bad:
            with pytest.raises(TypeError) as info:
                await asyncio.wait_for(p.send("types", **kwargs), 5)  # type: ignore[arg-type]
            assert isinstance(info.value, errors.GregorError) and info.value.code == errors.Code.INVALID_RECORD
        md = await asyncio.wait_for(p.send_and_wait("types", b"fine", headers=[("h", b"v")]), 10)
        assert md.offset == 0


async def test_send_after_the_sender_died_raises_with_the_cause_instead_of_hanging(broker) -> None:
    await create(broker.grpc, "dies")
    async with Producer({"bootstrap.servers": broker.grpc}) as p:
        await p.send_and_wait("dies", b"before")
        assert p._acc is not None and p._sender_task is not None

        def boom(*_: object) -> None:
            raise RuntimeError("sender bug")

        p._acc.ready = boom  # type: ignore[method-assign]
        p._acc.wakeup.set()
        await asyncio.wait_for(asyncio.wait([p._sender_task]), 5)
        with pytest.raises(errors.GregorError) as info:
            await asyncio.wait_for(p.send("dies", b"after"), 5)
        assert isinstance(info.value.__cause__, RuntimeError) and "sender bug" in str(info.value)


async def test_a_timed_out_waiter_does_not_cancel_the_other_records_of_its_batch(broker) -> None:
    await create(broker.grpc, "shared")
    async with Producer({"bootstrap.servers": broker.grpc, "linger.ms": 300}) as p:
        h1 = await p.send("shared", b"one")
        h2 = await p.send("shared", b"two")
        assert h1.batch is h2.batch
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(h1, 0.01)
        waiter = asyncio.ensure_future(_await(h1))
        await asyncio.sleep(0.01)
        waiter.cancel()
        md2 = await asyncio.wait_for(h2, 10)
        assert md2.offset == 1 and h2.exception() is None
        assert (await h1).offset == 0 and h1.exception() is None


async def _await(handle):  # type: ignore[no-untyped-def]
    return await handle


async def test_one_request_carries_every_ready_partition_of_a_broker(broker) -> None:
    """Kafka's request shape: 16 ready partitions on one leader leave in one request on its ProduceStream."""
    await create(broker.grpc, "many", partitions=16)
    before = requests_served(broker, "ProduceStream")
    async with Producer({"bootstrap.servers": broker.grpc, "linger.ms": 60000}) as p:
        handles = [await p.send("many", b"v%d" % i, partition=i) for i in range(16)]
        await p.flush()  # all 16 become ready at once
        mds = [await h for h in handles]
    assert [(md.partition, md.offset) for md in mds] == [(i, 0) for i in range(16)]
    assert requests_served(broker, "ProduceStream") - before == 1
    assert requests_served(broker, "Produce") == requests_served(broker, "ProducePartitions") == 0


async def test_partitions_beyond_max_request_size_wait_for_the_next_request(broker) -> None:
    """A request already carrying partitions takes only what fits; the rest go next, none fails as too large."""
    await create(broker.grpc, "split", partitions=16)
    before = requests_served(broker, "ProduceStream")
    cfg = {"bootstrap.servers": broker.grpc, "linger.ms": 60000, "max.request.size": 4096}
    async with Producer(cfg) as p:
        handles = [await p.send("split", bytes([i]) * 1000, partition=i) for i in range(16)]
        await p.flush()
        mds = [await h for h in handles]
    assert sorted(md.partition for md in mds) == list(range(16)) and all(md.offset == 0 for md in mds)
    sent = requests_served(broker, "ProduceStream") - before
    assert 4 <= sent <= 8, sent  # 3 batches of ~1.1 KB fit in 4,096 bytes: ~6 requests, not 1 and not 16
    got = await consume_all(broker.grpc, [("split", i) for i in range(16)], 16)
    assert sorted((r.partition, r.value) for r in got) == [(i, bytes([i]) * 1000) for i in range(16)]
