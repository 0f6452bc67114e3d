"""A thin asyncio wrapper over aetcd for Gregor: cluster-scoped keys, leases, guarded transactions, watches."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import aetcd
import grpc
from aetcd import rpc
from aetcd import watcher as aetcd_watcher
from prometheus_client import Counter, Histogram

from gregor.common import tls
from gregor.common.aio import wait_for
from gregor.common.metrics import LATENCY_BUCKETS_S, observe_seconds

log = logging.getLogger(__name__)

ENDPOINT_FAILOVERS = Counter("gregor_etcd_endpoint_failovers_total",
                             "Times an etcd client moved to the next endpoint after its member failed")
REQUEST_DURATION = Histogram("gregor_etcd_request_duration_seconds",
                             "Unary etcd RPCs, by gRPC method, from first send to answer or error "
                             "(ZooKeeper's ZooKeeperRequestLatencyMs)", ["method"], buckets=LATENCY_BUCKETS_S)
LEASE_KEEPALIVE_FAILURES = Counter("gregor_etcd_lease_keepalive_failures_total",
                                   "Lease refreshes that failed (etcd unreachable); the lease is lost after its TTL")

# One etcd RPC may take this long before it counts as unavailable; a lease TTL is seconds, so
# a stuck call must give up well inside it for the keepalive to retry.
REQUEST_TIMEOUT_S = 5.0
# A watch whose stream broke is re-created after this backoff (doubling up to the max).
WATCH_RETRY_BACKOFF_S = 0.1
WATCH_RETRY_BACKOFF_MAX_S = 2.0
# etcd refuses TTLs below its minimum (1.5 s with default raft timings) by raising them; 1 s is ours.
LEASE_TTL_MIN_S = 1


class EtcdError(RuntimeError):
    """An etcd operation failed; the message names the operation and the endpoint."""


class EtcdUnavailable(EtcdError):
    """etcd did not answer (connection refused, timeout, stream reset)."""


class CompareFailed(EtcdError):
    """A guarded transaction did not apply because these compares did not hold."""

    def __init__(self, failed: Sequence["Compare"], revision: int) -> None:
        self.failed = tuple(failed)
        self.revision = revision
        super().__init__("compare failed: " + ", ".join(map(str, self.failed)) + f" (at revision {revision})")


class LeaseLost(EtcdError):
    """A lease expired, was revoked elsewhere, or could not be refreshed within its TTL."""


class WatchCompacted(EtcdError):
    """A watch asked for history etcd has compacted away: re-read the keys, then watch again."""

    def __init__(self, compact_revision: int) -> None:
        self.compact_revision = compact_revision
        super().__init__(f"watch start revision compacted (compact revision {compact_revision})")


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it; `version` 0 and revisions 0 mean the key does not exist."""

    key: bytes
    value: bytes = b""
    create_revision: int = 0
    mod_revision: int = 0
    version: int = 0
    lease: int = 0

    @classmethod
    def from_pb(cls, kv: rpc.KeyValue) -> "KeyValue":
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True)
class RangeResult:
    """Keys read at one store revision (watch from revision + 1 to miss nothing)."""

    kvs: tuple[KeyValue, ...]
    revision: int


CompareTarget = Literal["version", "create_revision", "mod_revision", "value"]


@dataclass(frozen=True)
class Compare:
    """An equality compare of one key's field (etcd compares a missing key as all zeros)."""

    key: bytes
    target: CompareTarget
    expected: int | bytes

    def holds(self, kv: KeyValue | None) -> bool:
        """Evaluate locally against a read of the key (None when missing), as etcd does."""
        if kv is None:
            return self.target != "value" and self.expected == 0
        return bool(getattr(kv, self.target) == self.expected)

    def to_pb(self) -> rpc.Compare:
        c = rpc.Compare(key=self.key, result=rpc.Compare.EQUAL)
        if self.target == "value":
            c.target, c.value = rpc.Compare.VALUE, bytes(self.expected)  # type: ignore[arg-type]
        elif self.target == "version":
            c.target, c.version = rpc.Compare.VERSION, int(self.expected)
        elif self.target == "create_revision":
            c.target, c.create_revision = rpc.Compare.CREATE, int(self.expected)
        else:
            c.target, c.mod_revision = rpc.Compare.MOD, int(self.expected)
        return c

    def __str__(self) -> str:
        return f"{self.key.decode(errors='replace')}.{self.target} == {self.expected!r}"


