"""Pure-Python Kafka v2 record batch codec: the slow, readable twin of gregor_native's.

Layout (all big-endian), 61 bytes of header then the records:

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8
    | crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64
    | maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32
    | recordsCount int32 | records...

The CRC-32C covers attributes..end, so baseOffset and partitionLeaderEpoch can be
rewritten in place. Nothing here imports the native module or a CRC library, so
the two implementations fail independently.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Optional, Sequence

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
CRC_OFFSET = 17  # baseOffset(8) + batchLength(4) + partitionLeaderEpoch(4) + magic(1)
ATTRIBUTES_OFFSET = 21  # first byte covered by the CRC
LOG_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted in batchLength
MAGIC = 2

Header = tuple[str, bytes]
Record = tuple[Optional[bytes], Optional[bytes], Sequence[Header], int]  # key, value, headers, ts delta
DecodedRecord = tuple[int, int, Optional[bytes], Optional[bytes], list[Header]]


class CodecError(ValueError):
    """The reference rejects the input (the native side must reject it too)."""


# ---------------------------------------------------------------- CRC-32C (Castagnoli)
_CRC32C_POLY_REVERSED = 0x82F63B78


def _make_crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY_REVERSED if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _make_crc_table()


def crc32c(data: bytes) -> int:
    """Table-driven, reflected CRC-32C, init and final xor 0xFFFFFFFF."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


# ---------------------------------------------------------------- zigzag varints
def write_varint(value: int) -> bytes:
    """Zigzag then LEB128, as Kafka's ByteUtils.writeVarlong (covers varint too)."""
    if not -(1 << 63) <= value < (1 << 63):
        raise CodecError(f"varlong out of range: {value}")
    zigzag = (value << 1) ^ (value >> 63)
    zigzag &= (1 << 64) - 1
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, new position); CodecError on a truncated or over-long varint."""
    shift, raw = 0, 0
    while True:
        if pos >= len(data):
            raise CodecError("truncated varint")
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift >= 70:
            raise CodecError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def _write_bytes(value: Optional[bytes]) -> bytes:
    if value is None:
        return write_varint(-1)
    return write_varint(len(value)) + value


def _read_bytes(data: bytes, pos: int, end: int) -> tuple[Optional[bytes], int]:
    length, pos = read_varint(data, pos)
    if length == -1:
        return None, pos
    if length < 0 or pos + length > end:
        raise CodecError(f"bad length {length}")
    return data[pos:pos + length], pos + length


# ---------------------------------------------------------------- records
def encode_record(offset_delta: int, key: Optional[bytes], value: Optional[bytes],
                  headers: Sequence[Header], timestamp_delta: int) -> bytes:
    body = bytearray(b"\x00")  # record attributes, unused
    body += write_varint(timestamp_delta)
    body += write_varint(offset_delta)
    body += _write_bytes(key)
    body += _write_bytes(value)
    body += write_varint(len(headers))
    for name, hvalue in headers:
        body += _write_bytes(name.encode("utf-8"))
        body += _write_bytes(hvalue)
    return write_varint(len(body)) + bytes(body)


def encode_records(records: Sequence[Record]) -> bytes:
    """The records section; offset deltas 0, 1, 2, ... in order."""
    return b"".join(
        encode_record(i, key, value, headers, ts_delta)
        for i, (key, value, headers, ts_delta) in enumerate(records)
    )


def decode_records(section: bytes, count: int) -> list[DecodedRecord]:
    """Exactly `count` records that fill `section`, else CodecError."""
    out: list[DecodedRecord] = []
    pos = 0
    for _ in range(count):
        length, pos = read_varint(section, pos)
        end = pos + length
        if length < 1 or end > len(section):
            raise CodecError(f"bad record length {length}")
        pos += 1  # attributes
        ts_delta, pos = read_varint(section, pos)
        offset_delta, pos = read_varint(section, pos)
        key, pos = _read_bytes(section, pos, end)
        value, pos = _read_bytes(section, pos, end)
        n_headers, pos = read_varint(section, pos)
        if n_headers < 0:
            raise CodecError("negative header count")
        headers = []
        for _ in range(n_headers):
            name, pos = _read_bytes(section, pos, end)
            hvalue, pos = _read_bytes(section, pos, end)
            if name is None or hvalue is None:
                raise CodecError("null header")
            headers.append((name.decode("utf-8"), hvalue))
        if pos != end:
            raise CodecError("record length does not match its fields")
        out.append((offset_delta, ts_delta, key, value, headers))
    if pos != len(section):
        raise CodecError("bytes left after the last record")
    return out


# ---------------------------------------------------------------- batches
@dataclass(frozen=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def pack(self) -> bytes:
        return HEADER.pack(
            self.base_offset, self.batch_length, self.partition_leader_epoch, self.magic,
            self.crc, self.attributes, self.last_offset_delta, self.base_timestamp,
            self.max_timestamp, self.producer_id, self.producer_epoch, self.base_sequence,
            self.records_count,
        )


def build_batch(section: bytes, records_count: int, *, base_offset: int = 0,
                partition_leader_epoch: int = -1, attributes: int = 0,
                last_offset_delta: Optional[int] = None, base_timestamp: int = 0,
                max_timestamp: int = 0, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1) -> bytes:
    """Header + section, with batchLength and the CRC computed here."""
    header = BatchHeader(
        base_offset=base_offset,
        batch_length=HEADER_SIZE - LOG_OVERHEAD + len(section),
        partition_leader_epoch=partition_leader_epoch,
        magic=MAGIC,
        crc=0,
        attributes=attributes,
        last_offset_delta=records_count - 1 if last_offset_delta is None else last_offset_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=records_count,
    )
    unsigned = header.pack() + section
    crc = crc32c(unsigned[ATTRIBUTES_OFFSET:])
    return replace(header, crc=crc).pack() + section


def parse_header(data: bytes, pos: int = 0) -> BatchHeader:
    if len(data) - pos < HEADER_SIZE:
        raise CodecError("truncated header")
    return BatchHeader(*HEADER.unpack_from(data, pos))


def parse_batches(data: bytes, verify_crc: bool = True) -> list[BatchHeader]:
    """Headers of the whole batches that exactly fill data, else CodecError."""
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < LOG_OVERHEAD:
            raise CodecError("truncated batch")
        batch_length = struct.unpack_from(">i", data, pos + 8)[0]
        if batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise CodecError(f"batch length {batch_length} below the header size")
        end = pos + LOG_OVERHEAD + batch_length
        if end > len(data):
            raise CodecError("truncated batch")
        header = parse_header(data, pos)
        if header.magic != MAGIC:
            raise CodecError(f"magic {header.magic}")
        if verify_crc and crc32c(data[pos + ATTRIBUTES_OFFSET:end]) != header.crc:
            raise CodecError("crc mismatch")
        out.append(header)
        pos = end
    return out


def split_batches(data: bytes) -> list[tuple[BatchHeader, bytes]]:
    """(header, raw bytes) of every batch in data."""
    out, pos = [], 0
    for header in parse_batches(data):
        out.append((header, data[pos:pos + header.size_bytes]))
        pos += header.size_bytes
    return out


def with_offset_and_epoch(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """The batch as a leader append stores it: baseOffset and partitionLeaderEpoch
    rewritten, everything else (CRC included) untouched."""
    return struct.pack(">q", base_offset) + batch[8:12] + struct.pack(">i", leader_epoch) + batch[16:]


def records_of(batch: bytes) -> list[DecodedRecord]:
    header = parse_header(batch)
    return decode_records(batch[HEADER_SIZE:header.size_bytes], header.records_count)
