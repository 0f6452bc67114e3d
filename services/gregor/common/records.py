"""Build and read Kafka v2 record batches: the one place that knows the compression codecs.

The producer, the consumer, the CLI and the tools all go through here. Record
encoding, batch framing and the CRC happen in gregor_native; this module only
adds what the native module leaves out: compressing the records section
(cramjam) and walking batches back into records.
"""

from __future__ import annotations

import struct
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import cramjam
import gregor_native as native

from gregor.common.errors import CorruptMessageError, UnsupportedCompressionTypeError  # type: ignore[attr-defined]

# Kafka's codec ids, as they appear in the low three attribute bits.
COMPRESSION_CODECS: dict[str, int] = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
CODEC_NAMES: dict[int, str] = {v: k for k, v in COMPRESSION_CODECS.items()}

CODEC_MASK = 0x07
TIMESTAMP_TYPE_FLAG = 0x08  # set: LogAppendTime, every record has the batch's max timestamp
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
BATCH_HEADER_SIZE = 61

# Per-record bytes beyond key and value in the records section (length, attributes,
# timestamp/offset deltas, key/value lengths, header count as varints): an upper
# estimate used by the producer to size batches without encoding them.
RECORD_OVERHEAD_BYTES = 21

# Java clients (and librdkafka) frame snappy the xerial way; accept it when reading.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"

Header = tuple[str, bytes]
# key, value, headers, timestamp_ms: what a producer hands to build_batch.
OutRecord = tuple[Optional[bytes], Optional[bytes], Sequence[Header], int]


class LogRecord(NamedTuple):
    """One record read back from a batch; `batch` is its native BatchHeader."""

    offset: int
    timestamp: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: list[Header]
    batch: "native.BatchHeader"


def codec_id(name: str) -> int:
    """Kafka's codec id for a compression.type name ('none', 'gzip', ...)."""
    try:
        return COMPRESSION_CODECS[name.lower()]
    except KeyError:
        raise UnsupportedCompressionTypeError(
            f"unknown compression type {name!r}: expected one of {sorted(COMPRESSION_CODECS)}") from None


def codec_name(codec: int) -> str:
    return CODEC_NAMES.get(codec, f"unknown({codec})")


def compress(codec: int, data: bytes) -> bytes:
    """Compress a records section with Kafka's codec `codec`."""
    if codec == 0:
        return data
    if codec == 1:
        return bytes(cramjam.gzip.compress(data))
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:
        return bytes(cramjam.lz4.compress(data))  # frame format, as Kafka's KafkaLZ4BlockOutputStream
    if codec == 4:
        return bytes(cramjam.zstd.compress(data))
    raise UnsupportedCompressionTypeError(f"compression codec {codec} is not supported")


def decompress(codec: int, data: bytes) -> bytes:
    """Inverse of compress; raises CorruptMessageError on undecodable input (whatever the codec library raises)."""
    if codec not in CODEC_NAMES:
        raise UnsupportedCompressionTypeError(f"compression codec {codec} is not supported")
    if codec == 0:
        return data
    try:
        if codec == 1:
            return bytes(cramjam.gzip.decompress(data))
        if codec == 2:
            if data[:8] == _XERIAL_MAGIC:
                return _xerial_decompress(data)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == 3:
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except CorruptMessageError:
        raise
    except Exception as exc:  # cramjam.DecompressionError, struct.error, ValueError, ...
        raise CorruptMessageError(f"cannot decompress {codec_name(codec)} records: {exc}") from exc


def _xerial_decompress(data: bytes) -> bytes:
    # 8 magic + 4 version + 4 compat, then [u32 BE length][raw snappy block]...
    out, pos = [], 16
    while pos < len(data):
        try:
            (n,) = struct.unpack_from(">I", data, pos)
        except struct.error as exc:
            raise CorruptMessageError(f"truncated xerial snappy block header at byte {pos}: {exc}") from None
        if pos + 4 + n > len(data):
            raise CorruptMessageError(f"truncated xerial snappy block at byte {pos}: {n} bytes announced, "
                                      f"{len(data) - pos - 4} present")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos + 4:pos + 4 + n])))
        pos += 4 + n
    return b"".join(out)


