"""A coordinator whose etcd lease is lost grants a new one, registers on it and claims its shards again,
and transactions complete through it (ownership.py LeaseFence), as real processes: etcd, a controller, a
broker and one group/transaction coordinator with a 2 s lease.

Before, a lost lease either stopped the process (the Lease's keepalive saw TTL 0 or gave up after the
TTL) or, when only the lease clock had stopped, left it fenced for good: the TLS chaos schedule's
etcd-kill left the single transaction coordinator refusing every `__transaction_state` write ("only
certain for -69411 ms") for the rest of the run, with nothing re-claiming its shards."""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from typing import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_coordinator
from gregor.client import AdminClient, Consumer, Producer
from gregor.client.admin import NewTopic
from gregor.common.etcd import EtcdClient
from gregor.common.etcd_layout import CoordinatorsZNode
from tests.helpers.cluster import etcd_endpoints, tear_down
from tests.helpers.wait import until

LEASE_TTL_MS = 2000
PARTITIONS = 2  # of __consumer_offsets and of __transaction_state
OVERRIDES = {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": str(PARTITIONS),
             "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
             "transaction.state.log.num.partitions": str(PARTITIONS)}


@pytest.fixture
def cluster(tmp_path: str) -> Iterator[LocalCluster]:
    # The controller and the broker keep their default 10 s leases: only the coordinator's is short.
    c = LocalCluster.up(str(tmp_path), brokers=1, controllers=1)
    try:
        c.processes.append(start_coordinator(c.data_dir, 0, etcd_endpoints(c), lease_ttl_ms=LEASE_TTL_MS,
                                             overrides=OVERRIDES))
        yield c
    finally:
        tear_down(c)


def losses(p: Process, reason: str) -> float:
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    name = f'gregor_coordinator_lease_losses_total{{reason="{reason}"}}'
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name))


async def leases(etcd: EtcdClient, coordinator_id: int) -> tuple[int | None, set[int | None]]:
    """The lease of the coordinator's registration and the leases of its claims (None: a claim missing)."""
    reg = await etcd.get(CoordinatorsZNode.id_key(etcd, coordinator_id))
    claims = set()
    for kind in (CoordinatorsZNode.OFFSETS_CLAIMS, CoordinatorsZNode.TXN_CLAIMS):
        for p in range(PARTITIONS):
            kv = await etcd.get(CoordinatorsZNode.claim_key(etcd, kind, p))
            claims.add(kv.lease if kv is not None and kv.value == CoordinatorsZNode.encode_claim(coordinator_id)
                       else None)
    return (reg.lease if reg is not None else None), claims


async def transaction(producer: Producer, value: bytes) -> None:
    await producer.begin_transaction()
    for p in range(2):
        await (await producer.send("ll-out", value, partition=p))
    await producer.commit_transaction()


async def lose_the_lease_and_recover(cluster: LocalCluster, *, revoke: bool = False, pause_etcd_s: float = 0.0) -> tuple[int, int]:
    """A transaction commits, the lease is lost (revoked in etcd, or etcd paused past the TTL), and then:
    the coordinator runs on, registered and holding every shard on a new lease, and a transaction of the
    same producer commits. Returns (old lease, new lease)."""
    coordinator = cluster.by_role("coordinator")[0]
    etcd_proc = cluster.by_role("etcd")[0]
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        await admin.create_topics([NewTopic("ll-out", 2, 1)])
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "ll-tid", "linger.ms": 0})
    async with EtcdClient(cluster.etcd_endpoints, cluster="gregor") as etcd:
        try:
            await asyncio.wait_for(producer.init_transactions(), 60)
            await asyncio.wait_for(transaction(producer, b"before"), 60)

            async def all_claimed_on_one_lease() -> int | None:
                reg, claims = await leases(etcd, coordinator.id)
                return reg if reg is not None and claims == {reg} else None

            await until(all_claimed_on_one_lease, 30, "every shard claimed on the registration's lease")
            old = await all_claimed_on_one_lease()
            assert old is not None
            if revoke:
                await etcd.revoke(old)  # what an expiry does: the registration and every claim go at once
            if pause_etcd_s:
                os.kill(etcd_proc.pid, signal.SIGSTOP)  # no keepalive answered for longer than the TTL
                try:
                    await asyncio.sleep(pause_etcd_s)
                finally:
                    os.kill(etcd_proc.pid, signal.SIGCONT)

            async def claimed_again() -> bool:
                lease = await all_claimed_on_one_lease()
                return lease is not None and lease != old

            await until(claimed_again, 60, "the coordinator registered and claimed every shard on a new lease")
            assert coordinator.alive(), "the coordinator stopped on losing its lease"
            new = await all_claimed_on_one_lease()
            assert new is not None
            await asyncio.wait_for(transaction(producer, b"after"), 60)
            await a_group_joins_and_commits(cluster.bootstrap)
        finally:
            await producer.close()
    return old, new


async def a_group_joins_and_commits(bootstrap: str) -> None:
    """The group coordinator side of the same instance serves again: a consumer joins, reads both committed
    transactions read_committed and commits its offsets."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ll-group", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                         "fetch.max.wait.ms": 100})
    try:
        consumer.subscribe(["ll-out"])
        seen: list[bytes] = []

        async def read_both() -> bool:
            seen.extend(r.value for r in await consumer.poll(200) if r.value is not None)
            return sorted(seen) == [b"after", b"after", b"before", b"before"]

        await until(read_both, 60, "the group member reads both transactions")
        await asyncio.wait_for(consumer.commit_sync(), 30)
        committed = await consumer.committed([("ll-out", 0), ("ll-out", 1)])
        assert all(v is not None and v >= 3 for v in committed.values()), committed  # past "after" (offset 2)
    finally:
        await consumer.close()


async def test_a_revoked_lease_is_replaced_and_the_shards_claimed_again(cluster: LocalCluster) -> None:
    old, new = await lose_the_lease_and_recover(cluster, revoke=True)
    coordinator = cluster.by_role("coordinator")[0]
    with open(coordinator.log) as f:
        text = f.read()
    assert "coordinator lease lost" in text and f"coordinator lease {new:x} replaces lost lease {old:x}" in text
    assert losses(coordinator, "expired") == 1


async def test_a_lease_not_refreshed_within_its_ttl_is_replaced(cluster: LocalCluster) -> None:
    """etcd answers nothing for 3 TTLs (SIGSTOP): the coordinator cannot know its lease is alive, gives its
    shards up once the lease may have expired, and once etcd answers again holds them on a new lease."""
    old, new = await lose_the_lease_and_recover(cluster, pause_etcd_s=3 * LEASE_TTL_MS / 1000)
    coordinator = cluster.by_role("coordinator")[0]
    with open(coordinator.log) as f:
        text = f.read()
    assert "not refreshed within its TTL" in text and f"replaces lost lease {old:x}" in text
    assert losses(coordinator, "not_refreshed") >= 1
