"""One partition replica on a broker: its log, leader epoch, ISR and high watermark.

Concurrency: owned by the broker's event loop; no locks. The native Log is
thread-safe on its own, so zero-copy sends may run on worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import gregor_native as native

from gregor.broker.producer_state import (
    PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    BatchInfo,
    ProducerStateManager,
    parse_batch_infos,
)
from gregor.broker.txn_markers import READ_COMMITTED, index_aborted, partition_lso
from gregor.common import errors
from gregor.common.clock import now_ms
from gregor.common.config import is_compacted, recompression_target
from gregor.common.isr import (
    NO_BROKER_EPOCH,
    REPLICA_LAG_TIME_MAX_MS_DEFAULT,
    FollowerFetchState,
    compute_high_watermark,
    is_isr_eligible,
    is_stale_follower_fetch,
    isr_eligible_followers,
    maybe_expand_isr,
    maybe_shrink_isr,
)

log = logging.getLogger(__name__)


def native_error(exc: Exception, topic: str, partition: int) -> errors.GregorError:
    """Map an exception from the native engine to its Kafka error."""
    where = {"topic": topic, "partition": partition}
    if isinstance(exc, native.CorruptRecordError):
        return errors.error_for(errors.Code.CORRUPT_MESSAGE, str(exc), **where)
    if isinstance(exc, native.RecordTooLargeError):
        return errors.error_for(errors.Code.MESSAGE_TOO_LARGE, str(exc), **where)
    if isinstance(exc, native.InvalidRecordError):
        return errors.error_for(errors.Code.INVALID_RECORD, str(exc), **where)
    if isinstance(exc, native.OffsetOutOfRangeError):
        return errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, str(exc), **where)
    if isinstance(exc, (OSError, native.LogClosedError)):
        return errors.error_for(errors.Code.KAFKA_STORAGE_ERROR, str(exc), **where)
    return errors.error_for(errors.Code.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}", **where)


@dataclass(frozen=True)
class DuplicateAppendInfo:
    """An idempotent retry of a batch already in the log: its original offsets; nothing was appended."""

    first_offset: int
    last_offset: int
    num_records: int = 0
    valid_bytes: int = 0
    duplicate: bool = True


@dataclass
class Partition:
    """Replica state of one partition on this broker (seed 000's Partition)."""

    topic: str
    partition: int
    log: native.Log
    local_broker_id: int
    configs: dict
    leader_id: int = -1
    leader_epoch: int = -1
    replicas: list[int] = field(default_factory=list)
    isr: set[int] = field(default_factory=set)
    high_watermark: int = 0
    # Followers' fetch state: LEO and last caught-up time (leader only, seed 000).
    follower_states: dict[int, FollowerFetchState] = field(default_factory=dict)
    # LEO when this broker became leader: the start offset of its leader epoch (ISR expansion bound).
    leader_epoch_start_offset: int | None = None
    # etcd version of the partition state as LeaderAndIsr told us (partition_epoch + 1); -1 unknown.
    partition_epoch: int = -1
    # An ISR write to etcd is in flight (one at a time per partition).
    isr_update_in_flight: bool = False
    # replica.lag.time.max.ms (broker config): the ISR shrink bound and the HW's caught-up window.
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT
    # The metadata cache's live brokers -> broker epoch (None before the first UpdateMetadata; brokers in
    # controlled shutdown are left out): which caught-up followers the HW waits for (isReplicaIsrEligible).
    live_broker_epochs: Callable[[], dict[int, int] | None] | None = None
    # Idempotence (seed 003): producer ids' epochs and last batches, loaded on the first append.
    producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT
    producer_state: ProducerStateManager | None = None
    _segments_seen: tuple[int, int] = (-1, -1)  # (num_segments, active base offset) at the last append

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def min_insync_replicas(self) -> int:
        return int(self.configs["min.insync.replicas"])

    def make_standalone_leader(self) -> None:
        """A single-broker cluster: this broker leads with an ISR of itself."""
        self.leader_id = self.local_broker_id
        self.leader_epoch = max(self.leader_epoch, self.log.latest_epoch() or 0)
        self.replicas = [self.local_broker_id]
        self.isr = {self.local_broker_id}
        self.high_watermark = max(self.high_watermark, self.log.log_start_offset)
        self.maybe_increment_leader_hw()

    def make_leader(self, leader_epoch: int, isr: list[int], replicas: list[int]) -> bool:
        """Become leader at leader_epoch (LeaderAndIsr); False if that epoch is older than ours."""
        if leader_epoch < self.leader_epoch:
            return False
        if self.is_leader and leader_epoch == self.leader_epoch:
            # Same term re-sent (e.g. a broker restarted): keep what the followers' fetches told us.
            self.replicas = list(replicas)
            self.isr = set(isr)
            self.maybe_increment_leader_hw()
            return True
        self.leader_id = self.local_broker_id
        self.leader_epoch = leader_epoch
        self.replicas = list(replicas)
        self.isr = set(isr)
        # Followers' LEOs are unknown (0) until they fetch under the new epoch.
        now = now_ms()
        self.follower_states = {}
        for r in replicas:
            if r != self.local_broker_id:
                state = FollowerFetchState()
                state.reset(now, r in self.isr)
                self.follower_states[r] = state
        self.leader_epoch_start_offset = self.log.log_end_offset
        self.high_watermark = max(self.high_watermark, self.log.log_start_offset)
        self.maybe_increment_leader_hw()
        return True

    def make_follower(self, leader_id: int, leader_epoch: int, isr: list[int], replicas: list[int]) -> bool:
        """Follow leader_id at leader_epoch (LeaderAndIsr); False if that epoch is older than ours.

        Consumers and producers get NOT_LEADER_OR_FOLLOWER from now on; the
        ReplicaManager truncates the log by leader epoch and starts a fetcher.
        """
        if leader_epoch < self.leader_epoch:
            return False
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.replicas = list(replicas)
        self.isr = set(isr)
        self.follower_states = {}
        self.leader_epoch_start_offset = None
        return True

    # ------------------------------------------------------------------ replication (seed 000)
    def check_follower_broker_epoch(self, replica_id: int, broker_epoch: int, live_epoch: int | None) -> None:
        """Refuse a follower fetch from an earlier incarnation of that broker (STALE_BROKER_EPOCH).

        The newest epoch known for the follower is the larger of what its accepted
        fetches carried and what the controller's live-broker list says (KIP-380).
        """
        state = self.follower_states.get(replica_id)
        newest = max(state.broker_epoch if state is not None else NO_BROKER_EPOCH,
                     live_epoch if live_epoch is not None else NO_BROKER_EPOCH)
        if is_stale_follower_fetch(broker_epoch, newest):
            raise errors.error_for(
                errors.Code.STALE_BROKER_EPOCH,
                f"fetch from broker {replica_id} at broker epoch {broker_epoch}, older than {newest}",
                topic=self.topic, partition=self.partition)

    def update_follower_fetch_state(self, replica_id: int, fetch_offset: int, fetch_time_ms: int,
                                    broker_epoch: int = NO_BROKER_EPOCH) -> bool:
        """A follower fetched at fetch_offset (its LEO): record it; True if the HW moved."""
        if not self.is_leader or replica_id not in self.replicas or replica_id == self.local_broker_id:
            return False
        state = self.follower_states.setdefault(replica_id, FollowerFetchState())
        state.update_fetch_state(fetch_offset, self.log.log_end_offset, fetch_time_ms)
        if broker_epoch != NO_BROKER_EPOCH:
            state.broker_epoch = max(state.broker_epoch, broker_epoch)
        return self.maybe_increment_leader_hw(fetch_time_ms)

    def needs_expand_isr(self, replica_id: int, live_broker_epochs: dict[int, int] | None = None) -> bool:
        """A follower outside the ISR whose LEO reached the HW and its leader epoch's start (seed 000).

        With the controller's live-broker epochs given, only the registered incarnation
        of the follower is eligible (KIP-903): a fetch from a dead or older one is not.
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

    def out_of_sync_isr(self, now: int, replica_lag_time_max_ms: int) -> list[int] | None:
        """The shrunk ISR if some follower was not caught up within replica.lag.time.max.ms, else None."""
        if not self.is_leader:
            return None
        caught_up = {r: s.last_caught_up_time_ms for r, s in self.follower_states.items()}
        leos = {r: s.log_end_offset for r, s in self.follower_states.items()}
        return maybe_shrink_isr(sorted(self.isr), self.local_broker_id, caught_up, now, replica_lag_time_max_ms,
                                leos, self.log.log_end_offset)

    def update_follower_high_watermark(self, leader_hw: int) -> bool:
        """Follower HW = min(leader HW, own LEO); True if it changed."""
        new_hw = min(leader_hw, self.log.log_end_offset)
        if new_hw != self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH unless we lead at that epoch."""
        where = {"topic": self.topic, "partition": self.partition,
                 "leader_id": self.leader_id, "leader_epoch": self.leader_epoch}
        if current_leader_epoch >= 0 and current_leader_epoch < self.leader_epoch:
            raise errors.error_for(errors.Code.FENCED_LEADER_EPOCH,
                                   f"leader epoch {current_leader_epoch} is older than {self.leader_epoch}", **where)
        if current_leader_epoch > self.leader_epoch:
            raise errors.error_for(errors.Code.UNKNOWN_LEADER_EPOCH,
                                   f"leader epoch {current_leader_epoch} is newer than {self.leader_epoch}", **where)
        if not self.is_leader:
            raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER,
                                   f"broker {self.local_broker_id} is not the leader", **where)

    def append_records_to_leader(self, records: bytes, required_acks: int,
                                 is_marker: bool = False) -> native.AppendInfo | DuplicateAppendInfo:
        """Validate and append as leader; offsets are assigned in the native engine.

        Idempotent batches are checked against the ProducerStateManager first
        (header fields only): a duplicate answers its original offsets without
        appending; a gap or a stale epoch rejects the request before any write.
        """
        self.check_leader()
        if required_acks == -1 and len(self.isr) < self.min_insync_replicas:
            raise errors.error_for(
                errors.Code.NOT_ENOUGH_REPLICAS,
                f"ISR size {len(self.isr)} is below min.insync.replicas {self.min_insync_replicas}",
                topic=self.topic, partition=self.partition)
        records = self._recompress(records)
        batches = parse_batch_infos(records)  # None: not whole batches, the engine rejects it below
        if batches is not None and not is_marker and any(b.is_control for b in batches):
            raise errors.error_for(errors.Code.INVALID_RECORD,
                                   "client produce requests may not carry control batches (only WriteTxnMarkers)",
                                   topic=self.topic, partition=self.partition)
        psm = self.producer_state_manager()
        if batches is not None:
            duplicate = psm.check_leader_append(batches)
            if duplicate is not None:
                return DuplicateAppendInfo(duplicate.first_offset, duplicate.last_offset)
        try:
            info = self.log.append_as_leader(records, self.leader_epoch, now_ms())
        except Exception as exc:
            raise native_error(exc, self.topic, self.partition) from exc
        self._update_producer_state(batches, info.first_offset)
        self.maybe_increment_leader_hw()
        return info

    def _recompress(self, records: bytes) -> bytes:
        """Leader only: batches not in the topic's compression.type rewritten into it (Kafka's LogValidator).

        One native call (GIL released); compression.type=producer, or every batch already in the
        topic's codec, keeps the producer's bytes. Producer id/epoch/sequence stay in the header,
        so the ProducerStateManager below reads the rewritten batches. Followers copy the leader's bytes.
        """
        target = recompression_target(self.configs)
        if target is None:
            return records
        try:
            rewritten = native.recompress_batches(
                records, target[0], int(self.configs.get("max.message.bytes", 1048588)),
                level=target[1], require_keys=is_compacted(self.configs))
        except Exception as exc:
            raise native_error(exc, self.topic, self.partition) from exc
        return records if rewritten is None else rewritten

    def append_records_to_follower(self, records: bytes) -> native.AppendInfo:
        """Append replicated batches (offsets and epochs kept) and apply them to the producer state."""
        self.producer_state_manager()
        info = self.log.append_as_follower(records)
        self._update_producer_state(parse_batch_infos(records), None)
        return info

    # ------------------------------------------------------------------ producer state (idempotence)
    def producer_state_manager(self) -> ProducerStateManager:
        """The partition's ProducerStateManager, loaded (snapshot + header scan) on first use.

        Every append goes through the Partition, so the state's end offset equals
        the LEO; if it does not, the log was truncated (replication) or reset
        since, and the state is rebuilt from the snapshots for the log as it is.
        """
        psm = self.producer_state
        if psm is None:
            psm = ProducerStateManager(self.topic, self.partition, self.log.dir, self.producer_id_expiration_ms)
        try:
            if psm is not self.producer_state or psm.map_end_offset != self.log.log_end_offset:
                psm.load(self.log)
            if psm is not self.producer_state:
                self._segments_seen = (self.log.num_segments, self.log.segments()[-1].base_offset)
        except Exception as exc:  # unreadable log: this append fails, the next one tries again
            self.producer_state = None
            raise native_error(exc, self.topic, self.partition) from exc
        self.producer_state = psm
        return psm

    def _update_producer_state(self, batches: list[BatchInfo] | None, first_offset: int | None) -> None:
        psm = self.producer_state
        if psm is None:
            return
        if batches is not None and any(b.producer_id >= 0 for b in batches):
            index_aborted(self.log, psm.update(batches, first_offset))
        psm.map_end_offset = self.log.log_end_offset
        now = now_ms()
        if psm.maybe_remove_expired_producers(now):
            psm.delete_snapshots(below=self.log.log_start_offset, keep_latest=True)
        segments = self.log.num_segments
        if segments != self._segments_seen[0]:
            active = self.log.segments()[-1].base_offset
            if active != self._segments_seen[1]:
                self.snapshot_producer_state()  # a segment rolled: Kafka snapshots at every roll
            self._segments_seen = (segments, active)

    def snapshot_producer_state(self) -> None:
        """Write `<LEO:020>.snapshot` if the state is loaded (segment roll, clean shutdown)."""
        psm = self.producer_state
        if psm is None or psm.map_end_offset != self.log.log_end_offset:
            return
        try:
            psm.take_snapshot()
        except OSError as exc:
            log.warning("%s-%d: cannot write producer snapshot: %s",
                        self.topic, self.partition, exc)

    def maybe_increment_leader_hw(self, now: int | None = None) -> bool:
        """Seed 000's maybeIncrementLeaderHW: min LEO of the ISR and caught-up ISR-eligible followers; never back."""
        leo = self.log.log_end_offset
        if self.high_watermark > leo:
            return False  # only a follower's view can be ahead of its own log; a leader never lowers it
        states = self.follower_states
        leos = {r: s.log_end_offset for r, s in states.items()}
        leos.update({r: 0 for r in self.isr if r != self.local_broker_id and r not in states})
        live = self.live_broker_epochs() if self.live_broker_epochs is not None else None
        new_hw = compute_high_watermark(
            leo, self.isr, leos, self.high_watermark, self.local_broker_id,
            {r: s.last_caught_up_time_ms for r, s in states.items()}, now if now is not None else now_ms(),
            self.replica_lag_time_max_ms,
            isr_eligible_followers({r: s.broker_epoch for r, s in states.items()}, live))
        if new_hw > self.high_watermark:
            self.high_watermark = new_hw
            return True
        return False

    @property
    def last_stable_offset(self) -> int:
        """The LSO (seed 003): below the oldest open transaction, or the HW when none is open."""
        return partition_lso(self)

    def fetch_upper_bound(self, is_follower: bool, isolation_level: int = 0) -> int:
        """Followers read up to the LEO; consumers below the high watermark, read_committed below the LSO."""
        if is_follower:
            return self.log.log_end_offset
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark

    def read_slice(self, fetch_offset: int, max_bytes: int, is_follower: bool,
                   isolation_level: int = 0) -> native.FileSlice:
        try:
            upper = self.fetch_upper_bound(is_follower, isolation_level)
            return self.log.read_slice(fetch_offset, max_bytes, upper, True)
        except Exception as exc:
            raise native_error(exc, self.topic, self.partition) from exc
