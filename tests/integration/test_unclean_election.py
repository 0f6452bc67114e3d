"""Unclean leader election with real processes: etcd, one controller, two cluster-mode brokers.

Two topics with one partition on brokers [A, B] (A the preferred leader):
`clean` keeps the default `unclean.leader.election.enable=false`, `dirty` sets it
to true. B is SIGSTOPped, A takes records alone and the ISRs shrink to [A]
(seen in the controller's metadata); then A is SIGKILLed and B resumed.

- clean: no live ISR member, so the partition goes offline: leader -1 in B's
  Metadata, OfflinePartitionsCount 1, listed by `topics describe
  --unavailable-partitions`; when A comes back it leads again (onBrokerStartup
  elects offline partitions) with every acknowledged record.
- dirty: the out-of-sync B is elected, UncleanLeaderElections counts 1, and the
  records only A had are gone from the partition.

A has a short session (2 s) so its death is seen fast; B a long one so its
registration survives the stop (the ISR shrink plus its propagation take ~10 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, start_controller, start_etcd, stop_process
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import tear_down
from tests.helpers.batches import make_batch, record_values
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

LEASE_TTL_MS = 2000
REPLICA_LAG_TIME_MAX_MS = 1000
A_SESSION_TIMEOUT_MS = 2000
B_SESSION_TIMEOUT_MS = 25000
# Shrink: lag + one expiration period; propagation: 5 s of quiet + the 2.5 s check; then UpdateMetadata.
ISR_PROPAGATION_MARGIN_S = REPLICA_LAG_TIME_MAX_MS / 1000 * 1.5 + 5 + 2.5 + 4
FAILOVER_MARGIN_S = A_SESSION_TIMEOUT_MS / 1000 + 6
A, B = 0, 1
CLEAN, DIRTY = "clean", "dirty"


def overrides(session_ms: int) -> dict[str, str]:
    return {"broker.session.timeout.ms": str(session_ms), "replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS)}


@pytest.fixture()
def cluster(tmp_path: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(str(tmp_path))
    try:
        etcd = start_etcd(c.data_dir)
        c.processes.append(etcd)
        c.processes.append(start_controller(c.data_dir, 0, etcd.grpc, lease_ttl_ms=LEASE_TTL_MS))
        c.processes.append(start_broker(c.data_dir, A, overrides=overrides(A_SESSION_TIMEOUT_MS),
                                        etcd_endpoint=etcd.grpc))
        c.processes.append(start_broker(c.data_dir, B, overrides=overrides(B_SESSION_TIMEOUT_MS),
                                        etcd_endpoint=etcd.grpc))
        c.save()
        yield c
    finally:
        tear_down(c)


def node(c: LocalCluster, broker_id: int) -> Process:
    return next(p for p in c.by_role("broker") if p.id == broker_id)


def controller_metric(c: LocalCluster, name: str) -> float:
    with urllib.request.urlopen(c.by_role("controller")[0].metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def view(p: Process, topic: str) -> tuple[int, int, tuple[int, ...], tuple[int, ...]] | None:
    """(leader, leader epoch, replicas, isr) of partition 0 as p's Metadata shows it."""
    return partitions(await metadata(p, topic)).get(0)


async def produce(p: Process, topic: str, values: list[bytes], acks: int) -> int:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=0, records=make_batch(values), acks=acks, timeout_ms=10000), timeout=15)
    return resp.base_offset


async def consume(p: Process, topic: str) -> tuple[int, list[bytes]]:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=0, max_bytes=1 << 24, min_bytes=0, max_wait_ms=0), timeout=5)
    return resp.high_watermark, record_values(resp.records)


