"""gregor.common.etcd against a real etcd process: leases, compares, guarded transactions, watches."""

from __future__ import annotations

import asyncio
import signal
from typing import AsyncIterator

import pytest

from gregor.common.etcd import (CompareFailed, Delete, EtcdClient, EtcdUnavailable, Put, WatchEvent,
                                lease_ttl_s, mod_revision_is, parse_endpoints, prefix_range_end, version_is)
from tests.helpers.cluster import Process


@pytest.fixture
async def client(etcd: Process) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="t") as c:
        yield c


def test_key_helpers() -> None:
    c = EtcdClient("http://127.0.0.1:2379,127.0.0.2:2380", cluster="blue")
    assert c.key("brokers", "ids", 3) == b"/gregor/blue/brokers/ids/3"
    assert c.relative(b"/gregor/blue/controller") == "controller"
    assert parse_endpoints("http://a:1, b:2") == [("a", 1), ("b", 2)]
    assert prefix_range_end(b"/a/") == b"/a0"
    assert lease_ttl_s(10000) == 10 and lease_ttl_s(1500) == 2 and lease_ttl_s(1) == 1
    with pytest.raises(ValueError):
        parse_endpoints("nohostport")


async def test_lease_expiry_deletes_key_and_reports_loss(client: EtcdClient) -> None:
    lease = await client.grant_lease(2)
    key = client.key("brokers", "ids", 1)
    assert await client.create_if_absent(key, b"b1", lease=lease.id)
    assert not await client.create_if_absent(key, b"again")  # version != 0 now
    lost: list[Exception] = []
    lease.on_lost(lost.append)
    # Revoke behind the keepalive's back: the next refresh must notice and report it.
    await client.revoke(lease.id)
    assert await client.get(key) is None
    reason = await asyncio.wait_for(asyncio.shield(lease.lost), timeout=lease.ttl_s + 2)
    assert "expired or was revoked" in str(reason) and lost == [reason]


async def test_lease_without_keepalive_expires(client: EtcdClient) -> None:
    lease = await client.grant_lease(2)
    key = client.key("controller")
    await client.put(key, b"x", lease=lease.id)
    lease._task.cancel()  # a frozen process: nothing refreshes the lease any more
    await asyncio.sleep(lease.ttl_s + 1.2)
    assert await client.get(key) is None
    assert await client.refresh_lease(lease.id) == 0


async def test_revoked_lease_deletes_keys_at_once(client: EtcdClient) -> None:
    lease = await client.grant_lease(10)
    key = client.key("controller")
    await client.put(key, b"x", lease=lease.id)
    await lease.revoke()
    assert await client.get(key) is None
    assert not lease.alive


async def test_cas_fails_on_stale_mod_revision(client: EtcdClient) -> None:
    key = client.key("controller_epoch")
    assert await client.cas(key, b"1", 0)  # absent: mod_revision 0
    first = await client.get(key)
    assert first is not None and first.value == b"1" and first.version == 1
    assert await client.cas(key, b"2", first.mod_revision)
    stale = await client.cas(key, b"3", first.mod_revision)
    assert not stale and stale.failed == (mod_revision_is(key, first.mod_revision),)
    current = await client.get(key)
    assert current is not None and current.value == b"2"


async def test_guarded_txn_names_the_failed_compare(client: EtcdClient) -> None:
    epoch, data = client.key("controller_epoch"), client.key("brokers", "topics", "t")
    rev = await client.put(epoch, b"1")
    ok = await client.guarded_txn([mod_revision_is(epoch, rev), version_is(data, 0)], [Put(data, b"{}")])
    assert ok.revision > rev
    await client.put(epoch, b"2")  # a newer controller
    with pytest.raises(CompareFailed) as info:
        await client.guarded_txn([mod_revision_is(epoch, rev)], [Delete(data)])
    assert [c.key for c in info.value.failed] == [epoch]
    assert (await client.get(data)) is not None  # nothing applied


async def test_watch_sees_put_and_delete(client: EtcdClient) -> None:
    prefix = client.key("brokers", "ids") + b"/"
    before = await client.put(client.key("brokers", "ids", 0), b"old")
    events: list[WatchEvent] = []

    async def collect() -> None:
        async for ev in client.watch_prefix(prefix, start_revision=before + 1):
            events.append(ev)
            if len(events) == 3:
                return

    task = asyncio.create_task(collect())
    await client.put(client.key("brokers", "ids", 1), b"b1")
    await client.put(client.key("brokertopics"), b"outside the prefix")
    await client.delete(client.key("brokers", "ids", 1))
    await client.delete(client.key("brokers", "ids", 0))
    await asyncio.wait_for(task, 5)
    assert [(e.type, client.relative(e.key), e.value) for e in events] == [
        ("put", "brokers/ids/1", b"b1"), ("delete", "brokers/ids/1", b""), ("delete", "brokers/ids/0", b"")]
    assert events[0].create_revision == events[0].mod_revision and events[1].version == 0


