"""`gregor perf produce|consume`: kafka-producer-perf-test and kafka-consumer-perf-test, same flags and output."""

from __future__ import annotations

import array
import asyncio
import functools
import random
import time
from datetime import datetime
from typing import Any, Optional

import click

from gregor.cli.common import VariadicCommand, VariadicOption, emit_json, obj, parse_kv, run
from gregor.client.admin import AdminClient
from gregor.client.config import ConfigError, consumer_config, producer_config
from gregor.client.consumer import Consumer
from gregor.client.accumulator import ProducerBatch
from gregor.client.producer import Producer
from gregor.common.memory import tune_allocator

REPORT_INTERVAL_S = 5.0  # ProducerPerformance's reportingInterval


@click.group()
def perf() -> None:
    """Performance tools with the flags and output of Kafka's perf tests."""


class Stats:
    """ProducerPerformance.Stats: windowed progress lines and the final summary (latencies in ms)."""

    def __init__(self, num_records: int, echo: bool) -> None:
        self.start = time.monotonic()
        self.window_start = self.start
        self.latencies = array.array("l")
        self.count = self.bytes = self.max_latency = self.total_latency = 0
        self.w_count = self.w_bytes = self.w_max = self.w_total = 0
        self.echo = echo

    def record(self, latency_ms: int, size: int, now: float) -> None:
        self.count += 1
        self.bytes += size
        self.total_latency += latency_ms
        self.max_latency = max(self.max_latency, latency_ms)
        self.latencies.append(latency_ms)
        self.w_count += 1
        self.w_bytes += size
        self.w_total += latency_ms
        self.w_max = max(self.w_max, latency_ms)
        if now - self.window_start >= REPORT_INTERVAL_S:
            self.print_window(now)

    def record_many(self, latencies_ms: list[int], size: int, now: float) -> None:
        """record() for several records acknowledged together (one produce batch)."""
        n = len(latencies_ms)
        if not n:
            return
        total, top = sum(latencies_ms), max(latencies_ms)
        self.count += n
        self.bytes += n * size
        self.total_latency += total
        self.max_latency = max(self.max_latency, top)
        self.latencies.extend(latencies_ms)
        self.w_count += n
        self.w_bytes += n * size
        self.w_total += total
        self.w_max = max(self.w_max, top)
        if now - self.window_start >= REPORT_INTERVAL_S:
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

    def summary(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        lat = sorted(self.latencies)

        def pct(p: float) -> int:
            return lat[int(p * len(lat))] if lat else 0

        return {"records": self.count, "records_per_sec": self.count / elapsed,
                "mb_per_sec": self.bytes / elapsed / 1048576,
                "avg_latency_ms": self.total_latency / self.count if self.count else 0.0,
                "max_latency_ms": float(self.max_latency), "p50_ms": pct(0.5), "p95_ms": pct(0.95),
                "p99_ms": pct(0.99), "p999_ms": pct(0.999)}


def summary_line(s: dict[str, Any]) -> str:
    """Kafka's final line, e.g. '100000 records sent, 26723.677178 records/sec (26.10 MB/sec), ...'."""
    return (f"{s['records']} records sent, {s['records_per_sec']:f} records/sec ({s['mb_per_sec']:.2f} MB/sec), "
            f"{s['avg_latency_ms']:.2f} ms avg latency, {s['max_latency_ms']:.2f} ms max latency, "
            f"{s['p50_ms']} ms 50th, {s['p95_ms']} ms 95th, {s['p99_ms']} ms 99th, {s['p999_ms']} ms 99.9th.")


async def _perf_produce(config: dict[str, Any], topic: str, num_records: int, record_size: int,
                        throughput: float, echo: bool) -> dict[str, Any]:
    async with AdminClient({"bootstrap.servers": config["bootstrap.servers"]}) as admin:
        await admin.describe_topics([topic])
    # Kafka's payload: random uppercase letters, one payload reused for every record.
    rng = random.Random()
    payload = bytes(rng.randrange(65, 91) for _ in range(record_size))
    stats = Stats(num_records, echo)
    failures: list[BaseException] = []
    failed = 0
    monotonic = time.monotonic
    # Per-record latency as Kafka's PerfCallback measures it (ack time - send time, ms), but with
    # one callback per produce batch: the send times of a batch's records are collected here and
    # turned into latencies when the batch (and so each of its records) is acknowledged.
    sends_of: dict[ProducerBatch, list[float]] = {}

    def batch_done(batch: ProducerBatch, fut: "asyncio.Future[int]") -> None:
        nonlocal failed
        sends = sends_of.pop(batch)
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            failed += len(sends)
            failures.append(exc)
            return
        now = monotonic()
        stats.record_many([int((now - t) * 1000) for t in sends], record_size, now)

    async with Producer(config) as producer:
        send = producer.send
        start = monotonic()
        current: Optional[ProducerBatch] = None
        current_sends: list[float] = []
        for i in range(num_records):
            sent_at = monotonic()
            batch = (await send(topic, payload)).batch
            if batch is not current:
                current = batch
                sends = sends_of.get(batch)
                if sends is None:
                    sends = sends_of[batch] = []
                    batch.future.add_done_callback(functools.partial(batch_done, batch))
                current_sends = sends
            current_sends.append(sent_at)
            if throughput > 0:
                # ThroughputThrottler: sleep whenever we are ahead of the target rate.
                ahead = (i + 1) / throughput - (monotonic() - start)
                if ahead > 0.002:
                    await asyncio.sleep(ahead)
        await producer.flush()
        await asyncio.sleep(0)  # let the last batches' callbacks run
    stats.print_window(monotonic())
    if failures:
        raise click.ClickException(f"{failed} record(s) failed, first: {failures[0]}")
    return stats.summary()


@perf.command("produce", cls=VariadicCommand)
@click.option("--topic", required=True)
@click.option("--num-records", type=int, required=True)
@click.option("--record-size", type=int, required=True, help="bytes per record value")
@click.option("--throughput", type=float, required=True, help="records/sec cap; -1 for none")
@click.option("--producer-props", cls=VariadicOption, metavar="KEY=VALUE ...",
              help="producer configs, space separated after one flag (Kafka style) or repeated")
@click.option("--gateway", metavar="HOST:PORT[,...]",
              help="produce through these producer gateways (ProduceStream) instead of the SDK producer")
@click.option("--via-gateway", is_flag=True, help="produce through the gateways listed in DATA_DIR/cluster.json")
@click.pass_context
def perf_produce(ctx: click.Context, topic: str, num_records: int, record_size: int, throughput: float,
                 producer_props: tuple[str, ...], gateway: Optional[str] = None, via_gateway: bool = False) -> None:
    """Produce NUM_RECORDS records of RECORD_SIZE bytes and report throughput and latency percentiles."""
    if num_records <= 0 or record_size <= 0:
        raise click.UsageError("--num-records and --record-size must be positive")
    if gateway or via_gateway:
        _perf_produce_via_gateway(ctx, gateway, topic, num_records, record_size, throughput, producer_props)
        return
    config: dict[str, Any] = {"bootstrap.servers": obj(ctx).bootstrap()}
    config.update(parse_kv(producer_props, "--producer-props"))
    try:
        producer_config(config)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--producer-props") from None
    as_json = obj(ctx).json
    tune_allocator()  # multi-MiB produce requests: keep them off fresh mmaps (page faults)
    summary = run(_perf_produce(config, topic, num_records, record_size, throughput, echo=not as_json))
    if as_json:
        emit_json(summary)
    else:
        click.echo(summary_line(summary))


CONSUMER_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                   "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")


