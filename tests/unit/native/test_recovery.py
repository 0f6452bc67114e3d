"""Recovery on open: a writer killed mid-stream, torn and corrupt tails, and
damaged indexes of sealed segments."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gregor_native as native
import pytest

from tests.reference import codec
from tests.unit.native.support import log_files, read_all, values_batch

REPO = Path(__file__).resolve().parents[3]
MARKER = ".clean-shutdown"  # native/src/log.rs CLEAN_SHUTDOWN_FILE


def writer_batch(i: int) -> bytes:
    """Batch i of the killed writer (the parent re-derives it to check content)."""
    return values_batch(1 + i % 7, 50 + (i * 31) % 400, timestamp_ms=1_000 + i, tag=i)


WRITER_CONFIG = dict(segment_bytes=64 * 1024, index_interval_bytes=512)

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    import gregor_native as native
    from tests.unit.native.test_recovery import WRITER_CONFIG, writer_batch

    log = native.Log({dir!r}, native.LogConfig(**WRITER_CONFIG), now_ms=0)
    i = 0
    while True:
        log.append_as_leader(writer_batch(i), leader_epoch=i // 100, now_ms=1_000 + i)
        i += 1
        if i == 50:
            print("appending", flush=True)
""")


def check_against_writer(log: native.Log) -> int:
    """The log holds exactly the writer's batches 0..n-1, offsets contiguous,
    epochs as written; returns n."""
    stored = codec.split_batches(read_all(log))  # the reference parser checks every CRC
    offset = 0
    for i, (header, raw) in enumerate(stored):
        assert raw == codec.with_offset_and_epoch(writer_batch(i), offset, i // 100)
        offset = header.next_offset
    assert log.log_start_offset == 0 and log.log_end_offset == offset
    epochs = [(i // 100, h.base_offset) for i, (h, _) in enumerate(stored) if i % 100 == 0]
    assert log.epoch_entries() == epochs
    return len(stored)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_s", [0.0, 0.15, 0.6])
def test_sigkill_mid_stream(tmp_path: Path, kill_after_s: float) -> None:
    code = WRITER.format(repo=str(REPO), dir=str(tmp_path / "p"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"appending\n"
        time.sleep(kill_after_s)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "p" / MARKER).exists()

    log = native.Log(str(tmp_path / "p"), native.LogConfig(**WRITER_CONFIG), now_ms=0)
    n = check_against_writer(log)
    assert n >= 50
    assert log.recovery_point == log.log_end_offset
    # Appends continue right after the recovered end.
    leo = log.log_end_offset
    info = log.append_as_leader(writer_batch(n), leader_epoch=n // 100)
    assert info.first_offset == leo
    log.close()
    log = native.Log(str(tmp_path / "p"), native.LogConfig(**WRITER_CONFIG), now_ms=0)
    assert check_against_writer(log) == n + 1
    log.close()


# ---------------------------------------------------------------- torn and corrupt tails
CONFIG = dict(segment_bytes=6_000, index_interval_bytes=200)


def build(path: Path, n: int = 40) -> native.Log:
    """At least n batches (epoch i // 10, timestamp 1000 + i) over 3+ segments,
    the active one holding at least 4 batches."""
    log = native.Log(str(path), native.LogConfig(**CONFIG), now_ms=0)
    i = 0
    while i < n or len(codec.parse_batches(Path(log.segments()[-1].log_path).read_bytes())) < 4:
        log.append_as_leader(values_batch(1 + i % 4, 30 + (i * 53) % 250, timestamp_ms=1_000 + i, tag=i),
                             leader_epoch=i // 10, now_ms=1_000 + i)
        i += 1
    assert log.num_segments >= 3
    log.flush()
    return log


def crash_copy(log: native.Log, dest: Path) -> Path:
    """The files as a crash leaves them: the log is still open, so no marker."""
    shutil.copytree(log.dir, dest)
    assert not (dest / MARKER).exists()
    return dest


def active_log_file(path: Path) -> Path:
    return log_files(path, ".log")[-1]


def batches_of(path: Path) -> list[tuple[codec.BatchHeader, bytes]]:
    return codec.split_batches(active_log_file(path).read_bytes())


@pytest.fixture
def source(tmp_path: Path):  # type: ignore[no-untyped-def]
    log = build(tmp_path / "src")
    yield log
    log.close()


def reopen(path: Path) -> native.Log:
    return native.Log(str(path), native.LogConfig(**CONFIG), now_ms=0)


def check_recovered(log: native.Log, original: bytes, keep_until: int) -> None:
    """The log is `original` cut before offset keep_until, and still appendable."""
    kept = b"".join(raw for h, raw in codec.split_batches(original) if h.last_offset < keep_until)
    assert log.log_end_offset == keep_until
    assert read_all(log) == kept
    # The cache describes the kept data; an entry may start right at the new end.
    epochs: list[tuple[int, int]] = []
    for h, _ in codec.split_batches(kept):
        if not epochs or h.partition_leader_epoch > epochs[-1][0]:
            epochs.append((h.partition_leader_epoch, h.base_offset))
    assert [e for e in log.epoch_entries() if e[1] < keep_until] == epochs
    assert all(start <= keep_until for _, start in log.epoch_entries())
    info = log.append_as_leader(values_batch(2, 10), leader_epoch=9)
    assert info.first_offset == keep_until
    assert read_all(log, keep_until) == codec.with_offset_and_epoch(values_batch(2, 10), keep_until, 9)
    log.close()
    log = reopen(Path(log.dir))  # clean this time
    assert log.recovered_bytes_truncated == 0
    assert log.log_end_offset == keep_until + 2
    log.close()


@pytest.mark.parametrize("chop", ["1", "10", "into_header", "header_only_left", "one_byte_left",
                                  "whole_batch", "into_previous"])
def test_torn_tail_is_cut(source: native.Log, tmp_path: Path, chop: str) -> None:
    original = read_all(source)
    path = crash_copy(source, tmp_path / "crash")
    tail = batches_of(path)
    assert len(tail) >= 2
    (last, last_raw), (prev, prev_raw) = tail[-1], tail[-2]
    size = len(last_raw)
    n = {"1": 1, "10": 10, "into_header": size - 30, "header_only_left": size - 61,
         "one_byte_left": size - 1, "whole_batch": size, "into_previous": size + 5}[chop]
    f = active_log_file(path)
    f.write_bytes(f.read_bytes()[:-n])

    log = reopen(path)
    if chop == "whole_batch":  # nothing torn: the file ends on a batch boundary
        assert log.recovered_bytes_truncated == 0
        check_recovered(log, original, last.base_offset)
    elif chop == "into_previous":
        assert log.recovered_bytes_truncated == len(prev_raw) - 5
        check_recovered(log, original, prev.base_offset)
    else:
        assert log.recovered_bytes_truncated == size - n > 0
        check_recovered(log, original, last.base_offset)


@pytest.mark.parametrize("where", ["last_batch_value", "last_batch_crc", "last_batch_attributes",
                                   "middle_batch", "last_batch_length"])
def test_corrupt_batch_in_active_segment_is_cut(source: native.Log, tmp_path: Path, where: str) -> None:
    original = read_all(source)
    path = crash_copy(source, tmp_path / "crash")
    tail = batches_of(path)
    f = active_log_file(path)
    data = bytearray(f.read_bytes())
    victim = len(tail) // 2 if where == "middle_batch" else len(tail) - 1
    start = sum(len(raw) for _, raw in tail[:victim])
    if where == "last_batch_length":
        data[start + 8:start + 12] = (10**6).to_bytes(4, "big")  # runs past the end of the file
    else:
        at = {"last_batch_value": len(tail[victim][1]) - 3, "last_batch_crc": 18,
              "last_batch_attributes": 22, "middle_batch": 70}[where]
        data[start + at] ^= 0x40
    f.write_bytes(bytes(data))

    log = reopen(path)
    assert log.recovered_bytes_truncated == len(data) - start
    check_recovered(log, original, tail[victim][0].base_offset)


def test_recovery_restores_epochs_of_the_tail(tmp_path: Path) -> None:
    """An append's new epoch reaches the checkpoint only with the log's next
    flush, roll or close, so a crash before it leaves batches whose epoch the
    checkpoint does not know. Recovery must re-derive the cache from the
    recovered batches (Kafka's LogSegment.recover assigns epochs as it scans),
    or OffsetForLeaderEpoch answers the wrong end offset for the previous epoch."""
    log = native.Log(str(tmp_path / "src"), native.LogConfig(), now_ms=0)
    log.append_as_leader(values_batch(3, 10), leader_epoch=1)
    log.flush()
    checkpoint_before = (tmp_path / "src" / "leader-epoch-checkpoint").read_bytes()
    log.append_as_leader(values_batch(2, 10), leader_epoch=2)
    # The append did not write the checkpoint (issue 24: no fsync per first append).
    assert (tmp_path / "src" / "leader-epoch-checkpoint").read_bytes() == checkpoint_before
    path = crash_copy(log, tmp_path / "crash")
    log.close()
    assert (path / "leader-epoch-checkpoint").read_bytes() == checkpoint_before

    recovered = reopen(path)
    assert recovered.log_end_offset == 5
    assert recovered.epoch_entries() == [(1, 0), (2, 3)]
    assert recovered.end_offset_for_epoch(1) == (1, 3)
    recovered.close()


def test_torn_tail_under_a_clean_marker_is_never_appended_after(source: native.Log, tmp_path: Path) -> None:
    """With the marker the engine may skip the CRC scan, but once it sees that the
    active segment does not end on a batch boundary it must not write behind the
    torn bytes: that would make every later batch unreadable."""
    original = read_all(source)
    source.close()
    path = tmp_path / "clean"
    shutil.copytree(source.dir, path)
    last = batches_of(path)[-1][0]
    f = active_log_file(path)
    f.write_bytes(f.read_bytes()[:-10])
    log = reopen(path)
    assert log.log_end_offset == last.base_offset
    info = log.append_as_leader(values_batch(1, 5), leader_epoch=9)
    assert info.first_offset == last.base_offset
    data = read_all(log)  # the reference parser checks every CRC on the way
    assert data.startswith(b"".join(r for h, r in codec.split_batches(original) if h.base_offset < last.base_offset))
    log.close()


def test_clean_shutdown_marker_lifecycle(source: native.Log, tmp_path: Path) -> None:
    """close() writes the marker, open() consumes it, so a crash after an open
    is never mistaken for a clean shutdown."""
    source.close()
    path = tmp_path / "clean"
    shutil.copytree(source.dir, path)
    assert (path / MARKER).exists()
    log = reopen(path)
    assert not (path / MARKER).exists()  # removed while the log is open
    assert log.recovered_bytes_truncated == 0
    log.close()
    assert (path / MARKER).exists()


def test_crash_right_after_roll(tmp_path: Path) -> None:
    log = build(tmp_path / "src")
    log.roll()
    path = crash_copy(log, tmp_path / "crash")
    log.close()
    recovered = reopen(path)
    assert recovered.log_end_offset == log_end(path)
    assert recovered.recovered_bytes_truncated == 0
    assert recovered.segments()[-1].size_bytes == 0
    recovered.close()


def log_end(path: Path) -> int:
    return codec.split_batches(log_files(path, ".log")[-2].read_bytes())[-1][0].next_offset


# ---------------------------------------------------------------- damaged indexes
def _garble_random(raw: bytes) -> bytes:
    return random.Random(7).randbytes(len(raw))


def _reverse(entry_size: int):  # type: ignore[no-untyped-def]
    def reverse(raw: bytes) -> bytes:
        entries = [raw[i:i + entry_size] for i in range(0, len(raw), entry_size)]
        return b"".join(reversed(entries))
    return reverse


def _shift_middle_position(raw: bytes) -> bytes:
    """Keys still ascending and every position inside the file, but one entry
    points one byte past its batch: only a check against the .log catches it."""
    entries = bytearray(raw)
    at = 8 * (len(raw) // 16)
    entries[at + 4:at + 8] = (int.from_bytes(raw[at + 4:at + 8], "big") + 1).to_bytes(4, "big")
    return bytes(entries)


DAMAGE = {
    "delete": None,
    "empty": lambda raw: b"",
    "odd_length": lambda raw: raw[:-3],
    "extra_bytes": lambda raw: raw + b"\x01\x02\x03",
    "half": lambda raw: raw[: len(raw) // 2],
    "random": _garble_random,
    "zeros": lambda raw: bytes(len(raw)),
}


INDEX_CASES = [(suffix, damage) for suffix in (".index", ".timeindex") for damage in [*DAMAGE, "reversed"]]
INDEX_CASES.append((".index", "shifted_position"))


@pytest.mark.parametrize(("suffix", "damage"), INDEX_CASES)
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "crash"])
def test_damaged_index_of_sealed_segment(tmp_path: Path, suffix: str, damage: str, clean: bool) -> None:
    log = build(tmp_path / "src", n=60)
    original = read_all(log)
    timestamps = [(h.base_offset, h.max_timestamp) for h, _ in codec.split_batches(original)]
    sealed = log.segments()[:-1]
    assert all(s.offset_index_entries >= 3 and s.time_index_entries >= 3 for s in sealed)
    before = [(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp) for s in log.segments()]
    if clean:
        log.close()
        path = tmp_path / "copy"
        shutil.copytree(log.dir, path)
    else:
        path = crash_copy(log, tmp_path / "copy")
        log.close()
    victim = path / f"{sealed[1].base_offset:020d}{suffix}"
    raw = victim.read_bytes()
    assert len(raw) > 0
    if damage == "delete":
        victim.unlink()
    else:
        transform = {"reversed": _reverse(8 if suffix == ".index" else 12),
                     "shifted_position": _shift_middle_position}.get(damage) or DAMAGE[damage]
        victim.write_bytes(transform(raw))

    log = reopen(path)
    after = [(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp) for s in log.segments()]
    assert after == before
    assert read_all(log) == original
    for header, raw_batch in codec.split_batches(original):
        for offset in (header.base_offset, header.last_offset):
            assert log.read(offset, 1) == raw_batch, offset
    for target in range(990, timestamps[-1][1] + 2):
        want = next(((o, t) for o, t in timestamps if t >= target), None)
        assert log.offset_for_timestamp(target) == want, target
    if damage in ("delete", "odd_length", "extra_bytes", "reversed"):
        rebuilt = log.segments()[1]
        assert (rebuilt.offset_index_entries, rebuilt.time_index_entries) == (
            sealed[1].offset_index_entries, sealed[1].time_index_entries)
    log.close()
