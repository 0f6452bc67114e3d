"""Deterministic tests of gregor_native.Log: rolls, lookups, retention, the leader-epoch
cache (seed 002), flush policy and follower appends."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional

import gregor_native as native
import pytest

from tests.reference import codec
from tests.unit.native.support import (
    log_files, make_batch, offsets_of, read_all, snapshot, values_batch,
)

MAX_RELATIVE_OFFSET = 2**31 - 1


def open_log(path: Path, now_ms: Optional[int] = None, **config: int) -> native.Log:
    return native.Log(str(path), native.LogConfig(**config), now_ms=now_ms)


def segment_bases(log: native.Log) -> list[int]:
    return [s.base_offset for s in log.segments()]


def check_segments_on_disk(log: native.Log) -> None:
    """Each segment is a <base:020>.log file holding exactly its batches."""
    path = Path(log.dir)
    infos = log.segments()
    assert [p.name for p in log_files(path, ".log")] == [f"{s.base_offset:020d}.log" for s in infos]
    for s in infos:
        data = Path(s.log_path).read_bytes()
        assert len(data) == s.size_bytes
        headers = codec.parse_batches(data)
        assert all(h.base_offset >= s.base_offset for h in headers)
        assert all(h.last_offset - s.base_offset <= MAX_RELATIVE_OFFSET for h in headers)
        assert (headers[-1].next_offset if headers else s.base_offset) == s.next_offset


# ---------------------------------------------------------------- config
def test_log_config_defaults() -> None:
    c = native.LogConfig()
    assert (c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes) == (
        1073741824, 604800000, 10485760, 4096)
    assert (c.retention_bytes, c.retention_ms, c.max_message_bytes) == (-1, 604800000, 1048588)
    assert c.flush_messages == c.flush_ms == 2**63 - 1


# ---------------------------------------------------------------- the four roll conditions
def test_roll_on_segment_bytes(tmp_path: Path) -> None:
    batch_size = len(values_batch(2, 100))
    log = open_log(tmp_path, segment_bytes=3 * batch_size + 10)
    for i in range(10):
        info = log.append_as_leader(values_batch(2, 100, tag=i), leader_epoch=0, now_ms=0)
        assert info.first_offset == 2 * i
    assert segment_bases(log) == [0, 6, 12, 18]
    assert [s.size_bytes for s in log.segments()] == [3 * batch_size] * 3 + [batch_size]
    check_segments_on_disk(log)
    log.close()


def test_an_append_goes_whole_into_one_segment_unless_larger_than_one(tmp_path: Path) -> None:
    """Kafka rolls before the whole append: one that does not fit the active segment starts a new one
    rather than being split (a failed second share could not leave the first behind); only an append
    larger than a segment is split, so that segments still stay within segment_bytes."""
    batch_size = len(values_batch(1, 100))
    log = open_log(tmp_path, segment_bytes=4 * batch_size)
    log.append_as_leader(values_batch(1, 100) * 3, leader_epoch=0, now_ms=0)
    log.append_as_leader(values_batch(1, 100) * 2, leader_epoch=0, now_ms=0)
    assert segment_bases(log) == [0, 3]
    log.append_as_leader(values_batch(1, 100) * 6, leader_epoch=0, now_ms=0)
    assert segment_bases(log) == [0, 3, 7]  # split: segment 3 filled to 4 batches, the rest from 7
    assert all(s.size_bytes <= 4 * batch_size for s in log.segments())
    check_segments_on_disk(log)
    log.close()


def test_roll_on_segment_ms(tmp_path: Path) -> None:
    # Batch timestamps equal now_ms, so the age of a segment is the same whether
    # it is measured from its creation or from its first batch (Kafka).
    log = open_log(tmp_path, now_ms=5_000, segment_ms=1000)

    def append(now: int) -> None:
        log.append_as_leader(values_batch(1, 10, timestamp_ms=now), leader_epoch=0, now_ms=now)

    append(5_000)
    append(5_600)
    assert segment_bases(log) == [0]
    append(6_100)  # 1,100 ms after the segment's first batch
    assert segment_bases(log) == [0, 2]
    append(6_900)
    assert segment_bases(log) == [0, 2]
    append(7_200)
    assert segment_bases(log) == [0, 2, 4]
    check_segments_on_disk(log)
    log.close()


def test_roll_on_full_index(tmp_path: Path) -> None:
    # 64 bytes hold 8 offset entries and 5 time entries; one entry per batch or so.
    log = open_log(tmp_path, segment_index_bytes=64, index_interval_bytes=1)
    for i in range(60):
        log.append_as_leader(values_batch(1, 20, timestamp_ms=1000 + i, tag=i), leader_epoch=0, now_ms=0)
    infos = log.segments()
    assert len(infos) >= 5
    for s in infos:
        assert s.offset_index_entries <= 8 and s.time_index_entries <= 5
    assert sum(s.offset_index_entries for s in infos) > 0
    for offset in range(60):
        assert offsets_of(log.read(offset, 1)) == [(offset, offset)]
    log.close()
    for index in log_files(tmp_path, ".index"):
        assert index.stat().st_size % 8 == 0 and index.stat().st_size <= 64
    for index in log_files(tmp_path, ".timeindex"):
        assert index.stat().st_size % 12 == 0 and index.stat().st_size <= 64


def test_roll_on_offset_overflow(tmp_path: Path) -> None:
    """A follower batch more than 2^31 - 1 offsets above the segment base goes to a
    new segment: relative offsets in the index are 32 bits."""
    log = open_log(tmp_path)
    far = 2**31 + 10
    log.append_as_follower(make_batch([b"a", b"b"], base_offset=0, epoch=1))
    first = make_batch([b"c"], base_offset=2, epoch=1)
    jump = make_batch([b"d", b"e"], base_offset=far, epoch=1)
    info = log.append_as_follower(first + jump)
    assert (info.first_offset, info.last_offset, info.log_end_offset) == (2, far + 1, far + 2)
    bases = segment_bases(log)
    assert len(bases) >= 2 and bases[0] == 0 and 2 < bases[-1] <= far
    check_segments_on_disk(log)
    assert log.read(2, 10_000) == first
    assert log.read(far, 10_000) == jump
    assert log.read(far + 1, 10_000) == jump
    log.close()
    log = open_log(tmp_path)
    assert segment_bases(log) == bases
    assert log.read(far, 10_000) == jump
    log.close()


def test_explicit_roll_and_empty_roll(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.roll(now_ms=0) == 0  # rolling an empty log keeps one segment
    log.append_as_leader(values_batch(3, 10), leader_epoch=0)
    assert log.roll(now_ms=1) == 3
    assert log.roll(now_ms=2) == 3  # the empty active segment is reused
    assert segment_bases(log) == [0, 3]
    assert log.read(3, 100) == b""  # start == LEO: empty, not an error
    log.close()


# ---------------------------------------------------------------- lookups
def test_max_offset_inside_a_batch(tmp_path: Path) -> None:
    """The .pyi: a read bounded by max_offset excludes any batch whose last offset is
    >= max_offset (consumers only see fully committed batches), even with
    min_one_batch."""
    log = open_log(tmp_path)
    for _ in range(4):
        log.append_as_leader(values_batch(2, 50), leader_epoch=0)
    assert offsets_of(log.read(0, 1 << 20, max_offset=5)) == [(0, 1), (2, 3)]
    assert log.read(4, 1 << 20, max_offset=5) == b""
    assert log.read(4, 1 << 20, max_offset=5, min_one_batch=True) == b""
    log.close()



def test_lookup_by_offset_at_every_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=4096, index_interval_bytes=128)
    infos = [log.append_as_leader(values_batch(1 + i % 5, 10 + (i * 37) % 200, tag=i), leader_epoch=i // 50)
             for i in range(150)]
    stored = codec.split_batches(read_all(log))
    assert [(h.base_offset, h.last_offset) for h, _ in stored] == [(i.first_offset, i.last_offset) for i in infos]
    expected = [(h.base_offset, h.last_offset, raw) for h, raw in stored]
    assert log.num_segments > 3
    assert all(s.offset_index_entries > 0 for s in log.segments()[:-1])

    def check(log: native.Log) -> None:
        for base, last, data in expected:
            for offset in range(base, last + 1):
                assert log.read(offset, 1) == data, offset  # min_one_batch
                assert log.read(offset, 1, min_one_batch=False) == b""
                assert log.read_slice(offset, 1).start_offset == base

    check(log)
    log.close()
    log = open_log(tmp_path, segment_bytes=4096, index_interval_bytes=128)  # indexes from disk
    check(log)
    log.close()


def test_read_limits_and_segment_bounds(tmp_path: Path) -> None:
    batch = values_batch(2, 50)
    size = len(batch)
    log = open_log(tmp_path, segment_bytes=5 * size)
    for _ in range(8):
        log.append_as_leader(batch, leader_epoch=0)
    assert segment_bases(log) == [0, 10]
    assert offsets_of(log.read(0, 3 * size)) == [(0, 1), (2, 3), (4, 5)]
    assert offsets_of(log.read(0, 3 * size - 1)) == [(0, 1), (2, 3)]
    assert offsets_of(log.read(3, 100 * size)) == [(2, 3), (4, 5), (6, 7), (8, 9)]  # not past segment
    assert offsets_of(log.read(0, 100 * size, max_offset=4)) == [(0, 1), (2, 3)]
    assert offsets_of(log.read(0, 100 * size, max_offset=6)) == [(0, 1), (2, 3), (4, 5)]
    assert offsets_of(log.read(12, 100 * size)) == [(12, 13), (14, 15)]
    assert log.read(16, 100) == b""
    for bad in (-1, 17, 1000):
        with pytest.raises(native.OffsetOutOfRangeError):
            log.read(bad, 100)
    log.close()


def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=3000, index_interval_bytes=100)
    records: list[tuple[int, int]] = []  # (offset, timestamp)
    for i in range(80):
        ts = 10_000 + 10 * i
        info = log.append_as_leader(make_batch([b"v%d" % j for j in range(3)], ts, ts_step=3),
                                    leader_epoch=0, now_ms=ts)
        records += [(info.first_offset + j, ts + 3 * j) for j in range(3)]
    assert log.num_segments > 2
    for target in range(9_990, 10_000 + 10 * 80 + 5):
        want = next(((o, t) for o, t in records if t >= target), None)
        assert log.offset_for_timestamp(target) == want, target
    # A compressed batch is answered with its base offset and max timestamp.
    section = gzip.compress(codec.encode_records([(None, b"z", [], d) for d in (0, 5, 9)]))
    compressed = codec.build_batch(section, 3, attributes=native.COMPRESSION_GZIP,
                                   base_timestamp=20_000, max_timestamp=20_009)
    info = log.append_as_leader(compressed, leader_epoch=0, now_ms=20_009)
    assert log.offset_for_timestamp(20_004) == (info.first_offset, 20_009)
    assert log.offset_for_timestamp(20_010) is None
    log.close()


# ---------------------------------------------------------------- retention
def build_three_epoch_log(path: Path, **config: int) -> tuple[native.Log, int]:
    """Nine 2-record batches, three per segment, epochs 0, 1, 2 by segment;
    batch i has timestamp 1000 * (i + 1)."""
    size = len(values_batch(2, 40))
    log = open_log(path, segment_bytes=3 * size, **config)
    for i in range(9):
        ts = 1000 * (i + 1)
        log.append_as_leader(values_batch(2, 40, timestamp_ms=ts, tag=i), leader_epoch=i // 3, now_ms=ts)
    assert segment_bases(log) == [0, 6, 12]
    assert log.epoch_entries() == [(0, 0), (1, 6), (2, 12)]
    return log, size


def test_retention_by_time(tmp_path: Path) -> None:
    log, _ = build_three_epoch_log(tmp_path, retention_ms=5_000)
    assert log.delete_old_segments(now_ms=8_000) == 0  # segment 0's largest timestamp is 3,000
    assert log.delete_old_segments(now_ms=8_001) == 1
    assert (log.log_start_offset, segment_bases(log)) == (6, [6, 12])
    assert log.epoch_entries() == [(1, 6), (2, 12)]
    with pytest.raises(native.OffsetOutOfRangeError):
        log.read(5, 100)
    assert offsets_of(log.read(6, 1))[0] == (6, 7)
    # Everything expired: the active segment is rolled first, then deleted.
    assert log.delete_old_segments(now_ms=100_000) == 2
    assert (log.log_start_offset, log.log_end_offset, segment_bases(log)) == (18, 18, [18])
    assert log.epoch_entries() == [(2, 18)]
    assert log.read(18, 100) == b""
    info = log.append_as_leader(values_batch(1, 5, timestamp_ms=100_000), leader_epoch=2, now_ms=100_000)
    assert info.first_offset == 18
    assert log.delete_old_segments(now_ms=100_000) == 0
    check_segments_on_disk(log)
    log.close()


def test_retention_by_time_keeps_a_fresh_active_segment(tmp_path: Path) -> None:
    log, _ = build_three_epoch_log(tmp_path, retention_ms=5_000)
    assert log.delete_old_segments(now_ms=13_000) == 2  # active (largest 9,000) not expired
    assert segment_bases(log) == [12]
    assert log.epoch_entries() == [(2, 12)]
    log.close()


def test_retention_by_bytes(tmp_path: Path) -> None:
    log, size = build_three_epoch_log(tmp_path, retention_ms=-1, retention_bytes=-1)
    assert log.delete_old_segments(now_ms=10**12) == 0  # unlimited
    # Kafka's rule: delete the oldest segment while what is left is still >= retention.bytes.
    log.update_config(native.LogConfig(segment_bytes=3 * size, retention_ms=-1, retention_bytes=6 * size + 1))
    assert log.delete_old_segments(now_ms=0) == 0
    log.update_config(native.LogConfig(segment_bytes=3 * size, retention_ms=-1, retention_bytes=6 * size))
    assert log.delete_old_segments(now_ms=0) == 1
    assert (log.log_start_offset, log.size_bytes) == (6, 6 * size)
    assert log.epoch_entries() == [(1, 6), (2, 12)]
    log.update_config(native.LogConfig(segment_bytes=3 * size, retention_ms=-1, retention_bytes=0))
    assert log.delete_old_segments(now_ms=0) == 1  # the active segment stays
    assert (log.log_start_offset, segment_bases(log)) == (12, [12])
    assert log.epoch_entries() == [(2, 12)]
    check_segments_on_disk(log)
    log.close()


def test_retention_trims_epoch_inside_a_segment(tmp_path: Path) -> None:
    """The epoch that owns the first remaining offset is kept, moved to the new
    log start (Kafka's truncateFromStart), not dropped."""
    size = len(values_batch(2, 40))
    log = open_log(tmp_path, segment_bytes=3 * size, retention_bytes=3 * size, retention_ms=-1)
    epochs = [0, 1, 1, 1, 2, 2, 2]  # epoch 1 starts inside segment 0, owns all of segment 1
    for i, epoch in enumerate(epochs):
        log.append_as_leader(values_batch(2, 40, tag=i), leader_epoch=epoch)
    assert log.epoch_entries() == [(0, 0), (1, 2), (2, 8)]
    assert segment_bases(log) == [0, 6, 12]
    assert log.delete_old_segments() == 1
    assert log.epoch_entries() == [(1, 6), (2, 8)]
    assert log.end_offset_for_epoch(1) == (1, 8)
    log.close()


def test_maybe_increment_log_start_offset(tmp_path: Path) -> None:
    log, _ = build_three_epoch_log(tmp_path)
    assert log.maybe_increment_log_start_offset(7)
    assert not log.maybe_increment_log_start_offset(7)
    assert not log.maybe_increment_log_start_offset(3)
    assert log.log_start_offset == 7
    assert log.epoch_entries() == [(1, 7), (2, 12)]
    with pytest.raises(native.OffsetOutOfRangeError):
        log.read(6, 100)
    assert offsets_of(log.read(7, 1)) == [(6, 7)]  # the batch holding offset 7
    log.close()


# ---------------------------------------------------------------- truncation
def test_truncate_to(tmp_path: Path) -> None:
    log, size = build_three_epoch_log(tmp_path)
    assert not log.truncate_to(18)
    assert not log.truncate_to(50)
    assert log.truncate_to(13)  # inside the batch 12..13: that batch goes too
    assert (log.log_end_offset, segment_bases(log)) == (12, [0, 6, 12])
    # Entries at or after the new log end go: epoch 2 has no record left. (The
    # .pyi says "at or after offset"; cutting at the new end keeps the cache
    # consistent with the log, which is what replication relies on.)
    assert log.epoch_entries() == [(0, 0), (1, 6)]
    assert log.truncate_to(8)
    assert (log.log_end_offset, segment_bases(log), log.size_bytes) == (8, [0, 6], 4 * size)
    assert log.epoch_entries() == [(0, 0), (1, 6)]
    assert log.latest_epoch() == 1
    info = log.append_as_leader(values_batch(1, 5), leader_epoch=3)
    assert info.first_offset == 8
    assert log.epoch_entries() == [(0, 0), (1, 6), (3, 8)]
    check_segments_on_disk(log)
    log.close()


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    log, _ = build_three_epoch_log(tmp_path)
    log.truncate_fully_and_start_at(1_000)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (1_000, 1_000, 0)
    assert segment_bases(log) == [1_000]
    assert log.epoch_entries() == [] and log.latest_epoch() is None
    assert [p.name for p in log_files(tmp_path, ".log")] == [f"{1000:020d}.log"]
    info = log.append_as_follower(make_batch([b"x"], base_offset=1_000, epoch=7))
    assert info.first_offset == 1_000
    assert log.epoch_entries() == [(7, 1_000)]
    log.close()


# ---------------------------------------------------------------- leader-epoch cache (seed 002)
def seed_logs(tmp_path: Path) -> tuple[native.Log, native.Log]:
    """A led epoch 1 and has offsets 1..6; B replicated 1..4. Offsets start at 1 as in the seed."""
    a, b = open_log(tmp_path / "A"), open_log(tmp_path / "B")
    for log in (a, b):
        log.truncate_fully_and_start_at(1)
    for i in range(6):
        a.append_as_leader(make_batch([b"r%d" % (i + 1)]), leader_epoch=1)
    b.append_as_follower(a.read(1, 10_000, max_offset=5))
    assert (a.log_end_offset, b.log_end_offset) == (7, 5)
    assert a.epoch_entries() == b.epoch_entries() == [(1, 1)]
    return a, b


def test_seed_002_new_leader_without_new_records(tmp_path: Path) -> None:
    a, b = seed_logs(tmp_path)
    # B leads epoch 2 but has appended nothing: its latest epoch is still 1.
    end_epoch, end_offset = b.end_offset_for_epoch(1)
    assert (end_epoch, end_offset) == (1, 5)
    assert a.truncate_to(min(end_offset, a.log_end_offset))
    assert a.log_end_offset == 5 and a.epoch_entries() == [(1, 1)]
    assert read_all(a) == read_all(b)
    a.close()
    b.close()


def test_seed_002_new_leader_with_new_records(tmp_path: Path) -> None:
    a, b = seed_logs(tmp_path)
    for i in range(3):
        b.append_as_leader(make_batch([b"b%d" % (i + 5)]), leader_epoch=2)
    assert b.epoch_entries() == [(1, 1), (2, 5)]
    assert b.end_offset_for_epoch(2) == (2, 8)
    # Older than every known epoch: Kafka answers the asked epoch with the
    # start offset of the first known epoch.
    assert b.end_offset_for_epoch(0) == (0, 1)
    assert b.end_offset_for_epoch(-1) == (-1, -1)
    assert b.end_offset_for_epoch(3) == (-1, -1)
    # A asks with its latest epoch, 1: the smallest larger epoch (2) starts at 5.
    end_epoch, end_offset = b.end_offset_for_epoch(a.latest_epoch())
    assert (end_epoch, end_offset) == (1, 5)
    assert a.truncate_to(min(end_offset, a.log_end_offset))
    assert (a.log_end_offset, a.epoch_entries()) == (5, [(1, 1)])
    a.append_as_follower(b.read(a.log_end_offset, 10_000))
    assert a.epoch_entries() == b.epoch_entries() == [(1, 1), (2, 5)]
    assert a.log_end_offset == b.log_end_offset == 8
    assert read_all(a) == read_all(b)
    assert [h.partition_leader_epoch for h, _ in codec.split_batches(read_all(a))] == [1] * 4 + [2] * 3
    # The checkpoint survives a reopen.
    a.close()
    b.close()
    a = open_log(tmp_path / "A")
    assert a.epoch_entries() == [(1, 1), (2, 5)]
    assert (tmp_path / "A" / "leader-epoch-checkpoint").exists()
    a.close()


def test_end_offset_for_epoch_with_gaps(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.end_offset_for_epoch(0) == (-1, -1)  # empty cache
    for epoch in (2, 2, 5, 9):
        log.append_as_leader(values_batch(2, 5), leader_epoch=epoch)
    assert log.epoch_entries() == [(2, 0), (5, 4), (9, 6)]
    assert [log.end_offset_for_epoch(e) for e in range(11)] == [
        (0, 0), (1, 0), (2, 4), (2, 4), (2, 4), (5, 6), (5, 6), (5, 6), (5, 6), (9, 8), (-1, -1)]
    log.assign_epoch_start_offset(12, 8)
    log.assign_epoch_start_offset(11, 8)  # not larger: ignored
    assert log.epoch_entries()[-1] == (12, 8) and log.latest_epoch() == 12
    log.close()


# ---------------------------------------------------------------- flush policy
def test_flush_messages_one_flushes_every_append(tmp_path: Path) -> None:
    log = open_log(tmp_path, flush_messages=1)
    for i in range(5):
        info = log.append_as_leader(values_batch(1 + i, 10), leader_epoch=0)
        assert log.recovery_point == info.log_end_offset
    log.close()


def test_flush_messages_counts_unflushed_records(tmp_path: Path) -> None:
    log = open_log(tmp_path, flush_messages=3)
    log.append_as_leader(values_batch(1, 10), leader_epoch=0)
    log.append_as_leader(values_batch(1, 10), leader_epoch=0)
    assert log.recovery_point == 0
    log.append_as_leader(values_batch(1, 10), leader_epoch=0)
    assert log.recovery_point == 3
    log.close()


def test_default_policy_never_flushes_until_asked(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for _ in range(5):
        log.append_as_leader(values_batch(10, 10), leader_epoch=0)
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 50
    log.close()


def test_flush_ms(tmp_path: Path) -> None:
    log = open_log(tmp_path, now_ms=0, flush_ms=1_000)
    log.append_as_leader(values_batch(2, 10), leader_epoch=0, now_ms=100)
    assert not log.maybe_flush(now_ms=500)
    assert log.recovery_point == 0
    assert log.maybe_flush(now_ms=1_500)
    assert log.recovery_point == 2
    log.close()


# ---------------------------------------------------------------- follower appends
def test_append_as_follower_keeps_offsets_and_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    batches = [make_batch([b"a", b"b"], base_offset=0, epoch=3),
               make_batch([b"c"], base_offset=2, epoch=3),
               make_batch([b"d", b"e", b"f"], base_offset=3, epoch=5)]
    info = log.append_as_follower(b"".join(batches), now_ms=0)
    assert (info.first_offset, info.last_offset, info.num_batches, info.num_records) == (0, 5, 3, 6)
    assert log.read(0, 10_000) == b"".join(batches)  # byte for byte
    assert log.epoch_entries() == [(3, 0), (5, 3)]
    log.close()


def test_append_as_follower_accepts_a_gap_after_the_log_end(tmp_path: Path) -> None:
    """A compacted leader log has gaps: Kafka's follower only rejects offsets below its log end."""
    log = open_log(tmp_path)
    log.append_as_follower(make_batch([b"x"] * 6, base_offset=0, epoch=1))
    info = log.append_as_follower(make_batch([b"y"], base_offset=9, epoch=1))
    assert (info.first_offset, log.log_end_offset) == (9, 10)
    assert log.read(7, 10_000)[:8] == (9).to_bytes(8, "big")
    log.close()


@pytest.mark.parametrize("bad", [
    [(5, 1)],  # overlaps the log
    [(6, 2), (7, 1)],  # goes backwards inside the append
])
def test_append_as_follower_rejects_backwards(tmp_path: Path, bad: list[tuple[int, int]]) -> None:
    log = open_log(tmp_path)
    log.append_as_follower(make_batch([b"x"] * 6, base_offset=0, epoch=1))
    log.flush()
    before = snapshot(tmp_path)
    data = b"".join(make_batch([b"y"] * n, base_offset=base, epoch=1) for base, n in bad)
    with pytest.raises(native.InvalidRecordError):
        log.append_as_follower(data)
    assert snapshot(tmp_path) == before
    assert log.log_end_offset == 6
    log.close()


def test_leader_rejects_inconsistent_record_count(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    bad = codec.build_batch(codec.encode_records([(None, b"v", [], 0)] * 3), 3, last_offset_delta=5)
    with pytest.raises(native.InvalidRecordError):
        log.append_as_leader(bad, leader_epoch=0)
    assert log.log_end_offset == 0 and log.size_bytes == 0
    log.close()


# ---------------------------------------------------------------- lifecycle
def test_closed_and_deleted_log(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append_as_leader(values_batch(1, 1), leader_epoch=0)
    log.close()
    for call in (lambda: log.append_as_leader(values_batch(1, 1), leader_epoch=0),
                 lambda: log.read(0, 10), lambda: log.roll(), lambda: log.flush()):
        with pytest.raises(native.LogClosedError):
            call()
    log = open_log(tmp_path / "p")
    assert log.log_end_offset == 1 and log.recovered_bytes_truncated == 0
    log.delete()
    assert not (tmp_path / "p").exists()
    with pytest.raises(native.LogClosedError):
        log.read(0, 10)


def test_append_info_timestamps(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    data = make_batch([b"a", b"b", b"c"], 5_000, ts_step=10) + make_batch([b"d"], 4_000)
    info = log.append_as_leader(data, leader_epoch=0, now_ms=6_000)
    assert (info.max_timestamp, info.offset_of_max_timestamp) == (5_020, 2)
    assert (info.num_batches, info.num_records, info.valid_bytes) == (2, 4, len(data))
    assert log.segments()[0].largest_timestamp == 5_020
    log.close()


def test_log_start_offset_survives_reopen(tmp_path: Path) -> None:
    log, _ = build_three_epoch_log(tmp_path)
    assert log.maybe_increment_log_start_offset(9)
    # Segment 0 now lies wholly below the log start: retention removes it.
    assert log.delete_old_segments(now_ms=0) == 1
    assert segment_bases(log) == [6, 12]
    log.close()
    log = open_log(tmp_path)
    assert (log.log_start_offset, log.log_end_offset) == (9, 18)
    assert log.epoch_entries() == [(1, 9), (2, 12)]
    with pytest.raises(native.OffsetOutOfRangeError):
        log.read(8, 100)
    with pytest.raises(native.OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(19)  # beyond the log end
    log.close()


def test_concurrent_appends_and_reads(tmp_path: Path) -> None:
    """The Log is thread-safe: appends from several threads interleave as whole
    appends, offsets stay contiguous, and readers never see a torn batch."""
    import threading

    log = open_log(tmp_path, segment_bytes=20_000, index_interval_bytes=256)
    errors: list[BaseException] = []
    written: dict[bytes, int] = {}  # value -> first offset

    def writer(tag: int) -> None:
        try:
            for i in range(150):
                value = b"w%d-%d" % (tag, i)
                info = log.append_as_leader(make_batch([value] * (1 + i % 3)), leader_epoch=0)
                written[value] = info.first_offset
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(300):
                leo = log.log_end_offset
                if leo:
                    codec.parse_batches(log.read(leo // 2, 5_000))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(3)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    stored = codec.split_batches(read_all(log))
    assert len(stored) == 450
    offset = 0
    for header, raw in stored:
        assert header.base_offset == offset
        value = codec.records_of(raw)[0][3]
        assert written[value] == offset
        offset = header.next_offset
    assert offset == log.log_end_offset
    log.close()


def test_truncate_inside_the_first_batch_keeps_start_below_end(tmp_path: Path) -> None:
    """log_start_offset <= log_end_offset always: when truncation removes the batch
    that holds the log start, the start comes down with the end."""
    log = open_log(tmp_path)
    log.append_as_leader(values_batch(1, 5), leader_epoch=0)  # offset 0
    log.append_as_leader(values_batch(2, 5), leader_epoch=0)  # offsets 1..2
    assert log.maybe_increment_log_start_offset(2)
    assert log.truncate_to(2)  # inside batch 1..2: the batch goes
    assert log.log_end_offset == 1
    assert log.log_start_offset <= log.log_end_offset
    assert log.read(log.log_end_offset, 100) == b""
    log.close()


def test_offset_for_timestamp_after_log_start_moved_past_a_segment(tmp_path: Path) -> None:
    """The search must not stop in a segment that lies wholly below the log start."""
    log = open_log(tmp_path)
    log.append_as_leader(values_batch(1, 5, timestamp_ms=100), leader_epoch=0, now_ms=100)  # offset 0
    log.roll()
    assert log.maybe_increment_log_start_offset(1)
    log.append_as_leader(values_batch(1, 5, timestamp_ms=200), leader_epoch=0, now_ms=200)  # offset 1
    assert log.offset_for_timestamp(150) == (1, 200)
    assert log.offset_for_timestamp(50) == (1, 200)
    log.close()
