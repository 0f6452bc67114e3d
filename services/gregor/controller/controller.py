"""The controller driver (seed 001's KafkaController): election, failover and resignation over etcd, through one event queue."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from gregor.common import errors
from gregor.common.etcd import (Compare, CompareFailed, Delete, EtcdClient, EtcdError, Lease, LeaseLost, Put,
                                WatchCompacted, lease_ttl_s, mod_revision_is)
from gregor.controller import elector
from gregor.controller.elector import NO_CONTROLLER, ControllerMovedError
from gregor.controller.event_manager import ControllerEventManager
from gregor.controller.membership import on_controller_failover, process_broker_change
from gregor.controller.requests import ControllerActions
from gregor.controller.state import ControllerContext, ControllerState

log = logging.getLogger(__name__)

LEASE_TTL_MS_DEFAULT = 10_000  # a SIGKILLed controller is replaced within this
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
PRODUCER_ID_BLOCK_KEY = "latest_producer_id_block"
BROKER_IDS = "brokers/ids/"
ISR_CHANGE_NOTIFICATIONS = "isr_change_notification/"


class ControllerMetrics:
    """The controller's own gauges and counters (the event manager registers its own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.active_controller_count = Gauge(
            "gregor_controller_active_controller_count",
            "1 on the active controller, 0 on standbys (Kafka's ActiveControllerCount).", registry=registry)
        self.epoch = Gauge("gregor_controller_epoch",
                           "Controller epoch: ours while active, else the latest one seen.", registry=registry)
        self.fenced_writes = Counter(
            "gregor_controller_fenced_writes_total",
            "etcd writes refused because controller_epoch moved on (a newer controller exists).", registry=registry)
        self.elections_won = Counter("gregor_controller_elections_won_total",
                                     "Elections this instance won.", registry=registry)


@dataclass
class _Event:
    """A controller event: a ControllerState and a coroutine run on the event task."""

    state: ControllerState
    name: str
    run: Callable[[], Awaitable[None]]
    on_preempt: Callable[[], None] | None = None

    async def process(self) -> None:
        await self.run()

    def preempt(self) -> None:
        if self.on_preempt is not None:
            self.on_preempt()

    def __repr__(self) -> str:
        return self.name