def build_batch(
    records: Sequence[OutRecord],
    *,
    compression: str | int = "none",
    base_timestamp: Optional[int] = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
) -> bytes:
    """One v2 batch holding `records` ((key, value, headers, timestamp_ms) tuples).

    Offsets inside the batch are 0..n-1 (the leader rewrites baseOffset); the
    base timestamp is the first record's unless given. A thin wrapper that turns
    the timestamps into deltas for build_batch_from_deltas.
    """
    if not records:
        raise ValueError("a record batch holds at least one record")
    first_ts = records[0][3]
    base = first_ts if base_timestamp is None else base_timestamp
    max_ts = max(r[3] for r in records)
    return build_batch_from_deltas([(k, v, h, ts - base) for k, v, h, ts in records], base, max_ts, compression,
                                   producer_id=producer_id, producer_epoch=producer_epoch,
                                   base_sequence=base_sequence, transactional=transactional)


def build_batch_from_deltas(records: Sequence[OutRecord], base_timestamp: int, max_timestamp: int,
                            compression: str | int = "none", *, producer_id: int = -1, producer_epoch: int = -1,
                            base_sequence: int = -1, transactional: bool = False) -> bytes:
    """The one batch encoder: records whose 4th field is already the delta from base_timestamp.

    The producer's accumulator stores records this way, so a batch is encoded
    without another pass over its records in Python. Native code encodes the
    records and computes the CRC; only the section compression runs here.
    """
    if not records:
        raise ValueError("a record batch holds at least one record")
    codec = codec_id(compression) if isinstance(compression, str) else compression
    attributes = codec | (TRANSACTIONAL_FLAG if transactional else 0)
    if codec == 0:  # one native pass: records straight into the batch, no intermediate section
        return native.encode_batch(records, attributes=attributes, base_timestamp=base_timestamp,
                                   max_timestamp=max_timestamp, producer_id=producer_id,
                                   producer_epoch=producer_epoch, base_sequence=base_sequence)
    return native.build_batch(compress(codec, native.encode_records(records)), len(records), attributes=attributes,
                              base_timestamp=base_timestamp, max_timestamp=max_timestamp, producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=base_sequence)


def batch_headers(data: bytes, verify_crc: bool = True) -> list["native.BatchHeader"]:
    """The header of every batch in data, in order; CorruptMessageError if it is not whole batches."""
    try:
        return native.parse_batches(data, verify_crc)
    except native.NativeError as exc:
        raise CorruptMessageError(f"invalid record batches: {exc}") from None


def split_batches(data: bytes, verify_crc: bool = True) -> list[tuple["native.BatchHeader", memoryview]]:
    """(header, whole batch bytes) for every batch in data; CorruptMessageError if it is not whole batches."""
    headers = batch_headers(data, verify_crc)
    view = memoryview(data)
    out, pos = [], 0
    for h in headers:
        out.append((h, view[pos:pos + h.size_bytes]))
        pos += h.size_bytes
    return out


def batch_records(header: "native.BatchHeader", batch: bytes | memoryview) -> list[
        tuple[int, int, Optional[bytes], Optional[bytes], list[tuple[str, Optional[bytes]]]]]:
    """Decoded (offset_delta, timestamp_delta, key, value, headers) of one whole batch (a header value may be null)."""
    section = bytes(batch[BATCH_HEADER_SIZE:header.size_bytes])
    codec = header.attributes & CODEC_MASK
    try:
        return native.decode_records(decompress(codec, section), header.records_count)
    except native.NativeError as exc:
        raise CorruptMessageError(f"batch at offset {header.base_offset}: {exc}") from None