async def _watching(c: EtcdClient, prefix: str) -> "tuple[asyncio.Task[None], asyncio.Queue[WatchEvent]]":
    """A task watching c.key(prefix) into a queue, checked with a first put (prefix/1 = b"1")."""
    got: asyncio.Queue[WatchEvent] = asyncio.Queue()

    async def collect() -> None:
        async for ev in c.watch_prefix(c.key(prefix)):
            await got.put(ev)

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.2)
    await c.put(c.key(prefix, 1), b"1")
    assert (await asyncio.wait_for(got.get(), 5)).value == b"1"
    return task, got


async def test_watch_survives_a_failover_another_call_started(etcd: Process) -> None:
    """A call that fails moves the client to the next endpoint and closes the channel a watch streams
    on; the watch goes on from the next revision on the new channel, losing nothing. grpc.aio reports
    such a stream as locally cancelled (asyncio.CancelledError), which used to end the watch and, in
    the controller, silently stop its broker watch (a partition leader was never replaced)."""
    async with EtcdClient([etcd.grpc, etcd.grpc], cluster="t") as c:  # one member listed twice
        task, got = await _watching(c, "w")
        # What a call that fails with UNAVAILABLE does (EtcdClient._translate): move to the next
        # endpoint, closing the current channel under the watch stream.
        await c._rotate(c._client)
        assert c._client is None
        await c.put(c.key("w", 2), b"2")
        assert (await asyncio.wait_for(got.get(), 5)).value == b"2"
        assert not task.done()
        task.cancel()


