"""LogManager: opens, owns and maintains every partition log under log.dirs.

Directories are `<log.dir>/<topic>-<partition>` as in Kafka, each with a `partition.metadata`
file naming the topic id (KIP-516) once a controller has sent one. A directory whose id is not
the topic's (the log of a deleted topic re-created under the same name, on a broker that
missed the deletion) is renamed `<topic>-<partition>.<old id hex>-stray` and a new log starts.
Retention and
flush run as periodic tasks on the event loop; log compaction (LogCleaner, below) runs on
its own threads; the native calls release the
GIL and run in worker threads so produce and fetch keep flowing.
Concurrency: event-loop owned; the native Log objects lock internally.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import itertools
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gregor_native as native
from prometheus_client import Counter, Gauge

from gregor.broker import log_dirs
from gregor.common.config import BrokerConfig, is_compacted, log_config_kwargs
from gregor.common import errors, uuid
from gregor.common.clock import now_ms
from gregor.common.phase_clock import PhaseClock

log = logging.getLogger(__name__)

PARTITION_METADATA = "partition.metadata"
# The native log's marker of a clean close (native/src/log.rs CLEAN_SHUTDOWN_FILE): present, the open skips
# recovery (and removes it); absent, the segments past the last flush are recovered.
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
STRAY_SUFFIX = "-stray"

FLUSH_NEVER_MS = 2**63 - 1  # flush.ms default (Long.MAX_VALUE): leave flushing to the OS
# open_logs yields to the event loop after this much file work (a new log is ~2-5 ms of syscalls here).
OPEN_LOGS_SLICE_S = 0.02
# The metadata writer makes at most this many new partition.metadata files durable with one syncfs per file
# system (instead of an fsync each), so the first of a large creation's files is durable within a batch's time.
METADATA_WRITE_BATCH = 1000

# Kafka's kafka.log:type=LogCleaner / LogCleanerManager metrics.
LOG_RECOVERY_SECONDS = Counter("gregor_broker_log_recovery_seconds_total",
                               "Time spent opening and recovering partition logs (load and tail recovery at start)")
LOG_RECOVERED_BYTES_TRUNCATED = Counter("gregor_broker_log_recovery_truncated_bytes_total",
                                        "Bytes of torn or corrupt tail cut by log recovery")
CLEANER_MAX_DIRTY_PERCENT = Gauge("gregor_log_cleaner_max_dirty_percent",
                                  "Highest dirty ratio (percent) of a compacted log at the last check")
CLEANER_CLEANED_BYTES = Counter("gregor_log_cleaner_cleaned_bytes_total", "Bytes of segments read and rewritten by cleaning")
CLEANER_WRITTEN_BYTES = Counter("gregor_log_cleaner_written_bytes_total", "Bytes written into cleaned segments")
CLEANER_RECOPY_PERCENT = Gauge("gregor_log_cleaner_recopy_percent", "Written / read bytes of the last cleaning, percent")
CLEANER_RUNS = Counter("gregor_log_cleaner_runs_total", "Cleanings that swapped cleaned segments in")
CLEANER_ERRORS = Counter("gregor_log_cleaner_errors_total", "Cleanings that failed (the log is retried after backoff)")
CLEANER_MAX_CLEAN_TIME = Gauge("gregor_log_cleaner_max_clean_time_secs", "Longest single cleaning so far, seconds")
CLEANER_TIME_SINCE_LAST_RUN = Gauge("gregor_log_cleaner_time_since_last_run_seconds",
                                    "Seconds since a cleaner thread last finished a pass over the logs")

LOGS_LOADED = Counter("gregor_broker_logs_loaded_total",
                      "Existing partition logs opened: recovery=skipped for a log shut down cleanly (its clean-shutdown "
                      "marker found), performed for one that was not (a crash: the unflushed tail is checked)",
                      ["recovery"])
STRAY_LOGS = Counter("gregor_broker_stray_logs_total",
                     "Partition directories of another topic id than the topic's (a deleted topic's log), "
                     "renamed -stray instead of served (KIP-516)")


class InconsistentTopicIdError(Exception):
    """A partition.metadata that cannot be read as Kafka's format."""


