"""ProducerStateManager: per partition log, what each idempotent producer last wrote (seed 003's idempotence).

For every producer id the broker keeps the producer epoch and the metadata of the
last 5 batches (first/last sequence, last offset, timestamp), Kafka's
ProducerStateEntry. A leader append is checked against it batch by batch
(header fields only, `struct.unpack_from` on the 61-byte v2 header, never the
records): a batch equal to one of the last 5 is a duplicate, acknowledged with
its original offsets and not appended again (SN_NEW < SN_OLD + 1); the next
sequence is appended (SN_NEW == SN_OLD + 1); anything past it is a gap,
OUT_OF_ORDER_SEQUENCE_NUMBER (SN_NEW > SN_OLD + 1); an older producer epoch is
INVALID_PRODUCER_EPOCH. Followers apply the same state from replicated batches
without the checks, so a new leader knows every producer.

Transactions (seed 003, §6.8): each entry also holds the first offset of the
producer's ongoing transaction on this partition (Kafka's currentTxnFirstOffset),
set by its first transactional batch and cleared by its COMMIT/ABORT marker. The
oldest of them, together with completed transactions whose marker is not yet
below the high watermark, gives the first unstable offset, from which the
Partition derives the LSO (broker/txn_markers.py). A completed ABORT is handed
back to the caller to index in the segment's `.txnindex`.

The state survives restarts in Kafka's `<offset:020>.snapshot` files beside the
segments (written on segment roll and clean shutdown, CRC-32C protected); on
open the latest snapshot at or below the log end offset is loaded and the state
is rebuilt from there to the log end offset by scanning batch headers.
Concurrency: owned by the broker's event loop, like its Partition; no locks.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Iterable, Iterator, NamedTuple, Optional, Protocol

import gregor_native as native

from gregor.common import errors
from gregor.common.clock import now_ms
from gregor.common.control_records import ABORT, decode_marker

log = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5  # Kafka's ProducerStateEntry.NumBatchesToRetain: max.in.flight for idempotence
PRODUCER_ID_EXPIRATION_MS_DEFAULT = 86400000  # producer.id.expiration.ms (1 day)
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS = 600000  # producer.id.expiration.check.interval.ms (10 min)
INT32_MAX = 2147483647
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_RE = re.compile(r"^(\d{20})\.snapshot$")
SNAPSHOT_VERSION = 2  # 2 adds each producer's ongoing transaction and coordinator epoch; 1 is still read
NO_TXN = -1
SCAN_READ_BYTES = 1 << 20  # rebuild reads the log in pieces of this size (headers only are parsed)

# The v2 batch header (61 bytes): baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
# baseSequence, recordsCount.
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CONTROL_FLAG = 0x20
_TRANSACTIONAL_FLAG = 0x10


class BatchInfo(NamedTuple):
    """The producer fields of one batch header, and its place in the request buffer."""

    position: int
    size_bytes: int
    base_offset: int
    last_offset_delta: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_control: bool = False
    is_transactional: bool = False
    # A control batch's marker type (control_records.ABORT / COMMIT); -1 for data batches.
    control_type: int = -1
    coordinator_epoch: int = -1

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from INT32_MAX to 0."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def parse_batch_infos(data: bytes | memoryview) -> Optional[list[BatchInfo]]:
    """Walk whole v2 batches by their length fields; None if the buffer is not whole batches.

    Only framing is checked here (the native engine validates CRCs, magic and
    sizes and rejects what this lets through); one unpack per batch.
    """
    out: list[BatchInfo] = []
    pos, end = 0, len(data)
    unpack = _HEADER.unpack_from
    while pos < end:
        if end - pos < _HEADER.size:
            return None
        (base_offset, batch_length, _ple, _magic, _crc, attributes, last_delta, _bts, max_ts, pid, epoch,
         base_seq, count) = unpack(data, pos)
        size = batch_length + 12
        if batch_length < _HEADER.size - 12 or pos + size > end:
            return None
        is_control = bool(attributes & _CONTROL_FLAG)
        marker = decode_marker(data, pos, size, count) if is_control else None
        out.append(BatchInfo(pos, size, base_offset, last_delta, max_ts, pid, epoch, base_seq, is_control,
                             bool(attributes & _TRANSACTIONAL_FLAG), marker.control_type if marker else -1,
                             marker.coordinator_epoch if marker else -1))
        pos += size
    return out


@dataclass(frozen=True)
class BatchMetadata:
    """Kafka's BatchMetadata: where one producer batch landed."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return increment_sequence(self.last_seq, -self.offset_delta) if self.offset_delta else self.last_seq

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass
class ProducerStateEntry:
    """One producer id on one partition: its epoch and its last NUM_BATCHES_TO_RETAIN batches."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: collections.deque[BatchMetadata] = field(
        default_factory=lambda: collections.deque(maxlen=NUM_BATCHES_TO_RETAIN))
    last_timestamp: int = -1
    # First offset of the producer's ongoing transaction on this partition (Kafka's currentTxnFirstOffset).
    current_txn_first_offset: int = NO_TXN
    # The newest transaction coordinator epoch whose marker this partition applied (fences stale coordinators).
    coordinator_epoch: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate_batch(self, epoch: int, first_seq: int, last_seq: int) -> Optional[BatchMetadata]:
        """The retained batch with exactly this epoch and sequence range, if any (Kafka's findDuplicateBatch)."""
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None

    def add_batch(self, epoch: int, last_seq: int, last_offset: int, offset_delta: int, timestamp: int) -> None:
        """Record an appended batch; a new epoch forgets the batches of the old one."""
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.batches.clear()
        self.batches.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = max(self.last_timestamp, timestamp)


class CompletedTxn(NamedTuple):
    """A transaction ended by a marker on this partition (Kafka's CompletedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_aborted: bool
    # The first offset still undecided once this one completed (Kafka's lastStableOffset of the index entry).
    last_stable_offset: int


class LogReader(Protocol):
    """What rebuilding needs of a log (gregor_native.Log satisfies it)."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    def read(self, start_offset: int, max_bytes: int, max_offset: Optional[int] = None,
             min_one_batch: bool = True) -> bytes: ...
    def append_aborted_txn(self, producer_id: int, first_offset: int, last_offset: int,
                           last_stable_offset: int) -> bool: ...


