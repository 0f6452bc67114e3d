"""A Gregor cluster on a 3-member etcd survives the loss of one member (issue 3).

etcd members, two controllers and three brokers run as real processes on
loopback; every service gets all three etcd endpoints and starts on the first.
That member is SIGKILLed under a continuous acks=all load: the clients move to
the next endpoint (EtcdClient's failover: reads and never-sent calls go to the
next member at once, lease keepalives and watches on their next round), produce
continues, and the controller still elects: a SIGKILLed partition leader is
replaced, and a SIGKILLed active controller is replaced by the standby, all
through the two surviving members. Every acknowledged record is in both
surviving replicas exactly once.
"""

from __future__ import annotations

import asyncio
import signal
import time
import urllib.request

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, stop_process
from gregor.common.etcd import EtcdClient
from gregor.controller import elector
from tests.helpers.cluster import AckedLoad, etcd_endpoints, move_etcd_leader, tear_down
from tests.helpers.wait import until
from tests.integration.test_failover_under_load import (
    PARTITIONS, TOPIC, acks_resume_everywhere, by_id, create_topic, full_isr_everywhere, identical_replicas, report,
    view)

# etcd re-elects its raft leader within ~1 s (election timeout) when the leader is the member lost;
# sessions and the controller lease outlive that and a keepalive round on the next endpoint.
SESSION_MS = 6000
BROKER_OVERRIDES = {"replica.lag.time.max.ms": "4000", "broker.session.timeout.ms": str(SESSION_MS)}
FAILOVER_WITHIN_S = SESSION_MS / 1000 + 10


def scrape(p: Process, name: str) -> float:
    try:
        with urllib.request.urlopen(p.metrics, timeout=3) as resp:
            lines = resp.read().decode().splitlines()
    except OSError:
        return -1.0
    return sum(float(line.split()[-1]) for line in lines if line.startswith(name + " ") or line.startswith(name + "{"))


def test_three_member_etcd_comes_up_and_is_listed(tmp_path: pytest.TempPathFactory) -> None:
    from gregor.cli.local_cluster import start_etcd_cluster

    members = start_etcd_cluster(str(tmp_path), 3)
    try:
        assert [m.id for m in members] == [0, 1, 2]
        leaders = [scrape(m, "etcd_server_is_leader") for m in members]
        assert sorted(leaders) == [0.0, 0.0, 1.0], leaders
        assert all(scrape(m, "etcd_server_has_leader") == 1.0 for m in members)
    finally:
        for m in members:
            stop_process(m, signal.SIGKILL)