def _kafka_time(t: float) -> str:
    d = datetime.fromtimestamp(t)
    return d.strftime("%Y-%m-%d %H:%M:%S:") + f"{d.microsecond // 1000:03d}"


def consumer_row(r: dict[str, Any]) -> str:
    return (f"{_kafka_time(r['start'])}, {_kafka_time(r['end'])}, {r['mb']:.4f}, {r['mb_sec']:.4f}, {r['messages']}, "
            f"{r['msg_sec']:.4f}, {r['rebalance_ms']}, {r['fetch_ms']}, {r['fetch_mb_sec']:.4f}, "
            f"{r['fetch_msg_sec']:.4f}")


async def _perf_consume(config: dict[str, Any], topic: str, messages: int, timeout_ms: int) -> dict[str, Any]:
    start = time.time()
    async with AdminClient({"bootstrap.servers": config["bootstrap.servers"]}) as admin:
        info = (await admin.describe_topics([topic]))[topic]
    count = nbytes = 0
    async with Consumer(config) as consumer:
        tps = [(topic, p.partition) for p in info.partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        assigned = time.time()
        last = time.monotonic()
        while count < messages:
            records = await consumer.poll(min(1000, timeout_ms), messages - count)
            if records:
                last = time.monotonic()
                count += len(records)
                nbytes += sum([len(r[5] or b"") + len(r[4] or b"") for r in records])  # value + key
            elif (time.monotonic() - last) * 1000 >= timeout_ms:
                break
    end = time.time()
    elapsed = max(end - start, 1e-9)
    rebalance_ms = int((assigned - start) * 1000)
    fetch_s = max(elapsed - rebalance_ms / 1000, 1e-9)
    mb = nbytes / 1048576
    return {"start": start, "end": end, "mb": mb, "mb_sec": mb / elapsed, "messages": count,
            "msg_sec": count / elapsed, "rebalance_ms": rebalance_ms, "fetch_ms": int(fetch_s * 1000),
            "fetch_mb_sec": mb / fetch_s, "fetch_msg_sec": count / fetch_s}


@perf.command("consume", cls=VariadicCommand)
@click.option("--topic", required=True)
@click.option("--messages", type=int, required=True, help="records to consume")
@click.option("--fetch-size", type=int, default=1048576, show_default=True, help="bytes per partition fetch")
@click.option("--timeout", "timeout_ms", type=int, default=10000, show_default=True,
              help="ms without a record before giving up")
@click.option("--hide-header", is_flag=True, help="skip the header line")
@click.option("--consumer-props", cls=VariadicOption, metavar="KEY=VALUE ...", help="consumer configs")
@click.pass_context
def perf_consume(ctx: click.Context, topic: str, messages: int, fetch_size: int, timeout_ms: int,
                 hide_header: bool, consumer_props: tuple[str, ...]) -> None:
    """Consume MESSAGES records from the beginning and report throughput like kafka-consumer-perf-test."""
    if messages <= 0:
        raise click.UsageError("--messages must be positive")
    config: dict[str, Any] = {"bootstrap.servers": obj(ctx).bootstrap(), "max.partition.fetch.bytes": fetch_size,
                              "auto.offset.reset": "earliest"}
    config.update(parse_kv(consumer_props, "--consumer-props"))
    try:
        consumer_config(config)
    except ConfigError as exc:
        raise click.BadParameter(exc.message, param_hint="--consumer-props") from None
    tune_allocator()  # multi-MiB fetch responses: keep them off fresh mmaps (page faults)
    result = run(_perf_consume(config, topic, messages, timeout_ms))
    if obj(ctx).json:
        emit_json({k: (_kafka_time(v) if k in ("start", "end") else v) for k, v in result.items()})
        return
    if not hide_header:
        click.echo(CONSUMER_HEADER)
    click.echo(consumer_row(result))
    if result["messages"] < messages:
        click.echo(f"WARNING: Exiting before consuming the expected number of messages: timeout ({timeout_ms} ms) "
                   f"exceeded.", err=True)


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
                              record_size: int, throughput: float, producer_props: tuple[str, ...]) -> None:
    if producer_props:
        click.echo("WARNING: --producer-props are ignored with a gateway: the gateway's producer config applies "
                   "(gregor cluster up --gateway-property)", err=True)
    targets = _gateway_targets(ctx, gateway)
    as_json = obj(ctx).json
    summary = run(_perf_produce_gateway(targets, topic, num_records, record_size, throughput, echo=not as_json))
    if as_json:
        emit_json(summary)
    else:
        click.echo(summary_line(summary))


