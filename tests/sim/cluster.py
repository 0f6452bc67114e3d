"""A seeded, in-memory cluster of one partition's replicas and two controllers, driving production code.

What is production code here: each broker's ReplicationState (gregor.broker.replication_state) and the
effect runner the broker uses (replication_state.dispatch_effects), with DelayedProduce's rule
(ReplicationState.acks_all_outcome); each follower's FollowerFetchState (gregor.broker.fetcher_state, the
fetch session, backoff, error handling and the truncation rounds ReplicaFetcher uses), speaking the
multi-partition ReplicaFetch session protocol (full and incremental requests on a stream, a new session per
stream) to the leader's ReplicaFetchSession (gregor.broker.replica_fetch_server: what a request does to the
session and which partitions have news); the ISR write rule (isr_manager.isr_after_proposal); the
controllers' election, state machines and request batches, with their etcd writes through
controller.requests.perform_partition_state_writes and apply_writes_outcome (the fake store loses compares
on purpose, so the re-run path runs under faults).

What is a fake: the in-memory log (for the native log, with LeaderView/SimRead standing in for Partition and
FetchResult where the session reads them), messages with random delays (for gRPC), a dict with
compare-and-swap (for etcd), an integer clock, and the IO glue that moves messages between those and the
production objects (the EffectRunner methods, the follower's request/answer plumbing around
FollowerFetchState and ReplicationState). Not modelled: the fetch purgatory (an answer without news goes
out empty at once instead of waiting replica.fetch.wait.max.ms). Nothing here decides a broker's
leadership, ISR, HW, truncation, what a fetch names or what a session answers; the one exception is the
`truncation="hw"` mutant, the pre-0.11 rule kept to show that the invariants bite.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from gregor.broker.fetcher_state import FollowerFetchState, PartitionFetchState
from gregor.broker.isr_manager import isr_after_proposal
from gregor.broker.replica_fetch_server import ReplicaFetchPart, ReplicaFetchSession
from gregor.broker.limits import REPLICA_FETCH_SESSION_REFRESH_PARTS
from gregor.broker.replication_state import (
    ControlRequestFence,
    Effect,
    FetchMode,
    ProposeIsr,
    ReplicationState,
    Role,
    StartFetcher,
    StartLogAt,
    StopFetcher,
    TruncateLog,
    dispatch_effects,
)
from gregor.common import errors
from gregor.common import isr as isr_logic
from gregor.controller.election import OfflineElection
from gregor.controller.membership import on_controller_failover, process_broker_change
from gregor.controller.partition_state_machine import trigger_online_partition_state_change
from gregor.controller.replica_assignment import assign_replicas_to_brokers
from gregor.controller.requests import (
    ControllerActions,
    LeaderAndIsrRequest,
    PartitionStateConflict,
    PartitionStateInfo,
    PartitionStateWrite,
    StopReplicaRequest,
    UpdateMetadataRequest,
    apply_writes_outcome,
    perform_partition_state_writes,
)
from gregor.controller.state import NO_LEADER, ControllerContext, LeaderAndIsr, PartitionState, TopicPartition
from gregor.controller.topics import on_new_partition_creation
from tests.sim.fakes import (
    STORE,
    EpochAnswer,
    EpochQuery,
    FakeClock,
    FetchPart,
    IsrWrite,
    IsrWriteResult,
    Network,
    PartAnswer,
    ReplicaFetch,
    ReplicaFetchAnswer,
    SimConfig,
    Store,
)

TP = TopicPartition("sim", 0)
T = TypeVar("T")
HISTORY_LEN = 25  # events kept for a failure message


class InvariantViolation(AssertionError):
    """A named invariant failed; the message carries the seed."""


@dataclass
class SimSlice:
    """The records of one read (native.FileSlice's length, for the session's news rule)."""

    length: int


@dataclass
class SimRead:
    """ReplicaManager.read's FetchResult for the in-memory log: what the fetch session looks at, and the records."""

    slice: SimSlice
    high_watermark: int
    records: tuple[tuple[int, int], ...]
    log_start_offset: int = 0


class SimLog:
    """The part of native.Log the fetch session reads: the log start (the simulated log never moves it)."""

    log_start_offset = 0


class LeaderView:
    """The broker's partition as the production fetch session sees a Partition (replica_fetch_server), one per broker."""

    key = TP
    log = SimLog()

    def __init__(self, broker: "Broker") -> None:
        self.broker = broker

    @property
    def log_end_offset(self) -> int:
        return self.broker.leo

    @property
    def is_leader(self) -> bool:
        return self.broker.rs.is_leader

    @property
    def leader_epoch(self) -> int:
        return self.broker.rs.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self.broker.rs.high_watermark