@pytest.mark.parametrize("raft_leader", [False, True], ids=["follower-member", "raft-leader-member"])
async def test_cluster_survives_loss_of_the_etcd_member_in_use(tmp_path: pytest.TempPathFactory,
                                                               raft_leader: bool) -> None:
    cluster = LocalCluster.up(str(tmp_path), brokers=3, controllers=2, lease_ttl_ms=SESSION_MS,
                              broker_overrides=BROKER_OVERRIDES, etcd_members=3)
    try:
        members = cluster.by_role("etcd")
        assert len(members) == 3 and etcd_endpoints(cluster).count(",") == 2
        # The member everyone talks to is either a raft follower or (moved there) the raft leader.
        await move_etcd_leader(members, members[0] if raft_leader else members[1])
        brokers = cluster.by_role("broker")
        await create_topic(brokers[0])
        await until(lambda: full_isr_everywhere(brokers), 30, "every partition led with a full ISR")
        load = AckedLoad(cluster.bootstrap, TOPIC, PARTITIONS)
        stop = asyncio.Event()
        task = asyncio.create_task(load.run(stop))
        await until(lambda: _flowing(load, task), 30, "acks=all load flows")

        async with EtcdClient(",".join(m.grpc for m in members[1:])) as etcd:
            active_id = await elector.read_controller_id(etcd)
            controllers = cluster.by_role("controller")
            active = next(c for c in controllers if c.id == active_id)
            standby = next(c for c in controllers if c.id != active_id)
            # Every service starts on the first endpoint: that is the member the controller talks to.
            lost = members[0]
            was_raft_leader = scrape(lost, "etcd_server_is_leader") == 1.0
            assert was_raft_leader == raft_leader
            t0 = time.monotonic()
            stop_process(lost, signal.SIGKILL)

            async def moved_on() -> bool:
                return scrape(active, "gregor_etcd_endpoint_failovers_total") >= 1
            await until(moved_on, SESSION_MS / 1000, "the active controller moved to another etcd member")
            t1 = time.monotonic()
            await until(lambda: acks_resume_everywhere(load, t1), 20, "produce continues on every partition")
            await asyncio.sleep(SESSION_MS / 1000)  # past a whole session: nobody lost its registration
            assert await elector.read_controller_id(etcd) == active_id
            regs = await etcd.get_prefix(etcd.key("brokers", "ids") + b"/")
            assert len(regs.kvs) == 3
            assert {b.extra["broker_epoch"] for b in brokers} == {kv.create_revision for kv in regs.kvs}, \
                "a broker re-registered: its session was lost"

            # The controller still elects: a partition leader dies.
            before = await view(brokers[1])
            victim = by_id(brokers, before[0][0])
            survivors = [b for b in brokers if b.id != victim.id]
            t_kill = time.monotonic()
            stop_process(victim, signal.SIGKILL)

            async def elected() -> bool:
                v = await view(survivors[0])
                return bool(v) and v[0][0] not in (-1, victim.id) and v[0][1] > before[0][1]
            await until(elected, FAILOVER_WITHIN_S, "a new leader elected through the surviving etcd members")
            elected_after = time.monotonic() - t_kill

            # And a new controller can be elected: the active one dies.
            t_ctl = time.monotonic()
            stop_process(active, signal.SIGKILL)

            async def standby_active() -> bool:
                return await elector.read_controller_id(etcd) == standby.id
            await until(standby_active, FAILOVER_WITHIN_S, "the standby controller takes over")
            takeover = time.monotonic() - t_ctl
        t2 = time.monotonic()
        await until(lambda: acks_resume_everywhere(load, t2), 30, "produce continues after both failovers")
        stop.set()
        await task
        await until(lambda: identical_replicas(survivors), 30, "the surviving replicas are byte-identical")
        counts = load.check_replicas(survivors)
        assert all(n > 50 for n in counts.values()), counts
        consumed = await load.check_consumed(",".join(b.grpc for b in survivors))
        assert all(consumed[p] >= counts[p] for p in counts), (consumed, counts)
        report("etcd member lost", load, t0, {
            f"controller moved to another etcd member ({'raft leader' if was_raft_leader else 'follower'} lost)":
                t1 - t0,
            "producer stall across the etcd member loss, per partition (max)": max(
                load.max_stall_s(p, after=t0 - 1, before=t_kill) for p in range(PARTITIONS)),
            "leader elected after broker SIGKILL (2 etcd members)": elected_after,
            "controller takeover after SIGKILL (2 etcd members)": takeover})
    finally:
        tear_down(cluster)


async def _flowing(load: AckedLoad, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()
    return all(len(load.acked_in(p)) >= 50 for p in range(PARTITIONS))



async def test_client_fails_over_past_dead_endpoints(tmp_path: pytest.TempPathFactory) -> None:
    """EtcdClient with a dead first endpoint: reads and never-sent writes go to the next member, once."""
    from gregor.cli.local_cluster import free_port
    from gregor.common.etcd import ENDPOINT_FAILOVERS
    from tests.helpers.cluster import etcd_process

    with etcd_process(str(tmp_path)) as live:
        dead = f"127.0.0.1:{free_port()}"  # nothing listens there: connection refused
        async with EtcdClient(f"http://{dead},http://{live.grpc}", cluster="failover") as etcd:
            before = ENDPOINT_FAILOVERS._value.get()
            # Many calls fail on the same dead channel at once: the client moves on exactly once.
            assert await asyncio.gather(*(etcd.get(etcd.key("k", i)) for i in range(10))) == [None] * 10
            assert etcd.endpoint == live.grpc and ENDPOINT_FAILOVERS._value.get() == before + 1
        async with EtcdClient(f"{dead},{live.grpc}", cluster="failover") as etcd:
            # A compare-and-swap never reached the dead member, so it is sent to the live one.
            assert await etcd.create_if_absent(etcd.key("once"), b"v")
            kv = await etcd.get(etcd.key("once"))
            assert kv is not None and kv.value == b"v" and kv.version == 1
