"""Transaction markers: Kafka's control batches (COMMIT/ABORT) and their record layout (seed 003, §6.8).

A control batch has the transactional and control attribute bits, the producer
id and epoch of the transaction it ends, no sequence, and one record whose key
is `version i16 (0) | type i16` (0 ABORT, 1 COMMIT) and whose value is
`version i16 (0) | coordinatorEpoch i32` (Kafka's ControlRecordType and
EndTransactionMarker). Markers are written by the leader on WriteTxnMarkers,
never by producers, and are never returned to applications.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import gregor_native as native

ABORT = 0
COMMIT = 1
CONTROL_TYPE_NAMES = {ABORT: "ABORT", COMMIT: "COMMIT"}
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


class Marker(NamedTuple):
    """What a control batch says: which transaction of which producer ended, and how."""

    control_type: int
    coordinator_epoch: int


def encode_marker_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                        timestamp_ms: int) -> bytes:
    """One control batch holding a COMMIT or ABORT marker (offsets assigned by the leader)."""
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    return native.encode_batch([(key, value, (), 0)], attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG,
                               base_timestamp=timestamp_ms, max_timestamp=timestamp_ms, producer_id=producer_id,
                               producer_epoch=producer_epoch, base_sequence=-1)


def decode_marker(data: bytes | memoryview, position: int, size: int, records_count: int) -> Marker | None:
    """The marker of the control batch at data[position:position+size]; None if it is not a valid marker.

    One native decode of a one-record section: control batches are one per transaction
    and partition, so this is never per data record.
    """
    start = position + native.BATCH_HEADER_SIZE
    try:
        rows = native.decode_records(bytes(data[start:position + size]), records_count)
    except native.NativeError:
        return None
    if not rows:
        return None
    key, value = rows[0][2], rows[0][3]
    if key is None or len(key) < _KEY.size:
        return None
    _version, control_type = _KEY.unpack_from(key, 0)
    epoch = _VALUE.unpack_from(value, 0)[1] if value is not None and len(value) >= _VALUE.size else -1
    if control_type not in CONTROL_TYPE_NAMES:
        return None
    return Marker(control_type, epoch)
