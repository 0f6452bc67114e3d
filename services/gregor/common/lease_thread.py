"""An etcd lease kept alive from a thread of its own (Kafka's heartbeats run on their own threads too).

`etcd.Lease` refreshes from a task on the owner's event loop, so anything that holds that loop for
longer than the TTL minus the refresh interval loses the lease although the process is alive and
well. The controller's election lease is `controller.quorum.fetch.timeout.ms`, 2 s, and a controller
taking over 10,000 partitions holds its loop for seconds on a loaded machine: with the loop's lease
it lost each term during its own failover and flapped without end (seen at load average 15).

`ThreadedLease` has the interface the controller uses of `etcd.Lease` (id, ttl_s, alive, lost,
on_lost, revoke); its keepalive is a daemon thread with a blocking gRPC channel of its own (grpc.aio
objects belong to one event loop), refreshing every TTL/3. A SIGSTOPped or dead process still loses
it after the TTL (the thread stops with it), so fencing by lease expiry is unchanged; a process whose
loop is merely busy keeps it. A process whose loop is wedged (no callback run for `loop_stall_limit_s`,
default max(30 s, 3 TTLs): far past any apply or takeover measured, 11 s at load 23) is no longer kept
alive by its thread: the thread stops refreshing, so etcd expires the lease and another controller or a
restart takes over, as it would if the process had died. Loss is reported on the owner's loop
(call_soon_threadsafe).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import grpc
from aetcd import rpc

from gregor.common.etcd import LEASE_KEEPALIVE_FAILURES, EtcdClient, EtcdError, LeaseLoss, LeaseLost

log = logging.getLogger(__name__)

LOOP_STALL_LIMIT_MIN_S = 30.0


class ThreadedLease(LeaseLoss):
    """An etcd lease refreshed from its own thread until revoked or lost.

    Concurrency: created and used on one event loop (the owner's); the keepalive thread touches
    only its own channel and `_stop`, and hands a loss to the owner's loop. `lost` resolves and
    every `on_lost` callback runs there, once, unless the owner revoked the lease.
    """

    def __init__(self, client: EtcdClient, lease_id: int, ttl_s: int,
                 loop_stall_limit_s: float | None = None) -> None:
        super().__init__(client, lease_id, ttl_s)
        self._loop = asyncio.get_running_loop()
        self._stop = threading.Event()
        self._endpoints = [f"{host}:{port}" for host, port in client.endpoints]
        self._credentials = client.channel_credentials()
        self.loop_stall_limit_s = (loop_stall_limit_s if loop_stall_limit_s is not None
                                   else max(LOOP_STALL_LIMIT_MIN_S, 3.0 * ttl_s))
        self._loop_seen = time.monotonic()  # written on the owner's loop, read by the thread
        self._thread = threading.Thread(target=self._keepalive, name=f"etcd-lease-{lease_id:x}", daemon=True)
        self._thread.start()

    @classmethod
    async def grant(cls, client: EtcdClient, ttl_s: int,
                    loop_stall_limit_s: float | None = None) -> "ThreadedLease":
        """A new lease of ttl_s seconds (etcd may raise it to its minimum) with its keepalive thread running."""
        lease_id, ttl = await client.grant_lease_id(ttl_s)
        return cls(client, lease_id, ttl, loop_stall_limit_s)

    async def revoke(self) -> None:
        """Stop refreshing and revoke: etcd deletes every key bound to the lease at once."""
        self._revoked = True
        self._stop.set()
        if not self.lost.done():
            self.lost.set_result(LeaseLost(f"lease {self.id:x} revoked by its owner"))
        try:
            await self.client.revoke(self.id)
        except EtcdError as exc:
            log.warning("could not revoke lease %x (keys expire within %d s): %s", self.id, self.ttl_s, exc)

    def stop_refreshing(self) -> None:
        """Stop the keepalive without revoking (etcd expires the lease after its TTL); no loss is reported."""
        self._stop.set()

    # -- the keepalive thread --------------------------------------------------------------------

    def _channel(self, index: int) -> grpc.Channel:
        target = self._endpoints[index % len(self._endpoints)]
        if self._credentials is not None:
            return grpc.secure_channel(target, self._credentials)
        return grpc.insecure_channel(target)

    def _refresh(self, channel: grpc.Channel, timeout_s: float) -> int:
        call = rpc.LeaseStub(channel).LeaseKeepAlive(iter([rpc.LeaseKeepAliveRequest(ID=self.id)]),
                                                     timeout=timeout_s)
        try:
            for reply in call:
                return int(reply.TTL)
        finally:
            call.cancel()
        raise LeaseLost(f"etcd lease keepalive {self.id:x}: stream ended without reply")

    def _keepalive(self) -> None:
        interval_s = self.ttl_s / 3
        last_ok = time.monotonic()
        index = 0
        channel: grpc.Channel | None = None
        try:
            while not self._stop.wait(interval_s):
                stalled_s = time.monotonic() - self._loop_seen
                if stalled_s > self.loop_stall_limit_s:
                    # Wedged, not busy: stop vouching for it (etcd expires the lease within its TTL).
                    self._report(LeaseLost(f"lease {self.id:x} no longer refreshed: the owner's event loop has "
                                           f"run nothing for {stalled_s:.1f} s (limit {self.loop_stall_limit_s:.0f} s)"))
                    return
                try:
                    self._loop.call_soon_threadsafe(self._seen)  # the loop answers when it runs at all
                except RuntimeError:  # the owner's loop is closed
                    return
                if channel is None:
                    channel = self._channel(index)
                try:
                    ttl = self._refresh(channel, interval_s)
                except (grpc.RpcError, LeaseLost) as exc:
                    LEASE_KEEPALIVE_FAILURES.inc()
                    # Unreachable: the lease is still good server-side until TTL after our last refresh.
                    # Try the next endpoint on the next round (a keepalive is safe to send anywhere).
                    channel.close()
                    channel, index = None, index + 1
                    if time.monotonic() - last_ok >= self.ttl_s:
                        self._report(LeaseLost(f"lease {self.id:x} not refreshed within {self.ttl_s} s: {exc}"))
                        return
                    continue
                if self._stop.is_set():
                    return
                if ttl <= 0:
                    self._report(LeaseLost(f"lease {self.id:x} expired or was revoked"))
                    return
                last_ok = time.monotonic()
        except BaseException as exc:  # the thread must say it stopped, whatever stopped it
            self._report(LeaseLost(f"lease {self.id:x} keepalive died: {exc!r}"))
        finally:
            if channel is not None:
                channel.close()

    def _seen(self) -> None:
        self._loop_seen = time.monotonic()

    def _report(self, reason: LeaseLost) -> None:
        """From the keepalive thread: resolve the loss on the owner's loop."""
        try:
            self._loop.call_soon_threadsafe(self._lose, reason)
        except RuntimeError:  # the owner's loop is closed: nobody is left to tell
            pass

    def _lose(self, reason: LeaseLost) -> None:
        if not self._revoked:
            self._report_loss(reason)
