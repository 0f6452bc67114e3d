"""`gregor perf produce|consume|e2e`: kafka-producer-perf-test, kafka-consumer-perf-test and EndToEndLatency,
with their flags and output (seed 003, 6.10)."""

from __future__ import annotations

import asyncio
import bisect
import functools
import gc
import itertools
import operator
import os
import random
import re
import time
from datetime import datetime
from typing import Any, Optional

import click

from gregor.common.tls import from_client_config
from gregor.cli.common import (
    VariadicCommand, VariadicOption, emit_json, load_properties_file, obj, parse_kv, run,
)
from gregor.cli.perf_metrics import ConsumerPerfMetrics, ProducerPerfMetrics, metrics_lines
from gregor.client.accumulator import ProducerBatch, record_size
from gregor.client.admin import AdminClient
from gregor.client.config import ConfigError, consumer_config, producer_config
from gregor.client.consumer import Consumer
from gregor.client.group_membership import ConsumerRebalanceListener
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.common.memory import tune_allocator

REPORT_INTERVAL_S = 5.0  # ProducerPerformance's reportingInterval
PERF_GC_YOUNG_OBJECTS = 50_000  # gc generation-0 threshold during `perf produce` (default 700); see _perf_produce
# A ProducerBatch record is (key, value, headers, timestamp - batch.base_timestamp).
_VALUE, _TIMESTAMP_DELTA = operator.itemgetter(1), operator.itemgetter(3)
PRODUCER_CLIENT_ID = "perf-producer-client"  # ProducerPerformance's client.id unless one is given
CONSUMER_CLIENT_ID = "perf-consumer-client"  # ConsumerPerformance's
THREADS_WARNING = ("WARNING: option [threads] and [num-fetch-threads] have been deprecated and will be ignored "
                   "by the test")


@click.group()
def perf() -> None:
    """Performance tools with the flags and output of Kafka's perf tests."""