def version_is(key: bytes, version: int) -> Compare:
    return Compare(key, "version", version)


def mod_revision_is(key: bytes, revision: int) -> Compare:
    return Compare(key, "mod_revision", revision)


def value_is(key: bytes, value: bytes) -> Compare:
    return Compare(key, "value", value)


@dataclass(frozen=True)
class Put:
    """Set a key, bound to `lease` when it is non-zero."""

    key: bytes
    value: bytes
    lease: int = 0

    def to_pb(self) -> rpc.RequestOp:
        return rpc.RequestOp(request_put=rpc.PutRequest(key=self.key, value=self.value, lease=self.lease))


@dataclass(frozen=True)
class Delete:
    """Delete a key, or every key under it when `prefix`."""

    key: bytes
    prefix: bool = False

    def to_pb(self) -> rpc.RequestOp:
        end = prefix_range_end(self.key) if self.prefix else b""
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=self.key, range_end=end))


@dataclass(frozen=True)
class TxnResult:
    """Outcome of a transaction; truthy when it applied. `failed` lists compares that did not hold."""

    succeeded: bool
    revision: int
    failed: tuple[Compare, ...] = ()

    def __bool__(self) -> bool:
        return self.succeeded


@dataclass(frozen=True)
class WatchEvent:
    """A put or delete seen by a watch; for a delete, `value` is empty and `version` 0."""

    type: Literal["put", "delete"]
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


