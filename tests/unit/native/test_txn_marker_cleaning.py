"""Transaction markers in compaction (Kafka's rule for delete.retention.ms), through the native
module on real files: a read_committed read returns the same committed records before and after
the cleaner drops the markers, and no `.txnindex` entry outlives its ABORT marker."""

from __future__ import annotations

from pathlib import Path

import gregor_native as native

from gregor.client.txn_filter import committed_rows
from tests.reference import codec
from tests.unit.native.support import read_all

T0 = 1_700_000_000_000
RETENTION = 60_000  # delete.retention.ms for these cleanings
ABORT, COMMIT = 0, 1


def _txn(key: bytes, value: bytes, pid: int, seq: int) -> bytes:
    section = codec.encode_records([(key, value, [], 0)])
    return codec.build_batch(section, 1, attributes=native.TRANSACTIONAL_FLAG_MASK, base_timestamp=T0,
                             max_timestamp=T0, producer_id=pid, producer_epoch=0, base_sequence=seq)


def _marker(pid: int, kind: int) -> bytes:
    key = (0).to_bytes(2, "big") + kind.to_bytes(2, "big")
    section = codec.encode_records([(key, b"\x00\x00\x00\x00\x00\x05", [], 0)])
    flags = native.TRANSACTIONAL_FLAG_MASK | native.CONTROL_FLAG_MASK
    return codec.build_batch(section, 1, attributes=flags, base_timestamp=T0, max_timestamp=T0,
                             producer_id=pid, producer_epoch=0)


def _plain(key: bytes, value: bytes) -> bytes:
    section = codec.encode_records([(key, value, [], 0)])
    return codec.build_batch(section, 1, base_timestamp=T0, max_timestamp=T0)


def _read_committed(log: native.Log) -> tuple[list[tuple[int, bytes, bytes]], int]:
    """(offset, key, value) a read_committed consumer gets from the log start, and the markers read."""
    data = read_all(log)
    headers = native.parse_batches(data)
    aborted = log.aborted_txns(log.log_start_offset, log.log_end_offset)
    rows = committed_rows(data, headers, aborted)
    return [(r[0], r[2], r[3]) for r in rows], sum(1 for h in headers if h.is_control)


def test_read_committed_is_unchanged_when_markers_are_cleaned(tmp_path: Path) -> None:
    log = native.Log(str(tmp_path), native.LogConfig(compact=True), now_ms=T0)
    log.append_as_leader(_plain(b"k", b"committed"), 1, T0)  # 0
    log.append_as_leader(_txn(b"k", b"aborted", 7, 0), 1, T0)  # 1
    log.append_as_leader(_marker(7, ABORT), 1, T0)  # 2
    log.append_aborted_txn(7, 1, 2, 1)
    log.append_as_leader(_txn(b"a", b"old", 8, 0), 1, T0)  # 3
    log.append_as_leader(_marker(8, COMMIT), 1, T0)  # 4
    log.append_as_leader(_txn(b"j", b"later", 7, 1), 1, T0)  # 5: producer 7's next transaction
    log.append_as_leader(_txn(b"a", b"new", 8, 1), 1, T0)  # 6: shadows 3
    log.append_as_leader(_marker(7, COMMIT), 1, T0)  # 7
    log.append_as_leader(_marker(8, COMMIT), 1, T0)  # 8
    log.roll(T0)
    log.append_as_leader(_plain(b"z", b"active"), 1, T0)  # 9, never cleaned
    expected = [(0, b"k", b"committed"), (5, b"j", b"later"), (6, b"a", b"new"), (9, b"z", b"active")]

    log.clean(T0, delete_retention_ms=RETENTION)  # drops the aborted and shadowed data, stamps horizons
    rows, markers = _read_committed(log)
    assert (rows, markers) == (expected, 4), "markers stay until delete.retention.ms has passed"
    assert log.aborted_txns(0, 10) == [(7, 1)]

    log.clean(T0 + RETENTION - 1, delete_retention_ms=RETENTION)
    assert _read_committed(log) == (expected, 4)

    log.clean(T0 + RETENTION, delete_retention_ms=RETENTION)
    rows, markers = _read_committed(log)
    assert markers == 2, "the ABORT at 2 and the COMMIT at 4 (their data gone) are dropped"
    assert log.aborted_txns(0, 10) == [], "no aborted entry without its marker"
    assert rows == expected, "j=later (producer 7, committed) is not read as aborted"
    log.close()
    reopened = native.Log(str(tmp_path), native.LogConfig(compact=True), now_ms=T0)
    assert _read_committed(reopened) == (expected, 2)
