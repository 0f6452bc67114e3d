"""Helpers shared by the native engine tests: batches built by the reference codec,
directory snapshots, and a leader append that also feeds the reference model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import gregor_native as native

from tests.reference import codec


def make_batch(values: list[bytes], timestamp_ms: int = 1_000, *, key: Optional[bytes] = None,
               base_offset: int = 0, epoch: int = -1, ts_step: int = 0) -> bytes:
    """One uncompressed v2 batch from the reference codec; record i has timestamp
    timestamp_ms + i * ts_step."""
    records = [(key, v, [], i * ts_step) for i, v in enumerate(values)]
    section = codec.encode_records(records)
    max_ts = timestamp_ms + (len(values) - 1) * ts_step
    return codec.build_batch(section, len(values), base_offset=base_offset,
                             partition_leader_epoch=epoch, base_timestamp=timestamp_ms,
                             max_timestamp=max_ts)


def values_batch(n: int, size: int, timestamp_ms: int = 1_000, tag: int = 0, **kw) -> bytes:
    """A batch of n records whose values are `size` bytes, distinct per (tag, i)."""
    return make_batch([_value(tag, i, size) for i in range(n)], timestamp_ms, **kw)


def _value(tag: int, i: int, size: int) -> bytes:
    stem = f"{tag}:{i}:".encode()
    return (stem * (size // len(stem) + 1))[:size]


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under path with its bytes (for "nothing was written" checks)."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            out[str(full.relative_to(path))] = full.read_bytes()
    return out


def log_files(path: Path, suffix: str) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(suffix))


def read_all(log: "native.Log", start: Optional[int] = None) -> bytes:
    """Every byte from start (default log start) to the log end, segment by segment."""
    offset = log.log_start_offset if start is None else start
    out = b""
    while offset < log.log_end_offset:
        chunk = log.read(offset, 1 << 30)
        if not chunk:
            raise AssertionError(f"empty read at {offset} < LEO {log.log_end_offset}")
        out += chunk
        offset = codec.split_batches(chunk)[-1][0].next_offset
    return out


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    """(base_offset, last_offset) of every batch in data (reference parser)."""
    return [(h.base_offset, h.last_offset) for h, _ in codec.split_batches(data)]
