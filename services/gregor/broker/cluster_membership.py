"""A cluster-mode broker's link to etcd: its lease-bound registration (broker epoch) and the controller's address.

The broker registers `brokers/ids/<id>` with JSON {host, grpc_port, data_port, rack, ...}
bound to a lease (ZooKeeper's ephemeral node); the key's creation revision is the
broker epoch. If the key still exists from an earlier incarnation whose lease has not
expired yet (a SIGKILLed broker restarted quickly), registration waits for it to go,
unless the key is bound to `previous_lease`: the lease the previous process on our log
dirs recorded there (log_dir_lock.py). Holding the dirs' lock proves that process dead,
so that lease is revoked and the broker registers at once, instead of waiting up to
broker.session.timeout.ms. When the lease is lost the broker registers again and gets
a new epoch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import Counter

from gregor.broker.limits import (
    REGISTER_RETRY_S,
    REGISTER_WAIT_S,
    CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S,
)
from gregor.common import errors
from gregor.common.aio import wait_for
from gregor.common.etcd import EtcdClient, EtcdError, LeaseLost, lease_ttl_s
from gregor.common.etcd_layout import BrokerIdsZNode, ControllerZNode
from gregor.common.lease_thread import ThreadedLease
from gregor.common.rpc import channel

log = logging.getLogger(__name__)

STALE_REGISTRATIONS_REVOKED = Counter(
    "gregor_broker_stale_registrations_revoked_total",
    "Registrations of this broker's previous process (SIGKILLed, its log dirs' lock since taken by us) whose "
    "lease was revoked at startup instead of waited out")


class ClusterMembership:
    """Registration, re-registration and controller lookup for one broker.

    Concurrency: runs on the broker's event loop. One registration task at a time
    (started by `start()` and by the lease-lost callback) writes `broker_epoch`;
    everyone else only reads it or awaits `wait_registered()`.
    """

    def __init__(self, etcd: EtcdClient, broker_id: int, info: dict[str, Any], session_timeout_ms: int,
                 on_registered: Callable[[int], None] | None = None, previous_lease: int = 0,
                 on_lease: Callable[[int], None] | None = None) -> None:
        """previous_lease: the lease the previous process on our log dirs registered with (0: unknown), to
        revoke if our key is still bound to it; on_lease: told each new lease before it is registered with
        (the broker records it in its log dir)."""
        self.etcd = etcd
        self.broker_id = broker_id
        self.info = info
        self.ttl_s = lease_ttl_s(session_timeout_ms)
        self.broker_epoch = -1
        self._on_registered = on_registered
        self._previous_lease = previous_lease
        self._waiting_on_lease = 0  # the other registration being waited out, logged once per lease
        self._on_lease = on_lease
        self._registered = asyncio.Event()
        self._lease: ThreadedLease | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def key(self) -> bytes:
        return BrokerIdsZNode.key(self.etcd, self.broker_id)

    async def start(self) -> None:
        """Register and return once registered (the broker epoch is known)."""
        self._spawn_register()
        await self._registered.wait()

    async def wait_registered(self, timeout_s: float = REGISTER_WAIT_S) -> int:
        """The current broker epoch, waiting for a registration in progress."""
        try:
            await wait_for(self._registered.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return self.broker_epoch

    async def close(self) -> None:
        """Stop re-registering and revoke the lease: the controller sees the broker leave at once."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._lease is not None:
            await self._lease.revoke()
        for ch in self._channels.values():
            await ch.close()

    def _spawn_register(self) -> None:
        self._registered.clear()
        self._task = asyncio.get_running_loop().create_task(self._register(), name="broker-registration")

    async def _register(self) -> None:
        value = BrokerIdsZNode.encode(self.info, int(time.time() * 1000))
        while True:
            try:
                lease = self._lease if self._lease is not None and self._lease.alive else await self._new_lease()
                result = await self.etcd.create_if_absent(self.key, value, lease.id)
                if result:
                    # The put happened at the transaction's revision: that is the key's creation revision.
                    kv = await self.etcd.get(self.key)
                    self.broker_epoch = kv.create_revision if kv is not None else result.revision
                    break
                if await self._revoke_previous_registration():
                    continue
            except EtcdError as exc:
                log.warning("broker %d: registration failed (%s); retrying", self.broker_id, exc)
            await asyncio.sleep(REGISTER_RETRY_S)
        log.info("broker %d registered with broker epoch %d", self.broker_id, self.broker_epoch)
        self._registered.set()
        if self._on_registered is not None:
            self._on_registered(self.broker_epoch)

    async def _revoke_previous_registration(self) -> bool:
        """Our key exists: revoke its lease if it is the one our previous process recorded (it is dead: we hold
        its log dirs' lock); True if revoked (register again at once), False to wait for the key to go."""
        kv = await self.etcd.get(self.key)
        if kv is None:
            return True  # gone meanwhile: register now
        if self._previous_lease and kv.lease == self._previous_lease:
            await self.etcd.revoke(kv.lease)
            self._previous_lease = 0  # once: a key that comes back on that lease is not ours to fight over
            STALE_REGISTRATIONS_REVOKED.inc()
            log.info("broker %d: revoked the registration lease %x of its previous process (its log dirs' lock "
                     "is ours, so that process is gone); registering now", self.broker_id, kv.lease)
            return True
        if kv.lease == self._waiting_on_lease:
            return False  # said once per lease: the loop retries every REGISTER_RETRY_S
        self._waiting_on_lease = kv.lease
        if self._previous_lease:
            log.warning("broker %d: %s is registered with lease %x, not %x, the one our previous process recorded: "
                        "another live process may use broker id %d; waiting for that registration to go",
                        self.broker_id, self.key.decode(), kv.lease, self._previous_lease, self.broker_id)
        else:
            log.info("broker %d: %s is still registered (an earlier incarnation's lease); waiting",
                     self.broker_id, self.key.decode())
        return False

    async def _new_lease(self) -> ThreadedLease:
        # Refreshed from its own thread (as the controller's election lease): a long LeaderAndIsr or a GC
        # pause on the loop must not cost the registration (issue 24: 10,000 partitions fenced every broker).
        lease = await ThreadedLease.grant(self.etcd, self.ttl_s)
        self._lease = lease
        if self._on_lease is not None:
            self._on_lease(lease.id)
        lease.on_lost(lambda reason: self._on_lease_lost(lease, reason))
        return lease

    def _on_lease_lost(self, lease: ThreadedLease, reason: LeaseLost) -> None:
        if self._closing or lease is not self._lease:
            return
        log.warning("broker %d lost its registration (%s); registering again", self.broker_id, reason)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._spawn_register()

    # -- controlled shutdown (Kafka's KafkaServer.controlledShutdown) ---------------

    async def controlled_shutdown(self, max_retries: int, retry_backoff_ms: int,
                                  sleep: Callable[[float], Any] = asyncio.sleep) -> bool:
        """Ask the active controller to move our leaderships away; True once it reports none left.

        Up to `max_retries` attempts (controlled.shutdown.max.retries): each sends
        ControlledShutdown(broker id, broker epoch) to the controller read from etcd;
        an error, an unreachable controller or partitions still led means another
        attempt after `retry_backoff_ms` (controlled.shutdown.retry.backoff.ms).
        False when the attempts are exhausted: the broker then stops anyway
        ("unclean" shutdown in Kafka's log), and the controller's broker-failure path
        moves what is left once the registration goes.
        """
        from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

        for attempt in range(1, max_retries + 1):
            try:
                controller_id, ch = await self.controller_channel()
                resp = await controller_pb2_grpc.ControllerServiceStub(ch).ControlledShutdown(
                    controller_pb2.ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch),
                    timeout=CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S)
                if resp.HasField("error") and resp.error.code != errors.Code.NONE:
                    raise errors.from_detail(resp.error)
                remaining = [f"{tp.topic}-{tp.partition}" for tp in resp.remaining_partitions]
                if not remaining:
                    log.info("broker %d: controlled shutdown succeeded (controller %d, attempt %d)",
                             self.broker_id, controller_id, attempt)
                    return True
                log.warning("broker %d: controlled shutdown attempt %d: still leading %d partitions: %s",
                            self.broker_id, attempt, len(remaining), ", ".join(remaining[:20]))
            except grpc.RpcError as exc:
                log.warning("broker %d: controlled shutdown attempt %d failed: %s", self.broker_id, attempt,
                            errors.from_rpc_error(exc))
            except (errors.GregorError, EtcdError, OSError) as exc:
                log.warning("broker %d: controlled shutdown attempt %d failed: %s", self.broker_id, attempt, exc)
            if attempt < max_retries:
                log.info("broker %d: retrying controlled shutdown in %d ms", self.broker_id, retry_backoff_ms)
                await sleep(retry_backoff_ms / 1000)
        log.warning("broker %d: proceeding to do an unclean shutdown as all the controlled shutdown attempts failed",
                    self.broker_id)
        return False

    # -- the active controller ----------------------------------------------------

    async def controller_channel(self) -> tuple[int, grpc.aio.Channel]:
        """(controller id, channel) of the active controller, read from the `controller` key."""
        kv = await self.etcd.get(ControllerZNode.key(self.etcd))
        if kv is None:
            raise errors.error_for(errors.Code.NOT_CONTROLLER, "no active controller")
        registration = ControllerZNode.decode(kv.value)
        endpoint = registration.endpoint
        if not endpoint:
            raise errors.error_for(errors.Code.NOT_CONTROLLER, "the active controller has no endpoint")
        if endpoint not in self._channels:
            self._channels[endpoint] = channel(endpoint)
        return registration.controller_id, self._channels[endpoint]
