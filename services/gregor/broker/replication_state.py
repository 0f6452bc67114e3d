"""The replica state machine of one partition on one broker: events in, effects out, no I/O.

In the spirit of etcd's RawNode and Kafka's Partition: every rule about who
leads, which epoch is current, who is in the ISR, where the high watermark is
and where a follower truncates is decided here, fed with plain values (the
log's end offset, its epoch entries, `now_ms`). The caller (the broker's
Partition/ReplicaManager, or the seeded simulation in tests/sim) owns the log,
the fetcher tasks, etcd and the purgatories, and carries out the effects
returned. Because the simulation runs this very class, its invariants check
the code that ships.

Concurrency: one owner (the broker's event loop, or the simulation's step);
no locks, no awaits. Only this class writes the fields below.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from gregor.common import errors
from gregor.common.isr import (
    NO_BROKER_EPOCH,
    REPLICA_LAG_TIME_MAX_MS_DEFAULT,
    UNDEFINED_EPOCH,
    EpochEntries,
    FollowerFetchState,
    compute_high_watermark,
    follower_truncation,
    is_isr_eligible,
    is_stale_follower_fetch,
    isr_eligible_followers,
    maybe_expand_isr,
    maybe_shrink_isr,
)

from gregor.common.etcd_layout import NO_LEADER  # noqa: E402  (one definition for every role)


class Role(enum.Enum):
    NONE = "none"  # new, stopped, or told there is no leader
    LEADER = "leader"
    FOLLOWER = "follower"


class FetchMode(enum.Enum):
    """A follower first truncates by leader epoch (seed 002), then fetches."""

    TRUNCATING = "truncating"
    FETCHING = "fetching"


# -- effects -------------------------------------------------------------------


@dataclass(frozen=True)
class TruncateLog:
    """Truncate the log to `offset` (records at and above it go); the caller's log also drops epoch entries."""

    offset: int


@dataclass(frozen=True)
class StartLogAt:
    """Empty the log and start it at `offset` (a follower behind the leader's log start)."""

    offset: int


@dataclass(frozen=True)
class ProposeIsr:
    """Write this ISR change (a compare-and-swap on the partition state) for `leader_epoch`; report the result."""

    add: frozenset[int]
    remove: frozenset[int]
    isr: tuple[int, ...]
    leader_epoch: int
    partition_epoch: int


@dataclass(frozen=True)
class HighWatermarkChanged:
    """The HW moved: parked acks=all produces and consumer fetches may complete."""

    high_watermark: int


@dataclass(frozen=True)
class StartFetcher:
    """Follow `leader_id` at `leader_epoch`: truncate first, then fetch."""

    leader_id: int
    leader_epoch: int


@dataclass(frozen=True)
class StopFetcher:
    """Stop fetching this partition (we lead it now, or it stopped)."""


@dataclass(frozen=True)
class CompleteDelayed:
    """Re-check the purgatory keys of this partition (leadership changed: waiters answer NOT_LEADER_OR_FOLLOWER)."""


Effect = TruncateLog | StartLogAt | ProposeIsr | HighWatermarkChanged | StartFetcher | StopFetcher | CompleteDelayed


R = TypeVar("R", contravariant=True)


class EffectRunner(Protocol[R]):
    """What carries out a replica's non-log effects: the broker's ReplicaManager, or the simulated broker's IO."""

    def start_fetcher(self, replica: R, effect: StartFetcher) -> None: ...

    def stop_fetcher(self, replica: R) -> None: ...

    def propose_isr(self, replica: R, effect: ProposeIsr) -> None: ...

    def complete_delayed(self, replica: R) -> None: ...


def dispatch_effects(replica: R, effects: Iterable[Effect], runner: EffectRunner[R]) -> None:
    """The one effect runner (the broker's and the simulation's): fetcher, ISR-write and purgatory effects in order,
    the purgatories woken once after the others. Log effects are the log owner's (Partition.apply_log_effects) and
    must be applied before: one reaching here is a bug, never silently dropped."""
    wake = False
    for e in effects:
        if isinstance(e, StartFetcher):
            runner.start_fetcher(replica, e)
        elif isinstance(e, StopFetcher):
            runner.stop_fetcher(replica)
        elif isinstance(e, ProposeIsr):
            runner.propose_isr(replica, e)
        elif isinstance(e, (HighWatermarkChanged, CompleteDelayed)):
            wake = True
        else:
            raise ValueError(f"{e} is a log effect: apply it to the log before running the others")
    if wake:
        runner.complete_delayed(replica)


