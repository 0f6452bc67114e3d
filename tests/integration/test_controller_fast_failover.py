"""A standby revokes the lease of an active controller whose process is provably gone (controller.fast.failover.enable,
gregor.controller.liveness), and never of one that is only silent. Real etcd, real controller and broker processes;
the watch's own tests run it in-process against real sockets and real etcd.

The lease is long (10 s) in the SIGKILL test so that its expiry cannot be what replaced the controller: keepalives
run every TTL/3, so a killed controller's key outlives it by at least two thirds of the TTL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest

from gregor.cli.local_cluster import Process, stop_process
from gregor.common.etcd import EtcdClient, KeyValue
from gregor.common.etcd_layout import ControllerZNode
from gregor.controller import elector
from gregor.controller.liveness import RETRY_S, ActiveControllerWatch, WatchedRegistration
from tests.helpers.cluster import admin_write_succeeds, kill_all, running_cluster, start_controller_with
from tests.helpers.wait import until

LONG_LEASE_MS = 10_000
SHORT_LEASE_MS = 3_000
REVOKED = "revoked lease"


def log_text(p: Process) -> str:
    with open(p.log, errors="replace") as f:
        return f.read()


def revocations(p: Process) -> float:
    with urllib.request.urlopen(p.metrics, timeout=2) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("gregor_controller_lease_revocations_total "):
                return float(line.rpartition(" ")[2])
    raise AssertionError("gregor_controller_lease_revocations_total not exported")


def connected_to(standby: Process, active_id: int) -> bool:
    return f"connected to active controller {active_id} " in log_text(standby)


async def roles(client: EtcdClient, controllers: list[Process]) -> tuple[Process, Process]:
    await until(lambda: _registered(client), 20, "a controller registered")
    active_id = await elector.read_controller_id(client)
    active = next(c for c in controllers if c.id == active_id)
    return active, next(c for c in controllers if c.id != active_id)


async def _registered(client: EtcdClient) -> bool:
    return await elector.read_controller_id(client) != elector.NO_CONTROLLER


async def test_sigkilled_active_is_replaced_long_before_its_lease_expires(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL of the active controller on a 10 s lease: the standby's connection to it breaks, its endpoint
    refuses connects, the standby revokes the lease, wins the next epoch, and an admin write through the broker
    succeeds, all before half the lease (which cannot have expired before two thirds of it). Without the
    revocation the key stays for 6.7-10.5 s and the standby waits for it."""
    with running_cluster(str(tmp_path / "cluster"), brokers=1, controllers=2, lease_ttl_ms=LONG_LEASE_MS) as cluster:
        broker = cluster.by_role("broker")[0]
        async with EtcdClient(f"http://{cluster.by_role('etcd')[0].grpc}", cluster="gregor") as client:
            active, standby = await roles(client, cluster.by_role("controller"))
            await until(lambda: connected_to(standby, active.id), 10, "the standby connected to the active")
            assert await until(lambda: admin_write_succeeds(broker, "before"), 20, "an admin write before the kill") >= 0
            epoch, _ = await elector.read_controller_epoch(client)
            registration = await client.get(ControllerZNode.key(client))
            assert registration is not None and registration.lease != 0

            stop_process(active, signal.SIGKILL)
            killed = time.monotonic()
            half_lease_s = LONG_LEASE_MS / 1000 / 2
            await until(lambda: _is(client, standby.id), half_lease_s, "the standby registered before half the lease")
            left = half_lease_s - (time.monotonic() - killed)
            assert left > 0
            await until(lambda: admin_write_succeeds(broker, "after"), left, "an admin write before half the lease")
            took = time.monotonic() - killed
            assert (await elector.read_controller_epoch(client))[0] == epoch + 1
            assert revocations(standby) == 1.0
            lines = [line for line in log_text(standby).splitlines() if REVOKED in line]
            assert len(lines) == 1 and f"lease {registration.lease:x} of active controller {active.id}" in lines[0]
            assert "refused" in lines[0], lines
            print(f"SIGKILL on a {LONG_LEASE_MS} ms lease: admin write {took:.2f} s after the kill")


async def _is(client: EtcdClient, controller_id: int) -> bool:
    return await elector.read_controller_id(client) == controller_id


@pytest.fixture
async def client(etcd: Process) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="gregor") as c:
        yield c


