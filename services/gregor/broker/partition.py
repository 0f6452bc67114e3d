"""One partition replica on a broker: its log, leader epoch, ISR and high watermark.

Concurrency: owned by the broker's event loop; no locks. The native Log is
thread-safe on its own, so zero-copy sends may run on worker threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gregor_native as native

from gregor.broker.log_dirs import LogDirHealth, is_storage_error
from gregor.broker.producer_state import (
    PRODUCER_ID_EXPIRATION_MS_DEFAULT,
    BatchInfo,
    ProducerStateManager,
    parse_batch_infos,
)
from gregor.broker.replication_state import (
    Effect,
    FetchMode,
    HighWatermarkChanged,
    LeaderAndIsrOutcome,
    ProposeIsr,
    ReplicationState,
    StartLogAt,
    TruncateLog,
)
from gregor.broker.txn_markers import LSO_LAG, READ_COMMITTED, index_aborted
from gregor.common import errors, uuid
from gregor.common.clock import now_ms
from gregor.common.config import is_compacted, recompression_target
from gregor.common.isr import NO_BROKER_EPOCH, REPLICA_LAG_TIME_MAX_MS_DEFAULT, FollowerFetchState

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
    """One partition replica on this broker: the native log driven by its ReplicationState (seed 000's Partition).

    Every replication decision (leadership, epochs, ISR, HW, truncation) is the
    ReplicationState's; this class feeds it the log's offsets and the clock, carries out
    the log effects (truncate, epoch start) and hands the rest to the ReplicaManager.
    """

    topic: str
    partition: int
    log: native.Log
    local_broker_id: int
    configs: dict
    # replica.lag.time.max.ms (broker config): the ISR shrink bound and the HW's caught-up window.
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT
    # The metadata cache's live brokers -> broker epoch (None before the first UpdateMetadata; brokers in
    # controlled shutdown are left out): which caught-up followers the HW waits for (isReplicaIsrEligible).
    live_broker_epochs: Callable[[], dict[int, int] | None] | None = None
    # Idempotence (seed 003): producer ids' epochs and last batches, loaded on the first append.
    producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT
    producer_state: ProducerStateManager | None = None
    _segments_seen: tuple[int, int] = (-1, -1)  # (num_segments, active base offset) at the last append
    # The topic id (KIP-516) of this replica's log, as its partition.metadata says; b"" when unknown
    # (standalone, or a log from before topic ids that no LeaderAndIsr has named yet).
    topic_id: bytes = b""
    # The broker's offline log dirs (LogManager.health): appends to a log in an offline dir are refused up
    # front, and a storage error in an append takes the dir offline. None: no such bookkeeping (unit tests).
    dir_health: LogDirHealth | None = None
    state: ReplicationState = field(init=False)
    # Follower id -> (leader epoch, its log start offset) as its replica fetches report it (DeleteRecords'
    # low watermark); only entries of the current leader epoch count (Kafka resets them on becoming leader).
    _follower_log_starts: dict[int, tuple[int, int]] = field(init=False, default_factory=dict)
    # This partition's LSO-lag gauge child, looked up once: labels() costs a lock and a dict per call, and
    # last_stable_offset runs per partition per fetch.
    _lso_lag: Any = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.state = ReplicationState(self.local_broker_id, self.replica_lag_time_max_ms, self.topic, self.partition)

    # -- the replica state, read-only here (ReplicationState is its one writer) ------------------
    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    @property
    def leader_id(self) -> int:
        return self.state.leader_id

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    @property
    def partition_epoch(self) -> int:
        return self.state.partition_epoch

    @property
    def replicas(self) -> tuple[int, ...]:
        """A copy, like isr: the ReplicationState is the replica list's one writer."""
        return tuple(self.state.replicas)

    @property
    def isr(self) -> frozenset[int]:
        """A copy: the ReplicationState is the ISR's one writer."""
        return frozenset(self.state.isr)

    @property
    def high_watermark(self) -> int:
        return self.state.high_watermark

    @property
    def follower_states(self) -> dict[int, FollowerFetchState]:
        return self.state.follower_states

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def min_insync_replicas(self) -> int:
        return int(self.configs["min.insync.replicas"])

    def _live(self) -> dict[int, int] | None:
        return self.live_broker_epochs() if self.live_broker_epochs is not None else None

    def apply_log_effects(self, effects: list[Effect]) -> list[Effect]:
        """Carry out the effects on the log; the rest (fetchers, ISR writes, purgatories) go back to the caller."""
        rest: list[Effect] = []
        for e in effects:
            if isinstance(e, TruncateLog):
                self.log.truncate_to(e.offset)  # also when nothing goes: it trims an empty epoch at the LEO
            elif isinstance(e, StartLogAt):
                self.log.truncate_fully_and_start_at(e.offset)
            else:
                rest.append(e)
        return rest

    # -- events ----------------------------------------------------------------------------
    def make_standalone_leader(self) -> None:
        """A single-broker cluster: this broker leads with an ISR of itself."""
        self.state.become_standalone_leader(self.log.latest_epoch(), self.log.log_end_offset,
                                            self.log.log_start_offset, now_ms())

    def apply_leader_and_isr(self, leader: int, leader_epoch: int, isr: list[int], replicas: list[int],
                             partition_epoch: int = -1) -> LeaderAndIsrOutcome:
        """One partition of a LeaderAndIsr; the log effects are applied, the others returned."""
        out = self.state.on_leader_and_isr(leader, leader_epoch, isr, replicas, partition_epoch,
                                           self.log.log_end_offset, self.log.log_start_offset, now_ms())
        return LeaderAndIsrOutcome(out.error, self.apply_log_effects(out.effects))

    def make_leader(self, leader_epoch: int, isr: list[int], replicas: list[int]) -> bool:
        """Lead at leader_epoch; False if that epoch is not newer than ours (tests and standalone tools)."""
        return self.apply_leader_and_isr(self.local_broker_id, leader_epoch, isr, replicas).applied

    def make_follower(self, leader_id: int, leader_epoch: int, isr: list[int], replicas: list[int]) -> bool:
        """Follow leader_id at leader_epoch; False if that epoch is not newer than ours."""
        return self.apply_leader_and_isr(leader_id, leader_epoch, isr, replicas).applied

    def acks_all_outcome(self, last_offset: int) -> bool | None:
        """True once the HW passed last_offset, False if leadership moved first, None while waiting."""
        return self.state.acks_all_outcome(last_offset)

    def stop(self) -> list[Effect]:
        """StopReplica: waiters wake up to NOT_LEADER_OR_FOLLOWER."""
        return self.state.on_stop_replica()

    def load_high_watermark(self, checkpointed: int) -> None:
        self.state.load_high_watermark(checkpointed, self.log.log_start_offset, self.log.log_end_offset)

    def on_follower_log_start(self, replica_id: int, log_start_offset: int) -> bool:
        """A follower's fetch reported its log start offset; True if that is news at this leader epoch."""
        entry = (self.leader_epoch, log_start_offset)
        if self._follower_log_starts.get(replica_id) == entry:
            return False
        self._follower_log_starts[replica_id] = entry
        return True

    def follower_log_start(self, replica_id: int) -> int:
        """The follower's last reported log start offset at this leader epoch, -1 if none yet."""
        epoch, offset = self._follower_log_starts.get(replica_id, (-1, -1))
        return offset if epoch == self.leader_epoch else -1

    # ------------------------------------------------------------------ replication (seed 000)
    def check_follower_broker_epoch(self, replica_id: int, broker_epoch: int, live_epoch: int | None) -> None:
        """Refuse a follower fetch from an earlier incarnation of that broker (STALE_BROKER_EPOCH)."""
        self.state.check_follower_fetch(replica_id, broker_epoch, live_epoch)

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, broker_epoch: int = NO_BROKER_EPOCH,
                          fetch_time_ms: int | None = None) -> list[Effect]:
        """A follower fetched at fetch_offset (its LEO): HW and ISR expansion effects."""
        return self.state.on_follower_fetch(replica_id, fetch_offset, broker_epoch, self.log.log_end_offset,
                                            now_ms() if fetch_time_ms is None else fetch_time_ms, self._live())

    def reconsider_isr_expansion(self, replica_id: int) -> list[Effect]:
        """The live brokers changed: maybe add `replica_id` to the ISR on its last fetch (ReplicationState)."""
        return self.state.reconsider_isr_expansion(replica_id, self._live())

    def on_tick(self, now: int | None = None) -> list[Effect]:
        """isr-expiration round: ISR shrink proposals and HW effects."""
        return self.state.on_tick(self.log.log_end_offset, now_ms() if now is None else now, self._live())

    def on_isr_write_result(self, leader_epoch: int, isr: list[int] | None, partition_epoch: int,
                            outcome_unknown: bool = False) -> list[Effect]:
        return self.state.on_isr_write_result(leader_epoch, isr, partition_epoch, self.log.log_end_offset,
                                              now_ms(), self._live(), outcome_unknown)

    def maybe_increment_leader_hw(self, now: int | None = None) -> list[Effect]:
        """Seed 000's maybeIncrementLeaderHW (decided by the ReplicationState): HighWatermarkChanged if it moved."""
        return self.state.on_local_append(self.log.log_end_offset, now_ms() if now is None else now, self._live())

    def check_topic_id(self, topic_id: bytes) -> None:
        """UNKNOWN_TOPIC_ID when a request names another topic id than this replica's (KIP-516): the
        client's topic was deleted and this one is a new topic under the same name (or the reverse).
        An empty id on either side skips the check (older clients; standalone)."""
        if topic_id and self.topic_id and topic_id != self.topic_id:
            raise errors.error_for(
                errors.Code.UNKNOWN_TOPIC_ID,
                f"Topic id {uuid.to_string(topic_id)} is not the id of {self.topic} "
                f"({uuid.to_string(self.topic_id)}): the topic was deleted and re-created",
                topic=self.topic, partition=self.partition)

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER / FENCED_LEADER_EPOCH unless we lead at that epoch."""
        self.state.check_leader(current_leader_epoch)

    def check_offsets_available(self) -> None:
        """OFFSET_NOT_AVAILABLE while a new leader's HW is below its term's start (KIP-207)."""
        self.state.check_offsets_available()

    # -- follower side -----------------------------------------------------------------------
    def follows(self, leader_id: int, leader_epoch: int) -> bool:
        """Do we still follow leader_id at leader_epoch? (a fetcher's work for an older term is dropped)"""
        return self.state.is_current_follower(leader_id, leader_epoch)

    @property
    def is_truncating(self) -> bool:
        """A follower that must truncate by leader epoch before its next fetch (seed 002)."""
        return self.state.fetch_mode is FetchMode.TRUNCATING

    def restart_truncation(self) -> None:
        """OFFSET_OUT_OF_RANGE from the leader, or a failed append: truncate again before the next fetch."""
        self.state.restart_truncation()

    def finish_truncation(self) -> None:
        """Truncation rounds are over: fetch from the LEO."""
        self.state.finish_truncation(self.log.log_end_offset)

    def reset_to_leader_log_range(self, leader_log_start: int, leader_hw: int) -> Effect | None:
        """Still out of range after epoch truncation: start over at the leader's log start, or cut what lies past
        its HW (the ReplicationState decides; the log effect is applied here and returned for the log line)."""
        effect = self.state.on_leader_log_range(leader_log_start, leader_hw, self.log.log_end_offset)
        if effect is not None:
            self.apply_log_effects([effect])
        return effect

    def truncation_query(self) -> int | None:
        """The epoch to ask the leader about before fetching; None after a HW truncation (no epochs)."""
        q = self.state.truncation_query(self.log.latest_epoch(), self.log.log_end_offset)
        if isinstance(q, TruncateLog):
            self.apply_log_effects([q])
            return None
        return q

    def on_truncation_point(self, asked_epoch: int, leader_epoch: int, end_offset: int) -> bool:
        """Truncate by the leader's OffsetForLeaderEpoch answer (seed 002); True when truncation is complete."""
        effect, completed = self.state.on_truncation_point(leader_epoch, end_offset, self.log.epoch_entries(),
                                                           self.log.log_end_offset)
        if effect.offset < self.log.log_end_offset:
            log.info("%s-%d: truncating to %d by leader epoch (asked %d, leader said %d@%d)", self.topic,
                     self.partition, effect.offset, asked_epoch, leader_epoch, end_offset)
        self.apply_log_effects([effect])
        return completed

    def append_fetched(self, records: bytes, leader_hw: int) -> list[Effect]:
        """A follower's fetch response: append the leader's batches, then take the HW (seed 004)."""
        if records:
            self.append_records_to_follower(records)
        return self.state.on_follower_fetched(leader_hw, self.log.log_end_offset)

    def append_records_to_leader(self, records: bytes, required_acks: int, is_marker: bool = False
                                 ) -> tuple[native.AppendInfo | DuplicateAppendInfo, list[Effect]]:
        """Validate and append as leader; offsets are assigned in the native engine. Returns the append and its
        effects (the HW of a one-replica ISR moves: Kafka's appendRecordsToLeader returning leaderHWIncremented),
        which the caller runs like every other Partition event's (ReplicaManager.after_leader_append).

        Idempotent batches are checked against the ProducerStateManager first
        (header fields only): a duplicate answers its original offsets without
        appending; a gap or a stale epoch rejects the request before any write.
        """
        self.state.check_append(required_acks, self.min_insync_replicas)
        health = self.dir_health
        if health is not None:
            health.check(self.log.dir, self.topic, self.partition)
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
                return DuplicateAppendInfo(duplicate.first_offset, duplicate.last_offset), []
        try:
            info = self.log.append_as_leader(records, self.leader_epoch, now_ms())
        except Exception as exc:
            raise self._append_error(exc) from exc
        self._update_producer_state(batches, info.first_offset)
        return info, self.maybe_increment_leader_hw()

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
        health = self.dir_health
        if health is not None:
            health.check(self.log.dir, self.topic, self.partition)
        self.producer_state_manager()
        try:
            info = self.log.append_as_follower(records)
        except Exception as exc:
            raise self._append_error(exc) from exc
        self._update_producer_state(parse_batch_infos(records), None)
        return info

    def _append_error(self, exc: Exception) -> errors.GregorError:
        """The Kafka error of a failed append; a storage error takes the log dir offline (KAFKA_STORAGE_ERROR
        naming the dir) and the producer state is reloaded from the log at the next append."""
        if is_storage_error(exc):
            # A write that failed part-way left no bytes past the segment's end: native Segment::append (and the
            # streamed leader append) cut the file back to it. LogManager.try_recover_dir reopens the log (full
            # recovery) before the dir serves writes again.
            self.producer_state = None  # the log may hold part of what failed: rebuild from the log
            if self.dir_health is not None:
                return self.dir_health.failed(self.log.dir, exc, self.topic, self.partition)
        return native_error(exc, self.topic, self.partition)

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

    @property
    def last_stable_offset(self) -> int:
        """The LSO (the ReplicationState's rule, fed the producer state's first unstable offset); as leader it
        also updates the LSO-lag gauge."""
        hw = self.high_watermark
        lso = self.state.last_stable_offset(self.producer_state_manager().first_unstable_offset(hw))
        if self.is_leader:
            gauge = self._lso_lag
            if gauge is None:
                gauge = self._lso_lag = LSO_LAG.labels(topic=self.topic, partition=str(self.partition))
            gauge.set(hw - lso)
        return lso

    def fetch_upper_bound(self, is_follower: bool, isolation_level: int = 0) -> int:
        """Followers read up to the LEO; consumers below the high watermark, read_committed consumers below
        the LSO (the ReplicationState's rules)."""
        if not is_follower and isolation_level == READ_COMMITTED:
            return self.last_stable_offset
        return self.state.fetch_upper_bound(is_follower, self.log.log_end_offset)

    def read_slice(self, fetch_offset: int, max_bytes: int, is_follower: bool,
                   isolation_level: int = 0) -> native.FileSlice:
        try:
            upper = self.fetch_upper_bound(is_follower, isolation_level)
            return self.log.read_slice(fetch_offset, max_bytes, upper, True)
        except Exception as exc:
            raise native_error(exc, self.topic, self.partition) from exc