@dataclass(frozen=True)
class LeaderAndIsrOutcome:
    """What a LeaderAndIsr did: `error` is the per-partition code Kafka answers (None: applied)."""

    error: int | None
    effects: list[Effect]

    @property
    def applied(self) -> bool:
        return self.error is None


@dataclass
class ControlRequestFence:
    """Fencing of the controller's requests on one broker (seed 001); broker-wide, not per partition.

    STALE_BROKER_EPOCH for a request meant for another incarnation of this broker,
    STALE_CONTROLLER_EPOCH for one from a controller older than the newest seen.
    """

    controller_epoch: int = 0

    def check(self, controller_epoch: int, broker_epoch: int, current_broker_epoch: int) -> None:
        if broker_epoch != -1 and broker_epoch != current_broker_epoch:
            raise errors.error_for(errors.Code.STALE_BROKER_EPOCH,
                                   f"broker epoch {broker_epoch} is not this broker's registration "
                                   f"({current_broker_epoch})")
        # Last, so a request refused for its broker epoch never moves the controller epoch we hold.
        if controller_epoch < self.controller_epoch:
            raise errors.error_for(errors.Code.STALE_CONTROLLER_EPOCH,
                                   f"controller epoch {controller_epoch} is older than {self.controller_epoch}")
        self.controller_epoch = controller_epoch