class WatchTask:
    """The one background task of an etcd-fed cache (its follow_prefix loop): started once, stopped by
    cancelling it and waiting for it to end. Concurrency: event-loop owned."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task[None] | None = None

    def start(self, run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


async def follow_prefix(etcd: "EtcdClient", prefix: bytes, *, reset: Callable[[], None],
                        apply: Callable[[bytes, bytes | None, int], None], loaded: Callable[[int], None],
                        what: str, retry_s: float = 0.5) -> None:
    """Keep a cache of every key under prefix (Kafka's metadata caches over ZooKeeper watches): read them all
    (reset(), then apply(key, value, revision) each, then loaded(revision)), then watch from the next revision
    (apply(key, value or None when deleted, revision)); a compacted watch starts over with a fresh read; an
    etcd error is logged and retried after retry_s. Runs until cancelled, on the caller's event loop."""
    await follow_prefix_kvs(etcd, prefix, reset=reset,
                            apply=lambda kv, revision: apply(kv.key, kv.value if kv.version else None, revision),
                            loaded=loaded, what=what, retry_s=retry_s)


E = TypeVar("E")


def config_entity_apply(entity: Callable[[bytes], E | None], decode: Callable[[bytes], dict[str, str]],
                        apply: Callable[[E, dict[str, str]], None], *, what: str,
                        logger: logging.Logger) -> Callable[[bytes, bytes | None, int], None]:
    """follow_prefix's apply for a prefix of config entities (`config/brokers/<id>`, `config/clients/<id>`...,
    Kafka's ConfigEntityZNodes): a key that names no entity (entity(key) None) is skipped; a value is decoded
    ({} when deleted or empty) and handed to apply(entity, configs); a malformed one is logged to `logger` as
    `<what>: ignoring malformed <key>: <why>` and skipped (the entity keeps what it had)."""

    def on_change(key: bytes, value: bytes | None, _revision: int) -> None:
        name = entity(key)
        if name is None:
            return
        try:
            configs = decode(value) if value else {}
        except ValueError as exc:
            logger.warning("%s: ignoring malformed %r: %s", what, key, exc)
            return
        apply(name, configs)

    return on_change


async def follow_prefix_kvs(etcd: "EtcdClient", prefix: bytes, *, reset: Callable[[], None],
                            apply: Callable[[KeyValue, int], None], loaded: Callable[[int], None],
                            what: str, retry_s: float = 0.5) -> None:
    """follow_prefix with whole KeyValues: apply(kv, revision) gets each key's revisions and version (a
    deletion is a KeyValue of version 0 whose mod_revision is the deletion's), revision being the snapshot
    read's during the read, the event's after. For caches that need more than the value (the standby
    controller's, which checks every key's mod_revision against etcd when it takes over)."""
    while True:
        try:
            res = await etcd.get_prefix(prefix)
            reset()
            for kv in res.kvs:
                apply(kv, res.revision)
            loaded(res.revision)
            async for ev in etcd.watch_prefix(prefix, res.revision + 1):
                apply(KeyValue(ev.key, ev.value, ev.create_revision, ev.mod_revision, ev.version), ev.mod_revision)
        except WatchCompacted:
            continue
        except EtcdError as exc:
            log.warning("%s: reading %r from etcd failed (%s); retrying", what, prefix, exc)
            await asyncio.sleep(retry_s)


def prefix_range_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with prefix (etcd's clientv3.GetPrefixRangeEnd)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def lease_ttl_s(ttl_ms: int) -> int:
    """etcd leases are whole seconds: round a millisecond TTL up, to at least LEASE_TTL_MIN_S."""
    return max(LEASE_TTL_MIN_S, math.ceil(ttl_ms / 1000))


def parse_endpoints(endpoints: str | Iterable[str]) -> list[tuple[str, int]]:
    """'http://h:p,h2:p2' or a list of them -> [(host, port)]."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        hostport = item.split("://", 1)[-1].rstrip("/")
        host, sep, port = hostport.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"etcd endpoint {item!r} is not [http://]HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


class LeaseLoss:
    """What every lease holder shares (`Lease` here, `lease_thread.ThreadedLease`): `lost` resolves once
    with a LeaseLost, `on_lost` callbacks run once on a loss (not on the owner's revoke), `alive`.
    Concurrency: the owner's event loop only."""

    def __init__(self, client: "EtcdClient", lease_id: int, ttl_s: int) -> None:
        self.client = client
        self.id = lease_id
        self.ttl_s = ttl_s
        self.lost: asyncio.Future[LeaseLost] = asyncio.get_running_loop().create_future()
        self._revoked = False
        self._callbacks: list[Callable[[LeaseLost], None]] = []

    @property
    def alive(self) -> bool:
        return not self.lost.done() and not self._revoked

    def on_lost(self, callback: Callable[[LeaseLost], None]) -> None:
        """Call callback(LeaseLost) once if the lease is lost (not when we revoke it)."""
        if self.lost.done():
            callback(self.lost.result())
        else:
            self._callbacks.append(callback)

    def _report_loss(self, reason: LeaseLost) -> None:
        """A loss (not a revoke): log it, resolve `lost` and run every callback, once."""
        if self.lost.done():
            return
        log.warning("%s", reason)
        self.lost.set_result(reason)
        for callback in self._callbacks:
            try:
                callback(reason)
            except Exception:  # One failing callback must not hide the loss from the others.
                log.exception("lease-lost callback failed")


class Lease(LeaseLoss):
    """An etcd lease refreshed by a background keepalive task until revoked or lost.

    Concurrency: runs on the event loop that granted it; one keepalive task refreshes
    the lease every TTL/3. Its done-callback resolves `lost` (LeaseLost) and calls every
    `on_lost` callback unless the lease was revoked by us, so no waiter hangs.
    """

    def __init__(self, client: "EtcdClient", lease_id: int, ttl_s: int) -> None:
        super().__init__(client, lease_id, ttl_s)
        self._task = asyncio.get_running_loop().create_task(self._keepalive(), name=f"etcd-lease-{lease_id:x}")
        self._task.add_done_callback(self._on_task_done)

    async def revoke(self) -> None:
        """Stop refreshing and revoke: etcd deletes every key bound to the lease at once."""
        self._revoked = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        try:
            await self.client.revoke(self.id)
        except EtcdError as exc:
            # The keys expire with the TTL anyway; say so instead of failing the shutdown.
            log.warning("could not revoke lease %x (keys expire within %d s): %s", self.id, self.ttl_s, exc)

    async def _keepalive(self) -> LeaseLost:
        interval_s = self.ttl_s / 3
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(interval_s)
            try:
                ttl = await self.client.refresh_lease(self.id, timeout_s=interval_s)
            except EtcdUnavailable as exc:
                LEASE_KEEPALIVE_FAILURES.inc()
                # Unreachable: the lease is still good server-side until TTL after our last refresh.
                if time.monotonic() - last_ok >= self.ttl_s:
                    return LeaseLost(f"lease {self.id:x} not refreshed within {self.ttl_s} s: {exc}")
                continue
            if ttl <= 0:
                return LeaseLost(f"lease {self.id:x} expired or was revoked")
            last_ok = time.monotonic()

    def _on_task_done(self, task: asyncio.Task[LeaseLost]) -> None:
        if self._revoked:
            # Not a loss: resolve the future for anyone waiting, but call no callback.
            if not self.lost.done():
                self.lost.set_result(LeaseLost(f"lease {self.id:x} revoked by its owner"))
            return
        if task.cancelled():
            reason = LeaseLost(f"lease {self.id:x} keepalive cancelled")
        elif task.exception() is not None:
            reason = LeaseLost(f"lease {self.id:x} keepalive died: {task.exception()!r}")
        else:
            reason = task.result()
        self._report_loss(reason)


def _never_sent(exc: grpc.aio.AioRpcError) -> bool:
    """The RPC failed to connect, so no member saw it: safe to send again elsewhere."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.UNAVAILABLE and any(
        s in details for s in ("failed to connect", "connection refused", "connect failed"))


def endpoints_use_tls(endpoints: str | Iterable[str], security: tls.TlsConfig | None = None) -> bool:
    """etcd's convention: https:// endpoints speak TLS, http:// ones plain text; endpoints without a scheme
    follow security.protocol (the process's by default). Mixed schemes are refused."""
    items = [i.strip() for i in (endpoints.split(",") if isinstance(endpoints, str) else endpoints) if i.strip()]
    schemes = {i.split("://", 1)[0].lower() for i in items if "://" in i}
    if len(schemes) > 1:
        raise ValueError(f"etcd endpoints mix schemes {sorted(schemes)}: use all https:// or all http://")
    if schemes:
        return schemes == {"https"}
    return tls.effective(security).enabled


class _TlsAetcdClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client over a TLS channel: aetcd takes no credentials, so connect() is redone here with
    grpc.aio.secure_channel and the process's certificate (etcd's --client-cert-auth checks it)."""

    def __init__(self, *args: object, security: tls.TlsConfig, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._security = security

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        self.channel = tls.channel(f"{self._host}:{self._port}", list(self._options.items()), self._security)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = aetcd_watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout,
                                              metadata=self.metadata)
        self._connected.set()


# etcd's server refuses pings more often than --grpc-keepalive-min-time (5 s by default) with GOAWAY.
KEEPALIVE_TIME_S = 10.0
KEEPALIVE_TIMEOUT_S = 5.0


class EtcdClient:
    """Gregor's etcd client: keys under /gregor/<cluster>/, leases, transactions and watches.

    Concurrency: one aetcd channel on the running event loop, shared by every caller;
    each watch is its own gRPC stream owned by the iterating task. On an unreachable
    endpoint the next call moves to the next endpoint of the list.
    """

    def __init__(self, endpoints: str | Iterable[str], cluster: str = "gregor",
                 request_timeout_s: float = REQUEST_TIMEOUT_S, security: tls.TlsConfig | None = None,
                 keepalive_s: float = KEEPALIVE_TIME_S, keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S) -> None:
        self.endpoints = parse_endpoints(endpoints)
        # HTTP/2 pings on the channel (etcd's clientv3 DialKeepAliveTime/DialKeepAliveTimeout): a member that
        # went silent without closing the connection (a partition dropping packets, a frozen process) ends the
        # channel's calls with UNAVAILABLE, so a watch stream moves on to the next member instead of waiting
        # for events that never come. Unanswered requests have deadlines; an open watch stream has none.
        self._options = {"grpc.keepalive_time_ms": int(keepalive_s * 1000),
                         "grpc.keepalive_timeout_ms": int(keepalive_timeout_s * 1000),
                         # An open watch sends no data: without these, gRPC holds pings back for minutes.
                         "grpc.http2.max_pings_without_data": 0,
                         "grpc.http2.min_time_between_pings_ms": int(keepalive_s * 1000),
                         # gRPC sends no keepalive ping while a BDP (window-sizing) ping is unanswered, so on a
                         # connection that went silent right after one (seen) the keepalive never fired. No BDP
                         # probes, a fixed 16 MiB window instead (large range reads, e.g. 10,000 partitions).
                         "grpc.http2.bdp_probe": 0,
                         # gRPC 1.85 waits for a ping's ack this long (default a minute), not keepalive_timeout.
                         "grpc.http2.ping_timeout_ms": int(keepalive_timeout_s * 1000),
                         "grpc.http2.lookahead_bytes": 16 << 20}
        # https:// endpoints: TLS, presenting this process's certificate (security, else the process default).
        self._security = (tls.effective(security) if endpoints_use_tls(endpoints, security) else None)
        if self._security is not None and not self._security.truststore:
            raise ValueError("https:// etcd endpoints need ssl.truststore.location (the CA of etcd's certificate)")
        self.cluster = cluster
        self.prefix = f"/gregor/{cluster}/".encode()
        self.request_timeout_s = request_timeout_s
        self._index = 0
        self._client: aetcd.Client | None = None

    @property
    def endpoint(self) -> str:
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    def key(self, *parts: str | int) -> bytes:
        """The absolute key of a path under this cluster, e.g. key("brokers", "ids", 1)."""
        return self.prefix + "/".join(str(p) for p in parts).encode()

    def relative(self, key: bytes) -> str:
        """A key without the cluster prefix, e.g. 'brokers/ids/1'."""
        return key[len(self.prefix):].decode() if key.startswith(self.prefix) else key.decode()

    async def __aenter__(self) -> "EtcdClient":
        await self._connected()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    # -- plumbing ----------------------------------------------------------------

    async def _connected(self) -> aetcd.Client:
        if self._client is None:
            host, port = self.endpoints[self._index]
            client = (aetcd.Client(host=host, port=port, timeout=self.request_timeout_s, options=self._options)
                      if self._security is None
                      else _TlsAetcdClient(host=host, port=port, timeout=self.request_timeout_s,
                                           options=self._options, security=self._security))
            await client.connect()
            self._client = client
        return self._client

    async def _call(self, what: str, stub: str, method: str, request: object,
                    timeout_s: float | None = None, idempotent: bool = False) -> object:
        """One unary etcd RPC with a deadline; transport failures become EtcdUnavailable.

        With several endpoints, a call that never reached its member (connection
        refused: the member is down) is tried on the next one, as is any read;
        a write that may have reached a member is not repeated: the caller decides.
        """
        attempts = len(self.endpoints)
        with observe_seconds(REQUEST_DURATION.labels(method=method)):
            return await self._call_with_failover(what, stub, method, request, timeout_s, idempotent, attempts)

    async def _call_with_failover(self, what: str, stub: str, method: str, request: object,
                                  timeout_s: float | None, idempotent: bool, attempts: int) -> object:
        while True:
            client = await self._connected()
            try:
                return await getattr(getattr(client, stub), method)(
                    request, timeout=timeout_s or self.request_timeout_s, metadata=client.metadata)
            except grpc.aio.AioRpcError as exc:
                err = await self._translate(what, exc, client)
                attempts -= 1
                if attempts <= 0 or not isinstance(err, EtcdUnavailable) or not (idempotent or _never_sent(exc)):
                    raise err from exc
            except asyncio.CancelledError:
                # Another call failed on this channel and _rotate closed it: grpc.aio reports the calls
                # still in flight on it as locally cancelled. That is a transport failure of this call,
                # not a cancellation of the caller's task (which must still propagate).
                if not self._closed_by_failover(client):
                    raise
                attempts -= 1
                if attempts <= 0 or not idempotent:
                    raise EtcdUnavailable(f"etcd {what}: channel to {self.endpoint} closed by endpoint "
                                          f"failover while the call was in flight") from None

    def _closed_by_failover(self, client: aetcd.Client) -> bool:
        """A CancelledError seen on `client`'s channel came from _rotate closing it (the channel is no
        longer current), not from a cancellation of the running task."""
        task = asyncio.current_task()
        return client is not self._client and not (task is not None and task.cancelling())

    async def _translate(self, what: str, exc: grpc.aio.AioRpcError, client: aetcd.Client | None = None) -> EtcdError:
        message = f"etcd {what} at {self.endpoint}: {exc.code().name}: {exc.details()}"
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                          grpc.StatusCode.CANCELLED):
            await self._rotate(client)
            return EtcdUnavailable(message)
        return EtcdError(message)

    async def _rotate(self, failed: aetcd.Client | None = None) -> None:
        """Drop the channel; the next call connects to the next endpoint (clientv3's endpoint failover).

        aetcd talks to one host, so failover lives here. Only the first caller that saw
        the current channel fail moves on: the other calls that failed on the same
        channel (closing it cancels them) must not skip past a healthy endpoint.
        """
        if len(self.endpoints) <= 1 or (failed is not None and failed is not self._client):
            return
        self._index = (self._index + 1) % len(self.endpoints)
        ENDPOINT_FAILOVERS.inc()
        log.warning("etcd endpoint failed; moving to %s", self.endpoint)
        await self.close()

    # -- key-value ---------------------------------------------------------------

    async def get(self, key: bytes) -> KeyValue | None:
        resp = await self._call(f"get {key!r}", "kvstub", "Range", rpc.RangeRequest(key=key), idempotent=True)
        return KeyValue.from_pb(resp.kvs[0]) if resp.kvs else None  # type: ignore[attr-defined]

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False, min_mod_revision: int = 0) -> RangeResult:
        """Every key under prefix, sorted by key, with the store revision of the read.

        keys_only: without values (revisions and versions only, a fraction of the bytes);
        min_mod_revision: only keys last written at that revision or later."""
        req = rpc.RangeRequest(key=prefix, range_end=prefix_range_end(prefix), keys_only=keys_only,
                               min_mod_revision=min_mod_revision,
                               sort_order=rpc.RangeRequest.ASCEND, sort_target=rpc.RangeRequest.KEY)
        resp = await self._call(f"get prefix {prefix!r}", "kvstub", "Range", req, idempotent=True)
        return RangeResult(tuple(KeyValue.from_pb(kv) for kv in resp.kvs),  # type: ignore[attr-defined]
                           resp.header.revision)  # type: ignore[attr-defined]

    async def compact(self, revision: int) -> None:
        """Compact etcd's history up to revision (operators and tests: a watch from before it then fails
        with WatchCompacted)."""
        await self._call(f"compact {revision}", "kvstub", "Compact",
                         rpc.CompactionRequest(revision=revision, physical=True), idempotent=True)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Unconditional put (tests and tools; controller writes go through guarded_txn); returns the revision."""
        resp = await self._call(f"put {key!r}", "kvstub", "Put", rpc.PutRequest(key=key, value=value, lease=lease))
        return int(resp.header.revision)  # type: ignore[attr-defined]

    async def delete(self, key: bytes, prefix: bool = False) -> int:
        """Delete a key (or a prefix); returns how many keys went away."""
        end = prefix_range_end(key) if prefix else b""
        resp = await self._call(f"delete {key!r}", "kvstub", "DeleteRange",
                                rpc.DeleteRangeRequest(key=key, range_end=end))
        return int(resp.deleted)  # type: ignore[attr-defined]

    async def txn(self, compares: Sequence[Compare], successes: Sequence[Put | Delete]) -> TxnResult:
        """Apply successes atomically if every compare holds; on failure, say which compares did not."""
        keys = list(dict.fromkeys(c.key for c in compares))
        req = rpc.TxnRequest(
            compare=[c.to_pb() for c in compares],
            success=[op.to_pb() for op in successes],
            # Read the compared keys on failure so the caller learns which compare broke.
            failure=[rpc.RequestOp(request_range=rpc.RangeRequest(key=k)) for k in keys],
        )
        resp = await self._call("txn", "kvstub", "Txn", req)
        revision = int(resp.header.revision)  # type: ignore[attr-defined]
        if resp.succeeded:  # type: ignore[attr-defined]
            return TxnResult(True, revision)
        current: dict[bytes, KeyValue] = {}
        for op in resp.responses:  # type: ignore[attr-defined]
            for kv in op.response_range.kvs:
                current[kv.key] = KeyValue.from_pb(kv)
        return TxnResult(False, revision, tuple(c for c in compares if not c.holds(current.get(c.key))))

    async def guarded_txn(self, compares: Sequence[Compare], successes: Sequence[Put | Delete]) -> TxnResult:
        """txn() that raises CompareFailed instead of returning a failed result.

        The controller passes its epoch guard (controller_epoch's mod_revision) first, so
        a fenced controller's write never applies (ZooKeeper's epochZkVersion check).
        """
        result = await self.txn(compares, successes)
        if not result:
            raise CompareFailed(result.failed, result.revision)
        return result

    async def create_if_absent(self, key: bytes, value: bytes, lease: int = 0) -> TxnResult:
        """Create key only if it does not exist (version == 0)."""
        return await self.txn([version_is(key, 0)], [Put(key, value, lease)])

    async def cas(self, key: bytes, value: bytes, expected_mod_revision: int) -> TxnResult:
        """Set key only if its mod_revision is still expected_mod_revision (0: only if absent)."""
        return await self.txn([mod_revision_is(key, expected_mod_revision)], [Put(key, value)])

    # -- leases ------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> Lease:
        """A lease of ttl_s seconds (etcd may raise it to its minimum) with a running keepalive."""
        resp = await self._call("lease grant", "leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s),
                                idempotent=True)  # a lease granted twice only leaks an empty lease for one TTL
        if resp.error:  # type: ignore[attr-defined]
            raise EtcdError(f"etcd lease grant at {self.endpoint}: {resp.error}")  # type: ignore[attr-defined]
        return Lease(self, int(resp.ID), int(resp.TTL))  # type: ignore[attr-defined]

    async def grant_lease_id(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease and return (id, TTL etcd granted) without a keepalive (the caller refreshes it,
        e.g. gregor.common.lease_thread.ThreadedLease)."""
        resp = await self._call("lease grant", "leasestub", "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl_s),
                                idempotent=True)
        if resp.error:  # type: ignore[attr-defined]
            raise EtcdError(f"etcd lease grant at {self.endpoint}: {resp.error}")  # type: ignore[attr-defined]
        return int(resp.ID), int(resp.TTL)  # type: ignore[attr-defined]

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """The credentials this client's channels use (None: plain text), for a blocking channel of a thread."""
        return self._security.channel_credentials() if self._security is not None else None

    async def refresh_lease(self, lease_id: int, timeout_s: float | None = None) -> int:
        """One keepalive round trip; returns the remaining TTL in seconds (0 when the lease is gone)."""
        client = await self._connected()
        call = client.leasestub.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=timeout_s or self.request_timeout_s,
            metadata=client.metadata)
        try:
            async for reply in call:
                return int(reply.TTL)
        except grpc.aio.AioRpcError as exc:
            raise await self._translate(f"lease keepalive {lease_id:x}", exc, client) from exc
        except asyncio.CancelledError:
            # Another call failed and _rotate closed this channel under the keepalive (as in _call_with_failover):
            # a transport failure the caller retries on the next endpoint, not a cancellation of its task.
            if not self._closed_by_failover(client):
                raise
            raise EtcdUnavailable(f"etcd lease keepalive {lease_id:x}: channel closed by endpoint failover "
                                  f"while the keepalive was in flight") from None
        finally:
            call.cancel()
        raise EtcdUnavailable(f"etcd lease keepalive {lease_id:x} at {self.endpoint}: stream ended without reply")

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease: its keys are deleted now. A lease already gone is not an error."""
        try:
            await self._call(f"lease revoke {lease_id:x}", "leasestub", "LeaseRevoke",
                             rpc.LeaseRevokeRequest(ID=lease_id))
        except EtcdError as exc:
            if "lease not found" not in str(exc):
                raise

    # -- watches -----------------------------------------------------------------

    def watch_prefix(self, prefix: bytes, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Every put and delete under prefix from start_revision on (0: from now); see watch()."""
        return self.watch(prefix, start_revision, prefix=True)

    async def watch(self, key: bytes, start_revision: int = 0, prefix: bool = False) -> AsyncIterator[WatchEvent]:
        """Every put and delete of key (or under it) from start_revision on (0: from now), in revision order.

        A broken stream is re-created from the revision after the last event delivered,
        so no event is lost or repeated across reconnections. Raises WatchCompacted when
        that revision is compacted away; close the iterator to cancel the watch.
        """
        next_revision = start_revision
        backoff_s = WATCH_RETRY_BACKOFF_S
        while True:
            try:
                async for event in self._watch_stream(key, prefix_range_end(key) if prefix else b"", next_revision):
                    next_revision = event.mod_revision + 1
                    backoff_s = WATCH_RETRY_BACKOFF_S
                    yield event
            except EtcdUnavailable as exc:
                log.info("watch on %r broke (%s); re-watching from revision %d", key, exc, next_revision)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, WATCH_RETRY_BACKOFF_MAX_S)

    async def _watch_stream(self, key: bytes, range_end: bytes, start_revision: int) -> AsyncIterator[WatchEvent]:
        """One Watch stream; ends only by raising (EtcdUnavailable when the stream breaks)."""
        try:
            client = await self._connected()
        except aetcd.exceptions.ClientError as exc:
            raise EtcdUnavailable(f"etcd watch at {self.endpoint}: {exc}") from exc
        call = rpc.WatchStub(client.channel).Watch(metadata=client.metadata)
        try:
            create = call.write(rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                key=key, range_end=range_end, start_revision=start_revision)))
            try:
                # Bounded: a stream still starting when failover closes its channel (its member unreachable)
                # is not ended by the close and would wait for good, the watch silent from then on.
                await wait_for(create, self.request_timeout_s)
            except asyncio.TimeoutError:
                await self._rotate(client)
                raise EtcdUnavailable(f"etcd watch {key!r} at {self.endpoint}: not created within "
                                      f"{self.request_timeout_s} s") from None
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise EtcdUnavailable(f"etcd watch {key!r} at {self.endpoint}: stream closed")
                if resp.compact_revision:
                    raise WatchCompacted(resp.compact_revision)
                if resp.canceled:
                    raise EtcdUnavailable(f"etcd watch {key!r} canceled by server: {resp.cancel_reason}")
                for ev in resp.events:
                    kind: Literal["put", "delete"] = "delete" if ev.type == rpc.Event.DELETE else "put"
                    yield WatchEvent(kind, ev.kv.key, ev.kv.value, ev.kv.create_revision,
                                     ev.kv.mod_revision, ev.kv.version)
        except grpc.aio.AioRpcError as exc:
            raise await self._translate(f"watch {key!r}", exc, client) from exc
        except asyncio.CancelledError:
            # Another call failed and _rotate closed this channel: grpc.aio reports the stream as
            # locally cancelled. That is a broken stream (re-created on the next endpoint), not a
            # cancellation of the watching task, which must still propagate; taken for one, it
            # ended the watch silently (the controller stopped seeing broker deaths).
            if not self._closed_by_failover(client):
                raise
            raise EtcdUnavailable(f"etcd watch {key!r}: channel closed by endpoint failover") from None
        finally:
            call.cancel()
