"""Property test of Log.clean against tests/reference/compaction.py: random appends of a
few keys (tombstones included), rolls, cleanings at advancing times and reopenings; after
every step the native log holds exactly the reference's records at the same offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import gregor_native as native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reference import codec
from tests.reference.compaction import CompactedLogModel

RETENTION_MS = 1_000
T0 = 1_700_000_000_000

keys = st.sampled_from([b"a", b"b", b"c", b"d"])
values = st.one_of(st.none(), st.binary(min_size=1, max_size=20))
batches = st.lists(st.tuples(keys, values), min_size=1, max_size=4)
ops = st.lists(st.one_of(
    st.tuples(st.just("append"), batches),
    st.tuples(st.just("roll"), st.none()),
    st.tuples(st.just("clean"), st.integers(min_value=0, max_value=1_500)),
    st.tuples(st.just("reopen"), st.booleans()),
), min_size=1, max_size=40)


def batch_of(recs: list[tuple[bytes, Optional[bytes]]], ts: int) -> bytes:
    section = b"".join(codec.encode_record(i, k, v, [], i) for i, (k, v) in enumerate(recs))
    return codec.build_batch(section, len(recs), base_timestamp=ts, max_timestamp=ts + len(recs) - 1)


def records_of(log: native.Log) -> list[tuple[int, bytes, Optional[bytes]]]:
    out = []
    at = log.log_start_offset
    while at < log.log_end_offset:
        data = log.read(at, 1 << 20)
        if not data:
            break
        for h, raw in codec.split_batches(data):
            for delta, _ts, key, value, _headers in codec.decode_records(raw[codec.HEADER_SIZE:], h.records_count):
                assert key is not None
                out.append((h.base_offset + delta, key, value))
            at = h.base_offset + h.last_offset_delta + 1
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops)
def test_clean_matches_reference(tmp_path_factory, steps) -> None:  # type: ignore[no-untyped-def]
    path: Path = tmp_path_factory.mktemp("log")
    config = native.LogConfig(segment_bytes=200)
    log = native.Log(str(path), config, T0)
    model = CompactedLogModel(RETENTION_MS)
    now = T0
    try:
        for op, arg in steps:
            if op == "append":
                log.append_as_leader(batch_of(arg, now), 0, now)
                model.append(arg)
            elif op == "roll":
                log.roll(now)
            elif op == "clean":
                now += arg
                leo = log.log_end_offset
                stats = log.clean(now, delete_retention_ms=RETENTION_MS)
                assert log.log_end_offset == leo
                if stats.end_offset >= 0:
                    model.clean(stats.end_offset, now)
                    assert log.cleanable(now).first_dirty_offset == stats.end_offset
            elif op == "reopen":
                if arg:
                    log.close()
                del log
                log = native.Log(str(path), config, now)
            got = records_of(log)
            assert got == model.records
            assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
    finally:
        try:
            log.close()
        except native.LogClosedError:
            pass
