"""A standby's direct watch on the active controller's process: revoke its lease once it is provably gone.

The active controller holds the `controller` key on an etcd lease of `controller.quorum.fetch.timeout.ms`
(2 s); a standby can only win once that key is gone, so a SIGKILLed controller used to be replaced after
the lease expired (1.3-2.5 s with etcd's expiry check). The lease is the only judge that works whatever
happened to the active (a network partition, a frozen process, a vanished host), and it stays so. This
module adds one case where a standby knows more than etcd: the active's process is dead.

A standby holds a plain TCP connection to the endpoint the active registered (its gRPC port; nothing is
sent, the connection only exists). When that connection breaks (EOF or reset: the kernel closed the
active's socket) the standby connects afresh to the same host:port. A connect refused (ECONNREFUSED: the
kernel at that address has no listener on the port, so the process is gone or has closed its server),
confirmed by a second refused connect CONFIRM_DELAY_S later, is proof enough; the standby then revokes the
lease the `controller` key is bound to, read from that key, and only while the key is still the
registration it watched (same mod_revision and lease), so a newer controller's lease is never revoked. The
key goes with the lease and every controller's watch runs the usual election at once.

Anything else proves nothing and leaves the lease as the only path: a connect that times out or fails
otherwise (a partitioned or vanished host, EHOSTUNREACH), a connect that succeeds (a SIGSTOPped process's
kernel still accepts), an endpoint the standby never managed to connect to (a misadvertised address must
not make the standbys revoke a live controller's lease over and over). A wrong revocation could not make
two controllers write either: every controller write is fenced by `controller_epoch`, which the next
election bumps, and the old controller, finding its lease gone, resigns.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from gregor.common.aio import wait_for
from gregor.common.etcd import EtcdClient, EtcdError, KeyValue
from gregor.common.etcd_layout import ControllerZNode

log = logging.getLogger(__name__)

# Refused connects, in a row, right after the connection broke, that prove the active's process gone.
REFUSALS_REQUIRED = 2
CONFIRM_DELAY_S = 0.05  # between them: a listener being re-bound (a restart on the same port) answers the second
CONNECT_TIMEOUT_S = 1.0  # a connect slower than this proves nothing (a loaded or distant host)
RETRY_S = 0.5  # between attempts to (re)establish the connection when it could not be made
READ_CHUNK = 4096


class ConnectOutcome(Enum):
    """What one fresh TCP connect to the active's endpoint showed."""

    CONNECTED = "connected"  # a listener accepted: the process may be alive (even stopped)
    REFUSED = "refused"  # ECONNREFUSED: no listener on that host:port
    NO_ANSWER = "no answer"  # timed out, unreachable, or any other error: nothing is proven


def classify_connect_error(exc: BaseException) -> ConnectOutcome:
    """ECONNREFUSED alone is REFUSED; timeouts, unreachable networks and everything else prove nothing."""
    if isinstance(exc, ConnectionRefusedError) or (isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED):
        return ConnectOutcome.REFUSED
    return ConnectOutcome.NO_ANSWER


def process_gone(outcomes: Sequence[ConnectOutcome], required: int = REFUSALS_REQUIRED) -> bool:
    """The fresh connects made since an established connection broke, in order: the process is provably
    gone when the first `required` of them were all refused (one that connected or got no answer ends it)."""
    return required > 0 and len(outcomes) >= required and all(o is ConnectOutcome.REFUSED
                                                              for o in outcomes[:required])


@dataclass(frozen=True)
class WatchedRegistration:
    """The active controller's registration a standby watches: who, where, on which lease, at which revision."""

    controller_id: int
    endpoint: str
    lease: int
    mod_revision: int

    @classmethod
    def of(cls, kv: KeyValue) -> "WatchedRegistration":
        registration = ControllerZNode.decode(kv.value)
        return cls(registration.controller_id, registration.endpoint, kv.lease, kv.mod_revision)


def still_registered(watched: WatchedRegistration, kv: KeyValue | None) -> bool:
    """The `controller` key is still the registration watched (a newer controller's has another mod_revision
    and lease), so revoking the lease it is bound to ends that registration and nothing else."""
    return (kv is not None and watched.lease != 0 and kv.lease == watched.lease
            and kv.mod_revision == watched.mod_revision)


