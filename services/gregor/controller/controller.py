"""The controller driver (seed 001's KafkaController): election, failover and resignation over etcd, through one event queue."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from gregor.common import errors, uuid
from gregor.common.etcd import (Compare, CompareFailed, Delete, EtcdClient, EtcdError, KeyValue, LeaseLost,
                                Put, WatchCompacted, lease_ttl_s, mod_revision_is)
from gregor.common.lease_thread import ThreadedLease
from gregor.common.phase_clock import PhaseClock
from gregor.common.etcd_layout import (BrokerIdsZNode, ControllerZNode, DeleteTopicsZNode, IsrChangeNotificationZNode,
                                       LogDirEventNotificationZNode, ProducerIdBlock, ProducerIdBlockZNode, TopicZNode)
from gregor.controller import elector, metadata_store
from gregor.controller.liveness import ActiveControllerWatch, WatchedRegistration
from gregor.controller.standby_metadata import StandbyMetadata, TakeOver
from gregor.controller.broker_registry import (BrokerRegistration, ClusterDescription, broker_epochs, open_file_limits,
                                              registrations)
from gregor.controller.channel_manager import ControllerChannelManager
from gregor.controller.election import ELECTION_KINDS, OfflineElection
from gregor.controller.elector import NO_CONTROLLER, ControllerMovedError
from gregor.controller.event_manager import ControllerEventManager
from gregor.controller.leader_balance import (ElectionOutcome, ElectionTrigger, ElectionType,
                                              check_and_trigger_auto_leader_rebalance, do_controlled_shutdown,
                                              partitions_still_led, process_replica_leader_election)
from gregor.controller.membership import (compute_broker_changes, on_broker_log_dir_failure, on_controller_failover,
                                         on_leader_and_isr_response, process_broker_change)
from gregor.controller.requests import (PARTITION_STATE_WRITE_BATCH, PARTITION_STATE_WRITE_CONCURRENCY,
                                        ControllerActions, ControlRequestBatch, PartitionStateConflict,
                                        PartitionStateWrite, apply_writes_outcome, perform_partition_state_writes)
from gregor.controller.state import ControllerContext, ControllerState, LeaderAndIsr, TopicPartition
from gregor.controller.topics import (on_new_partition_creation, on_topic_deletion, process_partition_modifications,
                                     process_topic_change)
from gregor.rpc.v1 import broker_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")

# controller.quorum.fetch.timeout.ms: KRaft's bound on how long a silent active controller keeps the role
# before the standbys elect another (default 2000). Gregor's controllers elect through etcd, so it is the
# TTL of the lease the `controller` key is bound to: a SIGKILLed controller's key is gone within it (plus
# etcd's 0.5 s expiry check) and the standby, watching the key, campaigns at once. It is not the brokers'
# session (broker.session.timeout.ms, 10 s here, 9 s in Kafka): a broker missing for 2 s is not declared
# dead, a controller missing for 2 s is replaced. etcd leases are whole seconds, at least etcd's minimum
# (1.5 s with its default raft timings, rounded up to 2 s).
CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT = 2_000
# controller.fast.failover.enable (Gregor's own): a standby holds a TCP connection to the active controller's
# registered endpoint and, when it breaks and fresh connects there are refused (no listener: the process is
# gone), revokes the active's lease instead of waiting for it to expire (gregor.controller.liveness). A
# connect that times out (a partition, a frozen process, a vanished host) leaves the lease the only path.
CONTROLLER_FAST_FAILOVER_ENABLE_DEFAULT = True
LEASE_TTL_MS_DEFAULT = CONTROLLER_QUORUM_FETCH_TIMEOUT_MS_DEFAULT  # the name the Python API has used
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
# auto.leader.rebalance.enable, leader.imbalance.per.broker.percentage, leader.imbalance.check.interval.seconds
AUTO_LEADER_REBALANCE_ENABLE_DEFAULT = True
LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT = 10
LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS_DEFAULT = 300.0
# Kafka schedules the first AutoPreferredReplicaLeaderElection 5 s after failover.
FIRST_AUTO_LEADER_REBALANCE_DELAY_S = 5.0
# How long the standby's copy and the broker registrations must stay unchanged before the standby decides
# the failover ahead (a burst of ISR changes costs one decision, not one per change).
PREPARE_QUIET_S = 1.0
# new.partitions.per.event: how many new partitions one controller event brings online. A larger creation
# (CreateTopics, CreatePartitions, a topic key written by hand) writes its topic key at once and then
# creates its partitions in events of this many, queued behind whatever else waits, so a 10,000-partition
# creation does not hold the event queue for the seconds its partition-state writes take (issue 24).
NEW_PARTITIONS_PER_EVENT_DEFAULT = 1_000


@dataclass(frozen=True)
class LeaderBalanceConfig:
    """The auto-rebalance settings, Kafka's names and defaults."""

    auto_leader_rebalance_enable: bool = AUTO_LEADER_REBALANCE_ENABLE_DEFAULT
    leader_imbalance_per_broker_percentage: int = LEADER_IMBALANCE_PER_BROKER_PERCENTAGE_DEFAULT
    leader_imbalance_check_interval_seconds: float = LEADER_IMBALANCE_CHECK_INTERVAL_SECONDS_DEFAULT


