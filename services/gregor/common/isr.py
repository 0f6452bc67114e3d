"""Leader-side ISR, high-watermark and leader-epoch truncation decisions as pure functions (seeds 000, 002).

Shared by the broker (which runs them) and the controller; no I/O, fed with time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# replica.lag.time.max.ms: a follower not caught up for this long leaves the ISR (30 s since Kafka 2.5).
REPLICA_LAG_TIME_MAX_MS_DEFAULT = 30_000
# isr-change-propagation runs this often (ReplicaManager's fixed 2500 ms).
ISR_CHANGE_PROPAGATION_CHECK_INTERVAL_MS = 2_500
# Propagate once no ISR change has happened for this long (IsrChangePropagationBlackOut) ...
ISR_CHANGE_PROPAGATION_BLACKOUT_MS = 5_000
# ... or at the latest this long after the previous propagation (IsrChangePropagationInterval).
ISR_CHANGE_PROPAGATION_INTERVAL_MS = 60_000

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


def isr_expiration_interval_ms(replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT) -> int:
    """How often isr-expiration runs: replica.lag.time.max.ms / 2 (seed 000)."""
    return replica_lag_time_max_ms // 2


@dataclass
class FollowerFetchState:
    """What the leader knows about one follower: its LEO and when it was last caught up.

    Concurrency: owned by the partition's single owner on the broker, like the log.
    """

    log_end_offset: int = 0
    last_caught_up_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = 0
    last_fetch_time_ms: int = 0
    # The follower's broker epoch as its latest accepted fetch carried it (-1: none yet).
    broker_epoch: int = -1

    def update_fetch_state(self, fetch_offset: int, leader_log_end_offset: int, fetch_time_ms: int) -> None:
        """Record a fetch (Kafka's Replica.updateFetchState).

        A fetch at the leader's current LEO proves the follower is caught up
        now; a fetch at or beyond the LEO the leader had at the previous fetch
        proves it was caught up then.
        """
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, fetch_time_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = leader_log_end_offset
        self.last_fetch_time_ms = fetch_time_ms

    def reset(self, now_ms: int, in_isr: bool) -> None:
        """On becoming leader: ISR members count as caught up now, others as never."""
        self.log_end_offset = 0
        self.last_caught_up_time_ms = now_ms if in_isr else 0
        self.last_fetch_leader_log_end_offset = 0
        self.last_fetch_time_ms = now_ms if in_isr else 0


def out_of_sync_replicas(
    isr: Iterable[int],
    leader: int,
    follower_last_caught_up_ms: Mapping[int, int],
    now_ms: int,
    replica_lag_time_max_ms: int,
    follower_leos: Mapping[int, int] | None = None,
    leader_leo: int | None = None,
) -> list[int]:
    """ISR followers not caught up within replica.lag.time.max.ms (getOutOfSyncReplicas).

    A follower whose LEO equals the leader's is in sync whatever its timestamp
    (seed 000 condition 2); an unknown follower counts as never caught up.
    """
    out = []
    for replica in isr:
        if replica == leader:
            continue
        if follower_leos is not None and leader_leo is not None and follower_leos.get(replica) == leader_leo:
            continue
        if now_ms - follower_last_caught_up_ms.get(replica, 0) > replica_lag_time_max_ms:
            out.append(replica)
    return out


def maybe_shrink_isr(
    isr: Sequence[int],
    leader: int,
    follower_last_caught_up_ms: Mapping[int, int],
    now_ms: int,
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
    follower_leos: Mapping[int, int] | None = None,
    leader_leo: int | None = None,
) -> list[int] | None:
    """The shrunk ISR (order kept) if some follower fell out of sync, else None (seed 000)."""
    out = out_of_sync_replicas(
        isr, leader, follower_last_caught_up_ms, now_ms, replica_lag_time_max_ms, follower_leos, leader_leo
    )
    if not out:
        return None
    return [r for r in isr if r not in out]


def maybe_expand_isr(follower_leo: int, hw: int, leader_epoch_start_offset: int | None) -> bool:
    """True if a follower outside the ISR may join it (seed 000's isFollowerInSync).

    Its LEO must reach the high watermark and the start offset of the current
    leader epoch, so it holds everything this leader's term has committed.
    """
    return leader_epoch_start_offset is not None and follower_leo >= hw and follower_leo >= leader_epoch_start_offset


def is_caught_up(last_caught_up_time_ms: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
    """A follower caught up to the leader within replica.lag.time.max.ms (Kafka's isCaughtUp window)."""
    return now_ms - last_caught_up_time_ms <= replica_lag_time_max_ms


def compute_high_watermark(
    leader_leo: int,
    isr: Collection[int],
    follower_leos: Mapping[int, int],
    current_hw: int = 0,
    leader_id: int | None = None,
    follower_last_caught_up_ms: Mapping[int, int] | None = None,
    now_ms: int | None = None,
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
    isr_eligible: Collection[int] | None = None,
) -> int:
    """The leader's high watermark (seed 000's maybeIncrementLeaderHW); never below `current_hw`.

    The min LEO over the ISR **plus** every follower outside the ISR that was
    caught up within replica.lag.time.max.ms (it fetched up to the leader's LEO
    recently but its ISR expansion is not written yet) **and** may join the ISR:
    Kafka waits for such a replica (Partition.shouldWaitForReplicaToJoinIsr) so
    that, once it joins, the HW is not already past its LEO. A replica that may
    not join (isReplicaIsrEligible, KIP-841: its broker is not registered, is in
    controlled shutdown, or fetched as an older incarnation) is not waited for,
    so a departing broker that fetched once does not hold acks=all back for
    replica.lag.time.max.ms. ISR members always count, eligible or not.

    Args:
        leader_leo: the leader's log end offset.
        isr: ISR broker ids (may include the leader).
        follower_leos: followers' LEOs as last reported by their fetches.
        current_hw: the high watermark now; the result never regresses below it.
        leader_id: the leader's id, skipped in `isr` (its LEO is `leader_leo`).
        follower_last_caught_up_ms: followers' lastCaughtUpTimeMs; with `now_ms`, caught-up
            non-ISR followers count too. None counts the ISR only.
        now_ms: the time the caught-up window is measured from.
        replica_lag_time_max_ms: the caught-up window.
        isr_eligible: the followers that may join the ISR (`isr_eligible_followers`); a caught-up
            follower outside the ISR and outside this set is not waited for. None: all may.

    Raises:
        ValueError: current_hw is above leader_leo (a corrupt state).
    """
    if current_hw > leader_leo:
        raise ValueError(f"high watermark {current_hw} is above the leader's log end offset {leader_leo}")
    candidate = leader_leo
    for replica in isr:
        if replica == leader_id:
            continue
        if replica not in follower_leos:
            # An ISR member we have not heard from yet holds the watermark where it is.
            return current_hw
        candidate = min(candidate, follower_leos[replica])
    if follower_last_caught_up_ms is not None and now_ms is not None:
        for replica, leo in follower_leos.items():
            if replica == leader_id or replica in isr or replica not in follower_last_caught_up_ms:
                continue
            if isr_eligible is not None and replica not in isr_eligible:
                continue
            if is_caught_up(follower_last_caught_up_ms[replica], now_ms, replica_lag_time_max_ms):
                candidate = min(candidate, leo)
    return max(current_hw, candidate)


# -- follower broker epochs (KIP-380 / KIP-903) --------------------------------

NO_BROKER_EPOCH = -1


def is_stale_follower_fetch(fetch_broker_epoch: int, newest_known_epoch: int) -> bool:
    """A follower fetch from an earlier incarnation of that broker (Kafka's STALE_BROKER_EPOCH).

    `newest_known_epoch` is the largest epoch the leader knows for the broker: from its
    earlier fetches or from the controller's live-broker list. A fetch that carries no
    epoch (-1) is not judged here.
    """
    return fetch_broker_epoch != NO_BROKER_EPOCH and fetch_broker_epoch < newest_known_epoch


def is_isr_eligible(fetch_broker_epoch: int, live_broker_epoch: int | None, metadata_known: bool) -> bool:
    """May a follower join the ISR? Only its live incarnation (KIP-903's isReplicaIsrEligible).

    With the controller's live-broker list known, the follower must be in it and its
    fetches must carry the registered epoch; before the first UpdateMetadata there is
    nothing to check against.
    """
    if not metadata_known:
        return True
    return live_broker_epoch is not None and fetch_broker_epoch in (live_broker_epoch, NO_BROKER_EPOCH)


def isr_eligible_followers(
    follower_broker_epochs: Mapping[int, int], live_broker_epochs: Mapping[int, int] | None
) -> set[int] | None:
    """The followers that may join the ISR, by the leader's metadata cache (Kafka's isReplicaIsrEligible).

    `follower_broker_epochs` maps each follower to the broker epoch its fetches carried
    (-1: none); `live_broker_epochs` is the controller's live-broker list as the last
    UpdateMetadata gave it, which leaves out unregistered (fenced) brokers and brokers
    in controlled shutdown. None (no UpdateMetadata yet, or a standalone broker): no
    check is possible, so None (everyone eligible) is returned.
    """
    if not live_broker_epochs:
        return None
    return {
        replica
        for replica, epoch in follower_broker_epochs.items()
        if is_isr_eligible(epoch, live_broker_epochs.get(replica), True)
    }


@dataclass
class IsrChangePropagation:
    """Batches ISR changes into /isr_change_notification entries (seed 000's maybePropagateIsrChanges).

    Checked every 2.5 s; propagates when there are changes and either none
    happened in the last 5 s or the previous propagation is over 60 s old.

    Concurrency: owned by one task (the broker's replica-manager loop); fed with now_ms.
    """

    blackout_ms: int = ISR_CHANGE_PROPAGATION_BLACKOUT_MS
    interval_ms: int = ISR_CHANGE_PROPAGATION_INTERVAL_MS
    pending: set[tuple[str, int]] = field(default_factory=set)
    last_isr_change_ms: int = 0
    last_propagation_ms: int = 0

    def record_isr_change(self, topic: str, partition: int, now_ms: int) -> None:
        self.pending.add((topic, partition))
        self.last_isr_change_ms = now_ms

    def maybe_propagate(self, now_ms: int) -> list[tuple[str, int]] | None:
        """The partitions to publish now, clearing them, or None if it is not time yet."""
        if not self.pending:
            return None
        quiet = self.last_isr_change_ms + self.blackout_ms < now_ms
        overdue = self.last_propagation_ms + self.interval_ms < now_ms
        if not (quiet or overdue):
            return None
        out = sorted(self.pending)
        self.pending.clear()
        self.last_propagation_ms = now_ms
        return out


# -- leader epochs (seed 002) -------------------------------------------------

EpochEntries = Sequence[tuple[int, int]]  # (leader epoch, start offset), ascending


def end_offset_for_epoch(entries: EpochEntries, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
    """The leader's OffsetForLeaderEpoch answer: (epoch, end offset) (LeaderEpochFileCache.endOffsetFor).

    For the leader's latest epoch the end offset is its LEO; for an older epoch
    it is the start offset of the smallest epoch greater than the one asked,
    reported with the largest epoch <= the one asked. An epoch the leader has
    never seen after answers (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET).
    """
    if requested_epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if entries[-1][0] == requested_epoch:
        return requested_epoch, log_end_offset
    higher = [(e, s) for e, s in entries if e > requested_epoch]
    if not higher:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    floor = [(e, s) for e, s in entries if e <= requested_epoch]
    return (floor[-1][0] if floor else requested_epoch), higher[0][1]


@dataclass(frozen=True)
class TruncationDecision:
    """Where a follower truncates; if not `completed`, it asks the leader again with its new latest epoch."""

    offset: int
    completed: bool


def truncation_offset(leader_end_offset: int, follower_leo: int) -> int:
    """Seed 002's rule: truncate to the smaller of the leader's end offset for our epoch and our LEO."""
    return min(leader_end_offset, follower_leo)


def follower_truncation(
    follower_entries: EpochEntries,
    follower_leo: int,
    leader_epoch: int,
    leader_end_offset: int,
    follower_hw: int = 0,
) -> TruncationDecision:
    """A follower's decision on the leader's OffsetForLeaderEpoch reply (KIP-101 with KIP-279's fix).

    If the leader replied with an epoch the follower also has, truncate to the
    smaller of the two end offsets for it and our LEO; if the follower does not
    have that epoch, truncate to the end of its largest smaller epoch and ask
    again. An undefined reply falls back to the high watermark.
    """
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(min(follower_hw, follower_leo), True)
    if leader_epoch == UNDEFINED_EPOCH:
        return TruncationDecision(truncation_offset(leader_end_offset, follower_leo), True)
    follower_epoch, follower_end = end_offset_for_epoch(follower_entries, leader_epoch, follower_leo)
    if follower_end == UNDEFINED_EPOCH_OFFSET:
        return TruncationDecision(truncation_offset(leader_end_offset, follower_leo), True)
    if follower_epoch != leader_epoch:
        return TruncationDecision(min(follower_end, follower_leo), False)
    return TruncationDecision(min(follower_end, leader_end_offset, follower_leo), True)


def truncate_epoch_entries(entries: EpochEntries, end_offset: int) -> list[tuple[int, int]]:
    """Epoch entries after truncating the log to end_offset: those starting at or beyond it go.

    Apply this even when end_offset equals the LEO and no record is removed: a
    follower that once led an epoch without appending to it holds an entry
    (epoch, LEO); left in place, the follower keeps asking the leader about that
    epoch and never completes truncation (found by tests/sim).
    """
    return [(e, s) for e, s in entries if s < end_offset]


def assign_epoch_start_offset(entries: EpochEntries, epoch: int, start_offset: int) -> list[tuple[int, int]]:
    """Append (epoch, start_offset) if epoch is newer than the latest entry; entries are otherwise kept."""
    out = list(entries)
    if not out or epoch > out[-1][0]:
        out.append((epoch, start_offset))
    return out
