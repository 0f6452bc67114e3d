"""The follower's fetch state for one leader, IO-free: session, backoff, errors and truncation rounds.

Concurrency: none of its own; owned by one ReplicaFetcher task on a broker (replica_fetcher.py, which
keeps only the IO: the ReplicaFetch stream, OffsetForLeaderEpoch/ListOffsets calls and the native log)
and by the simulated follower in tests/sim, which drives the same object with fake messages.

Inputs are partitions added or dropped, the current time, fetch answers (per-partition errors), epoch
answers and failures; outputs are which partitions to name in the next multi-partition fetch (and
whether it is incremental, KIP-227), when to back off, when to truncate again, and when an epoch
truncation has converged. The partition's own leadership, HW and truncation point stay in its
ReplicationState; this object only decides what the fetcher asks next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Hashable, Sequence, TypeVar

from gregor.broker.limits import MAX_TRUNCATION_ROUNDS, REPLICA_FETCH_BACKOFF_S, REPLICA_FETCH_SESSION_REFRESH_PARTS
from gregor.common import errors

K = TypeVar("K", bound=Hashable)

# Errors a fetcher expects in normal operation (a leadership move, a restart): back off quietly.
BACKOFF_CODES = frozenset({errors.Code.FENCED_LEADER_EPOCH, errors.Code.NOT_LEADER_OR_FOLLOWER,
                           errors.Code.UNKNOWN_LEADER_EPOCH, errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                           errors.Code.NETWORK_EXCEPTION, errors.Code.REQUEST_TIMED_OUT,
                           errors.Code.KAFKA_STORAGE_ERROR,
                           # The leader knows a newer incarnation of us: our re-registration is under way.
                           errors.Code.STALE_BROKER_EPOCH})


@dataclass(eq=False)
class PartitionFetchState:
    """One followed partition under one leader epoch. Identity matters: a partition removed and added
    again (a topic deleted and re-created under the same name) gets a new object, hence a new session entry."""

    leader_epoch: int
    out_of_range: bool = False
    backoff_until: float = 0.0
    truncation_rounds: int = 0


@dataclass
class ErrorOutcome:
    """What a partition's fetch error means: truncate again (OFFSET_OUT_OF_RANGE) or back off; `unexpected`
    says the fetcher should log it (not a routine leadership-move error)."""

    restart_truncation: bool
    unexpected: bool


@dataclass
class FollowerFetchState(Generic[K]):
    """Every partition a follower copies from one leader, and its fetch session with that leader."""

    # Times are in the driver's clock unit (seconds on a broker, simulated milliseconds in tests/sim).
    refresh_after: float  # a full request at least this often: replica.lag.time.max.ms / REFRESH_PARTS
    backoff: float = REPLICA_FETCH_BACKOFF_S  # replica.fetch.backoff.ms
    partitions: dict[K, PartitionFetchState] = field(default_factory=dict)
    # The session (KIP-227): (fetch offset, leader epoch, state identity) last named per partition.
    _sent: dict[K, tuple[int, int, int, int]] = field(default_factory=dict)
    _full_at: float = float("-inf")
    # Bumped when a partition is added or dropped, backs off, or the session forgets it: while it stays put, the
    # fetcher may name only the partitions whose answers it applied (moved_request) instead of walking them all.
    version: int = 0

    @classmethod
    def for_lag_time(cls, replica_lag_time_max_ms: int, backoff_s: float = REPLICA_FETCH_BACKOFF_S
                     ) -> "FollowerFetchState[K]":
        """The broker's form: times in seconds."""
        return cls(refresh_after=replica_lag_time_max_ms / 1000 / REPLICA_FETCH_SESSION_REFRESH_PARTS,
                   backoff=backoff_s)

    # -- partitions ------------------------------------------------------------------------
    def add(self, key: K, leader_epoch: int) -> PartitionFetchState:
        st = self.partitions[key] = PartitionFetchState(leader_epoch)
        self.version += 1
        return st

    def drop(self, key: K, st: PartitionFetchState | None = None) -> None:
        """Stop fetching key (only if it is still `st`, when given)."""
        if st is None or self.partitions.get(key) is st:
            if self.partitions.pop(key, None) is not None:
                self.version += 1

    def current(self, key: K, st: PartitionFetchState) -> bool:
        return self.partitions.get(key) is st

    def keep(self, key: K, st: PartitionFetchState, follows: bool) -> bool:
        """Go on fetching key under st? Only while the replica still follows this fetcher's leader at st's epoch
        (follows: ReplicationState.is_current_follower) and st is still the state held for key; else key is
        dropped (a LeaderAndIsr moved it; the new one, if any, was added under a new state)."""
        if follows and self.partitions.get(key) is st:
            return True
        self.drop(key, st)
        return False

    def ready(self, now: float) -> list[tuple[K, PartitionFetchState]]:
        """The partitions not backing off, in insertion order."""
        return [(key, st) for key, st in list(self.partitions.items()) if st.backoff_until <= now]

    def wait_time(self, now: float) -> float:
        """How long to sleep when nothing is ready: until the first backoff ends (the backoff if none)."""
        waits = [st.backoff_until - now for st in self.partitions.values()]
        return max(0.0, min(waits, default=self.backoff)) or self.backoff

    # -- the session -----------------------------------------------------------------------
    def session_request(self, batch: Sequence[tuple[K, PartitionFetchState, int]], new_stream: bool,
                        now: float, log_starts: Sequence[int] | None = None) -> tuple[list[int], bool]:
        """Indexes into batch (key, state, fetch offset) to name in the next request, and whether it is incremental.

        Full on a new stream (a new session on the leader), when a partition left the set (the request has no
        way to take one out of the leader's session), and every refresh_after (so the leader records a fetch of
        every idle partition well within the lag limit); otherwise only partitions whose fetch offset, epoch or
        log start offset (log_starts, parallel to batch: the leader's DeleteRecords waits for it) moved, and
        partitions new to the set, which an incremental request adds to the leader's session (KIP-227): a
        creation adding 100 partitions per LeaderAndIsr chunk to a session of thousands re-listed them all per
        chunk (issue 24)."""
        sent = self._sent
        full = new_stream or sum(1 for k, _st, _o in batch if k in sent) != len(sent) \
            or now - self._full_at >= self.refresh_after
        if full:
            self._sent, self._full_at = {}, now
            listed = list(range(len(batch)))
        else:
            sent = self._sent
            listed = [i for i, (key, st, offset) in enumerate(batch)
                      if sent.get(key) != (offset, st.leader_epoch, id(st), log_starts[i] if log_starts else -1)]
        for i in listed:
            key, st, offset = batch[i]
            self._sent[key] = (offset, st.leader_epoch, id(st), log_starts[i] if log_starts else -1)
        return listed, not full

    def moved_request(self, moved: Sequence[tuple[K, PartitionFetchState, int, int]], now: float) -> list[int] | None:
        """session_request's incremental case in O(moved): the same partitions as the last request, none backing
        off or truncating (the caller's version check), and only `moved` (key, state, fetch offset, log start: the
        partitions whose answers were applied since) can have changed. Indexes into moved to name; None when
        a full request is due (refresh_after), which the caller then builds with session_request."""
        if now - self._full_at >= self.refresh_after:
            return None
        sent = self._sent
        listed = []
        for i, (key, st, offset, log_start) in enumerate(moved):
            sig = (offset, st.leader_epoch, id(st), log_start)
            if sent.get(key) != sig:
                sent[key] = sig
                listed.append(i)
        return listed

    def forget(self, key: K) -> None:
        """The leader's session will not read key again until it is named: name it next time (a full request)."""
        self._sent.pop(key, None)
        self.version += 1

    # -- answers ---------------------------------------------------------------------------
    def on_error(self, key: K, st: PartitionFetchState, code: int, now: float) -> ErrorOutcome:
        """A partition's fetch failed (a per-partition error or the whole stream)."""
        self.forget(key)
        if code == errors.Code.OFFSET_OUT_OF_RANGE:
            st.out_of_range = True
            return ErrorOutcome(restart_truncation=True, unexpected=False)
        st.backoff_until = now + self.backoff
        return ErrorOutcome(restart_truncation=False, unexpected=code not in BACKOFF_CODES)

    def on_apply_failed(self, key: K, st: PartitionFetchState, now: float) -> None:
        """Appending the fetched records failed (a bad batch, storage): back off, then truncate and refetch."""
        self.forget(key)
        st.backoff_until = now + self.backoff

    def on_truncation_failed(self, st: PartitionFetchState, now: float) -> None:
        st.truncation_rounds = 0
        st.backoff_until = now + self.backoff
        self.version += 1

    # -- truncation by leader epoch (seed 002) -----------------------------------------------
    @staticmethod
    def truncation_round_done(st: PartitionFetchState, completed: bool, asked_epoch: int,
                              latest_epoch_now: int | None) -> bool:
        """After one OffsetForLeaderEpoch answer was applied: stop asking? Stops when the ReplicationState says
        the truncation converged, when our latest epoch did not move (asking again would get the same
        answer), or after MAX_TRUNCATION_ROUNDS."""
        st.truncation_rounds += 1
        if completed or latest_epoch_now == asked_epoch or st.truncation_rounds >= MAX_TRUNCATION_ROUNDS:
            st.truncation_rounds = 0
            return True
        return False

    @staticmethod
    def truncation_finished(st: PartitionFetchState) -> None:
        """The partition goes back to fetching (after any out-of-range reset)."""
        st.out_of_range = False
        st.truncation_rounds = 0
