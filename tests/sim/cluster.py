"""A seeded, in-memory cluster of one partition's replicas and a controller, built on the pure controller logic."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from gregor.controller import isr as isr_logic
from gregor.controller.election import OfflineElection
from gregor.controller.membership import on_controller_failover, process_broker_change
from gregor.controller.partition_state_machine import trigger_online_partition_state_change
from gregor.controller.replica_assignment import assign_replicas_to_brokers
from gregor.controller.requests import (
    ControllerActions,
    LeaderAndIsrRequest,
    PartitionStateInfo,
    StopReplicaRequest,
    UpdateMetadataRequest,
)
from gregor.controller.state import NO_LEADER, ControllerContext, LeaderAndIsr, PartitionState, TopicPartition
from gregor.controller.topics import on_new_partition_creation

TP = TopicPartition("sim", 0)


class InvariantViolation(AssertionError):
    """A named invariant failed; the message carries the seed."""


@dataclass
class SimConfig:
    """Knobs of one run; times are scaled down from Kafka's defaults to keep runs short."""

    n_brokers: int = 3
    tick_ms: int = 50
    replica_lag_time_max_ms: int = 1_000
    session_timeout_ms: int = 600
    delay_ms_max: int = 150
    drop_probability: float = 0.05
    produce_probability: float = 0.5
    stale_metadata_probability: float = 0.2
    min_insync_replicas: int = 1
    unclean_leader_election: bool = False
    fetch_records_max: int = 20
    request_timeout_ms: int = 400
    # "epoch" truncates by leader epoch (KIP-101); "hw" is the pre-0.11 rule, kept to show the invariants bite.
    truncation: str = "epoch"
    # Names of the invariants to check; None checks all that apply.
    invariants: frozenset[str] | None = None


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0


class Network:
    """Delivers messages after a random delay; drops some; honours cut links; holds mail for paused nodes."""

    def __init__(self, rng: random.Random, cfg: SimConfig) -> None:
        self.rng, self.cfg = rng, cfg
        self.in_flight: list[tuple[int, int, int, int, Any, bool]] = []
        self.cut: set[frozenset[int]] = set()
        self._seq = 0

    def send(self, now_ms: int, src: int, dst: int, msg: Any, reliable: bool = False) -> None:
        """Queue a message; `reliable` ones (the controller channel retries) are never dropped."""
        if not reliable and self.rng.random() < self.cfg.drop_probability:
            return
        self._seq += 1
        at = now_ms + self.rng.randint(1, self.cfg.delay_ms_max)
        heapq.heappush(self.in_flight, (at, self._seq, src, dst, msg, reliable))

    def due(self, now_ms: int, paused: set[int]) -> list[tuple[int, int, Any]]:
        out, held = [], []
        while self.in_flight and self.in_flight[0][0] <= now_ms:
            item = heapq.heappop(self.in_flight)
            _, _, src, dst, msg, reliable = item
            if dst in paused:
                held.append(item)
            elif frozenset((src, dst)) in self.cut:
                if reliable:  # The controller channel keeps retrying until the link heals.
                    held.append(item)
            else:
                out.append((src, dst, msg))
        for at, seq, src, dst, msg, reliable in held:
            heapq.heappush(self.in_flight, (max(at, now_ms) + self.cfg.tick_ms, seq, src, dst, msg, reliable))
        return out


@dataclass
class Store:
    """Fake etcd: the partition state with compare-and-swap, the controller epoch, broker leases."""

    controller_epoch: int = 0
    state: LeaderAndIsr | None = None
    registrations: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> (epoch, lease expiry)
    revision: int = 0
    isr_change_notifications: list[TopicPartition] = field(default_factory=list)
    elections: list[tuple[LeaderAndIsr | None, LeaderAndIsr]] = field(default_factory=list)

    def register(self, broker_id: int, now_ms: int, ttl_ms: int) -> int:
        self.revision += 1
        self.registrations[broker_id] = (self.revision, now_ms + ttl_ms)
        return self.revision

    def keep_alive(self, broker_id: int, epoch: int, now_ms: int, ttl_ms: int) -> bool:
        reg = self.registrations.get(broker_id)
        if reg is None or reg[0] != epoch or reg[1] < now_ms:
            return False
        self.registrations[broker_id] = (epoch, now_ms + ttl_ms)
        return True

    def live_registrations(self, now_ms: int) -> dict[int, int]:
        self.registrations = {b: r for b, r in self.registrations.items() if r[1] >= now_ms}
        return {b: r[0] for b, r in self.registrations.items()}

    def cas_state(self, expected: int | None, new: LeaderAndIsr, controller_epoch: int | None = None) -> bool:
        """Write the state if the compare holds; controller writes also compare the controller epoch."""
        if controller_epoch is not None and controller_epoch != self.controller_epoch:
            return False
        if expected is None:
            if self.state is not None:
                return False
        elif self.state is None or self.state.partition_epoch != expected:
            return False
        if new.leader_epoch != (self.state.leader_epoch if self.state else -1):
            self.elections.append((self.state, new))
        self.state = new
        return True


