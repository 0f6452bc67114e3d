"""Replication with real processes: etcd, a controller and three cluster-mode brokers (seeds 000, 002, 004).

acks=all waits for the ISR and leaves three byte-identical replicas; a SIGSTOPped
follower leaves the ISR within replica.lag.time.max.ms and the controller's
metadata shows it, then rejoins after SIGCONT; a SIGKILLed leader under acks=all
load loses no acknowledged record, and once it is back every replica matches.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, stop_process
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import tear_down
from tests.helpers.batches import make_batch, record_values
from tests.integration.test_cluster_control import broker, metadata, partitions, until

LEASE_TTL_MS = 2000  # the controller's lease
# Brokers keep their registration through a SIGSTOP longer than the ISR shrink
# takes, so the shrink seen is the leader's (isr-expiration), not the controller's.
BROKER_SESSION_TIMEOUT_MS = 12000
REPLICA_LAG_TIME_MAX_MS = 2000
# Shrink: lag + one expiration period; propagation: 5 s of quiet + the 2.5 s check; then UpdateMetadata.
ISR_PROPAGATION_MARGIN_S = REPLICA_LAG_TIME_MAX_MS / 1000 * 1.5 + 5 + 2.5 + 4
TOPIC = "replicated"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("repl")), brokers=3, controllers=1, lease_ttl_ms=LEASE_TTL_MS,
                        broker_overrides={"replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS),
                                          "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS)})
    try:
        yield c
    finally:
        tear_down(c)


def isr_shrinks(p: Process) -> float:
    """gregor_broker_isr_shrinks_total of one broker."""
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("gregor_broker_isr_shrinks_total "):
                return float(line.split()[1])
    return 0.0


async def view(p: Process, topic: str = TOPIC) -> dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    return partitions(await metadata(p, topic))


async def produce(p: Process, values: list[bytes], acks: int = -1, topic: str = TOPIC) -> broker_pb2.ProduceResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=0, records=make_batch(values), acks=acks, timeout_ms=10000), timeout=15)


async def consume(p: Process, offset: int = 0) -> tuple[int, list[bytes]]:
    """(high watermark, values) a consumer sees from offset on."""
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=TOPIC, partition=0, fetch_offset=offset, max_bytes=1 << 24, min_bytes=0, max_wait_ms=0), timeout=5)
    return resp.high_watermark, record_values(resp.records)


def segment_bytes(p: Process, topic: str = TOPIC) -> list[tuple[str, bytes]]:
    """The partition's segment files on one broker, name and content."""
    out = []
    for path in sorted(glob.glob(os.path.join(p.data_dir, f"{topic}-0", "*.log"))):
        with open(path, "rb") as f:
            out.append((os.path.basename(path), f.read()))
    return out


async def replicas_identical(brokers: list[Process], topic: str = TOPIC) -> bool:
    logs = [segment_bytes(b, topic) for b in brokers]
    return bool(logs[0]) and all(lg == logs[0] for lg in logs)


async def test_acks_all_replicates_to_every_replica_byte_identical(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    async with channel(brokers[0].grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=3,
                                                  configs={"min.insync.replicas": "2"})]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def led() -> bool:
        v = await view(brokers[0])
        return bool(v) and v[0][0] >= 0 and len(v[0][3]) == 3
    await until(led, 15, "partition 0 has a leader and a full ISR")
    leader = broker(cluster, (await view(brokers[0]))[0][0])

    sent: list[bytes] = []
    for i in range(20):
        values = [f"r{i}-{j}".encode() for j in range(5)]
        r = await produce(leader, values)
        assert r.base_offset == len(sent)
        sent += values
        hw, seen = await consume(leader)
        # acks=all answered: the HW passed the batch, so a consumer sees it.
        assert hw >= len(sent) and seen[:len(sent)] == sent
    await until(lambda: replicas_identical(brokers), 10, "every replica holds the same bytes")


