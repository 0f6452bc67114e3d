"""LogManager: retention never deletes at or above the high watermark; the flush scheduler touches only due logs."""

from __future__ import annotations

import asyncio
import os
import threading

from gregor.broker.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from gregor.common.config import BrokerConfig, effective_topic_configs
from tests.helpers.batches import make_batch


async def test_retention_is_bounded_by_the_high_watermark(tmp_path) -> None:
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    configs = effective_topic_configs({"retention.ms": "1000", "segment.bytes": "200"})
    log = manager.get_or_create_log("old", 0, configs)
    for i in range(5):  # year-2001 timestamps: every segment is long expired
        log.append_as_leader(make_batch([f"v{i}".encode()], timestamp_ms=1_000_000_000_000), 0)
    assert log.num_segments >= 3
    hw = {"value": 0}
    manager.retention_upper_bound = lambda key: hw["value"]
    assert await manager.cleanup_logs() == 0, "nothing is below HW 0"
    assert log.log_start_offset == 0
    hw["value"] = 3
    await manager.cleanup_logs()
    assert 0 < log.log_start_offset <= 3, "deletes only segments wholly below the HW"
    assert log.log_end_offset == 5
    manager.close()


def count_thread_hops(monkeypatch) -> list[object]:  # type: ignore[no-untyped-def]
    """From now on every asyncio.to_thread call appends the function it hands to a thread."""
    hops: list[object] = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(fn, *args):  # type: ignore[no-untyped-def]
        hops.append(fn)
        return await real_to_thread(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting_to_thread)
    return hops


async def test_flush_scheduler_fsyncs_only_due_logs_with_unflushed_data(tmp_path, monkeypatch) -> None:
    """flush.ms=0 logs with new data are fsynced by the scheduler; default (never) logs and idle logs are left
    alone (no thread hop per log per second on an idle broker)."""
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    eager = manager.get_or_create_log("eager", 0, effective_topic_configs({"flush.ms": "0"}))
    lazy = manager.get_or_create_log("lazy", 0, effective_topic_configs({}))
    for lg in (eager, lazy):
        lg.append_as_leader(make_batch([b"a", b"b"]), 0)
    assert eager.recovery_point == lazy.recovery_point == 0
    await manager.flush_dirty_logs()
    assert eager.recovery_point == 2, "flush.ms=0: flushed"
    assert lazy.recovery_point == 0, "flush.ms never: left to the OS"
    hops = count_thread_hops(monkeypatch)
    await manager.flush_dirty_logs()
    assert hops == [], "nothing unflushed under a flush.ms: no thread hop at all"
    eager.append_as_leader(make_batch([b"c"]), 0)
    await manager.flush_dirty_logs()
    assert len(hops) == 1 and eager.recovery_point == 3
    manager.close()


async def test_the_scheduler_flushes_what_a_roll_sealed_whatever_flush_ms(tmp_path, monkeypatch) -> None:
    """Kafka flushes a segment when a roll seals it: with flush.ms never (the default) the scheduler still
    fsyncs the sealed segments and moves the recovery point to the active segment's base, and leaves the
    active segment to the OS; a log with nothing rolled costs no thread hop."""
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    rolling = manager.get_or_create_log("rolling", 0, effective_topic_configs({"segment.bytes": "200"}))
    for i in range(6):
        rolling.append_as_leader(make_batch([f"value-{i}".encode() * 8]), 0)
    sealed_up_to = rolling.segments()[-1].base_offset
    assert rolling.num_segments >= 3 and 0 < sealed_up_to < rolling.log_end_offset
    assert rolling.rolled_unflushed and rolling.recovery_point == 0
    await manager.flush_dirty_logs()
    assert rolling.recovery_point == sealed_up_to, "sealed segments fsynced; the active one left to the OS"
    assert not rolling.rolled_unflushed
    hops = count_thread_hops(monkeypatch)
    rolling.append_as_leader(make_batch([b"x"]), 0)  # into the active segment: nothing newly sealed
    await manager.flush_dirty_logs()
    assert hops == [] and rolling.recovery_point == sealed_up_to
    manager.close()


