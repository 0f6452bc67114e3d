"""The producer's RecordAccumulator: a deque of batches per partition, bounded by buffer.memory.

send() appends a (key, value, headers, timestamp) tuple to the open batch of
its partition and gets a lightweight handle back; the records are encoded once
per batch (gregor.common.records.build_batch_from_deltas) when the sender drains it.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time
from typing import Any, Callable, Generator, NamedTuple, Optional, Sequence

import gregor_native as native

from gregor.common import errors
from gregor.common.aio import wait_for
from gregor.common.records import BATCH_HEADER_SIZE, RECORD_OVERHEAD_BYTES, TRANSACTIONAL_FLAG, build_batch_from_deltas

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
                 "attempts", "retry_at", "sealed", "payload", "log_append_time", "base_timestamp", "max_timestamp",
                 "producer_id", "producer_epoch", "base_sequence", "parts", "registry", "transactional",
                 "last_error")

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
        # Idempotence (seed 003): set when the sender first drains the batch; -1 means none.
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.transactional = False  # part of a transaction: the batch carries the transactional attribute
        # A merged batch (idempotent drain): the batches it carries and the index of each one's first record.
        self.parts: Optional[list[tuple["ProducerBatch", int]]] = None
        # The accumulator's set of incomplete batches, left once the batch completes or fails
        # (directly, not through a future callback: one scheduled callback less per batch).
        self.registry: Optional[set["ProducerBatch"]] = None
        # The retriable error of its last attempt (the delivery timeout's message names it).
        self.last_error: Optional[BaseException] = None

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    def encode(self, compression: str) -> bytes:
        """The wire batch, built once. Encoding seals the batch: a record appended after it would be
        counted in the batch (and given a sequence and an offset) but missing from the bytes sent."""
        self.sealed = True
        if self.payload is None:
            self.payload = build_batch_from_deltas(self.records, self.base_timestamp, self.max_timestamp,
                                                   compression, producer_id=self.producer_id,
                                                   producer_epoch=self.producer_epoch,
                                                   base_sequence=self.base_sequence,
                                                   transactional=self.transactional)
        return self.payload

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence >= 0

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + len(self.records) - 1

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Stamp producerId, producerEpoch and baseSequence into the batch header, then redo the CRC.

        The CRC-32C covers attributes to the end, so it is computed after the
        fields are in place; the records section (compressed or not) is kept.
        """
        self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence
        if self.payload is not None:
            self.payload = stamp_producer_state(self.payload, producer_id, producer_epoch, base_sequence,
                                                self.transactional)

    def metadata(self, index: int) -> RecordMetadata:
        base = self.future.result()
        ts = self.log_append_time if self.log_append_time >= 0 else self.base_timestamp + self.records[index][3]
        return RecordMetadata(self.topic, self.partition, base + index if base >= 0 else -1, ts)

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        if self.registry is not None:
            self.registry.discard(self)
        if self.future.done():
            return
        if self.parts is not None:
            for part, start in self.parts:
                part.complete(base_offset + start if base_offset >= 0 else base_offset, log_append_time)
        self.log_append_time = log_append_time
        self.future.set_result(base_offset)
        if self.callbacks:
            # Dropped once called, as a future drops its callbacks: a callback that refers to its record's
            # handle (and so to this batch) would otherwise keep the batch in a cycle only the GC frees.
            callbacks, self.callbacks = self.callbacks, []
            topic, partition, records, base_ts = self.topic, self.partition, self.records, self.base_timestamp
            for index, cb in callbacks:
                ts = log_append_time if log_append_time >= 0 else base_ts + records[index][3]
                _call(cb, RecordMetadata(topic, partition, base_offset + index if base_offset >= 0 else -1, ts), None)

    def fail(self, exc: BaseException) -> None:
        self.sealed = True  # failed before it was drained (aborted, expired): nothing more goes in
        if self.registry is not None:
            self.registry.discard(self)
        if self.future.done():
            return
        if self.parts is not None:
            for part, _ in self.parts:
                part.fail(exc)
        self.future.set_exception(exc)
        self.future.exception()  # mark retrieved: a caller who never awaits is not an "unhandled" error
        callbacks, self.callbacks = self.callbacks, []
        for _, cb in callbacks:
            _call(cb, None, exc)


_PRODUCER_FIELDS = struct.Struct(">qhi")  # producerId, producerEpoch, baseSequence at byte 43 of a v2 batch
_PRODUCER_FIELDS_POS = 43
_CRC = struct.Struct(">I")
_CRC_POS = 17
_ATTRIBUTES_POS = 21  # the CRC covers attributes to the end of the batch


def stamp_producer_state(payload: bytes, producer_id: int, producer_epoch: int, base_sequence: int,
                         transactional: bool = False) -> bytes:
    """A copy of one encoded v2 batch with new producer fields (and the transactional attribute when asked)
    and the CRC computed over them."""
    buf = bytearray(payload)
    _PRODUCER_FIELDS.pack_into(buf, _PRODUCER_FIELDS_POS, producer_id, producer_epoch, base_sequence)
    if transactional:
        buf[_ATTRIBUTES_POS + 1] |= TRANSACTIONAL_FLAG  # the low byte of the big-endian i16 attributes
    _CRC.pack_into(buf, _CRC_POS, native.crc32c(bytes(memoryview(buf)[_ATTRIBUTES_POS:])))
    return bytes(buf)


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


