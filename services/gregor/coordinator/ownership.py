"""Event-loop owned, no locks: one etcd watch task and one reconcile task per ShardOwnership; loads run as tasks.

Shard ownership of a coordinator's internal topic (`__consumer_offsets` for groups,
`__transaction_state` for transactional ids): the one mechanism both coordinators use.
Kafka's GroupCoordinator and TransactionCoordinator serve the partitions of their
internal topic that their broker leads, and learn of it from LeaderAndIsr; Gregor's
coordinators are separate processes, so leadership of a shard is an etcd claim instead:

- every instance registers `coordinators/ids/<id>` on its lease (LeaseFence below);
- the desired owner of partition p is `desired_owner(p, live ids)`
  (common/coordinator_ownership.py), computed alike by every instance from the same view;
- acquire: create the claim key (bound to the lease, only if absent), take the claim's etcd
  create revision as the coordinator epoch, then load the shard (replay the partition to
  its high watermark; requests get COORDINATOR_LOAD_IN_PROGRESS meanwhile);
- release (p moved away, or shutdown): stop admitting writes to p, forget its state
  (`unload`), wait until every write already sent to p has finished (acknowledged or
  abandoned by the producer), and only then delete the claim — so the successor, which
  loads p only once the claim is gone, finds every write its predecessor made;
- fence: a write is admitted only while p is owned and the lease is certainly alive for
  longer than the write can take (LeaseFence.check).

The etcd keys this module uses, all built by common/etcd_layout.py: `CoordinatorsZNode.prefix`
(watched: registrations and both kinds of claims) and `CoordinatorsZNode.claim_key(kind, p)`
(created, read for its create revision, deleted); the registration `CoordinatorsZNode.id_key`
is written by the group coordinator's start-up on the same lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, Coroutine

from prometheus_client import Counter

from gregor.common import errors
from gregor.common.aio import wait_for
from gregor.common.clock import monotonic_ms
from gregor.common.coordinator_ownership import desired_partitions
from gregor.common.etcd import Delete, EtcdClient, EtcdError, Lease, WatchCompacted, lease_ttl_s, value_is
from gregor.common.etcd_layout import CoordinatorKey, CoordinatorsZNode

log = logging.getLogger(__name__)
Code = errors.Code

LEASE_LOSSES = Counter("gregor_coordinator_lease_losses_total",
                       "Ownership leases found lost (reason: expired = etcd answered TTL 0, not_refreshed = no "
                       "keepalive acknowledged within the TTL) and replaced by a new one on which the shards "
                       "are claimed again (ZooKeeper's SessionExpireListener ZooKeeperExpiresPerSec)", ["reason"])


async def reconcile_forever(needed: asyncio.Event, reconcile: Callable[[], Awaitable[None]], what: str) -> None:
    """Run reconcile() whenever `needed` is set (etcd views changed); an etcd failure retries it shortly."""
    while True:
        await needed.wait()
        needed.clear()
        try:
            await reconcile()
        except EtcdError as exc:
            log.warning("%s reconcile failed, retrying: %s", what, exc)
            await asyncio.sleep(0.5)
            needed.set()


class LeaseFence:
    """The instance's etcd lease, the clock that fences writes by it (docs/groups.md "Fencing"), and its
    replacement when it is lost.

    The lease cannot expire before (send time of the last acknowledged keepalive) + TTL on our
    monotonic clock; a write is admitted only if it is certain to be acknowledged or abandoned by
    the producer (delivery.timeout.ms = write_timeout_ms) fence_margin_ms before that.

    A lease is lost when etcd answers a keepalive with TTL 0 (it expired or was revoked), or when no
    keepalive was acknowledged before that bound ran out (etcd unreachable or this process paused past
    the TTL: it may have expired). Then, as a Kafka broker re-registers after its ZooKeeper session
    expired: every shard is given up at once (the `on_lost` hooks: unload, drain the writes in flight),
    a new lease is granted, the instance registers on it (`register`), the old lease is revoked (its
    claims go at once if it still lived), and the shards are claimed again on the new lease through the
    usual compare-and-create (`on_granted` hooks), so a successor that claimed one meanwhile keeps it.
    `generation` counts the losses: a claim taken on a lease declared lost is never served."""

    def __init__(self, etcd: EtcdClient, lease_ttl_ms: int, write_timeout_ms: int, fence_margin_ms: int) -> None:
        self.etcd = etcd
        self.lease_ttl_ms = lease_ttl_ms
        self.write_timeout_ms = write_timeout_ms
        self.fence_margin_ms = fence_margin_ms
        self.lease: Lease | None = None
        self._valid_until_ms = 0
        self.generation = 0  # losses declared so far
        self.on_lost: list[Callable[[], Awaitable[None]]] = []  # give the shards up (before a new lease)
        self.on_granted: list[Callable[[], None]] = []  # claim them again (a new lease is registered)
        self._register: Callable[[int], Awaitable[None]] | None = None
        self._registered = True
        self._lost: tuple[str, str] | None = None  # (metric reason, log text) of a loss not yet repaired
        self._declared = False  # the loss's on_lost hooks ran
        self._wake = asyncio.Event()
        self._revoking: set[asyncio.Task[None]] = set()

    async def grant(self, register: Callable[[int], Awaitable[None]] | None = None) -> None:
        """Grant the first lease and register on it: register(lease id) writes the instance's registration
        bound to the lease (and again on every replacement lease)."""
        self._register = register
        await self._grant()
        if register is not None:
            await register(self.lease_id)

    async def _grant(self) -> Lease:
        granted_at = monotonic_ms()
        lease = await self.etcd.grant_lease(lease_ttl_s(self.lease_ttl_ms))
        self.lease = lease
        self._valid_until_ms = granted_at + lease.ttl_s * 1000
        lease.on_lost(lambda exc: self._lease_lost(lease, exc))
        return lease

    def _lease_lost(self, lease: Lease, exc: BaseException) -> None:
        """The Lease's own keepalive gave it up (TTL 0, or not refreshed within the TTL): repair it now."""
        if lease is self.lease and self._lost is None:
            self._lost = ("expired" if "expired or was revoked" in str(exc) else "not_refreshed", str(exc))
            self._wake.set()

    @property
    def lease_id(self) -> int:
        assert self.lease is not None
        return self.lease.id

    @property
    def lost(self) -> bool:
        """The lease was declared lost and no new one is registered yet: nothing may be claimed or served."""
        return self._declared

    def remaining_ms(self) -> int:
        """How long the lease is certainly still alive (negative once it may have expired)."""
        return self._valid_until_ms - monotonic_ms()

    def certain_for_a_write(self) -> bool:
        return not self._declared and self.remaining_ms() >= self.write_timeout_ms + self.fence_margin_ms

    async def clock_loop(self) -> None:
        """Keep the bound = send time of the last acknowledged keepalive + granted TTL, every TTL/4; replace
        the lease when it is lost, and retry a registration that failed.

        etcd extends a lease to (time it processes the keepalive) + TTL, which is after we sent it,
        so the lease cannot expire before our bound (one host, one monotonic clock rate). The
        Lease object's own keepalive also refreshes (and reports a loss it sees, waking this loop)."""
        failing = False
        while True:
            assert self.lease is not None
            interval_s = self.lease.ttl_s / 4
            with contextlib.suppress(asyncio.TimeoutError):
                await wait_for(self._wake.wait(), interval_s)
            self._wake.clear()
            try:
                if self._lost is None:
                    await self._measure(interval_s)
                    failing = False
                if self._lost is not None:
                    await self._replace()
                elif not self._registered and self._register is not None:
                    await self._register(self.lease_id)
                    self._registered = True
                    self._granted()
            except EtcdError as exc:
                if not failing:  # logged once per outage (the Lease keepalive counts its failures in a metric)
                    log.warning("lease clock: %s; writes stop %d ms before the lease can expire (%d ms left)",
                                exc, self.write_timeout_ms + self.fence_margin_ms, self.remaining_ms())
                failing = True
                if self._lost is None and self.remaining_ms() <= 0:
                    self._lost = ("not_refreshed", f"lease {self.lease_id:x} not refreshed within its TTL "
                                                   f"({self.lease_ttl_ms} ms): it may have expired ({exc})")
                    self._wake.set()

    async def _measure(self, timeout_s: float) -> None:
        assert self.lease is not None
        sent = monotonic_ms()
        ttl = await self.etcd.refresh_lease(self.lease.id, timeout_s=timeout_s)
        if ttl > 0:
            self._valid_until_ms = max(self._valid_until_ms, sent + ttl * 1000)
        else:
            self._lost = ("expired", f"etcd answered lease {self.lease.id:x}'s keepalive with TTL 0: "
                                     f"it expired or was revoked")

    async def _replace(self) -> None:
        """Give every shard up (once per loss), then grant a new lease, register on it, revoke the old one
        and let the shards be claimed again. An etcd failure leaves the rest for the next round."""
        assert self._lost is not None and self.lease is not None
        reason, text = self._lost
        old = self.lease
        if not self._declared:
            self._declared = True
            self.generation += 1
            self._valid_until_ms = min(self._valid_until_ms, monotonic_ms())
            LEASE_LOSSES.labels(reason=reason).inc()
            log.warning("coordinator lease lost: %s; giving up every shard and granting a new lease", text)
            for hook in self.on_lost:
                await hook()
        new = await self._grant()
        self._registered = False
        self._lost = None
        self._declared = False
        if self._register is not None:
            try:
                await self._register(new.id)
                self._registered = True
            except EtcdError as exc:
                log.warning("registering on the new lease %x failed, retrying: %s", new.id, exc)
        # Its claims (if it still lived) go now instead of at its expiry ("not found" is fine, a failure is
        # logged); in the background, so a slow etcd does not hold up the new lease's clock.
        revoking = asyncio.get_running_loop().create_task(old.revoke(), name=f"revoke-lease-{old.id:x}")
        self._revoking.add(revoking)
        revoking.add_done_callback(self._revoking.discard)
        log.warning("coordinator lease %x replaces lost lease %x (%s); claiming the shards again on it",
                    new.id, old.id, reason)
        if self._registered:
            self._granted()

    def _granted(self) -> None:
        for hook in self.on_granted:
            hook()

    async def revoke(self) -> None:
        if self.lease is not None:
            await self.lease.revoke()