def parse_endpoint(endpoint: str) -> tuple[str, int] | None:
    """host:port ([v6]:port too) of a registration; None when there is none, it does not parse, or its host is
    a wildcard (0.0.0.0 or ::: a connect there reaches the standby's own host, not the active's)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("0.0.0.0", "::", "*"):
        return None
    number = int(port)
    return (host, number) if 0 < number < 65536 else None


async def _connect(host: str, port: int) -> tuple[ConnectOutcome, asyncio.StreamReader | None,
                                                  asyncio.StreamWriter | None]:
    """One fresh TCP connect: its outcome, and the open connection when it connected."""
    try:
        reader, writer = await wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
    except asyncio.TimeoutError:
        return ConnectOutcome.NO_ANSWER, None, None
    except OSError as exc:
        return classify_connect_error(exc), None, None
    return ConnectOutcome.CONNECTED, reader, writer


async def _hold(reader: asyncio.StreamReader) -> str:
    """Read (and drop) whatever arrives until the connection breaks; says how it broke."""
    try:
        while await reader.read(READ_CHUNK):
            pass
    except OSError as exc:
        return f"connection {exc.__class__.__name__}: {exc}"
    return "connection closed by the peer"


def _close(writer: asyncio.StreamWriter | None) -> None:
    if writer is not None:
        writer.close()


class ActiveControllerWatch:
    """The standby side: follows the registration the controller last read and watches that process.

    `follow` is called with every read of the `controller` key (None, or our own registration, stops
    watching). One task at a time; it only connects, reads and, once, revokes. `on_revoked` is told
    (the registration, the reason) after a revocation.
    """

    def __init__(self, etcd: EtcdClient, controller_id: int,
                 on_revoked: Callable[[WatchedRegistration, str], None] = lambda watched, reason: None) -> None:
        self.etcd = etcd
        self.controller_id = controller_id
        self.on_revoked = on_revoked
        self.watched: WatchedRegistration | None = None
        self.connected = False  # the watch holds a connection to the watched endpoint now (tests read it)
        self.connects = 0  # connects tried, of every registration watched
        self._task: asyncio.Task[None] | None = None

    def follow(self, kv: KeyValue | None) -> None:
        """Watch the registration in kv (another controller's), or nothing."""
        watched = WatchedRegistration.of(kv) if kv is not None else None
        if watched is not None and (watched.controller_id == self.controller_id or watched.lease == 0
                                    or parse_endpoint(watched.endpoint) is None):
            watched = None
        if watched == self.watched and (watched is None or (self._task is not None and not self._task.done())):
            return
        self._cancel()
        self.watched = watched
        if watched is not None:
            self._task = asyncio.get_running_loop().create_task(self._run(watched),
                                                                name=f"active-controller-watch-{watched.controller_id}")
            self._task.add_done_callback(self._on_done)

    async def stop(self) -> None:
        task = self._cancel()
        self.watched = None
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    def _cancel(self) -> asyncio.Task[None] | None:
        task, self._task = self._task, None
        self.connected = False
        if task is not None:
            task.cancel()
        return task

    @staticmethod
    def _on_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            # Nothing lost: the lease's expiry still replaces a dead controller.
            log.error("%s failed; the lease alone decides until the next registration is read", task.get_name(),
                      exc_info=task.exception())

    async def _run(self, watched: WatchedRegistration) -> None:
        address = parse_endpoint(watched.endpoint)
        assert address is not None
        host, port = address
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        announced = False
        try:
            while True:
                if reader is None:
                    _, reader, writer = await self._connect(host, port)
                    if reader is None:
                        # Never connected (yet), or the last break was followed by no answer: nothing proven.
                        await asyncio.sleep(RETRY_S)
                        continue
                if not announced:
                    log.info("controller %d: connected to active controller %d at %s (lease %x); a break of this "
                             "connection with its endpoint refusing connects revokes that lease",
                             self.controller_id, watched.controller_id, watched.endpoint, watched.lease)
                    announced = True
                self.connected = True
                held_since = time.monotonic()
                broke = await _hold(reader)
                held_s = time.monotonic() - held_since
                self.connected = False
                _close(writer)
                reader = writer = None
                outcomes: list[ConnectOutcome] = []
                while len(outcomes) < REFUSALS_REQUIRED and (not outcomes or outcomes[-1] is ConnectOutcome.REFUSED):
                    if outcomes:
                        await asyncio.sleep(CONFIRM_DELAY_S)
                    outcome, reader, writer = await self._connect(host, port)
                    outcomes.append(outcome)
                if process_gone(outcomes):
                    reason = (f"{broke}, then {len(outcomes)} connects to {watched.endpoint} refused "
                              f"{int(CONFIRM_DELAY_S * 1000)} ms apart (no listener: the process is gone)")
                    await self._revoke(watched, reason)
                    return
                log.debug("controller %d: connection to active controller %d at %s broke (%s); connects since: %s",
                          self.controller_id, watched.controller_id, watched.endpoint, broke,
                          ", ".join(o.value for o in outcomes))
                if reader is None or held_s < RETRY_S:
                    # No connection, or one that something (a proxy, a TLS server) closes at once: at most a
                    # couple of connects per RETRY_S, not a busy loop. A break right after connecting is
                    # still probed at once above, so a process that dies then is still caught.
                    await asyncio.sleep(RETRY_S)
        finally:
            self.connected = False
            _close(writer)

    async def _connect(self, host: str, port: int) -> tuple[ConnectOutcome, asyncio.StreamReader | None,
                                                            asyncio.StreamWriter | None]:
        self.connects += 1
        return await _connect(host, port)

    async def _revoke(self, watched: WatchedRegistration, reason: str) -> None:
        """Revoke the watched registration's lease if the `controller` key is still that registration."""
        try:
            kv = await self.etcd.get(ControllerZNode.key(self.etcd))
            if not still_registered(watched, kv):
                log.info("controller %d: active controller %d is gone (%s), but the controller key moved on; "
                         "nothing to revoke", self.controller_id, watched.controller_id, reason)
                return
            await self.etcd.revoke(watched.lease)
        except EtcdError as exc:
            log.warning("controller %d: could not revoke lease %x of gone active controller %d (%s); its "
                        "expiry will: %s", self.controller_id, watched.lease, watched.controller_id, exc, reason)
            return
        log.warning("controller %d: revoked lease %x of active controller %d (registration at revision %d): %s",
                    self.controller_id, watched.lease, watched.controller_id, watched.mod_revision, reason)
        self.on_revoked(watched, reason)
