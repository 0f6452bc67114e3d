"""The group coordinator as real processes: etcd, a controller, a broker and coordinators over raw gRPC."""

from __future__ import annotations

import asyncio
import os
import signal
import re
import time
import urllib.request
from typing import Any, Awaitable, Callable, Iterator, TypeVar

import pytest

from gregor.cli.local_cluster import LocalCluster, start_coordinator, stop_process
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.common.coordinator_ownership import partition_for
from gregor.common.etcd import EtcdClient
from gregor.common.etcd_layout import CoordinatorsZNode
from gregor.common import errors
from gregor.rpc.v1 import coordinator_pb2 as pb
from tests.helpers.cluster import tear_down
from tests.helpers.wait import until
from tests.integration.coordinator_client import Member, call, join_and_sync, stub

T = TypeVar("T")
LEASE_TTL_MS = 2000
OVERRIDES = {"offsets.topic.num.partitions": "4", "group.initial.rebalance.delay.ms": "0",
             "group.min.session.timeout.ms": "500"}


def up(path: str, coordinators: int) -> LocalCluster:
    return LocalCluster.up(path, brokers=1, controllers=1, coordinators=coordinators, lease_ttl_ms=LEASE_TTL_MS,
                           coordinator_overrides=OVERRIDES)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = up(str(tmp_path_factory.mktemp("groups")), coordinators=1)
    try:
        yield c
    finally:
        tear_down(c)


def coordinator_addr(c: LocalCluster, i: int = 0) -> str:
    return next(p.grpc for p in c.by_role("coordinator") if p.id == i)


