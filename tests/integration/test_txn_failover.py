"""Transactions through coordinator and broker failures, real processes (seed 003 §6.8).

Two brokers, two coordinators. The output partition lives on one broker (X) and
the transactional id's __transaction_state partition on the other. With X
frozen (SIGSTOP) the commit's decision (PrepareCommit) is durable but no marker
can land; the coordinator owning the id is then SIGKILLed and X resumed: the
surviving coordinator takes the partition over, finds PrepareCommit and writes
the markers, so the transaction becomes visible whole, and until then
read_committed shows none of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Iterator

import pytest

from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.common.coordinator_ownership import partition_for
from gregor.common.rpc import channel
from gregor.rpc.v1 import coordinator_pb2, transaction_pb2, transaction_pb2_grpc
from gregor.rpc.v1 import broker_pb2_grpc
from tests.helpers.cluster import LocalCluster, tear_down

TXN_PARTITIONS = 5


def coordinator_overrides(offsets_partitions: int) -> dict[str, str]:
    """Both internal topics at RF 1 (the clusters have 2 brokers, one may be down), few partitions."""
    return {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": str(offsets_partitions),
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.num.partitions": str(TXN_PARTITIONS)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("txn-fo")), brokers=2, controllers=1, coordinators=2,
                        lease_ttl_ms=2000,
                        # Brokers keep their session through the few seconds X is frozen.
                        broker_overrides={"broker.session.timeout.ms": "20000"},
                        coordinator_overrides=coordinator_overrides(offsets_partitions=4))
    try:
        yield c
    finally:
        tear_down(c)


async def committed_values(address: str, topic: str, timeout_s: float) -> list[bytes]:
    out: list[bytes] = []
    async with Consumer({"bootstrap.servers": address, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100}) as c:
        c.assign([(topic, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(out) < 3:
            out += [r.value for r in await c.poll(200)]
    return out


async def test_new_coordinator_completes_a_commit_left_in_prepare(cluster: LocalCluster) -> None:
    brokers = {p.id: p for p in cluster.by_role("broker")}
    boot = ",".join(p.grpc for p in brokers.values())
    async with AdminClient({"bootstrap.servers": boot}) as admin:
        await admin.create_topics([NewTopic("fo-out", 1, 1)])
    async with Producer({"bootstrap.servers": boot, "transactional.id": "fo-warmup"}) as warm:
        await warm.init_transactions()  # creates __transaction_state
    async with Producer({"bootstrap.servers": boot, "linger.ms": 0}) as probe:
        await probe.metadata.wait_for_topic("fo-out", 10000)
        await probe.metadata.wait_for_topic("__transaction_state", 10000)
        x = probe.metadata.leader_for("fo-out", 0)
        # A transactional id whose state partition is led by the other broker.
        tid = next(t for t in (f"fo-{i}" for i in range(200))
                   if probe.metadata.leader_for("__transaction_state", partition_for(t, TXN_PARTITIONS)) != x)
    other = next(p for i, p in brokers.items() if i != x).grpc
    async with channel(other) as ch:
        found = await broker_pb2_grpc.BrokerServiceStub(ch).FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(group_id=tid, key_type=1), timeout=10)
    owner = next(p for p in cluster.by_role("coordinator") if p.id == found.coordinator_id)
    survivor = next(p for p in cluster.by_role("coordinator") if p.id != found.coordinator_id)

    p = Producer({"bootstrap.servers": boot, "transactional.id": tid, "linger.ms": 0})
    try:
        await p.init_transactions()
        await p.begin_transaction()
        for i in range(3):
            await (await p.send("fo-out", f"v{i}".encode(), partition=0))
        os.kill(brokers[x].pid, signal.SIGSTOP)  # no marker can land on X now
        try:
            await p.commit_transaction()  # PrepareCommit is durable on the other broker
            await asyncio.sleep(0.3)
            os.kill(owner.pid, signal.SIGKILL)
        finally:
            os.kill(brokers[x].pid, signal.SIGCONT)
    finally:
        await p.close()
    assert await committed_values(other, "fo-out", 20) == [b"v0", b"v1", b"v2"]
    # The killed owner never saw its markers acknowledged (X was frozen), so it never wrote CompleteCommit:
    # the survivor did, after taking the partition over and finding PrepareCommit. (A marker request already
    # in X's socket may land when X resumes; the outcome is the same commit, and the survivor's markers after
    # it complete nothing twice.)
    deadline = time.monotonic() + 20
    async with channel(survivor.grpc) as ch:
        while True:
            d = (await transaction_pb2_grpc.TransactionCoordinatorServiceStub(ch).DescribeTransactions(
                transaction_pb2.DescribeTransactionsRequest(transactional_ids=[tid]), timeout=10)).transactions[0]
            if d.state == "CompleteCommit" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert d.state == "CompleteCommit", d
    assert d.coordinator_id == survivor.id


@pytest.fixture
def rf2(tmp_path: str) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path), brokers=2, controllers=1, coordinators=1, lease_ttl_ms=2000,
                        coordinator_overrides=coordinator_overrides(offsets_partitions=2))
    try:
        yield c
    finally:
        tear_down(c)


async def test_markers_land_on_the_new_leader_when_the_leader_dies(rf2: LocalCluster) -> None:
    """The leader of a transaction's partition is frozen before the commit and SIGKILLed while the coordinator
    tries to write the marker: the marker lands on the new leader, and the transaction is visible there."""
    brokers = {p.id: p for p in rf2.by_role("broker")}
    boot = ",".join(p.grpc for p in brokers.values())
    async with AdminClient({"bootstrap.servers": boot}) as admin:
        await admin.create_topics([NewTopic("lk-out", 1, 2, {"min.insync.replicas": "1"})])
    async with Producer({"bootstrap.servers": boot, "transactional.id": "lk-warmup"}) as warm:
        await warm.init_transactions()
    async with Producer({"bootstrap.servers": boot, "linger.ms": 0}) as probe:
        await probe.metadata.wait_for_topic("lk-out", 10000)
        await probe.metadata.wait_for_topic("__transaction_state", 10000)
        leader = probe.metadata.leader_for("lk-out", 0)
        tid = next(t for t in (f"lk-{i}" for i in range(200))
                   if probe.metadata.leader_for("__transaction_state", partition_for(t, TXN_PARTITIONS)) != leader)
    survivor = next(p for i, p in brokers.items() if i != leader)
    p = Producer({"bootstrap.servers": boot, "transactional.id": tid, "linger.ms": 0})
    try:
        await p.init_transactions()
        await p.begin_transaction()
        for i in range(3):
            await (await p.send("lk-out", f"v{i}".encode(), partition=0))  # acks=all: on both replicas
        os.kill(brokers[leader].pid, signal.SIGSTOP)
        try:
            await p.commit_transaction()  # PrepareCommit is durable; the marker cannot land on the leader
            await asyncio.sleep(0.3)
        finally:
            os.kill(brokers[leader].pid, signal.SIGKILL)
            os.kill(brokers[leader].pid, signal.SIGCONT)
    finally:
        await p.close()
    assert await committed_values(survivor.grpc, "lk-out", 30) == [b"v0", b"v1", b"v2"]
