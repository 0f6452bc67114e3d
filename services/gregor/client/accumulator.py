"""The producer's RecordAccumulator: a deque of batches per partition, bounded by buffer.memory.

send() appends a (key, value, headers, timestamp) tuple to the open batch of
its partition and gets a lightweight handle back; the records are encoded once
per batch (gregor.common.records.build_batch_from_deltas) when the sender drains it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Callable, Generator, NamedTuple, Optional, Sequence

from gregor.common import errors
from gregor.common.records import RECORD_OVERHEAD_BYTES, build_batch_from_deltas

TopicPartition = tuple[str, int]
Callback = Callable[[Optional["RecordMetadata"], Optional[BaseException]], Any]


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. offset is -1 for acks=0."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ProducerBatch:
    """Records of one partition sent together; one future for all of them."""

    __slots__ = ("topic", "partition", "records", "size_bytes", "created", "future", "callbacks",
                 "attempts", "retry_at", "sealed", "payload", "log_append_time", "base_timestamp", "max_timestamp")

    def __init__(self, topic: str, partition: int, created: float, base_timestamp: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        # (key, value, headers, timestamp - base_timestamp): ready for the native encoder as they are.
        self.records: list[tuple[Optional[bytes], Optional[bytes], Sequence[tuple[str, bytes]], int]] = []
        self.base_timestamp = base_timestamp  # the first record's timestamp
        self.max_timestamp = base_timestamp
        self.size_bytes = 0
        self.created = created
        # Resolves to the base offset given by the leader (or fails).
        self.future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.callbacks: list[tuple[int, Callback]] = []
        self.attempts = 0
        self.retry_at = 0.0
        self.sealed = False  # drained at least once: no more appends
        self.payload: Optional[bytes] = None  # encoded batch, kept for retries
        self.log_append_time = -1

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    def encode(self, compression: str) -> bytes:
        if self.payload is None:
            self.payload = build_batch_from_deltas(self.records, self.base_timestamp, self.max_timestamp,
                                                   compression)
        return self.payload

    def metadata(self, index: int) -> RecordMetadata:
        base = self.future.result()
        ts = self.log_append_time if self.log_append_time >= 0 else self.base_timestamp + self.records[index][3]
        return RecordMetadata(self.topic, self.partition, base + index if base >= 0 else -1, ts)

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        if self.future.done():
            return
        self.log_append_time = log_append_time
        self.future.set_result(base_offset)
        if self.callbacks:
            topic, partition, records, base_ts = self.topic, self.partition, self.records, self.base_timestamp
            for index, cb in self.callbacks:
                ts = log_append_time if log_append_time >= 0 else base_ts + records[index][3]
                _call(cb, RecordMetadata(topic, partition, base_offset + index if base_offset >= 0 else -1, ts), None)

    def fail(self, exc: BaseException) -> None:
        if self.future.done():
            return
        self.future.set_exception(exc)
        self.future.exception()  # mark retrieved: a caller who never awaits is not an "unhandled" error
        for _, cb in self.callbacks:
            _call(cb, None, exc)


def _call(cb: Callback, md: Optional[RecordMetadata], exc: Optional[BaseException]) -> None:
    try:
        cb(md, exc)
    except Exception:  # a user callback must not break the sender
        import logging

        logging.getLogger(__name__).exception("producer callback raised")


class FutureRecordMetadata:
    """Per-record handle: the batch future plus the record's index (awaitable, no future of its own)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self.batch = batch
        self.index = index

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        future = self.batch.future
        if not future.done():
            # The future belongs to the whole batch: shield it, so a waiter that times out or is
            # cancelled (wait_for(handle, 0.01), task.cancel()) never cancels its siblings' records.
            yield from asyncio.shield(future).__await__()
        return self.batch.metadata(self.index)

    def done(self) -> bool:
        return self.batch.future.done()

    def result(self) -> RecordMetadata:
        """The metadata once done (raises the delivery error, or InvalidStateError if pending)."""
        return self.batch.metadata(self.index)

    def exception(self) -> Optional[BaseException]:
        return self.batch.future.exception()

    def add_done_callback(self, cb: Callback) -> None:
        """cb(metadata, exception) once the record is acknowledged or failed."""
        if self.batch.future.done():
            exc = self.batch.future.exception()
            _call(cb, None if exc else self.result(), exc)
        else:
            self.batch.callbacks.append((self.index, cb))


def record_size(key: Optional[bytes], value: Optional[bytes], headers: Sequence[tuple[str, bytes]]) -> int:
    """Upper estimate of a record's bytes in a batch (the one used for batch.size and buffer.memory)."""
    size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    for hk, hv in headers:
        size += len(hk) + len(hv) + 4
    return size


