"""The native v2 codec against the pure-Python reference (tests/reference/codec.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import gregor_native as native
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reference import codec
from tests.unit.native.support import make_batch, snapshot, values_batch

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I16 = st.integers(-(2**15), 2**15 - 1)

maybe_bytes = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=50)), max_size=4)
record = st.tuples(maybe_bytes, maybe_bytes, headers, I64)
records = st.lists(record, min_size=1, max_size=12)


@st.composite
def batch_fields(draw: st.DrawFn) -> dict[str, int]:
    """Every header field build_batch takes, anywhere in its type's range."""
    return {
        "base_offset": draw(I64), "partition_leader_epoch": draw(I32),
        "attributes": draw(I16), "base_timestamp": draw(I64), "max_timestamp": draw(I64),
        "producer_id": draw(I64), "producer_epoch": draw(I16), "base_sequence": draw(I32),
    }


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    recs = draw(records)
    return codec.build_batch(codec.encode_records(recs), len(recs), **draw(batch_fields()))


def header_tuple(h: object) -> tuple[int, ...]:
    names = ("base_offset", "batch_length", "partition_leader_epoch", "magic", "crc",
             "attributes", "last_offset_delta", "base_timestamp", "max_timestamp",
             "producer_id", "producer_epoch", "base_sequence", "records_count")
    return tuple(getattr(h, n) for n in names)


def small_batch() -> bytes:
    return make_batch([b"alpha", b"", b"gamma" * 7], 1_700_000_000_000, key=b"k", ts_step=3)


# ---------------------------------------------------------------- constants and CRC
def test_constants() -> None:
    assert native.BATCH_HEADER_SIZE == native.RECORD_BATCH_OVERHEAD == codec.HEADER_SIZE == 61
    assert native.MAGIC_V2 == 2
    assert (native.COMPRESSION_NONE, native.COMPRESSION_GZIP, native.COMPRESSION_SNAPPY,
            native.COMPRESSION_LZ4, native.COMPRESSION_ZSTD) == (0, 1, 2, 3, 4)
    assert native.COMPRESSION_CODEC_MASK == 0x07
    assert native.TIMESTAMP_TYPE_MASK == 0x08
    assert native.TRANSACTIONAL_FLAG_MASK == 0x10
    assert native.CONTROL_FLAG_MASK == 0x20


@pytest.mark.parametrize(("data", "crc"), [
    (b"123456789", 0xE3069283),  # the CRC catalogue's check value
    (b"", 0),
    (bytes(32), 0x8A9136AA),  # RFC 3720 B.4 vectors
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
])
def test_crc32c_known_vectors(data: bytes, crc: int) -> None:
    assert native.crc32c(data) == crc
    assert codec.crc32c(data) == crc


@given(st.binary(max_size=2000))
def test_crc32c_matches_reference(data: bytes) -> None:
    assert native.crc32c(data) == codec.crc32c(data)


# ---------------------------------------------------------------- records section
@given(records)
def test_encode_records_matches_reference(recs: list) -> None:
    assert native.encode_records(recs) == codec.encode_records(recs)


@given(records)
def test_decode_records_round_trip_both_ways(recs: list) -> None:
    expected = [(i, ts, k, v, list(h)) for i, (k, v, h, ts) in enumerate(recs)]
    assert native.decode_records(codec.encode_records(recs), len(recs)) == expected
    assert codec.decode_records(native.encode_records(recs), len(recs)) == expected


@given(records, st.integers(-3, 3).filter(lambda d: d != 0))
def test_decode_records_wrong_count_is_corrupt(recs: list, delta: int) -> None:
    section = codec.encode_records(recs)
    count = len(recs) + delta
    if count < 0:
        count = len(recs) + 1
    with pytest.raises(native.CorruptRecordError):
        native.decode_records(section, count)


def test_decode_records_every_truncation_is_corrupt() -> None:
    recs = [(b"key", b"value" * 10, [("h1", b"v1"), ("h2", b"")], 5), (None, b"x", [], -7)]
    section = codec.encode_records(recs)
    for cut in range(len(section)):
        with pytest.raises(native.CorruptRecordError):
            native.decode_records(section[:cut], 2)