@dataclass
class Broker:
    """One replica: an in-memory log (with its epoch cache) driving the production ReplicationState.

    The log, its epoch entries and the HW checkpoint survive restarts; everything else is volatile.
    """

    id: int
    cfg: SimConfig
    log: list[tuple[int, int]] = field(default_factory=list)  # (leader epoch, value) per offset
    epochs: list[tuple[int, int]] = field(default_factory=list)
    hw_checkpoint: int = 0
    alive: bool = True
    paused: bool = False
    # Cut off from etcd and the controllers (a zombie): no session renewal, no ISR writes.
    isolated: bool = False
    broker_epoch: int = -1
    rs: ReplicationState = field(init=False)
    fence: ControlRequestFence = field(default_factory=ControlRequestFence)
    heard_from: set[int] = field(default_factory=set)  # followers that fetched in this term (observation only)
    pending_acks: dict[int, int] = field(default_factory=dict)  # the DelayedProduce purgatory: offset -> value
    # The production follower fetch state for the leader we copy from (StartFetcher .. StopFetcher), or None.
    fetcher: FollowerFetchState[TopicPartition] | None = None
    fetcher_leader: int = -1
    stream_id: int = 0  # the ReplicaFetch stream to the leader; a new one opens a new session there
    stream_open: bool = False
    inflight_id: int = 0
    inflight_since_ms: int = -1
    inflight_parts: dict[TopicPartition, tuple[PartitionFetchState, int]] = field(default_factory=dict)
    inflight_truncation: tuple[PartitionFetchState, int] | None = None  # (state, asked epoch)
    out_of_range_hw: int | None = None  # the leader's HW from its OFFSET_OUT_OF_RANGE (ListOffsets latest)
    # The leader side of the fetch sessions: the production ReplicaFetchSession per (follower, stream).
    sessions: dict[tuple[int, int], ReplicaFetchSession] = field(default_factory=dict)
    last_shrink_check_ms: int = 0
    view: LeaderView = field(init=False)

    def __post_init__(self) -> None:
        self.view = LeaderView(self)
        self.reset_volatile()

    def reset_volatile(self) -> None:
        """A (re)started broker: a fresh ReplicationState with the HW from its checkpoint file."""
        self.rs = ReplicationState(self.id, self.cfg.replica_lag_time_max_ms, TP.topic, TP.partition)
        self.rs.load_high_watermark(self.hw_checkpoint, 0, self.leo)
        self.fence = ControlRequestFence()
        self.heard_from, self.pending_acks, self.sessions = set(), {}, {}
        self.stop_fetcher()

    def stop_fetcher(self) -> None:
        self.fetcher, self.fetcher_leader, self.stream_open = None, -1, False
        self.inflight_since_ms, self.inflight_parts, self.inflight_truncation = -1, {}, None
        self.out_of_range_hw = None

    # -- views for the invariants and the scripted tests ------------------------------------
    @property
    def leo(self) -> int:
        return len(self.log)

    @property
    def hw(self) -> int:
        return self.rs.high_watermark

    @property
    def role(self) -> str | None:
        return None if self.rs.role is Role.NONE else self.rs.role.value

    @property
    def leader_epoch(self) -> int:
        return self.rs.leader_epoch

    @property
    def leader_id(self) -> int:
        return self.rs.leader_id

    @property
    def isr(self) -> list[int]:
        return sorted(self.rs.isr)

    # -- the log (what gregor_native.Log does on a real broker) ------------------------------------
    def truncate_to(self, offset: int) -> None:
        del self.log[offset:]
        # Trim epochs even when no record goes: an empty epoch at the LEO would make the
        # follower ask about it again and again (see isr.truncate_epoch_entries).
        self.epochs = isr_logic.truncate_epoch_entries(self.epochs, offset)

    def append(self, epoch: int, value: int) -> int:
        self.epochs = isr_logic.assign_epoch_start_offset(self.epochs, epoch, self.leo)
        self.log.append((epoch, value))
        return self.leo - 1

    def latest_epoch(self) -> int | None:
        return self.epochs[-1][0] if self.epochs else None

    def apply_log_effects(self, effects: list[Effect]) -> list[Effect]:
        """Partition.apply_log_effects for the in-memory log."""
        rest: list[Effect] = []
        for e in effects:
            if isinstance(e, TruncateLog):
                self.truncate_to(e.offset)
            elif isinstance(e, StartLogAt):
                raise AssertionError("the simulated log never moves its start offset")
            else:
                rest.append(e)
        return rest




class SimController:
    """One controller instance; the active one drives elections from registrations and the store."""

    def __init__(self, node_id: int, sim: Simulation) -> None:
        self.id, self.sim = node_id, sim
        self.ctx = ControllerContext()
        self.active = False
        self.zombie_until_ms = -1

    def election(self) -> OfflineElection:
        return OfflineElection(allow_unclean=self.sim.cfg.unclean_leader_election)

    def failover(self) -> None:
        """Become active: bump the controller epoch, load the context from the store, onControllerFailover."""
        sim = self.sim
        sim.store.controller_epoch += 1
        self.active = True
        ctx = self.ctx = ControllerContext(epoch=sim.store.controller_epoch)
        ctx.live_broker_epochs = sim.store.live_registrations(sim.clock.now_ms)
        ctx.all_topics.add(TP.topic)
        if sim.assignment:
            ctx.update_partition_replica_assignment(TP, sim.assignment)
        if sim.store.state is not None:
            ctx.put_partition_leadership_info(TP, sim.store.state)
        actions = ControllerActions()
        if sim.assignment and sim.store.state is None:
            on_new_partition_creation(ctx, [TP], actions)
        else:
            on_controller_failover(ctx, actions, self.election())
        self.apply(actions)

    def tick(self) -> None:
        sim = self.sim
        now = sim.clock.now_ms
        if not self.active:
            return
        if self.zombie_until_ms >= 0 and now > self.zombie_until_ms:
            self.active = False
            return
        # Like Kafka reading partition state from ZooKeeper before acting on it.
        if sim.store.state is not None:
            self.ctx.put_partition_leadership_info(TP, sim.store.state)
        actions = ControllerActions()
        current = sim.store.live_registrations(now)
        if current != self.ctx.live_broker_epochs:
            process_broker_change(self.ctx, current, actions, self.election())
        if sim.store.isr_change_notifications and self.zombie_until_ms < 0:
            sim.store.isr_change_notifications.clear()
            actions.batch.add_update_metadata(self.ctx.live_or_shutting_down_broker_ids, [TP])
        if self.ctx.partition_state(TP) is PartitionState.OFFLINE:
            trigger_online_partition_state_change(self.ctx, actions, self.election())
        self.apply(actions)

    def apply(self, actions: ControllerActions) -> None:
        """Controller.apply_actions: the production write driver (compare-and-swap, re-run on a lost compare)
        against the fake store, which loses some compares on purpose (SimConfig.controller_write_conflict_probability)."""
        sim = self.sim

        async def write(w: PartitionStateWrite) -> None:
            # A create compares the key's absence, which no concurrent writer fakes: only updates lose compares.
            if (w.expected_partition_epoch is not None
                    and sim.conflict_rng.random() < sim.cfg.controller_write_conflict_probability):
                # A leader's ISR write lands between the controller's read and its write (seed 000); with
                # none on its way, the compare fails anyway (another revision of the key).
                if not sim.flush_isr_writes():
                    sim.injected_conflicts += 1
                    raise PartitionStateConflict("injected by the fake store")
            if not sim.store.cas_state(w.expected_partition_epoch, w.new_state, self.ctx.epoch):
                if self.ctx.epoch != sim.store.controller_epoch:
                    raise _ControllerMoved()
                raise PartitionStateConflict(f"partition epoch is not {w.expected_partition_epoch}")

        async def load(tp: TopicPartition) -> LeaderAndIsr | None:
            return sim.store.state

        try:
            outcome = run_sync(perform_partition_state_writes(actions.writes, self.ctx.epoch, write, load))
        except _ControllerMoved:
            self.active = False  # ControllerMovedException: resign.
            return
        sim.write_retries += outcome.retries
        apply_writes_outcome(self.ctx, actions, outcome)
        if actions.unclean_elections:
            sim.unclean_elections += actions.unclean_elections
            if not sim.cfg.unclean_leader_election:
                sim.violate("unclean_election_only_when_enabled", "controller ran an unclean election")
        for broker_id, requests in actions.batch.build(self.ctx, self.id).items():
            for request in requests:
                sim.network.send(sim.clock.now_ms, self.id, broker_id, request, reliable=True, control=True)


