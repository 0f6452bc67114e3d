"""Build record batches for tests straight from the native codec (no client SDK involved)."""

from __future__ import annotations

import time

import gregor_native as native


def make_batch(values: list[bytes], key: bytes | None = None, timestamp_ms: int | None = None) -> bytes:
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    section = native.encode_records([(key, v, [], 0) for v in values])
    return native.build_batch(section, len(values), base_timestamp=ts, max_timestamp=ts)


def split_batches(data: bytes) -> list[tuple["native.BatchHeader", bytes]]:
    """(header, whole batch bytes) for every batch in data."""
    out, pos = [], 0
    for h in native.parse_batches(data):
        out.append((h, data[pos:pos + h.size_bytes]))
        pos += h.size_bytes
    return out


def record_values(data: bytes) -> list[bytes]:
    """Every record value in data, in offset order."""
    values: list[bytes] = []
    for h, raw in split_batches(data):
        section = raw[native.BATCH_HEADER_SIZE:]
        values += [r[3] for r in native.decode_records(section, h.records_count)]
    return values