def test_partition_metadata_records_the_topic_id_and_another_id_is_quarantined(tmp_path) -> None:
    """KIP-516: a log dir carries its topic id; a log of another id (a deleted topic's) is renamed -stray,
    kept with its records, and a new empty log starts; a log from before ids adopts the id."""
    from gregor.broker.log_manager import PARTITION_METADATA, read_partition_metadata
    from gregor.common import uuid

    old, new = uuid.random_topic_id(), uuid.random_topic_id()
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    configs = effective_topic_configs({})
    lg = manager.get_or_create_log("t", 0, configs, old)
    lg.append_as_leader(make_batch([b"old"]), 0)
    with open(tmp_path / "t-0" / PARTITION_METADATA) as f:
        assert f.read() == f"version: 0\ntopic_id: {uuid.to_string(old)}\n"  # Kafka's format
    manager.close()

    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    assert manager.get_or_create_log("t", 0, configs, old).log_end_offset == 1  # same id: same log
    manager.close()
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    quarantined: list[tuple[str, int]] = []
    manager.on_quarantine = quarantined.append
    fresh = manager.get_or_create_log("t", 0, configs, new)
    assert fresh.log_end_offset == 0 and read_partition_metadata(str(tmp_path / "t-0")) == new
    stray = tmp_path / f"t-0.{old.hex()}-stray"
    assert stray.is_dir() and read_partition_metadata(str(stray)) == old and quarantined == [("t", 0)]
    manager.close()

    # A log written before topic ids (no partition.metadata) keeps its records and adopts the id.
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    legacy = manager.get_or_create_log("legacy", 0, configs)
    legacy.append_as_leader(make_batch([b"x"]), 0)
    assert read_partition_metadata(str(tmp_path / "legacy-0")) == b""
    manager.close()
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    assert manager.get_or_create_log("legacy", 0, configs, new).log_end_offset == 1
    assert read_partition_metadata(str(tmp_path / "legacy-0")) == new
    manager.close()


def test_new_logs_go_to_the_log_dir_with_the_fewest_open_logs(tmp_path) -> None:
    """Kafka's placement, counted in memory (a directory scan per new partition made creating N
    partitions O(N^2)): new logs alternate over the dirs, and a deleted log frees its dir's slot."""
    a, b = tmp_path / "a", tmp_path / "b"
    manager = LogManager(BrokerConfig(log_dirs=f"{a},{b}/"))
    configs = effective_topic_configs({})
    dirs = [os.path.dirname(manager.get_or_create_log("t", i, configs).dir) for i in range(4)]
    assert sorted(dirs) == sorted([str(a), str(a), str(b), str(b)]), dirs
    manager.delete_log("t", dirs.index(str(b)))
    assert os.path.dirname(manager.get_or_create_log("u", 0, configs).dir) == str(b)
    # A partition already on disk stays where it is.
    assert os.path.dirname(manager.get_or_create_log("t", 0, configs).dir) == dirs[0]
    manager.close()


async def test_open_logs_lays_out_many_logs_between_other_work_and_fails_only_the_broken_one(tmp_path) -> None:
    """open_logs (a LeaderAndIsr's new replicas, issue 24): every log opened with its topic id, over two log
    dirs; a partition whose directory cannot be made fails alone; the loop ran other work meanwhile."""
    from gregor.broker import log_manager as lm
    from gregor.broker.log_manager import read_partition_metadata
    from gregor.common import uuid

    a, b = tmp_path / "a", tmp_path / "b"
    manager = LogManager(BrokerConfig(log_dirs=f"{a},{b}"))
    configs = effective_topic_configs({})
    tid = uuid.random_topic_id()
    for d in (a, b):
        (d / "t-7").write_text("a file where partition 7's directory would go")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    lm.OPEN_LOGS_SLICE_S, saved = 0.0, lm.OPEN_LOGS_SLICE_S  # yield after every log
    task = asyncio.create_task(ticker())
    try:
        failed = await manager.open_logs([("t", i, configs, tid) for i in range(40)])
    finally:
        task.cancel()
        lm.OPEN_LOGS_SLICE_S = saved
    assert list(failed) == [("t", 7)] and isinstance(failed[("t", 7)], OSError)
    assert sorted(manager.logs) == [("t", i) for i in range(40) if i != 7]
    # partition.metadata is written off the loop (a worker thread); until then the id is answered from memory.
    assert all(manager.log_topic_id("t", i) == tid for i in range(40) if i != 7)
    await manager.flush_partition_metadata()
    assert all(read_partition_metadata(lg.dir) == tid for lg in manager.logs.values())
    assert {os.path.dirname(lg.dir) for lg in manager.logs.values()} == {str(a), str(b)}
    assert ticks >= 39, "open_logs did not let the loop run between logs"
    assert await manager.open_logs([("t", 0, configs, tid)]) == {}  # already open: nothing to do
    manager.close()