def read_partition_metadata(log_dir: str) -> bytes:
    """The topic id in `<dir>/partition.metadata` (Kafka's `version: 0` / `topic_id: <id>` lines);
    b"" when the file is absent (a log written before topic ids)."""
    try:
        with open(os.path.join(log_dir, PARTITION_METADATA), encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return b""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    if fields.get("version", "").strip() != "0" or "topic_id" not in fields:
        raise InconsistentTopicIdError(f"{log_dir}/{PARTITION_METADATA} is not version 0 with a topic_id: {text!r}")
    try:
        return uuid.from_string(fields["topic_id"].strip())
    except errors.GregorError as exc:
        raise InconsistentTopicIdError(f"{log_dir}/{PARTITION_METADATA}: {exc}") from exc


def _partition_metadata_tmp(log_dir: str) -> str:
    """Where a partition.metadata is written before the rename that makes it whole (never read as the file)."""
    return os.path.join(log_dir, PARTITION_METADATA + ".tmp")


def write_partition_metadata(log_dir: str, topic_id: bytes) -> None:
    """Write `<dir>/partition.metadata` durably (temp file, fsync, rename), as Kafka's PartitionMetadataFile."""
    path = os.path.join(log_dir, PARTITION_METADATA)
    tmp = _partition_metadata_tmp(log_dir)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(_partition_metadata_text(topic_id))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _partition_metadata_text(topic_id: bytes) -> str:
    return f"version: 0\ntopic_id: {uuid.to_string(topic_id)}\n"


_SYNCFS = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)


def sync_filesystems(dirs: "list[str]") -> bool:
    """Make everything written so far on the file systems holding `dirs` durable: one syncfs(2) per
    file system (Linux). False when syncfs is not available (the caller fsyncs file by file)."""
    if _SYNCFS is None:
        return False
    done: set[int] = set()
    for d in dirs:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            dev = os.fstat(fd).st_dev
            if dev in done:
                continue
            if _SYNCFS(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"syncfs {d}: {os.strerror(err)}")
            done.add(dev)
        finally:
            os.close(fd)
    return True


def _rename_stray(path: str, stored: bytes) -> str:
    """Rename a partition directory `<path>.<id hex>-stray` (a free name); returns the new path."""
    tag = stored.hex() if len(stored) == uuid.UUID_BYTES else "unknown"
    stray = f"{path}.{tag}{STRAY_SUFFIX}"
    n = 0
    while os.path.exists(stray):
        n += 1
        stray = f"{path}.{tag}.{n}{STRAY_SUFFIX}"
    os.rename(path, stray)
    return stray


@dataclass
class _OpenedLog:
    """What _open_log_files did for one partition, for LogManager._adopt to register on the loop."""

    key: tuple[str, int]
    log: native.Log | None = None
    error: Exception | None = None
    stray: tuple[str, str, bytes] | None = None  # (directory, its -stray name, the topic id it held)
    seconds: float = 0.0
    # The topic id its partition.metadata is still to say (defer_metadata: written later, off the loop).
    metadata_due: bytes = b""
    # An existing log: "skipped" if it was shut down cleanly, else "performed"; "" for a new one.
    recovery: str = ""


def _open_log_files(key: tuple[str, int], log_dirs: list[str], fewest: str, configs: dict[str, Any],
                    topic_id: bytes, defer_metadata: bool = False) -> _OpenedLog:
    """The file work of opening one partition's log; touches only that partition's directories. The log
    is in the log dir that already holds the partition's directory, else in `fewest`; a directory of
    another topic id is renamed -stray first and a new log started. With defer_metadata a partition.metadata
    to write is left in `metadata_due` (LogManager writes it on a worker thread) instead of written here."""
    out = _OpenedLog(key)
    name = f"{key[0]}-{key[1]}"
    try:
        existing = next((os.path.join(d, name) for d in log_dirs if os.path.isdir(os.path.join(d, name))), None)
        path = existing or os.path.join(fewest, name)
        if topic_id and existing:
            try:
                stored = read_partition_metadata(path)
            except InconsistentTopicIdError as exc:
                log.warning("%s; quarantining the directory", exc)
                stored = b"?"
            if stored and stored != topic_id:
                out.stray = (path, _rename_stray(path, stored), stored)
                path = os.path.join(fewest, name)
        if existing and not out.stray:
            out.recovery = "skipped" if os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE)) else "performed"
        started = time.perf_counter()
        opened = native.Log(path, native.LogConfig(**log_config_kwargs(configs)), now_ms())
        out.seconds = time.perf_counter() - started
        try:
            # A directory made just now has no partition.metadata to read.
            if topic_id and (not existing or out.stray or read_partition_metadata(path) != topic_id):
                if defer_metadata:
                    out.metadata_due = topic_id
                else:
                    write_partition_metadata(path, topic_id)
        except BaseException:
            opened.close()
            raise
        out.log = opened
    except Exception as exc:
        out.error = exc
    return out