def test_decode_records_bad_varint_is_corrupt() -> None:
    # A record length made of 11 continuation bytes is not a varint.
    with pytest.raises(native.CorruptRecordError):
        native.decode_records(b"\xff" * 11 + b"\x01", 1)


# ---------------------------------------------------------------- whole batches
@given(records, batch_fields())
def test_build_batch_matches_reference(recs: list, fields: dict[str, int]) -> None:
    section = codec.encode_records(recs)
    ours = native.build_batch(native.encode_records(recs), len(recs), **fields)
    assert ours == codec.build_batch(section, len(recs), **fields)
    [h] = native.parse_batches(ours)
    assert header_tuple(h) == header_tuple(codec.parse_header(ours))
    assert native.decode_records(ours[61:], h.records_count) == codec.decode_records(section, len(recs))


@given(records, batch_fields())
def test_encode_batch_matches_reference(recs: list, fields: dict[str, int]) -> None:
    """The producer's one-pass encoder writes exactly the reference batch (base offset 0, epoch -1)."""
    keep = {k: fields[k] for k in ("attributes", "base_timestamp", "max_timestamp", "producer_id",
                                   "producer_epoch", "base_sequence")}
    ours = native.encode_batch(recs, **keep)
    assert ours == codec.build_batch(codec.encode_records(recs), len(recs), base_offset=0,
                                     partition_leader_epoch=-1, **keep)
    assert native.encode_batch(recs, **keep) == native.build_batch(native.encode_records(recs), len(recs), **keep)


def test_encode_batch_refuses_no_records_and_bad_fields() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        native.encode_batch([])
    for bad, error in ((("not bytes", b"v", [], 0), TypeError), ((None, b"v", []), ValueError)):
        for encode in (native.encode_batch, native.encode_records):  # both refuse it alike
            with pytest.raises(error):
                encode([bad])
    # bytearray keys and values are accepted (copied), as encode_records does.
    assert native.encode_batch([(bytearray(b"k"), bytearray(b"v"), [], 0)]) == native.encode_batch([(b"k", b"v", [], 0)])


@given(records, I64, st.integers(-(2**40), 2**40), st.integers(-1, 14), st.booleans())
def test_decode_rows_matches_decode_records(recs: list, base_ts: int, base_offset: int, skip: int,
                                            log_append: bool) -> None:
    """Rows are (*prefix, offset, timestamp, key, value, headers) at or above min_offset, decoded in place."""
    section = codec.encode_records(recs)
    data = b"junk" + section + b"tail"
    min_offset = base_offset + skip
    rows = native.decode_rows(data, len(recs), start=4, end=4 + len(section), base_offset=base_offset,
                              base_timestamp=base_ts, log_append_time=77 if log_append else None,
                              min_offset=min_offset, prefix=("t", 3))
    assert rows == [("t", 3, base_offset + d, 77 if log_append else base_ts + td, k, v, h)
                    for d, td, k, v, h in native.decode_records(section, len(recs)) if base_offset + d >= min_offset]


def test_decode_rows_bad_input() -> None:
    section = codec.encode_records([(None, b"x", [], 0)] * 2)
    assert native.decode_rows(section, 2) == [(0, 0, None, b"x", []), (1, 1 - 1, None, b"x", [])]
    with pytest.raises(native.CorruptRecordError):
        native.decode_rows(section, 3)
    with pytest.raises(native.CorruptRecordError):
        native.decode_rows(section[:-1], 2)
    with pytest.raises(ValueError, match="outside"):
        native.decode_rows(section, 2, start=1, end=len(section) + 1)


@given(st.binary(max_size=500), st.integers(0, 1000), st.integers(-1, 2000))
def test_build_batch_wraps_any_section(section: bytes, count: int, last_offset_delta: int) -> None:
    """build_batch treats the section as opaque (it may be compressed)."""
    fields = {"last_offset_delta": last_offset_delta, "attributes": native.COMPRESSION_ZSTD}
    ours = native.build_batch(section, count, **fields)
    assert ours == codec.build_batch(section, count, **fields)


def test_build_batch_default_last_offset_delta() -> None:
    batch = native.build_batch(codec.encode_records([(None, b"a", [], 0)] * 5), 5)
    [h] = native.parse_batches(batch)
    assert (h.last_offset_delta, h.records_count, h.magic) == (4, 5, 2)
    assert (h.partition_leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence) == (-1, -1, -1, -1)


