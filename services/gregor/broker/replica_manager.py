"""ReplicaManager: the broker's partitions, the produce and fetch paths and their purgatories.

handle_produce appends through the leader Partition (offsets assigned in the
native engine, no per-record Python work) and parks acks=all requests in the
DelayedProduce purgatory until the high watermark passes them. handle_fetch
answers at once when enough bytes are there, no wait was asked, or an error
happened; otherwise a DelayedFetch waits for an append (seed 004).
Concurrency: event-loop owned; no locks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence

import gregor_native as native
from prometheus_client import Counter, Gauge

from gregor.broker.limits import CONTROL_YIELD_S, HW_CHECKPOINT_INTERVAL_MS, LEADER_AND_ISR_CHUNK
from gregor.broker import checkpoint
from gregor.broker.log_manager import LogManager, write_partition_metadata
from gregor.broker.partition import DuplicateAppendInfo, Partition, native_error
from gregor.broker.replication_state import (
    ControlRequestFence,
    Effect,
    ProposeIsr,
    StartFetcher,
    dispatch_effects,
)
from gregor.broker.fetch_session import FetchSessionCache
from gregor.broker.purgatory import DelayedOperation, DelayedOperationPurgatory
from gregor.broker.delete_records import DelayedDeleteRecords, PartitionStatus, delete_on_leader
from gregor.broker.txn_markers import READ_COMMITTED, aborted_transactions
from gregor.common import errors, uuid
from gregor.common.clock import now_ms
from gregor.common.config import BrokerConfig, effective_topic_configs

if TYPE_CHECKING:
    from gregor.broker.isr_manager import IsrManager
    from gregor.broker.metadata_cache import MetadataCache
    from gregor.broker.replica_fetcher import ReplicaFetcherManager

log = logging.getLogger(__name__)

BYTES_IN = Counter("gregor_broker_topic_bytes_in_total", "Bytes appended by produce requests", ["topic"])
MESSAGES_IN = Counter("gregor_broker_topic_messages_in_total", "Records appended by produce requests", ["topic"])
BYTES_OUT = Counter("gregor_broker_topic_bytes_out_total", "Bytes returned by fetch requests", ["topic"])
FAILED_PRODUCE = Counter("gregor_broker_failed_produce_requests_total", "Produce requests that failed", ["error"])
DUPLICATE_BATCHES = Counter("gregor_broker_produce_duplicate_requests_total",
                            "Idempotent retries answered with their original offsets, not appended again", ["topic"])
FAILED_FETCH = Counter("gregor_broker_failed_fetch_requests_total", "Fetch requests that failed", ["error"])
PARTITION_COUNT = Gauge("gregor_broker_partitions", "Partition replicas hosted by this broker")
LEADER_COUNT = Gauge("gregor_broker_leader_partitions", "Partitions this broker leads")
UNDER_REPLICATED = Gauge("gregor_broker_under_replicated_partitions", "Led partitions whose ISR is smaller than the replica set")
UNDER_MIN_ISR = Gauge("gregor_broker_under_min_isr_partitions", "Led partitions whose ISR is below min.insync.replicas")

ACKS_VALUES = (0, 1, -1)


def _check_acks(acks: int, **where: Any) -> None:
    if acks not in ACKS_VALUES:
        FAILED_PRODUCE.labels(error="INVALID_REQUIRED_ACKS").inc()
        raise errors.error_for(errors.Code.INVALID_REQUIRED_ACKS, f"acks must be 0, 1 or -1 (all), got {acks}",
                               **where)


def _produce_result(p: Partition, info: "native.AppendInfo | DuplicateAppendInfo") -> "ProduceResult":
    return ProduceResult(info.first_offset, info.last_offset, p.log.log_start_offset,
                         isinstance(info, DuplicateAppendInfo))


def _settled(future: "asyncio.Future[ProduceResult]") -> "ProduceResult | errors.GregorError":
    exc = future.exception()
    if exc is None:
        return future.result()
    if isinstance(exc, errors.GregorError):
        return exc
    raise exc


def produce_pending(results: list[Any]) -> bool:
    """Whether start_produce_partitions left partitions waiting for their acks."""
    return any(isinstance(r, asyncio.Future) for r in results)


async def collect_produce(results: list[Any]) -> list["ProduceResult | errors.GregorError"]:
    """Wait for the acks=-1 partitions of start_produce_partitions (they run at once), in request order."""
    for i, item in enumerate(results):
        if isinstance(item, asyncio.Future):
            try:
                results[i] = await item
            except errors.GregorError as err:
                results[i] = err
    return results


class _EffectiveConfigs(dict):  # type: ignore[type-arg]
    """Topic -> effective configs; a topic the request named no configs for gets the broker defaults."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        super().__init__()
        self._defaults = defaults

    def __missing__(self, topic: str) -> dict[str, Any]:
        configs = self[topic] = effective_topic_configs({}, self._defaults)
        return configs