def describe(p: Process, *flags: str) -> list[tuple[str, int]]:
    """(topic, partition) pairs `gregor --output json topics describe FLAGS` lists, bootstrapping from p."""
    out = subprocess.run([sys.executable, "-m", "gregor.cli.main", "--output", "json", "topics", "describe", *flags],
                         env={**os.environ, "GREGOR_BOOTSTRAP": p.grpc}, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return sorted((t["topic"], part["partition"]) for t in json.loads(out.stdout) for part in t["partitions"])


async def test_last_isr_member_dies_offline_when_clean_stale_follower_when_unclean(cluster: LocalCluster) -> None:
    a, b = node(cluster, A), node(cluster, B)
    async with channel(b.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(name=CLEAN, num_partitions=-1, replication_factor=-1,
                                          assignments={0: controller_pb2.ReplicaList(broker_ids=[A, B])}),
            controller_pb2.CreatableTopic(name=DIRTY, num_partitions=-1, replication_factor=-1,
                                          assignments={0: controller_pb2.ReplicaList(broker_ids=[A, B])},
                                          configs={"unclean.leader.election.enable": "true"})]), timeout=30)
    assert [r.error.code for r in resp.results] == [0, 0], resp

    async def led_by_a_in_sync() -> bool:
        views = [await view(b, t) for t in (CLEAN, DIRTY)]
        return all(v is not None and v[0] == A and len(v[3]) == 2 for v in views)
    await until(led_by_a_in_sync, 15, "A leads both partitions with ISR [A, B]")
    assert controller_metric(cluster, "gregor_controller_global_topics") == 2
    assert controller_metric(cluster, "gregor_controller_global_partitions") == 2
    for t in (CLEAN, DIRTY):
        for i in range(3):
            assert await produce(a, t, [f"{t}-synced-{i}".encode()], acks=-1) == i
    epoch_before = {t: (await view(a, t))[1] for t in (CLEAN, DIRTY)}  # type: ignore[index]

    os.kill(b.pid, signal.SIGSTOP)
    try:
        # New data makes the stopped follower fall behind; acks=1 answers at once.
        for t in (CLEAN, DIRTY):
            await produce(a, t, [f"{t}-a-only-3".encode()], acks=1)

        async def shrunk() -> bool:
            views = [await view(a, t) for t in (CLEAN, DIRTY)]
            return all(v is not None and v[3] == (A,) for v in views)
        await until(shrunk, ISR_PROPAGATION_MARGIN_S, "the controller's metadata shows both ISRs shrunk to [A]")
        # With the ISR at [A] (min.insync.replicas 1), acks=all is acknowledged by A alone.
        for t in (CLEAN, DIRTY):
            assert await produce(a, t, [f"{t}-a-only-4".encode()], acks=-1) == 4
        stop_process(a, signal.SIGKILL)
    finally:
        os.kill(b.pid, signal.SIGCONT)

    async def failed_over() -> bool:
        clean, dirty = await view(b, CLEAN), await view(b, DIRTY)
        return clean is not None and clean[0] == -1 and dirty is not None and dirty[0] == B
    await until(failed_over, FAILOVER_MARGIN_S, "clean-0 offline and dirty-0 led by B in B's metadata")
    clean, dirty = await view(b, CLEAN), await view(b, DIRTY)
    assert clean is not None and clean[3] == (A,)  # the last ISR member stays in the ISR
    assert dirty is not None and dirty[3] == (B,) and dirty[1] > epoch_before[DIRTY]
    assert controller_metric(cluster, "gregor_controller_offline_partitions") == 1
    assert controller_metric(cluster, "gregor_controller_unclean_leader_elections_total") == 1
    assert controller_metric(cluster, "gregor_controller_preferred_replica_imbalance") == 2
    # The CLI in cluster mode, bootstrapping from the surviving broker.
    assert describe(b, "--unavailable-partitions") == [(CLEAN, 0)]
    assert describe(b, "--under-replicated-partitions") == [(CLEAN, 0), (DIRTY, 0)]
    # The unclean leader lost what only A had.
    hw, seen = await consume(b, DIRTY)
    # (a-only-3 may have reached B in a fetch answered just before the stop; a-only-4 cannot have.)
    assert seen[:3] == [f"{DIRTY}-synced-{i}".encode() for i in range(3)] and b"dirty-a-only-4" not in seen, seen

    # A comes back: onBrokerStartup elects it for the offline partition, with everything it acknowledged.
    back = start_broker(cluster.data_dir, A, overrides=overrides(A_SESSION_TIMEOUT_MS),
                        etcd_endpoint=cluster.by_role("etcd")[0].grpc)
    cluster.processes = [p for p in cluster.processes if p.pid != a.pid] + [back]

    async def clean_led_by_a() -> bool:
        v = await view(b, CLEAN)
        return v is not None and v[0] == A
    await until(clean_led_by_a, 15, "A leads clean-0 again")
    assert (await view(b, CLEAN))[1] > epoch_before[CLEAN]  # type: ignore[index]
    assert (await view(b, DIRTY))[0] == B  # a live leader is not moved
    hw, seen = await consume(back, CLEAN)
    assert seen == [*(f"{CLEAN}-synced-{i}".encode() for i in range(3)), b"clean-a-only-3", b"clean-a-only-4"], seen
    assert controller_metric(cluster, "gregor_controller_offline_partitions") == 0
    assert controller_metric(cluster, "gregor_controller_unclean_leader_elections_total") == 1
    assert describe(b, "--unavailable-partitions") == []
