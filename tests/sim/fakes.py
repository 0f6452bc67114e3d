"""The simulation's stand-ins for what is not production broker or controller code: the knobs,
the clock, the network (delays, drops, cuts, lost and duplicated control requests), etcd (a
partition state with compare-and-swap, broker leases) and the messages between nodes."""

from __future__ import annotations

import collections
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from gregor.broker.replication_state import ProposeIsr
from gregor.controller.state import LeaderAndIsr, TopicPartition

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
    # Control requests (LeaderAndIsr, StopReplica, UpdateMetadata) lost or delivered twice; random delays reorder them.
    control_drop_probability: float = 0.0
    control_duplicate_probability: float = 0.0
    # Controller partition-state writes whose compare the fake store fails (a leader's ISR write landing first,
    # else a spurious one): the production re-run path (perform_partition_state_writes) under faults.
    controller_write_conflict_probability: float = 0.15
    # replica.fetch.backoff.ms, scaled like the rest
    replica_fetch_backoff_ms: int = 50
    # Session/fetch timeouts in ticks of tick_ms are derived from the above.


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 0


class Network:
    """Delivers messages after a random delay; drops some; honours cut links; holds mail for paused nodes.

    Control requests travel in one FIFO queue per (controller, broker) link, as the
    controller's one sender per broker sends them: they are reordered across brokers
    and across controllers (an old and a new one), never on one link.
    """

    def __init__(self, rng: random.Random, cfg: SimConfig) -> None:
        self.rng, self.cfg = rng, cfg
        self.in_flight: list[tuple[int, int, int, int, Any, bool]] = []
        self.cut: set[frozenset[int]] = set()
        self._seq = 0
        self.lost_control = 0
        self.control: dict[tuple[int, int], collections.deque[tuple[int, Any]]] = {}

    def send(self, now_ms: int, src: int, dst: int, msg: Any, reliable: bool = False, control: bool = False) -> None:
        """Queue a message; `reliable` ones (a channel that retries) wait out cuts and are not dropped at random.

        `control` requests have their own faults: lost (a sender queue dropped with its
        connection) or duplicated (a retry after a lost response); `lost_control` records it.
        """
        if not reliable and self.rng.random() < self.cfg.drop_probability:
            return
        copies = 1
        if control:
            if self.rng.random() < self.cfg.control_drop_probability:
                self.lost_control += 1
                return
            if self.rng.random() < self.cfg.control_duplicate_probability:
                copies = 2
        for _ in range(copies):
            self._seq += 1
            at = now_ms + self.rng.randint(1, self.cfg.delay_ms_max)
            if control:
                self.control.setdefault((src, dst), collections.deque()).append((at, msg))
            else:
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
        for (src, dst), queue in sorted(self.control.items(), key=lambda kv: kv[0]):
            while (queue and queue[0][0] <= now_ms and dst not in paused
                   and frozenset((src, dst)) not in self.cut):
                out.append((src, dst, queue.popleft()[1]))
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


@dataclass(frozen=True)
class FetchPart:
    """One partition of a ReplicaFetch, as the follower names it (broker_pb2.ReplicaFetchPartition)."""

    tp: TopicPartition
    offset: int
    current_leader_epoch: int


@dataclass(frozen=True)
class ReplicaFetch:
    """A multi-partition replica fetch on one stream (broker_pb2.ReplicaFetchRequest); a full request
    (incremental=False) opens the leader's session for the stream, an incremental one names only moved parts."""

    req_id: int
    stream_id: int
    broker_epoch: int
    incremental: bool
    parts: tuple[FetchPart, ...]


@dataclass(frozen=True)
class PartAnswer:
    tp: TopicPartition
    offset: int
    records: tuple[tuple[int, int], ...]
    hw: int
    leader_leo: int
    error: str | None = None


@dataclass(frozen=True)
class ReplicaFetchAnswer:
    """The answer to one ReplicaFetch; `error` ends the stream (the leader has no session for it)."""

    req_id: int
    parts: tuple[PartAnswer, ...]
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
class IsrWrite:
    """A leader's ISR compare-and-swap on its way to etcd (IsrManager._write_isr)."""

    proposal: ProposeIsr


@dataclass(frozen=True)
class IsrWriteResult:
    leader_epoch: int
    isr: tuple[int, ...] | None
    partition_epoch: int


STORE = 0  # the fake etcd's address on the simulated network
