"""The Gregor producer: asyncio `Producer`, its sender task, and a thread-backed `SyncProducer`.

    async with Producer({"bootstrap.servers": "127.0.0.1:9092"}) as p:
        handle = await p.send("orders", b"value", key=b"k")   # returns once buffered
        md = await handle                                      # RecordMetadata once acknowledged
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import grpc

from gregor.common.aio import wait_for
from gregor.common.tls import from_client_config
from gregor.client.accumulator import (
    NEW_BATCH, Callback, FutureRecordMetadata, ProducerBatch, RecordAccumulator, RecordMetadata, TopicPartition,
    record_size,
)
from gregor.client.config import ConfigError, client_id_for, parse_bootstrap, producer_config
from gregor.client.loop_thread import LoopThread
from gregor.client.metadata import ClusterMetadata, call_error
from gregor.client.produce_request import ProduceRequestEncoder
from gregor.client.produce_stream import ProduceStreams, open_produce_stream
from gregor.client.partitioner import PartitionerClassError, checked_partition, is_builtin, new_partitioner
from gregor.client.producer_sequences import ProducerSequences
from gregor.client.transaction_manager import TransactionManager
from gregor.common import errors
from gregor.common.records import RECORD_OVERHEAD_BYTES
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

log = logging.getLogger(__name__)
_time_ns = time.time_ns  # a record's timestamp: wall-clock ms as an int with no float step
_NO_HEADERS: tuple[tuple[str, bytes], ...] = ()  # shared by every record without headers

__all__ = ["Producer", "SyncProducer", "RecordMetadata", "FutureRecordMetadata", "InvalidRecordTypeError"]


class InvalidRecordTypeError(errors.InvalidRecordError, TypeError):  # type: ignore[name-defined,misc]
    """send() got a key, value or header of the wrong type (INVALID_RECORD, and a TypeError)."""


def _check_record(key: Any, value: Any, headers: Any) -> Sequence[tuple[str, bytes]]:
    """The record's headers as a sequence, after checking every field's type (raises InvalidRecordTypeError)."""
    if value is not None and not isinstance(value, bytes):
        raise InvalidRecordTypeError(f"record value must be bytes or None, not {type(value).__name__}")
    if key is not None and not isinstance(key, bytes):
        raise InvalidRecordTypeError(f"record key must be bytes or None, not {type(key).__name__}")
    if not headers:
        return _NO_HEADERS
    if isinstance(headers, (str, bytes)) or not isinstance(headers, (list, tuple)):
        raise InvalidRecordTypeError(f"record headers must be a list of (str, bytes) pairs, "
                                     f"not {type(headers).__name__}")
    for header in headers:
        if (not isinstance(header, tuple) or len(header) != 2 or not isinstance(header[0], str)
                or not isinstance(header[1], bytes)):
            raise InvalidRecordTypeError(f"record header {header!r} is not a (str, bytes) pair")
    return list(headers)


class Sender:
    """Drains ready batches to partition leaders (one asyncio task plus one task per request).

    Ordering: without idempotence at most one produce request per partition is
    in flight, so a retried batch can never overtake a later one. With
    enable.idempotence up to max.in.flight.requests.per.connection (<= 5) batches
    per partition are unacknowledged, each with its sequence; the leader refuses
    a gap, so a later batch cannot land before a retried earlier one, and
    retries go out alone in sequence order (ProducerSequences). Either way
    max.in.flight.requests.per.connection bounds the requests per broker.
    """

    def __init__(self, metadata: ClusterMetadata, acc: RecordAccumulator, cfg: Mapping[str, Any]) -> None:
        self.metadata = metadata
        self.acc = acc
        # enable.idempotence (seed 003): producer id + per-partition sequences, up to 5 batches in flight
        # per partition; without it, one request per partition keeps retries in order.
        self.txn: Optional[ProducerSequences] = (
            ProducerSequences(int(cfg["max.in.flight.requests.per.connection"]))
            if cfg["enable.idempotence"] else None)
        self._init_pid_task: Optional[asyncio.Task[None]] = None
        # transactional.id: batches wait until their partition is in the transaction (transaction_manager.py).
        self.txn_gate: Optional[Callable[[TopicPartition], bool]] = None
        self.on_batch_failed: Optional[Callable[[BaseException], None]] = None
        self.acks = int(cfg["acks"])
        self.max_request_size = int(cfg["max.request.size"])
        self.max_in_flight = int(cfg["max.in.flight.requests.per.connection"])
        self.retries = int(cfg["retries"])
        self.request_timeout_ms = int(cfg["request.timeout.ms"])
        self.delivery_timeout_s = int(cfg["delivery.timeout.ms"]) / 1000
        self.in_flight: dict[int, int] = {}
        self.muted: set[TopicPartition] = set()
        self.stats = SenderStats()
        self.requests: set[asyncio.Task[None]] = set()
        self.closing = False
        self.closing_forced = False  # close() timed out: fail instead of retrying
        self._refresh_task: Optional[asyncio.Task[None]] = None
        self._drain_index = 0  # where the next drain starts among the ready partitions
        self._streams = ProduceStreams(lambda address: open_produce_stream(self.metadata.channel(address)))
        # KIP-219: a broker that answered with throttle_time_ms gets no request before this (monotonic s).
        self.throttled_until: dict[int, float] = {}
        self._request_encoder = ProduceRequestEncoder(self.acks, self.request_timeout_ms)

    async def run(self) -> None:
        acc = self.acc
        while True:
            acc.wakeup.clear()
            now = time.monotonic()
            if (self.txn is not None and not self.txn.has_producer_id and acc.has_undrained()
                    and self.txn_gate is None):  # a transactional producer gets its id from init_transactions()
                self._maybe_init_producer_id()
            for batch in acc.expire(now):
                self._fail(batch, errors.RequestTimedOutError(  # type: ignore[attr-defined]
                    f"Expiring {len(batch.records)} record(s) for {batch.topic}-{batch.partition}: "
                    f"{int((now - batch.created) * 1000)} ms has passed since batch creation "
                    f"(delivery.timeout.ms)" + ("" if batch.last_error is None else
                                                f"; the last attempt failed: {batch.last_error}"),
                    topic=batch.topic, partition=batch.partition))
            # Kafka's Sender sends one request per broker per pass and passes again while one was
            # sent (more may be ready: a full request, up to max.in.flight per broker).
            need_metadata, sent = False, True
            while sent:
                ready, delay = acc.ready(now, self.muted)
                need, sent = self._send_ready(ready)
                need_metadata = need_metadata or need
            # Kafka's NetworkClient updates metadata first once an update is requested (a request
            # failed with NOT_LEADER_OR_FOLLOWER, a network error, ...): refresh at once, not when
            # the retried batch's backoff has passed, so the retry already goes to the new leader.
            if need_metadata or (self.metadata.stale and (ready or acc.has_undrained())):
                wait = self.metadata.refresh_backoff_left(now)
                if wait <= 0:
                    self._maybe_refresh_metadata()
                delay = min(delay, wait or self.metadata.retry_backoff_s)
            if self.closing and not acc.has_undrained() and not self.requests:
                if self._init_pid_task is not None:
                    self._init_pid_task.cancel()
                self.close_streams()
                return
            if need_metadata or not acc.has_undrained():
                delay = max(delay, 0.005) if acc.has_undrained() else 1.0
            if self.throttled_until:  # wake when a throttled broker may be sent to again
                clock = time.monotonic()
                for broker in [b for b, until in self.throttled_until.items() if until <= clock]:
                    del self.throttled_until[broker]
                if self.throttled_until and acc.has_undrained():
                    delay = min(delay, max(0.001, min(self.throttled_until.values()) - clock))
            try:
                await wait_for(acc.wakeup.wait(), delay)
            except asyncio.TimeoutError:
                pass

    def _send_ready(self, ready: list[TopicPartition]) -> tuple[bool, bool]:
        """Drain the ready partitions into one produce request per leader (Kafka's Sender.drain).

        Every ready partition of a leader goes into the same request, up to
        max.request.size over all of them, so 16 partitions cost one call, not 16.
        The start rotates between calls (Kafka's drainIndex) so that a full request
        does not always favour the same partitions. Returns whether metadata is needed
        and whether a request was sent.
        """
        need_metadata = False
        requests: dict[int, list[tuple[TopicPartition, list[ProducerBatch]]]] = {}
        sizes: dict[int, int] = {}
        acc, limit = self.acc, self.max_request_size
        if len(ready) > 1:
            self._drain_index = (self._drain_index + 1) % len(ready)
            ready = ready[self._drain_index:] + ready[:self._drain_index]
        for tp in ready:
            leader = self.metadata.leader_for(*tp)
            if leader < 0:
                need_metadata = True
                continue
            if not self.metadata.connectable(leader):
                # The leader's connection failed (it died?): keep the batches (delivery.timeout.ms
                # bounds them) and ask for metadata; they go as soon as it names a new leader.
                need_metadata = True
                self.metadata.request_update()
                continue
            if self.in_flight.get(leader, 0) >= self.max_in_flight:
                continue
            if leader in self.throttled_until and not self._throttle_over(leader):
                continue
            if self.txn_gate is not None and not self.txn_gate(tp):
                continue
            used = sizes.get(leader, 0)
            # The first partition of a request may fill it; later ones take what is left, and a head
            # batch that does not fit waits for the next request instead of failing as too large.
            budget = limit - used if used else None
            if budget is not None and budget <= 0:
                continue
            if self.txn is not None:
                dq = acc.batches.get(tp)
                allowed = self.txn.drainable(tp, dq[0]) if dq else 0
                if allowed <= 0:
                    continue
                # New batches leave merged into one (one of the 5 in-flight batches); a retry alone.
                batches = (acc.drain(tp, limit, 1, budget) if dq[0].has_sequence  # type: ignore[index]
                           else acc.drain_merged(tp, limit, budget))
                if not batches:
                    continue
                self.txn.assign_sequences(tp, batches)
                if batches[0].payload is None and not acc.encode_or_fail(batches[0]):  # a merged batch
                    self.txn.request_done(tp)
                    self.txn.on_failed(batches[0])
                    continue
            else:
                batches = acc.drain(tp, limit, None, budget)
                if not batches:
                    continue
                self.muted.add(tp)
            requests.setdefault(leader, []).append((tp, batches))
            sizes[leader] = used + sum(len(b.payload or b"") for b in batches)
        for leader, parts in requests.items():
            self.in_flight[leader] = self.in_flight.get(leader, 0) + 1
            # Written to the leader's stream now, in drain order (the task only waits for the answer).
            task = asyncio.ensure_future(self._produce(leader, parts, self._send_request(leader, parts)))
            self.requests.add(task)
            task.add_done_callback(self.requests.discard)
        return need_metadata, bool(requests)

    def _throttle_over(self, leader: int) -> bool:
        """Whether the leader's throttle time has passed (KIP-219: the client waits it out)."""
        if time.monotonic() < self.throttled_until[leader]:
            return False
        del self.throttled_until[leader]
        return True

    def _on_throttle(self, leader: int, throttle_ms: int) -> None:
        """A response carried throttle_time_ms: no request to that broker until it has passed."""
        self.stats.record_throttle(throttle_ms)
        if throttle_ms > 0:
            until = time.monotonic() + throttle_ms / 1000
            self.throttled_until[leader] = max(until, self.throttled_until.get(leader, 0.0))

    def _maybe_init_producer_id(self) -> None:
        if self._init_pid_task is None or self._init_pid_task.done():
            self._init_pid_task = asyncio.ensure_future(self._init_producer_id())

    async def _init_producer_id(self) -> None:
        """InitProducerId on any broker (Kafka asks the least loaded node), retried until it answers."""
        assert self.txn is not None
        while not self.txn.has_producer_id:
            try:
                stub = broker_pb2_grpc.BrokerServiceStub(self.metadata.channel(self.metadata.any_address()))
                resp = await stub.InitProducerId(broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1),
                                                 timeout=self.request_timeout_ms / 1000)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                err = call_error(exc)
                if not err.retriable:
                    # Nothing can be sent without a producer id: fail what is queued, keep trying for later sends.
                    log.error("InitProducerId failed: %s", err)
                    self.acc.abort_undrained(err)
                else:
                    log.warning("InitProducerId failed: %s; retrying", err)
                await asyncio.sleep(self.metadata.retry_backoff_s)
                continue
            self.txn.set_producer_id_and_epoch(resp.producer_id, resp.producer_epoch)
        self.acc.wakeup.set()

    def _maybe_refresh_metadata(self) -> None:
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.metadata.refresh()
        except errors.GregorError as exc:
            log.warning("metadata refresh failed: %s", exc)
            await asyncio.sleep(self.metadata.retry_backoff_s)
        self.acc.wakeup.set()

    def _send_request(self, leader: int, parts: list[tuple[TopicPartition, list[ProducerBatch]]]) -> Any:
        """Build the leader's ProducePartitions request and queue it on its ProduceStream.

        The future of its answer, or the GregorError that kept it from being sent."""
        compression = self.acc.compression
        stats = self.stats  # per request, not per record: the gateway exports these (compression ratio)
        stats.requests += 1
        encoder = self._request_encoder
        pieces = encoder.start()
        for tp, batches in parts:
            payloads = [b.encode(compression) for b in batches]
            wire = sum(map(len, payloads))
            stats.batches += len(batches)
            stats.record_bytes += sum(b.size_bytes for b in batches)
            stats.wire_bytes += wire
            encoder.add_partition(pieces, tp[0], tp[1], payloads, wire)
        try:
            address = self.metadata.broker_address(leader)
        except errors.GregorError as err:
            return err
        return self._streams.send(leader, address, pieces)

    async def _produce(self, leader: int, parts: list[tuple[TopicPartition, list[ProducerBatch]]],
                       sent: Any) -> None:
        """Wait for one request's answer; each partition's result completes or retries its batches."""
        try:
            if isinstance(sent, errors.GregorError):
                raise sent
            try:
                # The broker may hold an acks=all request for timeout_ms; leave room for the answer.
                resp = await wait_for(asyncio.shield(sent), self.request_timeout_ms / 1000 + 1)
            except asyncio.TimeoutError:
                err = errors.error_for(errors.Code.REQUEST_TIMED_OUT,
                                       f"no produce answer from broker {leader} within request.timeout.ms")
                self._fail_stream(leader, err)  # Kafka closes the connection of a timed-out request
                raise err from None
            self._on_throttle(leader, resp.throttle_time_ms)
            if resp.HasField("error"):
                raise errors.from_detail(resp.error)
            if len(resp.results) != len(parts):
                raise errors.GregorError(f"broker {leader} answered {len(resp.results)} of {len(parts)} partitions")
        except (grpc.RpcError, errors.GregorError) as exc:
            err = call_error(exc)
            for tp, batches in parts:
                self._partition_done(tp, batches, None, err)
        else:
            for (tp, batches), result in zip(parts, resp.results):
                self._partition_done(tp, batches, result, None)
        finally:
            self.in_flight[leader] -= 1
            self.acc.wakeup.set()

    def _fail_stream(self, leader: int, err: errors.GregorError) -> None:
        self._streams.fail(leader, err)

    def close_streams(self) -> None:
        self._streams.close()

    def _partition_done(self, tp: TopicPartition, batches: list[ProducerBatch],
                        result: Optional[broker_pb2.ProducePartitionResult], err: Optional[errors.GregorError]) -> None:
        if self.txn is not None:
            self.txn.request_done(tp)
        self.muted.discard(tp)
        if err is None and result is not None and result.HasField("error"):
            err = errors.from_detail(result.error)
        if err is not None:
            # A failed partition gets its own copy: _on_error stamps topic and partition into it.
            self._on_error(tp, batches, copy.copy(err) if result is None else err)
            return
        assert result is not None
        base = result.base_offset
        for batch in batches:
            if self.txn is not None:
                self.txn.on_success(batch)
            self.acc.deallocate(batch)
            batch.complete(base, result.log_append_time_ms)
            if base >= 0:  # batches of one request get contiguous offsets
                base += len(batch.records)

    def _on_error(self, tp: TopicPartition, batches: list[ProducerBatch], err: errors.GregorError) -> None:
        if not err.topic:
            err.topic, err.partition = tp
        now = time.monotonic()
        self.metadata.request_update(err)
        # Put retriable batches back in order (last first, since each goes to the head;
        # batches with sequences go in sequence order whatever the order here).
        for batch in reversed(batches):
            if (self.txn is not None and batch.parts is not None and err.code == errors.Code.MESSAGE_TOO_LARGE
                    and not self.closing_forced):
                # The merged batch is over the topic's max.message.bytes: send its parts one by one
                # (Kafka splits a batch on MESSAGE_TOO_LARGE); they keep their share of its sequences.
                parts = self.acc.split_merged(batch)
                self.txn.replace_with_parts(batch, parts)
                for part in parts:
                    self.acc.reenqueue(part, now)
                continue
            expired = now - batch.created >= self.delivery_timeout_s
            retriable = self.txn.can_retry(batch, err) if self.txn is not None else err.retriable
            if retriable and batch.attempts <= self.retries and not expired and not self.closing_forced:
                log.debug("retrying %s-%s after %s (attempt %d)", *tp, err.name, batch.attempts)
                self.stats.retries += 1
                batch.last_error = err
                self.acc.reenqueue(batch, now)
            else:
                self._fail(batch, err)

    def _fail(self, batch: ProducerBatch, exc: BaseException) -> None:
        if self.on_batch_failed is not None:
            self.on_batch_failed(exc)
        if self.txn is not None:
            self.txn.on_failed(batch)
        self.acc.deallocate(batch)
        batch.fail(exc)


class SenderStats:
    """Plain counters of the sender, kept per produce request (never per record) and read by exporters."""

    __slots__ = ("requests", "batches", "record_bytes", "wire_bytes", "retries", "responses", "throttle_time_ms_total",
                 "throttle_time_ms_max")

    def __init__(self) -> None:
        self.requests = self.batches = self.record_bytes = self.wire_bytes = self.retries = 0
        self.responses = self.throttle_time_ms_total = self.throttle_time_ms_max = 0

    def record_throttle(self, throttle_ms: int) -> None:
        """One produce response's throttle_time_ms (0 when not throttled), as Kafka's produce-throttle-time sensor."""
        self.responses += 1
        self.throttle_time_ms_total += throttle_ms
        if throttle_ms > self.throttle_time_ms_max:
            self.throttle_time_ms_max = throttle_ms

    @property
    def produce_throttle_time_avg(self) -> float:
        """Kafka's produce-throttle-time-avg (ms per response; over the producer's life, not a window)."""
        return self.throttle_time_ms_total / self.responses if self.responses else 0.0

    @property
    def produce_throttle_time_max(self) -> float:
        """Kafka's produce-throttle-time-max (ms)."""
        return float(self.throttle_time_ms_max)


class Producer:
    """Asyncio producer (event-loop owned: create, use and close it on one loop).

    send() buffers the record in the RecordAccumulator and returns a handle that
    resolves to RecordMetadata; one Sender task ships batches. If the sender
    task dies, every pending record fails with its error (nothing hangs).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.config = producer_config(config, **kwargs)
        cfg = self.config
        self.metadata = ClusterMetadata(parse_bootstrap(cfg["bootstrap.servers"]),
                                        request_timeout_ms=cfg["request.timeout.ms"], security=from_client_config(cfg),
                                        retry_backoff_ms=cfg["retry.backoff.ms"],
                                        metadata_max_age_ms=cfg["metadata.max.age.ms"],
                                        client_id=client_id_for(cfg, "producer"))
        # partitioner.class: a custom partitioner decides every record without a partition (no sticky
        # logic around it, as in Kafka 3.3+); unset, the built-in murmur2 / KIP-480 sticky partitioner.
        try:
            self.partitioner = new_partitioner(cfg["partitioner.class"], cfg, cfg["partitioner.ignore.keys"])
        except PartitionerClassError as exc:
            raise ConfigError(f"Invalid value {cfg['partitioner.class']} for configuration partitioner.class: "
                              f"{exc}") from exc
        self._custom_partitioner = not is_builtin(self.partitioner)
        # partitioner.ignore.keys: keyed records are sticky too (never with partitioner.class)
        self._ignore_keys = not self._custom_partitioner and bool(self.partitioner.ignore_keys)
        self.max_block_ms = int(cfg["max.block.ms"])
        self.max_request_size = int(cfg["max.request.size"])
        self._acc: Optional[RecordAccumulator] = None
        self._sender: Optional[Sender] = None
        self._sender_task: Optional[asyncio.Task[None]] = None
        self._closed = False
        self._failure: Optional[BaseException] = None  # why the sender task died; send() raises it
        self._parts_cache: dict[str, tuple[Any, int, list[int]]] = {}
        self._txn: Optional[TransactionManager] = TransactionManager(self, cfg) if cfg["transactional.id"] else None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._acc is not None:
            return
        cfg = self.config
        self._acc = RecordAccumulator(
            batch_size=cfg["batch.size"], linger_ms=cfg["linger.ms"], buffer_memory=cfg["buffer.memory"],
            max_block_ms=cfg["max.block.ms"], delivery_timeout_ms=cfg["delivery.timeout.ms"],
            retry_backoff_ms=cfg["retry.backoff.ms"], compression=cfg["compression.type"])
        self._sender = Sender(self.metadata, self._acc, cfg)
        if self._txn is not None:
            assert self._sender.txn is not None
            self._sender.txn.transactional = True
            self._sender.txn_gate = self._txn.ready_to_send
            self._sender.on_batch_failed = self._txn.on_send_failed
        self._sender_task = asyncio.ensure_future(self._sender.run())
        self._sender_task.add_done_callback(self._on_sender_done)

    @property
    def sender_stats(self) -> SenderStats:
        """The sender's per-request counters (zeros before start())."""
        return self._sender.stats if self._sender is not None else SenderStats()

    def metrics(self) -> dict[str, float]:
        """Kafka producer metrics kept here, by Kafka's names (producer-metrics group)."""
        stats = self.sender_stats
        return {"produce-throttle-time-avg": stats.produce_throttle_time_avg,
                "produce-throttle-time-max": stats.produce_throttle_time_max,
                "request-total": float(stats.requests), "record-retry-total": float(stats.retries)}

    def _on_sender_done(self, task: asyncio.Task[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if task.cancelled() or exc is not None:
            if exc is not None:
                log.error("producer sender died", exc_info=exc)
            assert self._acc is not None
            # Nothing drains the accumulator any more: fail what is queued and refuse later sends
            # (they would wait forever), keeping the original cause.
            self._failure = exc if exc is not None else asyncio.CancelledError("producer sender task was cancelled")
            self._acc.closed = True
            self._acc.abort_all(self._sender_failed_error())

    def _sender_failed_error(self) -> errors.GregorError:
        cause = self._failure
        err = errors.GregorError(f"producer sender stopped: {type(cause).__name__}: {cause}")
        err.__cause__ = cause
        return err

    async def __aenter__(self) -> "Producer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self, timeout: Optional[float] = None) -> None:
        """Send everything buffered now and wait until each record is acknowledged or failed."""
        if self._acc is None:
            return
        acc = self._acc
        acc.flushes_in_progress += 1
        acc.wakeup.set()
        try:
            pending = [b.future for b in list(acc.incomplete)]
            if pending:
                await asyncio.wait(pending, timeout=timeout)
        finally:
            acc.flushes_in_progress -= 1

    async def close(self, timeout: Optional[float] = None) -> None:
        """Flush (up to timeout seconds, default delivery.timeout.ms), stop the sender, close channels."""
        if self._closed:
            return
        self._closed = True
        if self._acc is not None and self._sender is not None and self._sender_task is not None:
            self._acc.closed = True
            self._sender.closing = True
            self._acc.wakeup.set()
            wait_s = timeout if timeout is not None else self.config["delivery.timeout.ms"] / 1000
            done, _ = await asyncio.wait([self._sender_task], timeout=wait_s)
            if not done:
                self._sender.closing_forced = True
                self._sender_task.cancel()
                if self._sender._init_pid_task is not None:
                    self._sender._init_pid_task.cancel()
                for t in list(self._sender.requests):
                    t.cancel()
                self._acc.abort_all(errors.RequestTimedOutError(  # type: ignore[attr-defined]
                    "producer closed before the record was sent"))
                await asyncio.gather(self._sender_task, *self._sender.requests, return_exceptions=True)
                self._sender.close_streams()
        await self.metadata.close()
        close = getattr(self.partitioner, "close", None) if self._custom_partitioner else None
        if callable(close):
            try:  # Kafka closes the partitioner quietly: its failure does not fail close()
                close()
            except Exception:
                log.exception("partitioner %s failed to close", type(self.partitioner).__qualname__)

    # ------------------------------------------------------------ sending
    async def partitions_for(self, topic: str) -> list[int]:
        return [p.partition for p in await self.metadata.wait_for_topic(topic, self.max_block_ms)]

    async def send(self, topic: str, value: Optional[bytes], key: Optional[bytes] = None,
                   headers: Optional[Sequence[tuple[str, bytes]]] = None, partition: Optional[int] = None,
                   timestamp_ms: Optional[int] = None, callback: Optional[Callback] = None) -> FutureRecordMetadata:
        """Buffer one record; the returned handle resolves to its RecordMetadata (await it).

        Blocks (up to max.block.ms) only for unknown metadata or a full buffer.memory;
        otherwise it never suspends (no await on the common path).
        callback(metadata, exception) runs on the event loop once the record is done.
        """
        if self._closed or self._failure is not None:
            raise (errors.GregorError("cannot send after the producer is closed") if self._closed
                   else self._sender_failed_error())
        if self._txn is not None:
            self._txn.check_send()
        # The common record (bytes or None, no headers) is checked and sized inline: this runs per record.
        if headers is None and (value is None or type(value) is bytes) and (key is None or type(key) is bytes):
            hdrs: Sequence[tuple[str, bytes]] = _NO_HEADERS
            size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
        else:
            hdrs = _check_record(key, value, headers)
            size = record_size(key, value, hdrs)
        acc = self._acc
        cached = self._parts_cache.get(topic)
        if acc is None or cached is None or self.metadata.topics.get(topic) is not cached[0]:
            acc, cached = await self._prepare(topic)
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        # KIP-480's common case without a partitioner call: a record the sticky partition takes goes into
        # the batch that partition is filling, while it has room (the path below does the same, slower).
        if partition is None and (key is None or self._ignore_keys) and size <= self.max_request_size:
            fast = acc.try_append_sticky(topic, key, value, hdrs, timestamp_ms, size)
            if fast is not None:
                if callback is not None:
                    fast.add_done_callback(callback)
                return fast
        n, available = cached[1], cached[2]
        partitioner = self.partitioner
        sticky = False
        if partition is not None:
            if not 0 <= partition < n:
                acc, cached = await self._wait_for_partition(topic, partition, n)
                n, available = cached[1], cached[2]
        elif self._custom_partitioner:  # partitioner.class decides (InvalidPartitionError outside [0, n))
            partition = checked_partition(partitioner, topic, key, value, n, available)
        elif key is None or partitioner.ignore_keys:
            # Null keys (or partitioner.ignore.keys): the sticky partition of KIP-480.
            sticky = True
            partition = partitioner.partition(topic, None, n, available)
        else:
            partition = partitioner.partition(topic, key, n, available)
        if size > self.max_request_size:
            raise errors.MessageTooLargeError(  # type: ignore[attr-defined]
                f"The message is {size} bytes when serialized which is larger than max.request.size "
                f"({self.max_request_size})", topic=topic, partition=partition)
        handle = acc.try_append(topic, partition, key, value, hdrs, timestamp_ms, size, sticky)
        if handle is NEW_BATCH:
            # KIP-480: the sticky partition's batch is complete; move on before opening a new one.
            partition = self._next_sticky_partition(acc, topic, partition, n, available)
            handle = acc.try_append(topic, partition, key, value, hdrs, timestamp_ms, size)
        if handle is None:  # buffer.memory is full: wait for the sender to free some
            if self._failure is not None:
                raise self._sender_failed_error()
            if sticky and acc.needs_new_batch((topic, partition), size):
                partition = self._next_sticky_partition(acc, topic, partition, n, available)
            # Not the topic's sticky batch for try_append_sticky: the partitioner may move on meanwhile.
            handle, _ = await acc.append(topic, partition, key, value, hdrs, timestamp_ms, size)
        elif sticky:
            acc.sticky_batches[topic] = handle.batch  # type: ignore[union-attr]
        if callback is not None:
            handle.add_done_callback(callback)  # type: ignore[union-attr]
        return handle  # type: ignore[return-value]

    def _next_sticky_partition(self, acc: RecordAccumulator, topic: str, partition: int, n: int,
                               available: list[int]) -> int:
        """KIP-480: the sticky partition's batch is complete; the partition the next records go to."""
        acc.sticky_batches.pop(topic, None)
        self.partitioner.on_batch_full(topic, partition, n, available)
        return self.partitioner.partition(topic, None, n, available)  # type: ignore[no-any-return]

    async def _prepare(self, topic: str) -> tuple[RecordAccumulator, tuple[Any, int, list[int]]]:
        """send()'s slow path: start the producer if needed and get the topic's partitions (waiting up to
        max.block.ms for metadata); raises the sender's failure if it died meanwhile."""
        if self._acc is None:
            await self.start()
        acc = self._acc
        assert acc is not None
        cached = self._parts_cache.get(topic)
        if cached is None or self.metadata.topics.get(topic) is not cached[0]:
            cached = self._topic_parts(topic)
            if cached is None:
                await self.metadata.wait_for_topic(topic, self.max_block_ms)
                cached = self._topic_parts(topic)
                assert cached is not None
        if self._failure is not None:  # the sender died while we waited
            raise self._sender_failed_error()
        return acc, cached

    async def _wait_for_partition(self, topic: str, partition: int,
                                  n: int) -> tuple[RecordAccumulator, tuple[Any, int, list[int]]]:
        """An explicit partition beyond the partitions known: Kafka's waitOnMetadata refreshes until the
        topic has it (partitions may have just been added, and this metadata is older) or max.block.ms
        passed, then fails the send. A negative partition, or max.block.ms=0 (the gateway), fails at once."""
        if partition < 0 or self.max_block_ms <= 0:
            raise errors.UnknownTopicOrPartitionError(  # type: ignore[attr-defined]
                f"partition {partition} of topic {topic!r} does not exist ({n} partitions)",
                topic=topic, partition=partition)
        await self.metadata.wait_for_topic(topic, self.max_block_ms, partition)
        return await self._prepare(topic)

    def _topic_parts(self, topic: str) -> Optional[tuple[Any, int, list[int]]]:
        """(TopicInfo, partition count, partitions with a leader) of topic, cached until the metadata
        answer for it changes (the cache entry holds the TopicInfo it was computed from); None if unknown."""
        info = self.metadata.topics.get(topic)
        parts = self.metadata.partitions_for(topic)
        if not parts:
            return None
        cached = self._parts_cache[topic] = (info, len(parts), [p.partition for p in parts if p.leader >= 0])
        if self._acc is not None:  # the partitioner sees the new partitions before the next sticky append
            self._acc.sticky_batches.pop(topic, None)
        return cached

    async def send_and_wait(self, topic: str, value: Optional[bytes], key: Optional[bytes] = None,
                            **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, value, key, **kwargs))

    # ------------------------------------------------------------ transactions (transaction_manager.py)
    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise errors.error_for(errors.Code.INVALID_TXN_STATE,
                                   "Transactional method invoked on a non-transactional producer: set transactional.id")
        return self._txn

    async def init_transactions(self) -> None:
        """Kafka's initTransactions: register transactional.id, fence older instances, finish their transaction."""
        await self.start()
        await self._transactions().init_transactions()

    async def begin_transaction(self) -> None:
        self._transactions().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group_metadata: Any) -> None:
        """Commit consumer offsets ({(topic, partition): next offset}) of a group with this transaction."""
        await self._transactions().send_offsets_to_transaction(offsets, group_metadata)

    async def commit_transaction(self) -> None:
        await self._transactions().commit_transaction()

    async def abort_transaction(self) -> None:
        await self._transactions().abort_transaction()

    def buffered_bytes(self) -> int:
        """Bytes of records waiting in the accumulator (the part of buffer.memory in use)."""
        return self._acc.buffered_bytes if self._acc is not None else 0

    # -- TxnSender (transaction_manager.py): what the TransactionManager may use of the producer ----------
    def wakeup(self) -> None:
        """Let the sender look at the accumulator again (partitions joined the transaction)."""
        if self._acc is not None:
            self._acc.wakeup.set()

    def sequences(self) -> ProducerSequences:
        """The producer id, epoch and sequences (idempotence bookkeeping) the sender stamps batches with."""
        assert self._sender is not None and self._sender.txn is not None
        return self._sender.txn

    def fail_queued(self, tps: set[TopicPartition], exc: BaseException) -> None:
        """Fail the records waiting to be sent (their partitions could not join the transaction)."""
        if self._acc is not None:
            self._acc.abort_undrained(exc)


class SyncProducer:
    """Blocking facade over Producer: an event loop on a private thread runs the real one.

    The order of calls is kept as Kafka's KafkaProducer keeps it: send() returns once the record is in
    the accumulator (or raises what Kafka's send() raises: a bad record, a record too large, a send
    outside a transaction, a fenced or closed producer), so the flush(), commit_transaction(),
    abort_transaction() or close() called after it covers it. send() returns a
    concurrent.futures.Future[RecordMetadata]; use it from any thread.
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self._loop = LoopThread("gregor-producer")
        self._closed = False
        try:
            self._producer: Producer = self._loop.run(self._make(config, kwargs))
        except BaseException:
            self._loop.stop()
            raise

    def metrics(self) -> dict[str, float]:
        """Producer.metrics() (plain counters: read without the loop)."""
        return self._producer.metrics()

    @staticmethod
    async def _make(config: Mapping[str, Any] | None, kwargs: dict[str, Any]) -> Producer:
        p = Producer(config, **kwargs)
        await p.start()
        return p

    def _run(self, coro: Any, timeout: Optional[float] = None) -> Any:
        if self._closed:
            coro.close()
            raise errors.GregorError("the producer is closed")
        return self._loop.run(coro, timeout)

    def send(self, topic: str, value: Optional[bytes], key: Optional[bytes] = None,
             headers: Optional[Sequence[tuple[str, bytes]]] = None, partition: Optional[int] = None,
             timestamp_ms: Optional[int] = None,
             callback: Optional[Callable[[Optional[RecordMetadata], Optional[BaseException]], Any]] = None
             ) -> "concurrent.futures.Future[RecordMetadata]":
        """Append one record (blocking up to max.block.ms for metadata or buffer space, as Kafka's send()).

        Raises at once what the async send() raises; the returned future resolves to the record's
        RecordMetadata once acknowledged, or to its delivery error. callback(metadata, exception) runs
        on the producer's I/O thread, as Kafka's callbacks run on its sender thread."""
        result: "concurrent.futures.Future[RecordMetadata]" = concurrent.futures.Future()

        def resolve(md: Optional[RecordMetadata], exc: Optional[BaseException]) -> None:
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result(md)  # type: ignore[arg-type]

        async def append() -> None:
            handle = await self._producer.send(topic, value, key, headers=headers, partition=partition,
                                               timestamp_ms=timestamp_ms, callback=callback)
            handle.add_done_callback(resolve)

        self._run(append())
        return result

    def partitions_for(self, topic: str) -> list[int]:
        return self._run(self._producer.partitions_for(topic))

    def init_transactions(self) -> None:
        self._run(self._producer.init_transactions())

    def begin_transaction(self) -> None:
        self._run(self._producer.begin_transaction())

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group_metadata: Any) -> None:
        self._run(self._producer.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self) -> None:
        self._run(self._producer.commit_transaction())

    def abort_transaction(self) -> None:
        self._run(self._producer.abort_transaction())

    def flush(self, timeout: Optional[float] = None) -> None:
        self._run(self._producer.flush(timeout))

    def close(self, timeout: Optional[float] = None) -> None:
        """Kafka's close(): every send that returned is completed or failed before this returns."""
        if self._closed:
            return
        try:
            self._run(self._producer.close(timeout))
        finally:
            self._closed = True
            self._loop.stop()

    def __enter__(self) -> "SyncProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
