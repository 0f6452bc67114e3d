"""A consumer group survives the loss of its coordinator (seed 003, 6.4: "the group's coordinator changed").

Two coordinators; the one owning the group is SIGKILLed. The member sees NOT_COORDINATOR /
COORDINATOR_NOT_AVAILABLE or a dead channel, finds the new coordinator with FindCoordinator,
keeps consuming, and its committed offsets survive (they live in __consumer_offsets).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import pytest

from gregor.client import AdminClient, Consumer, NewTopic, Producer
from gregor.client.group_admin import GroupAdmin
from gregor.common import errors
from tests.helpers.cluster import LocalCluster, stop_process, tear_down


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("failover")), brokers=1, controllers=1, coordinators=2,
                        lease_ttl_ms=2000, coordinator_overrides={"group.initial.rebalance.delay.ms": "0",
                                                                  "offsets.topic.replication.factor": "1"})
    try:
        yield c
    finally:
        tear_down(c)


async def test_member_follows_its_group_to_the_surviving_coordinator(cluster: LocalCluster) -> None:
    broker = cluster.by_role("broker")[0].grpc
    coordinators = cluster.by_role("coordinator")
    cfg = {"bootstrap.servers": broker, "group.id": "fo-g", "auto.offset.reset": "earliest",
           "coordinator.bootstrap.servers": ",".join(p.grpc for p in coordinators),
           "heartbeat.interval.ms": 300, "session.timeout.ms": 10000, "auto.commit.interval.ms": 200,
           "fetch.max.wait.ms": 100}
    async with AdminClient({"bootstrap.servers": broker}) as admin:
        await admin.create_topics([NewTopic("fo", 2, 1)])
    async with Producer({"bootstrap.servers": broker, "linger.ms": 0}) as p:
        for i in range(20):
            await (await p.send("fo", f"a{i}".encode(), partition=i % 2))
    seen: list[str] = []
    async with Consumer(cfg) as c, GroupAdmin(cfg) as admin:
        c.subscribe(["fo"])
        deadline = time.monotonic() + 60
        while len(seen) < 20 and time.monotonic() < deadline:
            seen += [r.value.decode() for r in await c.poll(200) if r.value]
        assert len(seen) == 20
        for _ in range(20):  # let an auto-commit land
            await c.poll(50)
        owner = await admin.find_coordinator("fo-g")
        committed_before = await admin.committed_offsets("fo-g")
        assert committed_before == {("fo", 0): 10, ("fo", 1): 10}
        victim = next(p for p in coordinators if p.grpc == owner)
        stop_process(victim, signal.SIGKILL)
        async with Producer({"bootstrap.servers": broker, "linger.ms": 0}) as p:
            for i in range(20):
                await (await p.send("fo", f"b{i}".encode(), partition=i % 2))
        deadline = time.monotonic() + 60
        while len(seen) < 40 and time.monotonic() < deadline:
            seen += [r.value.decode() for r in await c.poll(200) if r.value]
        assert {f"b{i}" for i in range(20)} <= set(seen)
        # Heartbeats find the dead channel, FindCoordinator names the survivor once it took the partition over.
        group = c._group
        assert group is not None
        deadline = time.monotonic() + 30
        while group.coordinator in (None, owner) and time.monotonic() < deadline:
            await c.poll(200)
        assert group.coordinator not in (None, owner)
        generation = group.generation
        for _ in range(10):
            await c.poll(100)
        assert group.generation >= generation >= 1 and sorted(c.assignment()) == [("fo", 0), ("fo", 1)]
        # Commits go to the new coordinator and continue from where the old one left off.
        await c.commit_sync()
        admin._owner.clear()
        for _ in range(50):
            try:
                got = await admin.committed_offsets("fo-g")
                break
            except errors.GregorError:
                await asyncio.sleep(0.2)
        assert got == {("fo", 0): 20, ("fo", 1): 20}