class LeaderAndIsrState(Protocol):
    """One partition of a LeaderAndIsr request (the proto message satisfies it)."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    isr: Iterable[int]
    replicas: Iterable[int]


@dataclass(frozen=True)
class ProduceResult:
    base_offset: int
    last_offset: int
    log_start_offset: int
    # An idempotent retry of a batch already in the log: the offsets are the original ones.
    duplicate: bool = False


@dataclass(frozen=True)
class FetchResult:
    slice: native.FileSlice
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    leader_epoch: int
    # read_committed: (producer id, first offset) of aborted transactions in range (txn_markers.py).
    aborted_transactions: tuple[tuple[int, int], ...] = ()


class DelayedProduce(DelayedOperation[ProduceResult]):
    """acks=all: done once the high watermark passes the append (seed 004)."""

    def __init__(self, delay_ms: int, partition: Partition, info: "native.AppendInfo | DuplicateAppendInfo") -> None:
        super().__init__(delay_ms)
        self.partition = partition
        self.info = info

    def try_complete(self) -> bool:
        if self.partition.acks_all_outcome(self.info.last_offset) is not None:
            return self.force_complete()
        return False

    def on_complete(self) -> ProduceResult:
        p = self.partition
        where = {"topic": p.topic, "partition": p.partition}
        outcome = p.acks_all_outcome(self.info.last_offset)
        if outcome:
            if len(p.isr) < p.min_insync_replicas:
                raise errors.error_for(errors.Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                       "ISR shrank below min.insync.replicas after the append", **where)
            return ProduceResult(self.info.first_offset, self.info.last_offset, p.log.log_start_offset,
                                 isinstance(self.info, DuplicateAppendInfo))
        if outcome is False:
            raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "leadership moved before replication",
                                   leader_id=p.leader_id, leader_epoch=p.leader_epoch, **where)
        raise errors.error_for(errors.Code.REQUEST_TIMED_OUT,
                               f"ISR did not replicate offset {self.info.last_offset} within {self.delay_ms} ms",
                               **where)


class DelayedFetch(DelayedOperation[FetchResult]):
    """A fetch waiting for min_bytes (or its max wait); completes on append or HW change."""

    def __init__(self, delay_ms: int, read: Callable[[], FetchResult], min_bytes: int) -> None:
        super().__init__(delay_ms)
        self._read = read
        self.min_bytes = min_bytes
        self._result: FetchResult | None = None

    def try_complete(self) -> bool:
        try:
            result = self._read()
        except errors.GregorError:
            return self.force_complete()  # on_complete re-raises it for the waiter
        if result.slice.length >= self.min_bytes:
            self._result = result
            return self.force_complete()
        return False

    def on_complete(self) -> FetchResult:
        return self._result if self._result is not None else self._read()


class ReplicaManager:
    """The partitions of this broker and the produce/fetch paths (event-loop owned)."""

    def __init__(self, config: BrokerConfig, log_manager: LogManager) -> None:
        self.config = config
        self.log_manager = log_manager
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.topic_overrides: dict[str, dict[str, Any]] = {}  # topic -> its overrides, as LeaderAndIsr named them
        # The newest controller epoch seen in a control request (Kafka's ReplicaManager.controllerEpoch).
        self.control_fence = ControlRequestFence()
        self.produce_purgatory: DelayedOperationPurgatory[ProduceResult] = DelayedOperationPurgatory("Produce")
        self.fetch_purgatory: DelayedOperationPurgatory[FetchResult] = DelayedOperationPurgatory("Fetch")
        self.delete_records_purgatory: DelayedOperationPurgatory[dict[tuple[str, int], PartitionStatus]] = \
            DelayedOperationPurgatory("DeleteRecords")
        # KIP-227 consumer fetch sessions (broker/consumer_fetch.py), shared by gRPC and the Kafka listener.
        self.fetch_sessions = FetchSessionCache(config.max_incremental_fetch_session_cache_slots)
        log_manager.retention_upper_bound = self._retention_upper_bound
        log_manager.on_log_start_moved = self.fetch_purgatory.check_and_complete
        log_manager.on_quarantine = self._forget_checkpointed_hw
        log_manager.on_log_reopened = self._log_reopened
        log_manager.before_close = self._snapshot_before_close
        PARTITION_COUNT.set_function(lambda: len(self.partitions))
        LEADER_COUNT.set_function(lambda: sum(1 for p in self.partitions.values() if p.is_leader))
        UNDER_REPLICATED.set_function(
            lambda: sum(1 for p in self.partitions.values() if p.is_leader and len(p.isr) < len(p.replicas)))
        UNDER_MIN_ISR.set_function(
            lambda: sum(1 for p in self.partitions.values() if p.is_leader and len(p.isr) < p.min_insync_replicas))
        # Cluster mode only (attach_replication): fetchers, ISR writes, HW checkpoints.
        self.fetchers: "ReplicaFetcherManager | None" = None
        self.isr_manager: "IsrManager | None" = None
        self.broker_endpoints: dict[int, str] = {}  # broker id -> host:port, from LeaderAndIsr's live_leaders
        # broker id -> host:data_port (absent: the broker has no data port), from the same live_leaders
        self.broker_data_endpoints: dict[int, str] = {}
        self._checkpointed_hws: dict[tuple[str, int], int] = {}
        self._checkpoint_task: asyncio.Task[None] | None = None
        # Cluster mode: the controller's live brokers (UpdateMetadata), for follower broker-epoch checks.
        self.metadata_cache: "MetadataCache | None" = None
        # LeaderAndIsr and StopReplica apply one at a time, in arrival order (Kafka's replicaStateChangeLock):
        # a chunked apply yields to the loop, and another control request must not interleave with it.
        self._control_lock = asyncio.Lock()
        self._control_closed = False  # set by close_control(): control requests stop between chunks
        # During a multi-partition produce: the partitions appended, whose parked fetches wake after the last one.
        self._deferred_fetch_wakes: list[tuple[str, int]] | None = None

    # ------------------------------------------------------------------ replication (cluster mode)
    def attach_replication(self, fetchers: "ReplicaFetcherManager", isr_manager: "IsrManager") -> None:
        """Cluster mode: load checkpointed HWs, start ISR maintenance and the HW checkpoint timer."""
        for d in self.log_manager.log_dirs:
            try:
                self._checkpointed_hws.update(
                    checkpoint.read_offsets(os.path.join(d, checkpoint.REPLICATION_OFFSET_CHECKPOINT)))
            except (ValueError, OSError) as exc:
                log.warning("ignoring the HW checkpoint in %s: %s", d, exc)
        for p in self.partitions.values():
            self._load_high_watermark(p)
        self.fetchers = fetchers
        self.isr_manager = isr_manager
        isr_manager.start()
        self._checkpoint_task = asyncio.create_task(self._checkpoint_loop(), name="highwatermark-checkpoint")

    def _load_high_watermark(self, p: Partition) -> None:
        hw = self._checkpointed_hws.get(p.key)
        if hw is not None:
            p.load_high_watermark(hw)

    def _high_watermarks_by_dir(self) -> dict[str, dict[tuple[str, int], int]]:
        by_dir: dict[str, dict[tuple[str, int], int]] = {d: {} for d in self.log_manager.log_dirs}
        for p in self.partitions.values():
            by_dir.setdefault(os.path.dirname(p.log.dir), {})[p.key] = p.high_watermark
        return by_dir

    @staticmethod
    def _write_high_watermarks(by_dir: dict[str, dict[tuple[str, int], int]]) -> list[tuple[str, OSError]]:
        """Write each dir's checkpoint (a worker thread may run this); returns the dirs whose write failed."""
        failed: list[tuple[str, OSError]] = []
        for d, offsets in by_dir.items():
            try:
                checkpoint.write_offsets(os.path.join(d, checkpoint.REPLICATION_OFFSET_CHECKPOINT), offsets)
            except OSError as exc:
                failed.append((d, exc))
        return failed

    def _checkpoints_failed(self, failed: list[tuple[str, OSError]]) -> None:
        """A failed checkpoint write takes its dir offline, as Kafka's checkpoint IOException does (one WARN for
        the dir, not one every checkpoint interval)."""
        for d, exc in failed:
            self.log_manager.health.failed_dir(d, exc, checkpoint.REPLICATION_OFFSET_CHECKPOINT)

    def checkpoint_high_watermarks(self) -> None:
        """Write replication-offset-checkpoint in every log dir (Kafka's format)."""
        self._checkpoints_failed(self._write_high_watermarks(self._high_watermarks_by_dir()))

    async def _checkpoint_loop(self) -> None:
        """Every HW_CHECKPOINT_INTERVAL_MS, on a worker thread and only when a HW moved: the write
        fsyncs, and on ext4 an fsync can wait for the journal to commit other files' dirty log data
        (tens to hundreds of ms while a produce load is written back), which on the event loop
        stalled every request of the broker (issue 15)."""
        last: dict[str, dict[tuple[str, int], int]] | None = None
        while True:
            await asyncio.sleep(HW_CHECKPOINT_INTERVAL_MS / 1000.0)
            current = self._high_watermarks_by_dir()
            if current != last:
                self._checkpoints_failed(await asyncio.to_thread(self._write_high_watermarks, current))
                last = current

    async def stop_replication(self) -> None:
        """Stop fetchers and ISR tasks, then checkpoint the HWs a last time (clean shutdown)."""
        if self._checkpoint_task is not None:
            self._checkpoint_task.cancel()
            await asyncio.gather(self._checkpoint_task, return_exceptions=True)
            self._checkpoint_task = None
        if self.fetchers is not None:
            await self.fetchers.shutdown()
        if self.isr_manager is not None:
            await self.isr_manager.stop()
            self.checkpoint_high_watermarks()

    def endpoint_of(self, broker_id: int) -> str | None:
        return self.broker_endpoints.get(broker_id)

    def data_endpoint_of(self, broker_id: int) -> str | None:
        """host:port of the broker's data port (data_port.py), None if it has none."""
        return self.broker_data_endpoints.get(broker_id)

    # ------------------------------------------------------------------ partitions
    def _log_reopened(self, key: tuple[str, int], lg: Any) -> None:
        """Its log dir came back: the Partition serves the reopened (recovered) log; the producer state reloads
        from it at the next append, and a follower truncates against its leader before fetching again."""
        p = self.partitions.get(key)
        if p is None:
            return
        p.log = lg
        p.producer_state = None
        if not p.is_leader:
            p.restart_truncation()

    def _forget_checkpointed_hw(self, key: tuple[str, int]) -> None:
        """A quarantined log's HW is not the new topic's (its log starts empty)."""
        self._checkpointed_hws.pop(key, None)

    def create_partition(self, topic: str, partition: int, overrides: dict[str, Any],
                         topic_id: bytes = b"", effective: dict[str, Any] | None = None) -> Partition:
        """The partition, opened or created. With a topic id (KIP-516), a hosted partition or a log of
        another topic id (a deleted topic's, the deletion missed) is stopped and its directory
        quarantined, and the new topic's replica starts from an empty log. `effective`: the topic's
        effective configs when the caller has them (one dict shared by the topic's partitions)."""
        configs = effective if effective is not None else effective_topic_configs(overrides, self.config.topic_defaults)
        existing = self.partitions.get((topic, partition))
        if existing is not None:
            if not topic_id or existing.topic_id == topic_id:
                return existing
            if not existing.topic_id:  # a log from before topic ids adopts the controller's id
                write_partition_metadata(existing.log.dir, topic_id)
                existing.topic_id = topic_id
                return existing
            log.warning("%s-%d: hosted as topic id %s, the controller says %s: the topic was deleted and "
                        "re-created; dropping the old replica", topic, partition,
                        uuid.to_string(existing.topic_id), uuid.to_string(topic_id))
            if self.fetchers is not None:
                self.fetchers.remove_partitions([existing.key])
            self.run_effects(existing, existing.stop())
            del self.partitions[existing.key]
            self.log_manager.quarantine(topic, partition, existing.log.dir, existing.topic_id)
        lg = self.log_manager.get_or_create_log(topic, partition, configs, topic_id)
        p = Partition(topic, partition, lg, self.config.broker_id, configs,
                      replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
                      live_broker_epochs=self.live_broker_epochs,
                      topic_id=topic_id or self.log_manager.log_topic_id(topic, partition),
                      dir_health=self.log_manager.health)
        self._load_high_watermark(p)
        p.producer_id_expiration_ms = self.config.producer_id_expiration_ms
        self.partitions[p.key] = p
        return p

    def update_topic_configs(self, topic: str, overrides: dict[str, Any],
                             effective: dict[str, Any] | None = None) -> None:
        configs = effective if effective is not None else effective_topic_configs(overrides, self.config.topic_defaults)
        for p in self.partitions.values():
            if p.topic == topic:
                p.configs = configs
        self.log_manager.update_config(topic, configs)

    def reapply_topic_defaults(self) -> None:
        """The broker's topic defaults changed (a dynamic broker config, broker/dynamic_config.py): every hosted
        topic's effective configs again from its overrides (as the last LeaderAndIsr named them) and the new
        defaults; the topics whose effective configs changed are updated (their logs and partitions) in one pass."""
        changed: dict[str, dict[str, Any]] = {}
        for topic, current in self.log_manager.topic_configs.items():
            configs = effective_topic_configs(self.topic_overrides.get(topic, {}), self.config.topic_defaults)
            if configs != current:
                changed[topic] = configs
        if not changed:
            return
        for p in self.partitions.values():
            new = changed.get(p.topic)
            if new is not None:
                p.configs = new
        self.log_manager.update_configs(changed)

    def delete_partitions(self, topic: str) -> None:
        """Standalone topic deletion: every partition of the topic, stopped and deleted."""
        self.stop_replicas([k for k in self.partitions if k[0] == topic], delete=True)

    # ------------------------------------------------------------------ control requests (seed 001)
    def become_leader_or_follower(self, states: Iterable[LeaderAndIsrState],
                                  topic_configs: dict[str, dict[str, Any]],
                                  live_leaders: Iterable[Any] = ()) -> dict[tuple[str, int], int]:
        """Apply LeaderAndIsr in one go on the caller's thread: create or open each partition, lead or follow
        it; returns errors per partition. The control service uses apply_leader_and_isr (chunked, yielding
        to the loop); this form is for tests and tools with a handful of partitions.

        A partition whose leader epoch is older than the one we hold is left alone
        (STALE_CONTROLLER_EPOCH, as Kafka answers); topic configs always apply.
        """
        effective = self._prepare_leader_and_isr(topic_configs, live_leaders)
        return self._apply_partition_states(states, effective, {})

    async def apply_leader_and_isr(self, states: Sequence[LeaderAndIsrState],
                                   topic_configs: dict[str, dict[str, Any]],
                                   live_leaders: Iterable[Any] = ()) -> dict[tuple[str, int], int]:
        """LeaderAndIsr as the control service applies it (Kafka's becomeLeaderOrFollower under the
        replica state change lock): one control request at a time, in chunks of LEADER_AND_ISR_CHUNK
        partitions. Each chunk's new logs are laid out (LogManager.open_logs, which yields every few
        logs), then its partitions lead or follow, then the loop runs whatever waits (Produce, Fetch,
        Metadata, the fetcher tasks) before the next chunk: a request for 10,000 partitions no longer
        holds the loop for minutes (issue 24). Each partition is applied whole, so a request answered
        between chunks sees every partition either before or after its change."""
        async with self._control_lock:
            # Kafka's "Handling/Finished LeaderAndIsr request" lines: INFO once the request spans chunks (a
            # topic creation, a broker coming back), DEBUG for the everyday one-partition changes.
            level = logging.INFO if len(states) > LEADER_AND_ISR_CHUNK else logging.DEBUG
            began = time.monotonic()
            log.log(level, "Handling LeaderAndIsr request for %d partitions", len(states))
            effective = self._prepare_leader_and_isr(topic_configs, live_leaders)
            failed: dict[tuple[str, int], int] = {}
            loaded_before = dict(self.log_manager.loaded)
            for start in range(0, len(states), LEADER_AND_ISR_CHUNK):
                chunk = states[start:start + LEADER_AND_ISR_CHUNK]
                if self._control_closed:  # shutting down: the rest is not applied (the logs are closing)
                    failed.update({(s.topic, s.partition): errors.Code.NOT_LEADER_OR_FOLLOWER
                                   for s in states[start:]})
                    break
                new = [(s.topic, s.partition, effective[s.topic], bytes(getattr(s, "topic_id", b"")))
                       for s in chunk if (s.topic, s.partition) not in self.partitions]
                open_errors = await self.log_manager.open_logs(new) if new else {}
                failed.update(self._apply_partition_states(chunk, effective, open_errors))
                await asyncio.sleep(CONTROL_YIELD_S)
            skipped, recovered = (self.log_manager.loaded[k] - loaded_before.get(k, 0) for k in ("skipped", "performed"))
            # Kafka's "Skipping recovery of N logs ... since clean shutdown file was found" / "Recovering N logs":
            # the logs a restarted broker finds are opened here, by its first LeaderAndIsr.
            loaded = (f"; existing logs loaded: recovery skipped for {skipped} shut down cleanly, "
                      f"{recovered} recovered (no clean-shutdown marker)") if skipped or recovered else ""
            log.log(logging.INFO if loaded else level, "Finished LeaderAndIsr request in %dms for %d partitions "
                    "(%d failed)%s", (time.monotonic() - began) * 1000, len(states), len(failed), loaded)
            return failed

    async def close_control(self) -> None:
        """Before the logs close: a LeaderAndIsr or StopReplica being applied (it goes on after its caller gave
        up) stops at its next chunk, and this returns once it has; later ones apply nothing. Before, a
        10,000-partition LeaderAndIsr still applying at shutdown failed with LogClosedError in a task nobody
        awaited."""
        self._control_closed = True
        async with self._control_lock:
            pass

    async def apply_stop_replica(self, partitions: Sequence[tuple[str, int]], delete: bool) -> None:
        """StopReplica as the control service applies it: under the control lock, in chunks, the logs of a
        deletion removed on a worker thread (thousands of directories when a large topic goes)."""
        async with self._control_lock:
            for start in range(0, len(partitions), LEADER_AND_ISR_CHUNK):
                if self._control_closed:
                    break
                chunk = partitions[start:start + LEADER_AND_ISR_CHUNK]
                self.stop_replicas(chunk, delete=False)
                if delete:
                    for key in chunk:
                        self.partitions.pop(key, None)
                    detached = [(key, self.log_manager.detach_log(*key)) for key in chunk]
                    await asyncio.to_thread(self.log_manager.delete_detached, detached)
                await asyncio.sleep(CONTROL_YIELD_S)

    def _prepare_leader_and_isr(self, topic_configs: dict[str, dict[str, Any]],
                                live_leaders: Iterable[Any]) -> dict[str, dict[str, Any]]:
        """The request's leader endpoints and topic configs; returns each topic's effective configs (one
        dict per topic, shared by its partitions). A hosted topic's configs are re-applied only when
        they changed (every LeaderAndIsr names its topics' configs: re-applying them to every hosted
        partition of a 10,000-partition topic for each request of its creation was quadratic)."""
        for b in live_leaders:
            self.broker_endpoints[b.broker_id] = f"{b.host}:{b.grpc_port}"
            if b.data_port > 0:
                self.broker_data_endpoints[b.broker_id] = f"{b.host}:{b.data_port}"
            else:
                self.broker_data_endpoints.pop(b.broker_id, None)
        effective: dict[str, dict[str, Any]] = _EffectiveConfigs(self.config.topic_defaults)
        for topic, overrides in topic_configs.items():
            self.topic_overrides[topic] = dict(overrides)  # for reapply_topic_defaults
            configs = effective[topic] = effective_topic_configs(overrides, self.config.topic_defaults)
            current = self.log_manager.topic_configs.get(topic)
            if current is not None and current != configs:
                self.update_topic_configs(topic, overrides, configs)
            elif current is not None:
                effective[topic] = current  # unchanged: keep sharing the dict the partitions hold
        return effective

    def _apply_partition_states(self, states: Iterable[LeaderAndIsrState], effective: dict[str, dict[str, Any]],
                                open_errors: dict[tuple[str, int], Exception]) -> dict[tuple[str, int], int]:
        failed: dict[tuple[str, int], int] = {}
        health = self.log_manager.health
        for s in states:
            key = (s.topic, s.partition)
            hosted = self.partitions.get(key)
            if hosted is not None and health.offline and health.is_offline(hosted.log.dir):
                # Kafka's offline replica: left as it is and answered KAFKA_STORAGE_ERROR, from which the
                # controller learns it is offline (it moves leadership and ISR membership off it).
                failed[key] = errors.Code.KAFKA_STORAGE_ERROR
                continue
            try:
                if key in open_errors:
                    raise open_errors[key]
                p = self.create_partition(s.topic, s.partition, {}, bytes(getattr(s, "topic_id", b"")),
                                          effective=effective[s.topic])
            except Exception as exc:  # a log that cannot open fails this partition only
                failed[key] = native_error(exc, s.topic, s.partition).code
                continue
            outcome = p.apply_leader_and_isr(s.leader, s.leader_epoch, list(s.isr), list(s.replicas),
                                             int(getattr(s, "partition_epoch", -1)))
            if outcome.error is not None:
                failed[p.key] = outcome.error
            self.run_effects(p, outcome.effects)
        return failed

    def run_effects(self, p: Partition, effects: Iterable[Effect]) -> None:
        """Carry out what the partition's ReplicationState decided: fetchers, ISR writes, purgatory wake-ups
        (dispatch_effects, the runner the simulation uses too, calls the four methods below)."""
        dispatch_effects(p, effects, self)

    def start_fetcher(self, p: Partition, effect: StartFetcher) -> None:
        # Followers truncate by leader epoch, then fetch from the leader (seed 002).
        if self.fetchers is not None:
            self.fetchers.add_partition(p)

    def stop_fetcher(self, p: Partition) -> None:
        if self.fetchers is not None:
            self.fetchers.remove_partitions([p.key])

    def propose_isr(self, p: Partition, effect: ProposeIsr) -> None:
        if self.isr_manager is not None:
            self.isr_manager.write_isr(p, effect)
        else:  # standalone: nobody to write to; the proposal is dropped
            self.run_effects(p, p.on_isr_write_result(effect.leader_epoch, None, effect.partition_epoch))

    def complete_delayed(self, p: Partition) -> None:
        # Parked produces and fetches re-check the HW and leadership (a new follower answers NOT_LEADER).
        self.on_high_watermark_change(p)
        self.delete_records_purgatory.check_and_complete(p.key)

    def stop_replicas(self, partitions: Iterable[tuple[str, int]], delete: bool) -> None:
        """Apply StopReplica: stop serving each partition; with delete also remove its log."""
        for key in partitions:
            if self.fetchers is not None:
                self.fetchers.remove_partitions([key])
            p = self.partitions.get(key)
            if p is not None:
                self.run_effects(p, p.stop())  # waiters wake up to NOT_LEADER_OR_FOLLOWER
            if delete:
                self.partitions.pop(key, None)
                self.log_manager.delete_log(*key)

    def _retention_upper_bound(self, key: tuple[str, int]) -> int | None:
        """Retention and the cleaner work only below the partition's LSO (the HW when no transaction is open):
        an open transaction's records may still be aborted, so they must not shadow older ones (Kafka's
        cleaner stops at the first unstable offset)."""
        p = self.partitions.get(key)
        if p is None:
            return None
        try:
            return p.last_stable_offset
        except errors.GregorError:  # producer state unreadable: the HW, as before transactions
            return p.high_watermark

    def get_partition(self, topic: str, partition: int) -> Partition:
        p = self.partitions.get((topic, partition))
        if p is None:
            raise errors.error_for(errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                                   f"This server does not host this topic-partition: {topic}-{partition}",
                                   topic=topic, partition=partition)
        return p

    # ------------------------------------------------------------------ produce
    async def handle_produce(self, topic: str, partition: int, records: bytes, acks: int,
                             timeout_ms: int) -> ProduceResult:
        """The single-partition Produce: a one-partition request whose partition error is the call's."""
        _check_acks(acks, topic=topic, partition=partition)
        [result] = await self.handle_produce_partitions([(topic, partition, records)], acks, timeout_ms)
        if isinstance(result, errors.GregorError):
            raise result
        return result

    async def handle_produce_partitions(self, parts: Sequence[tuple[str, int, bytes]], acks: int,
                                        timeout_ms: int) -> list[ProduceResult | errors.GregorError]:
        """Kafka's multi-partition Produce: append every partition, then wait for all of them (acks=-1)."""
        return await collect_produce(self.start_produce_partitions(parts, acks, timeout_ms))

    def start_produce_partitions(self, parts: Sequence[tuple[str, int, bytes]], acks: int,
                                 timeout_ms: int) -> list[Any]:
        """Append every partition now (in the caller's order); acks=-1 partitions come back as futures.

        One partition's failure is its own result and never stops the others (Kafka answers
        per partition). Only a request that is wrong as a whole raises: bad acks, no
        partition, a partition listed twice. Synchronous, so a stream's requests append in
        the order they arrived however long their acks take (ProduceStream).
        """
        _check_acks(acks)
        if not parts:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "produce request names no partition")
        if len({(t, n) for t, n, _ in parts}) != len(parts):
            raise errors.error_for(errors.Code.INVALID_REQUEST, "produce request lists a partition twice")
        out: list[Any] = []
        # The followers' parked fetches wake once every partition is appended, hearing of all of them (Kafka's
        # ActionQueue, run after the whole produce): woken at the first append, a fetch answered that partition
        # alone and the others waited for the follower's next fetch, one more replication round trip before
        # their acks=all.
        if len(parts) > 1:
            self._deferred_fetch_wakes = []
        try:
            self._append_partitions(parts, acks, timeout_ms, out)
        finally:
            deferred, self._deferred_fetch_wakes = self._deferred_fetch_wakes, None
            if deferred:
                self.fetch_purgatory.check_and_complete_all(deferred)  # type: ignore[arg-type]
        return out

    def _append_partitions(self, parts: Sequence[tuple[str, int, bytes]], acks: int, timeout_ms: int,
                           out: list[Any]) -> None:
        for topic, partition, records in parts:
            try:
                p, info = self._append_for_produce(topic, partition, records, acks)
            except errors.GregorError as err:
                out.append(err)
                continue
            except Exception as exc:  # a bug in one partition's append must not fail the ones already appended
                log.exception("produce to %s-%d failed", topic, partition)
                out.append(errors.GregorError(f"{type(exc).__name__}: {exc}", topic=topic, partition=partition))
                continue
            if acks != -1:
                out.append(_produce_result(p, info))
                continue
            out.append(self.wait_for_replication(p, info, timeout_ms))

    def wait_for_replication(self, p: Partition, info: "native.AppendInfo | DuplicateAppendInfo",
                             timeout_ms: int) -> "asyncio.Future[ProduceResult] | ProduceResult | errors.GregorError":
        """acks=all after an append as leader: the result now if the HW already passed it (or it failed),
        else a future the DelayedProduce purgatory completes (produce and WriteTxnMarkers alike)."""
        op = DelayedProduce(max(timeout_ms, 0), p, info)
        self.produce_purgatory.try_complete_else_watch(op, [p.key])
        return op.future if not op.future.done() else _settled(op.future)

    def after_leader_append(self, p: Partition, effects: list[Effect]) -> None:
        """An append as leader happened (produce or marker): run its effects (the HW of a one-replica ISR may
        have moved, which wakes both purgatories), else wake the parked fetches (followers see the new data)."""
        if effects:
            self.run_effects(p, effects)
        elif self._deferred_fetch_wakes is not None:  # a multi-partition produce: after its last append
            self._deferred_fetch_wakes.append(p.key)
        else:
            self.fetch_purgatory.check_and_complete(p.key)

    def _append_for_produce(self, topic: str, partition: int, records: bytes,
                            acks: int) -> tuple[Partition, "native.AppendInfo | DuplicateAppendInfo"]:
        """Append to the leader and wake what the new data may satisfy (followers at once, consumers on HW)."""
        try:
            if len(records) == 0:
                raise errors.error_for(errors.Code.CORRUPT_MESSAGE, "produce request carries no record batch",
                                       topic=topic, partition=partition)
            p = self.get_partition(topic, partition)
            info, effects = p.append_records_to_leader(records, acks)
        except errors.GregorError as err:
            FAILED_PRODUCE.labels(error=err.name).inc()
            raise
        if isinstance(info, DuplicateAppendInfo):
            DUPLICATE_BATCHES.labels(topic=topic).inc()
        BYTES_IN.labels(topic=topic).inc(info.valid_bytes)
        MESSAGES_IN.labels(topic=topic).inc(info.num_records)
        self.after_leader_append(p, effects)
        return p, info

    def on_high_watermark_change(self, p: Partition) -> None:
        """Wake requests that wait on this partition's HW."""
        self.produce_purgatory.check_and_complete(p.key)
        self.fetch_purgatory.check_and_complete(p.key)

    # ------------------------------------------------------------------ fetch
    def read(self, p: Partition, fetch_offset: int, max_bytes: int, is_follower: bool,
             current_leader_epoch: int, isolation_level: int = 0) -> FetchResult:
        """One partition's fetch read (leader checks, bounds, LSO and aborted transactions); no waiting."""
        p.check_leader(current_leader_epoch)
        sl = p.read_slice(fetch_offset, max_bytes, is_follower, isolation_level)
        lso = p.last_stable_offset if not is_follower else p.high_watermark
        aborted = (tuple(aborted_transactions(p, fetch_offset, lso))
                   if isolation_level == READ_COMMITTED and sl.length else ())
        return FetchResult(sl, p.high_watermark, lso, p.log.log_start_offset, p.leader_epoch, aborted)

    async def handle_fetch(self, topic: str, partition: int, fetch_offset: int, max_bytes: int,
                           min_bytes: int, max_wait_ms: int, replica_id: int = -1,
                           current_leader_epoch: int = -1, replica_broker_epoch: int = -1,
                           isolation_level: int = 0, topic_id: bytes = b"") -> FetchResult:
        try:
            if max_bytes <= 0 or min_bytes < 0 or max_wait_ms < 0:
                raise errors.error_for(
                    errors.Code.INVALID_FETCH_SIZE if max_bytes <= 0 or min_bytes < 0 else errors.Code.INVALID_REQUEST,
                    f"invalid fetch bounds: max_bytes={max_bytes} min_bytes={min_bytes} max_wait_ms={max_wait_ms}",
                    topic=topic, partition=partition)
            if fetch_offset < 0:
                raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"negative fetch offset {fetch_offset}",
                                       topic=topic, partition=partition)
            max_bytes = min(max_bytes, self.config.fetch_max_bytes)
            p = self.get_partition(topic, partition)
            p.check_topic_id(topic_id)
            is_follower = replica_id >= 0
            if is_follower:
                p.check_follower_broker_epoch(replica_id, replica_broker_epoch, self.live_broker_epoch(replica_id))

            def read() -> FetchResult:
                return self.read(p, fetch_offset, max_bytes, is_follower, current_leader_epoch, isolation_level)

            result = read()
            if is_follower:
                self.on_follower_fetch(p, replica_id, fetch_offset, replica_broker_epoch)
            if max_wait_ms == 0 or result.slice.length >= max(min_bytes, 1):
                BYTES_OUT.labels(topic=topic).inc(result.slice.length)
                return result
            op = DelayedFetch(max_wait_ms, read, max(min_bytes, 1))
            self.fetch_purgatory.try_complete_else_watch(op, [p.key])
            result = await op.future
            BYTES_OUT.labels(topic=topic).inc(result.slice.length)
            return result
        except errors.GregorError as err:
            FAILED_FETCH.labels(error=err.name).inc()
            raise

    def live_broker_epochs(self) -> dict[int, int] | None:
        """Broker id -> epoch of the live brokers as the controller last said (None before any UpdateMetadata)."""
        cache = self.metadata_cache
        if cache is None or not cache.live_brokers:
            return None
        return {b: e.broker_epoch for b, e in cache.live_brokers.items()}

    def on_live_brokers_changed(self, before: dict[int, int] | None) -> int:
        """After an UpdateMetadata: for each broker newly live or with a new epoch, the partitions led here that
        it follows outside the ISR reconsider it (a restarted follower that fetched before we knew its epoch).
        Returns how many ISR expansions were proposed."""
        after = self.live_broker_epochs() or {}
        changed = [b for b, e in after.items() if (before or {}).get(b) != e and b != self.config.broker_id]
        if not changed:
            return 0
        proposed = 0
        for p in list(self.partitions.values()):
            if not p.is_leader:
                continue
            for b in changed:
                effects = p.reconsider_isr_expansion(b)
                if effects:
                    proposed += 1
                    self.run_effects(p, effects)
        return proposed

    def live_broker_epoch(self, broker_id: int) -> int | None:
        cache = self.metadata_cache
        endpoint = cache.live_brokers.get(broker_id) if cache is not None else None
        return endpoint.broker_epoch if endpoint is not None else None

    def on_follower_fetch(self, p: Partition, replica_id: int, fetch_offset: int, broker_epoch: int = -1,
                          log_start_offset: int = -1) -> None:
        """A follower's fetch offset is its LEO: maybe advance the HW, maybe expand the ISR (seed 000). Its log
        start offset may complete a parked DeleteRecords."""
        self.run_effects(p, p.on_follower_fetch(replica_id, fetch_offset, broker_epoch, now_ms()))
        if log_start_offset >= 0 and p.on_follower_log_start(replica_id, log_start_offset):
            self.delete_records_purgatory.check_and_complete(p.key)

    async def delete_records(self, offsets: list[tuple[str, int, int]],
                             timeout_ms: int) -> list[PartitionStatus | errors.GregorError]:
        """Kafka's ReplicaManager.deleteRecords: each leader's log start offset moves now; the answer waits until
        every partition's low watermark (leader and live replicas) reached its offset, or timeout_ms
        (REQUEST_TIMED_OUT for those not there). Per partition: its status, or its error."""
        out: list[PartitionStatus | errors.GregorError] = []
        status: dict[tuple[str, int], PartitionStatus] = {}
        for topic, partition, offset in offsets:
            try:
                p = self.get_partition(topic, partition)
                target = delete_on_leader(p, offset)
                self.fetch_purgatory.check_and_complete(p.key)  # parked follower fetches carry the new log start
                st = status[p.key] = PartitionStatus(target, p.log.log_start_offset)
                out.append(st)
            except errors.GregorError as err:
                out.append(err)
            except Exception as exc:  # the native log (storage)
                out.append(native_error(exc, topic, partition))
        if status:
            op = DelayedDeleteRecords(max(timeout_ms, 0), self, status)
            self.delete_records_purgatory.try_complete_else_watch(op, list(status))
            await op.future
        return out

    # ------------------------------------------------------------------ offsets
    def offset_for_leader_epoch(self, topic: str, partition: int, leader_epoch: int,
                                current_leader_epoch: int | None) -> tuple[int, int]:
        """The leader's OffsetForLeaderEpoch answer (seed 002): (epoch, end offset) from its epoch cache."""
        p = self.get_partition(topic, partition)
        if current_leader_epoch is not None:
            p.check_leader(current_leader_epoch)
        return p.log.end_offset_for_epoch(leader_epoch)

    def list_offsets(self, topic: str, partition: int, timestamp_ms: int,
                     current_leader_epoch: int = -1, isolation_level: int = 0) -> tuple[int, int, int]:
        """(offset, timestamp, leader_epoch) for -2 earliest, -1 latest (HW; LSO for read_committed) or a
        timestamp (found below that same bound)."""
        p = self.get_partition(topic, partition)
        p.check_leader(current_leader_epoch)
        upper = p.fetch_upper_bound(False, isolation_level)
        if timestamp_ms == -2:
            return p.log.log_start_offset, -1, p.leader_epoch
        p.check_offsets_available()
        if timestamp_ms == -1:
            return upper, -1, p.leader_epoch
        if timestamp_ms < 0:
            raise errors.error_for(errors.Code.INVALID_REQUEST,
                                   f"timestamp must be -2, -1 or >= 0, got {timestamp_ms}", topic=topic,
                                   partition=partition)
        try:
            found = p.log.offset_for_timestamp(timestamp_ms)
        except Exception as exc:
            raise native_error(exc, topic, partition) from exc
        if found is None or found[0] >= upper:
            return -1, -1, p.leader_epoch
        return found[0], found[1], p.leader_epoch

    def shutdown(self) -> None:
        closing = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "broker is shutting down")
        self.produce_purgatory.cancel_all(closing)
        self.fetch_purgatory.cancel_all(closing)
        self.delete_records_purgatory.cancel_all(closing)

    def _snapshot_before_close(self, key: tuple[str, int]) -> None:
        """Clean shutdown, on a LogManager closing thread just before the partition's log closes: its producer
        state (if loaded) snapshotted at its LEO, so a restart loads it without a scan. Done there and not here
        on the loop: one fsync per replica, one after the other, was 5 s of a 5,000-replica broker's stop (issue
        24); and by then no request can append after the snapshot. The loop waits for the close meanwhile, so
        nothing else touches the partition."""
        p = self.partitions.get(key)
        if p is not None:
            p.snapshot_producer_state()
