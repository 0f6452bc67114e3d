"""Controller election, failover and fencing (seed 001) with a real etcd and real controller processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gregor.cli.local_cluster import LocalCluster, start_controller, stop_process
from gregor.common import errors
from gregor.common.config import BrokerConfig
from gregor.common.etcd import CompareFailed, EtcdClient, EtcdUnavailable, LeaseLost, Put
from gregor.common.etcd_layout import ProducerIdBlockZNode
from gregor.controller import elector
from gregor.controller.controller import (CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT, FIRST_AUTO_LEADER_REBALANCE_DELAY_S,
                                         Controller, ControllerState, _Event)
from gregor.controller.standby_metadata import StandbyMetadata
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import Process, admin_write_succeeds, tear_down
from tests.helpers.wait import until

LEASE_TTL_MS = 2000  # etcd's minimum lease is ~1.5 s, rounded up to 2 s anyway
DEFAULT_LEASE_TTL_MS = CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT
TAKEOVER_MARGIN_S = 3.0  # lease expiry check interval (0.5 s) + watch + election + slack
BROKER_SESSION_TIMEOUT_MS_DEFAULT = BrokerConfig().broker_session_timeout_ms


@pytest.fixture
async def client(etcd: Process) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="gregor") as c:
        yield c


@pytest.fixture
def controllers(tmp_path, etcd: Process) -> Iterator[list[Process]]:  # type: ignore[no-untyped-def]
    procs = [start_controller(str(tmp_path / "cluster"), i, etcd.grpc, lease_ttl_ms=LEASE_TTL_MS) for i in (1, 2)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.alive():
                os.kill(p.pid, signal.SIGCONT)
            stop_process(p, signal.SIGKILL)


def scrape(proc: Process) -> dict[str, float]:
    with urllib.request.urlopen(proc.metrics, timeout=2) as r:
        lines = r.read().decode().splitlines()
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}



async def controller_is(client: EtcdClient, controller_id: int) -> bool:
    return await elector.read_controller_id(client) == controller_id


async def active_metric(proc: Process) -> float:
    return await asyncio.to_thread(lambda: scrape(proc)["gregor_controller_active_controller"])


async def register_broker(client: EtcdClient, broker_id: int) -> int:
    """A broker registration as the broker will write it: lease-bound JSON; returns its epoch."""
    lease = await client.grant_lease(30)
    key = client.key("brokers", "ids", broker_id)
    value = json.dumps({"host": "127.0.0.1", "grpc_port": 9000 + broker_id, "data_port": 0}).encode()
    assert await client.create_if_absent(key, value, lease.id)
    kv = await client.get(key)
    assert kv is not None
    return kv.create_revision


async def allocate(proc: Process, broker_id: int, broker_epoch: int) -> int:
    async with grpc.aio.insecure_channel(proc.grpc) as ch:
        resp = await controller_pb2_grpc.ControllerServiceStub(ch).AllocateProducerIds(
            controller_pb2.AllocateProducerIdsRequest(broker_id=broker_id, broker_epoch=broker_epoch), timeout=5)
    return int(resp.producer_id_start)


async def test_one_active_and_sigkill_failover(client: EtcdClient, controllers: list[Process]) -> None:
    c1, c2 = controllers
    await until(lambda: _any_registered(client), 5, "a controller registered")
    active_id = await elector.read_controller_id(client)
    active, standby = (c1, c2) if active_id == 1 else (c2, c1)
    epoch_kv = await client.get(client.key("controller_epoch"))
    assert epoch_kv is not None and (epoch_kv.value, epoch_kv.version) == (b"1", 1)
    await until(lambda: _eq(active_metric(active), 1.0), 3, "active reports ActiveControllerCount 1")
    assert scrape(standby)["gregor_controller_active_controller"] == 0.0
    assert scrape(active)["gregor_controller_epoch"] == 1.0
    epoch_broker = await register_broker(client, 7)

    async with grpc.aio.insecure_channel(standby.grpc) as ch:
        desc = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(controller_pb2.DescribeClusterRequest())
    assert (desc.controller_id, desc.controller_epoch) == (active_id, 1)
    assert [(b.broker_id, b.broker_epoch, b.grpc_port) for b in desc.brokers] == [(7, epoch_broker, 9007)]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await allocate(standby, 7, epoch_broker)
    assert errors.from_rpc_error(info.value).code == errors.Code.NOT_CONTROLLER

    stop_process(active, signal.SIGKILL)
    took = await until(lambda: controller_is(client, standby.id), LEASE_TTL_MS / 1000 + TAKEOVER_MARGIN_S,
                       "standby took over after SIGKILL")
    epoch, _ = await elector.read_controller_epoch(client)
    assert epoch == 2
    await until(lambda: _eq(active_metric(standby), 1.0), 2, "new active reports ActiveControllerCount 1")
    assert scrape(standby)["gregor_controller_epoch"] == 2.0
    assert await allocate(standby, 7, epoch_broker) == 0  # it loaded the live brokers at failover
    print(f"takeover after SIGKILL: {took:.2f} s")


async def test_sigkill_failover_on_defaults_stays_inside_the_broker_session(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Nothing configured: the controllers' election lease is controller.quorum.fetch.timeout.ms (2 s), the
    broker's session broker.session.timeout.ms (10 s). The standby takes over within the lease plus the
    takeover margin, far inside the broker's session, which does not lapse meanwhile (same registration);
    then an admin write through the broker succeeds. With the election lease at the brokers' 10 s (the old
    default) the takeover took 7-10.5 s after the SIGKILL and this bound fails."""
    cluster = LocalCluster.up(str(tmp_path / "cluster"), brokers=1, controllers=2)
    try:
        broker = cluster.by_role("broker")[0]
        async with EtcdClient(f"http://{cluster.by_role('etcd')[0].grpc}", cluster="gregor") as client:
            await until(lambda: _any_registered(client), 10, "a controller registered")
            active_id = await elector.read_controller_id(client)
            active = next(c for c in cluster.by_role("controller") if c.id == active_id)
            standby = next(c for c in cluster.by_role("controller") if c.id != active_id)
            assert await admin_write_succeeds(broker, "before-failover")
            registration = await client.get(client.key("brokers", "ids", broker.id))
            assert registration is not None
            epoch, _ = await elector.read_controller_epoch(client)

            stop_process(active, signal.SIGKILL)
            took = await until(lambda: controller_is(client, standby.id),
                               DEFAULT_LEASE_TTL_MS / 1000 + TAKEOVER_MARGIN_S, "standby took over after SIGKILL")
            assert DEFAULT_LEASE_TTL_MS / 1000 + TAKEOVER_MARGIN_S < BROKER_SESSION_TIMEOUT_MS_DEFAULT / 1000
            assert (await elector.read_controller_epoch(client))[0] == epoch + 1
            admin = await until(lambda: admin_write_succeeds(broker, f"after-failover-{time.monotonic_ns()}"), 10,
                                "an admin write through the broker after the failover")
            after = await client.get(client.key("brokers", "ids", broker.id))
            assert after is not None and after.create_revision == registration.create_revision  # session kept
            print(f"defaults: takeover {took:.2f} s after SIGKILL, admin write {admin:.2f} s later")
    finally:
        tear_down(cluster)


