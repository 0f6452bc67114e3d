"""ProducerGateway: one SDK producer (acks=all, idempotent when the SDK has it) behind the gateway's RPCs.

Seed 003's producer, moved to a server: the main thread's work (partitioner,
RecordAccumulator append) runs per incoming record; the Sender drains batches
to partition leaders, compresses them (compression.type), retries across leader
changes (retries, retry.backoff.ms, delivery.timeout.ms). buffer.memory bounds
what waits in the accumulator; where Kafka's send() would block up to
max.block.ms, the gateway answers at once with THROTTLING_QUOTA_EXCEEDED
(gRPC RESOURCE_EXHAUSTED), so a full gateway never holds a client forever.

Stateless apart from the producer: any number of gateways may run side by side.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

from prometheus_client import REGISTRY, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from gregor.client.accumulator import FutureRecordMetadata, RecordMetadata, record_size
from gregor.client.config import ConfigError, producer_config
from gregor.client.producer import Producer, SenderStats
from gregor.common import errors
from gregor.common.metrics import COUNT_BUCKETS, LATENCY_BUCKETS_S, SIZE_BUCKETS_BYTES, PlainHistogram

log = logging.getLogger(__name__)



GATEWAY_ERROR_CODES = ("THROTTLING_QUOTA_EXCEEDED", "REQUEST_TIMED_OUT", "MESSAGE_TOO_LARGE",
                       "UNKNOWN_TOPIC_OR_PARTITION")


class GatewayMetrics:
    """Per-record counters and the record-latency histogram as plain numbers (event-loop owned).

    A prometheus_client Counter/Histogram takes a lock per update (~2-5 µs); at tens of
    thousands of records per second that is a large share of the gateway's CPU, so the
    hot path does an integer add and a bisect, and /metrics reads the numbers at scrape time.
    """

    def __init__(self) -> None:
        self.records_in = 0
        self.records_out = 0
        self.batches_in = 0
        # The codes the gateway answers itself start at 0, so a dashboard sees the series before the first error.
        self.errors: dict[str, int] = {code: 0 for code in GATEWAY_ERROR_CODES}
        self.latency = PlainHistogram(LATENCY_BUCKETS_S)
        self.records_per_batch = PlainHistogram(COUNT_BUCKETS)
        self.batch_bytes = PlainHistogram(SIZE_BUCKETS_BYTES)
        self.buffered: Callable[[], int] = lambda: 0
        self.buffer_memory = 0
        self.sender: SenderStats = SenderStats()

    def observe(self, seconds: float, count: int = 1) -> None:
        self.latency.observe(seconds, count)

    def batch_in(self, records: int, size_bytes: int) -> None:
        """One client request (a batch of records): counted and sized once, not per record."""
        self.batches_in += 1
        self.records_in += records
        self.records_per_batch.observe(records)
        self.batch_bytes.observe(size_bytes)

    def error(self, err: errors.GregorError) -> None:
        self.errors[err.name] = self.errors.get(err.name, 0) + 1

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("gregor_gateway_records_in", "Records received by the gateway",
                                  value=self.records_in)
        yield CounterMetricFamily("gregor_gateway_batches_in", "Client produce requests (record batches) received",
                                  value=self.batches_in)
        yield CounterMetricFamily("gregor_gateway_records_out",
                                  "Records acknowledged (acks=all) to gateway clients", value=self.records_out)
        errs = CounterMetricFamily("gregor_gateway_record_errors", "Records answered with an error, by Kafka error code",
                                   labels=["code"])
        for code, n in sorted(self.errors.copy().items()):  # dict.copy is atomic: the loop may add codes
            errs.add_metric([code], n)
        yield errs
        yield GaugeMetricFamily("gregor_gateway_buffer_bytes", "Bytes of records waiting in the producer "
                                "(buffer.memory used)", value=self.buffered())
        yield GaugeMetricFamily("gregor_gateway_buffer_memory_bytes", "buffer.memory of the gateway's producer",
                                value=self.buffer_memory)
        yield from self._sender_families()
        for name, doc, hist in (
                ("gregor_gateway_record_latency_seconds", "Time from receiving a record to answering it (ack or error)",
                 self.latency),
                ("gregor_gateway_records_per_batch", "Records per client request", self.records_per_batch),
                ("gregor_gateway_batch_size_bytes", "Client request size in bytes (records' keys, values, headers)",
                 self.batch_bytes)):
            family = HistogramMetricFamily(name, doc, labels=[])
            hist.add_to(family, [])
            yield family

    def _sender_families(self) -> Iterator[Metric]:
        s = self.sender
        yield CounterMetricFamily("gregor_gateway_produce_requests", "Produce requests sent to brokers", value=s.requests)
        yield CounterMetricFamily("gregor_gateway_retries", "Batches re-enqueued after a retriable error "
                                  "(record-retry-rate)", value=s.retries)
        yield CounterMetricFamily("gregor_gateway_produced_record_bytes", "Uncompressed record bytes sent to brokers",
                                  value=s.record_bytes)
        yield CounterMetricFamily("gregor_gateway_produced_wire_bytes", "Encoded (compressed) batch bytes sent "
                                  "to brokers", value=s.wire_bytes)
        ratio = s.wire_bytes / s.record_bytes if s.record_bytes else 1.0
        yield GaugeMetricFamily("gregor_gateway_compression_ratio", "Encoded / uncompressed bytes sent so far "
                                "(compression-rate-avg)", value=ratio)


METRICS = GatewayMetrics()
REGISTRY.register(METRICS)  # type: ignore[arg-type]
IDEMPOTENT = Gauge("gregor_gateway_idempotence_enabled", "1 when the gateway's producer runs with enable.idempotence")

# Kafka's defaults, except: acks is always all; max.block.ms is 0 (a full buffer answers
# THROTTLING_QUOTA_EXCEEDED instead of blocking); unknown topics are looked up once per
# UNKNOWN_TOPIC_CACHE_S instead of waiting for them.
FORCED = {"acks": "all"}
GATEWAY_DEFAULTS: dict[str, Any] = {"max.block.ms": 0}
UNKNOWN_TOPIC_CACHE_S = 1.0

Result = tuple[int, int, int, Optional[errors.GregorError]]  # partition, offset, timestamp, error


def idempotence_supported() -> bool:
    """True when the SDK accepts enable.idempotence=true (the idempotence issue landed)."""
    try:
        producer_config({"enable.idempotence": True})
        return True
    except ConfigError:
        return False


def gateway_producer_config(props: Mapping[str, str], bootstrap: str) -> dict[str, Any]:
    """The producer config of a gateway: user props over gateway defaults, acks=all, idempotence when available."""
    raw: dict[str, Any] = {**GATEWAY_DEFAULTS, **props, "bootstrap.servers": bootstrap}
    acks = str(raw.get("acks", "all"))
    if acks not in ("all", "-1"):
        raise ConfigError(f"the gateway always produces with acks=all; got acks={acks}")
    raw.update(FORCED)
    if "enable.idempotence" not in props and idempotence_supported():
        raw["enable.idempotence"] = True
    return producer_config(raw)


class InRecord(NamedTuple):
    """One record as a client sent it (proto-free; a NamedTuple: built once per record, cheaper than a
    frozen dataclass)."""

    topic: str
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Sequence[tuple[str, bytes]]
    partition: Optional[int]
    timestamp_ms: Optional[int]


class ProducerGateway:
    """The gateway's domain (event-loop owned): validate, admit against buffer.memory, hand to the producer."""

    def __init__(self, bootstrap: str, props: Mapping[str, str] | None = None) -> None:
        self.config = gateway_producer_config(props or {}, bootstrap)
        self.producer = Producer(self.config)
        self.buffer_memory = int(self.config["buffer.memory"])
        self.max_request_size = int(self.config["max.request.size"])
        self._unknown: dict[str, float] = {}  # topic -> monotonic time it was last found missing
        METRICS.buffer_memory = self.buffer_memory
        METRICS.buffered = self.buffered_bytes
        IDEMPOTENT.set(1 if self.config.get("enable.idempotence") else 0)

    async def start(self) -> None:
        await self.producer.start()
        METRICS.sender = self.producer.sender_stats
        try:
            await self.producer.metadata.refresh()
        except errors.GregorError as exc:  # brokers may come later; records will say so
            log.warning("no broker answered at start: %s", exc)

    async def close(self, timeout: Optional[float] = None) -> None:
        await self.producer.close(timeout)

    def buffered_bytes(self) -> int:
        return self.producer.buffered_bytes()

    def free_bytes(self) -> int:
        return self.buffer_memory - self.buffered_bytes()

    # ------------------------------------------------------------ admission
    async def check_topic(self, topic: str) -> None:
        """UNKNOWN_TOPIC_OR_PARTITION unless topic has partitions (one coalesced metadata lookup at most)."""
        if not topic:
            raise errors.InvalidTopicExceptionError("topic name is empty")  # type: ignore[attr-defined]
        md = self.producer.metadata
        if md.partitions_for(topic):
            return
        missed = self._unknown.get(topic)
        if missed is None or time.monotonic() - missed >= UNKNOWN_TOPIC_CACHE_S:
            md.add_topics(topic)
            try:
                await md.refresh([topic])
            except errors.GregorError as exc:
                raise errors.error_for(exc.code, f"cannot look up topic {topic!r}: {exc.message}", topic=topic)
            if md.partitions_for(topic):
                self._unknown.pop(topic, None)
                return
            self._unknown[topic] = time.monotonic()
        info = md.topics.get(topic)
        code = info.error if info is not None and info.error else errors.Code.UNKNOWN_TOPIC_OR_PARTITION
        raise errors.error_for(code, f"This server does not host this topic-partition: unknown topic {topic!r}",
                               topic=topic)

    @staticmethod
    def size_of(rec: InRecord) -> int:
        return record_size(rec.key, rec.value, rec.headers)

    def throttled(self, size: int) -> Optional[errors.GregorError]:
        """THROTTLING_QUOTA_EXCEEDED when buffer.memory has no room for size bytes (records larger than
        buffer.memory itself are left to send(), which answers MESSAGE_TOO_LARGE)."""
        if size <= self.buffer_memory and self.buffered_bytes() + size > self.buffer_memory:
            return errors.ThrottlingQuotaExceededError(  # type: ignore[attr-defined]
                f"gateway buffer.memory is full ({self.buffered_bytes()} of {self.buffer_memory} bytes in use, "
                f"record needs {size}): retry later or on another gateway")
        return None

    async def send(self, rec: InRecord, on_done: Callable[[Result], None]) -> None:
        """Hand one record to the producer; on_done gets (partition, offset, timestamp, error) exactly once.

        Never raises for a bad record: validation errors, unknown topics and a full
        buffer come back through on_done like delivery errors do.
        """
        metrics = METRICS
        metrics.records_in += 1
        start = time.perf_counter()

        def finish(result: Result) -> None:
            metrics.observe(time.perf_counter() - start)
            err = result[3]
            if err is None:
                metrics.records_out += 1
            else:
                metrics.error(err)
            on_done(result)

        part = rec.partition if rec.partition is not None else -1
        try:
            if not self.producer.metadata.partitions_for(rec.topic):
                await self.check_topic(rec.topic)
            throttle = self.throttled(self.size_of(rec))
            if throttle is not None:
                throttle.topic, throttle.partition = rec.topic, part
                raise throttle
            handle = await self.producer.send(rec.topic, rec.value, key=rec.key, headers=list(rec.headers) or None,
                                              partition=rec.partition, timestamp_ms=rec.timestamp_ms)
        except Exception as exc:  # every failure is this record's answer, never the stream's
            finish((part, -1, -1, as_gregor_error(exc, rec.topic, part)))
            return

        def done(md: Optional[RecordMetadata], exc: Optional[BaseException]) -> None:
            if md is not None:
                finish((md.partition, md.offset, md.timestamp, None))
            else:
                finish((handle.batch.partition, -1, -1, as_gregor_error(exc, rec.topic, handle.batch.partition)))

        handle.add_done_callback(done)


    async def send_many(self, records: Sequence[InRecord],
                        on_done: Callable[[list[tuple[int, Result]]], None], size_bytes: int = 0) -> None:
        """Hand records to the producer without waiting; on_done gets lists of (index, result), every
        index exactly once: one call for the records refused before sending (at once), then one per
        produce batch the others went into, when that batch completes.

        The ProduceStreamBatch path: like send_all it watches each produce batch's future once
        (seed 003: one future per RecordBatch) instead of running a callback per record.
        """
        metrics = METRICS
        metrics.batch_in(len(records), size_bytes)
        start = time.perf_counter()
        refused: list[tuple[int, Result]] = []
        groups: dict[int, list[tuple[int, FutureRecordMetadata]]] = {}
        partitions_for, send = self.producer.metadata.partitions_for, self.producer.send
        for i, rec in enumerate(records):
            part = rec.partition if rec.partition is not None else -1
            try:
                if not partitions_for(rec.topic):
                    await self.check_topic(rec.topic)
                throttle = self.throttled(self.size_of(rec))
                if throttle is not None:
                    throttle.topic, throttle.partition = rec.topic, part
                    raise throttle
                handle = await send(rec.topic, rec.value, key=rec.key, headers=rec.headers or None,
                                    partition=rec.partition, timestamp_ms=rec.timestamp_ms)
            except Exception as exc:  # this record's answer, never the stream's
                refused.append((i, (part, -1, -1, as_gregor_error(exc, rec.topic, part))))
                continue
            members = groups.get(id(handle.batch))
            if members is None:
                members = groups[id(handle.batch)] = []
                handle.batch.future.add_done_callback(functools.partial(self._batch_done, records, members,
                                                                        start, on_done))
            members.append((i, handle))
        if refused:
            for _, (_, _, _, err) in refused:
                if err is not None:
                    metrics.error(err)
            metrics.observe(time.perf_counter() - start, len(refused))
            on_done(refused)

    @staticmethod
    def _batch_done(records: Sequence[InRecord], members: list[tuple[int, FutureRecordMetadata]], start: float,
                    on_done: Callable[[list[tuple[int, Result]]], None], future: "asyncio.Future[int]") -> None:
        metrics = METRICS
        failure = None if future.cancelled() else future.exception()
        out: list[tuple[int, Result]] = []
        if failure is None and not future.cancelled():
            for i, handle in members:
                md = handle.result()
                out.append((i, (md.partition, md.offset, md.timestamp, None)))
            metrics.records_out += len(out)
        else:
            for i, handle in members:
                part = handle.batch.partition
                err = as_gregor_error(failure or asyncio.CancelledError(), records[i].topic, part)
                metrics.error(err)
                out.append((i, (part, -1, -1, err)))
        metrics.observe(time.perf_counter() - start, len(out))
        on_done(out)

    async def send_all(self, records: Sequence[InRecord], timeout: Optional[float],
                       size_bytes: int = 0) -> list[Result]:
        """Hand records to the producer and wait (up to timeout seconds) for all of them: one result each, in order.

        The unary path: it waits on each produce batch's future once instead of running a
        callback per record. Records still unacknowledged at the timeout get REQUEST_TIMED_OUT
        (they stay in the producer and may still be written).
        """
        metrics = METRICS
        metrics.batch_in(len(records), size_bytes)
        start = time.perf_counter()
        out: list[Optional[Result]] = [None] * len(records)
        pending: list[tuple[int, FutureRecordMetadata]] = []
        partitions_for, send = self.producer.metadata.partitions_for, self.producer.send
        for i, rec in enumerate(records):
            try:
                if not partitions_for(rec.topic):
                    await self.check_topic(rec.topic)
                throttle = self.throttled(self.size_of(rec))
                if throttle is not None:
                    raise throttle
                pending.append((i, await send(rec.topic, rec.value, key=rec.key, headers=rec.headers or None,
                                              partition=rec.partition, timestamp_ms=rec.timestamp_ms)))
            except Exception as exc:  # this record's answer, never the request's
                part = rec.partition if rec.partition is not None else -1
                out[i] = (part, -1, -1, as_gregor_error(exc, rec.topic, part))
        futures = {id(h.batch): h.batch.future for _, h in pending}
        if futures:
            await asyncio.wait(list(futures.values()), timeout=timeout)
        for i, handle in pending:
            rec, part = records[i], handle.batch.partition
            if not handle.done():
                out[i] = (part, -1, -1, errors.RequestTimedOutError(  # type: ignore[attr-defined]
                    "not acknowledged before the request deadline; the record may still be written",
                    topic=rec.topic, partition=part))
                continue
            failure = handle.exception()
            if failure is not None:
                out[i] = (part, -1, -1, as_gregor_error(failure, rec.topic, part))
            else:
                md = handle.result()
                out[i] = (md.partition, md.offset, md.timestamp, None)
        results: list[Result] = [r for r in out if r is not None]
        failed = [r[3] for r in results if r[3] is not None]
        for err in failed:
            metrics.error(err)
        metrics.records_out += len(results) - len(failed)
        metrics.observe(time.perf_counter() - start, len(results))
        return results


def as_gregor_error(exc: BaseException | None, topic: str, partition: int) -> errors.GregorError:
    """Any failure as a typed GregorError with its topic and partition filled in."""
    if isinstance(exc, errors.GregorError):
        err = exc
    elif isinstance(exc, asyncio.TimeoutError):
        err = errors.RequestTimedOutError("timed out")  # type: ignore[attr-defined]
    else:
        err = errors.GregorError(f"{type(exc).__name__}: {exc}")
    if not err.topic:
        err.topic, err.partition = topic, partition
    return err