async def retrying(fn: Callable[[], Awaitable[T]], timeout_s: float = 20) -> T:
    """fn() until it stops failing with a retriable error (load in progress, not coordinator yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fn()
        except errors.GregorError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def fetch_offsets(s: Any, group: str) -> dict[tuple[str, int], int]:
    resp = await call(s.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=10))
    return {(p.topic, p.partition): p.offset for p in resp.partitions}


async def describe(s: Any, group: str) -> pb.GroupDescription:
    resp = await call(s.DescribeGroups(pb.DescribeGroupsRequest(group_ids=[group]), timeout=10))
    return resp.groups[0]


async def test_three_members_join_sync_heartbeat_and_leave(cluster: LocalCluster) -> None:
    ch, s = stub(coordinator_addr(cluster))
    async with ch:
        members = [Member(s, "g-basic", ["orders"]) for _ in range(3)]
        assignments = await retrying(lambda: join_and_sync(members, {"orders": 6}))
        # With group.initial.rebalance.delay.ms=0 a join that arrives after the first join phase
        # completed starts another generation (Kafka does the same), so under load the three may
        # settle in a later generation: what counts is that they share one.
        gens = {m.generation for m in members}
        assert len(gens) == 1
        gen = gens.pop()
        assert len({m.leader for m in members}) == 1
        got = sorted(p for a in assignments for _, ps in a.partitions for p in ps)
        assert got == list(range(6)) and all(len(a.partitions[0][1]) == 2 for a in assignments)
        for m in members:
            await m.heartbeat()
        d = await describe(s, "g-basic")
        assert (d.state, d.protocol, d.generation_id, len(d.members)) == ("Stable", "range", gen, 3)
        assert all(x.client_host == "/127.0.0.1" and x.assignment for x in d.members)
        listing = await call(s.ListGroups(pb.ListGroupsRequest(), timeout=10))
        assert ("g-basic", "Stable", "consumer") in [(g.group_id, g.state, g.protocol_type) for g in listing.groups]
        # One member leaves: the others learn through their heartbeat and rejoin into generation 2.
        await members[2].leave()
        with pytest.raises(errors.GregorError) as ei:
            await members[0].heartbeat()
        assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS
        await join_and_sync(members[:2], {"orders": 6})
        assert {m.generation for m in members[:2]} == {gen + 1}
        with pytest.raises(errors.GregorError) as ei:
            await members[2].heartbeat()
        assert ei.value.code == errors.Code.UNKNOWN_MEMBER_ID
        with pytest.raises(errors.GregorError) as ei:
            await members[0].commit({("orders", 0): 5}, generation=gen)
        assert ei.value.code == errors.Code.ILLEGAL_GENERATION
        bad = Member(s, "g-basic", ["orders"], session_timeout_ms=100)
        with pytest.raises(errors.GregorError) as ei:
            await bad.join()
        assert ei.value.code == errors.Code.INVALID_SESSION_TIMEOUT
    await asyncio.sleep(0.3)  # gauges refresh on the coordinator's tick
    proc = cluster.by_role("coordinator")[0]
    with urllib.request.urlopen(proc.metrics, timeout=5) as r:
        text = r.read().decode()
    assert "gregor_coordinator_partitions_owned 4.0" in text
    assert "gregor_coordinator_partitions_loading 0.0" in text
    assert 'gregor_coordinator_groups{state="Stable"}' in text
    assert re.search(r"^gregor_coordinator_rebalances_total [1-9]", text, re.M)
    assert re.search(r"^gregor_coordinator_offset_commits_total", text, re.M)


async def test_session_timeout_evicts_member_and_triggers_rebalance(cluster: LocalCluster) -> None:
    ch, s = stub(coordinator_addr(cluster))
    async with ch:
        alive, silent = (Member(s, "g-session", ["t"], session_timeout_ms=1500) for _ in range(2))
        await retrying(lambda: join_and_sync([alive, silent], {"t": 2}))
        gen = alive.generation
        start = time.monotonic()
        with pytest.raises(errors.GregorError) as ei:
            while time.monotonic() - start < 10:
                await alive.heartbeat()  # `silent` sends nothing
                await asyncio.sleep(0.2)
        assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS
        assert 1.2 < time.monotonic() - start < 5
        await join_and_sync([alive], {"t": 2})
        assert alive.generation == gen + 1 and alive.assignment is not None
        assert alive.assignment.partitions == [("t", [0, 1])]
        d = await describe(s, "g-session")
        assert [x.member_id for x in d.members] == [alive.member_id]


async def test_static_member_rejoins_without_rebalance(cluster: LocalCluster) -> None:
    ch, s = stub(coordinator_addr(cluster))
    async with ch:
        a = Member(s, "g-static", ["t"], instance_id="host-a")
        b = Member(s, "g-static", ["t"], instance_id="host-b")
        await retrying(lambda: join_and_sync([a, b], {"t": 4}))
        old_id, old_assignment, gen = b.member_id, b.assignment, b.generation
        # host-b restarts: a new process with the same group.instance.id and no member id.
        b2 = Member(s, "g-static", ["t"], instance_id="host-b")
        await b2.join()
        assert b2.member_id != old_id and b2.generation == gen
        assert await b2.sync() == old_assignment
        await a.heartbeat()  # no rebalance for the others
        await b2.heartbeat()
        d = await describe(s, "g-static")
        assert (d.state, d.generation_id) == ("Stable", gen)
        with pytest.raises(errors.GregorError) as ei:
            await b.heartbeat()
        assert ei.value.code == errors.Code.FENCED_INSTANCE_ID


async def test_partition_count_change_triggers_rebalance(cluster: LocalCluster) -> None:
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        await admin.create_topic("grow", 2, 1)
        ch, s = stub(coordinator_addr(cluster))
        async with ch:
            m = Member(s, "g-grow", ["grow"])
            other = Member(s, "g-grow-other", ["unrelated"])
            await retrying(lambda: join_and_sync([m], {"grow": 2}))
            await retrying(lambda: join_and_sync([other], {"unrelated": 1}))
            await m.heartbeat()
            await admin.create_partitions("grow", 3)
            deadline = time.monotonic() + 10
            with pytest.raises(errors.GregorError) as ei:
                while time.monotonic() < deadline:
                    await m.heartbeat()
                    await asyncio.sleep(0.1)
            assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS
            await other.heartbeat()  # a group not subscribed to the topic is left alone
            await join_and_sync([m], {"grow": 3})
            assert m.generation == 2 and m.assignment is not None
            assert m.assignment.partitions == [("grow", [0, 1, 2])]


async def test_delete_groups_and_offset_errors(cluster: LocalCluster) -> None:
    ch, s = stub(coordinator_addr(cluster))
    async with ch:
        m = Member(s, "g-del", ["t"])
        await retrying(lambda: join_and_sync([m], {"t": 1}))
        await m.commit({("t", 0): 7})
        resp = await call(s.DeleteGroups(pb.DeleteGroupsRequest(group_ids=["g-del", "g-never"]), timeout=10))
        assert resp.errors["g-del"].code == errors.Code.NON_EMPTY_GROUP
        assert resp.errors["g-never"].code == errors.Code.GROUP_ID_NOT_FOUND
        await m.leave()
        assert (await describe(s, "g-del")).state == "Empty"
        assert await fetch_offsets(s, "g-del") == {("t", 0): 7}
        resp = await call(s.DeleteGroups(pb.DeleteGroupsRequest(group_ids=["g-del"]), timeout=10))
        assert resp.errors["g-del"].code == errors.Code.NONE
        assert await fetch_offsets(s, "g-del") == {}
        assert (await describe(s, "g-del")).state == "Dead"
        # A commit outside any generation (admin reset) on an unknown group creates it Empty.
        admin = Member(s, "g-admin", ["t"])
        res = await admin.commit({("t", 0): 3, ("t", -1): 1}, generation=-1)
        codes = {(r.topic, r.partition): r.error.code for r in res.results}
        assert codes == {("t", 0): errors.Code.NONE, ("t", -1): errors.Code.INVALID_REQUEST}
        with pytest.raises(errors.GregorError) as ei:
            await call(s.OffsetFetch(pb.OffsetFetchRequest(group_id=""), timeout=10))
        assert ei.value.code == errors.Code.INVALID_GROUP_ID


async def test_committed_offsets_and_groups_survive_coordinator_restart(tmp_path: Any) -> None:
    c = up(str(tmp_path / "restart"), coordinators=1)
    try:
        ch, s = stub(coordinator_addr(c))
        async with ch:
            m = Member(s, "g-restart", ["t"], session_timeout_ms=30000)
            await retrying(lambda: join_and_sync([m], {"t": 2}))
            await m.commit({("t", 0): 11, ("t", 1): 22})
            gone = Member(s, "g-gone", ["t"])
            await gone.commit({("t", 0): 5}, generation=-1)
            await call(s.DeleteGroups(pb.DeleteGroupsRequest(group_ids=["g-gone"]), timeout=10))
        old = c.by_role("coordinator")[0]
        stop_process(old, signal.SIGTERM)
        c.processes.remove(old)
        etcd = ",".join(p.grpc for p in c.by_role("etcd"))
        new = start_coordinator(c.data_dir, 0, etcd, lease_ttl_ms=LEASE_TTL_MS, overrides=OVERRIDES)
        c.processes.append(new)
        ch, s = stub(new.grpc)
        async with ch:
            assert await retrying(lambda: fetch_offsets(s, "g-restart")) == {("t", 0): 11, ("t", 1): 22}
            d = await describe(s, "g-restart")
            assert (d.state, d.generation_id, [x.member_id for x in d.members]) == ("Stable", 1, [m.member_id])
            m.stub = s
            await m.heartbeat()  # the loaded member carries on without rejoining
            # tombstones were replayed too (its partition may still be loading: retriable, as clients retry)
            assert await retrying(lambda: fetch_offsets(s, "g-gone")) == {}
    finally:
        tear_down(c)


async def test_sigkill_owner_survivor_takes_over_within_lease_ttl(tmp_path: Any) -> None:
    c = up(str(tmp_path / "failover"), coordinators=2)
    try:
        addrs = {p.id: p.grpc for p in c.by_role("coordinator")}
        ch0, s0 = stub(addrs[0])
        ch1, s1 = stub(addrs[1])
        async with ch0, ch1:
            async def owner_of(s: Any, group: str) -> pb.FindCoordinatorResponse:
                return await call(s.FindCoordinator(pb.FindCoordinatorRequest(group_id=group), timeout=10))

            # Both instances agree on the owner once the claims settle; pick a group each instance owns.
            groups = {}
            for i in range(40):
                g = f"g-fo-{i}"
                r = await retrying(lambda: owner_of(s0, g))
                groups.setdefault(r.coordinator_id, g)
                if len(groups) == 2:
                    break
            assert set(groups) == {0, 1}, "two live coordinators must split the offsets partitions"
            victim_id = 0
            group = groups[victim_id]
            stubs = {0: s0, 1: s1}
            m = Member(stubs[victim_id], group, ["t"], session_timeout_ms=30000)
            await retrying(lambda: join_and_sync([m], {"t": 1}))
            await m.commit({("t", 0): 99})
            with pytest.raises(errors.GregorError) as ei:
                await call(s1.OffsetFetch(pb.OffsetFetchRequest(group_id=group), timeout=10))
            assert ei.value.code == errors.Code.NOT_COORDINATOR
            victim = next(p for p in c.by_role("coordinator") if p.id == victim_id)
            os.kill(victim.pid, signal.SIGKILL)
            killed = time.monotonic()
            r = await retrying(lambda: owner_of(s1, group), timeout_s=30)
            while r.coordinator_id != 1:  # the dead owner's claim stays until its lease expires
                await asyncio.sleep(0.1)
                r = await retrying(lambda: owner_of(s1, group), timeout_s=30)
            offsets = await retrying(lambda: fetch_offsets(s1, group), timeout_s=30)
            took = time.monotonic() - killed
            print(f"coordinator takeover after SIGKILL: {took:.2f} s (lease TTL {LEASE_TTL_MS} ms)")
            assert offsets == {("t", 0): 99}
            # etcd expires the lease within its TTL (rounded up to whole seconds) plus its own tick.
            assert took < LEASE_TTL_MS / 1000 + 3, f"takeover took {took:.1f} s"
            d = await describe(s1, group)
            assert d.state == "Stable" and [x.member_id for x in d.members] == [m.member_id]
    finally:
        tear_down(c)


def test_cli_cluster_up_starts_coordinators(tmp_path: Any) -> None:
    """`gregor cluster up --coordinators 2` lists role "coordinator" processes in cluster.json; down stops them."""
    import json

    from click.testing import CliRunner

    from gregor.cli.main import cli

    d = str(tmp_path / "cli")
    runner = CliRunner()
    res = runner.invoke(cli, ["cluster", "up", "--data-dir", d, "--brokers", "1", "--controllers", "1",
                              "--coordinators", "2", "--coordinator-property", "offsets.topic.num.partitions=2"])
    try:
        assert res.exit_code == 0, res.output
        info = json.loads(res.output)
        coords = [p for p in info["processes"] if p["role"] == "coordinator"]
        assert [p["id"] for p in coords] == [0, 1] and all(p["grpc"] and p["metrics"] for p in coords)
        bad = runner.invoke(cli, ["cluster", "up", "--data-dir", str(tmp_path / "bad"), "--brokers", "1",
                                   "--controllers", "0", "--coordinators", "1"])
        assert bad.exit_code != 0 and "cluster mode" in bad.output
    finally:
        if os.path.exists(os.path.join(d, "cluster.json")):
            tear_down(LocalCluster.load(d))


async def test_new_coordinator_takes_over_half_the_partitions_with_their_offsets(tmp_path: Any) -> None:
    """A second instance joining moves the odd offsets partitions to it (graceful hand-over, no lease expiry)."""
    from gregor.coordinator.offsets_log import partition_for

    c = up(str(tmp_path / "handover"), coordinators=1)
    try:
        group = next(f"g-ho-{i}" for i in range(100) if partition_for(f"g-ho-{i}", 4) % 2 == 1)
        ch0, s0 = stub(coordinator_addr(c, 0))
        async with ch0:
            m = Member(s0, group, ["t"], session_timeout_ms=30000)
            await retrying(lambda: join_and_sync([m], {"t": 1}))
            await m.commit({("t", 0): 17})
            etcd = ",".join(p.grpc for p in c.by_role("etcd"))
            c.processes.append(start_coordinator(c.data_dir, 1, etcd, lease_ttl_ms=LEASE_TTL_MS, overrides=OVERRIDES))
            ch1, s1 = stub(coordinator_addr(c, 1))
            async with ch1:
                assert await retrying(lambda: fetch_offsets(s1, group)) == {("t", 0): 17}
                with pytest.raises(errors.GregorError) as ei:
                    await m.heartbeat()  # still asking the old instance
                assert ei.value.code == errors.Code.NOT_COORDINATOR
                r = await call(s0.FindCoordinator(pb.FindCoordinatorRequest(group_id=group), timeout=10))
                assert r.coordinator_id == 1 and r.partition % 2 == 1
                m.stub = s1
                await m.heartbeat()  # the group was handed over with its members: no rejoin needed
    finally:
        tear_down(c)


async def test_sigkilled_coordinator_restarted_before_its_lease_expires_claims_its_shards_anew(tmp_path: Any) -> None:
    """A coordinator SIGKILLed and started again with the same id finds its previous incarnation's claims (still
    bound to the dead lease). It must not serve them under that lease: once the lease expired the claims were gone
    and FindCoordinator answered COORDINATOR_NOT_AVAILABLE for those partitions for good. It waits for the old
    lease to expire and claims every shard on its own lease; groups on every offsets partition keep working."""
    lease_ttl_ms = 6000  # long enough for the restart to finish before the dead lease expires
    c = LocalCluster.up(str(tmp_path / "same-id"), brokers=1, controllers=1, coordinators=1,
                        lease_ttl_ms=lease_ttl_ms, coordinator_overrides=OVERRIDES)
    try:
        partitions = int(OVERRIDES["offsets.topic.num.partitions"])
        groups: dict[int, str] = {}
        for i in range(200):  # one group id on every offsets partition
            groups.setdefault(partition_for(f"g-same-id-{i}", partitions), f"g-same-id-{i}")
        assert len(groups) == partitions

        async def commit_all(offset: int) -> None:
            for g in groups.values():
                async with Consumer({"bootstrap.servers": c.bootstrap, "group.id": g, "enable.auto.commit": False,
                                     "default.api.timeout.ms": 30000}) as consumer:
                    await consumer.commit_sync({("t", 0): offset})
                    assert await consumer.committed([("t", 0)]) == {("t", 0): offset}
        await commit_all(1)
        async with EtcdClient(c.to_json()["etcd"], cluster="gregor") as etcd:
            before = await etcd.get(CoordinatorsZNode.id_key(etcd, 0))
            assert before is not None
            old = c.by_role("coordinator")[0]
            stop_process(old, signal.SIGKILL)
            c.processes.remove(old)
            etcd_endpoints = ",".join(p.grpc for p in c.by_role("etcd"))
            new = start_coordinator(c.data_dir, 0, etcd_endpoints, lease_ttl_ms=lease_ttl_ms, overrides=OVERRIDES,
                                    port=int(old.grpc.rsplit(":", 1)[1]))
            c.processes.append(new)
            registration = await etcd.get(CoordinatorsZNode.id_key(etcd, 0))
            assert registration is not None and registration.lease != before.lease

            async def claimed_on_the_new_lease() -> bool:
                res = await etcd.get_prefix(CoordinatorsZNode.prefix(etcd))
                claims = [kv for kv in res.kvs if (key := CoordinatorsZNode.parse(etcd, kv.key)) is not None
                          and key.kind == CoordinatorsZNode.OFFSETS_CLAIMS]
                return len(claims) == partitions and all(kv.lease == registration.lease for kv in claims)
            await until(claimed_on_the_new_lease, 60, "every offsets partition claimed on the restarted lease")
        await commit_all(2)  # FindCoordinator finds the restarted instance for every partition
    finally:
        tear_down(c)