def test_header_properties() -> None:
    attributes = native.COMPRESSION_LZ4 | native.TIMESTAMP_TYPE_MASK | native.TRANSACTIONAL_FLAG_MASK
    batch = codec.build_batch(b"opaque", 5, base_offset=100, attributes=attributes, base_sequence=40)
    [h] = native.parse_batches(batch)
    assert h.size_bytes == len(batch) == h.batch_length + 12
    assert (h.last_offset, h.next_offset) == (104, 105)
    assert (h.compression, h.timestamp_type, h.is_transactional, h.is_control) == (3, 1, True, False)
    assert h.last_sequence == 44
    [control] = native.parse_batches(codec.build_batch(b"", 1, attributes=native.CONTROL_FLAG_MASK))
    assert (control.is_control, control.is_transactional, control.timestamp_type) == (True, False, 0)
    assert control.last_sequence == -1  # no sequence


@given(st.lists(batches(), max_size=6))
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_parse_batches_on_concatenations(parts: list[bytes]) -> None:
    data = b"".join(parts)
    ours = native.parse_batches(data)
    assert [header_tuple(h) for h in ours] == [header_tuple(h) for h in codec.parse_batches(data)]
    assert [h.size_bytes for h in ours] == [len(p) for p in parts]


def test_parse_batches_empty() -> None:
    assert native.parse_batches(b"") == []


# ---------------------------------------------------------------- bad input
def test_every_truncation_is_corrupt() -> None:
    first, batch = small_batch(), small_batch()
    for cut in range(1, len(batch)):
        for prefix in (b"", first):
            for verify in (True, False):
                with pytest.raises(native.CorruptRecordError):
                    native.parse_batches(prefix + batch[:cut], verify)


def test_every_bit_flip_in_crc_region_is_corrupt() -> None:
    batch = small_batch()
    flips = 0
    for pos in range(codec.CRC_OFFSET, len(batch)):  # the CRC field and what it covers
        for bit in range(8):
            bad = bytearray(batch)
            bad[pos] ^= 1 << bit
            with pytest.raises(native.CorruptRecordError):
                native.parse_batches(bytes(bad))
            flips += 1
    assert flips == 8 * (len(batch) - codec.CRC_OFFSET)


def test_crc_does_not_cover_offset_and_epoch() -> None:
    batch = codec.with_offset_and_epoch(small_batch(), 123_456_789, 77)
    [h] = native.parse_batches(batch)
    assert (h.base_offset, h.partition_leader_epoch) == (123_456_789, 77)


def test_verify_crc_false_skips_only_the_crc() -> None:
    bad = bytearray(small_batch())
    bad[-1] ^= 0xFF
    [h] = native.parse_batches(bytes(bad), verify_crc=False)
    assert h.size_bytes == len(bad)
    with pytest.raises(native.CorruptRecordError):
        native.parse_batches(bytes(bad))


@pytest.mark.parametrize("magic", [0, 1, 3, 127, 255])
def test_wrong_magic_is_invalid(magic: int) -> None:
    bad = bytearray(small_batch())
    bad[16] = magic  # not covered by the CRC
    with pytest.raises(native.InvalidRecordError):
        native.parse_batches(bytes(bad))
    assert issubclass(native.InvalidRecordError, native.NativeError)
    assert not issubclass(native.InvalidRecordError, native.CorruptRecordError)


@pytest.mark.parametrize("batch_length", [-1, 0, 48, -(2**31)])
def test_length_below_header_is_corrupt(batch_length: int) -> None:
    bad = bytearray(small_batch())
    bad[8:12] = struct.pack(">i", batch_length)
    with pytest.raises(native.CorruptRecordError):
        native.parse_batches(bytes(bad) + bytes(100))


@given(st.binary(max_size=400))
def test_garbage_agrees_with_reference(data: bytes) -> None:
    try:
        expected = codec.parse_batches(data)
    except codec.CodecError:
        with pytest.raises((native.CorruptRecordError, native.InvalidRecordError)):
            native.parse_batches(data)
    else:
        assert [header_tuple(h) for h in native.parse_batches(data)] == [header_tuple(h) for h in expected]


