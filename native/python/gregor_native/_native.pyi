"""Type stubs for gregor_native._native, the Rust log engine (checked by mypy.stubtest).

This file is the contract between the Rust crate (native/src) and the Python
services. Offsets are i64, timestamps are milliseconds since the epoch (i64),
sizes are bytes. All functions that do disk or socket I/O release the GIL.
"""

from typing import Any, Optional, Sequence, final

# ---------------------------------------------------------------- errors
class NativeError(Exception):
    """Base class of every error raised by the native module."""

class CorruptRecordError(NativeError):
    """A batch failed validation: CRC mismatch, bad length, truncated, bad varint.
    Maps to Kafka's CORRUPT_MESSAGE."""

class InvalidRecordError(NativeError):
    """A batch is well formed but not acceptable: wrong magic (not 2), records_count
    inconsistent with lastOffsetDelta, follower batch offsets going backwards
    (a follower accepts gaps, as a compacted leader log has them).
    Maps to INVALID_RECORD."""

class RecordTooLargeError(NativeError):
    """A batch is larger than max.message.bytes. Maps to MESSAGE_TOO_LARGE."""

class OffsetOutOfRangeError(NativeError):
    """A read asked for an offset below log_start_offset or above log_end_offset.
    Maps to OFFSET_OUT_OF_RANGE."""

class LogClosedError(NativeError):
    """The log was closed (or deleted) and cannot be used any more."""

# ---------------------------------------------------------------- record batches (Kafka v2)
BATCH_HEADER_SIZE: int  # 61
RECORD_BATCH_OVERHEAD: int  # 61, same; kept for Kafka's name
MAGIC_V2: int  # 2

# attribute bits
COMPRESSION_NONE: int  # 0
COMPRESSION_GZIP: int  # 1
COMPRESSION_SNAPPY: int  # 2
COMPRESSION_LZ4: int  # 3
COMPRESSION_ZSTD: int  # 4
COMPRESSION_CODEC_MASK: int  # 0x07
TIMESTAMP_TYPE_MASK: int  # 0x08
TRANSACTIONAL_FLAG_MASK: int  # 0x10
CONTROL_FLAG_MASK: int  # 0x20

def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of data, as Kafka's v2 batch CRC."""

@final
class BatchHeader:
    """The fixed 61-byte header of one v2 record batch (immutable)."""

    base_offset: int
    batch_length: int  # bytes after the batchLength field (size_bytes - 12)
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
    def size_bytes(self) -> int: ...  # whole batch: batch_length + 12
    @property
    def last_offset(self) -> int: ...  # base_offset + last_offset_delta
    @property
    def next_offset(self) -> int: ...  # last_offset + 1
    @property
    def compression(self) -> int: ...  # attributes & 0x07
    @property
    def timestamp_type(self) -> int: ...  # 0 CreateTime, 1 LogAppendTime
    @property
    def is_transactional(self) -> bool: ...
    @property
    def is_control(self) -> bool: ...
    @property
    def last_sequence(self) -> int: ...  # base_sequence + last_offset_delta, -1 if no sequence

def parse_batches(data: bytes, verify_crc: bool = True) -> list[BatchHeader]:
    """Split data into whole v2 batches and return their headers.

    Raises CorruptRecordError on a truncated tail, a length smaller than the
    header or a CRC mismatch (when verify_crc), InvalidRecordError on a magic
    other than 2. Empty input returns []."""

def recompress_batches(
    data: bytes, codec: int, max_message_bytes: int, *, level: Optional[int] = None, require_keys: bool = False
) -> Optional[bytes]:
    """Broker-side recompression (topic compression.type, Kafka's LogValidator).

    Validates data as a leader append does, then rewrites every non-control
    batch whose codec is not `codec` (0 none .. 4 zstd): decompressed, records
    walked, recompressed at `level` (gzip 1..9, zstd; None or -1: the codec's
    default; LZ4 has one level) and rebuilt with the same header fields and a
    new CRC. Returns None when no batch needed it. Raises CorruptRecordError
    (cannot decompress / bad records), InvalidRecordError, RecordTooLargeError
    (an input or rewritten batch above max_message_bytes). GIL released."""