class _NewBatch:
    """Type of NEW_BATCH."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEW_BATCH"


NEW_BATCH = _NewBatch()  # try_append(abort_on_new_batch=True): the record would open a new batch


class RecordAccumulator:
    """Per-partition batch deques with buffer.memory backpressure (event-loop owned).

    Concurrency: every method runs on the producer's event loop; `wakeup` tells
    the sender task that something became ready.
    """

    def __init__(self, *, batch_size: int, linger_ms: int, buffer_memory: int, max_block_ms: int,
                 delivery_timeout_ms: int, retry_backoff_ms: int, compression: str = "none") -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.buffer_memory = buffer_memory
        self.max_block_s = max_block_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.compression = compression
        self.batches: dict[TopicPartition, collections.deque[ProducerBatch]] = {}
        self.incomplete: set[ProducerBatch] = set()
        self.buffered_bytes = 0
        self.flushes_in_progress = 0
        self.closed = False
        self.wakeup = asyncio.Event()
        self._space_freed = asyncio.Event()

    # ------------------------------------------------------------ append side
    record_size = staticmethod(record_size)

    def needs_new_batch(self, tp: TopicPartition, size: int) -> bool:
        """True when a record of `size` bytes would start a new batch of tp (sticky partitioning moves on)."""
        dq = self.batches.get(tp)
        if not dq:
            return tp in self.batches  # the partition had batches before; a brand-new one does not count
        last = dq[-1]
        return last.sealed or (bool(last.records) and last.size_bytes + size > self.batch_size)

    def try_append(self, topic: str, partition: int, key: Optional[bytes], value: Optional[bytes],
                   headers: Sequence[tuple[str, bytes]], timestamp_ms: int, size: int,
                   abort_on_new_batch: bool = False) -> "FutureRecordMetadata | None | _NewBatch":
        """append() without blocking: None (and nothing appended) when buffer.memory has no room for size.

        With abort_on_new_batch (sticky partitioning), returns NEW_BATCH instead of opening a new
        batch of a partition whose last batch is complete (what needs_new_batch() says), so the
        caller can move to another partition first (Kafka's abortOnNewBatch).
        """
        if self.closed:
            raise errors.GregorError("producer is closed")
        if self.buffered_bytes + size > self.buffer_memory:
            if size > self.buffer_memory:
                raise errors.MessageTooLargeError(  # type: ignore[attr-defined]
                    f"record of {size} bytes is larger than buffer.memory ({self.buffer_memory})")
            return None
        dq = self.batches.get((topic, partition))
        batch = dq[-1] if dq else None
        if batch is None or batch.sealed or (batch.records and batch.size_bytes + size > self.batch_size):
            if abort_on_new_batch and dq is not None:  # a brand-new partition does not count
                return NEW_BATCH
            batch = self._new_batch(topic, partition, dq, batch, timestamp_ms)
        elif timestamp_ms > batch.max_timestamp:
            batch.max_timestamp = timestamp_ms
        records = batch.records
        records.append((key, value, headers, timestamp_ms - batch.base_timestamp))
        batch.size_bytes += size
        self.buffered_bytes += size
        if batch.size_bytes >= self.batch_size or self.linger_s == 0:
            self.wakeup.set()
        return FutureRecordMetadata(batch, len(records) - 1)

    def _new_batch(self, topic: str, partition: int, dq: Optional[collections.deque[ProducerBatch]],
                   last: Optional[ProducerBatch], timestamp_ms: int) -> ProducerBatch:
        if dq is None:
            dq = self.batches[(topic, partition)] = collections.deque()
        if last is not None and not last.sealed:
            self.wakeup.set()  # the previous batch is complete: ready to send
        batch = ProducerBatch(topic, partition, time.monotonic(), timestamp_ms)
        dq.append(batch)
        self.incomplete.add(batch)
        batch.future.add_done_callback(lambda _f, b=batch: self.incomplete.discard(b))
        return batch

    async def append(self, topic: str, partition: int, key: Optional[bytes], value: Optional[bytes],
                     headers: Sequence[tuple[str, bytes]], timestamp_ms: int, size: int) -> tuple[
                         FutureRecordMetadata, bool]:
        """Add a record to its partition's open batch; returns (handle, that batch is now full).

        Blocks up to max.block.ms while buffer.memory is full.
        """
        handle = self.try_append(topic, partition, key, value, headers, timestamp_ms, size)
        while handle is None:
            await self._wait_for_space(size)
            handle = self.try_append(topic, partition, key, value, headers, timestamp_ms, size)
        assert isinstance(handle, FutureRecordMetadata)
        return handle, handle.batch.size_bytes >= self.batch_size

    async def _wait_for_space(self, size: int) -> None:
        # Kafka's BufferPool: block the caller up to max.block.ms until the sender frees memory.
        deadline = time.monotonic() + self.max_block_s
        while self.buffered_bytes + size > self.buffer_memory:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.RequestTimedOutError(  # type: ignore[attr-defined]
                    f"Failed to allocate {size} bytes within the configured max blocking time "
                    f"{int(self.max_block_s * 1000)} ms (buffer.memory={self.buffer_memory} is full)")
            self._space_freed.clear()
            self.wakeup.set()  # make sure the sender is draining
            try:
                await asyncio.wait_for(self._space_freed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def deallocate(self, batch: ProducerBatch) -> None:
        """Give a finished batch's bytes back to buffer.memory."""
        self.buffered_bytes -= batch.size_bytes
        batch.size_bytes = 0
        self._space_freed.set()

    # ------------------------------------------------------------ sender side
    def ready(self, now: float, muted: set[TopicPartition]) -> tuple[list[TopicPartition], float]:
        """Partitions with a sendable head batch, and how long until the next one may become ready.

        A head batch is sendable when full, when another batch queues behind it,
        when linger.ms has passed, when its retry backoff has passed, or while
        flushing / closing (Kafka's RecordAccumulator.ready).
        """
        ready: list[TopicPartition] = []
        next_check = self.linger_s if self.linger_s > 0 else 0.1
        flushing = self.flushes_in_progress > 0 or self.closed or self._space_waiters()
        for tp, dq in self.batches.items():
            if not dq or tp in muted:
                continue
            head = dq[0]
            if head.retry_at > now:
                next_check = min(next_check, head.retry_at - now)
                continue
            if len(dq) > 1 or head.size_bytes >= self.batch_size or flushing or head.sealed:
                ready.append(tp)
                continue
            waited = now - head.created
            if waited >= self.linger_s:
                ready.append(tp)
            else:
                next_check = min(next_check, self.linger_s - waited)
        return ready, max(next_check, 0.0)

    def _space_waiters(self) -> bool:
        # Someone blocked in append(): send everything rather than wait for linger.
        return self.buffered_bytes >= self.buffer_memory * 0.9

    def drain(self, tp: TopicPartition, max_request_size: int) -> list[ProducerBatch]:
        """Head batches of tp for one produce request: at least one, up to max.request.size."""
        dq = self.batches.get(tp)
        out: list[ProducerBatch] = []
        total = 0
        while dq:
            head = dq[0]
            try:
                payload = head.encode(self.compression)
            except Exception as exc:  # a record the encoder rejects fails its batch, never the sender
                dq.popleft()
                head.sealed = True
                self.deallocate(head)
                err = errors.error_for(errors.Code.INVALID_RECORD, f"cannot encode batch: {type(exc).__name__}: {exc}",
                                       topic=tp[0], partition=tp[1])
                err.__cause__ = exc
                head.fail(err)
                continue
            if out and total + len(payload) > max_request_size:
                break
            if not out and len(payload) > max_request_size:
                dq.popleft()
                head.sealed = True
                self.deallocate(head)
                head.fail(errors.MessageTooLargeError(  # type: ignore[attr-defined]
                    f"batch of {len(payload)} bytes is larger than max.request.size ({max_request_size})",
                    topic=tp[0], partition=tp[1]))
                continue
            dq.popleft()
            head.sealed = True
            head.attempts += 1
            total += len(payload)
            out.append(head)
        return out

    def reenqueue(self, batch: ProducerBatch, now: float) -> None:
        """Put a batch that failed retriably back at the head of its deque (order preserved)."""
        batch.retry_at = now + self.retry_backoff_s
        self.batches.setdefault(batch.tp, collections.deque()).appendleft(batch)

    def expire(self, now: float) -> list[ProducerBatch]:
        """Queued batches older than delivery.timeout.ms, removed from the deques."""
        expired: list[ProducerBatch] = []
        for dq in self.batches.values():
            while dq and now - dq[0].created >= self.delivery_timeout_s:
                expired.append(dq.popleft())
        return expired

    def has_undrained(self) -> bool:
        return any(self.batches.values())

    def abort_all(self, exc: BaseException) -> None:
        """Fail every queued batch (sender died or producer force-closed)."""
        for dq in self.batches.values():
            while dq:
                batch = dq.popleft()
                self.deallocate(batch)
                batch.fail(exc)
        for batch in list(self.incomplete):
            batch.fail(exc)