class ControllerMetrics:
    """The controller's own gauges and counters (the event manager registers its own)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.active_controller_count = Gauge(
            "gregor_controller_active_controller",
            "1 on the active controller, 0 on standbys (Kafka's ActiveControllerCount).", registry=registry)
        self.epoch = Gauge("gregor_controller_epoch",
                           "Controller epoch: ours while active, else the latest one seen.", registry=registry)
        self.fenced_writes = Counter(
            "gregor_controller_fenced_writes_total",
            "etcd writes refused because controller_epoch moved on (a newer controller exists).", registry=registry)
        self.elections_won = Counter("gregor_controller_elections_won_total",
                                     "Elections this instance won.", registry=registry)
        self.offline_partitions = Gauge("gregor_controller_offline_partitions",
                                        "Partitions without a live leader (Kafka's OfflinePartitionsCount).",
                                        registry=registry)
        self.topics = Gauge("gregor_controller_global_topics", "Topics (active controller).", registry=registry)
        self.partitions = Gauge("gregor_controller_global_partitions", "Partitions (active controller).",
                                registry=registry)
        self.preferred_replica_imbalance = Gauge(
            "gregor_controller_preferred_replica_imbalance",
            "Partitions whose leader is not the first assigned replica (Kafka's PreferredReplicaImbalanceCount).",
            registry=registry)
        self.unclean_elections = Counter("gregor_controller_unclean_leader_elections_total",
                                         "Leaders elected from outside the ISR (Kafka's UncleanLeaderElectionsPerSec).",
                                         registry=registry)
        self.leader_elections = Counter(
            "gregor_controller_leader_elections_total",
            "Partition leaders elected, by kind: offline, unclean, reassign, preferred, controlled_shutdown "
            "(Kafka's LeaderElectionRateAndTimeMs count).", ["kind"], registry=registry)
        for kind in ELECTION_KINDS:  # every kind exported from the start (at 0), not after its first election
            self.leader_elections.labels(kind=kind)
        self.preferred_elections = Counter(
            "gregor_controller_preferred_replica_elections_total",
            "Partitions whose preferred replica was elected leader, by trigger: auto "
            "(auto.leader.rebalance.enable) or admin (ElectLeaders).", ["trigger"], registry=registry)
        self.controlled_shutdowns = Counter(
            "gregor_controller_controlled_shutdowns_total",
            "ControlledShutdown requests handled, by result: done (the broker leads nothing movable), "
            "remaining (partitions left, the broker retries) or error.", ["result"], registry=registry)
        self.shutting_down_brokers = Gauge("gregor_controller_shutting_down_brokers",
                                           "Brokers in controlled shutdown (Kafka's shuttingDownBrokerIds).",
                                           registry=registry)
        self.partition_state_write_retries = Counter(
            "gregor_controller_partition_state_write_retries_total",
            "Partition-state writes re-run after losing their compare to a leader's ISR change "
            "(Kafka's updateLeaderAndIsr retry).", registry=registry)
        self.lease_revocations = Counter(
            "gregor_controller_lease_revocations_total",
            "Leases of an active controller this standby revoked because the active's process was provably "
            "gone (its connection broke and its endpoint refused connects; controller.fast.failover.enable).",
            registry=registry)

    def update_partition_gauges(self, ctx: ControllerContext) -> None:
        """Recompute the gauges from the context; called after every applied event and on resignation."""
        self.offline_partitions.set(ctx.offline_partition_count)
        self.topics.set(len(ctx.all_topics))
        self.partitions.set(sum(len(p) for p in ctx.partition_assignments.values()))
        self.preferred_replica_imbalance.set(preferred_replica_imbalance_count(ctx))
        self.shutting_down_brokers.set(len(ctx.shutting_down_broker_ids))


def preferred_replica_imbalance_count(ctx: ControllerContext) -> int:
    """Partitions with a leadership record whose leader is not the preferred (first) replica.

    Topics queued for deletion are not counted; a partition without a leader (-1)
    counts, as in Kafka's ControllerStats.
    """
    count = 0
    for tp, lai in ctx.partition_leadership_info.items():
        assignment = ctx.partition_replica_assignment(tp)
        if assignment and lai.leader != assignment[0] and not ctx.is_topic_queued_up_for_deletion(tp.topic):
            count += 1
    return count


def _offline_election(ctx: ControllerContext) -> OfflineElection:
    """Offline election, unclean only for topics that enable unclean.leader.election.enable."""
    unclean = frozenset(t for t, c in ctx.topic_configs.items()
                        if str(c.get("unclean.leader.election.enable", "false")).lower() == "true")
    return OfflineElection(allow_unclean=False, unclean_topics=unclean)


def _load_topics(ctx: ControllerContext, snapshot: metadata_store.TopicsSnapshot) -> None:
    """Topics, assignments, partition states, configs, deletion marks and topic ids into a context."""
    for topic, assignment in snapshot.assignments.items():
        ctx.all_topics.add(topic)
        ctx.topic_configs[topic] = snapshot.configs.get(topic, {})
        for partition, replicas in assignment.items():
            ctx.update_partition_replica_assignment(TopicPartition(topic, partition), replicas)
    for tp, state in snapshot.states.items():
        ctx.put_partition_leadership_info(tp, state)
    ctx.topics_to_be_deleted = snapshot.topics_to_delete & ctx.all_topics
    ctx.topic_ids = {t: i for t, i in snapshot.topic_ids.items() if t in ctx.all_topics}


def _broker_key(registered: Iterable[BrokerRegistration]) -> tuple[tuple[int, int, str], ...]:
    """Broker registrations as a comparable value: id, epoch and the registration's JSON."""
    return tuple(sorted((r.broker_id, r.broker_epoch, json.dumps(r.info, sort_keys=True, default=str))
                        for r in registered))