class _ControllerMoved(Exception):
    """The fake store's controller epoch moved on (Kafka's ControllerMovedException)."""


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the fakes answer at once) without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("a simulated store call suspended")


class Simulation:
    """The whole cluster, stepped one tick at a time with invariants checked after each step."""

    def __init__(self, seed: int, cfg: SimConfig | None = None) -> None:
        self.seed = seed
        self.cfg = cfg or SimConfig()
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.network = Network(self.rng, self.cfg)
        self.store = Store()
        self.brokers = {i: Broker(i, self.cfg) for i in range(1, self.cfg.n_brokers + 1)}
        for b in self.brokers.values():
            b.broker_epoch = self.store.register(b.id, 0, self.cfg.session_timeout_ms)
        self.assignment = tuple(
            assign_replicas_to_brokers(1, self.cfg.n_brokers, list(self.brokers), rng=self.rng)[0]
        )
        self.controllers = [SimController(100, self), SimController(101, self)]
        self.acked: dict[int, int] = {}
        self.consumed: dict[int, int] = {}  # offset -> value a consumer read
        self.next_value = 0
        self.unclean_elections = 0
        # The fake store's injected compare failures draw from their own stream, so the schedule's draws stay put.
        self.conflict_rng = random.Random(seed * 7919 + 17)
        self.injected_conflicts = 0
        self.isr_races = 0  # controller writes that lost their compare to a leader's ISR write
        self.write_retries = 0
        # Follower requests by kind; "no_news": leader answers the production session left empty (nothing moved).
        self.fetches = {"full": 0, "incremental": 0, "no_news": 0}
        self.leader_by_epoch: dict[int, int] = {}
        self.max_hw: dict[int, int] = {}
        self.steps = 0
        self.history: list[str] = []
        self.controllers[0].failover()

    # -- faults --------------------------------------------------------------

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].alive = False
        self.record(f"fault: kill {broker_id}")

    def restart(self, broker_id: int, torn_tail: bool = False) -> None:
        """Start a dead broker again; with `torn_tail` the unflushed end of its log is gone.

        The torn tail loses only records above every broker's HW (never a committed one):
        when every ISR member loses an unflushed acknowledged tail, Kafka loses it too (no
        ISR member survived intact), which is not what no_acked_record_lost checks.
        """
        b = self.brokers[broker_id]
        if b.alive:
            return
        b.alive, b.paused, b.isolated = True, False, False
        committed = max([x.hw for x in self.brokers.values()] + [o + 1 for o in [*self.acked, *self.consumed]])
        if torn_tail and b.leo > committed:
            cut = b.leo - self.rng.randint(1, b.leo - committed)
            b.truncate_to(cut)
            self.record(f"fault: broker {broker_id} restarts with a torn tail at {cut}")
        if self.cfg.truncation == "hw":
            b.truncate_to(b.hw_checkpoint)  # Pre-0.11 brokers truncated to the HW checkpoint on restart.
        b.reset_volatile()
        self.max_hw[b.id] = b.hw
        b.broker_epoch = self.store.register(b.id, self.clock.now_ms, self.cfg.session_timeout_ms)
        self.record(f"fault: restart {broker_id} at broker epoch {b.broker_epoch}")

    def restart_torn(self, broker_id: int) -> None:
        """Kill and restart at once, losing the log's unflushed tail."""
        self.kill(broker_id)
        self.restart(broker_id, torn_tail=True)

    def pause(self, broker_id: int) -> None:
        self.brokers[broker_id].paused = True
        self.record(f"fault: pause {broker_id}")

    def unpause(self, broker_id: int) -> None:
        self.brokers[broker_id].paused = False

    def cut(self, a: int, b: int) -> None:
        """Cut one link; between two brokers the controllers still see both."""
        self.network.cut.add(frozenset((a, b)))
        self.record(f"fault: cut {a}-{b}")

    def partition_leader(self, n_followers: int) -> None:
        """Cut the current leader from some of its followers while the controllers still see everyone."""
        state = self.store.state
        if state is None or state.leader not in self.brokers:
            return
        others = [r for r in sorted(self.brokers) if r != state.leader]
        for f in self.rng.sample(others, max(1, min(n_followers, len(others)))):
            self.cut(state.leader, f)

    def zombie(self, broker_id: int) -> None:
        """Cut a broker from etcd and the controllers but not from clients and brokers.

        Its session expires, a new leader is elected with a newer epoch, but the
        isolated broker still believes it leads at the old one (a zombie leader):
        followers, writes to etcd and the new epoch must fence it.
        """
        b = self.brokers[broker_id]
        b.isolated = True
        for node in (STORE, *(c.id for c in self.controllers)):
            self.network.cut.add(frozenset((broker_id, node)))
        self.record(f"fault: zombie {broker_id} (leader epoch {b.leader_epoch}, role {b.role})")

    def heal(self) -> None:
        self.network.cut.clear()
        for b in self.brokers.values():
            b.isolated = False

    def heal_all(self) -> None:
        """End every fault: heal links, resume paused brokers, restart dead ones, make sure a controller is active.

        If control requests were lost, a controller failover resends every partition's state
        (the recovery a lost request gets in Kafka too: the next controller event).
        """
        self.heal()
        for b in self.brokers.values():
            self.unpause(b.id)
            self.restart(b.id)
        lost = self.network.lost_control
        self.cfg.control_drop_probability = 0.0
        if lost or not any(c.active and c.zombie_until_ms < 0 for c in self.controllers):
            self.controller_failover()

    def controller_failover(self) -> None:
        """The standby takes over with a new epoch; the old one lingers as a zombie for a while."""
        old = next((c for c in self.controllers if c.active and c.zombie_until_ms < 0), None)
        new = next(c for c in self.controllers if c is not old)
        if old is not None:
            old.zombie_until_ms = self.clock.now_ms + self.rng.randint(0, 500)
        new.zombie_until_ms = -1
        new.failover()
        self.record(f"fault: controller failover to {new.id} (controller epoch {new.ctx.epoch})")

    # -- stepping ------------------------------------------------------------

    def step(self) -> None:
        self.steps += 1
        self.clock.now_ms += self.cfg.tick_ms
        now = self.clock.now_ms
        paused = {b.id for b in self.brokers.values() if b.paused}
        for src, dst, msg in self.network.due(now, paused):
            self.deliver(src, dst, msg)
        for b in self.brokers.values():
            if b.alive and not b.paused:
                self.broker_tick(b)
        for c in self.controllers:
            c.tick()
        if self.rng.random() < self.cfg.produce_probability:
            self.produce()
        self.consume()
        self.check_invariants()

    def run(self, n_steps: int) -> None:
        for _ in range(n_steps):
            self.step()

    def run_until(self, predicate: Any, max_steps: int = 400) -> None:
        """Step until predicate(self) holds; fails loudly (with the seed) if it never does."""
        for _ in range(max_steps):
            if predicate(self):
                return
            self.step()
        if not predicate(self):
            raise AssertionError(f"condition not reached in {max_steps} steps (seed={self.seed})")

    def deliver(self, src: int, dst: int, msg: Any) -> None:
        if dst in self.brokers:
            b = self.brokers[dst]
            if not b.alive:
                return
            if isinstance(msg, (LeaderAndIsrRequest, StopReplicaRequest, UpdateMetadataRequest)):
                self.handle_control(b, msg)
            elif isinstance(msg, ReplicaFetch):
                self.network.send(self.clock.now_ms, b.id, src, self.handle_replica_fetch(b, src, msg))
            elif isinstance(msg, EpochQuery):
                self.network.send(self.clock.now_ms, b.id, src, self.handle_epoch_query(b, msg))
            elif isinstance(msg, ReplicaFetchAnswer):
                self.handle_fetch_answer(b, src, msg)
            elif isinstance(msg, EpochAnswer):
                self.handle_epoch_answer(b, src, msg)
            elif isinstance(msg, IsrWriteResult):
                self.handle_isr_write_result(b, msg)
        elif dst == STORE and isinstance(msg, IsrWrite):
            self.handle_isr_write(src, msg)

    def client_target(self) -> Broker | None:
        """The running broker a client believes leads (the metadata is sometimes stale), or None."""
        state = self.store.state
        if state is None:
            return None
        target = state.leader
        if self.rng.random() < self.cfg.stale_metadata_probability:
            target = self.rng.choice(list(self.brokers))
        b = self.brokers.get(target)
        return b if b is not None and b.alive and not b.paused else None

    def produce(self) -> None:
        """A client with acks=all sends to the leader it believes in (sometimes stale)."""
        b = self.client_target()
        if b is None:
            return
        try:
            b.rs.check_append(-1, self.cfg.min_insync_replicas)  # NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS
        except errors.GregorError:
            return
        self.next_value += 1
        offset = b.append(b.rs.leader_epoch, self.next_value)
        b.pending_acks[offset] = self.next_value
        self.run_effects(b, b.rs.on_local_append(b.leo, self.clock.now_ms))

    def consume(self) -> None:
        """A consumer fetches from the leader it believes in (sometimes stale), below what the broker allows."""
        b = self.client_target()
        if b is None:
            return
        try:
            b.rs.check_leader()
        except errors.GregorError:
            return
        upper = b.rs.fetch_upper_bound(False, b.leo)
        for offset in range(len(self.consumed), min(upper, len(self.consumed) + self.cfg.fetch_records_max)):
            self.consumed[offset] = b.log[offset][1]

    # -- broker side: the drivers of ReplicationState ---------------------------------------------

    def run_effects(self, b: Broker, effects: list[Effect]) -> None:
        """What ReplicaManager.run_effects does: the log effects on the log, the rest through the production
        dispatch_effects, which calls the four EffectRunner methods below (the simulation's IO for them)."""
        dispatch_effects(b, b.apply_log_effects(effects), self)

    def start_fetcher(self, b: Broker, e: StartFetcher) -> None:
        """ReplicaFetcherManager.add_partition: the partition joins the fetcher for its leader."""
        if b.fetcher is None or b.fetcher_leader != e.leader_id:
            b.stop_fetcher()
            b.fetcher = FollowerFetchState(
                refresh_after=self.cfg.replica_lag_time_max_ms / REPLICA_FETCH_SESSION_REFRESH_PARTS,
                backoff=self.cfg.replica_fetch_backoff_ms)
            b.fetcher_leader = e.leader_id
        b.fetcher.add(TP, e.leader_epoch)
        b.out_of_range_hw = None
        if self.cfg.truncation == "hw":  # the pre-0.11 mutant: truncate to the HW, skip leader epochs
            b.truncate_to(b.hw)
            b.rs.finish_truncation(b.leo)

    def stop_fetcher(self, b: Broker) -> None:
        if b.fetcher is not None:
            b.fetcher.drop(TP)

    def propose_isr(self, b: Broker, e: ProposeIsr) -> None:
        """IsrManager.write_isr: the proposal travels to the (fake) etcd."""
        self.network.send(self.clock.now_ms, b.id, STORE, IsrWrite(e), reliable=True)

    def complete_delayed(self, b: Broker) -> None:
        """The DelayedProduce purgatory: each parked acks=all append ends as the production rule
        (ReplicationState.acks_all_outcome) says: acked once the HW passed it, failed if leadership moved first."""
        for offset in list(b.pending_acks):
            outcome = b.rs.acks_all_outcome(offset)
            if outcome is True:
                self.acked[offset] = b.pending_acks.pop(offset)
            elif outcome is False:
                del b.pending_acks[offset]

    def handle_control(self, b: Broker, req: Any) -> None:
        """BrokerControlServicer: fence, then LeaderAndIsr / StopReplica through the ReplicationState."""
        try:
            b.fence.check(req.controller_epoch, req.broker_epoch, b.broker_epoch)
        except errors.GregorError:
            return
        if isinstance(req, LeaderAndIsrRequest):
            for info in req.partition_states:
                self.become_leader_or_follower(b, info)
        elif isinstance(req, StopReplicaRequest):
            self.record(f"broker {b.id}: StopReplica from controller epoch {req.controller_epoch}")
            self.run_effects(b, b.rs.on_stop_replica())

    def become_leader_or_follower(self, b: Broker, info: PartitionStateInfo) -> None:
        lai = info.leader_and_isr
        now = self.clock.now_ms
        outcome = b.rs.on_leader_and_isr(lai.leader, lai.leader_epoch, lai.isr, list(info.replicas),
                                         lai.partition_epoch, b.leo, 0, now)
        if not outcome.applied:
            self.record(f"broker {b.id}: LeaderAndIsr epoch {lai.leader_epoch}/{lai.partition_epoch} ignored "
                        f"(at {b.rs.leader_epoch}/{b.rs.partition_epoch}, {b.role})")
            return
        if StopFetcher() in outcome.effects or StartFetcher(lai.leader, lai.leader_epoch) in outcome.effects:
            self.record(f"broker {b.id}: {b.role} at epoch {lai.leader_epoch} (leader {lai.leader}, isr {lai.isr})")
            b.heard_from = set()
        if lai.leader == b.id:
            seen = self.leader_by_epoch.setdefault(lai.leader_epoch, b.id)
            if seen != b.id:
                self.violate("one_leader_per_epoch", f"epoch {lai.leader_epoch} led by {seen} and {b.id}")
            b.last_shrink_check_ms = now
        self.run_effects(b, outcome.effects)

    def broker_tick(self, b: Broker) -> None:
        now = self.clock.now_ms
        b.hw_checkpoint = b.hw  # replication-offset-checkpoint (every tick here, every 5 s on a broker)
        if not b.isolated and not self.store.keep_alive(b.id, b.broker_epoch, now, self.cfg.session_timeout_ms):
            # Session expired while paused or isolated: register again, as a broker does on a new session.
            b.broker_epoch = self.store.register(b.id, now, self.cfg.session_timeout_ms)
            self.record(f"broker {b.id}: registered again at broker epoch {b.broker_epoch}")
        if b.fetcher is not None and b.fetcher.partitions:
            self.fetcher_tick(b, now)
        rs = b.rs
        if rs.is_leader and now - b.last_shrink_check_ms >= isr_logic.isr_expiration_interval_ms(
            self.cfg.replica_lag_time_max_ms
        ):
            b.last_shrink_check_ms = now
            self.run_effects(b, rs.on_tick(b.leo, now))  # IsrManager.maybe_shrink_isr

    # -- the follower: ReplicaFetcher's IO over FollowerFetchState --------------------------------------------

    def current(self, b: Broker, st: PartitionFetchState) -> bool:
        """ReplicaFetcher._current: the production rule (FollowerFetchState.keep over
        ReplicationState.is_current_follower); a partition no longer followed at st's epoch leaves the fetcher."""
        assert b.fetcher is not None
        return b.fetcher.keep(TP, st, b.rs.is_current_follower(b.fetcher_leader, st.leader_epoch))

    def fetcher_tick(self, b: Broker, now: int) -> None:
        """One fetcher step: a timed-out exchange fails its partitions (REQUEST_TIMED_OUT, the stream resets);
        with none out, truncate what needs it (OffsetForLeaderEpoch) or send the session's next ReplicaFetch."""
        fetcher = b.fetcher
        assert fetcher is not None
        if b.inflight_since_ms >= 0:
            if now - b.inflight_since_ms <= self.cfg.request_timeout_ms:
                return
            b.inflight_since_ms, b.stream_open = -1, False
            if b.inflight_truncation is not None:
                st = b.inflight_truncation[0]
                b.inflight_truncation = None
                fetcher.on_error(TP, st, errors.Code.REQUEST_TIMED_OUT, now)
            for tp, (st, _offset) in b.inflight_parts.items():
                fetcher.on_error(tp, st, errors.Code.REQUEST_TIMED_OUT, now)
            b.inflight_parts = {}
        batch: list[tuple[TopicPartition, PartitionFetchState, int]] = []
        for tp, st in fetcher.ready(now):
            if not self.current(b, st):
                continue
            if b.rs.fetch_mode is FetchMode.TRUNCATING:
                query = b.rs.truncation_query(b.latest_epoch(), b.leo)  # Partition.truncation_query
                if isinstance(query, TruncateLog):
                    b.apply_log_effects([query])
                    self.finish_truncation(b, st)
                    continue
                b.inflight_id += 1
                b.inflight_since_ms, b.inflight_truncation = now, (st, query)
                self.network.send(now, b.id, b.fetcher_leader, EpochQuery(b.inflight_id, query, st.leader_epoch))
                return  # the simulated fetcher has one exchange out at a time
            batch.append((tp, st, b.leo))
        if not batch:
            return
        listed, incremental = fetcher.session_request(batch, not b.stream_open, now)
        self.fetches["incremental" if incremental else "full"] += 1
        if not b.stream_open:
            b.stream_id += 1
            b.stream_open = True
        b.inflight_id += 1
        b.inflight_since_ms = now
        b.inflight_parts = {tp: (st, offset) for tp, st, offset in batch}
        parts = tuple(FetchPart(batch[i][0], batch[i][2], batch[i][1].leader_epoch) for i in listed)
        self.network.send(now, b.id, b.fetcher_leader,
                          ReplicaFetch(b.inflight_id, b.stream_id, b.broker_epoch, incremental, parts))

    def finish_truncation(self, b: Broker, st: PartitionFetchState) -> None:
        """ReplicaFetcher._truncate's end: the out-of-range reset (ListOffsets), then fetching again."""
        assert b.fetcher is not None
        if st.out_of_range and b.out_of_range_hw is not None:
            extra = b.rs.on_leader_log_range(0, b.out_of_range_hw, b.leo)
            if extra is not None:
                b.apply_log_effects([extra])
        b.rs.finish_truncation(b.leo)
        b.fetcher.truncation_finished(st)
        b.out_of_range_hw = None

    def handle_epoch_query(self, b: Broker, q: EpochQuery) -> EpochAnswer:
        """The leader's OffsetForLeaderEpoch (BrokerServicer): fenced by the current leader epoch."""
        try:
            b.rs.check_leader(q.current_leader_epoch)
        except errors.GregorError as err:
            return EpochAnswer(q.req_id, -1, -1, err.name)
        epoch, end = isr_logic.end_offset_for_epoch(b.epochs, q.epoch, b.leo)
        return EpochAnswer(q.req_id, epoch, end)

    def handle_epoch_answer(self, b: Broker, src: int, a: EpochAnswer) -> None:
        if (b.fetcher is None or src != b.fetcher_leader or a.req_id != b.inflight_id
                or b.inflight_truncation is None):
            return
        st, asked = b.inflight_truncation
        b.inflight_since_ms, b.inflight_truncation = -1, None
        if not self.current(b, st) or b.rs.fetch_mode is not FetchMode.TRUNCATING:
            return
        if a.error:
            # An RPC error from OffsetForLeaderEpoch (ReplicaFetcher._truncate_guarded): truncate again, back off.
            b.rs.restart_truncation()
            b.fetcher.on_error(TP, st, errors.Code.Value(a.error), self.clock.now_ms)
            return
        effect, completed = b.rs.on_truncation_point(a.epoch, a.end_offset, b.epochs, b.leo)
        b.apply_log_effects([effect])
        if b.fetcher.truncation_round_done(st, completed, asked, b.latest_epoch()):
            self.finish_truncation(b, st)

    def handle_replica_fetch(self, b: Broker, follower: int, f: ReplicaFetch) -> ReplicaFetchAnswer:
        """The leader's ReplicaFetch through the production ReplicaFetchSession (replica_fetch_server): a full
        request replaces the stream's session, an incremental one updates the parts it names, and the answer
        carries only the session's partitions with news. Not modelled: parking an answer without news (the
        DelayedSessionFetch purgatory); it goes out empty at once."""
        key = (follower, f.stream_id)
        if f.incremental and key not in b.sessions:
            return ReplicaFetchAnswer(f.req_id, (), "NETWORK_EXCEPTION")  # no such stream here: it ended
        if not f.incremental:
            for old in [k for k in b.sessions if k[0] == follower]:
                del b.sessions[old]
            b.sessions[key] = ReplicaFetchSession()
        session = b.sessions[key]
        parts = [ReplicaFetchPart(p.tp.topic, p.tp.partition, p.offset, p.current_leader_epoch,
                                  self.cfg.fetch_records_max) for p in f.parts]
        # LeaderView and SimRead stand in for Partition and FetchResult (the attributes the session reads).
        listed = session.apply_request(parts, f.incremental, lambda part: self.open_for_follower(  # type: ignore
            b, follower, f.broker_epoch, part))
        self.check_session_covers_fetch(follower, f, session, listed)
        hosted = {TP: b.view} if b.alive else {}
        answered = session.news(listed, hosted)  # type: ignore[arg-type]
        session.sent(answered)
        if not answered:
            self.fetches["no_news"] += 1
        answers = []
        for entry, outcome in answered:
            part = entry.part
            tp = TopicPartition(part.topic, part.partition)
            if isinstance(outcome, errors.GregorError):
                answers.append(PartAnswer(tp, part.fetch_offset, (), b.hw, b.leo, outcome.name))
            else:
                read: SimRead = outcome  # type: ignore[assignment]
                answers.append(PartAnswer(tp, part.fetch_offset, read.records, read.high_watermark, b.leo))
        return ReplicaFetchAnswer(f.req_id, tuple(answers))

    def check_session_covers_fetch(self, follower: int, f: ReplicaFetch, session: ReplicaFetchSession,
                                   listed: dict[tuple[str, int], Any]) -> None:
        """Invariant fetch_session_covers_fetch: the follower's current request leaves every partition it is
        fetching in the leader's session (else that partition silently stops replicating until the next full
        request: the leader answers an errored part once and forgets it until it is named again)."""
        fb = self.brokers[follower]
        if f.req_id != fb.inflight_id or f.stream_id != fb.stream_id:
            return  # a late request of an earlier exchange or stream
        missing = sorted(str(tp) for tp in fb.inflight_parts
                         if tp not in session.entries
                         or (tp not in listed and isinstance(session.entries[tp].slot, errors.GregorError)))
        if missing:
            self.violate("fetch_session_covers_fetch",
                         f"broker {follower} fetches {missing} but its {'incremental' if f.incremental else 'full'} "
                         f"request left them out of leader {self.brokers[follower].fetcher_leader}'s session")

    def open_for_follower(self, b: Broker, follower: int, broker_epoch: int,
                          part: ReplicaFetchPart) -> tuple[LeaderView, Callable[[], SimRead], SimRead]:
        """handle_replica_fetch's open_part for the in-memory log: broker epoch, leader epoch and range checks
        (ReplicaManager.read), the first read, and the follower's fetch recorded in the ReplicationState."""
        rs = b.rs
        rs.check_follower_fetch(follower, broker_epoch, self.live_epoch(follower))

        def read() -> SimRead:
            rs.check_leader(part.current_leader_epoch)
            if part.fetch_offset > b.leo:
                raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"{part.fetch_offset} > LEO {b.leo}")
            records = tuple(b.log[part.fetch_offset : part.fetch_offset + part.max_bytes])
            return SimRead(SimSlice(len(records)), b.hw, records)

        result = read()
        b.heard_from.add(follower)
        self.run_effects(b, rs.on_follower_fetch(follower, part.fetch_offset, broker_epoch, b.leo, self.clock.now_ms))
        return b.view, read, result

    def live_epoch(self, broker_id: int) -> int | None:
        """The broker epoch the controller last saw registered (the metadata cache's live brokers)."""
        active = next((c for c in self.controllers if c.active and c.zombie_until_ms < 0), None)
        return active.ctx.live_broker_epochs.get(broker_id) if active is not None else None

    def handle_fetch_answer(self, b: Broker, src: int, r: ReplicaFetchAnswer) -> None:
        """ReplicaFetcher._fetch_loop's answer handling: per partition, an error or records to append."""
        fetcher = b.fetcher
        if fetcher is None or src != b.fetcher_leader or r.req_id != b.inflight_id or not b.inflight_parts:
            return
        inflight, now = b.inflight_parts, self.clock.now_ms
        b.inflight_since_ms, b.inflight_parts = -1, {}
        if r.error:
            b.stream_open = False  # the stream ended: the next request opens a new session
            for tp, (st, _offset) in inflight.items():
                fetcher.on_error(tp, st, errors.Code.Value(r.error), now)
            return
        for part in r.parts:
            item = inflight.get(part.tp)
            if item is None:
                continue
            st, fetch_offset = item
            if part.error:
                if not self.current(b, st):
                    continue
                outcome = fetcher.on_error(part.tp, st, errors.Code.Value(part.error), now)
                if outcome.restart_truncation:
                    if self.cfg.truncation == "hw":
                        b.truncate_to(part.leader_leo)
                        fetcher.truncation_finished(st)
                    else:
                        b.out_of_range_hw = part.hw
                        b.rs.restart_truncation()
                continue
            if not self.current(b, st) or b.leo != fetch_offset or b.rs.fetch_mode is not FetchMode.FETCHING:
                continue
            for epoch, value in part.records:
                b.append(epoch, value)
            self.run_effects(b, b.rs.on_follower_fetched(part.hw, b.leo))

    # -- the fake etcd -------------------------------------------------------------------------------------

    def handle_isr_write(self, src: int, w: IsrWrite) -> None:
        """IsrManager._write_isr against the fake etcd: the production rule (isr_after_proposal), then CAS."""
        p = w.proposal
        b = self.brokers[src]
        current = self.store.state
        result = IsrWriteResult(p.leader_epoch, None, -1)
        new = None
        if not b.isolated and current is not None:
            new = isr_after_proposal(current.leader, current.leader_epoch, list(current.isr), src, p)
        if current is not None and new is not None:
            # Like IsrManager, which rewrites only the state's "isr": every other field stays.
            state = replace(current, isr=tuple(new), partition_epoch=current.partition_epoch + 1)
            if tuple(new) == current.isr:
                result = IsrWriteResult(p.leader_epoch, current.isr, current.partition_epoch)
            elif self.store.cas_state(current.partition_epoch, state):
                self.store.isr_change_notifications.append(TP)
                self.record(f"broker {src}: ISR {current.isr} -> {state.isr} (epoch {p.leader_epoch})")
                result = IsrWriteResult(p.leader_epoch, state.isr, state.partition_epoch)
        self.network.send(self.clock.now_ms, STORE, src, result, reliable=True)

    def flush_isr_writes(self) -> bool:
        """Deliver the ISR writes on their way to the store now (they win the race with a controller write)."""
        net = self.network
        due = [item for item in net.in_flight if item[3] == STORE and isinstance(item[4], IsrWrite)
               and frozenset((item[2], STORE)) not in net.cut]
        if not due:
            return False
        net.in_flight = [item for item in net.in_flight if not any(item is d for d in due)]
        heapq.heapify(net.in_flight)
        for item in due:
            self.handle_isr_write(item[2], item[4])
        self.isr_races += 1
        return True

    def handle_isr_write_result(self, b: Broker, r: IsrWriteResult) -> None:
        self.run_effects(b, b.rs.on_isr_write_result(r.leader_epoch, r.isr, r.partition_epoch, b.leo,
                                                     self.clock.now_ms))

    # -- invariants ----------------------------------------------------------

    def record(self, event: str) -> None:
        """Keep a short history for the failure message."""
        self.history.append(f"t={self.clock.now_ms}ms {event}")
        del self.history[:-HISTORY_LEN]

    def violate(self, name: str, detail: str) -> None:
        history = "\n  ".join(self.history)
        raise InvariantViolation(
            f"invariant {name} violated at step {self.steps} (seed={self.seed}): {detail}\n"
            f"last events:\n  {history}")

    def check_invariants(self) -> None:
        """Check every named invariant; with unclean election enabled only the structural ones hold."""
        checks = {
            "hw_never_regresses": self.check_hw_never_regresses,
            "no_acked_record_lost": self.check_no_acked_record_lost,
            "replicas_agree_below_hw": self.check_replicas_agree_below_hw,
            "unclean_election_only_when_enabled": self.check_elections_from_isr,
        }
        if self.cfg.unclean_leader_election:
            checks = {}  # Data loss is the documented price of unclean election.
        for name, check in checks.items():
            if self.cfg.invariants is None or name in self.cfg.invariants:
                check()
        self.store.elections.clear()

    def converged(self) -> str | None:
        """None when there is one leader and every replica holds its log with the HW at the end; else why not."""
        state = self.store.state
        if state is None or state.leader not in self.brokers:
            return f"no leader: {state}"
        leader = self.brokers[state.leader]
        for b in self.brokers.values():
            if b.log != leader.log or b.hw != leader.leo:
                return f"broker {b.id} LEO {b.leo} HW {b.hw} vs leader {leader.id} LEO {leader.leo} HW {leader.hw}"
        return None

    def settle(self, max_steps: int) -> None:
        """Step (with invariants) until converged; a cluster that never converges violates eventually_consistent."""
        for _ in range(max_steps):
            if self.converged() is None:
                return
            self.step()
        why = self.converged()
        if why is not None:
            self.violate("eventually_consistent", why)

    def check_hw_never_regresses(self) -> None:
        """Within one incarnation of a broker; a restart starts from its HW checkpoint, which may lag."""
        for b in self.brokers.values():
            if b.hw < self.max_hw.get(b.id, 0):
                self.violate("hw_never_regresses", f"broker {b.id} HW {self.max_hw[b.id]} -> {b.hw}")
            self.max_hw[b.id] = b.hw

    def check_no_acked_record_lost(self) -> None:
        """Every acked or consumed record sits at its offset on the established leader and on every replica
        whose HW passed it (a consumer that read above the HW could see a record that is later truncated)."""
        state = self.store.state
        established = None
        if state is not None and state.leader in self.brokers:
            leader = self.brokers[state.leader]
            if leader.alive and leader.role == "leader" and leader.leader_epoch == state.leader_epoch:
                established = leader
        for offset, value in [*self.acked.items(), *self.consumed.items()]:
            for b in self.brokers.values():
                if (b.hw > offset or b is established) and (offset >= b.leo or b.log[offset][1] != value):
                    got = b.log[offset] if offset < b.leo else None
                    self.violate("no_acked_record_lost", f"offset {offset}={value} acked; broker {b.id} has {got}")

    def check_replicas_agree_below_hw(self) -> None:
        bs = list(self.brokers.values())
        for i, a in enumerate(bs):
            for c in bs[i + 1 :]:
                upto = min(a.hw, c.hw)
                if a.log[:upto] != c.log[:upto]:
                    first = next(o for o in range(upto) if a.log[o] != c.log[o])
                    self.violate(
                        "replicas_agree_below_hw",
                        f"brokers {a.id} and {c.id} differ at offset {first}: {a.log[first]} vs {c.log[first]}",
                    )

    def check_elections_from_isr(self) -> None:
        for previous, new in self.store.elections:
            if previous is not None and new.leader not in (NO_LEADER, previous.leader) and new.leader not in previous.isr:
                self.violate(
                    "unclean_election_only_when_enabled",
                    f"leader {new.leader} elected outside ISR {previous.isr} (epoch {new.leader_epoch})",
                )