@given(st.binary(min_size=1, max_size=200), st.integers(0, 5))
def test_garbage_records_section_agrees_with_reference(section: bytes, count: int) -> None:
    try:
        expected = codec.decode_records(section, count)
    except codec.CodecError:
        with pytest.raises(native.NativeError):
            native.decode_records(section, count)
    except UnicodeDecodeError:
        # A header key that is not UTF-8: the .pyi leaves the answer open, but it
        # must be an ordinary exception or a value, never a panic.
        try:
            native.decode_records(section, count)
        except (native.NativeError, UnicodeDecodeError):
            pass
    else:
        assert native.decode_records(section, count) == expected


@given(st.binary(min_size=61, max_size=300))
def test_garbage_behind_a_valid_header_is_rejected(tail: bytes) -> None:
    """A plausible header (right length and magic) over garbage still fails the CRC."""
    batch = codec.build_batch(tail, 1)
    bad = batch[:21] + bytes(b ^ 0x5A for b in batch[21:])
    with pytest.raises(native.CorruptRecordError):
        native.parse_batches(bad)


# ---------------------------------------------------------------- bad input never reaches the log
@pytest.fixture
def small_log(tmp_path):  # type: ignore[no-untyped-def]
    log = native.Log(str(tmp_path / "p0"), native.LogConfig(max_message_bytes=2_000), now_ms=0)
    log.append_as_leader(values_batch(3, 100), leader_epoch=1, now_ms=0)
    log.flush()
    yield log
    log.close()


def _corrupt(batch: bytes) -> bytes:
    bad = bytearray(batch)
    bad[-2] ^= 0x01
    return bytes(bad)


def _bad_magic(batch: bytes) -> bytes:
    return batch[:16] + b"\x01" + batch[17:]


BAD_INPUTS = [
    (lambda: _corrupt(values_batch(2, 10)), "CorruptRecordError"),
    (lambda: values_batch(2, 10)[:-5], "CorruptRecordError"),
    (lambda: _bad_magic(values_batch(2, 10)), "InvalidRecordError"),
    # Garbage fails on its length or on its magic, whichever is checked first.
    (lambda: b"\x00garbage" * 20, "CorruptRecordError InvalidRecordError"),
]
# Followers skip the size check (Kafka's appendAsFollower ignores max.message.bytes).
TOO_LARGE = (lambda: values_batch(10, 300), "RecordTooLargeError")  # ~3.1 KB > 2,000


@pytest.mark.parametrize(("make_bad", "error", "leader"),
                         [(*bad, True) for bad in [TOO_LARGE, *BAD_INPUTS]]
                         + [(*bad, False) for bad in BAD_INPUTS])
def test_rejected_append_writes_nothing(small_log, make_bad, error: str, leader: bool) -> None:  # type: ignore[no-untyped-def]
    path = Path(small_log.dir)
    before = snapshot(path)
    state = (small_log.log_end_offset, small_log.size_bytes, small_log.epoch_entries())
    good = values_batch(2, 10, base_offset=small_log.log_end_offset, epoch=1)
    # The bad batch comes after a good one: validation must finish before any write.
    data = good + make_bad()
    with pytest.raises(tuple(getattr(native, e) for e in error.split())):
        if leader:
            small_log.append_as_leader(data, leader_epoch=2, now_ms=1)
        else:
            small_log.append_as_follower(data, now_ms=1)
    assert snapshot(path) == before
    assert (small_log.log_end_offset, small_log.size_bytes, small_log.epoch_entries()) == state
    # The log is still usable.
    info = small_log.append_as_leader(good, leader_epoch=2, now_ms=2)
    assert info.first_offset == state[0]


def test_max_message_bytes_is_inclusive(tmp_path) -> None:  # type: ignore[no-untyped-def]
    batch = values_batch(4, 50)
    log = native.Log(str(tmp_path / "p"), native.LogConfig(max_message_bytes=len(batch)), now_ms=0)
    assert log.append_as_leader(batch, leader_epoch=0, now_ms=0).valid_bytes == len(batch)
    with pytest.raises(native.RecordTooLargeError):
        log.append_as_leader(values_batch(4, 51), leader_epoch=0, now_ms=0)
    log.close()