class ShardOwnership:
    """The partitions of one internal topic this instance claims, loads, serves and releases.

    `load(p, still_loading)` replays p and returns True once its state is installed (the shard
    then becomes owned unless it was released meanwhile); `unload(p)` forgets p's state and
    fails its parked requests. Writes go through `writing(p)`, which fences and counts them,
    so a release can drain them. `on_task_done` watches the background tasks (a dead one
    stops the process)."""

    def __init__(self, etcd: EtcdClient, coordinator_id: int, kind: str, topic: str, fence: LeaseFence,
                 load: Callable[[int, Callable[[], bool]], Awaitable[bool]], unload: Callable[[int], None],
                 on_task_done: Callable[["asyncio.Task[Any]"], None],
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.etcd = etcd
        self.id = coordinator_id
        self.kind = kind  # CoordinatorsZNode.OFFSETS_CLAIMS or TXN_CLAIMS
        self.topic = topic
        self.fence = fence
        self._load = load
        self._unload = unload
        self._on_task_done = on_task_done
        self._on_change = on_change
        self.num_partitions = 0  # 0: the topic does not exist yet, nothing is claimed
        self.owned: set[int] = set()  # claimed and loaded
        self.loading: set[int] = set()  # claimed, load in progress
        self.releasing: set[int] = set()  # unloaded, draining before the claim goes
        self.claims: dict[int, int] = {}  # partition -> holder id (etcd view)
        self.live: dict[int, dict[str, Any]] = {}  # coordinator id -> registration (etcd view)
        self.epochs: dict[int, int] = {}  # our claim's create revision per claimed partition
        self.closing = False
        self._inflight: dict[int, int] = {}  # partition -> writes admitted and not yet finished
        self._reconcile_needed = asyncio.Event()
        self._loads: dict[int, object] = {}  # partition -> the load of its latest claim
        fence.on_lost.append(self.lease_lost)
        fence.on_granted.append(self._reconcile_needed.set)

    # ------------------------------------------------------------------ etcd
    def claim_key(self, p: int) -> bytes:
        return CoordinatorsZNode.claim_key(self.etcd, self.kind, p)

    def tasks(self) -> list[tuple[Coroutine[Any, Any, None], str]]:
        """The background coroutines (watch, reconcile) for the owner to run and watch."""
        return [(self._watch(), f"{self.kind}-watch"),
                (reconcile_forever(self._reconcile_needed, self.reconcile, self.topic), f"{self.kind}-reconcile")]

    def set_num_partitions(self, n: int) -> None:
        self.num_partitions = n
        self._reconcile_needed.set()

    async def _watch(self) -> None:
        prefix = CoordinatorsZNode.prefix(self.etcd)
        while True:
            res = await self.etcd.get_prefix(prefix)
            self.live, self.claims = {}, {}
            for kv in res.kvs:
                self._apply(CoordinatorsZNode.parse(self.etcd, kv.key), kv.value)
            self._reconcile_needed.set()
            try:
                async for ev in self.etcd.watch_prefix(prefix, res.revision + 1):
                    self._apply(CoordinatorsZNode.parse(self.etcd, ev.key), ev.value if ev.type == "put" else None)
                    self._reconcile_needed.set()
            except WatchCompacted:
                continue

    def _apply(self, key: CoordinatorKey | None, value: bytes | None) -> None:
        if key is None:
            return
        if key.kind == CoordinatorsZNode.IDS:
            if value is None:
                self.live.pop(key.n, None)
            else:
                self.live[key.n] = CoordinatorsZNode.decode_info(value)
        elif key.kind == self.kind:
            if value is None:
                self.claims.pop(key.n, None)
            else:
                self.claims[key.n] = CoordinatorsZNode.decode_claim(value)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self) -> None:
        """Release the partitions that moved away (drained first), claim and load the ones that moved here."""
        if self.num_partitions == 0 or self.closing:
            return
        want = desired_partitions(self.id, list(self.live), self.num_partitions) if self.id in self.live else set()
        mine = self.owned | self.loading
        for p in sorted(mine - want):
            await self.release(p)
        for p in sorted(want - mine):
            if self.closing:
                return
            await self._acquire(p)
        self._on_change()

    async def _acquire(self, p: int) -> None:
        holder = self.claims.get(p)
        if holder is not None and holder != self.id:
            return  # the old owner releases it (or its lease expires); the watch brings us back
        if self.fence.lost:
            return  # claimed again once a new lease is registered (LeaseFence.on_granted)
        generation, lease_id = self.fence.generation, self.fence.lease_id
        # Kafka's coordinator epoch is the internal partition's leader epoch; ours is the claim's create revision.
        if holder is None:
            created = await self.etcd.create_if_absent(self.claim_key(p), CoordinatorsZNode.encode_claim(self.id),
                                                       lease_id)
            if not created or self.fence.generation != generation:
                return  # taken by another; or our lease was lost meanwhile: the claim goes with it
            self.claims[p] = self.id
            revision = created.revision  # the revision of the txn that created the claim
        else:  # our claim from before (e.g. the watch was re-listed): read its create revision
            claim = await self.etcd.get(self.claim_key(p))
            if claim is None or claim.value != CoordinatorsZNode.encode_claim(self.id) \
                    or self.fence.generation != generation:
                return
            if claim.lease != lease_id:
                # Our id, but a previous incarnation's lease (this instance restarted before that lease
                # expired): not ours to serve. Serving it would leave p unclaimed once that lease expires
                # (FindCoordinator answers COORDINATOR_NOT_AVAILABLE for p from then on, and nothing would
                # keep a successor from claiming p beside us). Its expiry deletes the claim; the watch
                # brings us back to claim p on our own lease.
                log.info("%s-%d is still claimed by a previous incarnation or lost lease of coordinator %d "
                         "(lease %x): waiting for that lease to end", self.topic, p, self.id, claim.lease)
                return
            revision = claim.create_revision
        self.epochs[p] = revision & 0x7FFFFFFF
        self.loading.add(p)
        load = self._loads[p] = object()  # this claim's load: an earlier one still running must not install
        task = asyncio.get_running_loop().create_task(self._run_load(p, load), name=f"load-{self.topic}-{p}")
        task.add_done_callback(self._on_task_done)

    async def _run_load(self, p: int, load: object) -> None:
        def current() -> bool:
            # Still loading for this claim: not released, and not superseded by a later claim of p (a lease
            # lost and p claimed again while this replay was still running: it may predate a successor's writes).
            return p in self.loading and self._loads.get(p) is load

        if await self._load(p, current) and current():
            self.loading.discard(p)
            self.owned.add(p)
            self._on_change()

    async def release(self, p: int) -> None:
        """Give p up: stop admitting writes, forget its state, drain the writes in flight, then delete the claim."""
        self.releasing.add(p)
        try:
            self.owned.discard(p)
            self.loading.discard(p)
            self._unload(p)
            await self.drain(p)  # the successor must find every write we sent in the log
            await self.etcd.txn([value_is(self.claim_key(p), CoordinatorsZNode.encode_claim(self.id))],
                                [Delete(self.claim_key(p))])
            self.epochs.pop(p, None)
        finally:
            self.releasing.discard(p)
        self._on_change()

    async def lease_lost(self) -> None:
        """Our lease is gone or may be (LeaseFence): so are, or soon will be, our claims, and a successor may
        load and write any of our shards. Give every one up at once (stop admitting, forget its state) and
        wait out the writes in flight; the shards are claimed again (or not, if a successor holds them) on
        the new lease."""
        lost = sorted(self.owned | self.loading)
        for p in lost:
            self.owned.discard(p)
            self.loading.discard(p)
            self._unload(p)
        self.epochs.clear()
        for p in list(self._inflight):
            await self.drain(p)
        if lost:
            log.warning("%s: gave up partitions %s with the lost lease", self.topic, lost)
        self._on_change()

    async def release_all(self) -> None:
        """Shutdown: stop admitting, forget every shard and drain its writes. The claims are left to the
        lease's revocation (the caller revokes it next), which removes them all at once."""
        self.closing = True
        for p in sorted(self.owned | self.loading):
            self.owned.discard(p)
            self.loading.discard(p)
            self._unload(p)
        for p in list(self._inflight):
            await self.drain(p)

    # ------------------------------------------------------------------ writes
    def check_fence(self, p: int) -> None:
        """Admit a write to p only if p is served and the write ends (acknowledged or abandoned by the
        producer) a safety margin before our lease — and with it our claim on p — can expire."""
        if self.closing or p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR, f"coordinator {self.id} no longer owns {self.topic}-{p}")
        remaining = self.fence.remaining_ms()
        if not self.fence.certain_for_a_write():
            raise errors.error_for(
                Code.NOT_COORDINATOR,
                f"coordinator {self.id} is fenced from {self.topic}-{p}: its ownership lease is only certain "
                f"for {remaining} ms, less than the write timeout {self.fence.write_timeout_ms} ms + margin "
                f"{self.fence.fence_margin_ms} ms (a successor may take over): FindCoordinator again")

    @contextlib.asynccontextmanager
    async def writing(self, p: int) -> AsyncIterator[None]:
        """Fence a write to p and count it in flight until it ends; NOT_COORDINATOR afterwards if p
        was released meanwhile (the write may be in the log; the successor loads it, the caller
        must not act on it)."""
        self.check_fence(p)
        self._inflight[p] = self._inflight.get(p, 0) + 1
        try:
            yield
        finally:
            self._inflight[p] -= 1
            if not self._inflight[p]:
                del self._inflight[p]
        if p not in self.owned:
            raise errors.error_for(Code.NOT_COORDINATOR, f"{self.topic}-{p} moved away during the write")

    def inflight(self, p: int) -> int:
        return self._inflight.get(p, 0)

    async def drain(self, p: int) -> None:
        """Wait for the writes in flight to p (each ends within the write timeout)."""
        while self._inflight.get(p):
            await asyncio.sleep(0.01)
