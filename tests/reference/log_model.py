"""Pure-Python model of one partition log: the behaviour gregor_native.Log must match.

Segments are lists of stored batches (bytes after offset assignment). The model
follows Kafka's Log/LogSegment/LeaderEpochFileCache rules as the .pyi states them:

- a segment rolls before a batch when it is non-empty and the batch would take
  it past segment_bytes, or it is older than segment_ms, or the batch's last
  offset is more than 2^31 - 1 above the segment's base; an append that fits in
  one segment is decided as a whole (Kafka's maybeRoll: rolled once before it,
  never split), only one larger than a segment is split batch by batch;
  a roll on an empty active segment replaces it;
- truncate_to(offset) removes whole batches and then the epoch-cache entries at
  or after the new log end (which is <= offset when offset falls inside a batch);
- log_start_offset only moves forward (retention, maybe_increment_log_start_offset)
  except that it never stays above the log end after a truncation;
- retention deletes whole segments, oldest first: first those wholly below
  log_start_offset, then by time those whose largest
  timestamp is older than retention_ms, then while the log minus the oldest
  segment is still >= retention_bytes (Kafka's `diff - segment.size >= 0`);
  the active segment is never deleted unless it is expired by time and
  non-empty, in which case it is rolled first;
- the leader-epoch cache follows seed 002.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Optional

from tests.reference import codec


class ModelError(Exception):
    """The model refuses the operation (the engine must refuse it too)."""


class OutOfRange(ModelError):
    pass


@dataclass
class StoredBatch:
    base_offset: int
    last_offset: int
    max_timestamp: int
    epoch: int
    data: bytes

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass
class Segment:
    base_offset: int
    created_ms: int
    batches: list[StoredBatch] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(b.data) for b in self.batches)

    @property
    def next_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.base_offset

    @property
    def largest_timestamp(self) -> int:
        return max((b.max_timestamp for b in self.batches), default=-1)


class EpochCache:
    """Seed 002's leader-epoch cache: ascending (epoch, start_offset) pairs."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, int]] = []

    def latest_epoch(self) -> Optional[int]:
        return self.entries[-1][0] if self.entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """3.1: a batch whose epoch is above the latest one starts a new entry;
        entries starting at or after it are stale and go (Kafka's assign)."""
        if epoch >= 0 and (not self.entries or epoch > self.entries[-1][0]):
            self.entries = [e for e in self.entries if e[1] < start_offset] + [(epoch, start_offset)]

    def truncate_from_end(self, offset: int) -> None:
        """3.4: truncation to `offset` drops entries starting at or after it."""
        self.entries = [e for e in self.entries if e[1] < offset]

    def truncate_from_start(self, log_start_offset: int) -> None:
        """3.2: entries before the new log start go, but the epoch that still owns
        the first remaining records stays, moved to log_start_offset (Kafka's
        LeaderEpochFileCache.truncateFromStart)."""
        before = [e for e in self.entries if e[1] <= log_start_offset]
        after = [e for e in self.entries if e[1] > log_start_offset]
        self.entries = ([(before[-1][0], log_start_offset)] if before else []) + after

    def clear(self) -> None:
        """3.3: a full truncation empties the cache."""
        self.entries = []

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor."""
        if epoch == -1 or not self.entries or epoch > self.entries[-1][0]:
            return (-1, -1)
        if epoch == self.entries[-1][0]:
            return (epoch, log_end_offset)
        epochs = [e for e, _ in self.entries]
        i = bisect.bisect_right(epochs, epoch)
        higher = self.entries[i]
        if i == 0:  # older than every known epoch: the asked epoch, first start
            return (epoch, higher[1])
        return (self.entries[i - 1][0], higher[1])


class LogModel:
    """The reference log. Not thread-safe; everything lives in memory."""

    def __init__(self, *, segment_bytes: int, segment_ms: int = 604800000,
                 retention_bytes: int = -1, retention_ms: int = -1,
                 max_message_bytes: int = 1048588, now_ms: int = 0) -> None:
        self.segment_bytes = segment_bytes
        self.segment_ms = segment_ms
        self.retention_bytes = retention_bytes
        self.retention_ms = retention_ms
        self.max_message_bytes = max_message_bytes
        self.segments = [Segment(0, now_ms)]
        self.log_start_offset = 0
        self.epochs = EpochCache()

    # ------------------------------------------------------------ views
    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def batches(self) -> list[StoredBatch]:
        return [b for s in self.segments for b in s.batches]

    def all_bytes(self) -> bytes:
        """What a reader sees from the log start on: whole batches, the first one
        possibly starting below log_start_offset."""
        return b"".join(b.data for b in self.batches() if b.last_offset >= self.log_start_offset)

    # ------------------------------------------------------------ appends
    def append_as_leader(self, data: bytes, leader_epoch: int, now_ms: int) -> list[StoredBatch]:
        stored, offset = [], self.log_end_offset
        for header, raw in self._validate(data):
            stored.append(StoredBatch(offset, offset + header.last_offset_delta, header.max_timestamp,
                                      leader_epoch, codec.with_offset_and_epoch(raw, offset, leader_epoch)))
            offset += header.last_offset_delta + 1
        self._append(stored, now_ms)
        return stored

    def append_as_follower(self, data: bytes, now_ms: int) -> list[StoredBatch]:
        stored, expected = [], self.log_end_offset
        for header, raw in self._validate(data):
            if (not stored and header.base_offset != expected) or header.base_offset < expected:
                raise ModelError(f"base offset {header.base_offset}, expected {expected}")
            stored.append(StoredBatch(header.base_offset, header.last_offset, header.max_timestamp,
                                      header.partition_leader_epoch, raw))
            expected = header.next_offset
        self._append(stored, now_ms)
        return stored

    def _validate(self, data: bytes) -> list[tuple[codec.BatchHeader, bytes]]:
        batches = codec.split_batches(data)  # CodecError on anything malformed
        if any(len(raw) > self.max_message_bytes for _, raw in batches):
            raise ModelError("record too large")
        return batches

    def _append(self, stored: list[StoredBatch], now_ms: int) -> None:
        if not stored:
            return
        total = sum(len(b.data) for b in stored)
        first, last = stored[0], stored[-1]
        if total <= self.segment_bytes and last.last_offset - first.base_offset <= 2**31 - 1:
            # Fits one segment: all of it goes into one, rolled first if the active one can't take it.
            active = self.active
            if (active.batches and (active.size + total > self.segment_bytes or now_ms - active.created_ms > self.segment_ms)
                    or last.last_offset - active.base_offset > 2**31 - 1):
                self.roll_at(first.base_offset, now_ms)
            for batch in stored:
                self.active.batches.append(batch)
                self.epochs.assign(batch.epoch, batch.base_offset)
            return
        for batch in stored:
            active = self.active
            if active.batches and (active.size + len(batch.data) > self.segment_bytes
                                   or now_ms - active.created_ms > self.segment_ms):
                self.roll(now_ms)
            if batch.last_offset - self.active.base_offset > 2**31 - 1:
                self.roll_at(batch.base_offset, now_ms)
            self.active.batches.append(batch)
            self.epochs.assign(batch.epoch, batch.base_offset)

    def roll(self, now_ms: int) -> int:
        return self.roll_at(self.log_end_offset, now_ms)

    def roll_at(self, base_offset: int, now_ms: int) -> int:
        """A new active segment at base_offset; an empty active one is replaced."""
        if not self.active.batches:
            self.segments.pop()
        self.segments.append(Segment(base_offset, now_ms))
        return base_offset

    # ------------------------------------------------------------ reads
    def read(self, start_offset: int, max_bytes: int, max_offset: Optional[int] = None,
             min_one_batch: bool = True) -> bytes:
        if not self.log_start_offset <= start_offset <= self.log_end_offset:
            raise OutOfRange(start_offset)
        for segment in self.segments:
            for i, batch in enumerate(segment.batches):
                if batch.last_offset >= start_offset:
                    return self._take(segment.batches[i:], max_bytes, max_offset, min_one_batch)
        return b""

    @staticmethod
    def _take(batches: list[StoredBatch], max_bytes: int, max_offset: Optional[int],
              min_one_batch: bool) -> bytes:
        out = b""
        for batch in batches:
            if max_offset is not None and batch.base_offset >= max_offset:
                break
            if len(out) + len(batch.data) > max_bytes and (out or not min_one_batch):
                break
            out += batch.data
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> Optional[tuple[int, int]]:
        """Batch granularity: every batch here has records with timestamps
        base_timestamp + delta; callers that need record granularity decode."""
        for batch in self.batches():
            if batch.last_offset < self.log_start_offset:
                continue
            for offset_delta, ts_delta, *_ in codec.records_of(batch.data):
                ts = codec.parse_header(batch.data).base_timestamp + ts_delta
                if ts >= timestamp_ms:
                    return (batch.base_offset + offset_delta, ts)
        return None

    # ------------------------------------------------------------ truncation and retention
    def truncate_to(self, offset: int) -> bool:
        if offset >= self.log_end_offset:
            return False
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset, self.active.created_ms)
            return True
        self.segments = [s for s in self.segments if s.base_offset <= offset] or [self.segments[0]]
        active = self.active
        active.batches = [b for b in active.batches if b.last_offset < offset]
        self.epochs.truncate_from_end(self.log_end_offset)
        # Cutting a whole batch can take the end below a log start inside that batch.
        self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
        return True

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        self.segments = [Segment(offset, now_ms)]
        self.log_start_offset = offset
        self.epochs.clear()

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        if offset > self.log_end_offset:
            raise OutOfRange(offset)
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epochs.truncate_from_start(offset)
        return True

    def delete_old_segments(self, now_ms: int) -> int:
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.log_start_offset:
            self.segments.pop(0)  # wholly below the log start
            deleted += 1
        if self.retention_ms >= 0:
            while self.segments[0].batches and now_ms - self.segments[0].largest_timestamp > self.retention_ms:
                if len(self.segments) == 1:
                    self.roll(now_ms)
                self.segments.pop(0)
                deleted += 1
        if self.retention_bytes >= 0:
            diff = self.size_bytes - self.retention_bytes
            while len(self.segments) > 1 and diff - self.segments[0].size >= 0:
                diff -= self.segments.pop(0).size
                deleted += 1
        if deleted:
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            self.epochs.truncate_from_start(self.log_start_offset)
        return deleted

    # ------------------------------------------------------------ leader epochs
    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epochs.end_offset_for_epoch(epoch, self.log_end_offset)