async def test_stopped_follower_leaves_isr_and_rejoins(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    leader_id, _, replicas, isr = (await view(brokers[0]))[0]
    assert len(isr) == 3
    leader = broker(cluster, leader_id)
    victim = broker(cluster, next(r for r in replicas if r != leader_id))
    shrinks_before = isr_shrinks(leader)
    stopped_at = time.monotonic()
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        # A follower whose LEO equals the leader's stays in sync however quiet it is
        # (seed 000): new data makes the stopped one fall behind. acks=all waits
        # until the shrink lets the HW pass the two remaining replicas.
        r = await produce(leader, [b"while-stopped"])
        assert r.base_offset >= 0

        async def leader_shrank() -> bool:
            return isr_shrinks(leader) > shrinks_before
        await until(leader_shrank, REPLICA_LAG_TIME_MAX_MS / 1000 * 1.5 + 2, "the leader shrinks the ISR")
        took = time.monotonic() - stopped_at
        # Within replica.lag.time.max.ms + one isr-expiration period, and not before
        # replica.lag.time.max.ms (less the follower's last long poll, 500 ms).
        assert REPLICA_LAG_TIME_MAX_MS / 1000 - 0.6 <= took <= REPLICA_LAG_TIME_MAX_MS / 1000 * 1.5 + 2, took
        async def shrunk() -> bool:
            v = await view(leader)
            return victim.id not in v[0][3]
        await until(shrunk, ISR_PROPAGATION_MARGIN_S, "the controller's metadata shows the shrunk ISR")
        # Still two in sync: acks=all with min.insync.replicas=2 goes through at once.
        r = await produce(leader, [b"while-stopped-2"])
        assert r.base_offset >= 0
    finally:
        os.kill(victim.pid, signal.SIGCONT)

    async def rejoined() -> bool:
        return victim.id in (await view(leader))[0][3]
    await until(rejoined, ISR_PROPAGATION_MARGIN_S, "the follower rejoins the ISR after SIGCONT")
    await until(lambda: replicas_identical(brokers), 10, "every replica holds the same bytes")


async def test_leader_killed_under_acks_all_load_loses_nothing(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    leader_id = (await view(brokers[0]))[0][0]
    victim = broker(cluster, leader_id)
    acked: list[bytes] = []
    stop = asyncio.Event()

    async def load() -> None:
        i = 0
        while not stop.is_set():
            current = [b for b in cluster.by_role("broker") if b.pid != victim.pid or b.alive()]
            value = f"load-{i}".encode()
            target = None
            for b in current:
                try:
                    v = await view(b)
                    if v and v[0][0] >= 0:
                        target = broker(cluster, v[0][0])
                        break
                except grpc.aio.AioRpcError:
                    continue
            if target is None or (target.pid == victim.pid and not target.alive()):
                await asyncio.sleep(0.1)
                continue
            try:
                await produce(target, [value])
                acked.append(value)
                i += 1
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)

    task = asyncio.create_task(load())
    await asyncio.sleep(1.0)
    stop_process(victim, signal.SIGKILL)
    survivors = [b for b in brokers if b.id != leader_id]

    async def failed_over() -> bool:
        v = await view(survivors[0])
        return bool(v) and v[0][0] not in (-1, leader_id)
    await until(failed_over, BROKER_SESSION_TIMEOUT_MS / 1000 + 8, "a new leader")
    await asyncio.sleep(2.0)
    stop.set()
    await task
    assert any(v.startswith(b"load-") for v in acked)

    back = start_broker(victim.data_dir.rsplit("/", 1)[0], victim.id, overrides={
        "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS), "replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS)},
        etcd_endpoint=cluster.by_role("etcd")[0].grpc)
    cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
    new_leader = broker(cluster, (await view(survivors[0]))[0][0])
    # Everything acknowledged is there, in order, once.
    hw, seen = await consume(new_leader)
    loaded = [v for v in seen if v.startswith(b"load-")]
    assert [v for v in loaded if v in set(acked)] == acked or set(acked) <= set(loaded), (len(acked), len(loaded))
    assert set(acked) <= set(loaded)
    everyone = [back, *survivors]
    await until(lambda: replicas_identical(everyone), 20, "the restarted broker matches the others byte for byte")

    async def full_isr() -> bool:
        return len((await view(new_leader))[0][3]) == 3
    await until(full_isr, ISR_PROPAGATION_MARGIN_S, "the restarted broker rejoins the ISR")


async def test_seed_002_old_leader_truncates_by_leader_epoch(cluster: LocalCluster) -> None:
    """Seed 002's A/B example: A leads epoch e with offsets B lacks; B leads e+1 and appends; A comes back.

    A asks OffsetForLeaderEpoch(e), B answers the start offset of e+1, A cuts its
    extra records there and copies B's: both logs end byte-identical.
    """
    topic = "seed002"
    brokers = cluster.by_role("broker")
    a, b = brokers[0], brokers[1]
    async with channel(b.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1, assignments={
                0: controller_pb2.ReplicaList(broker_ids=[a.id, b.id])})]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def led_by_a() -> bool:
        v = await view(a, topic)
        return bool(v) and v[0][0] == a.id and len(v[0][3]) == 2
    await until(led_by_a, 15, "A leads with ISR {A, B}")
    epoch_a = (await view(a, topic))[0][1]
    for i in range(4):  # offsets 0..3 on both
        await produce(a, [f"m{i}".encode()], acks=-1, topic=topic)
    os.kill(b.pid, signal.SIGSTOP)
    try:
        # Offsets 4..7 on A. B's fetch parked at the leader may still carry offset 4
        # to B's socket (it was answered before the stop); nothing later can.
        for i in range(4, 8):
            await produce(a, [f"a-only-{i}".encode()], acks=1, topic=topic)
        stop_process(a, signal.SIGKILL)
    finally:
        os.kill(b.pid, signal.SIGCONT)

    async def led_by_b() -> bool:
        v = await view(b, topic)
        return bool(v) and v[0][0] == b.id
    await until(led_by_b, BROKER_SESSION_TIMEOUT_MS / 1000 + 8, "B leads the next epoch")
    assert (await view(b, topic))[0][1] > epoch_a
    first = (await produce(b, [b"b-0"], acks=1, topic=topic)).base_offset
    assert first in (4, 5), first  # B's epoch starts where its log ended
    for i in (1, 2):
        await produce(b, [f"b-{i}".encode()], acks=1, topic=topic)

    back = start_broker(a.data_dir.rsplit("/", 1)[0], a.id, overrides={
        "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS), "replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS)},
        etcd_endpoint=cluster.by_role("etcd")[0].grpc)
    cluster.processes = [p for p in cluster.processes if p.pid != a.pid] + [back]
    await until(lambda: replicas_identical([back, b], topic), 20, "A truncated to B's epoch start and caught up")
    hw, seen = await consume_topic(b, topic)
    expected = [b"m0", b"m1", b"m2", b"m3", *([b"a-only-4"] if first == 5 else []), b"b-0", b"b-1", b"b-2"]
    assert hw == first + 3 and seen == expected, (hw, seen)


async def consume_topic(p: Process, topic: str) -> tuple[int, list[bytes]]:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=0, max_bytes=1 << 24, min_bytes=0, max_wait_ms=0), timeout=5)
    return resp.high_watermark, record_values(resp.records)