@dataclass
class ReplicationState:
    """One partition replica's leadership, ISR, high watermark and follower bookkeeping (seeds 000, 002, 004)."""

    local_broker_id: int
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT
    # For error details only.
    topic: str = ""
    partition: int = -1
    role: Role = Role.NONE
    leader_id: int = NO_LEADER
    leader_epoch: int = -1
    # The etcd version of the partition state as last told or written (ZooKeeper's zkVersion); -1 unknown.
    partition_epoch: int = -1
    replicas: list[int] = field(default_factory=list)
    isr: set[int] = field(default_factory=set)
    high_watermark: int = 0
    # Leader only: each follower's LEO, last caught-up time and broker epoch (seed 000's Replica).
    follower_states: dict[int, FollowerFetchState] = field(default_factory=dict)
    # Leader only: the LEO when this term started (the ISR expansion bound, seed 000's leaderEpochStartOffset).
    leader_epoch_start_offset: int | None = None
    # Leader only: one ISR write in flight at a time.
    isr_update_in_flight: bool = False
    # Leader only: replicas an ISR write may have added that `isr` does not show yet, because the
    # write is in flight or its outcome is unknown (etcd failed after the compare-and-swap may have
    # landed). The HW counts them (Kafka's maximal ISR, KIP-497): the controller may already see
    # them in the ISR and elect one, so the HW must not pass their LEO.
    pending_isr_adds: set[int] = field(default_factory=set)
    uncertain_isr_adds: set[int] = field(default_factory=set)
    # Follower only: truncating by leader epoch, or fetching.
    fetch_mode: FetchMode | None = None

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def _where(self) -> dict[str, object]:
        return {"topic": self.topic, "partition": self.partition}

    # -- control requests (seed 001) --------------------------------------------------
    def on_leader_and_isr(self, leader: int, leader_epoch: int, isr: Iterable[int], replicas: Sequence[int],
                          partition_epoch: int, log_end_offset: int, log_start_offset: int,
                          now_ms: int) -> LeaderAndIsrOutcome:
        """Apply one partition of a LeaderAndIsr.

        Kafka applies a request only for a newer leader epoch; an older one, and the same
        epoch re-sent (a duplicate or a controller failover resending state), are ignored
        with STALE_CONTROLLER_EPOCH. The same epoch with a newer partition epoch (the
        controller changed the ISR or replicas within the term, as KRaft's partition epoch)
        updates ISR and replicas without starting a new term; a stopped or new replica takes
        the current epoch again.
        """
        isr_set, replica_list = set(isr), list(replicas)
        newer_epoch = leader_epoch > self.leader_epoch
        same_term = (leader_epoch == self.leader_epoch and self.role is not Role.NONE
                     and leader == self.leader_id)
        restart = leader_epoch == self.leader_epoch and self.role is Role.NONE
        if same_term and partition_epoch > self.partition_epoch:
            self.replicas, self.isr, self.partition_epoch = replica_list, isr_set, partition_epoch
            self.uncertain_isr_adds = set()
            return LeaderAndIsrOutcome(None, [*self._maybe_increment_hw(log_end_offset, now_ms), CompleteDelayed()])
        if not (newer_epoch or restart):
            return LeaderAndIsrOutcome(errors.Code.STALE_CONTROLLER_EPOCH, [])
        self.leader_epoch, self.leader_id = leader_epoch, leader
        self.replicas, self.isr = replica_list, isr_set
        self.partition_epoch = max(self.partition_epoch, partition_epoch)
        self.isr_update_in_flight = False
        self.pending_isr_adds, self.uncertain_isr_adds = set(), set()
        self.follower_states = {}
        if leader == self.local_broker_id:
            return LeaderAndIsrOutcome(None, self._become_leader(log_end_offset, log_start_offset, now_ms))
        self.leader_epoch_start_offset = None
        if leader == NO_LEADER:
            self.role, self.fetch_mode = Role.NONE, None
            return LeaderAndIsrOutcome(None, [StopFetcher(), CompleteDelayed()])
        self.role, self.fetch_mode = Role.FOLLOWER, FetchMode.TRUNCATING
        return LeaderAndIsrOutcome(None, [StartFetcher(leader, leader_epoch), CompleteDelayed()])

    def _become_leader(self, log_end_offset: int, log_start_offset: int, now_ms: int) -> list[Effect]:
        """A new term: followers' LEOs are unknown until they fetch; ISR members count as caught up now."""
        self.role, self.fetch_mode = Role.LEADER, None
        for r in self.replicas:
            if r != self.local_broker_id:
                state = FollowerFetchState()
                state.reset(now_ms, r in self.isr)
                self.follower_states[r] = state
        self.leader_epoch_start_offset = log_end_offset
        self.high_watermark = max(self.high_watermark, log_start_offset)
        # No epoch-cache entry yet: the log records this epoch with its first append (seed 002:
        # "此时还没有新记录追加,leaderEpochCache没有新增条目").
        return [StopFetcher(), *self._maybe_increment_hw(log_end_offset, now_ms), CompleteDelayed()]

    def become_standalone_leader(self, latest_epoch: int | None, log_end_offset: int, log_start_offset: int,
                                 now_ms: int) -> list[Effect]:
        """A single-broker cluster: this broker leads with an ISR of itself at the log's latest epoch."""
        self.role, self.leader_id = Role.LEADER, self.local_broker_id
        self.leader_epoch = max(self.leader_epoch, latest_epoch or 0)
        self.replicas, self.isr = [self.local_broker_id], {self.local_broker_id}
        self.follower_states, self.leader_epoch_start_offset = {}, log_end_offset
        self.high_watermark = max(self.high_watermark, log_start_offset)
        return self._maybe_increment_hw(log_end_offset, now_ms)

    def on_stop_replica(self) -> list[Effect]:
        """StopReplica: serve nothing until the next LeaderAndIsr (the epoch is kept as a fence)."""
        self.role, self.leader_id, self.fetch_mode = Role.NONE, NO_LEADER, None
        self.follower_states, self.isr_update_in_flight = {}, False
        self.pending_isr_adds, self.uncertain_isr_adds = set(), set()
        return [StopFetcher(), CompleteDelayed()]

    def load_high_watermark(self, checkpointed: int, log_start_offset: int, log_end_offset: int) -> None:
        """The HW from the replication-offset-checkpoint file, clamped to the log (startup)."""
        self.high_watermark = max(log_start_offset, min(checkpointed, log_end_offset))

    # -- leader side (seeds 000, 004) -----------------------------------------------------
    def check_offsets_available(self) -> None:
        """Raise OFFSET_NOT_AVAILABLE (retriable) while a new leader's HW is below the start offset of its
        term (Kafka's KIP-207): the previous leader may have acknowledged records up to there, so a
        ListOffsets answered from the lagging HW would make the high watermark appear to go backwards."""
        start = self.leader_epoch_start_offset
        if self.role is Role.LEADER and start is not None and start > self.high_watermark:
            raise errors.error_for(errors.Code.OFFSET_NOT_AVAILABLE,
                                   f"high watermark {self.high_watermark} has not reached {start}, where leader "
                                   f"epoch {self.leader_epoch} started", **self._where())

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER unless we lead at that epoch."""
        if self.role is Role.LEADER and (current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch):
            return  # the common case, checked on every read: no error context built
        where = {**self._where(), "leader_id": self.leader_id, "leader_epoch": self.leader_epoch}
        if 0 <= current_leader_epoch < self.leader_epoch:
            raise errors.error_for(errors.Code.FENCED_LEADER_EPOCH,
                                   f"leader epoch {current_leader_epoch} is older than {self.leader_epoch}", **where)
        if current_leader_epoch > self.leader_epoch:
            raise errors.error_for(errors.Code.UNKNOWN_LEADER_EPOCH,
                                   f"leader epoch {current_leader_epoch} is newer than {self.leader_epoch}", **where)
        if not self.is_leader:
            raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER,
                                   f"broker {self.local_broker_id} is not the leader", **where)

    def check_append(self, required_acks: int, min_insync_replicas: int) -> None:
        """A leader refuses acks=all appends while the ISR is below min.insync.replicas (NOT_ENOUGH_REPLICAS)."""
        self.check_leader()
        if required_acks == -1 and len(self.isr) < min_insync_replicas:
            raise errors.error_for(errors.Code.NOT_ENOUGH_REPLICAS,
                                   f"ISR size {len(self.isr)} is below min.insync.replicas {min_insync_replicas}",
                                   **self._where())

    def last_stable_offset(self, first_unstable_offset: int | None) -> int:
        """Kafka's LSO (seed 003): the first offset of the oldest undecided (or unreplicated) transaction, capped
        at the HW; the HW when no transaction is open. first_unstable_offset: the producer state's."""
        if first_unstable_offset is None:
            return self.high_watermark
        return min(first_unstable_offset, self.high_watermark)

    def fetch_upper_bound(self, is_follower: bool, log_end_offset: int) -> int:
        """Followers read up to the LEO; consumers only below the high watermark (seed 003), read_committed
        consumers below last_stable_offset."""
        return log_end_offset if is_follower else self.high_watermark

    def acks_all_outcome(self, last_offset: int) -> bool | None:
        """An acks=all append ending at last_offset (DelayedProduce, seed 004): True once the HW passed it,
        False when leadership moved first (NOT_LEADER_OR_FOLLOWER), None while it waits."""
        if self.high_watermark > last_offset:
            return True
        return None if self.is_leader else False

    def on_local_append(self, log_end_offset: int, now_ms: int,
                        live_broker_epochs: Mapping[int, int] | None = None) -> list[Effect]:
        """The leader appended: a single-member ISR (or caught-up followers) may move the HW."""
        return self._maybe_increment_hw(log_end_offset, now_ms, live_broker_epochs)

    def check_follower_fetch(self, replica_id: int, broker_epoch: int, live_epoch: int | None) -> None:
        """Refuse a follower fetch from an earlier incarnation of that broker (STALE_BROKER_EPOCH, KIP-380).

        The newest epoch known for the follower is the larger of what its accepted
        fetches carried and what the controller's live-broker list says.
        """
        state = self.follower_states.get(replica_id)
        newest = max(state.broker_epoch if state is not None else NO_BROKER_EPOCH,
                     live_epoch if live_epoch is not None else NO_BROKER_EPOCH)
        if is_stale_follower_fetch(broker_epoch, newest):
            raise errors.error_for(
                errors.Code.STALE_BROKER_EPOCH,
                f"fetch from broker {replica_id} at broker epoch {broker_epoch}, older than {newest}",
                **self._where())

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, broker_epoch: int, log_end_offset: int,
                          now_ms: int, live_broker_epochs: Mapping[int, int] | None = None) -> list[Effect]:
        """A follower fetched at fetch_offset (its LEO): record it, maybe move the HW, maybe expand the ISR."""
        if not self.is_leader or replica_id not in self.replicas or replica_id == self.local_broker_id:
            return []
        state = self.follower_states.setdefault(replica_id, FollowerFetchState())
        state.update_fetch_state(fetch_offset, log_end_offset, now_ms)
        if broker_epoch != NO_BROKER_EPOCH:
            state.broker_epoch = max(state.broker_epoch, broker_epoch)
        effects = self._maybe_increment_hw(log_end_offset, now_ms, live_broker_epochs)
        if self.needs_expand_isr(replica_id, live_broker_epochs):
            effects.extend(self._propose(add={replica_id}, remove=set()))
        return effects

    def reconsider_isr_expansion(self, replica_id: int, live_broker_epochs: Mapping[int, int] | None) -> list[Effect]:
        """The controller's live brokers changed (UpdateMetadata): a follower whose last fetch was refused the
        ISR only because this leader did not know its new incarnation yet (a broker restarted and fetching
        before our UpdateMetadata) may join now. Its last fetch offset still counts: a caught-up idle follower
        names no partition in its incremental fetches, so no fetch would ask again (Kafka updates every
        session partition's follower state on each fetch)."""
        if self.needs_expand_isr(replica_id, live_broker_epochs):
            return self._propose(add={replica_id}, remove=set())
        return []

    def needs_expand_isr(self, replica_id: int, live_broker_epochs: Mapping[int, int] | None = None) -> bool:
        """A follower outside the ISR whose LEO reached the HW and this term's start (seed 000).

        With the controller's live-broker epochs known, only the follower's registered
        incarnation may join (KIP-903): a fetch from a dead or older one may not.
        """
        if not self.is_leader or replica_id in self.isr or replica_id not in self.replicas:
            return False
        state = self.follower_states.get(replica_id)
        if state is None:
            return False
        if live_broker_epochs is not None and not is_isr_eligible(
                state.broker_epoch, live_broker_epochs.get(replica_id), bool(live_broker_epochs)):
            return False
        return maybe_expand_isr(state.log_end_offset, self.high_watermark, self.leader_epoch_start_offset)

    def out_of_sync_isr(self, log_end_offset: int, now_ms: int) -> list[int] | None:
        """The shrunk ISR if some follower was not caught up within replica.lag.time.max.ms, else None."""
        if not self.is_leader:
            return None
        caught_up = {r: s.last_caught_up_time_ms for r, s in self.follower_states.items()}
        leos = {r: s.log_end_offset for r, s in self.follower_states.items()}
        return maybe_shrink_isr(sorted(self.maximal_isr), self.local_broker_id, caught_up, now_ms,
                                self.replica_lag_time_max_ms, leos, log_end_offset)

    def on_tick(self, log_end_offset: int, now_ms: int,
                live_broker_epochs: Mapping[int, int] | None = None) -> list[Effect]:
        """isr-expiration: propose dropping followers that fell behind; the caught-up window may move the HW."""
        effects = self._maybe_increment_hw(log_end_offset, now_ms, live_broker_epochs)
        shrunk = self.out_of_sync_isr(log_end_offset, now_ms)
        if shrunk is not None:
            effects.extend(self._propose(add=set(), remove=self.maximal_isr - set(shrunk)))
        return effects

    def _propose(self, add: set[int], remove: set[int]) -> list[Effect]:
        if self.isr_update_in_flight:
            return []  # the next fetch or expiration round asks again
        self.isr_update_in_flight = True
        self.pending_isr_adds = set(add)
        new = tuple(sorted((self.isr - remove) | add))
        return [ProposeIsr(frozenset(add), frozenset(remove), new, self.leader_epoch, self.partition_epoch)]

    @property
    def maximal_isr(self) -> set[int]:
        """The ISR plus every replica a write in flight, or of unknown outcome, may have added."""
        return self.isr | self.pending_isr_adds | self.uncertain_isr_adds

    def on_isr_write_result(self, leader_epoch: int, isr: Iterable[int] | None, partition_epoch: int,
                            log_end_offset: int, now_ms: int,
                            live_broker_epochs: Mapping[int, int] | None = None,
                            outcome_unknown: bool = False) -> list[Effect]:
        """The ISR write for `leader_epoch` ended: `isr` is what the partition state now holds (None: failed).

        Applied only if we still lead that term; the HW may move once a lagging follower left.
        A failure whose outcome is unknown keeps counting the replicas it would have added
        until an ISR we can trust arrives (a later write, or the controller's LeaderAndIsr).
        """
        self.isr_update_in_flight = False
        if outcome_unknown:
            self.uncertain_isr_adds |= self.pending_isr_adds
        self.pending_isr_adds = set()
        if isr is None or not self.is_leader or self.leader_epoch != leader_epoch:
            return []
        self.isr = set(isr)
        self.uncertain_isr_adds = set()
        self.partition_epoch = max(self.partition_epoch, partition_epoch)
        return [*self._maybe_increment_hw(log_end_offset, now_ms, live_broker_epochs), CompleteDelayed()]

    def _maybe_increment_hw(self, log_end_offset: int, now_ms: int,
                            live_broker_epochs: Mapping[int, int] | None = None) -> list[Effect]:
        """Seed 000's maybeIncrementLeaderHW: min LEO of the ISR and caught-up ISR-eligible followers; never back."""
        if not self.is_leader or self.high_watermark > log_end_offset:
            return []
        states = self.follower_states
        leos = {r: s.log_end_offset for r, s in states.items()}
        isr = self.maximal_isr
        leos.update({r: 0 for r in isr if r != self.local_broker_id and r not in states})
        new_hw = compute_high_watermark(
            log_end_offset, isr, leos, self.high_watermark, self.local_broker_id,
            {r: s.last_caught_up_time_ms for r, s in states.items()}, now_ms, self.replica_lag_time_max_ms,
            isr_eligible_followers({r: s.broker_epoch for r, s in states.items()}, live_broker_epochs))
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return [HighWatermarkChanged(new_hw)]
        return []

    # -- follower side (seeds 002, 004) ---------------------------------------------------
    def is_current_follower(self, leader_id: int, leader_epoch: int) -> bool:
        """Do we still follow leader_id at leader_epoch? (a fetcher's answer for an old term is dropped)"""
        return self.role is Role.FOLLOWER and self.leader_id == leader_id and self.leader_epoch == leader_epoch

    def truncation_query(self, latest_epoch: int | None, log_end_offset: int) -> int | TruncateLog:
        """Before fetching: the epoch to ask OffsetForLeaderEpoch about, or (no epoch at all) a HW truncation."""
        if latest_epoch is None or latest_epoch == UNDEFINED_EPOCH:
            return self._truncate(min(self.high_watermark, log_end_offset), log_end_offset, completed=True)
        return latest_epoch

    def on_truncation_point(self, leader_epoch: int, end_offset: int, epoch_entries: EpochEntries,
                            log_end_offset: int) -> tuple[TruncateLog, bool]:
        """The leader's OffsetForLeaderEpoch answer: where to truncate, and whether truncation is complete."""
        decision = follower_truncation(epoch_entries, log_end_offset, leader_epoch, end_offset, self.high_watermark)
        return self._truncate(decision.offset, log_end_offset, decision.completed), decision.completed

    def _truncate(self, offset: int, log_end_offset: int, completed: bool) -> TruncateLog:
        offset = min(offset, log_end_offset)
        self.high_watermark = min(self.high_watermark, offset)
        if completed and self.role is Role.FOLLOWER:
            self.fetch_mode = FetchMode.FETCHING
        return TruncateLog(offset)

    def finish_truncation(self, log_end_offset: int) -> None:
        """Truncation rounds are over (complete, or no progress after the allowed rounds): fetch from the LEO."""
        self.high_watermark = min(self.high_watermark, log_end_offset)
        if self.role is Role.FOLLOWER:
            self.fetch_mode = FetchMode.FETCHING

    def restart_truncation(self) -> None:
        """OFFSET_OUT_OF_RANGE from the leader, or a failed append: truncate again before the next fetch."""
        if self.role is Role.FOLLOWER:
            self.fetch_mode = FetchMode.TRUNCATING

    def on_leader_log_range(self, leader_log_start: int, leader_hw: int, log_end_offset: int) -> Effect | None:
        """Still out of range after epoch truncation: start over at the leader's log start if we are behind
        it, or cut what lies past the leader's HW (ListOffsets earliest/latest)."""
        if log_end_offset < leader_log_start:
            self.high_watermark = leader_log_start
            return StartLogAt(leader_log_start)
        if log_end_offset > leader_hw:
            return self._truncate(leader_hw, log_end_offset, completed=False)
        return None

    def on_follower_fetched(self, leader_hw: int, log_end_offset: int) -> list[Effect]:
        """After appending a fetch response: follower HW = min(leader HW, own LEO) (seed 004), never back.

        A leader elected a moment ago may report a HW below what this follower already
        learned from the previous leader; both are committed, so the follower keeps the larger.
        """
        new_hw = min(leader_hw, log_end_offset)
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return [HighWatermarkChanged(new_hw)]
        return []