def encode_records(
    records: Sequence[tuple[Optional[bytes], Optional[bytes], Sequence[tuple[str, Optional[bytes]]], int]],
) -> bytes:
    """Encode the records section of a batch (uncompressed).

    Each record is (key, value, headers, timestamp_delta); offset deltas are
    0, 1, 2, ... in order. None key/value is encoded as length -1 (so is a
    None header value, which Kafka's wire format allows)."""

def encode_batch(
    records: Sequence[tuple[Optional[bytes], Optional[bytes], Sequence[tuple[str, Optional[bytes]]], int]],
    *,
    attributes: int = 0,
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """One uncompressed v2 batch straight from its records, in one pass:
    build_batch(encode_records(records), len(records), ...) without the
    intermediate section (base_offset 0, partition_leader_epoch -1,
    last_offset_delta len(records) - 1). Raises ValueError for no records."""

def decode_records(
    section: bytes, count: int
) -> list[tuple[int, int, Optional[bytes], Optional[bytes], list[tuple[str, Optional[bytes]]]]]:
    """Decode an (uncompressed) records section into
    (offset_delta, timestamp_delta, key, value, headers) tuples. A header value
    written as null (length -1, e.g. by a Java client) decodes as None.
    Raises CorruptRecordError if the section does not hold exactly count records."""

def decode_rows(
    data: bytes,
    count: int,
    *,
    start: int = 0,
    end: Optional[int] = None,
    base_offset: int = 0,
    base_timestamp: int = 0,
    log_append_time: Optional[int] = None,
    min_offset: int = -1,
    prefix: Optional[tuple[Any, ...]] = None,
) -> list[tuple[Any, ...]]:
    """The consumer's rows of the uncompressed records section data[start:end]
    (end None: to the end), which holds exactly count records:
    (*prefix, offset, timestamp, key, value, headers) for each record whose
    offset (base_offset + offset delta) is at least min_offset. timestamp is
    log_append_time when given (LogAppendTime batches), else base_timestamp +
    the record's delta; headers is a list of (str, bytes or None).
    Raises CorruptRecordError as decode_records, ValueError for a range
    outside data."""

def decode_columns(
    data: bytes,
    *,
    min_offset: int = -1,
    max_offset: int = 9223372036854775807,
    headers: bool = False,
    verify_crc: bool = True,
) -> dict[str, Any]:
    """Whole fetched v2 batches as Arrow column buffers (little-endian), for
    bulk readers that build pyarrow arrays without per-record Python.

    Covers the records with min_offset <= offset < max_offset; control batches
    are skipped, compressed batches decompressed in Rust, a batch starting at or
    after max_offset ends the scan. Keys: "rows" (int), "next_offset" (the
    offset after the last batch looked at, capped at max_offset), "offset" and
    "timestamp" (packed int64; timestamps in microseconds, LogAppendTime
    batches give every record the batch's max timestamp), "timestamp_type"
    (packed int32: 0 CreateTime, 1 LogAppendTime), "key" and "value" as
    (validity bitmap, int32 offsets of rows + 1, data, null count), and with
    headers=True "header_offsets" (int32 list offsets, rows + 1) into the
    header entries "header_key" / "header_value" (same 4-tuples). Raises
    CorruptRecordError (bad CRC, truncated, undecodable) and
    InvalidRecordError (bad magic, unknown codec). GIL released."""

def build_batch(
    section: bytes,
    records_count: int,
    *,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    attributes: int = 0,
    last_offset_delta: Optional[int] = None,  # default records_count - 1
    base_timestamp: int = 0,
    max_timestamp: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Wrap an (optionally already compressed) records section into a full v2
    batch, computing batchLength and the CRC-32C over attributes..end."""

# ---------------------------------------------------------------- the partition log
@final
class LogConfig:
    """Per-log settings, Kafka's topic config names in snake case. -1 means unlimited
    for retention_*; flush_* default to never (i64::MAX)."""

    segment_bytes: int  # segment.bytes, default 1073741824
    segment_ms: int  # segment.ms, default 604800000 (168 h)
    segment_index_bytes: int  # segment.index.bytes, default 10485760
    index_interval_bytes: int  # index.interval.bytes, default 4096
    retention_bytes: int  # retention.bytes, default -1
    retention_ms: int  # retention.ms, default 604800000
    flush_messages: int  # flush.messages, default 9223372036854775807
    flush_ms: int  # flush.ms, default 9223372036854775807
    max_message_bytes: int  # max.message.bytes, default 1048588
    compact: bool  # cleanup.policy includes compact: leader appends reject keyless records
    def __init__(
        self,
        *,
        segment_bytes: int = 1073741824,
        segment_ms: int = 604800000,
        segment_index_bytes: int = 10485760,
        index_interval_bytes: int = 4096,
        retention_bytes: int = -1,
        retention_ms: int = 604800000,
        flush_messages: int = 9223372036854775807,
        flush_ms: int = 9223372036854775807,
        max_message_bytes: int = 1048588,
        compact: bool = False,
    ) -> None: ...

@final
class AppendInfo:
    """What an append wrote."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    num_batches: int
    num_records: int  # sum of records_count over the batches
    valid_bytes: int
    log_end_offset: int  # after the append

@final
class SegmentInfo:
    base_offset: int
    next_offset: int  # offset after the last batch in the segment
    size_bytes: int
    largest_timestamp: int  # -1 if empty
    created_ms: int  # when the segment was rolled (file mtime after reopen)
    log_path: str
    offset_index_entries: int
    time_index_entries: int

@final
class CleanableInfo:
    """How dirty a log is, for the log cleaner (Kafka's LogToClean)."""

    first_dirty_offset: int  # the cleaner checkpoint (or log_start_offset)
    first_uncleanable_offset: int  # min(active segment base, upper bound, min.compaction.lag.ms limit)
    clean_bytes: int
    dirty_bytes: int
    dirty_ratio: float  # dirty / (clean + dirty), 0.0 when both are 0
    first_dirty_timestamp: int  # of the first dirty batch, -1 if none (max.compaction.lag.ms)
    next_delete_horizon_ms: int  # earliest delete horizon of a kept tombstone, -1 if none

@final
class CleanStats:
    """What one Log.clean did; end_offset is -1 when nothing was cleaned."""

    bytes_read: int
    bytes_written: int
    records_read: int
    records_retained: int
    tombstones_removed: int
    segments_before: int
    segments_after: int
    end_offset: int  # the new cleaner checkpoint

@final
class FileSlice:
    """A byte range of one segment file holding whole batches; keeps the file
    open, so a segment deleted by retention after read_slice stays readable."""

    length: int
    position: int
    start_offset: int  # base offset of the first batch in the slice (-1 if empty)
    def read(self) -> bytes:
        """pread the range straight into a new bytes object (no extra copy)."""
    def send_to(self, fd: int, prefix: bytes = b"", timeout_ms: int = -1) -> int:
        """Write prefix then the range to socket fd with sendfile(2); waits with
        poll(2) on EAGAIN, so non-blocking sockets work, at most timeout_ms per
        wait (negative: no bound), then raises TimeoutError. Releases the GIL.
        Returns the file bytes sent (not counting prefix; less than length only
        if the file shrank)."""

@final
class Log:
    """One partition's log: segments named by base offset in `dir`
    (00000000000000000000.log/.index/.timeindex) plus leader-epoch-checkpoint.
    Thread-safe (an internal mutex); every method releases the GIL around I/O.
    log_start_offset, log_end_offset and size_bytes are read from atomics kept
    in step with every operation, without the mutex: they never wait behind an
    fsync (flush) or an unlink (retention) in progress."""

    def __init__(self, dir: str, config: LogConfig, now_ms: Optional[int] = None) -> None:
        """Open (creating dir if needed) and recover: unless the clean-shutdown
        marker is present, scan the active segment (CRCs included) and cut a torn
        or corrupt tail; with the marker, only check the active segment's tail,
        and recover it the same way if it is damaged. Every offset-index entry
        is checked against the batch it points at, and any missing or damaged
        index of any segment is rebuilt. Leader-epoch entries the checkpoint
        lacks are re-assigned from the recovered batches' partitionLeaderEpoch."""
    @property
    def dir(self) -> str: ...
    @property
    def config(self) -> LogConfig: ...
    def update_config(self, config: LogConfig) -> None: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def recovery_point(self) -> int: ...  # offset below which everything is fsynced
    @property
    def rolled_unflushed(self) -> bool: ...  # a roll sealed segments not yet fsynced (flush_rolled)
    @property
    def size_bytes(self) -> int: ...
    @property
    def num_segments(self) -> int: ...
    @property
    def recovered_bytes_truncated(self) -> int: ...  # bytes cut from the tail on open
    def segments(self) -> list[SegmentInfo]: ...

    def append_as_leader(self, data: bytes, leader_epoch: int, now_ms: Optional[int] = None) -> AppendInfo:
        """Validate every batch (magic, sizes, CRC, max.message.bytes; records_count
        >= 1 with last_offset_delta == records_count - 1; for an uncompressed
        batch the records section must hold exactly records_count records with
        offset deltas 0..records_count-1 ending at the batch end: a mismatch is
        InvalidRecordError, a section that does not parse CorruptRecordError;
        compressed sections are not opened) and only then
        assign offsets from log_end_offset by rewriting baseOffset and
        partitionLeaderEpoch in place (the CRC does not cover them), append,
        index, extend the leader-epoch cache and apply the flush policy.
        On any error nothing is written. An append that fits in one segment goes
        whole into one, rolled first if the active segment cannot take it all
        (Kafka's maybeRoll); only one larger than a segment is split between
        segments."""
    def append_as_follower(self, data: bytes, now_ms: Optional[int] = None) -> AppendInfo:
        """Append batches keeping their offsets and epochs (replication). The first
        base offset must equal log_end_offset (InvalidRecordError otherwise) and
        offsets must increase; extends the epoch cache from partitionLeaderEpoch."""
    def read_slice(
        self, start_offset: int, max_bytes: int, max_offset: Optional[int] = None, min_one_batch: bool = True
    ) -> FileSlice:
        """Whole batches from the batch containing start_offset, up to max_bytes
        (at least one batch when min_one_batch, even if larger). A read bounded
        by max_offset (the high watermark) excludes any batch whose last offset
        is >= max_offset, min_one_batch notwithstanding: consumers only see
        fully committed batches, and the high watermark always lies on a batch
        boundary.
        start_offset == log_end_offset gives an empty slice; outside
        [log_start_offset, log_end_offset] raises OffsetOutOfRangeError. Only the
        segment holding start_offset is read (a slice never spans segments).
        Offsets are never skipped: damaged data on the way to start_offset
        raises CorruptRecordError."""
    def read(
        self, start_offset: int, max_bytes: int, max_offset: Optional[int] = None, min_one_batch: bool = True
    ) -> bytes:
        """read_slice(...).read()."""
    def offset_for_timestamp(self, timestamp_ms: int) -> Optional[tuple[int, int]]:
        """(offset, timestamp) of the first record whose timestamp >= timestamp_ms,
        using the time index then a scan; for a compressed batch the answer is the
        batch's base offset and max timestamp. Batches wholly below
        log_start_offset are never answered. None if no such record."""
    def roll(self, now_ms: Optional[int] = None) -> int:
        """Start a new active segment at log_end_offset; returns its base offset."""
    def truncate_to(self, offset: int) -> bool:
        """Remove everything at or after offset (whole batches; an offset inside a
        batch keeps that batch out too, as Kafka does); clears epoch-cache entries
        at or after the new log_end_offset (not the given offset, which may lie
        past it), and lowers log_start_offset to the new log_end_offset if it was
        above it. offset < log_start_offset is truncate_fully_and_start_at(offset).
        Returns False if offset >= log_end_offset."""
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and start empty at offset; clears the epoch cache."""
    def delete_old_segments(self, now_ms: Optional[int] = None, *, upper_bound_offset: Optional[int] = None) -> int:
        """Retention: delete whole segments wholly below log_start_offset, then
        those whose largest timestamp is older than retention.ms, then oldest
        segments while size exceeds retention.bytes; the active segment is never
        deleted (it is rolled first if it is expired and non-empty).
        Nothing at or above upper_bound_offset (Kafka's min(high watermark,
        log_end_offset); None is log_end_offset) is deleted: a segment goes only
        if the next segment's base offset is <= the bound, and the active
        segment is rolled for expiry only if log_end_offset <= the bound.
        Advances log_start_offset and trims the epoch cache.
        Returns the number of segments deleted."""
    def cleanable(self, now_ms: Optional[int] = None, *, upper_bound_offset: Optional[int] = None,
                  min_compaction_lag_ms: int = 0) -> CleanableInfo:
        """The log cleaner's view: cleaner checkpoint, first uncleanable offset
        (never the active segment, nothing at or above upper_bound_offset, no
        segment with a timestamp newer than now - min_compaction_lag_ms), and
        the dirty ratio of Kafka's min.cleanable.dirty.ratio."""
    def clean(self, now_ms: Optional[int] = None, *, upper_bound_offset: Optional[int] = None,
              delete_retention_ms: int = 86400000, min_compaction_lag_ms: int = 0,
              dedupe_buffer_size: int = 134217728) -> CleanStats:
        """Log compaction: keep the latest record per key below the first
        uncleanable offset (offsets kept, gaps allowed), tombstones until
        delete_retention_ms after their first cleaning, the active segment
        untouched; cleaned segments are swapped in atomically (.cleaned/.swap,
        finished or discarded on open). Holds the log lock only for the
        snapshot and the swap. Raises CorruptRecordError on a damaged segment."""
    def maybe_increment_log_start_offset(self, offset: int) -> bool: ...
    def maybe_flush(self, now_ms: Optional[int] = None) -> bool:
        """Apply flush.ms: fsync if the last flush is older than flush.ms."""
    def flush(self) -> None:
        """fsync everything up to log_end_offset; advances recovery_point."""
    def flush_rolled(self) -> bool:
        """fsync the segments a roll sealed (without blocking appends), then advance recovery_point to the
        active segment's base; False if nothing was due or the log changed below it meanwhile."""
    def close(self) -> None:
        """Flush, write the clean-shutdown marker, release files."""
    def delete(self) -> None:
        """Close and remove the directory with everything in it."""

    # aborted-transaction index (.txnindex per segment, Kafka's TransactionIndex)
    def append_aborted_txn(self, producer_id: int, first_offset: int, last_offset: int,
                           last_stable_offset: int) -> bool:
        """Index an aborted transaction in the segment of its ABORT marker (last_offset, already
        appended); False if it was indexed before. InvalidRecordError if the range is not in the log."""
    def aborted_txns(self, fetch_offset: int, upper_offset: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of aborted transactions overlapping [fetch_offset, upper_offset)."""

    # leader-epoch cache (seed 002), persisted in leader-epoch-checkpoint
    def latest_epoch(self) -> Optional[int]: ...
    def epoch_entries(self) -> list[tuple[int, int]]:  # (epoch, start_offset), ascending
        ...
    def assign_epoch_start_offset(self, epoch: int, start_offset: int) -> None:
        """Add (epoch, start_offset) if epoch is larger than the latest one."""
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch, Kafka's LeaderEpochFileCache.endOffsetFor:
        (epoch, end_offset). epoch -1 (UNDEFINED) gives (-1, -1). For the latest
        epoch the end offset is log_end_offset; otherwise the start offset of
        the smallest epoch greater than the one asked, with the largest known
        epoch <= the one asked, or with the asked epoch itself when it is below
        every entry (its history went with the log start). (-1, -1) when no
        known epoch is greater (or the cache is empty)."""
