"""Seed 003's high watermark (6.6.2 - 6.6.5) with real processes: etcd, a controller, three brokers.

- "消费者只允许看到HW以下的message": a leader whose LEO runs ahead of its HW (acks=1,
  both followers SIGSTOPped before they fetch) serves consumers only what lies below
  the HW, and ListOffsets(latest) answers the HW; once the followers resume, the HW
  catches up and the records become visible.
- The data-loss anomaly of HW-only truncation (6.6.4): a follower restarts while its
  high watermark lags the acknowledged records, then the leader dies. Truncating to
  the HW on restart (the pre-0.11 rule) would cut acknowledged records that the
  follower then leads without. With leader epochs the follower keeps its log (the
  leader answers OffsetForLeaderEpoch with its LEO), and after the leader's death
  every acknowledged record is still there. The divergence anomaly (the new leader
  writes at offsets the old one also used) is seed 002's case (b), in
  test_seed002.py; both are scripted against the HW-only rule in
  tests/sim/test_seed003_anomalies.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import grpc
import pytest

from gregor.broker.checkpoint import REPLICATION_OFFSET_CHECKPOINT, read_offsets
from gregor.broker.replica_fetcher import REPLICA_FETCH_WAIT_MAX_MS
from gregor.cli.local_cluster import LocalCluster, Process, stop_process
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch, record_values
from tests.helpers.cluster import replica_log_bytes, replica_values, restart_broker, running_cluster
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

LEASE_TTL_MS = 2000  # the controller's lease
# Followers are SIGSTOPped for about a second; their registrations (keepalive every third of
# this) must outlive that, and replica.lag.time.max.ms keeps its default (30 s) so the pause
# does not shrink the ISR: the HW must stay where the stopped followers hold it.
BROKER_SESSION_TIMEOUT_MS = 6000
OVERRIDES = {"broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS)}
# A follower's long poll parked at the leader when it is stopped is answered (empty) after
# replica.fetch.wait.max.ms; records appended after that reach no stopped follower.
PARKED_FETCH_DRAINED_S = REPLICA_FETCH_WAIT_MAX_MS / 1000 + 0.3
FAILOVER_WITHIN_S = BROKER_SESSION_TIMEOUT_MS / 1000 + 8  # registration expiry + election + UpdateMetadata
# A restarted broker waits out its old registration, registers, follows, catches up; its ISR
# return reaches the controller after 5 s of quiet + the 2.5 s propagation check.
REJOIN_WITHIN_S = BROKER_SESSION_TIMEOUT_MS / 1000 + 5 + 2.5 + 15


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("seed003")), brokers=3, controllers=1,
                         lease_ttl_ms=LEASE_TTL_MS, broker_overrides=OVERRIDES) as c:
        yield c


def by_id(cluster: LocalCluster, broker_id: int) -> Process:
    return next(b for b in cluster.by_role("broker") if b.id == broker_id)


async def create(p: Process, topic: str, replicas: list[int] | None = None, configs: dict[str, str] | None = None,
                 rf: int = 3) -> None:
    t = controller_pb2.CreatableTopic(name=topic, num_partitions=1, replication_factor=rf, configs=configs or {})
    if replicas:
        t = controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1, configs=configs or {},
                                          assignments={0: controller_pb2.ReplicaList(broker_ids=replicas)})
    async with channel(p.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(
            controller_pb2.CreateTopicsRequest(topics=[t]), timeout=30)
    assert resp.results[0].error.code == 0, resp


async def view(p: Process, topic: str) -> tuple[int, int, tuple[int, ...]]:
    """(leader, leader epoch, sorted isr) of partition 0 in p's metadata; (-1, -1, ()) while unknown."""
    try:
        v = partitions(await metadata(p, topic))
    except grpc.aio.AioRpcError:
        return -1, -1, ()
    if 0 not in v:
        return -1, -1, ()
    leader, epoch, _, isr = v[0]
    return leader, epoch, tuple(sorted(isr))


async def produce(p: Process, topic: str, values: list[bytes], acks: int) -> int:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=0, records=make_batch(values), acks=acks, timeout_ms=10000), timeout=15)
    return resp.base_offset


async def consume(p: Process, topic: str, offset: int = 0, max_wait_ms: int = 0) -> tuple[int, list[bytes]]:
    """A consumer's Fetch (no replica_id): (high watermark, values) from offset on."""
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=offset, max_bytes=1 << 24, min_bytes=1 if max_wait_ms else 0,
            max_wait_ms=max_wait_ms), timeout=5 + max_wait_ms / 1000)
    return resp.high_watermark, record_values(resp.records)


async def latest(p: Process, topic: str) -> int:
    """ListOffsets(latest): the offset a consumer's end_offsets() gets."""
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).ListOffsets(
            broker_pb2.ListOffsetsRequest(topic=topic, partition=0, timestamp_ms=-1), timeout=5)
    return resp.offset