@dataclass
class Broker:
    """One replica of the partition. Log, epoch cache and HW survive restarts; the rest is volatile."""

    id: int
    log: list[tuple[int, int]] = field(default_factory=list)  # (leader epoch, value) per offset
    epochs: list[tuple[int, int]] = field(default_factory=list)
    hw: int = 0
    alive: bool = True
    paused: bool = False
    broker_epoch: int = -1
    controller_epoch_seen: int = -1
    role: str | None = None
    leader_id: int = NO_LEADER
    leader_epoch: int = -1
    partition_epoch: int = -1
    isr: list[int] = field(default_factory=list)
    replicas: tuple[int, ...] = ()
    followers: dict[int, isr_logic.FollowerFetchState] = field(default_factory=dict)
    heard_from: set[int] = field(default_factory=set)
    pending_acks: dict[int, int] = field(default_factory=dict)
    fetch_mode: str | None = None  # "truncating" | "fetching"
    inflight_id: int = 0
    inflight_since_ms: int = -1
    last_shrink_check_ms: int = 0

    @property
    def leo(self) -> int:
        return len(self.log)

    def reset_volatile(self) -> None:
        self.role, self.leader_id, self.leader_epoch, self.partition_epoch = None, NO_LEADER, -1, -1
        self.isr, self.followers, self.heard_from, self.pending_acks = [], {}, set(), {}
        self.fetch_mode, self.inflight_since_ms, self.controller_epoch_seen = None, -1, -1

    def truncate_to(self, offset: int) -> None:
        del self.log[offset:]
        # Trim epochs even when no record goes: an empty epoch at the LEO would make the
        # follower ask about it again and again (see isr.truncate_epoch_entries).
        self.epochs = isr_logic.truncate_epoch_entries(self.epochs, offset)
        self.hw = min(self.hw, self.leo)

    def append(self, epoch: int, value: int) -> int:
        self.epochs = isr_logic.assign_epoch_start_offset(self.epochs, epoch, self.leo)
        self.log.append((epoch, value))
        return self.leo - 1


@dataclass(frozen=True)
class Fetch:
    req_id: int
    offset: int
    current_leader_epoch: int


@dataclass(frozen=True)
class FetchResponse:
    req_id: int
    offset: int
    records: tuple[tuple[int, int], ...]
    hw: int
    leader_leo: int
    error: str | None = None


@dataclass(frozen=True)
class EpochQuery:
    req_id: int
    epoch: int
    current_leader_epoch: int


@dataclass(frozen=True)
class EpochAnswer:
    req_id: int
    epoch: int
    end_offset: int
    error: str | None = None


@dataclass(frozen=True)
class Produce:
    value: int


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
        sim = self.sim
        for write in actions.writes:
            if not sim.store.cas_state(write.expected_partition_epoch, write.new_state, self.ctx.epoch):
                if self.ctx.epoch != sim.store.controller_epoch:
                    self.active = False  # ControllerMovedException: resign.
                    return
                # Stale view: reload, drop the requests for it, retry on the next tick.
                actions.batch.discard_partitions([write.topic_partition])
                if sim.store.state is not None:
                    self.ctx.put_partition_leadership_info(TP, sim.store.state)
                    if not self.ctx.is_replica_online(sim.store.state.leader, TP):
                        self.ctx.put_partition_state(TP, PartitionState.OFFLINE)
                break
        if actions.unclean_elections:
            sim.unclean_elections += actions.unclean_elections
            if not sim.cfg.unclean_leader_election:
                sim.violate("unclean_election_only_when_enabled", "controller ran an unclean election")
        for broker_id, requests in actions.batch.build(self.ctx, self.id).items():
            for request in requests:
                sim.network.send(sim.clock.now_ms, self.id, broker_id, request, reliable=True)