def record_size_of(batch: ProducerBatch) -> int:
    """The buffer.memory estimate of a batch's records."""
    return sum(record_size(k, v, h) for k, v, h, _ in batch.records)


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
        # topic -> the open batch its sticky partition (KIP-480) is filling, for try_append_sticky: set by
        # the producer after a sticky append, dropped when a batch of that partition opens behind it.
        self.sticky_batches: dict[str, ProducerBatch] = {}
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
        buffered = self.buffered_bytes + size
        if buffered > self.buffer_memory:
            if size > self.buffer_memory:
                raise errors.MessageTooLargeError(  # type: ignore[attr-defined]
                    f"record of {size} bytes is larger than buffer.memory ({self.buffer_memory})")
            return None
        # The common case first, with every attribute read once: the partition's last batch has room.
        batch_size = self.batch_size
        dq = self.batches.get((topic, partition))
        if dq:
            batch = dq[-1]
            if batch.sealed or (batch.records and batch.size_bytes + size > batch_size):
                if abort_on_new_batch:
                    return NEW_BATCH
                batch = self._new_batch(topic, partition, dq, timestamp_ms)
            elif timestamp_ms > batch.max_timestamp:
                batch.max_timestamp = timestamp_ms
        else:
            if abort_on_new_batch and dq is not None:  # a brand-new partition does not count
                return NEW_BATCH
            batch = self._new_batch(topic, partition, dq, timestamp_ms)
        records = batch.records
        records.append((key, value, headers, timestamp_ms - batch.base_timestamp))
        batch.size_bytes += size
        self.buffered_bytes = buffered
        if batch.size_bytes >= batch_size or self.linger_s == 0:
            self.wakeup.set()
        return FutureRecordMetadata(batch, len(records) - 1)

    def try_append_sticky(self, topic: str, key: Optional[bytes], value: Optional[bytes],
                          headers: Sequence[tuple[str, bytes]], timestamp_ms: int,
                          size: int) -> Optional[FutureRecordMetadata]:
        """send()'s fast path for a record of the sticky partition: appended to sticky_batches[topic] when
        that batch is still open and has room for size bytes (and buffer.memory too); None otherwise, and
        nothing appended (try_append then decides, as for any record). The same append as try_append's:
        no partitioner call, no (topic, partition) lookup, every attribute read once."""
        batch = self.sticky_batches.get(topic)
        if batch is None or batch.sealed:
            return None
        filled = batch.size_bytes + size
        buffered = self.buffered_bytes + size
        batch_size = self.batch_size
        if filled > batch_size or buffered > self.buffer_memory:
            return None
        records = batch.records
        records.append((key, value, headers, timestamp_ms - batch.base_timestamp))
        if timestamp_ms > batch.max_timestamp:
            batch.max_timestamp = timestamp_ms
        batch.size_bytes = filled
        self.buffered_bytes = buffered
        if filled >= batch_size or self.linger_s == 0:
            self.wakeup.set()
        return FutureRecordMetadata(batch, len(records) - 1)

    def _new_batch(self, topic: str, partition: int, dq: Optional[collections.deque[ProducerBatch]],
                   timestamp_ms: int) -> ProducerBatch:
        if dq is None:
            dq = self.batches[(topic, partition)] = collections.deque()
        sticky = self.sticky_batches.get(topic)
        if sticky is not None and sticky.partition == partition:
            del self.sticky_batches[topic]  # a batch opens behind it: records after this one must not go there
        # Kafka's append wakes the sender whenever a batch is created (newBatchCreated), not only
        # when the previous one is complete: an idle sender (nothing queued, nothing in flight, e.g.
        # after every request of a failover failed at once) would otherwise sleep its whole idle
        # poll before it sees the batch, and one second per failover round adds up.
        self.wakeup.set()
        batch = ProducerBatch(topic, partition, time.monotonic(), timestamp_ms)
        dq.append(batch)
        self.incomplete.add(batch)
        batch.registry = self.incomplete
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
                await wait_for(self._space_freed.wait(), remaining)
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

    def drain(self, tp: TopicPartition, max_request_size: int, max_batches: Optional[int] = None,
              budget: Optional[int] = None) -> list[ProducerBatch]:
        """Head batches of tp for one produce request: at least one, up to max.request.size (and max_batches).

        budget: the room left in a request that already carries other partitions; then
        nothing is drained when the head batch does not fit (it goes in the next request).
        """
        dq = self.batches.get(tp)
        out: list[ProducerBatch] = []
        total = 0
        limit = max_request_size if budget is None else min(budget, max_request_size)
        while dq and (max_batches is None or len(out) < max_batches):
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
            if out and total + len(payload) > limit:
                break
            if not out and len(payload) > limit and len(payload) <= max_request_size:
                break  # only with a budget: fits an empty request, not this one
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

    def drain_merged(self, tp: TopicPartition, max_request_size: int,
                     budget: Optional[int] = None) -> list[ProducerBatch]:
        """Idempotent producer: the head batches never sent, as ONE batch (one sequence range) up to max.request.size.

        The broker remembers the last 5 batches of a producer, so at most 5 may be
        unacknowledged per partition; merging the ready ones into one wire batch
        keeps requests as large as without idempotence. Each part keeps its own
        future (completed from the merged batch's base offset). One ready batch
        takes the ordinary drain path.
        """
        dq = self.batches.get(tp)
        limit = max_request_size if budget is None else min(budget, max_request_size)
        n, total = 0, BATCH_HEADER_SIZE
        for b in dq or ():
            if b.has_sequence or (n and total + b.size_bytes > limit):
                break
            n += 1
            total += b.size_bytes
        if n <= 1 or dq is None:
            return self.drain(tp, max_request_size, 1, budget)
        parts = [dq.popleft() for _ in range(n)]
        first = parts[0]
        merged = ProducerBatch(tp[0], tp[1], first.created, first.base_timestamp)
        merged.parts = []
        records = merged.records
        for part in parts:
            part.sealed = True
            part.attempts += 1
            merged.parts.append((part, len(records)))
            shift = part.base_timestamp - first.base_timestamp
            records.extend(part.records if shift == 0 else [(k, v, h, d + shift) for k, v, h, d in part.records])
            merged.max_timestamp = max(merged.max_timestamp, part.max_timestamp)
            merged.size_bytes += part.size_bytes
            part.size_bytes = 0  # the merged batch holds the buffer.memory bytes now
        merged.sealed = True
        merged.attempts = 1
        # Not encoded yet: the sender stamps its sequence first, then encodes once (encode_or_fail).
        return [merged]

    def encode_or_fail(self, batch: ProducerBatch) -> bool:
        """Encode a drained batch now; False (and the batch failed with INVALID_RECORD) if the encoder rejects it."""
        try:
            batch.encode(self.compression)
            return True
        except Exception as exc:  # a record the encoder rejects fails its batches, never the sender
            self.deallocate(batch)
            err = errors.error_for(errors.Code.INVALID_RECORD, f"cannot encode batch: {type(exc).__name__}: {exc}",
                                   topic=batch.topic, partition=batch.partition)
            err.__cause__ = exc
            batch.fail(err)
            return False

    def split_merged(self, merged: ProducerBatch) -> list[ProducerBatch]:
        """The parts of a merged batch, each stamped with its share of the merged sequence range."""
        assert merged.parts is not None
        out = []
        remaining = merged.size_bytes
        for i, (part, start) in enumerate(merged.parts):
            part.payload = None
            part.transactional = merged.transactional
            if merged.has_sequence:
                part.set_producer_state(merged.producer_id, merged.producer_epoch, merged.base_sequence + start)
            part.size_bytes = remaining if i == len(merged.parts) - 1 else record_size_of(part)
            remaining -= part.size_bytes
            out.append(part)
        merged.size_bytes = 0
        return out

    def reenqueue(self, batch: ProducerBatch, now: float) -> None:
        """Put a batch that failed retriably back at the head of its deque (order preserved).

        A batch with a sequence goes among the other retried ones in sequence order
        (Kafka's insertInSequenceOrder): responses of in-flight batches may fail in
        any order, the retries must go out in the order of their sequences.
        """
        batch.retry_at = now + self.retry_backoff_s
        dq = self.batches.setdefault(batch.tp, collections.deque())
        if not batch.has_sequence:
            dq.appendleft(batch)
            return
        i = 0
        while i < len(dq) and dq[i].has_sequence and dq[i].base_sequence < batch.base_sequence:
            i += 1
        dq.insert(i, batch)

    def expire(self, now: float) -> list[ProducerBatch]:
        """Queued batches older than delivery.timeout.ms, removed from the deques."""
        expired: list[ProducerBatch] = []
        for dq in self.batches.values():
            while dq and now - dq[0].created >= self.delivery_timeout_s:
                expired.append(dq.popleft())
        return expired

    def has_undrained(self) -> bool:
        return any(self.batches.values())

    def abort_undrained(self, exc: BaseException) -> None:
        """Fail every queued batch that was never sent (the producer cannot send them, e.g. no producer id)."""
        for dq in self.batches.values():
            keep = [b for b in dq if b.sealed and b.attempts > 0]
            for batch in dq:
                if not (batch.sealed and batch.attempts > 0):
                    self.deallocate(batch)
                    batch.fail(exc)
            dq.clear()
            dq.extend(keep)

    def abort_all(self, exc: BaseException) -> None:
        """Fail every queued batch (sender died or producer force-closed)."""
        for dq in self.batches.values():
            while dq:
                batch = dq.popleft()
                self.deallocate(batch)
                batch.fail(exc)
        for batch in list(self.incomplete):
            batch.fail(exc)