async def test_zombie_is_fenced_then_sigterm_handover(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A controller SIGSTOPped past its lease, then resumed, changes nothing in etcd or on the brokers.

    A real cluster (two controllers, three brokers, two topics). The active controller
    (the zombie) is frozen; the standby takes over. While the zombie sleeps a broker is
    SIGKILLed, so the zombie wakes up with that broker's failure (and its own timers)
    pending: work that would write partition states. The new controller handles the
    failure; once it has settled, the whole range under /gregor/<cluster>/ (key, value,
    create and mod revisions, version, lease) and every broker's metadata (leaders,
    leader epochs, ISRs, controller id) are recorded. The zombie resumes, is refused
    as controller, resigns and goes idle: both records are unchanged, key for key.
    """
    cluster = LocalCluster.up(str(tmp_path / "cluster"), brokers=3, controllers=2, lease_ttl_ms=LEASE_TTL_MS)
    try:
        brokers = cluster.by_role("broker")
        for name, partitions_, rf in (("zombie-a", 3, 3), ("zombie-b", 2, 2)):
            async with grpc.aio.insecure_channel(brokers[0].grpc) as ch:
                resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
                    topics=[controller_pb2.CreatableTopic(name=name, num_partitions=partitions_,
                                                          replication_factor=rf)]), timeout=30)
            assert resp.results[0].error.code == 0, resp
        await until(lambda: _settled(brokers, ZOMBIE_TOPICS), 30, "every partition led with a full ISR everywhere")

        async with EtcdClient(f"http://{cluster.by_role('etcd')[0].grpc}", cluster="gregor") as client:
            first_id = await elector.read_controller_id(client)
            zombie = next(c for c in cluster.by_role("controller") if c.id == first_id)
            other = next(c for c in cluster.by_role("controller") if c.id != first_id)
            await until(lambda: _eq(active_metric(zombie), 1.0), 3, "first controller active")
            b0 = brokers[0]
            assert await _retry_allocate(zombie, b0.id, b0.extra["broker_epoch"]) == 0

            os.kill(zombie.pid, signal.SIGSTOP)  # frozen past its lease: etcd expires it, the standby takes over
            await until(lambda: controller_is(client, other.id), LEASE_TTL_MS / 1000 + TAKEOVER_MARGIN_S,
                        "standby took over from the stopped controller")
            took_over = time.monotonic()
            await until(lambda: _eq(active_metric(other), 1.0), 2, "standby active")
            # Pending work for the zombie: a broker dies while it sleeps; the new controller handles it.
            victim = brokers[2]
            stop_process(victim, signal.SIGKILL)
            survivors = brokers[:2]
            await until(lambda: _settled(survivors, ZOMBIE_TOPICS, dead=victim.id), LEASE_TTL_MS / 1000 + 10,
                        "the new controller moved leaders and ISRs off the dead broker, on every broker")
            assert await allocate(other, b0.id, b0.extra["broker_epoch"]) == 1000
            # The new controller's own first auto-rebalance check (5 s after its failover) is behind us,
            # and it has been quiet for a while: nothing legitimate writes from here on.
            remaining = FIRST_AUTO_LEADER_REBALANCE_DELAY_S + 0.5 - (time.monotonic() - took_over)
            await asyncio.sleep(max(0.0, remaining))
            await until(lambda: _quiet(client), 15, "etcd unchanged for a second (the new controller settled)")
            etcd_before = await _snapshot(client)
            brokers_before = [await _broker_view(b) for b in survivors]
            assert all(v[0] == other.id for v in brokers_before), brokers_before

            os.kill(zombie.pid, signal.SIGCONT)
            # Whatever the zombie tries first, nothing it writes may land.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await allocate(zombie, b0.id, b0.extra["broker_epoch"])
            assert errors.from_rpc_error(info.value).code == errors.Code.NOT_CONTROLLER
            await until(lambda: _eq(active_metric(zombie), 0.0), 3, "the zombie resigned")
            await until(lambda: _idle(zombie), 10, "the zombie's event queue drained, its state Idle")
            assert await elector.read_controller_id(client) == other.id
            assert (await elector.read_controller_epoch(client))[0] == 2
            etcd_after = await _snapshot(client)
            assert etcd_after == etcd_before, _diff(etcd_before, etcd_after)
            assert [await _broker_view(b) for b in survivors] == brokers_before
            print(f"zombie fenced writes: {scrape(zombie)['gregor_controller_fenced_writes_total']:.0f}"
                  f" ({len(etcd_before)} keys unchanged)")

            # A clean shutdown revokes the lease: the resigned zombie, now a standby, takes over at once.
            started = time.monotonic()
            os.kill(other.pid, signal.SIGTERM)
            await until(lambda: controller_is(client, zombie.id), 1.0, "takeover within 1 s of SIGTERM")
            took = time.monotonic() - started
            assert (await elector.read_controller_epoch(client))[0] == 3
            await until(lambda: _eq(active_metric(zombie), 1.0), 2, "former zombie active again")
            assert await allocate(zombie, b0.id, b0.extra["broker_epoch"]) == 2000
            print(f"takeover after SIGTERM: {took:.3f} s")
    finally:
        tear_down(cluster)


ZOMBIE_TOPICS = {"zombie-a": 3, "zombie-b": 2}
BrokerView = tuple[int, dict[tuple[str, int], tuple[int, int, tuple[int, ...]]]]


async def _broker_view(b: Process) -> BrokerView:
    """(controller id, (topic, partition) -> (leader, leader epoch, sorted ISR)) as broker b's metadata says."""
    async with grpc.aio.insecure_channel(b.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(
            broker_pb2.MetadataRequest(topics=sorted(ZOMBIE_TOPICS)), timeout=5)
    return resp.controller_id, {(t.name, p.partition): (p.leader, p.leader_epoch, tuple(sorted(p.isr)))
                                for t in resp.topics for p in t.partitions}


async def _settled(brokers: list[Process], topics: dict[str, int], dead: int = -1) -> bool:
    """Every broker shows the same metadata: every partition led by a live broker, the dead one in no ISR."""
    try:
        views = [await _broker_view(b) for b in brokers]
    except grpc.aio.AioRpcError:
        return False
    _, parts = views[0]
    if len(parts) != sum(topics.values()) or any(v != views[0] for v in views):
        return False
    return all(leader not in (-1, dead) and dead not in isr and len(isr) >= 1 for leader, _, isr in parts.values())


async def _snapshot(client: EtcdClient) -> dict[str, tuple[bytes, int, int, int, int]]:
    """Every key under /gregor/<cluster>/: value, create revision, mod revision, version, lease."""
    rng = await client.get_prefix(client.prefix)
    return {client.relative(kv.key): (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)
            for kv in rng.kvs}


async def _quiet(client: EtcdClient) -> bool:
    """No key under the prefix changed during one second."""
    before = await _snapshot(client)
    await asyncio.sleep(1.0)
    return await _snapshot(client) == before


async def _idle(proc: Process) -> bool:
    try:
        m = await asyncio.to_thread(scrape, proc)
    except OSError:
        return False
    return m.get("gregor_controller_event_queue_size") == 0.0 and m.get("gregor_controller_state") == 0.0


def _diff(before: dict[str, tuple], after: dict[str, tuple]) -> str:
    keys = sorted(set(before) | set(after))
    return "; ".join(f"{k}: {before.get(k)} -> {after.get(k)}" for k in keys if before.get(k) != after.get(k))


async def test_guarded_write_of_a_deposed_controller_fails(client: EtcdClient) -> None:
    """In-process and deterministic: a controller that has not yet heard of its successor is fenced by etcd."""
    async with EtcdClient(client.endpoint, cluster="gregor") as own:
        ctl = Controller(1, own, lease_ttl_ms=LEASE_TTL_MS, registry=CollectorRegistry())
        await ctl.start()
        try:
            await until(lambda: _true(ctl.is_active), 3, "controller 1 active")
            broker_epoch = await register_broker(client, 3)
            await until(lambda: _true(ctl.ctx.broker_epoch(3) == broker_epoch), 3, "broker 3 seen live")
            # Deafen it (as a long pause would), then let a successor win behind its back.
            assert ctl._controller_watch is not None
            ctl._controller_watch.cancel()
            await client.delete(client.key("controller"))
            successor = await client.grant_lease(10)
            won = await elector.register_controller_and_increment_epoch(client, 2, successor.id)
            assert won.epoch == 2 and ctl.is_active  # still believes it leads
            with pytest.raises(errors.GregorError) as info:
                await ctl.allocate_producer_ids(3, broker_epoch)
            assert info.value.code == errors.Code.NOT_CONTROLLER
            assert ctl.metrics.fenced_writes._value.get() == 1.0
            assert not ctl.is_active and ctl.active_controller_id == 2
            assert await client.get(ProducerIdBlockZNode.key(client)) is None
            # The raw fence: a write guarded by the old epoch's revision never applies.
            with pytest.raises(CompareFailed):
                await client.guarded_txn([elector.epoch_guard(client, won.epoch_version - 1)],
                                         [Put(client.key("x"), b"y")])
        finally:
            await ctl.stop()


async def test_a_stale_report_of_a_replaced_lease_does_not_resign_the_new_term(client: EtcdClient) -> None:
    """Found by the chaos suite (seed 42): a lease loss reported twice re-elected the controller on a new
    lease, then the second report resigned it while its registration stayed: no active controller."""
    async with EtcdClient(client.endpoint, cluster="gregor") as own:
        ctl = Controller(1, own, lease_ttl_ms=LEASE_TTL_MS, registry=CollectorRegistry())
        await ctl.start()
        try:
            await until(lambda: _true(ctl.is_active), 3, "controller 1 active")
            old = ctl._lease
            assert old is not None and ctl.ctx.epoch == 1
            await client.revoke(old.id)  # the lease ends: Expire, resign, re-elect on a new lease
            await until(lambda: _true(ctl.is_active and ctl._lease is not old and ctl.ctx.epoch == 2), 10,
                        "controller 1 re-elected on a new lease")
            # The second report of the old lease's end, queued behind the Expire that re-elected it.
            ctl.events.put_nowait(_Event(ControllerState.CONTROLLER_CHANGE, "Expire",
                                         lambda: ctl._process_expire(old)))
            await asyncio.sleep(1.0)
            assert ctl.is_active and ctl.ctx.epoch == 2
            assert ctl.metrics.active_controller_count._value.get() == 1.0
            assert (await elector.read_controller_epoch(client))[0] == 2
        finally:
            await ctl.stop()


async def test_a_registration_on_a_lost_lease_is_given_up_and_won_again_at_once(client: EtcdClient) -> None:
    """The client gave its lease up (no refresh answered for its TTL, as while etcd elects a new leader) but
    etcd still holds it, so the registration bound to it stays. The controller resigns, removes that
    registration and is elected again on a new lease at once; it neither waits for the old lease to expire
    nor takes the stale registration for a term of its own (it was "active" with nothing loaded)."""
    async with EtcdClient(client.endpoint, cluster="gregor") as own:
        ctl = Controller(1, own, lease_ttl_ms=LEASE_TTL_MS, registry=CollectorRegistry())
        await ctl.start()
        keep: asyncio.Task[None] | None = None
        try:
            await until(lambda: _true(ctl.is_active), 3, "controller 1 active")
            old = ctl._lease
            assert old is not None and ctl.ctx.epoch == 1
            keep = asyncio.create_task(_keep_refreshing(client, old.id))  # etcd keeps the old lease alive
            old.stop_refreshing()  # the keepalive gives up (as after the TTL without an answer): LeaseLost, Expire
            old._lose(LeaseLost(f"lease {old.id:x} not refreshed within {old.ttl_s} s (test)"))
            await until(lambda: _true(ctl.is_active and ctl.ctx.epoch == 2 and ctl._lease is not old), 5,
                        "elected again on a new lease while the old lease lives")
            kv = await client.get(client.key("controller"))
            assert kv is not None and ctl._lease is not None and kv.lease == ctl._lease.id
            assert await client.refresh_lease(old.id) > 0  # the old lease never expired: nothing waited for it
            assert ctl.metrics.active_controller_count._value.get() == 1.0
        finally:
            if keep is not None:
                keep.cancel()
            await ctl.stop()


async def _keep_refreshing(client: EtcdClient, lease_id: int) -> None:
    while True:
        await client.refresh_lease(lease_id)
        await asyncio.sleep(0.3)


async def test_a_failover_that_fails_gives_the_registration_up(client: EtcdClient,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd fails the new controller's first read of the topics (fault injected there: the standby copy's
    hand-over, which reads etcd whether the copy is warm or not): Kafka's
    triggerControllerMove. The registration goes (the lease is revoked) and the next election, here the
    same controller's, runs the failover to the end. Its guarded delete of the key had been refused (the
    guard used the epoch of the context the resignation had just reset), and no controller was ever active."""
    real = StandbyMetadata.take
    calls = 0

    async def fails_once(self: StandbyMetadata) -> object:
        nonlocal calls
        calls += 1
        if calls == 1:
            await self.stop()
            raise EtcdUnavailable("injected: etcd did not answer the failover's read")
        return await real(self)

    monkeypatch.setattr(StandbyMetadata, "take", fails_once)
    async with EtcdClient(client.endpoint, cluster="gregor") as own:
        ctl = Controller(1, own, lease_ttl_ms=LEASE_TTL_MS, registry=CollectorRegistry())
        await ctl.start()
        try:
            await until(lambda: _true(ctl.is_active and ctl.ctx.epoch == 2
                                      and ctl.metrics.active_controller_count._value.get() == 1.0), 5,
                        "active after a second election")
            assert calls == 2 and await elector.read_controller_id(client) == 1
        finally:
            await ctl.stop()


async def test_election_is_exclusive(client: EtcdClient) -> None:
    leases = [await client.grant_lease(10) for _ in range(5)]
    results = await asyncio.gather(
        *(elector.register_controller_and_increment_epoch(client, i, lease.id) for i, lease in enumerate(leases)),
        return_exceptions=True)
    winners = [r for r in results if isinstance(r, elector.Election)]
    assert len(winners) == 1 and winners[0].epoch == 1
    assert all(isinstance(r, elector.ControllerMovedError) for r in results if r not in winners)


async def _any_registered(client: EtcdClient) -> bool:
    return await elector.read_controller_id(client) != elector.NO_CONTROLLER


async def _eq(value: Awaitable[float], expected: float) -> bool:
    try:
        return await value == expected
    except OSError:
        return False


async def _true(value: bool) -> bool:
    return value


async def _retry_allocate(proc: Process, broker_id: int, broker_epoch: int) -> int:
    """The active controller learns of a new broker through its watch: retry STALE_BROKER_EPOCH briefly."""
    for _ in range(50):
        try:
            return await allocate(proc, broker_id, broker_epoch)
        except grpc.aio.AioRpcError as exc:
            if errors.from_rpc_error(exc).code != errors.Code.STALE_BROKER_EPOCH:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("broker never became live on the controller")