async def test_new_replicas_partition_metadata_is_written_off_the_loop_and_kept_across_close(tmp_path, monkeypatch) -> None:
    """open_logs (a LeaderAndIsr's new replicas) does not write partition.metadata itself (an fsync per replica
    on the loop, issue 24): a worker thread does, soon after; the id is answered from memory meanwhile; close
    writes whatever is still due; a deleted replica's file is never written into its removed directory."""
    from gregor.broker import log_manager as lm
    from gregor.broker.log_manager import PARTITION_METADATA, read_partition_metadata
    from gregor.common import uuid
    from tests.helpers.wait import until

    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    configs = effective_topic_configs({})
    tid = uuid.random_topic_id()
    writer_threads: list[str] = []
    real_sync = lm.sync_filesystems
    hold = asyncio.Event()  # the writer is held back until the checks of the due state are done

    def recording_sync(dirs: list[str]) -> bool:
        import threading
        writer_threads.append(threading.current_thread().name)
        return real_sync(dirs)

    monkeypatch.setattr(lm, "sync_filesystems", recording_sync)
    real_to_thread = asyncio.to_thread

    async def held_to_thread(fn, *args):  # type: ignore[no-untyped-def]
        await hold.wait()
        return await real_to_thread(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", held_to_thread)
    assert await manager.open_logs([("t", i, configs, tid) for i in range(6)]) == {}
    assert not any(os.path.exists(os.path.join(lg.dir, PARTITION_METADATA)) for lg in manager.logs.values())
    assert all(manager.log_topic_id("t", i) == tid for i in range(6)), "due ids are answered from memory"
    gone = manager.logs[("t", 5)].dir
    manager.delete_log("t", 5)
    hold.set()
    await until(lambda: all(os.path.exists(os.path.join(lg.dir, PARTITION_METADATA)) for lg in manager.logs.values()),
                10, "every partition.metadata written by the worker")
    assert writer_threads and "MainThread" not in writer_threads
    assert not os.path.exists(gone), "the deleted replica's directory was not re-created by the writer"
    assert all(read_partition_metadata(lg.dir) == tid for lg in manager.logs.values())

    # Due at close (a clean shutdown before the worker ran): written by close, read back by the next broker.
    hold.clear()
    other = uuid.random_topic_id()
    await manager.open_logs([("u", 0, configs, other)])
    manager.close()
    reopened = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    reopened.get_or_create_log("u", 0, configs)
    assert reopened.log_topic_id("u", 0) == other
    reopened.close()
    hold.set()


async def test_partition_metadata_of_a_large_creation_is_made_durable_per_batch_not_per_file(tmp_path, monkeypatch) -> None:
    """A creation's partition.metadata files are synced with one syncfs per batch of METADATA_WRITE_BATCH, not
    an fsync each (a journal commit each, issue 24); while a batch syncs its ids are answered from memory and
    no file is in place yet; a replica deleted during the sync gets no file; the rest land complete, with no
    temp file left."""
    from gregor.broker import log_manager as lm
    from gregor.broker.log_manager import PARTITION_METADATA, read_partition_metadata
    from gregor.common import uuid

    monkeypatch.setattr(lm, "METADATA_WRITE_BATCH", 40)
    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    configs = effective_topic_configs({})
    tid = uuid.random_topic_id()
    n = 100
    # Laid out as open_logs does for a LeaderAndIsr, the worker held back: every file is still due.
    monkeypatch.setattr(manager, "_write_metadata_due", lambda: asyncio.sleep(0))
    assert await manager.open_logs([("t", i, configs, tid) for i in range(n)]) == {}
    syncs: list[list[str]] = []
    fsyncs: list[int] = []
    real_sync, real_fsync = lm.sync_filesystems, os.fsync
    deleted = manager.logs[("t", 7)].dir

    def spying_sync(dirs: list[str]) -> bool:
        syncs.append(dirs)
        if len(syncs) == 1:  # the first batch is staged, not renamed: answered from memory, not on disk
            staged = [lg for lg in manager.logs.values() if not os.path.exists(os.path.join(lg.dir, PARTITION_METADATA))]
            assert len(staged) == n
            assert all(manager.log_topic_id("t", i) == tid for i in range(n))
            manager.delete_log("t", 7)  # the loop deletes a replica while the batch syncs
        return real_sync(dirs)

    monkeypatch.setattr(lm, "sync_filesystems", spying_sync)
    monkeypatch.setattr(lm.os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    assert manager.write_partition_metadata_due() == n - 1
    assert len(syncs) == 3 and syncs[0] == [str(tmp_path)], syncs  # 100 files in batches of 40: three syncs
    assert fsyncs == [], "no fsync per file when syncfs works"
    assert not os.path.exists(deleted)
    for lg in manager.logs.values():
        assert read_partition_metadata(lg.dir) == tid
        assert not os.path.exists(os.path.join(lg.dir, PARTITION_METADATA + ".tmp"))
    manager.close()


async def test_partition_metadata_falls_back_to_an_fsync_per_file_when_syncfs_fails(tmp_path, monkeypatch) -> None:
    from gregor.broker import log_manager as lm
    from gregor.broker.log_manager import read_partition_metadata
    from gregor.common import uuid

    manager = LogManager(BrokerConfig(log_dirs=str(tmp_path)))
    monkeypatch.setattr(manager, "_write_metadata_due", lambda: asyncio.sleep(0))
    tid = uuid.random_topic_id()
    assert await manager.open_logs([("t", i, effective_topic_configs({}), tid) for i in range(5)]) == {}

    def failing_sync(dirs: list[str]) -> bool:
        raise OSError(5, "Input/output error")

    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(lm, "sync_filesystems", failing_sync)
    monkeypatch.setattr(lm.os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    assert manager.write_partition_metadata_due() == 5
    assert len(fsyncs) == 5
    assert all(read_partition_metadata(lg.dir) == tid for lg in manager.logs.values())
    manager.close()


def test_sync_filesystems_syncs_each_file_system_once(tmp_path) -> None:
    from gregor.broker.log_manager import sync_filesystems

    dirs = [str(tmp_path / d) for d in ("a", "b")]
    for d in dirs:
        os.makedirs(d)
    assert sync_filesystems(dirs) is True  # Linux: syncfs(2) exists
    try:
        sync_filesystems([str(tmp_path / "missing")])
    except FileNotFoundError:
        pass
    else:
        raise AssertionError("a missing directory is an error, not a silent no-op")


def test_close_spreads_the_logs_over_the_recovery_threads_of_each_dir_and_the_next_open_skips_recovery(
        tmp_path) -> None:
    """Clean shutdown (issue 24): each log dir's logs are closed by num.recovery.threads.per.data.dir threads,
    not one after the other on the caller's thread (the event loop): every log gets before_close (the producer
    snapshot) while still open, then its close, which writes its clean-shutdown marker; the next open of every
    one skips recovery, and a log that was not closed (a crash) is recovered."""
    dirs = [os.path.join(str(tmp_path), d) for d in ("a", "b")]
    cfg = BrokerConfig(log_dirs=",".join(dirs))
    cfg.num_recovery_threads_per_data_dir = 3
    manager = LogManager(cfg)
    configs = effective_topic_configs({})
    logs = {("t", p): manager.get_or_create_log("t", p, configs) for p in range(40)}
    for lg in logs.values():
        lg.append_as_leader(make_batch([b"v"]), 0)
    assert {os.path.dirname(lg.dir) for lg in logs.values()} == set(dirs), "the logs are spread over both dirs"
    seen: list[tuple[str, tuple[str, int], int]] = []

    def before_close(key: tuple[str, int]) -> None:
        seen.append((threading.current_thread().name, key, logs[key].log_end_offset))  # still open

    manager.before_close = before_close
    manager.close()
    assert sorted(key for _, key, _ in seen) == sorted(logs), "every log once"
    assert {leo for _, _, leo in seen} == {1}
    closers = {name for name, _, _ in seen}
    assert len(closers) == 2 * 3, closers  # three threads per log dir
    assert threading.current_thread().name not in closers
    for lg in logs.values():
        assert os.path.exists(os.path.join(lg.dir, CLEAN_SHUTDOWN_FILE)), lg.dir

    again = LogManager(cfg)
    for p in range(40):
        assert again.get_or_create_log("t", p, configs).log_end_offset == 1
    assert again.loaded == {"skipped": 40}, "no recovery of a cleanly closed log"
    crashed = {("t", p): again.logs[("t", p)] for p in range(2)}  # left open: no marker, as after a SIGKILL
    again.logs = {k: v for k, v in again.logs.items() if k not in crashed}
    again.close()
    third = LogManager(cfg)
    for p in range(40):
        third.get_or_create_log("t", p, configs)
    assert third.loaded == {"skipped": 38, "performed": 2}
    third.close()
    for lg in crashed.values():
        lg.close()