class Controller:
    """One controller instance: standby until it wins the election, then the owner of cluster metadata.

    Concurrency: one asyncio loop. The ControllerEventManager's single task runs every
    event and is the only writer of `ctx`, `active_controller_id` and the active role's
    watch task; etcd watch tasks and the lease-lost callback only enqueue events. The
    watch tasks' done-callbacks fail `stopped` if a watch dies, so the process exits
    rather than run blind.
    """

    def __init__(self, controller_id: int, etcd: EtcdClient, lease_ttl_ms: int = LEASE_TTL_MS_DEFAULT,
                 registry: CollectorRegistry = REGISTRY) -> None:
        self.controller_id = controller_id
        self.etcd = etcd
        self.lease_ttl_s = lease_ttl_s(lease_ttl_ms)
        self.ctx = ControllerContext()
        self.active_controller_id = NO_CONTROLLER
        self.metrics = ControllerMetrics(registry)
        self.events = ControllerEventManager(registry=registry)
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lease: Lease | None = None
        self._controller_watch: asyncio.Task[None] | None = None
        self._broker_watch: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def is_active(self) -> bool:
        return self.active_controller_id == self.controller_id

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Watch the controller key, then queue Startup (Kafka's startup())."""
        self.events.start()
        # Read the revision first and watch from just after it: no change can fall between.
        revision = (await self.etcd.get_prefix(self.etcd.key(elector.CONTROLLER_KEY))).revision
        self._controller_watch = self._spawn(self._watch_controller(revision + 1), "controller-watch")
        await self.events.put(_Event(ControllerState.CONTROLLER_CHANGE, "Startup", self._process_startup))

    async def stop(self) -> None:
        """Stop the event task, resign, and revoke the lease so a standby takes over at once."""
        self._closing = True
        await self.events.close()
        if self.is_active:
            self.on_controller_resignation()
        self.active_controller_id = NO_CONTROLLER
        for task in (self._controller_watch, self._broker_watch):
            if task is not None:
                task.cancel()
        if self._lease is not None:
            await self._lease.revoke()
        if not self.stopped.done():
            self.stopped.set_result(None)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._on_watch_done)
        return task

    def _on_watch_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closing:
            return
        reason = task.exception() or RuntimeError(f"{task.get_name()} ended")
        log.error("%s died; the controller stops", task.get_name(), exc_info=reason)
        if not self.stopped.done():
            self.stopped.set_exception(reason)

    # -- watches: they only enqueue events ---------------------------------------

    async def _watch_controller(self, start_revision: int) -> None:
        """Creation or data change -> ControllerChange; deletion -> Reelect (ControllerChangeHandler)."""
        key = self.etcd.key(elector.CONTROLLER_KEY)
        while True:
            try:
                async for ev in self.etcd.watch(key, start_revision):
                    start_revision = ev.mod_revision + 1
                    if ev.type == "delete":
                        await self.events.put(_Event(ControllerState.CONTROLLER_CHANGE, "Reelect", self._process_reelect))
                    else:
                        await self.events.put(
                            _Event(ControllerState.CONTROLLER_CHANGE, "ControllerChange", self._process_controller_change))
            except WatchCompacted:
                # History is gone: re-read from now and let Reelect sort out who is active.
                start_revision = (await self.etcd.get_prefix(key)).revision + 1
                await self.events.put(_Event(ControllerState.CONTROLLER_CHANGE, "Reelect", self._process_reelect))

    async def _watch_brokers(self, start_revision: int) -> None:
        """Any change under brokers/ids -> BrokerChange (BrokerChangeHandler)."""
        prefix = self.etcd.key(BROKER_IDS)
        while True:
            try:
                async for ev in self.etcd.watch_prefix(prefix, start_revision):
                    start_revision = ev.mod_revision + 1
                    await self.events.put(_Event(ControllerState.BROKER_CHANGE, "BrokerChange", self._process_broker_change))
            except WatchCompacted:
                start_revision = (await self.etcd.get_prefix(prefix)).revision + 1
                await self.events.put(_Event(ControllerState.BROKER_CHANGE, "BrokerChange", self._process_broker_change))

    def _on_lease_lost(self, lease: Lease, reason: LeaseLost) -> None:
        """Kafka's session expiry: Expire runs next and drops the backlog (clearAndPut)."""
        if lease is not self._lease or self._closing:
            return
        try:
            self.events.clear_and_put(_Event(ControllerState.CONTROLLER_CHANGE, "Expire", self._process_expire))
        except Exception:  # the event manager is stopping: nothing left to resign from
            log.exception("could not queue Expire after %s", reason)

    # -- events (run on the event task only) -------------------------------------

    async def _process_startup(self) -> None:
        await self._guarded_event(self.elect)

    async def _process_controller_change(self) -> None:
        await self.maybe_resign()

    async def _process_reelect(self) -> None:
        await self.maybe_resign()
        await self._guarded_event(self.elect)

    async def _process_expire(self) -> None:
        log.warning("controller %d lost its etcd lease", self.controller_id)
        was_active = self.is_active
        self.active_controller_id = NO_CONTROLLER
        if was_active:
            self.on_controller_resignation()
        await self._guarded_event(self.elect)

    async def _guarded_event(self, body: Callable[[], Awaitable[None]]) -> None:
        """Run an event body; if etcd says the controller moved, resign (Kafka's process() catch)."""
        try:
            await body()
        except ControllerMovedError as exc:
            log.info("controller %d: controller moved: %s", self.controller_id, exc)
            await self.maybe_resign()

    # -- election (seed 001) -----------------------------------------------------

    async def elect(self) -> None:
        """Become the controller unless one is registered; on success run onControllerFailover."""
        try:
            self.active_controller_id = await elector.read_controller_id(self.etcd)
            if self.active_controller_id != NO_CONTROLLER:
                self.metrics.epoch.set((await elector.read_controller_epoch(self.etcd))[0])
                log.debug("controller %d is active; not electing", self.active_controller_id)
                return
            lease = await self._ensure_lease()
            election = await elector.register_controller_and_increment_epoch(self.etcd, self.controller_id, lease.id)
        except EtcdError as exc:
            # etcd is away: try again shortly instead of staying a standby forever.
            log.warning("controller %d could not elect: %s; retrying", self.controller_id, exc)
            self._retry_later("Reelect", self._process_reelect)
            return
        self.ctx.epoch, self.ctx.epoch_version = election.epoch, election.epoch_version
        self.active_controller_id = self.controller_id
        self.metrics.elections_won.inc()
        log.info("controller %d elected; epoch %d (controller_epoch mod_revision %d)",
                 self.controller_id, election.epoch, election.epoch_version)
        try:
            await self.on_controller_failover()
        except EtcdError as exc:
            log.error("controller %d failed over badly (%s); moving the controller", self.controller_id, exc)
            await self._trigger_controller_move()

    async def maybe_resign(self) -> bool:
        """Re-read who is active; resign if it was us and is not any more. True when we resigned."""
        was_active = self.is_active
        self.active_controller_id = await elector.read_controller_id(self.etcd)
        if not self.is_active:
            self.metrics.epoch.set((await elector.read_controller_epoch(self.etcd))[0])
        if elector.should_resign(was_active, self.active_controller_id, self.controller_id):
            self.on_controller_resignation()
            return True
        return False

    async def _ensure_lease(self) -> Lease:
        """Our live lease, granting a new one if the last was lost (a new etcd session)."""
        if self._lease is None or not self._lease.alive:
            lease = await self.etcd.grant_lease(self.lease_ttl_s)
            self._lease = lease
            lease.on_lost(lambda reason: self._on_lease_lost(lease, reason))
        return self._lease

    def _retry_later(self, name: str, run: Callable[[], Awaitable[None]], delay_s: float = 1.0) -> None:
        def put() -> None:
            if self._closing:
                return
            try:
                self.events.put_nowait(_Event(ControllerState.CONTROLLER_CHANGE, name, run))
            except Exception:  # stopped or full: a watch event will trigger the next election
                log.exception("could not queue %s", name)
        asyncio.get_running_loop().call_later(delay_s, put)

    async def _trigger_controller_move(self) -> None:
        """Resign and delete our registration so another election runs (Kafka's triggerControllerMove)."""
        self.on_controller_resignation()
        self.active_controller_id = NO_CONTROLLER
        try:
            await self.guarded_write([], [Delete(self.etcd.key(elector.CONTROLLER_KEY))])
        except (EtcdError, ControllerMovedError) as exc:
            log.warning("could not delete the controller key: %s", exc)

    # -- the active role ---------------------------------------------------------

    async def on_controller_failover(self) -> None:
        """Load the context from etcd, register watches, set metrics (seed 001's onControllerFailover).

        Done so far: live brokers with their epochs, the broker watch, and removal of
        pending ISR change notifications (the full state is read now). Topics,
        partition states and the channel manager come with later slices.
        """
        brokers = await self.etcd.get_prefix(self.etcd.key(BROKER_IDS))
        self.ctx.live_broker_epochs = _broker_epochs(self.etcd, brokers.kvs)
        await self.guarded_write([], [Delete(self.etcd.key(ISR_CHANGE_NOTIFICATIONS), prefix=True)])
        self._broker_watch = self._spawn(self._watch_brokers(brokers.revision + 1), "broker-watch")
        actions = ControllerActions()
        on_controller_failover(self.ctx, actions)
        self.metrics.active_controller_count.set(1)
        self.metrics.epoch.set(self.ctx.epoch)
        log.info("controller %d active: epoch %d, live brokers %s", self.controller_id, self.ctx.epoch,
                 sorted(self.ctx.live_broker_epochs))

    def on_controller_resignation(self) -> None:
        """Stop what the active controller owns and forget its context (seed 001's onControllerResignation)."""
        if self._broker_watch is not None:
            self._broker_watch.cancel()
            self._broker_watch = None
        epoch = self.ctx.epoch
        self.ctx = ControllerContext()
        self.metrics.active_controller_count.set(0)
        log.info("controller %d resigned (was epoch %d)", self.controller_id, epoch)

    async def guarded_write(self, compares: list[Compare], ops: list[Put | Delete]) -> None:
        """An etcd write that applies only while controller_epoch is the one we were elected with.

        Raises ControllerMovedError when a newer controller fenced us (epochZkVersion check).
        """
        guard = elector.epoch_guard(self.etcd, self.ctx.epoch_version)
        try:
            await self.etcd.guarded_txn([guard, *compares], ops)
        except CompareFailed as exc:
            if any(elector.is_epoch_guard(self.etcd, c) for c in exc.failed):
                self.metrics.fenced_writes.inc()
                raise ControllerMovedError(
                    f"controller {self.controller_id} with epoch {self.ctx.epoch} is fenced: {exc}") from exc
            raise

    async def _process_broker_change(self) -> None:
        if not self.is_active:
            return
        brokers = await self.etcd.get_prefix(self.etcd.key(BROKER_IDS))
        changes = process_broker_change(self.ctx, _broker_epochs(self.etcd, brokers.kvs), ControllerActions())
        log.info("brokers: new %s, dead %s, bounced %s, live %s", list(changes.new), list(changes.dead),
                 list(changes.bounced), sorted(self.ctx.live_broker_epochs))

    # -- requests ----------------------------------------------------------------

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """A block of producer ids (start, length), allocated on the event task with a guarded write."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[tuple[int, int]] = loop.create_future()

        async def run() -> None:
            try:
                result.set_result(await self._allocate_producer_ids(broker_id, broker_epoch))
            except ControllerMovedError as exc:
                await self.maybe_resign()
                result.set_exception(errors.error_for(errors.Code.NOT_CONTROLLER, str(exc)))
            except Exception as exc:
                result.set_exception(exc)

        def preempt() -> None:
            result.set_exception(errors.error_for(errors.Code.NOT_CONTROLLER, "the controller is moving"))

        try:
            queued = await self.events.put(_Event(ControllerState.IDLE, "AllocateProducerIds", run, preempt))
            await queued.wait()
        except Exception as exc:  # the event task is gone: this instance controls nothing
            raise errors.error_for(errors.Code.NOT_CONTROLLER, f"controller stopping: {exc}") from exc
        return result.result()

    async def _allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        if not self.is_active:
            raise errors.error_for(errors.Code.NOT_CONTROLLER, f"controller {self.controller_id} is not active")
        if self.ctx.broker_epoch(broker_id) != broker_epoch:
            raise errors.error_for(errors.Code.STALE_BROKER_EPOCH,
                                   f"broker {broker_id} epoch {broker_epoch} is not the registered one")
        key = self.etcd.key(PRODUCER_ID_BLOCK_KEY)
        kv = await self.etcd.get(key)
        start = json.loads(kv.value)["block_end"] + 1 if kv is not None else 0
        block = {"version": 1, "broker": broker_id, "block_start": start, "block_end": start + PRODUCER_ID_BLOCK_SIZE - 1}
        expected = kv.mod_revision if kv is not None else 0
        await self.guarded_write([mod_revision_is(key, expected)], [Put(key, json.dumps(block).encode())])
        return start, PRODUCER_ID_BLOCK_SIZE

    async def describe_cluster(self) -> "ClusterDescription":
        """Controller id, epoch and registered brokers as etcd has them now (any instance may answer)."""
        controller_id = await elector.read_controller_id(self.etcd)
        epoch, _ = await elector.read_controller_epoch(self.etcd)
        brokers = await self.etcd.get_prefix(self.etcd.key(BROKER_IDS))
        out = []
        for kv in brokers.kvs:
            broker_id = _broker_id(self.etcd, kv.key)
            if broker_id is None:
                continue
            try:
                info = json.loads(kv.value) if kv.value else {}
            except ValueError:
                info = {}
            out.append(BrokerRegistration(broker_id, kv.create_revision, info if isinstance(info, dict) else {}))
        return ClusterDescription(controller_id, epoch, out)


@dataclass(frozen=True)
class BrokerRegistration:
    """A `brokers/ids/<id>` key: the broker epoch is its creation revision; `info` its JSON value."""

    broker_id: int
    broker_epoch: int
    info: dict[str, object]


@dataclass(frozen=True)
class ClusterDescription:
    controller_id: int
    controller_epoch: int
    brokers: list[BrokerRegistration]


def _broker_id(etcd: EtcdClient, key: bytes) -> int | None:
    suffix = etcd.relative(key)[len(BROKER_IDS):]
    return int(suffix) if suffix.isdigit() else None


def _broker_epochs(etcd: EtcdClient, kvs: "tuple[object, ...]") -> dict[int, int]:
    """{broker id: broker epoch} from brokers/ids keys; the epoch is the key's creation revision."""
    out = {}
    for kv in kvs:
        broker_id = _broker_id(etcd, kv.key)  # type: ignore[attr-defined]
        if broker_id is not None:
            out[broker_id] = int(kv.create_revision)  # type: ignore[attr-defined]
    return out
