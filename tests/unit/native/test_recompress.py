"""native.recompress_batches (broker-side compression.type) against the Python reference.

Input batches are built by gregor.common.records (cramjam codecs); the output is
decoded by cramjam and tests/reference/codec.py, so the Rust codecs are checked
against independent implementations in both directions.
"""

from __future__ import annotations

import gregor_native as native
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gregor.common import records as rec
from gregor.common.config import recompression_target
from tests.reference import codec as ref

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TARGETS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
PRODUCER_FIELDS = ("last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
                   "base_sequence", "records_count")


def sample(n: int = 25) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]:
    return [(None if i % 4 == 0 else b"k%d" % i, None if i % 7 == 6 else b"payload-%d " % i * (i % 5 + 1),
             [("trace", b"t%d" % i)] if i % 2 else [], 1_700_000_000_000 + i) for i in range(n)]


def ref_records(batch: bytes) -> list[tuple[object, ...]]:
    """(offset_delta, ts_delta, key, value, headers) decoded by cramjam + the pure-Python reference."""
    (h,) = ref.parse_batches(batch, verify_crc=True)
    section = rec.decompress(h.attributes & 0x07, batch[ref.HEADER_SIZE:h.size_bytes])
    return [tuple(r) for r in ref.decode_records(section, h.records_count)]


@pytest.mark.parametrize("source", CODECS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_each_pair_keeps_records_and_producer_fields(source: str, target: str) -> None:
    batch = rec.build_batch(sample(), compression=source, producer_id=77, producer_epoch=3, base_sequence=41,
                            transactional=True)
    codec = TARGETS[target]
    out = native.recompress_batches(batch, codec, 1 << 20)
    if rec.codec_id(source) == codec:
        assert out is None  # already in the topic's codec: the bytes are appended as they came
        return
    assert out is not None
    before, after = ref.parse_batches(batch)[0], ref.parse_batches(out)[0]
    assert after.attributes & 0x07 == codec
    assert after.attributes & ~0x07 == before.attributes & ~0x07
    assert [getattr(after, f) for f in PRODUCER_FIELDS] == [getattr(before, f) for f in PRODUCER_FIELDS]
    assert ref_records(out) == ref_records(batch)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.none() | st.binary(max_size=80), st.none() | st.binary(max_size=200)),
                min_size=1, max_size=30),
       st.sampled_from(CODECS), st.sampled_from(list(TARGETS)))
def test_random_batches_round_trip(kvs: list[tuple[bytes | None, bytes | None]], source: str, target: str) -> None:
    batch = rec.build_batch([(k, v, [], 5 + i) for i, (k, v) in enumerate(kvs)], compression=source)
    out = native.recompress_batches(batch, TARGETS[target], 1 << 20)
    assert ref_records(batch if out is None else out) == ref_records(batch)


def test_levels_from_topic_configs_reach_the_codec() -> None:
    batch = rec.build_batch(sample(300), compression="none")
    fast = native.recompress_batches(batch, 4, 1 << 20, level=1)
    best = native.recompress_batches(batch, 4, 1 << 20, level=19)
    assert fast is not None and best is not None and fast != best
    assert ref_records(fast) == ref_records(best) == ref_records(batch)
    assert recompression_target({"compression.type": "zstd", "compression.zstd.level": 19}) == (4, 19)
    assert recompression_target({"compression.type": "gzip", "compression.gzip.level": -1}) == (1, None)
    assert recompression_target({"compression.type": "producer"}) is None


def test_errors_are_typed() -> None:
    good = rec.build_batch(sample(3), compression="gzip")
    h = native.parse_batches(good)[0]
    garbage = native.build_batch(b"not gzip at all", h.records_count, attributes=1)
    with pytest.raises(native.CorruptRecordError):
        native.recompress_batches(garbage, 4, 1 << 20)
    with pytest.raises(native.CorruptRecordError):
        native.recompress_batches(good[:-1], 4, 1 << 20)
    with pytest.raises(native.RecordTooLargeError):
        native.recompress_batches(rec.build_batch(sample(200), compression="zstd"), 0, 2000)
    with pytest.raises(native.InvalidRecordError):  # compacted topic: keyless record inside a compressed batch
        native.recompress_batches(good, 4, 1 << 20, require_keys=True)