@dataclass
class _PreparedFailover:
    """A failover decided while standby, and the inputs it was decided on."""

    generation: int  # StandbyMetadata.generation of the copy it was loaded from
    brokers: tuple[tuple[int, int, str], ...]  # _broker_key of the registrations it assumed
    ctx: ControllerContext
    actions: ControllerActions
    bounced: set[int]


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
                 registry: CollectorRegistry = REGISTRY, endpoint: str = "", delete_topic_enable: bool = True,
                 leader_balance: LeaderBalanceConfig = LeaderBalanceConfig(),
                 new_partitions_per_event: int = NEW_PARTITIONS_PER_EVENT_DEFAULT,
                 fast_failover_enable: bool = CONTROLLER_FAST_FAILOVER_ENABLE_DEFAULT) -> None:
        if new_partitions_per_event < 1:
            raise ValueError("new.partitions.per.event must be at least 1")
        self.controller_id = controller_id
        self.new_partitions_per_event = new_partitions_per_event
        self.etcd = etcd
        self.endpoint = endpoint
        self.delete_topic_enable = delete_topic_enable
        self.leader_balance = leader_balance
        self.lease_ttl_s = lease_ttl_s(lease_ttl_ms)
        self.ctx = ControllerContext()
        self.active_controller_id = NO_CONTROLLER
        self.metrics = ControllerMetrics(registry)
        # Partitions per etcd transaction of an event's writes; 1 once etcd refused a batch (--max-txn-ops
        # below its default 128).
        self.partition_write_batch = PARTITION_STATE_WRITE_BATCH
        self.events = ControllerEventManager(registry=registry)
        self.channels = ControllerChannelManager(controller_id, registry)
        self.channels.on_leader_and_isr_response = self._leader_and_isr_answered
        self.stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lease: ThreadedLease | None = None
        self._controller_watch: asyncio.Task[None] | None = None
        # The active role's watches: brokers/ids, brokers/topics, admin/delete_topics.
        self._active_watches: list[asyncio.Task[None]] = []
        # The active role's AutoPreferredReplicaLeaderElection timer (Kafka's kafkaScheduler task).
        self._rebalance_timer: asyncio.Task[None] | None = None
        self._closing = False
        # New partitions whose creation waits for a later NewPartitionCreation event, in creation order:
        # partition -> (replicas, topic id of the topic they were assigned under). Active role only.
        self._creation_backlog: dict[TopicPartition, tuple[list[int], bytes]] = {}
        self._creation_scheduled = False  # one NewPartitionCreation event at a time is queued
        # While standby: the topics, partition states, configs and deletion marks kept current from etcd,
        # handed to the failover (verified key by key against etcd) instead of a cold read (issue 24).
        self.standby_metadata = StandbyMetadata(etcd)
        self.last_takeover: TakeOver | None = None  # what the last failover verified (None: it read cold)
        # While standby: the failover decided ahead from the warm copy (None until the copy has been quiet).
        self._prepared: _PreparedFailover | None = None
        self._prepare_task: asyncio.Task[None] | None = None
        self.last_failover_prepared = False  # the last failover used the decision prepared while standby
        # While standby: a connection to the active controller's endpoint, to revoke its lease once its
        # process is provably gone (controller.fast.failover.enable); None when that is off.
        self.active_watch: ActiveControllerWatch | None = (
            ActiveControllerWatch(etcd, controller_id, self._revoked_active_lease) if fast_failover_enable else None)

    @property
    def failover_prepared(self) -> bool:
        """A failover decided ahead is waiting (standby role)."""
        return self._prepared is not None

    @property
    def is_active(self) -> bool:
        return self.active_controller_id == self.controller_id

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Watch the controller key, then queue Startup (Kafka's startup())."""
        self.events.start()
        self._start_standby()
        # Read the revision first and watch from just after it: no change can fall between.
        revision = (await self.etcd.get_prefix(ControllerZNode.key(self.etcd))).revision
        self._controller_watch = self._spawn(self._watch_controller(revision + 1), "controller-watch")
        await self.events.put(_Event(ControllerState.CONTROLLER_CHANGE, "Startup", self._process_startup))

    async def stop(self) -> None:
        """Stop the event task, resign, and revoke the lease so a standby takes over at once."""
        self._closing = True
        await self.events.close()
        if self.is_active:
            self.on_controller_resignation()
        self.active_controller_id = NO_CONTROLLER
        self._stop_preparing()
        if self.active_watch is not None:
            await self.active_watch.stop()
        await self.standby_metadata.stop()
        for task in (self._controller_watch, *self._active_watches, self._rebalance_timer):
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
        if self._closing:
            return
        reason: BaseException
        if task.cancelled():
            # Resignation drops the active role's watches before they finish cancelling, and stop()
            # sets _closing: a watch still ours that ends cancelled was cancelled behind our back, and
            # without it the controller would go on blind to its keys (no broker death noticed).
            if task is not self._controller_watch and task not in self._active_watches:
                return
            reason = RuntimeError(f"{task.get_name()} was cancelled")
        else:
            reason = task.exception() or RuntimeError(f"{task.get_name()} ended")
        log.error("%s died; the controller stops", task.get_name(), exc_info=reason)
        if not self.stopped.done():
            self.stopped.set_exception(reason)

    # -- watches: they only enqueue events ---------------------------------------

    async def _watch_controller(self, start_revision: int) -> None:
        """Creation or data change -> ControllerChange; deletion -> Reelect (ControllerChangeHandler)."""
        key = ControllerZNode.key(self.etcd)
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

    async def _watch_prefix(self, key: bytes, start_revision: int, event: Callable[[], "_Event"],
                            wanted: Callable[[bytes], bool] = lambda key: True) -> None:
        """Enqueue event() for each wanted change under the key prefix (the active role's ChildChangeHandlers)."""
        while True:
            try:
                async for ev in self.etcd.watch_prefix(key, start_revision):
                    start_revision = ev.mod_revision + 1
                    if wanted(ev.key):
                        await self.events.put(event())
            except WatchCompacted:
                start_revision = (await self.etcd.get_prefix(key)).revision + 1
                await self.events.put(event())

    def _on_lease_lost(self, lease: ThreadedLease, reason: LeaseLost) -> None:
        """Kafka's session expiry: Expire runs next and drops the backlog (clearAndPut)."""
        if lease is not self._lease or self._closing:
            return
        try:
            self.events.clear_and_put(_Event(ControllerState.CONTROLLER_CHANGE, "Expire",
                                             lambda: self._process_expire(lease)))
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

    async def _process_expire(self, lease: ThreadedLease | None = None) -> None:
        if lease is not None and lease is not self._lease:
            # A second report of a loss already handled (the keepalive can report one lease's end twice,
            # the second queued behind the Expire that re-elected us on a new lease): resigning now
            # would drop the new term's context while its registration, on a live lease, stays in
            # etcd, and no controller would act again (found by the chaos suite, seed 42).
            log.info("controller %d: ignoring the loss of lease %x, already replaced", self.controller_id, lease.id)
            return
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
            kv = await self.etcd.get(ControllerZNode.key(self.etcd))
            if kv is not None and self._lost_registration(kv):
                # Our registration on the lease we lost (etcd was unreachable for the lease's TTL, as while
                # etcd elects a new leader): etcd may still hold that lease, and nobody acts on the key, so
                # remove it, only if unchanged, and campaign now instead of after its TTL (a short
                # controller.quorum.fetch.timeout.ms makes such losses commoner). The new epoch fences us.
                key = ControllerZNode.key(self.etcd)
                await self.etcd.txn([mod_revision_is(key, kv.mod_revision)], [Delete(key)])
                log.info("controller %d: removed its registration on lost lease %x to elect again",
                         self.controller_id, kv.lease)
                kv = None
            self.active_controller_id = self._registered_id(kv)
            self._follow_active(kv)
            if self.active_controller_id != NO_CONTROLLER:
                self.metrics.epoch.set((await elector.read_controller_epoch(self.etcd))[0])
                log.debug("controller %d is active; not electing", self.active_controller_id)
                return
            lease = await self._ensure_lease()
            election = await elector.register_controller_and_increment_epoch(
                self.etcd, self.controller_id, lease.id, endpoint=self.endpoint)
        except EtcdError as exc:
            # etcd is away: try again shortly instead of staying a standby forever.
            log.warning("controller %d could not elect: %s; retrying", self.controller_id, exc)
            self._retry_later("Reelect", self._process_reelect)
            return
        self.ctx.epoch, self.ctx.epoch_version = election.epoch, election.epoch_version
        self.active_controller_id = self.controller_id
        self._follow_active(None)
        self.metrics.elections_won.inc()
        log.info("controller %d elected; epoch %d (controller_epoch mod_revision %d)",
                 self.controller_id, election.epoch, election.epoch_version)
        try:
            await self.on_controller_failover()
        except EtcdError as exc:
            log.error("controller %d failed over badly (%s); moving the controller", self.controller_id, exc)
            await self._trigger_controller_move()

    def _holds(self, kv: KeyValue) -> bool:
        """The registration is this instance's current term: bound to our live lease, elected (epoch known)."""
        return (self._lease is not None and self._lease.alive and kv.lease == self._lease.id
                and self.ctx.epoch_version != 0)

    def _lost_registration(self, kv: KeyValue) -> bool:
        """Our own registration, bound to the lease this instance held and lost."""
        return (self._lease is not None and not self._lease.alive and kv.lease == self._lease.id
                and ControllerZNode.decode(kv.value).controller_id == self.controller_id)

    def _registered_id(self, kv: KeyValue | None) -> int:
        """The active controller's id from its registration. Our own id counts only for our current term:
        a registration of ours from a lost lease or an earlier process of ours is nobody's (its key goes
        with its lease); taking it for ours made a standby "active" without having loaded anything."""
        if kv is None:
            return NO_CONTROLLER
        controller_id = ControllerZNode.decode(kv.value).controller_id
        if controller_id == self.controller_id and not self._holds(kv):
            return NO_CONTROLLER
        return controller_id

    async def maybe_resign(self) -> bool:
        """Re-read who is active; resign if it was us and is not any more. True when we resigned."""
        was_active = self.is_active
        kv = await self.etcd.get(ControllerZNode.key(self.etcd))
        self.active_controller_id = self._registered_id(kv)
        self._follow_active(kv)
        if not self.is_active:
            self.metrics.epoch.set((await elector.read_controller_epoch(self.etcd))[0])
        if elector.should_resign(was_active, self.active_controller_id, self.controller_id):
            self.on_controller_resignation()
            return True
        return False

    def _follow_active(self, kv: KeyValue | None) -> None:
        """Point the standby's watch on the active controller's process at the registration just read
        (none while we are active or stopping, or when the key names nobody or us)."""
        if self.active_watch is not None:
            self.active_watch.follow(None if self._closing or self.is_active else kv)

    def _revoked_active_lease(self, watched: WatchedRegistration, reason: str) -> None:
        """The watch revoked a gone active's lease: count it (the key's deletion runs the election)."""
        self.metrics.lease_revocations.inc()

    async def _ensure_lease(self) -> ThreadedLease:
        """Our live lease, granting a new one if the last was lost (a new etcd session)."""
        if self._lease is None or not self._lease.alive:
            # Refreshed from its own thread: a failover holding the event loop for seconds (10,000
            # partitions on a loaded machine) must not cost the 2 s lease it was elected on.
            lease = await ThreadedLease.grant(self.etcd, self.lease_ttl_s)
            if lease.ttl_s != self.lease_ttl_s:
                log.info("controller %d: etcd granted a lease of %d s (asked %d s: its minimum)",
                         self.controller_id, lease.ttl_s, self.lease_ttl_s)
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
        """Resign and give up our registration so another election runs (Kafka's triggerControllerMove).

        The lease is revoked, which deletes the key at once, or, when etcd does not answer, stops its
        keepalive so the key expires within its TTL. (This deleted the key with a write guarded by the
        epoch of the context that the resignation had just reset, so the delete was always refused and
        the registration, on a live lease, stayed: no controller was active until the process ended.)
        """
        self.on_controller_resignation()
        self.active_controller_id = NO_CONTROLLER
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.revoke()

    # -- the active role ---------------------------------------------------------

    async def on_controller_failover(self) -> None:
        """Load the context from etcd, start senders and watches, bring partitions online (onControllerFailover).

        Reads live brokers (epoch = creation revision) and their endpoints, deletes pending
        ISR change notifications, loads topics, partition states and configs (from the standby's
        warm copy, verified against etcd, when it has one; the decision too if the standby made it
        on the same inputs), then runs the pure failover: every live broker gets UpdateMetadata and LeaderAndIsr for its
        replicas. Topics queued for deletion resume deleting.
        """
        phases = PhaseClock()
        brokers = await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))
        registered = registrations(self.etcd, brokers.kvs)
        self.ctx.live_broker_epochs = {r.broker_id: r.broker_epoch for r in registered}
        self.ctx.broker_open_file_limits = open_file_limits(registered)
        # Pending log dir events too, as Kafka's failover does: every replica gets LeaderAndIsr below, and the
        # answers say which are in an offline dir.
        await self.guarded_write([], [Delete(IsrChangeNotificationZNode.prefix(self.etcd), prefix=True),
                                      Delete(LogDirEventNotificationZNode.prefix(self.etcd), prefix=True)])
        phases.lap("brokers")
        # A warm standby hands over its copy, verified against etcd key by key (mod_revisions, no values):
        # only what changed since its watch last applied is read and parsed (StandbyMetadata's module doc
        # says why a missed watch event cannot leave a stale key). Not loaded yet: a cold read.
        if self._prepare_task is not None:  # the prepared decision (if any) stays for the check below
            self._prepare_task.cancel()
            self._prepare_task = None
        warm = await self.standby_metadata.take()
        if warm is not None:
            snapshot, self.last_takeover = warm
            source = str(self.last_takeover)
        else:
            snapshot, source, self.last_takeover = await metadata_store.load_topics(self.etcd), "cold read", None
        phases.lap("read")
        prepared, self._prepared = self._prepared, None
        if (prepared is not None and self.last_takeover is not None and self.last_takeover.unchanged
                and prepared.generation == self.last_takeover.generation
                and prepared.brokers == _broker_key(registered) and prepared.ctx.epoch == self.ctx.epoch):
            # The standby's prepared failover was decided on exactly these inputs: the copy handed over
            # (unchanged since, and nothing re-read or dropped by the verification), these registrations
            # and the epoch we were elected with.
            prepared.ctx.epoch_version = self.ctx.epoch_version
            self.ctx = prepared.ctx
            source += ", decision prepared while standby"
            self.last_failover_prepared = True
        else:
            prepared, self.last_failover_prepared = None, False
            _load_topics(self.ctx, snapshot)
        phases.lap("load")
        # Let the loop's other tasks (watches, gRPC handlers, the senders) run between the failover's long
        # synchronous steps: at 10,000 partitions each takes a few hundred ms. (The lease has its own thread.)
        await asyncio.sleep(0)
        await self._backfill_topic_ids(snapshot)
        for registration in registered:
            self.channels.add_broker(registration.endpoint())
        self._active_watches = [
            self._spawn(self._watch_prefix(BrokerIdsZNode.prefix(self.etcd), brokers.revision + 1,
                                           self._broker_change_event),
                        "broker-watch"),
            self._spawn(self._watch_prefix(TopicZNode.prefix(self.etcd), snapshot.revision + 1,
                                           self._topic_change_event,
                                           lambda key: metadata_store.is_topic_key(self.etcd, key)), "topic-watch"),
            self._spawn(self._watch_prefix(DeleteTopicsZNode.prefix(self.etcd), snapshot.revision + 1,
                                           self._topic_deletion_event), "topic-deletion-watch"),
            # Only creations matter: our own deletions of handled notifications also show up here.
            self._spawn(self._watch_prefix(IsrChangeNotificationZNode.prefix(self.etcd), snapshot.revision + 1,
                                           self._isr_change_event), "isr-change-watch"),
            self._spawn(self._watch_prefix(LogDirEventNotificationZNode.prefix(self.etcd), snapshot.revision + 1,
                                           self._log_dir_event), "log-dir-event-watch"),
        ]
        if prepared is not None:
            actions, bounced = prepared.actions, prepared.bounced
        else:
            actions = ControllerActions()
            bounced = on_controller_failover(self.ctx, actions, self._election())
        if bounced:
            log.info("leaders re-registered since their election, handled as bounced: %s", sorted(bounced))
        phases.lap("decide")
        await asyncio.sleep(0)
        await self.apply_actions(actions)
        phases.lap("apply")
        if snapshot.topics_to_delete:
            await self.on_topic_deletion()
        if self.leader_balance.auto_leader_rebalance_enable:
            self._rebalance_timer = asyncio.get_running_loop().create_task(
                self._auto_leader_rebalance_timer(), name="auto-leader-rebalance")
        self.metrics.active_controller_count.set(1)
        self.metrics.epoch.set(self.ctx.epoch)
        log.info("controller %d active: epoch %d, live brokers %s, %d topics, %d partitions; metadata %s; "
                 "failover took %s", self.controller_id, self.ctx.epoch, sorted(self.ctx.live_broker_epochs),
                 len(self.ctx.all_topics), len(self.ctx.partition_leadership_info), source, phases)

    async def _prepare_failover_loop(self) -> None:
        """While standby: decide the failover ahead (the context loaded from the warm copy and the pure
        `on_controller_failover` run on it, at the epoch the next election gives: the current one + 1), once
        the copy and the broker registrations have been quiet for PREPARE_QUIET_S. The failover uses it only
        if its inputs are still exactly those (see on_controller_failover); else it decides again."""
        seen = -1
        while True:
            await asyncio.sleep(PREPARE_QUIET_S)
            generation = self.standby_metadata.generation
            if self.is_active or not self.standby_metadata.ready or generation != seen:
                seen = generation  # changed within the last period: wait for a quiet one
                continue
            try:
                brokers = registrations(self.etcd, (await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))).kvs)
                # The epoch this standby would be elected with: the decision compares partition states'
                # controller epochs with it and stamps the states it writes with it.
                epoch = (await elector.read_controller_epoch(self.etcd))[0] + 1
            except EtcdError:
                continue
            key = _broker_key(brokers)
            current = self._prepared
            if (self.is_active or generation != self.standby_metadata.generation
                    or (current is not None and (current.generation, current.brokers, current.ctx.epoch)
                        == (generation, key, epoch))):
                continue
            ctx = ControllerContext(epoch=epoch)
            ctx.live_broker_epochs = {r.broker_id: r.broker_epoch for r in brokers}
            ctx.broker_open_file_limits = open_file_limits(brokers)
            _load_topics(ctx, self.standby_metadata.peek())
            actions = ControllerActions()
            bounced = on_controller_failover(ctx, actions, _offline_election(ctx))
            self._prepared = _PreparedFailover(generation, key, ctx, actions, bounced)
            # A full collection now, while idle, rather than during the takeover: the copy and the prepared
            # context are ~235,000 objects no full collection has seen yet, and one of them costs 0.1-0.2 s
            # at 10,000 partitions on a loaded 2-core machine (measured in isolation).
            gc.collect()
            log.debug("controller %d: failover prepared at copy generation %d", self.controller_id, generation)

    def _start_standby(self) -> None:
        """The standby role's background work: the warm copy and the failover prepared from it."""
        self.standby_metadata.start()
        if self._prepare_task is None:
            self._prepare_task = asyncio.get_running_loop().create_task(self._prepare_failover_loop(),
                                                                       name="prepare-failover")

    def _stop_preparing(self) -> None:
        if self._prepare_task is not None:
            self._prepare_task.cancel()
            self._prepare_task = None
        self._prepared = None

    async def _backfill_topic_ids(self, snapshot: metadata_store.TopicsSnapshot) -> None:
        """Topics created before topic ids (KIP-516) get one now, written to their key, as Kafka's
        controller does on upgrade (setTopicIds). A key changed meanwhile keeps its own (a newer
        write, itself with an id); the topic watch brings that in."""
        for topic in sorted(self.ctx.all_topics - set(self.ctx.topic_ids)):
            topic_id = uuid.random_topic_id()
            compares, ops = metadata_store.topic_id_backfill_ops(
                self.etcd, topic, snapshot.assignments[topic], topic_id, snapshot.topic_revisions[topic])
            try:
                await self.guarded_write(compares, ops)
            except CompareFailed:
                log.info("topic %s changed while its id was assigned; the topic watch will read it", topic)
                continue
            self.ctx.topic_ids[topic] = topic_id
            log.info("topic %s had no topic id; assigned %s", topic, uuid.to_string(topic_id))

    def on_controller_resignation(self) -> None:
        """Stop what the active controller owns and forget its context (seed 001's onControllerResignation)."""
        for task in self._active_watches:
            task.cancel()
        self._active_watches = []
        if self._rebalance_timer is not None:
            self._rebalance_timer.cancel()
            self._rebalance_timer = None
        self.channels.shutdown()
        # The next controller finds the rest of a half-created topic New in etcd and creates it on failover.
        self._creation_backlog.clear()
        self._creation_scheduled = False
        epoch = self.ctx.epoch
        self.ctx = ControllerContext()
        self.metrics.active_controller_count.set(0)
        if not self._closing:  # a standby again: follow the metadata from a fresh read
            self._start_standby()
        self.metrics.update_partition_gauges(self.ctx)
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

    async def refresh_partition_states(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Re-read partition states from etcd into the context (None: all) before deciding on them.

        Kafka's elections and ISR removals read the states from ZooKeeper first
        (getTopicPartitionStatesFromZk): leaders change ISRs by themselves (seed 000)
        and their notifications arrive seconds later, so the context may be stale.
        """
        wanted = None if partitions is None else set(partitions)
        if wanted is not None and not wanted:
            return
        for tp, state in (await metadata_store.load_partition_states(self.etcd)).items():
            if (wanted is None or tp in wanted) and tp in self.ctx.partition_leadership_info:
                self.ctx.put_partition_leadership_info(tp, state)

    def _election(self) -> OfflineElection:
        """Offline election, unclean only for topics that enable unclean.leader.election.enable."""
        return _offline_election(self.ctx)

    async def apply_actions(self, actions: ControllerActions, deleted_topics: Iterable[str] = ()) -> None:
        """Perform an event's etcd writes in order, then queue its control requests (sendRequestsToBrokers).

        A write whose partition-epoch compare fails (a leader changed the ISR meanwhile)
        re-reads the state and re-runs the transition on it, a bounded number of times
        (Kafka's updateLeaderAndIsr retry); the requests carry the state finally stored.
        A partition whose transition cannot complete keeps the state etcd holds and its
        requests are dropped. A fenced write raises ControllerMovedError and nothing is sent.
        """

        async def write_many(ws: list[PartitionStateWrite]) -> None:
            compares: list[Compare] = []
            ops: list[Put | Delete] = []
            for w in ws:
                c, o = metadata_store.partition_state_write(self.etcd, w)
                compares += c
                ops += o
            try:
                await self.guarded_write(compares, ops)
            except CompareFailed as exc:
                raise PartitionStateConflict(str(exc)) from exc
            except EtcdError as exc:
                if len(ws) == 1 or "too many operations in txn request" not in str(exc):
                    raise
                # etcd runs with a --max-txn-ops below the batch: nothing applied; one partition per
                # transaction from now on (the writes of this batch go one by one too).
                log.warning("etcd refused a transaction of %d partition-state writes (%s); writing one "
                            "partition per transaction (etcd's --max-txn-ops should be at least 128)", len(ws), exc)
                self.partition_write_batch = 1
                raise PartitionStateConflict(str(exc)) from exc

        async def write(w: PartitionStateWrite) -> None:
            await write_many([w])

        async def load(tp: TopicPartition) -> LeaderAndIsr | None:
            return await metadata_store.load_partition_state(self.etcd, tp)

        outcome = await perform_partition_state_writes(actions.writes, self.ctx.epoch, write, load,
                                                       concurrency=PARTITION_STATE_WRITE_CONCURRENCY,
                                                       write_many=write_many, batch=self.partition_write_batch)
        if outcome.batch_fallbacks:
            log.info("%d partition-state batches lost a compare and were written partition by partition",
                     outcome.batch_fallbacks)
        self.metrics.partition_state_write_retries.inc(outcome.retries)
        apply_writes_outcome(self.ctx, actions, outcome)
        if actions.unclean_elections:
            self.metrics.unclean_elections.inc(actions.unclean_elections)
        for kind, elected in actions.elections.items():
            self.metrics.leader_elections.labels(kind=kind).inc(elected)
        for tp, reason in sorted(actions.failed.items()):
            log.warning("%s: %s", tp, reason)
        self.channels.send(actions.batch.build(self.ctx, self.controller_id), self.ctx.topic_configs, deleted_topics,
                           self.ctx.topic_ids)
        self.metrics.update_partition_gauges(self.ctx)

    # -- cluster events (event task only) ------------------------------------------

    def _broker_change_event(self) -> _Event:
        return _Event(ControllerState.BROKER_CHANGE, "BrokerChange", lambda: self._guarded_event(self.on_broker_change))

    def _topic_change_event(self) -> _Event:
        return _Event(ControllerState.TOPIC_CHANGE, "TopicChange", lambda: self._guarded_event(self.on_topic_change))

    def _topic_deletion_event(self) -> _Event:
        return _Event(ControllerState.TOPIC_DELETION, "TopicDeletion",
                      lambda: self._guarded_event(self.on_topic_deletion))

    def _isr_change_event(self) -> _Event:
        return _Event(ControllerState.ISR_CHANGE, "IsrChangeNotification",
                      lambda: self._guarded_event(self.on_isr_change_notification))

    async def on_isr_change_notification(self) -> None:
        """IsrChangeNotification (seed 000): reload the changed partition states, UpdateMetadata everywhere, delete.

        Leaders write `isr_change_notification/isr_change_<seq>` =
        {"version":1,"partitions":[{"topic":T,"partition":P},...]} after changing an ISR.
        """
        if not self.is_active:
            return
        keys, decoded = await self._read_notifications(IsrChangeNotificationZNode.prefix(self.etcd),
                                                       IsrChangeNotificationZNode.decode, "ISR change")
        if not keys:
            return
        changed = {TopicPartition(t, p) for partitions in decoded for t, p in partitions}
        refreshed = []
        for tp in sorted(changed):
            if tp.topic not in self.ctx.all_topics:
                continue
            state = await metadata_store.load_partition_state(self.etcd, tp)
            if state is not None:
                self.ctx.put_partition_leadership_info(tp, state)
                refreshed.append(tp)
        actions = ControllerActions()
        if refreshed:
            actions.batch.add_update_metadata(self.ctx.live_or_shutting_down_broker_ids, refreshed)
        try:
            await self.apply_actions(actions)
        finally:
            await self.guarded_write([], [Delete(key) for key in keys])
        log.info("ISR changes propagated for %s", [f"{tp.topic}-{tp.partition}" for tp in refreshed])

    async def _read_notifications(self, prefix: bytes, decode: Callable[[bytes], T],
                                  what: str) -> tuple[list[bytes], list[T]]:
        """Every notification key under prefix (all to delete once handled) and the values that decode; a
        malformed one is logged and left out (Kafka's notification handlers skip what they cannot parse)."""
        found = await self.etcd.get_prefix(prefix)
        decoded = []
        for kv in found.kvs:
            try:
                decoded.append(decode(kv.value))
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring malformed %s notification %r: %s", what, kv.key, exc)
        return [kv.key for kv in found.kvs], decoded

    def _log_dir_event(self) -> _Event:
        return _Event(ControllerState.LOG_DIR_CHANGE, "LogDirEventNotification",
                      lambda: self._guarded_event(self.on_log_dir_event_notification))

    async def on_log_dir_event_notification(self) -> None:
        """LogDirEventNotification: a broker's log dir went offline (or, Gregor's, came back); delete the
        notifications and send the brokers named LeaderAndIsr for all their replicas (onBrokerLogDirFailure).
        Their answers (`on_leader_and_isr_response`) say which replicas are offline."""
        if not self.is_active:
            return
        keys, decoded = await self._read_notifications(LogDirEventNotificationZNode.prefix(self.etcd),
                                                       LogDirEventNotificationZNode.decode, "log dir event")
        if not keys:
            return
        brokers = {broker for broker, _ in decoded}
        actions = ControllerActions()
        try:
            on_broker_log_dir_failure(self.ctx, brokers, actions)
            await self.apply_actions(actions)
        finally:
            await self.guarded_write([], [Delete(key) for key in keys])
        log.info("log dir events of brokers %s: LeaderAndIsr sent for their replicas", sorted(brokers))

    def _leader_and_isr_answered(self, broker_id: int, request: broker_pb2.LeaderAndIsrRequest,
                                 response: broker_pb2.LeaderAndIsrResponse) -> None:
        """A broker answered LeaderAndIsr (its sender's task): queue LeaderAndIsrResponseReceived when the answer
        names a replica in an offline log dir, or the broker has such replicas (some may be back). Only a peek
        at the context from outside the event task, never a change."""
        storage = [TopicPartition(pe.topic, pe.partition) for pe in response.partition_errors
                   if pe.error == errors.Code.KAFKA_STORAGE_ERROR]
        if not storage and broker_id not in self.ctx.replicas_on_offline_dirs:
            return
        partitions = [TopicPartition(s.topic, s.partition) for s in request.partition_states]
        broker_epoch, controller_epoch = request.broker_epoch, request.controller_epoch
        event = _Event(ControllerState.LEADER_AND_ISR_RESPONSE_RECEIVED, "LeaderAndIsrResponseReceived",
                       lambda: self._guarded_event(lambda: self.on_leader_and_isr_response(
                           broker_id, broker_epoch, controller_epoch, partitions, storage)))
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            asyncio.get_running_loop().create_task(self.events.put(event), name="leader-and-isr-response")
        except Exception:  # the event manager is stopping: nothing to act on
            log.debug("LeaderAndIsr answer of broker %d not queued", broker_id, exc_info=True)

    async def on_leader_and_isr_response(self, broker_id: int, broker_epoch: int, controller_epoch: int,
                                         partitions: list[TopicPartition], storage_errors: list[TopicPartition]) -> None:
        """LeaderAndIsrResponseReceived: replicas answered KAFKA_STORAGE_ERROR go OfflineReplica (leadership and
        ISR membership move off them); offline ones answered without error are back. An answer of another
        controller term or of an earlier registration of the broker is stale and ignored."""
        if not self.is_active or controller_epoch != self.ctx.epoch:
            return
        if broker_id not in self.ctx.live_or_shutting_down_broker_ids or broker_epoch not in (
                -1, self.ctx.broker_epoch(broker_id)):
            return
        # Leaders may have changed ISRs since their last notification: decide on etcd's states.
        await self.refresh_partition_states(set(storage_errors))
        actions = ControllerActions()
        offline, back = on_leader_and_isr_response(self.ctx, broker_id, partitions, storage_errors, actions,
                                                   self._election())
        await self.apply_actions(actions)
        if offline or back:
            log.info("broker %d: replicas in an offline log dir: %d newly offline %s, %d back online %s", broker_id,
                     len(offline), sorted(str(tp) for tp in offline)[:20], len(back),
                     sorted(str(tp) for tp in back)[:20])

    async def on_broker_change(self) -> None:
        """BrokerChange: senders follow membership first, then onBrokerStartup / onBrokerFailure."""
        if not self.is_active:
            return
        brokers = await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))
        registered = {r.broker_id: r for r in registrations(self.etcd, brokers.kvs)}
        current = {b: r.broker_epoch for b, r in registered.items()}
        self.ctx.broker_open_file_limits = open_file_limits(registered.values())
        changes = compute_broker_changes(self.ctx.live_broker_epochs, current)
        for broker_id in (*changes.dead, *changes.bounced):
            self.channels.remove_broker(broker_id)
        for broker_id in (*changes.new, *changes.bounced):
            self.channels.add_broker(registered[broker_id].endpoint())
        if changes.dead or changes.bounced:
            # Leaders may have changed ISRs since their last notification: act on etcd's states.
            gone = (*changes.dead, *changes.bounced)
            await self.refresh_partition_states({r.topic_partition for r in self.ctx.replicas_on_brokers(gone)})
        actions = ControllerActions()
        # Its bounced brokers also count leaders recorded under another registration (same senders).
        changes = process_broker_change(self.ctx, current, actions, self._election())
        await self.apply_actions(actions)
        if not changes.is_empty():
            log.info("brokers: new %s, dead %s, bounced %s, live %s", list(changes.new), list(changes.dead),
                     list(changes.bounced), sorted(self.ctx.live_broker_epochs))

    async def on_topic_change(self) -> None:
        """TopicChange / PartitionModifications: new topics and added partitions go New -> Online.

        At most `new_partitions_per_event` new partitions are created in this event; the rest wait in
        the creation backlog for NewPartitionCreation events queued behind the events already waiting.
        """
        if not self.is_active:
            return
        topic_keys = await metadata_store.load_topic_keys(self.etcd)
        for topic, topic_id in topic_keys.topic_ids.items():
            if topic not in self.ctx.all_topics or topic not in self.ctx.topic_ids:
                self.ctx.topic_ids[topic] = topic_id
        for topic in set(topic_keys.assignments) - self.ctx.all_topics:
            kv = await self.etcd.get(metadata_store.config_key(self.etcd, topic))
            self.ctx.topic_configs[topic] = metadata_store.decode_config(kv.value) if kv is not None else {}
        assignments = self._admit_new_partitions(topic_keys.assignments)
        actions = ControllerActions()
        known = self.ctx.all_topics & set(assignments)
        new, deleted = process_topic_change(self.ctx, assignments, actions)
        for topic in sorted(known):
            process_partition_modifications(self.ctx, topic, assignments[topic], actions)
        await self.apply_actions(actions)
        if new or deleted:
            log.info("topics: new %s, gone %s", sorted(new), sorted(deleted))

    def _admit_new_partitions(self, assignments: Mapping[str, Mapping[int, Sequence[int]]]
                              ) -> dict[str, dict[int, Sequence[int]]]:
        """The assignments this event acts on: the partitions the context knows, plus new ones up to
        `new_partitions_per_event`; the other new partitions go to the creation backlog (in order)."""
        budget = self.new_partitions_per_event
        admitted: dict[str, dict[int, Sequence[int]]] = {}
        for topic in sorted(assignments):
            known = self.ctx.partition_assignments.get(topic, {}) if topic in self.ctx.all_topics else {}
            view: dict[int, Sequence[int]] = {}
            for partition, replicas in sorted(assignments[topic].items()):
                tp = TopicPartition(topic, partition)
                if partition in known:
                    view[partition] = replicas
                elif tp in self._creation_backlog:
                    continue
                elif budget > 0:
                    view[partition] = replicas
                    budget -= 1
                else:
                    self._creation_backlog[tp] = (list(replicas), self.ctx.topic_ids.get(topic, b""))
            admitted[topic] = view
        if self._creation_backlog:
            self._schedule_creation_batch()
        return admitted

    def _schedule_creation_batch(self) -> None:
        """Queue one NewPartitionCreation event behind what already waits (waiting for room if full)."""
        if self._creation_scheduled:
            return
        self._creation_scheduled = True
        def preempted() -> None:  # dropped by clear_and_put (Expire, shutdown): the next change re-queues
            self._creation_scheduled = False

        event = _Event(ControllerState.TOPIC_CHANGE, "NewPartitionCreation",
                       lambda: self._guarded_event(self._create_backlogged_partitions), preempted)
        try:
            self.events.put_nowait(event)
        except asyncio.QueueFull:
            asyncio.get_running_loop().create_task(self.events.put(event), name="new-partition-creation")

    async def _create_backlogged_partitions(self) -> None:
        """NewPartitionCreation: the next `new_partitions_per_event` backlogged partitions go New -> Online.

        A partition whose topic was deleted (or deleted and created again) since it was backlogged is
        dropped; one the context already has (a TopicChange took it) is skipped.
        """
        self._creation_scheduled = False
        if not self.is_active or not self._creation_backlog:
            return
        batch: list[TopicPartition] = []
        for tp in list(self._creation_backlog)[:self.new_partitions_per_event]:
            replicas, topic_id = self._creation_backlog.pop(tp)
            if (tp.topic in self.ctx.all_topics and tp.topic not in self.ctx.topics_to_be_deleted
                    and self.ctx.topic_ids.get(tp.topic, b"") == topic_id
                    and tp.partition not in self.ctx.partition_assignments.get(tp.topic, {})):
                self.ctx.update_partition_replica_assignment(tp, replicas)
                batch.append(tp)
        actions = ControllerActions()
        if batch:
            on_new_partition_creation(self.ctx, batch, actions)
        await self.apply_actions(actions)
        if self._creation_backlog:
            self._schedule_creation_batch()

    def assigned_partitions(self, topic: str) -> dict[int, list[int]]:
        """The topic's assignment as etcd holds it: created partitions and those still backlogged."""
        out = {p: list(r) for p, r in self.ctx.partition_assignments.get(topic, {}).items()}
        out.update({tp.partition: list(r) for tp, (r, _) in self._creation_backlog.items() if tp.topic == topic})
        return out

    def backlogged_replicas(self) -> list[list[int]]:
        """The replica lists of every partition still waiting in the creation backlog."""
        return [replicas for replicas, _ in self._creation_backlog.values()]

    async def on_topic_deletion(self) -> None:
        """TopicDeletion: topics marked under admin/delete_topics are stopped, deleted on brokers, then removed."""
        if not self.is_active:
            return
        marked = await metadata_store.load_topics_to_delete(self.etcd)
        if not marked:
            return
        if not self.delete_topic_enable:
            log.warning("delete.topic.enable is false; ignoring deletion of %s", sorted(marked))
            await self.guarded_write([], [Delete(metadata_store.delete_topic_key(self.etcd, t)) for t in marked])
            return
        actions = ControllerActions()
        deleted = on_topic_deletion(self.ctx, marked, actions)
        await self.apply_actions(actions, deleted_topics=deleted)
        ops = [op for topic in sorted(marked) for op in metadata_store.delete_topic_ops(self.etcd, topic)]
        await self.guarded_write([], ops)
        log.info("topics deleted: %s", sorted(deleted))

    # -- leadership on purpose: controlled shutdown, ElectLeaders, auto-rebalance -----

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> set[TopicPartition]:
        """The ControlledShutdown event: move leadership off a stopping broker; the partitions it still leads."""
        return await self.run_request("ControlledShutdown", ControllerState.CONTROLLED_SHUTDOWN,
                                      lambda: self._process_controlled_shutdown(broker_id, broker_epoch))

    async def _process_controlled_shutdown(self, broker_id: int, broker_epoch: int) -> set[TopicPartition]:
        await self.refresh_partition_states(self.ctx.partitions_on_broker(broker_id))
        actions = ControllerActions()
        try:
            do_controlled_shutdown(self.ctx, broker_id, broker_epoch, actions)
        except errors.GregorError:
            self.metrics.controlled_shutdowns.labels(result="error").inc()
            raise
        # First tell every broker it is no longer live (its senders are FIFO): a new leader then never
        # takes it back into the ISR when its last fetches arrive after the LeaderAndIsr below.
        announce = ControlRequestBatch()
        announce.add_update_metadata(self.ctx.live_or_shutting_down_broker_ids, [])
        self.channels.send(announce.build(self.ctx, self.controller_id), self.ctx.topic_configs, (), self.ctx.topic_ids)
        await self.apply_actions(actions)
        # After the writes: a transition that could not be re-run left etcd's leader in the context.
        remaining = partitions_still_led(self.ctx, broker_id)
        self.metrics.controlled_shutdowns.labels(result="remaining" if remaining else "done").inc()
        log.info("controlled shutdown of broker %d: %d partitions still led%s", broker_id, len(remaining),
                 f" ({sorted(str(tp) for tp in remaining)})" if remaining else "")
        return remaining

    async def elect_leaders(self, partitions: list[TopicPartition] | None,
                            election_type: ElectionType) -> dict[TopicPartition, ElectionOutcome]:
        """ElectLeaders (kafka-leader-election.sh): preferred or unclean election, per-partition outcomes."""
        return await self.run_request("ElectLeaders", ControllerState.MANUAL_LEADER_BALANCE,
                                      lambda: self._process_replica_leader_election(partitions, election_type))

    async def _process_replica_leader_election(
            self, partitions: list[TopicPartition] | None,
            election_type: ElectionType) -> dict[TopicPartition, ElectionOutcome]:
        await self.refresh_partition_states(set(partitions) if partitions is not None else None)
        actions = ControllerActions()
        outcomes = process_replica_leader_election(self.ctx, partitions, election_type, actions)
        return await self._apply_election(actions, outcomes, election_type, ElectionTrigger.ADMIN)

    async def _apply_election(self, actions: ControllerActions, outcomes: dict[TopicPartition, ElectionOutcome],
                              election_type: ElectionType,
                              trigger: ElectionTrigger) -> dict[TopicPartition, ElectionOutcome]:
        """Apply an election's actions; an outcome whose write could not complete becomes an error."""
        await self.apply_actions(actions)
        code = (errors.Code.PREFERRED_LEADER_NOT_AVAILABLE if election_type is ElectionType.PREFERRED
                else errors.Code.ELIGIBLE_LEADERS_NOT_AVAILABLE)
        final: dict[TopicPartition, ElectionOutcome] = {}
        elected = 0
        for tp, outcome in outcomes.items():
            lai = self.ctx.partition_leadership_info.get(tp)
            if outcome.error is None and tp in actions.failed:
                outcome = ElectionOutcome(lai.leader if lai is not None else outcome.leader, errors.error_for(
                    code, actions.failed[tp], topic=tp.topic, partition=tp.partition))
            elif outcome.error is None and lai is not None:
                outcome = ElectionOutcome(lai.leader)
                elected += 1
            final[tp] = outcome
        if election_type is ElectionType.PREFERRED and elected:
            self.metrics.preferred_elections.labels(trigger=trigger.value).inc(elected)
        return final

    async def _auto_leader_rebalance_timer(self) -> None:
        """Queue AutoPreferredReplicaLeaderElection after 5 s, then every leader.imbalance.check.interval.seconds."""
        interval = self.leader_balance.leader_imbalance_check_interval_seconds
        delay = min(FIRST_AUTO_LEADER_REBALANCE_DELAY_S, interval)
        while True:
            await asyncio.sleep(delay)
            delay = interval
            try:
                queued = await self.events.put(_Event(
                    ControllerState.AUTO_LEADER_BALANCE, "AutoPreferredReplicaLeaderElection",
                    lambda: self._guarded_event(self.on_auto_preferred_replica_leader_election)))
                await queued.wait()
            except Exception:  # the event failed or the manager is stopping: the next tick tries again
                log.exception("AutoPreferredReplicaLeaderElection failed")

    async def on_auto_preferred_replica_leader_election(self) -> None:
        """AutoPreferredReplicaLeaderElection: elect preferred leaders for brokers over the imbalance threshold."""
        if not self.is_active or not self.leader_balance.auto_leader_rebalance_enable:
            return
        await self.refresh_partition_states()
        actions = ControllerActions()
        outcomes = check_and_trigger_auto_leader_rebalance(
            self.ctx, actions, self.leader_balance.leader_imbalance_per_broker_percentage)
        if not outcomes:
            return
        final = await self._apply_election(actions, outcomes, ElectionType.PREFERRED, ElectionTrigger.AUTO)
        moved = sorted(str(tp) for tp, o in final.items() if o.error is None)
        failed = sorted(str(tp) for tp, o in final.items() if o.error is not None)
        log.info("auto leader rebalance: preferred leaders elected for %s%s", moved,
                 f", failed for {failed}" if failed else "")

    # -- requests ----------------------------------------------------------------

    async def run_request(self, name: str, state: ControllerState, body: Callable[[], Awaitable["T"]]) -> "T":
        """Run body on the event task (it alone touches the context) and return its result to an RPC.

        NOT_CONTROLLER when this instance is not active, was fenced, or is stopping.
        """
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()

        async def run() -> None:
            try:
                if not self.is_active:
                    raise errors.error_for(errors.Code.NOT_CONTROLLER,
                                           f"controller {self.controller_id} is not active")
                result.set_result(await body())
            except ControllerMovedError as exc:
                await self.maybe_resign()
                result.set_exception(errors.error_for(errors.Code.NOT_CONTROLLER, str(exc)))
            except Exception as exc:
                result.set_exception(exc)

        def preempt() -> None:
            result.set_exception(errors.error_for(errors.Code.NOT_CONTROLLER, "the controller is moving"))

        try:
            queued = await self.events.put(_Event(state, name, run, preempt))
            await queued.wait()
        except Exception as exc:  # the event task is gone: this instance controls nothing
            raise errors.error_for(errors.Code.NOT_CONTROLLER, f"controller stopping: {exc}") from exc
        return result.result()

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """A block of producer ids (start, length), allocated on the event task with a guarded write."""
        return await self.run_request("AllocateProducerIds", ControllerState.IDLE,
                                      lambda: self._allocate_producer_ids(broker_id, broker_epoch))

    async def _allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        if not self.is_active:
            raise errors.error_for(errors.Code.NOT_CONTROLLER, f"controller {self.controller_id} is not active")
        if self.ctx.broker_epoch(broker_id) != broker_epoch:
            raise errors.error_for(errors.Code.STALE_BROKER_EPOCH,
                                   f"broker {broker_id} epoch {broker_epoch} is not the registered one")
        key = ProducerIdBlockZNode.key(self.etcd)
        kv = await self.etcd.get(key)
        start = ProducerIdBlockZNode.decode(kv.value).block_end + 1 if kv is not None else 0
        block = ProducerIdBlock(broker_id, start, start + PRODUCER_ID_BLOCK_SIZE - 1)
        expected = kv.mod_revision if kv is not None else 0
        await self.guarded_write([mod_revision_is(key, expected)], [Put(key, ProducerIdBlockZNode.encode(block))])
        return start, PRODUCER_ID_BLOCK_SIZE

    async def describe_cluster(self) -> ClusterDescription:
        """Controller id, epoch and registered brokers as etcd has them now (any instance may answer)."""
        controller_id = await elector.read_controller_id(self.etcd)
        epoch, _ = await elector.read_controller_epoch(self.etcd)
        brokers = await self.etcd.get_prefix(BrokerIdsZNode.prefix(self.etcd))
        return ClusterDescription(controller_id, epoch, registrations(self.etcd, brokers.kvs))


__all__ = ["BrokerRegistration", "ClusterDescription", "Controller", "LeaderBalanceConfig", "broker_epochs"]
