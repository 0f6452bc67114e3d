"""Batch building and reading: every codec round-trips through the native codec and cramjam."""

from __future__ import annotations

import gregor_native as native
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gregor.common import errors, records
from gregor.common.errors import CorruptMessageError, GregorError

CODECS = list(records.COMPRESSION_CODECS)


def test_codec_table_matches_kafka_and_native() -> None:
    assert records.COMPRESSION_CODECS == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    assert records.COMPRESSION_CODECS["zstd"] == native.COMPRESSION_ZSTD
    assert records.codec_name(3) == "lz4"
    with pytest.raises(GregorError, match="UNSUPPORTED_COMPRESSION_TYPE"):
        records.codec_id("brotli")


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_every_codec(codec: str) -> None:
    recs = [(f"k{i}".encode() if i % 3 else None, b"value-%d " % i * 20, [("h", b"%d" % i)] if i % 2 else [],
             1_700_000_000_000 + i) for i in range(200)]
    data = records.build_batch(recs, compression=codec)
    (header,) = native.parse_batches(data)
    assert header.attributes & 0x07 == records.COMPRESSION_CODECS[codec]
    assert header.records_count == 200 and header.base_timestamp == recs[0][3] and header.max_timestamp == recs[-1][3]
    if codec != "none":
        assert len(data) < len(records.build_batch(recs)), "compression should shrink repetitive values"
    out = list(records.iter_records(data))
    assert [(r.key, r.value, r.headers, r.timestamp) for r in out] == [(k, v, list(h), t) for k, v, h, t in recs]
    assert [r.offset for r in out] == list(range(200))


def test_iter_records_skips_control_batches_and_offsets_below_min() -> None:
    a = records.build_batch([(None, b"a", [], 1), (None, b"b", [], 1)])
    control = bytearray(records.build_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], 1)]))
    # Rebuild as a control batch (attributes bit 5), with a valid CRC.
    section = bytes(control[61:])
    control_batch = native.build_batch(section, 1, attributes=records.CONTROL_FLAG, base_offset=2,
                                       base_timestamp=1, max_timestamp=1)
    c = native.build_batch(native.encode_records([(None, b"c", [], 0)]), 1, base_offset=3, base_timestamp=1,
                           max_timestamp=1)
    data = a + control_batch + c
    assert [r.value for r in records.iter_records(data)] == [b"a", b"b", b"c"]
    assert [r.offset for r in records.iter_records(data, min_offset=1)] == [1, 3]
    assert len(list(records.iter_records(data, skip_control=False))) == 4


def test_corrupt_input_raises_corrupt_message() -> None:
    data = bytearray(records.build_batch([(None, b"hello", [], 1)], compression="gzip"))
    data[-3] ^= 0xFF
    with pytest.raises(CorruptMessageError):
        list(records.iter_records(bytes(data)))
    # With the CRC check off, the broken gzip stream is still caught.
    with pytest.raises(CorruptMessageError):
        list(records.iter_records(bytes(data), verify_crc=False))
    with pytest.raises(CorruptMessageError):
        list(records.iter_records(bytes(data[:-10])))


def test_xerial_framed_snappy_is_readable() -> None:
    import cramjam
    section = native.encode_records([(None, b"x" * 100, [], 0)])
    block = bytes(cramjam.snappy.compress_raw(section))
    xerial = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big") + len(block).to_bytes(4, "big") + block
    assert records.decompress(2, xerial) == section


record_st = st.tuples(
    st.none() | st.binary(max_size=64),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=16)), max_size=3),
    st.integers(min_value=0, max_value=2**40),
)


@settings(max_examples=60, deadline=None)
@given(recs=st.lists(record_st, min_size=1, max_size=40), codec=st.sampled_from(CODECS))
def test_round_trip_property(recs: list, codec: str) -> None:
    data = records.build_batch(recs, compression=codec)
    out = list(records.iter_records(data))
    assert [(r.key, r.value, r.headers, r.timestamp) for r in out] == [(k, v, list(h), t) for k, v, h, t in recs]


def test_build_batch_from_deltas_equals_build_batch() -> None:
    recs = [(b"k" if i % 2 else None, b"v%d" % i, [("h", b"x")] if i == 3 else [], 5000 + (i * 7) % 5)
            for i in range(10)]
    deltas = [(k, v, h, ts - 5000) for k, v, h, ts in recs]
    for codec in ("none", "lz4"):
        assert records.build_batch_from_deltas(deltas, 5000, 5004, codec) == records.build_batch(
            recs, compression=codec)
    with pytest.raises(ValueError):
        records.build_batch_from_deltas([], 0, 0)


@pytest.mark.parametrize("data", [
    b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\x00\x00",  # truncated block length
    b"\x82SNAPPY\x00" + b"\x00" * 8 + b"\x00\x00\x00\x09abc",  # block shorter than announced
])
def test_broken_xerial_snappy_is_a_corrupt_message(data: bytes) -> None:
    with pytest.raises(errors.CorruptMessageError):  # type: ignore[attr-defined]
        records.decompress(2, data)


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_any_decompression_failure_is_a_corrupt_message(codec: int) -> None:
    with pytest.raises(errors.CorruptMessageError):  # type: ignore[attr-defined]
        records.decompress(codec, b"\x00\x01garbage that is no compressed stream\xff" * 3)


def test_build_batch_is_a_wrapper_of_build_batch_from_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = records.build_batch_from_deltas

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(records, "build_batch_from_deltas", spy)
    data = records.build_batch([(None, b"a", [], 10), (None, b"b", [], 7)], producer_id=5, transactional=True)
    assert calls and calls[0][1:3] == (10, 10)
    [h] = records.split_batches(data)
    assert h[0].producer_id == 5 and h[0].attributes & records.TRANSACTIONAL_FLAG
    assert [(r.offset, r.timestamp) for r in records.iter_records(data)] == [(0, 10), (1, 7)]


def test_records_has_no_clock_of_its_own() -> None:
    assert not hasattr(records, "now_ms")
