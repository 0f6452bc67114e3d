"""Log.clean through the Python API: batches compressed by the client codecs (cramjam)
are decompressed and recompressed by the engine in a form the clients read back; the
cleaner checkpoint, tombstone expiry, gaps for fetch, and crash leftovers on open."""

from __future__ import annotations

from pathlib import Path

import gregor_native as native
import pytest

from gregor.common import records

T0 = 1_700_000_000_000


def fill(log: native.Log, codec: str, n: int = 60, keys: int = 4) -> None:
    for i in range(n):
        key = f"k{i % keys}".encode()
        value = None if i == n - keys else f"v{i}".encode()  # one tombstone near the end
        log.append_as_leader(records.build_batch([(key, value, [], T0 + i)], compression=codec), 0, T0)
    log.roll(T0)


def consume(log: native.Log) -> list[tuple[int, bytes | None, bytes | None]]:
    out, at = [], log.log_start_offset
    while at < log.log_end_offset:
        data = log.read(at, 1 << 20)
        if not data:
            break
        for rec in records.iter_records(data, min_offset=at):
            out.append((rec[0], rec[2], rec[3]))
        at = records.split_batches(data)[-1][0].next_offset
    return out


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_clean_keeps_latest_per_key_for_every_codec(tmp_path: Path, codec: str) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(segment_bytes=600), T0)
    fill(log, codec)
    before = consume(log)
    info = log.cleanable(T0)
    assert info.first_dirty_offset == 0 and info.dirty_ratio == 1.0
    stats = log.clean(T0, delete_retention_ms=1_000)
    assert stats.end_offset == 60 and stats.records_read == 60 and stats.bytes_written < stats.bytes_read
    after = consume(log)
    latest = {k: (o, v) for o, k, v in before}
    assert after == sorted((o, k, v) for k, (o, v) in latest.items())
    assert log.log_end_offset == 60 and log.cleanable(T0).dirty_bytes == 0
    # Every batch still carries its codec.
    for header, _ in records.split_batches(log.read(0, 1 << 20)):
        assert header.compression == records.codec_id(codec)
    # The tombstone (key k0 at offset 56) stays until delete.retention.ms after the cleaning.
    assert (56, b"k0", None) in after
    log.clean(T0 + 999, delete_retention_ms=1_000)
    assert (56, b"k0", None) in consume(log)
    log.clean(T0 + 1_000, delete_retention_ms=1_000)
    assert [k for _, k, _ in consume(log)] == [b"k1", b"k2", b"k3"]
    log.close()


def test_fetch_at_a_cleaned_offset_returns_the_next_batch(tmp_path: Path) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(segment_bytes=600), T0)
    fill(log, "none")
    log.clean(T0)
    first = records.split_batches(log.read(0, 1 << 20))[0][0]
    assert first.base_offset > 0
    assert log.read_slice(3, 1 << 20).start_offset == first.base_offset
    log.close()


def test_leftover_cleaned_file_is_discarded_on_open(tmp_path: Path) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(segment_bytes=600), T0)
    fill(log, "none")
    before = consume(log)
    log.close()
    (tmp_path / f"{0:020d}.log.cleaned").write_bytes(b"half written")
    log = native.Log(str(tmp_path), native.LogConfig(segment_bytes=600), T0)
    assert consume(log) == before
    assert not list(tmp_path.glob("*.cleaned"))
    log.close()


def test_clean_stops_at_the_upper_bound_and_min_lag(tmp_path: Path) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(segment_bytes=600), T0)
    fill(log, "none")
    assert log.cleanable(T0, upper_bound_offset=0).dirty_bytes == 0
    assert log.clean(T0, upper_bound_offset=0).end_offset == -1
    assert log.clean(T0, min_compaction_lag_ms=10**9).end_offset == -1
    stats = log.clean(T0, upper_bound_offset=30)
    assert 0 < stats.end_offset <= 30
    assert [o for o, _, _ in consume(log) if o >= stats.end_offset] == list(range(stats.end_offset, 60))
    log.close()


def test_compacted_log_refuses_keyless_records(tmp_path: Path) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(compact=True), T0)
    with pytest.raises(native.InvalidRecordError, match="without key"):
        log.append_as_leader(records.build_batch([(b"k", b"v", [], T0), (None, b"v", [], T0)]), 0)
    assert (log.log_end_offset, log.size_bytes) == (0, 0)
    log.append_as_leader(records.build_batch([(b"k", b"v", [], T0)]), 0)
    assert native.LogConfig(compact=True).compact and not native.LogConfig().compact
    log.close()