class Simulation:
    """The whole cluster, stepped one tick at a time with invariants checked after each step."""

    def __init__(self, seed: int, cfg: SimConfig | None = None) -> None:
        self.seed = seed
        self.cfg = cfg or SimConfig()
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self.network = Network(self.rng, self.cfg)
        self.store = Store()
        self.brokers = {i: Broker(i) for i in range(1, self.cfg.n_brokers + 1)}
        for b in self.brokers.values():
            b.broker_epoch = self.store.register(b.id, 0, self.cfg.session_timeout_ms)
        self.assignment = tuple(
            assign_replicas_to_brokers(1, self.cfg.n_brokers, list(self.brokers), rng=self.rng)[0]
        )
        self.controllers = [SimController(100, self), SimController(101, self)]
        self.acked: dict[int, int] = {}
        self.next_value = 0
        self.unclean_elections = 0
        self.leader_by_epoch: dict[int, int] = {}
        self.max_hw: dict[int, int] = {}
        self.steps = 0
        self.controllers[0].failover()

    # -- faults --------------------------------------------------------------

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].alive = False

    def restart(self, broker_id: int) -> None:
        b = self.brokers[broker_id]
        if b.alive:
            return
        b.alive, b.paused = True, False
        b.reset_volatile()
        if self.cfg.truncation == "hw":
            b.truncate_to(b.hw)  # Pre-0.11 brokers truncated to the HW checkpoint on restart.
        b.broker_epoch = self.store.register(b.id, self.clock.now_ms, self.cfg.session_timeout_ms)

    def pause(self, broker_id: int) -> None:
        self.brokers[broker_id].paused = True

    def unpause(self, broker_id: int) -> None:
        self.brokers[broker_id].paused = False

    def cut(self, a: int, b: int) -> None:
        self.network.cut.add(frozenset((a, b)))

    def heal(self) -> None:
        self.network.cut.clear()

    def heal_all(self) -> None:
        """End every fault: heal links, resume paused brokers, restart dead ones, make sure a controller is active."""
        self.heal()
        for b in self.brokers.values():
            self.unpause(b.id)
            self.restart(b.id)
        if not any(c.active and c.zombie_until_ms < 0 for c in self.controllers):
            self.controller_failover()

    def controller_failover(self) -> None:
        """The standby takes over with a new epoch; the old one lingers as a zombie for a while."""
        old = next((c for c in self.controllers if c.active and c.zombie_until_ms < 0), None)
        new = next(c for c in self.controllers if c is not old)
        if old is not None:
            old.zombie_until_ms = self.clock.now_ms + self.rng.randint(0, 500)
        new.zombie_until_ms = -1
        new.failover()

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
            elif isinstance(msg, Fetch):
                self.network.send(self.clock.now_ms, b.id, src, self.handle_fetch(b, src, msg))
            elif isinstance(msg, EpochQuery):
                self.network.send(self.clock.now_ms, b.id, src, self.handle_epoch_query(b, msg))
            elif isinstance(msg, FetchResponse):
                self.handle_fetch_response(b, msg)
            elif isinstance(msg, EpochAnswer):
                self.handle_epoch_answer(b, msg)

    def produce(self) -> None:
        """A client with acks=all sends to the leader it believes in (sometimes stale)."""
        state = self.store.state
        if state is None:
            return
        target = state.leader
        if self.rng.random() < self.cfg.stale_metadata_probability:
            target = self.rng.choice(list(self.brokers))
        b = self.brokers.get(target)
        if b is None or not b.alive or b.paused or b.role != "leader":
            return
        if len(b.isr) < self.cfg.min_insync_replicas:
            return  # NOT_ENOUGH_REPLICAS
        self.next_value += 1
        offset = b.append(b.leader_epoch, self.next_value)
        b.pending_acks[offset] = self.next_value
        self.maybe_increment_leader_hw(b)

    # -- broker side -----------------------------------------------------------

    def handle_control(self, b: Broker, req: Any) -> None:
        # Fencing: drop requests from an older controller or for an earlier incarnation of this broker.
        if req.controller_epoch < b.controller_epoch_seen or req.broker_epoch != b.broker_epoch:
            return
        b.controller_epoch_seen = req.controller_epoch
        if isinstance(req, LeaderAndIsrRequest):
            for info in req.partition_states:
                self.become_leader_or_follower(b, info)
        elif isinstance(req, StopReplicaRequest):
            # The partition is gone from this broker: the next LeaderAndIsr starts it afresh.
            b.role, b.fetch_mode, b.leader_epoch, b.partition_epoch = None, None, -1, -1

    def become_leader_or_follower(self, b: Broker, info: PartitionStateInfo) -> None:
        lai = info.leader_and_isr
        if b.id not in info.replicas or lai.leader_epoch < b.leader_epoch:
            return
        if lai.leader_epoch == b.leader_epoch and lai.partition_epoch <= b.partition_epoch:
            return
        same_term = lai.leader_epoch == b.leader_epoch and b.role is not None
        b.partition_epoch, b.replicas = lai.partition_epoch, info.replicas
        if lai.leader == b.id:
            if same_term and b.role == "leader":
                b.isr = list(lai.isr)
                return
            seen = self.leader_by_epoch.setdefault(lai.leader_epoch, b.id)
            if seen != b.id:
                self.violate("one_leader_per_epoch", f"epoch {lai.leader_epoch} led by {seen} and {b.id}")
            b.role, b.leader_id, b.leader_epoch, b.isr = "leader", b.id, lai.leader_epoch, list(lai.isr)
            b.epochs = isr_logic.assign_epoch_start_offset(b.epochs, lai.leader_epoch, b.leo)
            b.followers = {r: isr_logic.FollowerFetchState() for r in info.replicas if r != b.id}
            for r, st in b.followers.items():
                st.reset(self.clock.now_ms, r in lai.isr)
            b.heard_from, b.pending_acks, b.fetch_mode = set(), {}, None
            b.last_shrink_check_ms = self.clock.now_ms
            self.maybe_increment_leader_hw(b)
        elif lai.leader != NO_LEADER:
            if same_term and b.role == "follower" and b.leader_id == lai.leader:
                return
            b.role, b.leader_id, b.leader_epoch = "follower", lai.leader, lai.leader_epoch
            b.pending_acks, b.inflight_since_ms = {}, -1
            if self.cfg.truncation == "hw":
                b.truncate_to(b.hw)
                b.fetch_mode = "fetching"
            else:
                b.fetch_mode = "truncating"
        else:
            b.role, b.leader_epoch, b.fetch_mode = None, lai.leader_epoch, None

    def broker_tick(self, b: Broker) -> None:
        now = self.clock.now_ms
        if not self.store.keep_alive(b.id, b.broker_epoch, now, self.cfg.session_timeout_ms):
            # Session expired while paused: register again, as a broker does on a new session.
            b.broker_epoch = self.store.register(b.id, now, self.cfg.session_timeout_ms)
        if b.role == "follower" and b.fetch_mode is not None:
            if b.inflight_since_ms < 0 or now - b.inflight_since_ms > self.cfg.request_timeout_ms:
                b.inflight_id += 1
                b.inflight_since_ms = now
                if b.fetch_mode == "truncating":
                    latest = b.epochs[-1][0] if b.epochs else isr_logic.UNDEFINED_EPOCH
                    msg: Any = EpochQuery(b.inflight_id, latest, b.leader_epoch)
                else:
                    msg = Fetch(b.inflight_id, b.leo, b.leader_epoch)
                self.network.send(now, b.id, b.leader_id, msg)
        if b.role == "leader" and now - b.last_shrink_check_ms >= isr_logic.isr_expiration_interval_ms(
            self.cfg.replica_lag_time_max_ms
        ):
            b.last_shrink_check_ms = now
            self.maybe_shrink_isr(b)

    def handle_epoch_query(self, b: Broker, q: EpochQuery) -> EpochAnswer:
        if b.role != "leader" or q.current_leader_epoch != b.leader_epoch:
            return EpochAnswer(q.req_id, -1, -1, "FENCED_LEADER_EPOCH")
        epoch, end = isr_logic.end_offset_for_epoch(b.epochs, q.epoch, b.leo)
        return EpochAnswer(q.req_id, epoch, end)

    def handle_epoch_answer(self, b: Broker, a: EpochAnswer) -> None:
        if b.role != "follower" or b.fetch_mode != "truncating" or a.req_id != b.inflight_id:
            return
        b.inflight_since_ms = -1
        if a.error:
            return
        decision = isr_logic.follower_truncation(b.epochs, b.leo, a.epoch, a.end_offset, b.hw)
        b.truncate_to(decision.offset)
        if decision.completed:
            b.fetch_mode = "fetching"

    def handle_fetch(self, b: Broker, follower: int, f: Fetch) -> FetchResponse:
        if b.role != "leader" or f.current_leader_epoch != b.leader_epoch or follower not in b.followers:
            return FetchResponse(f.req_id, f.offset, (), 0, 0, "FENCED_LEADER_EPOCH")
        if f.offset > b.leo:
            return FetchResponse(f.req_id, f.offset, (), b.hw, b.leo, "OFFSET_OUT_OF_RANGE")
        now = self.clock.now_ms
        b.followers[follower].update_fetch_state(f.offset, b.leo, now)
        b.heard_from.add(follower)
        if follower not in b.isr:
            epoch_start = next((s for e, s in b.epochs if e == b.leader_epoch), None)
            if isr_logic.maybe_expand_isr(f.offset, b.hw, epoch_start):
                self.write_isr(b, [*b.isr, follower])
        self.maybe_increment_leader_hw(b)
        records = tuple(b.log[f.offset : f.offset + self.cfg.fetch_records_max])
        return FetchResponse(f.req_id, f.offset, records, b.hw, b.leo)

    def handle_fetch_response(self, b: Broker, r: FetchResponse) -> None:
        if b.role != "follower" or b.fetch_mode != "fetching" or r.req_id != b.inflight_id:
            return
        b.inflight_since_ms = -1
        if r.error == "OFFSET_OUT_OF_RANGE":
            if self.cfg.truncation == "hw":
                b.truncate_to(r.leader_leo)
            else:
                b.fetch_mode = "truncating"
            return
        if r.error or r.offset != b.leo:
            return
        for epoch, value in r.records:
            b.append(epoch, value)
        b.hw = max(b.hw, min(r.hw, b.leo))

    def write_isr(self, b: Broker, new_isr: list[int]) -> bool:
        """The leader's compare-and-swap of the ISR (seed 000); a lost race leaves it unchanged."""
        state = LeaderAndIsr(b.id, b.leader_epoch, tuple(new_isr), b.controller_epoch_seen, b.partition_epoch + 1)
        current = self.store.state
        if current is None or current.leader_epoch != b.leader_epoch:
            return False
        state = state.with_controller_epoch(current.controller_epoch)
        if not self.store.cas_state(b.partition_epoch, state):
            return False
        b.isr, b.partition_epoch = list(new_isr), state.partition_epoch
        self.store.isr_change_notifications.append(TP)
        return True

    def maybe_shrink_isr(self, b: Broker) -> bool:
        caught_up = {r: st.last_caught_up_time_ms for r, st in b.followers.items()}
        leos = {r: b.followers[r].log_end_offset for r in b.heard_from}
        new_isr = isr_logic.maybe_shrink_isr(
            b.isr, b.id, caught_up, self.clock.now_ms, self.cfg.replica_lag_time_max_ms, leos, b.leo
        )
        if new_isr is None or not self.write_isr(b, new_isr):
            return False
        return self.maybe_increment_leader_hw(b)

    def maybe_increment_leader_hw(self, b: Broker) -> bool:
        leos = {r: b.followers[r].log_end_offset for r in b.heard_from}
        # Kafka's rule: the ISR plus followers caught up within replica.lag.time.max.ms (seed 000).
        caught_up = {r: b.followers[r].last_caught_up_time_ms for r in b.heard_from}
        new_hw = isr_logic.compute_high_watermark(b.leo, b.isr, leos, b.hw, b.id, caught_up, self.clock.now_ms,
                                                  self.cfg.replica_lag_time_max_ms)
        if new_hw == b.hw:
            return False
        b.hw = new_hw
        for offset in [o for o in b.pending_acks if o < new_hw]:
            self.acked[offset] = b.pending_acks.pop(offset)
        return True

    # -- invariants ----------------------------------------------------------

    def violate(self, name: str, detail: str) -> None:
        raise InvariantViolation(f"invariant {name} violated at step {self.steps} (seed={self.seed}): {detail}")

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
        for b in self.brokers.values():
            if b.hw < self.max_hw.get(b.id, 0):
                self.violate("hw_never_regresses", f"broker {b.id} HW {self.max_hw[b.id]} -> {b.hw}")
            self.max_hw[b.id] = b.hw

    def check_no_acked_record_lost(self) -> None:
        """Every acked record sits at its offset on the established leader and on every replica whose HW passed it."""
        state = self.store.state
        established = None
        if state is not None and state.leader in self.brokers:
            leader = self.brokers[state.leader]
            if leader.alive and leader.role == "leader" and leader.leader_epoch == state.leader_epoch:
                established = leader
        for offset, value in self.acked.items():
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