class Stats:
    """ProducerPerformance.Stats: windowed progress lines and the final summary (latencies in ms).

    Latencies are kept as a histogram (latency -> records): the percentiles are exact over every
    record (Kafka samples at most 500,000 of them), in memory and time per distinct latency.
    """

    def __init__(self, num_records: int, echo: bool, interval_s: float = REPORT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.start = time.monotonic()
        self.window_start = self.start
        self.histogram: dict[int, int] = {}
        self.count = self.bytes = self.max_latency = self.total_latency = 0
        self.w_count = self.w_bytes = self.w_max = self.w_total = 0
        self.echo = echo

    def record(self, latency_ms: int, size: int, now: float) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency += latency_ms
        self.max_latency = max(self.max_latency, latency_ms)
        self.histogram[latency_ms] = self.histogram.get(latency_ms, 0) + 1
        self.w_count += 1
        self.w_bytes += size
        self.w_total += latency_ms
        self.w_max = max(self.w_max, latency_ms)
        if now - self.window_start >= self.interval_s:
            self.print_window(now)

    def record_counts(self, latency_counts: dict[int, int], nbytes: int, now: float) -> None:
        """record() for records acknowledged together (one produce batch), grouped by latency
        (latency -> how many records had it); nbytes is their total payload size."""
        if not latency_counts:
            return
        n = total = 0
        histogram = self.histogram
        for latency, records in latency_counts.items():
            n += records
            total += latency * records
            histogram[latency] = histogram.get(latency, 0) + records
        top = max(latency_counts)
        self.count += n
        self.bytes += nbytes
        self.total_latency += total
        self.max_latency = max(self.max_latency, top)
        self.w_count += n
        self.w_bytes += nbytes
        self.w_total += total
        self.w_max = max(self.w_max, top)
        if now - self.window_start >= self.interval_s:
            self.print_window(now)

    def print_window(self, now: float) -> None:
        elapsed = now - self.window_start
        if self.echo and self.w_count:
            rate = self.w_count / elapsed
            click.echo(f"{self.w_count} records sent, {rate:.1f} records/sec ({self.w_bytes / elapsed / 1048576:.2f} "
                       f"MB/sec), {self.w_total / self.w_count:.1f} ms avg latency, {float(self.w_max):.1f} ms max "
                       f"latency.")
        self.window_start = now
        self.w_count = self.w_bytes = self.w_max = self.w_total = 0

    def percentiles(self, ps: list[float]) -> list[int]:
        """Kafka's Stats.percentiles: the latency at index int(p * records) of the sorted latencies."""
        items = sorted(self.histogram.items())
        if not items:
            return [0 for _ in ps]
        records_up_to = list(itertools.accumulate(records for _, records in items))
        n = records_up_to[-1]
        # The latency at sorted index i is the first one whose cumulative count exceeds i.
        return [items[bisect.bisect_right(records_up_to, int(p * n))][0] for p in ps]

    def summary(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        p50, p95, p99, p999 = self.percentiles([0.5, 0.95, 0.99, 0.999])
        return {"records": self.count, "records_per_sec": self.count / elapsed,
                "mb_per_sec": self.bytes / elapsed / 1048576,
                "avg_latency_ms": self.total_latency / self.count if self.count else 0.0,
                "max_latency_ms": float(self.max_latency), "p50_ms": p50, "p95_ms": p95,
                "p99_ms": p99, "p999_ms": p999}


def summary_line(s: dict[str, Any]) -> str:
    """Kafka's final line, e.g. '100000 records sent, 26723.677178 records/sec (26.10 MB/sec), ...'."""
    return (f"{s['records']} records sent, {s['records_per_sec']:f} records/sec ({s['mb_per_sec']:.2f} MB/sec), "
            f"{s['avg_latency_ms']:.2f} ms avg latency, {s['max_latency_ms']:.2f} ms max latency, "
            f"{s['p50_ms']} ms 50th, {s['p95_ms']} ms 95th, {s['p99_ms']} ms 99th, {s['p999_ms']} ms 99.9th.")


# ---------------------------------------------------------------- payloads (--record-size / --payload-file)
PAYLOAD_DELIMITER_DEFAULT = "\\n"  # shown escaped in --help, as Kafka's; means a newline


def read_payload_file(path: str, delimiter: str) -> list[bytes]:
    """ProducerPerformance.readPayloadFile: the UTF-8 text of path split like java.util.Scanner with the
    delimiter as a regular expression ("\\n", the default, is a newline)."""
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        raise click.BadParameter("File does not exist or empty file provided.", param_hint="--payload-file")
    pattern = "\n" if delimiter == PAYLOAD_DELIMITER_DEFAULT else delimiter
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise click.BadParameter(f"{delimiter!r} is not a valid regular expression: {exc}",
                                 param_hint="--payload-delimiter") from None
    if regex.fullmatch(""):
        raise click.BadParameter(f"{delimiter!r} matches the empty string", param_hint="--payload-delimiter")
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    return [token.encode("utf-8") for token in scanner_tokens(text, regex)]


def scanner_tokens(text: str, delimiter: "re.Pattern[str]") -> list[str]:
    """java.util.Scanner's tokens with a custom delimiter: one delimiter match before a token is skipped,
    two delimiters in a row give an empty token, a trailing delimiter gives none."""
    out: list[str] = []
    pos, end = 0, len(text)
    while True:
        skip = delimiter.match(text, pos)
        if skip is not None:
            pos = skip.end()
        if pos >= end:
            return out
        nxt = delimiter.search(text, pos)
        stop = nxt.start() if nxt is not None else end
        out.append(text[pos:stop])
        pos = stop


def perf_payloads(record_size: Optional[int], payload_file: Optional[str], delimiter: str,
                  echo: Any) -> list[bytes]:
    """The payloads to send: one of --record-size random uppercase letters (reused for every record, as
    Kafka's tool did until 3.x), or the payloads of --payload-file, one picked at random per record."""
    if (record_size is None) == (payload_file is None):
        raise click.UsageError("either --record-size or --payload-file must be specified but not both.")
    if record_size is not None:
        if record_size <= 0:
            raise click.UsageError("--record-size should be greater than zero")
        rng = random.Random()
        return [bytes(rng.randrange(65, 91) for _ in range(record_size))]
    assert payload_file is not None
    echo(f"Reading payloads from: {os.path.abspath(payload_file)}")
    payloads = read_payload_file(payload_file, delimiter)
    echo(f"Number of messages read: {len(payloads)}")
    if not payloads:
        raise click.BadParameter(f"{payload_file} holds no payload between the delimiters",
                                 param_hint="--payload-file")
    return payloads


# ---------------------------------------------------------------- perf produce
def batch_latency_counts(batch: ProducerBatch, ack_ms: int) -> dict[int, int]:
    """Kafka's PerfCallback latency (ack time - send time, wall-clock ms) of each record of an acknowledged
    batch, as latency -> records. A record's send time is the timestamp send() gave it."""
    ack = ack_ms - batch.base_timestamp
    records = batch.records
    # The usual batch: every record sent within its first millisecond (no later timestamp, none earlier).
    if batch.max_timestamp == batch.base_timestamp and min(map(_TIMESTAMP_DELTA, records)) == 0:
        return {ack: len(records)}
    deltas = list(map(_TIMESTAMP_DELTA, records))
    first = min(deltas)
    if first == max(deltas):  # one millisecond, but not the first record's (the clock stepped back)
        return {ack - first: len(deltas)}
    counts: dict[int, int] = {}
    for delta in deltas:
        counts[ack - delta] = counts.get(ack - delta, 0) + 1
    return counts


async def _perf_produce(config: dict[str, Any], topic: str, num_records: int, payloads: list[bytes],
                        throughput: float, echo: bool, print_metrics: bool,
                        interval_s: float = REPORT_INTERVAL_S) -> dict[str, Any]:
    async with AdminClient({"bootstrap.servers": config["bootstrap.servers"]}) as admin:
        await admin.describe_topics([topic])
    fixed_size = len(payloads[0]) if len(payloads) == 1 else None
    stats = Stats(num_records, echo, interval_s)
    metrics = (ProducerPerfMetrics(str(config["client.id"]), topic,
                                   record_size(None, payloads[0], ()) if fixed_size is not None else None)
               if print_metrics else None)
    failures: list[BaseException] = []
    failed = 0
    monotonic, wall = time.monotonic, time.time
    # Per-record latency as Kafka's PerfCallback measures it: ack time - send time, both wall-clock
    # ms (System.currentTimeMillis). The send time of a record is the timestamp the producer gave it
    # in send() (Kafka's tool reads the same clock just before send()), so nothing is kept per record:
    # one callback per produce batch groups its records by timestamp when the batch is acknowledged.
    watched: set[ProducerBatch] = set()

    def batch_done(batch: ProducerBatch, fut: "asyncio.Future[int]") -> None:
        nonlocal failed
        watched.discard(batch)
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if metrics is not None:
            metrics.on_batch(batch, exc is not None)
        records = batch.records
        if exc is not None:
            failed += len(records)
            failures.append(exc)
            return
        # --payload-file: the batch's records are this run's payloads, in send order
        nbytes = len(records) * fixed_size if fixed_size is not None else sum(map(len, map(_VALUE, records)))
        stats.record_counts(batch_latency_counts(batch, int(wall() * 1000)), nbytes, monotonic())

    # Kafka picks a payload of --payload-file at random for each record (seeded, as its SplittableRandom(0)).
    pick = random.Random(0).randrange
    count = len(payloads)
    payload = payloads[0]
    async with Producer(config) as producer:
        send = producer.send
        await producer.partitions_for(topic)  # metadata before the clock starts, as Kafka's first send
        # Everything alive now (modules, the producer) stays for the whole run: keep the cyclic GC from
        # re-walking it in every collection the run's allocations trigger.
        gc.freeze()
        # The run keeps up to buffer.memory of records alive (32k of 1 KiB): with the default young
        # generation (700 objects) each record tuple is scanned while alive and its batch's objects are
        # rescanned by the older generations; a young generation of PERF_GC_YOUNG_OBJECTS lets most die unscanned.
        gc_threshold = gc.get_threshold()
        gc.set_threshold(PERF_GC_YOUNG_OBJECTS, *gc_threshold[1:])
        try:
            start = monotonic()
            current: Optional[ProducerBatch] = None
            for i in range(num_records):
                if count > 1:
                    payload = payloads[pick(count)]
                batch = (await send(topic, payload)).batch
                if batch is not current:
                    current = batch
                    if batch not in watched:
                        watched.add(batch)
                        batch.future.add_done_callback(functools.partial(batch_done, batch))
                if throughput > 0:
                    # ThroughputThrottler: sleep whenever we are ahead of the target rate.
                    ahead = (i + 1) / throughput - (monotonic() - start)
                    if ahead > 0.002:
                        await asyncio.sleep(ahead)
            await producer.flush()
        finally:
            gc.set_threshold(*gc_threshold)
        await asyncio.sleep(0)  # let the last batches' callbacks run
        snapshot: dict[str, float] = {}
        if metrics is not None:
            # Kafka flushes, prints the summary and then the metrics before closing the producer.
            buffer_total = int(producer.config["buffer.memory"])
            snapshot = metrics.snapshot(monotonic() - start, buffer_total, buffer_total - producer.buffered_bytes())
    stats.print_window(monotonic())
    if failures:
        raise click.ClickException(f"{failed} record(s) failed, first: {failures[0]}")
    summary = stats.summary()
    if metrics is not None:
        summary["metrics"] = snapshot
    return summary


def _producer_config(ctx: click.Context, producer_props: tuple[str, ...],
                     producer_config_file: Optional[str]) -> dict[str, Any]:
    """ProducerPerformance.readProps: --producer.config, then --producer-props over it; client.id defaults
    to perf-producer-client."""
    config: dict[str, Any] = {"bootstrap.servers": obj(ctx).bootstrap()}
    if producer_config_file:
        config.update(load_properties_file(producer_config_file, "--producer.config"))
    config.update(parse_kv(producer_props, "--producer-props"))
    if not config.get("client.id"):
        config["client.id"] = PRODUCER_CLIENT_ID
    try:
        producer_config(config)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--producer-props/--producer.config") from None
    return config


@perf.command("produce", cls=VariadicCommand)
@click.option("--topic", required=True, help="produce messages to this topic")
@click.option("--num-records", type=int, required=True, help="number of messages to produce")
@click.option("--record-size", type=int, help="message size in bytes (exactly one of --record-size or "
                                               "--payload-file)")
@click.option("--payload-file", metavar="PAYLOAD-FILE",
              help="UTF-8 text file of payloads; one is picked at random for each record")
@click.option("--payload-delimiter", default=PAYLOAD_DELIMITER_DEFAULT, show_default=True,
              help="regular expression between the payloads of --payload-file (default: a newline)")
@click.option("--throughput", type=float, required=True, help="records/sec cap; -1 for none")
@click.option("--producer-props", cls=VariadicOption, metavar="KEY=VALUE ...",
              help="producer configs, space separated after one flag (Kafka style) or repeated; "
                   "they take precedence over --producer.config")
@click.option("--producer.config", "producer_config_file", metavar="CONFIG-FILE",
              help="producer config properties file")
@click.option("--print-metrics", is_flag=True, help="print out metrics at the end of the test")
@click.option("--reporting-interval", "reporting_interval_ms", type=int, default=int(REPORT_INTERVAL_S * 1000),
              show_default=True, metavar="INTERVAL-MS", help="interval in milliseconds between progress lines")
@click.option("--gateway", metavar="HOST:PORT[,...]",
              help="produce through these producer gateways (ProduceStream) instead of the SDK producer")
@click.option("--via-gateway", is_flag=True, help="produce through the gateways listed in DATA_DIR/cluster.json")
@click.pass_context
def perf_produce(ctx: click.Context, topic: str, num_records: int, record_size: Optional[int],
                 payload_file: Optional[str], payload_delimiter: str, throughput: float,
                 producer_props: tuple[str, ...], producer_config_file: Optional[str] = None,
                 print_metrics: bool = False, reporting_interval_ms: int = int(REPORT_INTERVAL_S * 1000),
                 gateway: Optional[str] = None, via_gateway: bool = False) -> None:
    """Produce NUM_RECORDS records and report throughput and latency percentiles (kafka-producer-perf-test)."""
    if num_records <= 0:
        raise click.UsageError("--num-records should be greater than zero")
    if reporting_interval_ms <= 0:
        raise click.BadParameter("Reporting interval must be greater than 0.", param_hint="--reporting-interval")
    as_json = obj(ctx).json
    echo = functools.partial(click.echo, err=as_json)  # Kafka's informational lines; stderr under --output json
    payloads = perf_payloads(record_size, payload_file, payload_delimiter, echo)
    if gateway or via_gateway:
        ignored = [flag for flag, given in (("--producer-props", producer_props),
                                            ("--producer.config", producer_config_file),
                                            ("--print-metrics", print_metrics)) if given]
        if ignored:
            click.echo(f"WARNING: {', '.join(ignored)} ignored with a gateway: the gateway's producer config "
                       "applies (gregor cluster up --gateway-property) and its metrics are on its /metrics",
                       err=True)
        _perf_produce_via_gateway(ctx, gateway, topic, num_records, payloads, throughput)
        return
    config = _producer_config(ctx, producer_props, producer_config_file)
    tune_allocator()  # multi-MiB produce requests: keep them off fresh mmaps (page faults)
    summary = run(_perf_produce(config, topic, num_records, payloads, throughput, echo=not as_json,
                                print_metrics=print_metrics, interval_s=reporting_interval_ms / 1000))
    if as_json:
        emit_json(summary)
        return
    click.echo(summary_line(summary))
    for line in metrics_lines(summary.get("metrics", {})):
        click.echo(line)


# ---------------------------------------------------------------- perf consume
CONSUMER_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                   "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
DETAILED_HEADER = ("time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                   "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
POLL_MS = 100  # ConsumerPerformance polls with Duration.ofMillis(100)
MB = 1024 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


def _kafka_time(t: float) -> str:
    """Kafka's default --date-format yyyy-MM-dd HH:mm:ss:SSS (t in seconds)."""
    d = datetime.fromtimestamp(t)
    return d.strftime("%Y-%m-%d %H:%M:%S:") + f"{d.microsecond // 1000:03d}"


def consumer_row(r: dict[str, Any]) -> str:
    return (f"{_kafka_time(r['start'])}, {_kafka_time(r['end'])}, {r['mb']:.4f}, {r['mb_sec']:.4f}, {r['messages']}, "
            f"{r['msg_sec']:.4f}, {r['rebalance_ms']}, {r['fetch_ms']}, {r['fetch_mb_sec']:.4f}, "
            f"{r['fetch_msg_sec']:.4f}")


def progress(bytes_read: int, last_bytes: int, messages: int, last_messages: int, start_ms: int, end_ms: int,
             join_ms_in_round: int) -> dict[str, Any]:
    """ConsumerPerformance.printConsumerProgress's figures for one reporting interval (thread id 0)."""
    elapsed_ms = max(end_ms - start_ms, 1)
    interval_mb = (bytes_read - last_bytes) / MB
    fetch_ms = end_ms - start_ms - join_ms_in_round
    return {"time": end_ms / 1000, "thread_id": 0, "mb": bytes_read / MB, "mb_sec": 1000.0 * interval_mb / elapsed_ms,
            "messages": messages, "msg_sec": (messages - last_messages) / elapsed_ms * 1000.0,
            "rebalance_ms": join_ms_in_round, "fetch_ms": fetch_ms,
            "fetch_mb_sec": 1000.0 * interval_mb / fetch_ms if fetch_ms > 0 else 0.0,
            "fetch_msg_sec": 1000.0 * (messages - last_messages) / fetch_ms if fetch_ms > 0 else 0.0}


def progress_row(r: dict[str, Any]) -> str:
    """One --show-detailed-stats line: printBasicProgress then printExtendedProgress."""
    return (f"{_kafka_time(r['time'])}, {r['thread_id']}, {r['mb']:.4f}, {r['mb_sec']:.4f}, {r['messages']}, "
            f"{r['msg_sec']:.4f}, {r['rebalance_ms']}, {r['fetch_ms']}, {r['fetch_mb_sec']:.4f}, "
            f"{r['fetch_msg_sec']:.4f}")


class ConsumerPerfRebListener(ConsumerRebalanceListener):
    """ConsumerPerformance's ConsumerPerfRebListener: the time from having no partition (the start, or the
    revocation of the last one) to getting partitions; rebalance.time.ms is its total, and each detailed
    line shows what accrued in its interval. Runs on the consumer's event loop."""

    def __init__(self, start_ms: int) -> None:
        self.join_start_ms = start_ms
        self.join_ms = self.join_ms_in_round = self.join_ms_max = 0
        self.rebalances = 0
        self.assigned: set[tuple[str, int]] = set()

    def on_partitions_revoked(self, partitions: list[tuple[str, int]]) -> None:
        self.assigned.difference_update(partitions)
        if not self.assigned:
            self.join_start_ms = _now_ms()

    def on_partitions_assigned(self, partitions: list[tuple[str, int]]) -> None:
        if not self.assigned:
            elapsed = _now_ms() - self.join_start_ms
            self.join_ms += elapsed
            self.join_ms_in_round += elapsed
            self.join_ms_max = max(self.join_ms_max, elapsed)
            self.rebalances += 1
        self.assigned.update(partitions)


async def _coordinator_error(config: dict[str, Any]) -> Optional[str]:
    """None when a group coordinator answers FindCoordinator for config's group.id, else why not."""
    from gregor.client.config import parse_bootstrap
    from gregor.client.group_membership import find_coordinator
    from gregor.client.metadata import ClusterMetadata

    metadata = ClusterMetadata(parse_bootstrap(config["bootstrap.servers"]),
                               request_timeout_ms=int(config.get("request.timeout.ms", 30000)),
                               security=from_client_config(config), client_id=str(config.get("client.id") or ""))
    overrides = [a.strip() for a in str(config.get("coordinator.bootstrap.servers", "")).split(",") if a.strip()]
    try:
        await find_coordinator(metadata, str(config["group.id"]), overrides, 10.0)
        return None
    except errors.GregorError as exc:
        return exc.message
    finally:
        await metadata.close()


async def _perf_consume(config: dict[str, Any], topic: str, messages: int, timeout_ms: int, *, group_given: bool,
                        from_latest: bool, reporting_interval_ms: int, on_progress: Optional[Any],
                        print_metrics: bool) -> dict[str, Any]:
    """ConsumerPerformance: subscribe with the group (so rebalance.time.ms is the real join) and poll until
    `messages` records or `timeout_ms` without one. Without --group and without a group coordinator
    (a standalone broker) it assigns every partition instead, with no group."""
    if not group_given:
        why = await _coordinator_error(config)
        if why is not None:
            click.echo(f"WARNING: {why}: consuming every partition by assignment, without a group", err=True)
            config = {k: v for k, v in config.items() if k != "group.id"}
    subscribe = bool(config.get("group.id"))
    start_ms = _now_ms()
    timer = ConsumerPerfRebListener(start_ms)
    metrics = ConsumerPerfMetrics(str(config["client.id"]), topic) if print_metrics else None
    read = nbytes = last_read = last_bytes = 0
    async with Consumer(config) as consumer:
        if subscribe:
            consumer.subscribe([topic], listener=timer)
        else:
            async with AdminClient({"bootstrap.servers": config["bootstrap.servers"]}) as admin:
                info = (await admin.describe_topics([topic]))[topic]
            tps = [(topic, p.partition) for p in info.partitions]
            consumer.assign(tps)
            (consumer.seek_to_end if from_latest else consumer.seek_to_beginning)(*tps)
            timer.on_partitions_assigned(tps)  # the "rebalance": looking the topic up and assigning it
        current = last_report = last_consumed = _now_ms()
        while read < messages and current - last_consumed <= timeout_ms:
            records = await consumer.poll(POLL_MS, min(messages - read, consumer.max_poll_records))
            current = _now_ms()
            if not records:
                continue
            last_consumed = current
            if current - last_report >= reporting_interval_ms:
                # Kafka checks per record with the time of the poll: the first record of this poll
                # closes the interval.
                first = records[0]
                at_read, at_bytes = read + 1, nbytes + len(first[4] or b"") + len(first[5] or b"")
                if on_progress is not None:
                    on_progress(progress(at_bytes, last_bytes, at_read, last_read, last_report, current,
                                         timer.join_ms_in_round))
                timer.join_ms_in_round = 0
                last_report, last_read, last_bytes = current, at_read, at_bytes
            read += len(records)
            nbytes += sum([len(r[5] or b"") + len(r[4] or b"") for r in records])  # value + key
            if metrics is not None:
                metrics.on_records(consumer, records)
        end_ms = _now_ms()
        snapshot = (metrics.snapshot((end_ms - start_ms) / 1000, read, nbytes, len(consumer.assignment()),
                                     timer if subscribe else None) if metrics is not None else None)
    elapsed_s = max((end_ms - start_ms) / 1000, 1e-9)
    fetch_ms = end_ms - start_ms - timer.join_ms
    fetch_s = max(fetch_ms / 1000, 1e-9)
    mb = nbytes / MB
    result: dict[str, Any] = {
        "start": start_ms / 1000, "end": end_ms / 1000, "mb": mb, "mb_sec": mb / elapsed_s, "messages": read,
        "msg_sec": read / elapsed_s, "rebalance_ms": timer.join_ms, "fetch_ms": fetch_ms,
        "fetch_mb_sec": mb / fetch_s, "fetch_msg_sec": read / fetch_s, "group": config.get("group.id") or None}
    if snapshot is not None:
        result["metrics"] = snapshot
    return result


def _consumer_config(ctx: click.Context, group: Optional[str], from_latest: bool, fetch_size: int,
                     consumer_props: tuple[str, ...],
                     consumer_config_file: Optional[str]) -> tuple[dict[str, Any], bool]:
    """ConsumerPerfOptions.props: --consumer.config, then the tool's settings, then --consumer-props.

    Returns (config, whether the group was given): --group, else a group.id of --consumer-props or of
    the file, else Kafka's default perf-consumer-<random>.
    """
    from gregor.cli.consume import coordinator_servers

    config: dict[str, Any] = {}
    if consumer_config_file:
        config.update(load_properties_file(consumer_config_file, "--consumer.config"))
    file_group = config.get("group.id")
    config.update({"bootstrap.servers": obj(ctx).bootstrap(), "max.partition.fetch.bytes": fetch_size,
                   "auto.offset.reset": "latest" if from_latest else "earliest", "check.crcs": "false"})
    props = parse_kv(consumer_props, "--consumer-props")
    config.update(props)
    given = group or props.get("group.id") or file_group
    if group is not None and not group.strip():
        raise click.BadParameter("must not be empty", param_hint="--group")
    config["group.id"] = given or f"perf-consumer-{random.randrange(100_000)}"
    if not config.get("client.id"):
        config["client.id"] = CONSUMER_CLIENT_ID
    if not config.get("coordinator.bootstrap.servers") and coordinator_servers(ctx):
        config["coordinator.bootstrap.servers"] = coordinator_servers(ctx)
    try:
        consumer_config(config)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--consumer-props/--consumer.config") from None
    return config, bool(given)


@perf.command("consume", cls=VariadicCommand)
@click.option("--topic", required=True, help="the topic to consume from")
@click.option("--messages", type=int, required=True, help="the number of messages to consume")
@click.option("--group", help="the group id to consume on (default: perf-consumer-<random>)")
@click.option("--from-latest", is_flag=True,
              help="without a committed offset, start with the latest message rather than the earliest")
@click.option("--fetch-size", type=int, default=1048576, show_default=True,
              help="the amount of data to fetch in a single request (max.partition.fetch.bytes)")
@click.option("--timeout", "timeout_ms", type=int, default=10000, show_default=True,
              help="the maximum allowed time in milliseconds between returned records")
@click.option("--show-detailed-stats", is_flag=True,
              help="report stats for each reporting interval as configured by --reporting-interval")
@click.option("--reporting-interval", "reporting_interval_ms", type=int, default=5000, show_default=True,
              help="interval in milliseconds at which to print progress info")
@click.option("--print-metrics", is_flag=True, help="print out the metrics")
@click.option("--consumer.config", "consumer_config_file", metavar="CONFIG-FILE",
              help="consumer config properties file")
@click.option("--threads", type=int, help="DEPRECATED AND IGNORED: number of processing threads")
@click.option("--num-fetch-threads", type=int, help="DEPRECATED AND IGNORED: number of fetcher threads")
@click.option("--hide-header", is_flag=True, help="skip printing the header for the stats")
@click.option("--consumer-props", cls=VariadicOption, metavar="KEY=VALUE ...",
              help="consumer configs (over --consumer.config and the tool's own settings)")
@click.pass_context
def perf_consume(ctx: click.Context, topic: str, messages: int, group: Optional[str], from_latest: bool,
                 fetch_size: int, timeout_ms: int, show_detailed_stats: bool, reporting_interval_ms: int,
                 print_metrics: bool, consumer_config_file: Optional[str], threads: Optional[int],
                 num_fetch_threads: Optional[int], hide_header: bool, consumer_props: tuple[str, ...]) -> None:
    """Consume MESSAGES records and report throughput like kafka-consumer-perf-test."""
    if messages <= 0:
        raise click.UsageError("--messages must be positive")
    if reporting_interval_ms <= 0:
        raise click.BadParameter("Reporting interval must be greater than 0.", param_hint="--reporting-interval")
    as_json = obj(ctx).json
    if threads is not None or num_fetch_threads is not None:
        click.echo(THREADS_WARNING, err=as_json)
    config, group_given = _consumer_config(ctx, group, from_latest, fetch_size, consumer_props, consumer_config_file)
    tune_allocator()  # multi-MiB fetch responses: keep them off fresh mmaps (page faults)
    if not hide_header and not as_json:
        click.echo(DETAILED_HEADER if show_detailed_stats else CONSUMER_HEADER)
    on_progress = None
    if show_detailed_stats:
        def on_progress(r: dict[str, Any]) -> None:
            if as_json:
                emit_json({**r, "time": _kafka_time(r["time"])})
            else:
                click.echo(progress_row(r))
    result = run(_perf_consume(config, topic, messages, timeout_ms, group_given=group_given, from_latest=from_latest,
                               reporting_interval_ms=reporting_interval_ms, on_progress=on_progress,
                               print_metrics=print_metrics))
    if result["messages"] < messages:
        click.echo(f"WARNING: Exiting before consuming the expected number of messages: timeout ({timeout_ms} ms) "
                   "exceeded. You can use the --timeout option to increase the timeout.", err=as_json)
    if as_json:
        emit_json({k: (_kafka_time(v) if k in ("start", "end") else v) for k, v in result.items()})
        return
    if not show_detailed_stats:  # Kafka prints the summary row only without --show-detailed-stats
        click.echo(consumer_row(result))
    for line in metrics_lines(result.get("metrics", {})):
        click.echo(line)


# ---------------------------------------------------------------- through the producer gateway
GATEWAY_WINDOW_BYTES = 16 << 20  # unanswered record bytes on the stream (half the gateway's default buffer.memory)


def _gateway_targets(ctx: click.Context, gateway: Optional[str]) -> str:
    if gateway:
        return gateway
    import json as _json
    import os as _os

    path = _os.path.join(obj(ctx).data_dir, "cluster.json")
    try:
        with open(path) as f:
            targets = str(_json.load(f).get("gateways") or "")
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"--via-gateway needs a local cluster with gateways: cannot read {path}: {exc}")
    if not targets:
        raise click.ClickException(f"{path} lists no gateway: start one with `gregor cluster up --gateways 1`")
    return targets


def _perf_produce_via_gateway(ctx: click.Context, gateway: Optional[str], topic: str, num_records: int,
                              payloads: list[bytes], throughput: float) -> None:
    targets = _gateway_targets(ctx, gateway)
    as_json = obj(ctx).json
    summary = run(_perf_produce_gateway(targets, topic, num_records, payloads, throughput, echo=not as_json))
    if as_json:
        emit_json(summary)
    else:
        click.echo(summary_line(summary))


async def _perf_produce_gateway(targets: str, topic: str, num_records: int, payloads: list[bytes],
                                throughput: float, echo: bool) -> dict[str, Any]:
    """kafka-producer-perf-test through a gateway: one ProduceStream, latency = result time - send time.

    Records answered THROTTLING_QUOTA_EXCEEDED (gateway buffer.memory full) are sent again after
    retry.backoff.ms, keeping their first send time, as a blocked KafkaProducer.send() would.
    """
    from gregor.gateway.client import GatewayClient, record
    from gregor.rpc.v1 import gateway_pb2

    recs = [record(p) for p in payloads]
    sizes = [len(p) for p in payloads]
    pick = random.Random(0).randrange  # a random payload per record, as the SDK path
    chosen: dict[int, int] = {}  # correlation id -> index of its payload (several payloads only)
    stats = Stats(num_records, echo)
    window = asyncio.Semaphore(max(1, GATEWAY_WINDOW_BYTES // (max(sizes) + 64)))
    sent_at: dict[int, float] = {}
    retry: asyncio.Queue[int] = asyncio.Queue()
    failures: list[str] = []
    monotonic = time.monotonic
    done = asyncio.Event()
    answered = 0

    async def requests() -> Any:
        start = monotonic()
        next_id = 0
        while next_id < num_records or sent_at:
            cid: Optional[int] = None
            if not retry.empty():
                cid = retry.get_nowait()
            elif next_id < num_records:
                await window.acquire()
                cid = next_id
                next_id += 1
                sent_at[cid] = monotonic()
                if throughput > 0:
                    ahead = (next_id) / throughput - (monotonic() - start)
                    if ahead > 0.002:
                        await asyncio.sleep(ahead)
            else:
                get = asyncio.ensure_future(retry.get())
                stop = asyncio.ensure_future(done.wait())
                finished, _ = await asyncio.wait([get, stop], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if get not in finished:
                    get.cancel()
                    return
                cid = get.result()
            if len(recs) == 1:
                index = 0
            elif cid in chosen:  # a resend keeps its payload
                index = chosen[cid]
            else:
                index = chosen[cid] = pick(len(recs))
            yield gateway_pb2.GatewayRecord(topic=topic, record=recs[index], correlation_id=cid)

    async with GatewayClient(targets) as client:
        call = client.stub().ProduceStream(requests())
        async for res in call:
            cid = res.correlation_id
            if res.error.code == errors.Code.THROTTLING_QUOTA_EXCEEDED:  # resend after retry.backoff.ms
                asyncio.get_running_loop().call_later(0.1, retry.put_nowait, cid)
                continue
            t0 = sent_at.pop(cid)
            size = sizes[chosen.pop(cid, 0)]
            window.release()
            answered += 1
            if res.error.code:
                failures.append(f"{errors.code_name(res.error.code)}: {res.error.message}")
            else:
                now = monotonic()
                stats.record(int((now - t0) * 1000), size, now)
            if answered == num_records:
                done.set()
                call.cancel()
                break
    stats.print_window(monotonic())
    if failures:
        raise click.ClickException(f"{len(failures)} record(s) failed, first: {failures[0]}")
    return stats.summary()


# ---------------------------------------------------------------- end-to-end latency (Kafka's EndToEndLatency)
@perf.command("e2e")
@click.option("--topic", required=True)
@click.option("--num-records", "--num-messages", "num_records", type=int, required=True,
              help="records to produce and consume back, one at a time")
@click.option("--producer-acks", type=click.Choice(["0", "1", "all", "-1"]), default="1", show_default=True)
@click.option("--record-size", "--message-size", "record_size", type=int, required=True, help="bytes per record")
@click.option("--timeout", "timeout_ms", type=int, default=60000, show_default=True,
              help="ms to wait for each record to come back")
@click.pass_context
def perf_e2e(ctx: click.Context, topic: str, num_records: int, producer_acks: str, record_size: int,
             timeout_ms: int) -> None:
    """Produce one record, consume it back, repeat: avg and 50th/99th/99.9th percentile latency (ms)."""
    if num_records <= 0 or record_size <= 0:
        raise click.UsageError("--num-records and --record-size must be positive")
    bootstrap = obj(ctx).bootstrap()
    as_json = obj(ctx).json
    result = run(_perf_e2e(bootstrap, topic, num_records, producer_acks, record_size, timeout_ms, echo=not as_json))
    if as_json:
        emit_json(result)
        return
    click.echo(f"Avg latency: {result['avg_latency_ms']:.4f} ms\n")
    click.echo(f"Percentiles: 50th = {result['p50_ms']}, 99th = {result['p99_ms']}, 99.9th = {result['p999_ms']}")


async def _perf_e2e(bootstrap: str, topic: str, num_records: int, acks: str, record_size: int, timeout_ms: int,
                    echo: bool) -> dict[str, Any]:
    """EndToEndLatency: the consumer is positioned at the end of every partition, then each record is sent
    (linger.ms=0), flushed, and polled back; its content is checked like Kafka's tool does."""
    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        info = (await admin.describe_topics([topic]))[topic]
    tps = [(topic, p.partition) for p in info.partitions]
    rng = random.Random()
    latencies_ns: list[int] = []
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "latest", "fetch.max.wait.ms": 100,
                         "enable.auto.commit": False}) as consumer, \
            Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0}) as producer:
        consumer.assign(tps)
        consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        for i in range(num_records):
            payload = bytes(rng.randrange(65, 91) for _ in range(record_size))
            begin = time.perf_counter_ns()
            handle = await producer.send(topic, payload)
            await producer.flush()
            await handle
            got: list[Any] = []
            deadline = time.monotonic() + timeout_ms / 1000
            while not got:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise click.ClickException(f"poll timed out: record {i} did not come back within {timeout_ms} ms")
                got = await consumer.poll(int(min(remaining, 1.0) * 1000) or 1, 1)
            elapsed = time.perf_counter_ns() - begin
            if got[0].value != payload:
                raise click.ClickException(f"Consumed message {i} didn't match the one produced")
            latencies_ns.append(elapsed)
            if echo and i % 1000 == 0:
                click.echo(f"{i}\t{elapsed / 1e6}")
    lat = sorted(n // 1_000_000 for n in latencies_ns)
    return {"records": num_records, "avg_latency_ms": sum(latencies_ns) / num_records / 1e6,
            "p50_ms": lat[int(len(lat) * 0.5)], "p99_ms": lat[int(len(lat) * 0.99)],
            "p999_ms": lat[int(len(lat) * 0.999)]}
