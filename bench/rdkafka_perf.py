"""A ProducerPerformance for librdkafka (confluent-kafka): the native client's side of bench_same_client.py.

Run in a process of its own (the bench's own work does not share its GIL):

    python bench/rdkafka_perf.py --bootstrap HOST:PORT --topic T --num-records N --record-size 1024 \
        --throughput -1 --producer-props acks=all linger.ms=5

Like Kafka's ProducerPerformance: N records of --record-size bytes (no key), at most --throughput records/s
(-1: as fast as the client goes, waiting on a full queue), every record's latency from produce() to its
delivery report (librdkafka's own `rd_kafka_message_latency`, microseconds). As with Kafka's tool (and
`gregor perf produce`) the clock starts at the first record, so the client's start (connections, Metadata,
the producer id) is in the figures; --warmup-records K adds a "steady" summary of the records delivered
after the first K (delivery order: send order within a partition). Prints one JSON line: records,
records_per_sec, mb_per_sec (MiB, as Kafka's tool), avg/max/p50/p95/p99/p999 latency in ms, errors,
seconds, steady_mb_per_sec (the records delivered after the first second over the time after it: the
client's start left out, as the progress windows after the first one of Kafka's tool), [steady].
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

MIB = 1024 * 1024
STEADY_AFTER_S = 1.0  # steady_mb_per_sec: the records delivered after the first second, over the time since


def percentile(sorted_ms: list[float], q: float) -> float:
    """Kafka's ProducerPerformance: the value at index (int)(q * count) of the sorted latencies."""
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def summary(latencies_s: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000.0 for x in latencies_s)
    return {"avg_latency_ms": sum(ms) / len(ms) if ms else float("nan"), "max_latency_ms": ms[-1] if ms else 0.0,
            "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95), "p99_ms": percentile(ms, 0.99),
            "p999_ms": percentile(ms, 0.999)}


def run(bootstrap: str, topic: str, records: int, record_size: int, throughput: float,
        props: dict[str, str], warmup: int = 0) -> dict[str, Any]:
    from confluent_kafka import KafkaException, Producer

    latencies: list[float] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            latencies.append(msg.latency())

    p = Producer({"bootstrap.servers": bootstrap, **props, "on_delivery": delivered})
    value = b"x" * record_size
    produce, poll = p.produce, p.poll
    steady_at: tuple[float, int] | None = None  # (time, records delivered) when the first second was over
    t0 = time.perf_counter()
    interval = 1.0 / throughput if throughput > 0 else 0.0
    for i in range(records):
        if interval:  # Kafka's ThroughputThrottler: never ahead of i / throughput
            ahead = t0 + i * interval - time.perf_counter()
            if ahead > 0:
                poll(ahead)
        while True:
            try:
                produce(topic, value=value)
                break
            except BufferError:  # queue.buffering.max.*: wait for deliveries
                poll(0.005)
        if i % 1000 == 0:
            poll(0)
        if steady_at is None and i % 1000 == 0 and time.perf_counter() - t0 >= STEADY_AFTER_S:
            steady_at = (time.perf_counter(), len(latencies) + len(errors))
    deadline = time.perf_counter() + 300
    while len(p) and time.perf_counter() < deadline:  # flush, noting when the first second is over
        p.flush(0.05)
        if steady_at is None and time.perf_counter() - t0 >= STEADY_AFTER_S:
            steady_at = (time.perf_counter(), len(latencies) + len(errors))
    elapsed = time.perf_counter() - t0
    if len(p):
        raise KafkaException(f"{len(p)} records not delivered within 300 s")
    steady_mb = float("nan")
    if steady_at is not None and t0 + elapsed > steady_at[0]:
        steady_mb = (records - steady_at[1]) * record_size / MIB / (t0 + elapsed - steady_at[0])
    out: dict[str, Any] = {"records": records, "records_per_sec": records / elapsed,
                           "mb_per_sec": records * record_size / MIB / elapsed, "seconds": elapsed,
                           "steady_mb_per_sec": steady_mb,
                           **summary(latencies), "errors": len(errors),
                           "first_error": errors[0] if errors else None}
    if warmup:
        out["steady"] = {"records": len(latencies[warmup:]), **summary(latencies[warmup:])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--num-records", type=int, required=True)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--throughput", type=float, default=-1, help="records/s cap; -1 for none")
    ap.add_argument("--warmup-records", type=int, default=0,
                    help="also summarize the records delivered after the first this many")
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    props = dict(kv.split("=", 1) for kv in args.producer_props)
    out = run(args.bootstrap, args.topic, args.num_records, args.record_size, args.throughput, props,
              args.warmup_records)
    print(json.dumps(out), flush=True)
    sys.exit(1 if out["errors"] else 0)


if __name__ == "__main__":
    main()