async def test_sigstopped_active_keeps_the_role_until_its_lease_expires(  # type: ignore[no-untyped-def]
        tmp_path, etcd: Process, client: EtcdClient) -> None:
    """SIGSTOP of the active controller: its kernel keeps the standby's connection and accepts new ones, so
    nothing proves it dead. The standby, connected to it, revokes nothing and takes over only once the lease
    has expired (keepalives every TTL/3: not before two thirds of it; asserted with room for a keepalive
    delayed on a loaded machine: not before a third, where the fast path takes a tenth of a second)."""
    data_dir = str(tmp_path / "cluster")
    procs = [start_controller_with(data_dir, i, etcd.grpc, lease_ttl_ms=SHORT_LEASE_MS) for i in (1, 2)]
    try:
        active, standby = await roles(client, procs)
        await until(lambda: connected_to(standby, active.id), 10, "the standby connected to the active")
        os.kill(active.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        await until(lambda: _is(client, standby.id), SHORT_LEASE_MS / 1000 + 3, "the standby took over")
        took = time.monotonic() - stopped
        assert took >= SHORT_LEASE_MS / 1000 / 3, f"took over {took:.2f} s after SIGSTOP: before the lease expired"
        assert revocations(standby) == 0.0 and REVOKED not in log_text(standby)
        os.kill(active.pid, signal.SIGCONT)
        await until(lambda: "lost its etcd lease" in log_text(active) or "controller moved" in log_text(active), 10,
                    "the resumed controller noticed it is not active")
        assert await _is(client, standby.id)
        print(f"SIGSTOP on a {SHORT_LEASE_MS} ms lease: takeover {took:.2f} s after the stop")
    finally:
        kill_all(procs)


# -- the watch in-process, against a listener the test controls and a registration in real etcd --------------


class Listener:
    """A TCP listener standing in for the active's gRPC port; it can drop its connections and close."""

    def __init__(self, close_at_once: bool = False) -> None:
        self.close_at_once = close_at_once
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.accepted = 0

    async def start(self, port: int = 0) -> int:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.accepted += 1
            if self.close_at_once:
                writer.close()
            else:
                self.writers.append(writer)
        self.server = await asyncio.start_server(accept, "127.0.0.1", port)
        return int(self.server.sockets[0].getsockname()[1])

    def drop_connections(self) -> None:
        for w in self.writers:
            w.close()
        self.writers.clear()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        self.drop_connections()


async def register(client: EtcdClient, controller_id: int, port: int) -> KeyValue:
    """A controller's registration on its own lease, as the election writes it; returns the key."""
    lease = await client.grant_lease(30)
    await elector.register_controller_and_increment_epoch(client, controller_id, lease.id,
                                                          endpoint=f"127.0.0.1:{port}")
    kv = await client.get(ControllerZNode.key(client))
    assert kv is not None
    return kv


async def lease_alive(client: EtcdClient, lease_id: int) -> bool:
    return await client.refresh_lease(lease_id) > 0


async def test_watch_reconnects_to_a_live_listener_and_revokes_once_it_refuses(client: EtcdClient) -> None:
    """The active's side drops the connection but still listens (as its server closing an idle connection):
    the watch reconnects and revokes nothing. Then the listener closes and drops the connection: connects
    are refused and the watch revokes the registration's lease; the key goes with it."""
    listener = Listener()
    port = await listener.start()
    kv = await register(client, 1, port)
    revoked: list[WatchedRegistration] = []
    watch = ActiveControllerWatch(client, 2, lambda w, reason: revoked.append(w))
    try:
        watch.follow(kv)
        await until(lambda: watch.connected and listener.accepted == 1, 5, "the watch connected")
        listener.drop_connections()
        await until(lambda: listener.accepted == 2 and watch.connected, 5, "the watch connected again")
        assert not revoked and await lease_alive(client, kv.lease)

        await listener.close()
        await until(lambda: revoked, 5, "the watch revoked the lease")
        assert revoked == [WatchedRegistration.of(kv)]
        assert await client.get(ControllerZNode.key(client)) is None
        assert not await lease_alive(client, kv.lease)
    finally:
        await watch.stop()
        await listener.close()


async def test_watch_revokes_nothing_once_the_key_names_another_registration(client: EtcdClient) -> None:
    """The watched process goes, but by the time the watch checks, the `controller` key is a newer
    registration (here controller 3's, on its own lease): that lease is not revoked, the key stays."""
    listener = Listener()
    port = await listener.start()
    first = await register(client, 1, port)
    watch = ActiveControllerWatch(client, 2)
    try:
        watch.follow(first)
        await until(lambda: watch.connected, 5, "the watch connected")
        await client.revoke(first.lease)
        newer = await register(client, 3, port)  # the watch is not told: it still watches controller 1's
        await listener.close()
        await until(lambda: watch._task is not None and watch._task.done(), 5, "the watch finished")
        kv = await client.get(ControllerZNode.key(client))
        assert kv is not None and kv.mod_revision == newer.mod_revision
        assert await lease_alive(client, newer.lease)
    finally:
        await watch.stop()
        await listener.close()


async def test_watch_never_connected_revokes_nothing(client: EtcdClient) -> None:
    """A registration whose endpoint the standby never reached (nothing listens there: a misadvertised
    address, or a process already gone) proves nothing about a live controller: no revocation."""
    listener = Listener()
    port = await listener.start()
    await listener.close()  # the port is free again: connects are refused from the start
    kv = await register(client, 1, port)
    watch = ActiveControllerWatch(client, 2)
    try:
        watch.follow(kv)
        # It keeps trying to connect (every RETRY_S), every try refused, and never revokes.
        await until(lambda: watch.connects >= 3, 5, "three connects refused")
        assert await lease_alive(client, kv.lease) and await client.get(ControllerZNode.key(client)) is not None
        assert not watch.connected and watch._task is not None and not watch._task.done()
    finally:
        await watch.stop()


async def test_watch_on_a_listener_that_closes_at_once_neither_spins_nor_revokes(client: EtcdClient) -> None:
    """Something that accepts and closes every connection at once (a proxy, a server refusing plain TCP): each
    break is probed, the probe connects, so nothing is proven; and the watch waits RETRY_S before holding the
    next connection instead of reconnecting in a busy loop."""
    listener = Listener(close_at_once=True)
    port = await listener.start()
    kv = await register(client, 1, port)
    watch = ActiveControllerWatch(client, 2)
    try:
        started = time.monotonic()
        watch.follow(kv)
        await until(lambda: listener.accepted >= 5, 10, "five connections accepted")
        assert time.monotonic() - started >= 3 * RETRY_S, "the watch reconnects in a busy loop"
        assert await lease_alive(client, kv.lease) and watch._task is not None and not watch._task.done()
    finally:
        await watch.stop()
        await listener.close()