async def test_watch_resumes_after_etcd_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A watch re-created after the stream broke continues from the next revision, losing nothing."""
    from gregor.cli.local_cluster import start_etcd, stop_process

    proc = start_etcd(str(tmp_path / "e"))
    host, port = proc.grpc.split(":")
    try:
        async with EtcdClient(proc.grpc, cluster="t") as c:
            task, got = await _watching(c, "x")
            stop_process(proc, signal.SIGKILL)
            with pytest.raises(EtcdUnavailable):
                await c.get(c.key("x", 1))
            proc = _restart_etcd(tmp_path / "e", int(port))
            # The client's channel may still be in reconnect backoff: retry the write, not the watch.
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                try:
                    await c.put(c.key("x", 2), b"2")
                    break
                except EtcdUnavailable:
                    if asyncio.get_running_loop().time() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert (await asyncio.wait_for(got.get(), 10)).value == b"2"
            task.cancel()
    finally:
        stop_process(proc)


def _restart_etcd(data_dir, port: int) -> Process:  # type: ignore[no-untyped-def]
    """etcd again on the same client port and data dir (start_etcd always picks new ports)."""
    import os
    import subprocess
    import time
    import urllib.request

    from gregor.cli.local_cluster import etcd_binary, free_port

    peer = free_port()
    log = open(os.path.join(data_dir, "logs", "etcd-restart.log"), "ab")
    popen = subprocess.Popen(
        [etcd_binary(), "--name", "gregor-etcd-0", "--data-dir", os.path.join(data_dir, "etcd-0"),
         "--listen-client-urls", f"http://127.0.0.1:{port}", "--advertise-client-urls", f"http://127.0.0.1:{port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    return Process("etcd", 0, popen.pid, f"127.0.0.1:{port}", "", "", str(data_dir))


def test_start_etcd_retries_a_port_taken_after_it_was_picked(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """free_port() can name a port that another process takes before etcd binds it (seen once as a
    test error, "etcd exited"): start_etcd tries again with new ports."""
    import socket

    from gregor.cli import local_cluster

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real = local_cluster.free_port
        picks = iter([port])  # the first pick, the client port, is taken
        monkeypatch.setattr(local_cluster, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
        proc = local_cluster.start_etcd(str(tmp_path / "e"))
        try:
            assert proc.grpc != f"127.0.0.1:{port}"
            with open(proc.log) as f:
                assert "address already in use" in f.read()
        finally:
            local_cluster.stop_process(proc)


async def test_lease_refresh_on_a_channel_closed_by_failover_is_unavailable(etcd: Process) -> None:
    """A keepalive in flight when another call's failure moves the client on (closing the channel under it)
    is a transport failure, EtcdUnavailable, which the keepalive loops retry on the next endpoint. grpc.aio
    reports it as a local cancellation (asyncio.CancelledError), which silently ended the coordinator's lease
    clock (LeaseFence.clock_loop): after an etcd-kill in the TLS chaos schedule its fence was never extended
    again and every __transaction_state write was refused for the rest of the run."""
    import socket

    hole = socket.socket()  # accepts TCP and never answers: a keepalive sent there stays in flight
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    try:
        async with EtcdClient([f"127.0.0.1:{hole.getsockname()[1]}", etcd.grpc], cluster="t") as c:
            refresh = asyncio.create_task(c.refresh_lease(0x1234, timeout_s=30))
            await asyncio.sleep(0.3)
            assert not refresh.done()
            # What a call that fails with UNAVAILABLE or DEADLINE_EXCEEDED does (EtcdClient._translate).
            await c._rotate(c._client)
            with pytest.raises(EtcdUnavailable, match="failover"):
                await asyncio.wait_for(refresh, 5)
            assert c.endpoint == etcd.grpc
            lease = await c.grant_lease(5)  # the next endpoint answers keepalives
            assert await c.refresh_lease(lease.id) > 0
            await lease.revoke()
    finally:
        hole.close()


async def test_a_watch_started_on_an_unreachable_member_moves_on(etcd: Process) -> None:
    """A watch (re-)created while its member does not answer (isolated, or its etcd process killed mid-failover)
    waited for good for its stream to start, and closing that channel in failover did not end the wait: the
    watch stayed silent. In the 10-minute chaos run both coordinators' ownership watches went silent so after
    a run of etcd faults, and neither claimed its shards again for the rest of the run. The stream's creation
    is bounded by the request timeout; the watch then goes on on the next endpoint from its revision."""
    import socket

    hole = socket.socket()  # accepts TCP and never answers
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)
    try:
        async with EtcdClient([etcd.grpc], cluster="t") as d:
            rev = await d.put(d.key("w", 0), b"0")
        async with EtcdClient([f"127.0.0.1:{hole.getsockname()[1]}", etcd.grpc], cluster="t",
                              request_timeout_s=1.0) as c:
            got: asyncio.Queue[WatchEvent] = asyncio.Queue()

            async def collect() -> None:
                async for ev in c.watch_prefix(c.key("w"), rev + 1):
                    await got.put(ev)

            task = asyncio.create_task(collect())
            await asyncio.sleep(0.3)
            await c._rotate(c._client)  # another call's failure moves the client on, closing the channel
            await c.put(c.key("w", 1), b"1")
            assert (await asyncio.wait_for(got.get(), 10)).value == b"1"
            task.cancel()
    finally:
        hole.close()


class FreezingRelay:
    """A TCP relay to one etcd member that can go silent: frozen, it keeps every connection open and passes
    nothing either way (a partition that drops packets, or a stopped process, as the client sees it)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            await self.flowing.wait()
            writer.write(data)
            await writer.drain()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            up_writer.close()

    def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_a_watch_on_a_member_gone_silent_moves_on(etcd: Process) -> None:
    """A watch stream has no deadline: on a member that stops answering without closing the connection (packets
    dropped by a partition, SIGSTOP), the stream waited for good and missed every later change. The client's
    channel pings (HTTP/2 keepalive, as etcd's clientv3 does): an unanswered ping ends the channel's calls, the
    watch goes on on the next endpoint from its revision and sees the change made meanwhile."""
    relay = FreezingRelay(etcd.grpc)
    silent = await relay.start()
    try:
        async with EtcdClient([etcd.grpc], cluster="t") as d:
            rev = await d.put(d.key("s", 0), b"0")
        async with EtcdClient([silent, etcd.grpc], cluster="t", keepalive_s=6.0, keepalive_timeout_s=2.0) as c:
            got: asyncio.Queue[WatchEvent] = asyncio.Queue()

            async def collect() -> None:
                async for ev in c.watch_prefix(c.key("s"), rev + 1):
                    await got.put(ev)

            task = asyncio.create_task(collect())
            async with EtcdClient([etcd.grpc], cluster="t") as d:
                await d.put(d.key("s", 1), b"1")
                assert (await asyncio.wait_for(got.get(), 10)).value == b"1"  # flowing through the relay
                relay.flowing.clear()
                await d.put(d.key("s", 2), b"2")
            # Without pings this waits forever; with them: a ping unanswered for 2 s within 6 + 2 s, then the
            # next member from the watch's revision.
            assert (await asyncio.wait_for(got.get(), 30)).value == b"2"
            task.cancel()
    finally:
        relay.flowing.set()
        relay.close()