class ProducerStateManager:
    """The producer state of one partition log (event-loop owned, like its Partition).

    `map_end_offset` is the offset up to which batches have been applied; it
    equals the log end offset after every append made through the Partition.
    """

    def __init__(self, topic: str, partition: int, log_dir: str,
                 producer_id_expiration_ms: int = PRODUCER_ID_EXPIRATION_MS_DEFAULT) -> None:
        self.topic = topic
        self.partition = partition
        self.log_dir = log_dir
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        # producer id -> first offset of its ongoing transaction; completed ones whose marker may be above the HW.
        self.ongoing_txns: dict[int, int] = {}
        self.unreplicated_txns: list[tuple[int, int]] = []  # (marker offset, first offset)
        self.map_end_offset = 0
        self.last_expiration_check_ms = now_ms()  # the first check comes one interval after opening

    # ------------------------------------------------------------------ the leader's checks
    def _error(self, code: int, message: str) -> errors.GregorError:
        return errors.error_for(code, message, topic=self.topic, partition=self.partition)

    def check_leader_append(self, batches: list[BatchInfo]) -> Optional[BatchMetadata]:
        """Validate a client's batches against the state; the original batch if the request is a duplicate.

        Raises OUT_OF_ORDER_SEQUENCE_NUMBER (gap, or a new epoch not starting at 0),
        INVALID_PRODUCER_EPOCH (an epoch older than the producer's), UNKNOWN_PRODUCER_ID
        (no state for the producer and a first sequence other than 0), and
        INVALID_REQUEST for a duplicate batch that is not alone in its request
        (the idempotent producer retries a batch on its own). Changes nothing.
        """
        pending: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last seq) within this request
        for b in batches:
            if not b.has_producer_id or b.is_control:
                continue
            pid, epoch, first = b.producer_id, b.producer_epoch, b.base_sequence
            entry = self.producers.get(pid)
            if pid in pending:
                cur_epoch, cur_last = pending[pid]
            else:
                cur_epoch = entry.producer_epoch if entry is not None else NO_PRODUCER_EPOCH
                cur_last = entry.last_seq if entry is not None else NO_SEQUENCE
                duplicate = entry.find_duplicate_batch(epoch, first, b.last_sequence) if entry is not None else None
                if duplicate is not None:
                    if len(batches) != 1:
                        raise self._error(errors.Code.INVALID_REQUEST,
                                          f"batch of producer {pid} with sequences {first}..{b.last_sequence} is a "
                                          f"duplicate; a retried idempotent batch must be sent alone")
                    return duplicate
            if not b.is_transactional and pid in self.ongoing_txns:
                raise self._error(errors.Code.INVALID_TXN_STATE,
                                  f"producer {pid} sent a non-transactional batch while its transaction from offset "
                                  f"{self.ongoing_txns[pid]} is open")
            if first < 0:
                raise self._error(errors.Code.INVALID_RECORD,
                                  f"idempotent batch of producer {pid} has no base sequence ({first})")
            if epoch < cur_epoch:
                raise self._error(errors.Code.INVALID_PRODUCER_EPOCH,
                                  f"Epoch of producer {pid} is {epoch}, which is smaller than the last seen "
                                  f"epoch {cur_epoch}")
            if epoch > cur_epoch or cur_last == NO_SEQUENCE:
                if first != 0:
                    if cur_epoch == NO_PRODUCER_EPOCH:
                        raise self._error(errors.Code.UNKNOWN_PRODUCER_ID,
                                          f"This partition has no state for producer {pid}: its first batch must "
                                          f"have sequence 0, got {first}")
                    raise self._error(errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                      f"Invalid sequence number for new epoch of producer {pid}: {epoch} (request "
                                      f"epoch), {first} (seq. number), {cur_epoch} (current producer epoch)")
            elif not in_sequence(cur_last, first):
                raise self._error(errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                  f"Out of order sequence number for producer {pid}: {first} (incoming seq. "
                                  f"number), {cur_last} (current end sequence number)")
            pending[pid] = (epoch, b.last_sequence)
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """WriteTxnMarkers' fencing: a stale coordinator epoch or an older producer epoch writes nothing."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if coordinator_epoch < entry.coordinator_epoch:
            raise self._error(errors.Code.TRANSACTION_COORDINATOR_FENCED,
                              f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}, older "
                              f"than {entry.coordinator_epoch}")
        if producer_epoch < entry.producer_epoch:
            raise self._error(errors.Code.INVALID_PRODUCER_EPOCH,
                              f"marker for producer {producer_id} at epoch {producer_epoch}, older than "
                              f"{entry.producer_epoch}")

    # ------------------------------------------------------------------ applying appends
    def update(self, batches: Iterable[BatchInfo], first_offset: Optional[int] = None) -> list[CompletedTxn]:
        """Apply appended batches: leader appends pass the first assigned offset, replicated ones carry theirs.

        Returns the transactions the batches' markers completed (the caller indexes the aborted ones).
        """
        next_offset = first_offset
        completed: list[CompletedTxn] = []
        for b in batches:
            base = next_offset if next_offset is not None else b.base_offset
            last_offset = base + b.last_offset_delta
            if next_offset is not None:
                next_offset = last_offset + 1
            if b.has_producer_id:
                entry = self.producers.get(b.producer_id)
                if entry is None:
                    entry = self.producers[b.producer_id] = ProducerStateEntry(b.producer_id)
                if not b.is_control:
                    entry.add_batch(b.producer_epoch, b.last_sequence, last_offset, b.last_offset_delta,
                                    b.max_timestamp)
                    if b.is_transactional and entry.current_txn_first_offset == NO_TXN:
                        entry.current_txn_first_offset = base
                        self.ongoing_txns[b.producer_id] = base
                elif b.control_type >= 0:
                    done = self._complete_txn(entry, b, last_offset)
                    if done is not None:
                        completed.append(done)
            self.map_end_offset = max(self.map_end_offset, last_offset + 1)
        return completed

    def _complete_txn(self, entry: ProducerStateEntry, b: BatchInfo, marker_offset: int) -> Optional[CompletedTxn]:
        """A marker ends the producer's ongoing transaction here (if it has one) and moves its epoch on."""
        if b.producer_epoch > entry.producer_epoch:
            entry.producer_epoch = b.producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = max(entry.coordinator_epoch, b.coordinator_epoch)
        entry.last_timestamp = max(entry.last_timestamp, b.max_timestamp)
        first = entry.current_txn_first_offset
        if first == NO_TXN:
            return None
        entry.current_txn_first_offset = NO_TXN
        self.ongoing_txns.pop(entry.producer_id, None)
        self.unreplicated_txns.append((marker_offset, first))
        lso = min(self.ongoing_txns.values(), default=marker_offset + 1)
        return CompletedTxn(entry.producer_id, first, marker_offset, b.control_type == ABORT, min(lso, marker_offset + 1))

    def first_unstable_offset(self, high_watermark: int) -> Optional[int]:
        """Kafka's firstUnstableOffset: the oldest ongoing transaction, or a completed one whose
        marker the high watermark has not passed yet; None when every transaction is decided and replicated."""
        if self.unreplicated_txns:
            self.unreplicated_txns = [t for t in self.unreplicated_txns if t[0] >= high_watermark]
        firsts = [first for _, first in self.unreplicated_txns]
        firsts.extend(self.ongoing_txns.values())
        return min(firsts) if firsts else None

    def update_from_headers(self, headers: Iterable["native.BatchHeader"]) -> list[CompletedTxn]:
        """Apply batches read back from the log (rebuild): their offsets are in the headers.

        Control batches need their marker, which is in the records: scan_batch_infos reads those.
        """
        return self.update(BatchInfo(0, h.size_bytes, h.base_offset, h.last_offset_delta, h.max_timestamp,
                                     h.producer_id, h.producer_epoch, h.base_sequence, h.is_control,
                                     h.is_transactional) for h in headers)

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms (by their last batch timestamp)."""
        self.last_expiration_check_ms = now_ms
        expired = [pid for pid, e in self.producers.items()
                   if now_ms - e.last_timestamp >= self.producer_id_expiration_ms
                   and e.current_txn_first_offset == NO_TXN]  # an open transaction keeps its producer
        for pid in expired:
            del self.producers[pid]
        return expired

    def maybe_remove_expired_producers(self, now_ms: int) -> bool:
        """remove_expired_producers once per producer.id.expiration.check.interval.ms; True if it ran."""
        if now_ms - self.last_expiration_check_ms < PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS:
            return False
        self.remove_expired_producers(now_ms)
        return True

    # ------------------------------------------------------------------ snapshots
    def snapshot_path(self, offset: int) -> str:
        return os.path.join(self.log_dir, f"{offset:020d}{SNAPSHOT_SUFFIX}")

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files in the log dir, ascending."""
        try:
            names = os.listdir(self.log_dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_SNAPSHOT_RE.match, names) if m)

    def take_snapshot(self) -> str:
        """Write `<map_end_offset:020>.snapshot` (temp file, fsync, rename); returns its path."""
        path = self.snapshot_path(self.map_end_offset)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(encode_snapshot(self.producers.values()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def delete_snapshots(self, below: Optional[int] = None, above: Optional[int] = None,
                         keep_latest: bool = False) -> None:
        """Remove snapshots with offset < below or > above (the latest one kept if asked)."""
        offsets = self.snapshot_offsets()
        latest = offsets[-1] if offsets else None
        for off in offsets:
            if keep_latest and off == latest and (above is None or off <= above):
                continue
            if (below is not None and off < below) or (above is not None and off > above):
                try:
                    os.remove(self.snapshot_path(off))
                except FileNotFoundError:
                    pass

    def load(self, lg: LogReader) -> int:
        """Reload the state for the log as it is now: latest usable snapshot, then a header scan to the LEO.

        Snapshots past the log end offset (a truncated log) are deleted; a corrupt
        snapshot is deleted and the next older one tried. Returns the offset the
        scan started from.
        """
        leo, start = lg.log_end_offset, lg.log_start_offset
        self.producers = {}
        self.ongoing_txns = {}
        self.unreplicated_txns = []
        self.delete_snapshots(above=leo)
        begin = start
        for off in reversed(self.snapshot_offsets()):
            path = self.snapshot_path(off)
            try:
                with open(path, "rb") as f:
                    entries = decode_snapshot(f.read())
            except (OSError, ValueError) as exc:
                log.warning("%s-%d: dropping unreadable producer snapshot %s: %s", self.topic, self.partition,
                            path, exc)
                try:
                    os.remove(path)
                except OSError:
                    pass
                continue
            # A snapshot below the log start still holds producers whose batches retention deleted.
            self.producers = {e.producer_id: e for e in entries}
            self.ongoing_txns = {e.producer_id: e.current_txn_first_offset for e in entries
                                 if e.current_txn_first_offset != NO_TXN}
            begin = max(off, start)
            break
        self.map_end_offset = begin
        for infos in scan_batch_infos(lg, begin, leo):
            for txn in self.update(infos):
                if txn.is_aborted:  # recovery re-indexes what the scan passes (already indexed: a no-op)
                    lg.append_aborted_txn(txn.producer_id, txn.first_offset, txn.last_offset,
                                          txn.last_stable_offset)
        self.map_end_offset = leo
        return begin


def scan_batch_infos(lg: LogReader, start: int, end: int) -> Iterator[list[BatchInfo]]:
    """The producer fields of lg's batches from start to end, one read and one header walk per piece
    (markers decoded from their one-record sections)."""
    offset = start
    while offset < end:
        data = lg.read(offset, SCAN_READ_BYTES, None, True)
        if not data:
            return
        infos = parse_batch_infos(data)
        if not infos:
            return
        yield [b for b in infos if b.base_offset + b.last_offset_delta >= offset]
        last = infos[-1]
        offset = last.base_offset + last.last_offset_delta + 1


# Snapshot file: version i16, crc u32 (CRC-32C of everything after it), count i32, then per producer:
# producer id i64, epoch i16, last timestamp i64, batch count i8, [v2: ongoing transaction's first
# offset i64 (-1 none), coordinator epoch i32], and per batch last seq i32, last offset i64, offset
# delta i32, timestamp i64 (oldest first).
_SNAP_HEAD = struct.Struct(">hI")
_SNAP_COUNT = struct.Struct(">i")
_SNAP_ENTRY = struct.Struct(">qhqb")
_SNAP_TXN = struct.Struct(">qi")
_SNAP_BATCH = struct.Struct(">iqiq")


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    items = [e for e in entries if e.batches or e.current_txn_first_offset != NO_TXN or e.coordinator_epoch >= 0]
    body = [_SNAP_COUNT.pack(len(items))]
    for e in sorted(items, key=lambda e: e.producer_id):
        body.append(_SNAP_ENTRY.pack(e.producer_id, e.producer_epoch, e.last_timestamp, len(e.batches)))
        body.append(_SNAP_TXN.pack(e.current_txn_first_offset, e.coordinator_epoch))
        body += [_SNAP_BATCH.pack(b.last_seq, b.last_offset, b.offset_delta, b.timestamp) for b in e.batches]
    payload = b"".join(body)
    return _SNAP_HEAD.pack(SNAPSHOT_VERSION, native.crc32c(payload)) + payload


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Entries of a snapshot file; ValueError if it is truncated, of another version or fails its CRC."""
    try:
        version, crc = _SNAP_HEAD.unpack_from(data, 0)
        if version not in (1, SNAPSHOT_VERSION):
            raise ValueError(f"unknown producer snapshot version {version}")
        payload = data[_SNAP_HEAD.size:]
        if native.crc32c(payload) != crc:
            raise ValueError("producer snapshot CRC mismatch")
        (count,) = _SNAP_COUNT.unpack_from(payload, 0)
        pos = _SNAP_COUNT.size
        out = []
        for _ in range(count):
            pid, epoch, last_ts, n = _SNAP_ENTRY.unpack_from(payload, pos)
            pos += _SNAP_ENTRY.size
            entry = ProducerStateEntry(pid, epoch, last_timestamp=last_ts)
            if version >= 2:
                entry.current_txn_first_offset, entry.coordinator_epoch = _SNAP_TXN.unpack_from(payload, pos)
                pos += _SNAP_TXN.size
            for _ in range(n):
                entry.batches.append(BatchMetadata(*_SNAP_BATCH.unpack_from(payload, pos)))
                pos += _SNAP_BATCH.size
            out.append(entry)
        if pos != len(payload):
            raise ValueError(f"producer snapshot has {len(payload) - pos} trailing bytes")
        return out
    except struct.error as exc:
        raise ValueError(f"truncated producer snapshot: {exc}") from None
