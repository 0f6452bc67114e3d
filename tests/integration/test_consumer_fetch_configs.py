"""The consumer's fetch settings against real brokers (etcd, a controller, 2 brokers; seed 003 "pull").

seek_to_end, fetch.min.bytes with fetch.max.wait.ms (the broker holds a fetch until enough bytes
are there or the wait is over), the max.poll.records config, max.partition.fetch.bytes (a bound
per partition fetch, yet always at least one batch), and isolation.level=read_committed, which
reads up to the last stable offset: the high watermark, as long as no transaction exists.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client import AdminClient, Consumer, Producer
from gregor.common import records
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.helpers.cluster import tear_down
from tests.integration.test_consumer_groups import create_topic

# Long leases: a SIGSTOPped follower stays registered (and in the ISR) for the whole isolation test.
LEASE_TTL_MS = 20000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("fetch")), brokers=2, controllers=1, lease_ttl_ms=LEASE_TTL_MS)
    try:
        yield c
    finally:
        tear_down(c)


def consumer(c: LocalCluster, **extra: Any) -> Consumer:
    return Consumer({"bootstrap.servers": c.bootstrap, "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100,
                     **{k.replace("_", "."): v for k, v in extra.items()}})


async def produce(c: LocalCluster, topic: str, values: list[bytes], acks: str = "all",
                  bootstrap: str | None = None) -> list[int]:
    """One batch per record (each send awaited); returns the offsets."""
    async with Producer({"bootstrap.servers": bootstrap or c.bootstrap, "linger.ms": 0, "acks": acks}) as p:
        return [(await p.send_and_wait(topic, v, partition=0)).offset for v in values]


async def test_seek_to_end_skips_buffered_records_and_reads_only_new_ones(cluster: LocalCluster) -> None:
    await create_topic(cluster, "seek-end", 1, replication_factor=1)
    await produce(cluster, "seek-end", [b"old-%d" % i for i in range(10)])
    tp = ("seek-end", 0)
    async with consumer(cluster) as c:
        c.assign([tp])
        got = await c.poll(5000, max_records=4)
        assert [r.offset for r in got] == [0, 1, 2, 3]
        await asyncio.sleep(0.3)  # the rest (4..9) is fetched into the buffer meanwhile
        c.seek_to_end(tp)
        assert await c.position(tp) == (await c.end_offsets([tp]))[tp] == 10
        assert await c.poll(1000) == []  # nothing buffered before the seek comes back
        await produce(cluster, "seek-end", [b"new-%d" % i for i in range(3)])
        recs: list[Any] = []
        deadline = time.monotonic() + 10
        while len(recs) < 3 and time.monotonic() < deadline:
            recs += await c.poll(500)
        assert [(r.offset, r.value) for r in recs] == [(10 + i, b"new-%d" % i) for i in range(3)]
        assert await c.position(tp) == 13


async def test_fetch_min_bytes_holds_the_fetch_until_enough_bytes_arrive(cluster: LocalCluster) -> None:
    await create_topic(cluster, "min-bytes", 1, replication_factor=1)
    tp = ("min-bytes", 0)
    max_wait_ms = 10000
    async with consumer(cluster, fetch_min_bytes=100000, fetch_max_wait_ms=max_wait_ms) as c:
        c.assign([tp])
        assert await c.position(tp) == 0
        assert await c.poll(500) == []  # the first fetch is parked on the broker now
        await produce(cluster, "min-bytes", [b"small"])
        # 5 bytes of 100000: the broker keeps the fetch (a min.bytes=1 fetch would answer at once).
        assert await c.poll(2000) == []
        # 120 KB in one batch, so one append satisfies the fetch (separate appends would satisfy it at
        # 100 KB, and the rest would wait for the next fetch's max wait).
        async with Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5000, "batch.size": 1 << 18}) as p:
            handles = [await p.send("min-bytes", b"x" * 1000, partition=0) for _ in range(120)]
            await p.flush()
            assert [(await h).offset for h in handles] == list(range(1, 121))
        produced = time.monotonic()
        recs: list[Any] = []
        while len(recs) < 121 and time.monotonic() - produced < max_wait_ms / 1000:
            recs += await c.poll(200)
        waited = time.monotonic() - produced
        assert [r.offset for r in recs] == list(range(121)) and recs[0].value == b"small"
        # Answered because 120 KB arrived, long before fetch.max.wait.ms.
        assert waited < max_wait_ms / 2000, waited


async def test_fetch_max_wait_answers_a_fetch_that_min_bytes_never_fills(cluster: LocalCluster) -> None:
    await create_topic(cluster, "trickle", 1, replication_factor=1)
    tp = ("trickle", 0)
    max_wait_ms, trickle_s = 1500, 6.0
    waiting = consumer(cluster, fetch_min_bytes=100000, fetch_max_wait_ms=max_wait_ms)
    eager = consumer(cluster, fetch_min_bytes=1, fetch_max_wait_ms=max_wait_ms)  # Kafka's default min.bytes
    bursts: dict[str, list[tuple[float, int]]] = {"waiting": [], "eager": []}
    stop = asyncio.Event()

    async def poll_loop(name: str, c: Consumer) -> None:
        while not stop.is_set():
            got = await c.poll(50)
            if got:
                bursts[name].append((time.monotonic(), len(got)))

    try:
        for c in (waiting, eager):
            c.assign([tp])
            assert await c.position(tp) == 0
        loops = [asyncio.ensure_future(poll_loop(n, c)) for n, c in (("waiting", waiting), ("eager", eager))]
        sent = 0
        async with Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "acks": "1"}) as p:
            start = time.monotonic()
            while time.monotonic() - start < trickle_s:  # ~100 bytes every 100 ms: never 100000
                await p.send_and_wait("trickle", b"t" * 100, partition=0)
                sent += 1
                await asyncio.sleep(0.1)
        deadline = time.monotonic() + max_wait_ms / 1000 * 3
        while sum(n for _, n in bursts["waiting"]) < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*loops)
    finally:
        await waiting.close()
        await eager.close()
    assert sum(n for _, n in bursts["waiting"]) == sum(n for _, n in bursts["eager"]) == sent
    times = [t for t, _ in bursts["waiting"]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    print(f"{sent} records: fetch.min.bytes=100000 got {len(times)} bursts (gaps {[round(g, 2) for g in gaps]}), "
          f"fetch.min.bytes=1 got {len(bursts['eager'])}")
    # Each fetch of `waiting` is answered by fetch.max.wait.ms, with everything that trickled in meanwhile.
    assert len(times) <= trickle_s / (max_wait_ms / 1000) + 2, bursts["waiting"]
    assert gaps and min(gaps) >= 0.6 * max_wait_ms / 1000, gaps
    assert len(bursts["eager"]) >= 3 * len(times), (len(bursts["eager"]), len(times))


async def test_max_poll_records_config_caps_every_poll(cluster: LocalCluster) -> None:
    await create_topic(cluster, "max-poll", 1, replication_factor=1)
    async with Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 50}) as p:
        for h in [await p.send("max-poll", b"%d" % i, partition=0) for i in range(50)]:
            await h
    async with consumer(cluster, max_poll_records=7) as c:
        c.assign([("max-poll", 0)])
        sizes: list[int] = []
        offsets: list[int] = []
        deadline = time.monotonic() + 20
        while len(offsets) < 50 and time.monotonic() < deadline:
            got = await c.poll(500)
            if got:
                sizes.append(len(got))
                offsets += [r.offset for r in got]
        assert offsets == list(range(50))
        assert max(sizes) == 7 and sizes.count(7) >= 5, sizes  # the buffer held more: poll stopped at 7
        c.seek(("max-poll", 0), 0)
        assert len(await c.poll(5000, max_records=3)) == 3  # the argument still overrides the config


async def test_max_partition_fetch_bytes_bounds_a_fetch_but_returns_at_least_one_batch(cluster: LocalCluster) -> None:
    await create_topic(cluster, "part-bytes", 1, replication_factor=1)
    limit = 3000
    values = [b"%04d" % i + b"v" * 996 for i in range(20)] + [b"big" + b"B" * 20000] + [b"tail"]
    await produce(cluster, "part-bytes", values)  # one ~1.1 KB batch per record, one 20 KB batch
    async with consumer(cluster, max_partition_fetch_bytes=limit) as c:
        fetched: list[tuple[int, int]] = []  # (bytes, batches) of every fetch answer the consumer got
        on_result = c._on_fetch_result

        def spy(tp: Any, state: Any, result: Any) -> None:
            if result.records:
                fetched.append((len(result.records), len(records.split_batches(result.records))))
            on_result(tp, state, result)

        c._on_fetch_result = spy  # type: ignore[method-assign]
        c.assign([("part-bytes", 0)])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while len(got) < len(values) and time.monotonic() < deadline:
            got += await c.poll(500)
    assert [r.value for r in got] == values
    over = [f for f in fetched if f[0] > limit]
    assert over and all(batches == 1 for _, batches in over), fetched  # only the 20 KB batch, alone
    assert all(size <= limit for size, batches in fetched if batches > 1), fetched
    assert max(batches for _, batches in fetched) >= 2, fetched  # small batches do share a fetch


async def test_read_committed_reads_up_to_the_lso_which_is_the_high_watermark(cluster: LocalCluster) -> None:
    await create_topic(cluster, "isolation", 1, replication_factor=2)
    tp = ("isolation", 0)
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        part = (await admin.describe_topics(["isolation"]))["isolation"].partitions[0]
        assert len(part.isr) == 2, part  # the follower is in the ISR: the HW waits for it
    leader = next(b for b in cluster.by_role("broker") if b.id == part.leader)
    follower = next(b for b in cluster.by_role("broker") if b.id != part.leader)
    assert await produce(cluster, "isolation", [b"c%d" % i for i in range(5)]) == list(range(5))
    async with consumer(cluster, isolation_level="read_committed") as committed, consumer(cluster) as uncommitted:
        for c in (committed, uncommitted):
            c.assign([tp])
        assert await committed.end_offsets([tp]) == await uncommitted.end_offsets([tp]) == {tp: 5}
        # Hold the HW back: the follower (still in the ISR) stops fetching, acks=1 appends go on.
        os.kill(follower.pid, signal.SIGSTOP)
        try:
            # Bootstrap from the leader only: a stopped broker would hold the producer's first Metadata
            # request for request.timeout.ms, long enough for the leader to shrink the ISR.
            assert await produce(cluster, "isolation", [b"u%d" % i for i in range(3)], acks="1",
                                 bootstrap=leader.grpc) == [5, 6, 7]
            async with channel(leader.grpc) as ch:
                resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
                    topic="isolation", partition=0, fetch_offset=0, max_bytes=1 << 20, min_bytes=1, max_wait_ms=0,
                    isolation_level=common_pb2.READ_COMMITTED), timeout=10)
            assert (resp.high_watermark, resp.last_stable_offset) == (5, 5), resp  # LSO == HW < LEO (8)
            # ListOffsets latest with read_committed answers the LSO, not the log end.
            assert await committed.end_offsets([tp]) == {tp: 5}
            recs: list[Any] = []
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                recs += await committed.poll(200)
            assert [r.value for r in recs] == [b"c%d" % i for i in range(5)]  # up to the LSO, nothing beyond
            assert committed.highwater(tp) == 5
        finally:
            os.kill(follower.pid, signal.SIGCONT)
        # The follower catches up, the HW (= LSO) moves to 8 and read_committed reads the rest.
        deadline = time.monotonic() + 30
        while len(recs) < 8 and time.monotonic() < deadline:
            recs += await committed.poll(500)
        assert [r.offset for r in recs] == list(range(8))
        assert await committed.end_offsets([tp]) == {tp: 8}