def batch_rows(header: "native.BatchHeader", data: bytes, start: int, *, min_offset: int = -1,
               prefix: Optional[tuple[Any, ...]] = None) -> list[tuple[Any, ...]]:
    """(*prefix, offset, timestamp, key, value, headers) of the records at or above min_offset of the
    whole batch at data[start:]: one native pass per batch (decompressing first when compressed).

    LogAppendTime batches give every record the batch's max timestamp.
    """
    codec = header.attributes & CODEC_MASK
    log_append_time = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_FLAG else None
    try:
        if codec == 0:  # decoded straight from the fetched buffer: no copy of the section
            return native.decode_rows(data, header.records_count, start=start + BATCH_HEADER_SIZE,
                                      end=start + header.size_bytes, base_offset=header.base_offset,
                                      base_timestamp=header.base_timestamp, log_append_time=log_append_time,
                                      min_offset=min_offset, prefix=prefix)
        section = decompress(codec, bytes(data[start + BATCH_HEADER_SIZE:start + header.size_bytes]))
        return native.decode_rows(section, header.records_count, base_offset=header.base_offset,
                                  base_timestamp=header.base_timestamp, log_append_time=log_append_time,
                                  min_offset=min_offset, prefix=prefix)
    except native.NativeError as exc:
        raise CorruptMessageError(f"batch at offset {header.base_offset}: {exc}") from None


def iter_records(data: bytes, *, min_offset: int = -1, skip_control: bool = True,
                 verify_crc: bool = True) -> Iterator[LogRecord]:
    """Every record in `data` (whole batches) at or above min_offset, in offset order.

    Control batches (transaction markers) are skipped unless skip_control is False.
    """
    return records_of_batches(split_batches(data, verify_crc), min_offset=min_offset, skip_control=skip_control)


# One decoded record of a batch: (offset, timestamp, key, value, headers).
Row = tuple[int, int, Optional[bytes], Optional[bytes], list[Header]]


def decoded_batches(batches: Sequence[tuple["native.BatchHeader", bytes | memoryview]], *,
                    min_offset: int = -1, skip_control: bool = True) -> Iterator[tuple["native.BatchHeader", list[Row]]]:
    """(header, rows at or above min_offset) for each batch: the decoding path of the tools.

    Control batches (transaction markers) are skipped unless skip_control is False;
    LogAppendTime batches give every record the batch's max timestamp.
    One native decode per batch (batch_rows), one tuple per record.
    """
    for header, raw in batches:
        if skip_control and header.attributes & CONTROL_FLAG:
            continue
        if header.base_offset + header.last_offset_delta < min_offset:
            continue  # a fetch from inside a batch returns the whole batch
        yield header, batch_rows(header, raw if isinstance(raw, bytes) else bytes(raw), 0,  # type: ignore[misc]
                                 min_offset=min_offset)


def fetched_rows(data: bytes, headers: Sequence["native.BatchHeader"], *, min_offset: int = -1,
                 skip_control: bool = True, prefix: Optional[tuple[Any, ...]] = None) -> list[tuple[Any, ...]]:
    """The consumer's rows of a fetched buffer whose batch headers are `headers` (batch_headers(data)):
    (*prefix, offset, timestamp, key, value, headers) of every record at or above min_offset, in
    order, control batches skipped unless skip_control is False. Each batch is decoded in place."""
    out: list[tuple[Any, ...]] = []
    pos = 0
    for header in headers:
        start, pos = pos, pos + header.size_bytes
        if skip_control and header.attributes & CONTROL_FLAG:
            continue
        if header.base_offset + header.last_offset_delta < min_offset:
            continue
        out += batch_rows(header, data, start, min_offset=min_offset, prefix=prefix)
    return out


def records_of_batches(batches: Sequence[tuple["native.BatchHeader", bytes | memoryview]], *,
                       min_offset: int = -1, skip_control: bool = True) -> Iterator[LogRecord]:
    """iter_records over batches already split by split_batches."""
    new: Any = tuple.__new__
    for header, rows in decoded_batches(batches, min_offset=min_offset, skip_control=skip_control):
        for row in rows:
            yield new(LogRecord, (*row, header))