class LogManager:
    """Every partition log of this broker (event-loop owned)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.log_dirs = config.log_dir_list
        for d in self.log_dirs:
            os.makedirs(d, exist_ok=True)
        self.logs: dict[tuple[str, int], native.Log] = {}
        # Offline log dirs (a failed write: ENOSPC, EIO) and their recovery (broker/log_dirs.py).
        self.health = log_dirs.LogDirHealth(self.log_dirs)
        # A log reopened after its dir came back (the ReplicaManager points its Partition at the new one).
        self.on_log_reopened: Callable[[tuple[str, int], native.Log], None] = lambda _key, _log: None
        # Open logs per log dir, for placing new ones (Kafka's localLogsByDir counts): counting a directory's
        # entries for every new partition made creating N partitions O(N^2) (issue 24: 10,000 partitions
        # blocked a broker's event loop for minutes, 41 ms per scan of a 10,000-entry dir under load).
        self._logs_per_dir: collections.Counter[str] = collections.Counter()
        # Retention never deletes at or above a partition's high watermark (Kafka's
        # upperBoundOffset); the ReplicaManager, which owns the HW, installs this.
        self.retention_upper_bound: Callable[[tuple[str, int]], int | None] = lambda _key: None
        # Retention moved a log's start (on the loop): the ReplicaManager wakes what waits on that partition
        # (a follower's fetch session learns its log start from it, issue 24).
        self.on_log_start_moved: Callable[[tuple[str, int]], object] = lambda _key: None
        # Told when a partition's directory was quarantined (the ReplicaManager forgets its checkpointed HW).
        self.on_quarantine: Callable[[tuple[str, int]], None] = lambda _key: None
        # Called on a closing thread (close) just before each log closes: the ReplicaManager snapshots the
        # partition's producer state there, as Kafka's UnifiedLog.close does. Nothing else runs on the loop then.
        self.before_close: Callable[[tuple[str, int]], None] = lambda _key: None
        self.topic_configs: dict[str, dict[str, Any]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.cleaner = LogCleaner(self)
        # partition.metadata files of new replicas still to write: log directory -> topic id. A LeaderAndIsr's
        # new logs (open_logs) leave theirs here and a worker thread writes them (temp files, syncfs, renames),
        # as Kafka's UnifiedLog flushes its PartitionMetadataFile on a scheduler thread: the fsync was ~3.5 ms
        # per replica on the loop, half of a 1,000-partition apply (issue 24). Until written, log_topic_id
        # answers from here; a crash before the write leaves no file, and the next LeaderAndIsr's id is adopted
        # (a log from before topic ids). The loop adds entries without a lock (a dict store is atomic); the
        # writer stages and renames one entry at a time under _metadata_lock, and a directory about to be
        # renamed or deleted is taken out under it too, so no write lands in a directory being moved.
        self._metadata_due: dict[str, bytes] = {}
        # Taken from _metadata_due by the writer, temp file written, not renamed into place yet.
        self._metadata_staged: dict[str, bytes] = {}
        self._metadata_lock = threading.Lock()
        self._metadata_batch_lock = threading.Lock()
        self._metadata_writer: asyncio.Task[None] | None = None
        # Existing logs opened so far: "skipped" (shut down cleanly) and "performed" (recovered) counts.
        self.loaded: collections.Counter[str] = collections.Counter()

    def _fewest_dir(self, counts: "collections.Counter[str] | None" = None) -> str:
        """The online log dir with the fewest partitions, where Kafka places a new log (an offline dir takes
        none: the new replica would be offline at once, and the controller would not hear of it)."""
        per_dir = self._logs_per_dir if counts is None else counts
        online = [d for d in self.log_dirs if os.path.normpath(d) not in self.health.offline] if self.health.offline \
            else self.log_dirs
        return min(online or self.log_dirs, key=lambda d: per_dir[os.path.normpath(d)])

    def get_or_create_log(self, topic: str, partition: int, topic_configs: dict[str, Any],
                          topic_id: bytes = b"") -> native.Log:
        """The partition's log, opened or created; with a topic id, a directory holding another topic
        id is quarantined first (renamed -stray) and a new log started, and the id is recorded in
        partition.metadata (a log from before topic ids adopts it). The file work runs here, on the
        spot; open_logs does it for many logs, yielding to the event loop between them."""
        key = (topic, partition)
        self.topic_configs[topic] = topic_configs
        existing = self.logs.get(key)
        if existing is not None:
            return existing
        return self._adopt(_open_log_files(key, self.log_dirs, self._fewest_dir(), topic_configs, topic_id))

    async def open_logs(self, wanted: "list[tuple[str, int, dict[str, Any], bytes]]") -> dict[tuple[str, int], Exception]:
        """Open or create every (topic, partition, effective configs, topic id) not open yet, yielding to the
        event loop after every OPEN_LOGS_SLICE_S of file work, so the loop keeps serving while thousands of
        new replicas are laid out (issue 24). Returns the partitions that could not be opened, with why.

        On the loop, not a worker thread: each log is a dozen small syscalls, and a worker thread has to win
        the GIL back from a busy loop after every one of them (up to the 5 ms switch interval each): with the
        loop serving Metadata and fetches during a creation, a thread laid out 3-6x fewer logs per second than
        the loop does in slices (measured, bench_leader_and_isr.py). Callers serialize (the ReplicaManager's
        control lock): a log is never opened twice at once."""
        failed: dict[tuple[str, int], Exception] = {}
        slice_start = time.perf_counter()
        for topic, partition, configs, topic_id in wanted:
            self.topic_configs[topic] = configs
            if (topic, partition) in self.logs:
                continue
            try:
                self._adopt(_open_log_files((topic, partition), self.log_dirs, self._fewest_dir(), configs, topic_id,
                                            defer_metadata=True))
            except Exception as exc:  # this partition only: the others of the request go on
                failed[(topic, partition)] = exc
            if time.perf_counter() - slice_start >= OPEN_LOGS_SLICE_S:
                await asyncio.sleep(0)
                slice_start = time.perf_counter()
        if self._metadata_due and (self._metadata_writer is None or self._metadata_writer.done()):
            self._metadata_writer = asyncio.get_running_loop().create_task(
                self._write_metadata_due(), name="partition-metadata-writer")
        return failed

    async def _write_metadata_due(self) -> None:
        while self._metadata_due:
            await asyncio.to_thread(self.write_partition_metadata_due)

    def write_partition_metadata_due(self) -> int:
        """Write every partition.metadata still due (a worker thread, or close); returns how many.

        In batches of up to METADATA_WRITE_BATCH: each file is written as a temp file, then one syncfs per
        file system makes the batch durable, then each temp file is renamed into place. An fsync per file
        cost a journal commit each (on a journaled ext4, 5,000 new replicas took 12 s to lead instead of 7,
        the loop's own file creations waiting behind the commits, issue 24). A crash before the rename
        leaves no partition.metadata (the id is adopted from the next LeaderAndIsr, as for a log from before
        topic ids); after it, a complete one. The lock is taken per file, never across the sync, so the loop
        forgetting a directory (_forget_metadata_due) never waits for the disk. One batch at a time
        (_metadata_batch_lock): close and flush_partition_metadata wait for the worker's batch in progress."""
        with self._metadata_batch_lock:
            written = 0
            while True:
                staged: list[str] = []
                # The loop adds entries meanwhile: list(islice(...)) copies the keys in one C call under the GIL,
                # where a Python-level iteration could see the dict change size.
                for path in list(itertools.islice(self._metadata_due, METADATA_WRITE_BATCH)):
                    with self._metadata_lock:
                        topic_id = self._metadata_due.get(path)
                        if topic_id is None:  # forgotten meanwhile
                            continue
                        # Staged before it leaves _metadata_due: log_topic_id always finds it in one or the other.
                        self._metadata_staged[path] = topic_id
                        del self._metadata_due[path]
                        try:
                            with open(_partition_metadata_tmp(path), "w", encoding="utf-8") as f:
                                f.write(_partition_metadata_text(topic_id))
                            staged.append(path)
                        except OSError as exc:  # the directory went (a deletion raced the writer): nothing to record
                            del self._metadata_staged[path]
                            log.warning("cannot write %s in %s: %s", PARTITION_METADATA, path, exc)
                if not staged:
                    return written
                try:
                    synced = sync_filesystems(sorted({os.path.dirname(os.path.normpath(p)) for p in staged}))
                except OSError as exc:  # fsync file by file instead (an offline dir's write fails there, as before)
                    log.warning("syncfs failed (%s); syncing %d partition.metadata files one by one", exc, len(staged))
                    synced = False
                for path in staged:
                    with self._metadata_lock:
                        if path not in self._metadata_staged:  # forgotten meanwhile: renamed or deleted
                            continue
                        tmp = _partition_metadata_tmp(path)
                        try:
                            if not synced:
                                with open(tmp, "rb") as f:
                                    os.fsync(f.fileno())
                            os.replace(tmp, os.path.join(path, PARTITION_METADATA))
                            written += 1
                        except OSError as exc:
                            log.warning("cannot write %s in %s: %s", PARTITION_METADATA, path, exc)
                        finally:
                            del self._metadata_staged[path]

    async def flush_partition_metadata(self) -> None:
        """Wait until every partition.metadata due so far is written (tests, tools)."""
        await asyncio.to_thread(self.write_partition_metadata_due)

    def _forget_metadata_due(self, path: str) -> None:
        """A directory about to be renamed or deleted: its partition.metadata is no longer to be written, and
        a write into it in progress is over (the lock is held across each write)."""
        with self._metadata_lock:
            self._metadata_due.pop(path, None)
            self._metadata_staged.pop(path, None)

    def _adopt(self, o: "_OpenedLog") -> native.Log:
        """Register what _open_log_files did (on the loop): the quarantined directory, the opened log."""
        if o.stray is not None:
            self._quarantined(o.key, *o.stray)
        if o.log is None:
            assert o.error is not None
            raise o.error
        LOG_RECOVERY_SECONDS.inc(o.seconds)
        LOG_RECOVERED_BYTES_TRUNCATED.inc(o.log.recovered_bytes_truncated)
        if o.log.recovered_bytes_truncated:
            log.warning("recovered %s-%d: cut %d bytes of torn or corrupt tail",
                        o.key[0], o.key[1], o.log.recovered_bytes_truncated)
        existing = self.logs.get(o.key)
        if existing is not None:  # opened meanwhile by another path: keep that one, never two on one dir
            o.log.close()
            return existing
        if o.metadata_due:
            self._metadata_due[o.log.dir] = o.metadata_due
        if o.recovery:
            self.loaded[o.recovery] += 1
            LOGS_LOADED.labels(recovery=o.recovery).inc()
        self.logs[o.key] = o.log
        self._logs_per_dir[os.path.dirname(os.path.normpath(o.log.dir))] += 1
        return o.log

    def log_topic_id(self, topic: str, partition: int) -> bytes:
        """The topic id recorded in the open log's partition.metadata (b"" when none)."""
        lg = self.logs.get((topic, partition))
        if lg is None:
            return b""
        due = self._metadata_due.get(lg.dir) or self._metadata_staged.get(lg.dir)
        if due:
            return due
        try:
            return read_partition_metadata(lg.dir)
        except InconsistentTopicIdError:
            return b""

    def quarantine(self, topic: str, partition: int, path: str, stored: bytes) -> str:
        """Close the log (if open) and rename its directory `<topic>-<p>.<id hex>-stray` (Kafka's stray
        log), so nothing serves or extends it as the new topic's; returns the new path."""
        lg = self.logs.pop((topic, partition), None)
        if lg is not None:
            self._logs_per_dir[os.path.dirname(os.path.normpath(lg.dir))] -= 1
            self._forget_metadata_due(lg.dir)
            lg.close()
        self._forget_metadata_due(path)
        stray = _rename_stray(path, stored)
        self._quarantined((topic, partition), path, stray, stored)
        return stray

    def _quarantined(self, key: tuple[str, int], path: str, stray: str, stored: bytes) -> None:
        self.on_quarantine(key)
        STRAY_LOGS.inc()
        log.warning("%s-%d: the log in %s belongs to topic id %s, not the current topic; renamed to %s",
                    key[0], key[1], path, uuid.to_string(stored) if len(stored) == uuid.UUID_BYTES else "?", stray)

    def update_config(self, topic: str, topic_configs: dict[str, Any]) -> None:
        cfg = native.LogConfig(**log_config_kwargs(topic_configs))
        self.topic_configs[topic] = dict(topic_configs)
        for (t, _p), lg in self.logs.items():
            if t == topic:
                lg.update_config(cfg)

    def update_configs(self, changed: dict[str, dict[str, Any]]) -> None:
        """update_config for several topics in one pass over the logs (a changed broker default: every topic
        without its own override at once)."""
        native_configs = {t: native.LogConfig(**log_config_kwargs(c)) for t, c in changed.items()}
        for topic, configs in changed.items():
            self.topic_configs[topic] = dict(configs)
        for (t, _p), lg in self.logs.items():
            cfg = native_configs.get(t)
            if cfg is not None:
                lg.update_config(cfg)

    def delete_log(self, topic: str, partition: int) -> None:
        self.delete_detached([((topic, partition), self.detach_log(topic, partition))])

    def detach_log(self, topic: str, partition: int) -> native.Log | None:
        """Stop owning a partition's log (on the loop); delete_detached removes its files after."""
        lg = self.logs.pop((topic, partition), None)
        if lg is not None:
            self._logs_per_dir[os.path.dirname(os.path.normpath(lg.dir))] -= 1
            self._forget_metadata_due(lg.dir)
        return lg

    def delete_detached(self, logs: "list[tuple[tuple[str, int], native.Log | None]]") -> None:
        """Delete detached logs' files (a worker thread may run this): the open log's own delete, else
        whatever directory of the partition is left in any log dir."""
        for (topic, partition), lg in logs:
            if lg is None:
                for d in self.log_dirs:
                    shutil.rmtree(os.path.join(d, f"{topic}-{partition}"), ignore_errors=True)
                continue
            try:
                lg.delete()
            except Exception as exc:  # one log's failure must not keep the others of the batch
                log.warning("deleting the log of %s-%d failed: %s", topic, partition, exc)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._every(self.config.log_retention_check_interval_ms,
                                                        self.cleanup_logs), name="log-retention"))
        # flush.ms is per topic; check at least once a second whether any log is due.
        self._tasks.append(loop.create_task(self._every(min(1000, self.config.log_flush_scheduler_interval_ms),
                                                        self.flush_dirty_logs), name="log-flusher"))
        self._tasks.append(loop.create_task(self._probe_offline_dirs(), name="log-dir-probe"))
        if self.config.log_cleaner_enable:
            self.cleaner.start()

    async def _probe_offline_dirs(self) -> None:
        while True:
            await asyncio.sleep(log_dirs.PROBE_INTERVAL_S)
            for d in list(self.health.offline):
                try:
                    await self.try_recover_dir(d)
                except Exception:  # keep probing; the next round retries
                    log.exception("recovering log dir %s failed", d)

    async def try_recover_dir(self, d: str) -> bool:
        """An offline log dir whose probe write passes: reopen every log of it that saw a failed write (recovery
        cuts a torn batch and rebuilds offsets, indexes and epochs from what is on disk, as after a crash), then
        put the dir online. False (still offline) while the probe fails."""
        try:
            await asyncio.to_thread(log_dirs.probe, d)
        except OSError:
            return False
        health = self.health
        for key, lg in list(self.logs.items()):
            path = os.path.normpath(lg.dir)
            if path not in health.failed_logs or health.dir_of(path) != d:
                continue
            reopened = await asyncio.to_thread(self._reopen, lg)
            if self.logs.get(key) is not lg:  # deleted or replaced meanwhile
                reopened.close()
                continue
            self.logs[key] = reopened
            LOG_RECOVERED_BYTES_TRUNCATED.inc(reopened.recovered_bytes_truncated)
            log.info("reopened %s-%d after its log dir came back: log end %d, cut %d bytes of torn tail",
                     key[0], key[1], reopened.log_end_offset, reopened.recovered_bytes_truncated)
            self.on_log_reopened(key, reopened)
            health.failed_logs.discard(path)
        health.failed_logs = {p for p in health.failed_logs if health.dir_of(p) != d}
        health.online(d)
        return True

    @staticmethod
    def _reopen(lg: native.Log) -> native.Log:
        """Close a log and open it again with full recovery of its active segment (the clean-shutdown marker
        the close wrote is removed), then cut it back to the log end it had: a failed pwritev leaves the part of
        the append it wrote past the end the engine tracks, whole batches with their offsets among it, and
        recovery would take those back although their produce was answered KAFKA_STORAGE_ERROR."""
        path, end, config = lg.dir, lg.log_end_offset, lg.config
        try:
            lg.close()
        except Exception as exc:  # no marker then: the open below recovers all the same
            log.info("closing %s before recovery: %s", path, exc)
        try:
            os.remove(os.path.join(path, CLEAN_SHUTDOWN_FILE))
        except FileNotFoundError:
            pass
        reopened = native.Log(path, config, now_ms())
        if reopened.log_end_offset > end:
            log.info("%s: cutting %d offsets past the log end %d that a failed write left", path,
                     reopened.log_end_offset - end, end)
            reopened.truncate_to(end)
        return reopened

    async def _every(self, interval_ms: int, job: Any) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            try:
                await job()
            except Exception:  # keep the scheduler alive; the next run retries
                log.exception("periodic log job %s failed", job.__name__)

    async def cleanup_logs(self) -> int:
        """Retention (seed 003): delete whole expired or excess segments of every log."""
        deleted = 0
        for key, lg in list(self.logs.items()):
            bound = self.retention_upper_bound(key)
            n = await asyncio.to_thread(lg.delete_old_segments, now_ms(), upper_bound_offset=bound)
            if n:
                self.on_log_start_moved(key)
            deleted += n
        return deleted

    async def flush_dirty_logs(self) -> None:
        """The segments a roll sealed, whatever the flush settings (Kafka schedules that flush at every roll):
        fsynced off the loop without blocking appends, the recovery point moved to the active segment, so a
        clean shutdown syncs one segment per log (and recovery after a crash, which scans the active segment
        only, finds the sealed ones on disk). Then flush.ms: a thread hop
        (the fsync may block) only for a log with unflushed data and a flush.ms other than never (Kafka's
        default); an idle broker used to make one hop per log per second (issue 15: idle cost). Both checks
        read lock-free counters."""
        for key, lg in list(self.logs.items()):
            if lg.rolled_unflushed:
                try:
                    await asyncio.to_thread(lg.flush_rolled)
                except Exception as exc:  # one log's failure must not keep the others' flushes
                    log.warning("flushing the rolled segments of %s-%d failed: %s", key[0], key[1], exc)
            if lg.log_end_offset > lg.recovery_point and lg.config.flush_ms < FLUSH_NEVER_MS:
                await asyncio.to_thread(lg.maybe_flush, now_ms())

    def close(self) -> None:
        """Clean shutdown (Kafka's LogManager.shutdown): every log flushed and closed, which writes its
        clean-shutdown marker, so the next start skips its recovery. The logs of each log dir are closed by
        num.recovery.threads.per.data.dir threads (_close_logs); the caller waits (the broker has stopped
        serving by then)."""
        phases = PhaseClock()
        self.cleaner.stop()
        for task in self._tasks:
            task.cancel()
        phases.lap("cleaner")
        written = self.write_partition_metadata_due()  # a clean shutdown leaves every replica's topic id on disk
        phases.lap("partition.metadata")
        logs = list(self.logs.items())
        threads = self._close_logs(logs)
        self.logs.clear()
        self._logs_per_dir.clear()
        phases.lap("logs")
        log.info("closed %d logs on %d threads (%d partition.metadata written) in %s", len(logs), threads, written,
                 phases)

    def _close_logs(self, logs: "list[tuple[tuple[str, int], native.Log]]") -> int:
        """Close `logs`, each after before_close(key), on num.recovery.threads.per.data.dir threads per log dir;
        returns how many threads ran. A close is a handful of fsyncs (the segments and indexes, the directory,
        the clean-shutdown marker) and a producer snapshot one more: one after the other on the event loop that
        was ~1-2 ms per replica, so 5,000 replicas took 9 s to close and 10,000 minutes on a busy disk (issue
        24). Several at once, the file system commits them together (ext4's journal takes every fsync waiting
        in one commit), and the native close releases the GIL. Each thread takes every n-th log of its dir."""
        per_dir: dict[str, list[tuple[tuple[str, int], native.Log]]] = {}
        for key, lg in logs:
            per_dir.setdefault(os.path.dirname(os.path.normpath(lg.dir)), []).append((key, lg))
        n = max(1, self.config.num_recovery_threads_per_data_dir)
        slices = [batch[i::n] for batch in per_dir.values() for i in range(min(n, len(batch)))]
        threads = [threading.Thread(target=self._close_each, args=(batch,), name=f"log-close-{i}", daemon=True)
                   for i, batch in enumerate(slices)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return len(threads)

    def _close_each(self, logs: "list[tuple[tuple[str, int], native.Log]]") -> None:
        for key, lg in logs:
            try:
                self.before_close(key)
            except Exception:  # the log still closes cleanly: a missing snapshot costs a scan at the next start
                log.exception("before closing %s", lg.dir)
            try:
                lg.close()
            except Exception:
                log.exception("closing %s", lg.dir)


@dataclass
class _Candidate:
    key: tuple[str, int]
    log: native.Log
    configs: dict[str, Any]
    info: native.CleanableInfo


class LogCleaner:
    """Kafka's LogCleaner (seed 003, log compaction): log.cleaner.threads background threads
    that pick the "filthiest" log with cleanup.policy=compact, i.e. the highest dirty ratio
    at or above min.cleanable.dirty.ratio, or any log whose first dirty record is older than
    max.compaction.lag.ms or whose kept tombstones passed their delete horizon, and call the
    native Log.clean on it. The offset map and the segment rewrite run in Rust with the GIL
    released and the log lock held only for the snapshot and the swap, so produce and fetch
    keep flowing. A log is cleaned by one thread at a time; nothing at or above the high
    watermark (the LogManager's retention_upper_bound) is cleaned. Sleeps
    log.cleaner.backoff.ms when no log needs cleaning.
    """

    def __init__(self, manager: LogManager) -> None:
        self.manager = manager
        self.config = manager.config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._in_progress: set[tuple[str, int]] = set()
        self._threads: list[threading.Thread] = []
        self.last_run_monotonic = time.monotonic()
        self.runs = 0
        self.max_clean_time_s = 0.0
        CLEANER_TIME_SINCE_LAST_RUN.set_function(lambda: time.monotonic() - self.last_run_monotonic)

    def start(self) -> None:
        for i in range(max(1, self.config.log_cleaner_threads)):
            t = threading.Thread(target=self._run, name=f"log-cleaner-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops the threads; a cleaning in progress finishes (or its swap is undone on open)."""
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()

    def wakeup(self) -> None:
        """Check the logs now instead of after the backoff (tests, config changes)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cleaned = self.clean_filthiest()
            except Exception:  # keep the thread alive; the log is retried after the backoff
                log.exception("log cleaner pass failed")
                cleaned = False
            self.last_run_monotonic = time.monotonic()
            if not cleaned:
                self._wake.wait(self.config.log_cleaner_backoff_ms / 1000.0)
                self._wake.clear()

    def _candidates(self, now: int) -> list[_Candidate]:
        out: list[_Candidate] = []
        max_dirty = 0.0
        for key, lg in list(self.manager.logs.items()):
            configs = self.manager.topic_configs.get(key[0])
            if configs is None or not is_compacted(configs):
                continue
            try:
                info = lg.cleanable(now, upper_bound_offset=self.manager.retention_upper_bound(key),
                                    min_compaction_lag_ms=int(configs["min.compaction.lag.ms"]))
            except native.LogClosedError:
                continue
            max_dirty = max(max_dirty, info.dirty_ratio)
            due_by_ratio = info.dirty_bytes > 0 and info.dirty_ratio >= float(configs["min.cleanable.dirty.ratio"])
            due_by_lag = (info.dirty_bytes > 0 and info.first_dirty_timestamp >= 0
                          and now - info.first_dirty_timestamp > int(configs["max.compaction.lag.ms"]))
            due_by_horizon = 0 <= info.next_delete_horizon_ms <= now
            if due_by_ratio or due_by_lag or due_by_horizon:
                out.append(_Candidate(key, lg, configs, info))
        CLEANER_MAX_DIRTY_PERCENT.set(100.0 * max_dirty)
        return out

    def clean_filthiest(self) -> bool:
        """One pass: clean the dirtiest log that is due and not being cleaned; True if one was."""
        now = now_ms()
        with self._lock:
            candidates = [c for c in self._candidates(now) if c.key not in self._in_progress]
            if not candidates:
                return False
            chosen = max(candidates, key=lambda c: c.info.dirty_ratio)
            self._in_progress.add(chosen.key)
        try:
            return self._clean(chosen, now)
        finally:
            with self._lock:
                self._in_progress.discard(chosen.key)

    def _clean(self, c: _Candidate, now: int) -> bool:
        threads = max(1, self.config.log_cleaner_threads)
        started = time.monotonic()
        try:
            stats = c.log.clean(now, upper_bound_offset=self.manager.retention_upper_bound(c.key),
                                delete_retention_ms=int(c.configs["delete.retention.ms"]),
                                min_compaction_lag_ms=int(c.configs["min.compaction.lag.ms"]),
                                dedupe_buffer_size=self.config.log_cleaner_dedupe_buffer_size // threads)
        except native.LogClosedError:
            return False
        except Exception:
            CLEANER_ERRORS.inc()
            log.exception("cleaning %s-%d failed", *c.key)
            return False
        elapsed = time.monotonic() - started
        if stats.end_offset < 0:
            return False
        self.runs += 1
        CLEANER_RUNS.inc()
        CLEANER_CLEANED_BYTES.inc(stats.bytes_read)
        CLEANER_WRITTEN_BYTES.inc(stats.bytes_written)
        CLEANER_RECOPY_PERCENT.set(100.0 * stats.bytes_written / stats.bytes_read if stats.bytes_read else 0.0)
        if elapsed > self.max_clean_time_s:
            self.max_clean_time_s = elapsed
            CLEANER_MAX_CLEAN_TIME.set(elapsed)
        log.info("cleaned %s-%d up to offset %d in %.3fs: %d -> %d bytes, %d of %d records kept, %d tombstones removed",
                 c.key[0], c.key[1], stats.end_offset, elapsed, stats.bytes_read, stats.bytes_written,
                 stats.records_retained, stats.records_read, stats.tombstones_removed)
        return True