async def _perf_produce_gateway(targets: str, topic: str, num_records: int, record_size: int, throughput: float,
                                echo: bool) -> dict[str, Any]:
    """kafka-producer-perf-test through a gateway: one ProduceStream, latency = result time - send time.

    Records answered THROTTLING_QUOTA_EXCEEDED (gateway buffer.memory full) are sent again after
    retry.backoff.ms, keeping their first send time, as a blocked KafkaProducer.send() would.
    """
    from gregor.common import errors
    from gregor.gateway.client import GatewayClient, record
    from gregor.rpc.v1 import gateway_pb2

    rng = random.Random()
    payload = bytes(rng.randrange(65, 91) for _ in range(record_size))
    rec = record(payload)
    stats = Stats(num_records, echo)
    window = asyncio.Semaphore(max(1, GATEWAY_WINDOW_BYTES // (record_size + 64)))
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
            yield gateway_pb2.GatewayRecord(topic=topic, record=rec, correlation_id=cid)

    async with GatewayClient(targets) as client:
        call = client.stub().ProduceStream(requests())
        async for res in call:
            cid = res.correlation_id
            if res.error.code == errors.Code.THROTTLING_QUOTA_EXCEEDED:  # resend after retry.backoff.ms
                asyncio.get_running_loop().call_later(0.1, retry.put_nowait, cid)
                continue
            t0 = sent_at.pop(cid)
            window.release()
            answered += 1
            if res.error.code:
                failures.append(f"{errors.code_name(res.error.code)}: {res.error.message}")
            else:
                now = monotonic()
                stats.record(int((now - t0) * 1000), record_size, now)
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
            got = []
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
