"""Replication with real processes: etcd, a controller and three cluster-mode brokers (seeds 000, 002, 004).

acks=all waits for the ISR and leaves three byte-identical replicas; a SIGSTOPped
follower leaves the ISR within replica.lag.time.max.ms and the controller's
metadata shows it, then rejoins after SIGCONT; a SIGKILLed leader under acks=all
load loses no acknowledged record, and once it is back every replica matches.
Leader epochs that clients act on (KIP-320): a fetch with an older epoch than the
leader's gets FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, and the SDK
consumer, which sends its metadata's epoch, recovers from both. Seed 002's A/B
example is in test_seed002.py.
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
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import restart_broker, tear_down
from tests.helpers.batches import make_batch, record_values
from tests.integration.test_cluster_control import broker, metadata, partitions
from tests.helpers.wait import until

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
    # A produce that failed may still have landed and is retried with the same value, so a value may
    # appear twice; every acknowledged value is there, and their first appearances are in ack order.
    first: dict[bytes, int] = {}
    for pos, v in enumerate(loaded):
        first.setdefault(v, pos)
    missing = [v for v in acked if v not in first]
    assert not missing, f"{len(missing)} acknowledged record(s) lost, first {missing[:3]}"
    positions = [first[v] for v in acked]
    assert positions == sorted(positions), "acknowledged records out of order in the log"
    everyone = [back, *survivors]
    await until(lambda: replicas_identical(everyone), 20, "the restarted broker matches the others byte for byte")

    async def full_isr() -> bool:
        return len((await view(new_leader))[0][3]) == 3
    await until(full_isr, ISR_PROPAGATION_MARGIN_S, "the restarted broker rejoins the ISR")


# -- leader epochs that clients act on (KIP-320): FENCED_LEADER_EPOCH and UNKNOWN_LEADER_EPOCH ---------------

def failed_fetches(p: Process, error: str) -> float:
    """gregor_broker_failed_fetch_requests_total{error=...} of one broker."""
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(f'gregor_broker_failed_fetch_requests_total{{error="{error}"}} '):
                return float(line.split()[1])
    return 0.0


def errors_reported(consumer: object) -> list[tuple[int, int]]:
    """(error code, leader id the error names) of every error the consumer reports to its metadata, from now on.

    A spy around ClusterMetadata.request_update, which the consumer calls after each failed
    fetch: it records and delegates, so the consumer behaves exactly as it would.
    """
    md = consumer.metadata  # type: ignore[attr-defined]
    seen: list[tuple[int, int]] = []
    real = md.request_update

    def spy(err: errors.GregorError | None = None) -> None:
        if err is not None:
            seen.append((err.code, err.leader_id))
        real(err)
    md.request_update = spy
    return seen


async def fetch_with_epoch(p: Process, topic: str, epoch: int) -> broker_pb2.FetchResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=0, max_bytes=1 << 20, min_bytes=0, max_wait_ms=0,
            current_leader_epoch=epoch), timeout=5)


async def fetch_error(p: Process, topic: str, epoch: int) -> errors.GregorError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fetch_with_epoch(p, topic, epoch)
    return errors.from_rpc_error(info.value)


async def non_preferred_leader(cluster: LocalCluster, topic: str) -> tuple[Process, Process, Process]:
    """A partition (replicas P, Q, R) led by Q at epoch 1, P down: returns (P's stopped process, Q, R).

    P leads epoch 0; its controlled shutdown hands leadership to Q (epoch 1).
    """
    p_, q, r = sorted(cluster.by_role("broker"), key=lambda b: b.id)
    async with channel(q.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1, assignments={
                0: controller_pb2.ReplicaList(broker_ids=[p_.id, q.id, r.id])})]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def led_by(b: Process, epoch: int, isr_size: int) -> bool:
        v = await view(q, topic)
        return bool(v) and v[0][0] == b.id and v[0][1] == epoch and len(v[0][3]) == isr_size
    await until(lambda: led_by(p_, 0, 3), 15, "P leads epoch 0 with a full ISR")
    await asyncio.to_thread(stop_process, p_, signal.SIGTERM)  # controlled shutdown: leadership moves to Q
    await until(lambda: led_by(q, 1, 2), 15, "Q leads epoch 1")
    return p_, q, r


async def back_to_preferred(cluster: LocalCluster, p_: Process, q: Process, topic: str) -> Process:
    """Restart P; once the controller knows it is back in the ISR, the preferred election makes it leader at 2.

    auto.leader.rebalance.enable may get there first (its first check runs 5 s after
    the controller starts): ElectLeaders then answers ELECTION_NOT_NEEDED.
    """
    back = await asyncio.to_thread(restart_broker, cluster, p_, {
        "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS),
        "replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS)})

    async def p_in_isr() -> bool:
        v = await view(q, topic)
        return bool(v) and back.id in v[0][3]
    await until(p_in_isr, ISR_PROPAGATION_MARGIN_S + 10, "P rejoins the ISR (controller's view)")
    async with channel(q.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).ElectLeaders(controller_pb2.ElectLeadersRequest(
            partitions=[common_pb2.TopicPartition(topic=topic, partition=0)]), timeout=30)
    assert resp.results[0].error.code in (0, errors.Code.ELECTION_NOT_NEEDED), resp

    async def p_leads_2() -> bool:
        v = await view(q, topic)
        return bool(v) and v[0][:2] == (back.id, 2)
    await until(p_leads_2, 10, "the preferred election moves leadership to P at epoch 2")
    return back


async def test_stale_and_newer_leader_epochs_are_fenced_with_typed_errors(cluster: LocalCluster) -> None:
    """Fetch with current_leader_epoch: older than the leader's -> FENCED_LEADER_EPOCH, newer -> UNKNOWN_LEADER_EPOCH.

    Both carry the partition, the broker's leader and its leader epoch in the ErrorDetail;
    a follower asked at the current epoch answers NOT_LEADER_OR_FOLLOWER naming the leader.
    """
    topic = "epochs"
    p_, q, _ = await non_preferred_leader(cluster, topic)
    await produce(q, [b"e1"], acks=-1, topic=topic)
    p_ = await back_to_preferred(cluster, p_, q, topic)

    assert (await fetch_with_epoch(p_, topic, 2)).leader_epoch == 2  # the current epoch is served
    stale = await fetch_error(p_, topic, 1)
    assert (stale.code, stale.topic, stale.partition, stale.leader_id, stale.leader_epoch) == (
        errors.Code.FENCED_LEADER_EPOCH, topic, 0, p_.id, 2), stale
    assert stale.retriable
    newer = await fetch_error(p_, topic, 3)
    assert (newer.code, newer.topic, newer.partition, newer.leader_id, newer.leader_epoch) == (
        errors.Code.UNKNOWN_LEADER_EPOCH, topic, 0, p_.id, 2), newer
    assert newer.retriable
    # Q, now a follower at epoch 2: an older epoch is fenced there too, the current one is not led there.
    assert (await fetch_error(q, topic, 1)).code == errors.Code.FENCED_LEADER_EPOCH
    follower = await fetch_error(q, topic, 2)
    assert (follower.code, follower.leader_id, follower.leader_epoch) == (
        errors.Code.NOT_LEADER_OR_FOLLOWER, p_.id, 2), follower


async def test_consumer_with_stale_metadata_is_fenced_and_recovers(cluster: LocalCluster) -> None:
    """The SDK consumer sends its metadata's leader epoch; after a leader change it is fenced, refreshes, reads all.

    Q leads epoch 1 and the consumer reads from it; a preferred election (or
    auto.leader.rebalance, if it gets there first) makes P leader at epoch 2 while Q
    stays up as a follower. The consumer's next fetch still goes to Q with epoch 1: Q
    answers FENCED_LEADER_EPOCH (without the epoch it would have been
    NOT_LEADER_OR_FOLLOWER), the consumer follows the error's leader hint to P at
    epoch 2 and reads every record once, in order.
    """
    from gregor.client import Consumer

    topic = "stale-consumer"
    p_, q, _ = await non_preferred_leader(cluster, topic)
    first = [f"before-{i}".encode() for i in range(10)]
    for v in first:
        await produce(q, [v], acks=-1, topic=topic)
    async with Consumer({"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "fetch.max.wait.ms": 500}) as c:
        c.assign([(topic, 0)])
        c.seek_to_beginning((topic, 0))
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(first):
            assert time.monotonic() < deadline, got
            got += [r.value for r in await c.poll(timeout_ms=500)]
        known = c.metadata.partition(topic, 0)
        assert known is not None and (known.leader, known.leader_epoch) == (q.id, 1)
        fenced_before = failed_fetches(q, "FENCED_LEADER_EPOCH")
        seen = errors_reported(c)

        p_ = await back_to_preferred(cluster, p_, q, topic)
        second = [f"after-{i}".encode() for i in range(10)]
        for v in second:
            await produce(p_, [v], acks=-1, topic=topic)
        deadline = time.monotonic() + 20
        while len(got) < len(first) + len(second):
            assert time.monotonic() < deadline, got
            got += [r.value for r in await c.poll(timeout_ms=500)]
        assert got == first + second
        # The consumer itself was fenced (Q's counter also counts R's replica fetcher, fenced the same way).
        assert (errors.Code.FENCED_LEADER_EPOCH, p_.id) in seen, seen  # Q names P, the new leader
        assert failed_fetches(q, "FENCED_LEADER_EPOCH") > fenced_before
        known = c.metadata.partition(topic, 0)
        assert known is not None and (known.leader, known.leader_epoch) == (p_.id, 2)


async def test_consumer_ahead_of_the_broker_backs_off_and_recovers(cluster: LocalCluster) -> None:
    """A consumer whose metadata names a newer leader epoch than the leader applied gets UNKNOWN_LEADER_EPOCH.

    Emulated by raising the epoch in the consumer's metadata cache (as an answer from a
    broker that already applied a newer LeaderAndIsr would): the leader refuses the
    fetch, the consumer backs off, refreshes and reads everything at the real epoch.
    """
    import dataclasses

    from gregor.client import Consumer

    topic = "ahead-consumer"
    brokers = cluster.by_role("broker")
    async with channel(brokers[0].grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=1, replication_factor=3)]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def led() -> bool:
        v = await view(brokers[0], topic)
        return bool(v) and v[0][0] >= 0
    await until(led, 15, "the partition has a leader")
    leader_id, epoch, _, _ = (await view(brokers[0], topic))[0]
    leader = broker(cluster, leader_id)
    values = [f"v{i}".encode() for i in range(5)]
    await produce(leader, values, acks=-1, topic=topic)
    unknown_before = failed_fetches(leader, "UNKNOWN_LEADER_EPOCH")
    async with Consumer({"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False}) as c:
        await c.metadata.wait_for_topic(topic, 10000)
        info = c.metadata.topics[topic]
        info.partitions[0] = dataclasses.replace(info.partitions[0], leader_epoch=epoch + 5)
        seen = errors_reported(c)
        c.assign([(topic, 0)])
        c.seek((topic, 0), 0)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(values):
            assert time.monotonic() < deadline, got
            got += [r.value for r in await c.poll(timeout_ms=500)]
        assert got == values
        assert c.metadata.partition(topic, 0).leader_epoch == epoch  # type: ignore[union-attr]
        assert (errors.Code.UNKNOWN_LEADER_EPOCH, leader_id) in seen, seen
    assert failed_fetches(leader, "UNKNOWN_LEADER_EPOCH") > unknown_before, "the newer epoch was refused first"
