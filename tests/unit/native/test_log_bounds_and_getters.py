"""The native log refuses batches whose records section contradicts its header, never deletes at or
above the high watermark, answers OffsetForLeaderEpoch as Kafka, and reads its offsets without the
log's mutex."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

import gregor_native as native
import pytest

from tests.reference import codec
from tests.unit.native.support import make_batch, snapshot, values_batch


def open_log(path: Path, now_ms: Optional[int] = None, **config: int) -> native.Log:
    return native.Log(str(path), native.LogConfig(**config), now_ms=now_ms)


def segment_bases(log: native.Log) -> list[int]:
    return [s.base_offset for s in log.segments()]


def section(n: int) -> bytes:
    return codec.encode_records([(None, b"v%d" % i, [], 0) for i in range(n)])


# ---------------------------------------------------------------- 1. sections vs headers

@pytest.mark.parametrize("batch, error", [
    # Header says 3 records, the section holds 1.
    (codec.build_batch(section(1), 3), native.InvalidRecordError),
    # Header says 1 record, the section holds 3.
    (codec.build_batch(section(3), 1), native.InvalidRecordError),
    # records_count 0 with last_offset_delta 0.
    (codec.build_batch(b"", 0, last_offset_delta=0), native.InvalidRecordError),
    (codec.build_batch(section(1), 0, last_offset_delta=0), native.InvalidRecordError),
    # A section that does not parse as records.
    (codec.build_batch(b"xyz", 1), native.CorruptRecordError),
    (codec.build_batch(section(2)[:-1], 2), native.CorruptRecordError),
], ids=["3-vs-1", "1-vs-3", "zero-empty", "zero-with-record", "junk", "truncated"])
def test_append_rejects_sections_contradicting_the_header(tmp_path: Path, batch: bytes, error: type) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(make_batch([b"ok"]), leader_epoch=0)
    before = snapshot(tmp_path)
    good = make_batch([b"a", b"b"])
    for data in (batch, good + batch):
        with pytest.raises(error):
            log.append_as_leader(data, leader_epoch=0)
        with pytest.raises(error):
            log.append_as_follower(data)
    assert (log.log_end_offset, snapshot(tmp_path)) == (1, before)
    log.close()


def test_append_rejects_out_of_order_offset_deltas(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    records = [(None, b"a", [], 0), (None, b"b", [], 0)]
    bad = bytearray(codec.encode_records(records))
    # Record layout: length, attributes, timestampDelta, offsetDelta (zigzag 1 -> 2).
    second = 1 + bad[0] // 2  # one-byte zigzag length of the first record
    assert bad[second + 3] == 2
    bad[second + 3] = 4  # offset delta 2 instead of 1
    with pytest.raises(native.InvalidRecordError):
        log.append_as_leader(codec.build_batch(bytes(bad), 2), leader_epoch=0)
    assert log.log_end_offset == 0
    log.close()


def test_compressed_sections_keep_the_count_check_only(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    info = log.append_as_leader(codec.build_batch(b"opaque", 4, attributes=native.COMPRESSION_GZIP), leader_epoch=0)
    assert (info.first_offset, info.last_offset) == (0, 3)
    with pytest.raises(native.InvalidRecordError):
        log.append_as_leader(codec.build_batch(b"opaque", 0, last_offset_delta=0, attributes=1), leader_epoch=0)
    log.close()


# ---------------------------------------------------------------- 2. retention below the HW

def three_segment_log(path: Path, **config: int) -> tuple[native.Log, int]:
    size = len(values_batch(2, 40))
    log = open_log(path, segment_bytes=3 * size, **config)
    for i in range(9):
        ts = 1000 * (i + 1)
        log.append_as_leader(values_batch(2, 40, timestamp_ms=ts, tag=i), leader_epoch=i // 3, now_ms=ts)
    assert segment_bases(log) == [0, 6, 12] and log.log_end_offset == 18
    return log, size


def test_retention_by_time_never_deletes_at_or_above_the_bound(tmp_path: Path) -> None:
    log, _ = three_segment_log(tmp_path, retention_ms=5_000)
    now = 100_000  # everything expired
    assert log.delete_old_segments(now_ms=now, upper_bound_offset=5) == 0  # segment 0 holds offset 5
    assert log.delete_old_segments(now_ms=now, upper_bound_offset=6) == 1
    assert (log.log_start_offset, segment_bases(log)) == (6, [6, 12])
    assert log.delete_old_segments(now_ms=now, upper_bound_offset=11) == 0
    # HW 17 < LEO 18: segment 6 goes, the active segment is not rolled.
    assert log.delete_old_segments(now_ms=now, upper_bound_offset=17) == 1
    assert (log.log_start_offset, log.log_end_offset, segment_bases(log)) == (12, 18, [12])
    # HW == LEO: rolled, then deleted (None is the log end).
    assert log.delete_old_segments(now_ms=now, upper_bound_offset=None) == 1
    assert (log.log_start_offset, log.log_end_offset, segment_bases(log)) == (18, 18, [18])
    log.close()


def test_retention_by_bytes_never_deletes_at_or_above_the_bound(tmp_path: Path) -> None:
    log, size = three_segment_log(tmp_path, retention_ms=-1, retention_bytes=0)
    assert log.delete_old_segments(now_ms=0, upper_bound_offset=0) == 0
    assert log.delete_old_segments(now_ms=0, upper_bound_offset=7) == 1
    assert (log.log_start_offset, log.size_bytes) == (6, 6 * size)
    assert log.delete_old_segments(now_ms=0, upper_bound_offset=10**9) == 1  # capped at the log end
    assert segment_bases(log) == [12]
    log.close()


# ---------------------------------------------------------------- 3. OffsetForLeaderEpoch

def test_end_offset_for_epoch_older_than_every_entry(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for epoch in (3, 3, 5):
        log.append_as_leader(values_batch(2, 5), leader_epoch=epoch)
    assert log.epoch_entries() == [(3, 0), (5, 4)]
    # Kafka: the asked epoch with the start offset of the first higher epoch.
    assert log.end_offset_for_epoch(1) == (1, 0)
    assert log.end_offset_for_epoch(4) == (3, 4)
    assert log.end_offset_for_epoch(5) == (5, 6)
    assert log.end_offset_for_epoch(6) == (-1, -1)
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    log.close()


# ---------------------------------------------------------------- 4. lock-free getters

def test_offset_getters_answer_while_an_append_is_writing(tmp_path: Path) -> None:
    """log_end_offset / log_start_offset / size_bytes do not wait for the log's mutex: read while another
    thread's append is visibly writing the segment file (the file grows, the append has not returned),
    they answer the offsets published before it. A getter behind the mutex could only answer after the
    append, with the new log end offset."""
    batch = values_batch(16, 64 * 1024)
    log = open_log(tmp_path, max_message_bytes=1 << 31, segment_bytes=1 << 31)
    log.append_as_leader(batch, leader_epoch=0)
    log.flush()
    before = (log.log_end_offset, log.log_start_offset, log.size_bytes)
    segment = Path(log.segments()[0].log_path)
    chunk = batch * 256  # 256 MiB of batches in one append: long enough to be seen writing
    conclusive = 0
    for _ in range(3):
        done = threading.Event()
        start_size = segment.stat().st_size
        worker = threading.Thread(target=lambda: (log.append_as_leader(chunk, leader_epoch=0), done.set()))
        worker.start()
        while segment.stat().st_size == start_size and not done.is_set():
            time.sleep(0.0005)
        if not done.is_set():
            read = (log.log_end_offset, log.log_start_offset, log.size_bytes)
            if not done.is_set():  # the append was still running before and after the read
                assert read == before, "a getter waited for the append in progress"
                conclusive += 1
        worker.join()
        before = (log.log_end_offset, log.log_start_offset, log.size_bytes)
        if conclusive:
            break
    assert conclusive, "never caught an append in progress"
    log.close()
    with pytest.raises(native.LogClosedError):
        log.log_end_offset