async def test_consumers_read_only_below_the_high_watermark(cluster: LocalCluster) -> None:
    topic = "below-hw"
    brokers = cluster.by_role("broker")
    await create(brokers[0], topic)

    async def full_isr() -> bool:
        leader, _, isr = await view(brokers[0], topic)
        return leader >= 0 and len(isr) == 3
    await until(full_isr, 15, "the partition has a leader and a full ISR")
    leader = by_id(cluster, (await view(brokers[0], topic))[0])
    followers = [b for b in brokers if b.id != leader.id]
    committed = [f"c{i}".encode() for i in range(5)]
    assert await produce(leader, topic, committed, acks=-1) == 0
    assert await consume(leader, topic) == (5, committed)

    for f in followers:
        os.kill(f.pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(PARKED_FETCH_DRAINED_S)
        above = [f"u{i}".encode() for i in range(3)]
        assert await produce(leader, topic, above, acks=1) == 5  # acks=1: the leader alone has them
        assert replica_values(leader, topic, 0) == committed + above  # LEO 8 on the leader's disk
        # The HW stays at 5: both followers are in the ISR (30 s lag allowed) with LEO 5.
        assert await consume(leader, topic) == (5, committed)
        assert await consume(leader, topic, offset=5) == (5, [])  # at the HW: nothing, not out of range
        assert await consume(leader, topic, offset=6) == (5, [])  # between HW and LEO: nothing either
        # A long poll is not answered by records above the HW: it waits its whole max_wait_ms.
        waited = time.monotonic()
        assert await consume(leader, topic, offset=5, max_wait_ms=300) == (5, [])
        assert time.monotonic() - waited >= 0.3
        assert await latest(leader, topic) == 5
        assert (await view(leader, topic))[2] == tuple(sorted(b.id for b in brokers))
    finally:
        for f in followers:
            os.kill(f.pid, signal.SIGCONT)

    async def visible() -> bool:
        return await consume(leader, topic) == (8, committed + above)
    await until(visible, 10, "the followers fetch, the HW reaches 8, the records become visible")
    assert await latest(leader, topic) == 8


async def test_follower_restart_then_leader_death_loses_no_acked_record(cluster: LocalCluster) -> None:
    """Seed 003 6.6.4's data loss, with leader epochs: it does not happen.

    RF 2 (A leads, B follows), min.insync.replicas 2, acks=all. B is SIGKILLed right after
    the last acknowledgement, while its HW (in memory and in replication-offset-checkpoint)
    is still below the acknowledged records: the HW lags the data by one fetch round (the
    seed's second fetch). B restarts: HW-only truncation would cut what lies above that
    HW. B instead asks A OffsetForLeaderEpoch for its latest epoch and truncates nothing.
    As soon as the controller has B back in the ISR, A is SIGKILLed: B leads, and every
    acknowledged record is there, at its offset; A returns and both replicas are identical.
    """
    topic = "hw-loss"
    a, b = sorted(cluster.by_role("broker"), key=lambda p: p.id)[:2]
    await create(a, topic, replicas=[a.id, b.id], configs={"min.insync.replicas": "2"})

    async def led_by_a() -> bool:
        return await view(a, topic) == (a.id, 0, tuple(sorted((a.id, b.id))))
    await until(led_by_a, 15, "A leads with ISR {A, B}")
    acked = [f"m{i}".encode() for i in range(10)]
    for i, v in enumerate(acked):
        assert await produce(a, topic, [v], acks=-1) == i
    await asyncio.to_thread(stop_process, b, signal.SIGKILL)

    hw_checkpointed = read_offsets(os.path.join(b.data_dir, REPLICATION_OFFSET_CHECKPOINT)).get((topic, 0), 0)
    assert replica_values(b, topic, 0) == acked
    # The seed's precondition: B's HW lags the acknowledged records (here by >= 1 of 10).
    assert hw_checkpointed < len(acked), hw_checkpointed
    b_bytes = replica_log_bytes(b, topic, 0)
    print(f"\n[hw-loss] B's checkpointed HW {hw_checkpointed} of {len(acked)} acknowledged records")

    b = await asyncio.to_thread(restart_broker, cluster, b, OVERRIDES)

    async def b_back_in_isr() -> bool:
        leader, _, isr = await view(a, topic)
        return leader == a.id and isr == tuple(sorted((a.id, b.id)))
    await until(b_back_in_isr, REJOIN_WITHIN_S, "B follows again and the controller has it in the ISR")
    # B truncated nothing: same bytes, and no truncation in its log since it registered again.
    assert replica_log_bytes(b, topic, 0) == b_bytes
    with open(b.log, errors="replace") as f:
        since_restart = f.read().split(f"registered with broker epoch {b.extra['broker_epoch']}")[-1]
    assert f"{topic}-0: truncating" not in since_restart
    epoch_before = (await view(a, topic))[1]

    await asyncio.to_thread(stop_process, a, signal.SIGKILL)  # the leader dies right after

    async def b_leads() -> bool:
        leader, epoch, _ = await view(b, topic)
        return leader == b.id and epoch > epoch_before
    await until(b_leads, FAILOVER_WITHIN_S, "B leads (clean election: it is in the ISR)")
    hw, seen = await consume(b, topic)
    assert (hw, seen) == (len(acked), acked), "every acknowledged record survives, at its offset"

    a = await asyncio.to_thread(restart_broker, cluster, a, OVERRIDES)

    async def identical() -> bool:
        return replica_log_bytes(a, topic, 0) == replica_log_bytes(b, topic, 0)
    await until(identical, REJOIN_WITHIN_S, "A follows B and both replicas are byte-identical")
    assert replica_values(a, topic, 0) == acked
