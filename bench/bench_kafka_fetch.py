"""Consume throughput through the Kafka listener with and without zero-copy Fetch, in the same run.

One cluster (etcd, a controller, a group coordinator: ConsumerPerformance consumes in a group) with two brokers
side by side: broker 0 with `kafka.fetch.zero.copy.enable=true` (the default: records by sendfile,
kafka/zero_copy.py), broker 1 with `false` (the slices read into the response in Python, as TLS connections
do). Each leads its own one-partition topic of --mib MiB of 1 KiB records written by librdkafka, read from the
page cache by Kafka's own ConsumerPerformance (kafka-tools, `make kafka-jars`). Rounds alternate which broker
is read first. Reports per side the consumer's fetch MB/s (ConsumerPerformance's fetch.MB.sec, without the
group join) and the broker's CPU seconds per GiB served (utime + stime of the broker process over the
consume, /proc), medians over the rounds, and the ratios zero-copy / copy. The machine is shared with other
work: treat single numbers with care; the CPU per GiB is the steadier figure.

    python bench/bench_kafka_fetch.py --quick     # 32 MiB, 2 rounds: about a minute on an idle machine
    python bench/bench_kafka_fetch.py             # 256 MiB, 3 rounds

Writes bench/results/kafka_fetch[_quick].json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import run_tool, write_results  # noqa: E402
from bench.kafka_dist import CONSUMER_PERF, KafkaDist, ensure_kafka  # noqa: E402
from bench.vs_kafka_report import parse_consume  # noqa: E402
from gregor.cli.local_cluster import (LocalCluster, start_broker, start_controller, start_coordinator,  # noqa: E402
                                      start_etcd)

RECORD_BYTES = 1024
TOPIC = "fetch-bench"
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def fill(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, "acks": "1"})
    value = b"x" * RECORD_BYTES
    for _ in range(records):
        while True:
            try:
                p.produce(topic, value=value, partition=0)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(120) == 0


SIDES = {"zero_copy": 0, "copy": 1}  # side -> the broker that leads its topic


def start(base: Path, records: int) -> LocalCluster:
    data_dir = str(base)
    c = LocalCluster(data_dir)
    try:
        return _fill_cluster(c, data_dir, records)
    except BaseException:
        c.down()
        raise


def _fill_cluster(c: LocalCluster, data_dir: str, records: int) -> LocalCluster:
    from kafka import KafkaAdminClient  # type: ignore[import-untyped]
    from kafka.admin import NewTopic  # type: ignore[import-untyped]

    etcd = start_etcd(data_dir)
    c.processes.append(etcd)
    c.processes.append(start_controller(data_dir, 0, etcd.grpc))
    for name, broker_id in SIDES.items():
        c.processes.append(start_broker(data_dir, broker_id, etcd_endpoint=etcd.grpc, overrides={
            "kafka.fetch.zero.copy.enable": str(name == "zero_copy").lower()}))
    c.processes.append(start_coordinator(data_dir, 0, etcd.grpc, overrides={"offsets.topic.replication.factor": "1"}))
    c.save()
    bootstrap = str(c.to_json()["kafka_bootstrap"])
    admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
    try:  # each side's topic led by its broker (librdkafka's NewTopic refuses an assignment here)
        admin.create_topics([NewTopic(f"{TOPIC}-{name}", -1, -1, replica_assignments={0: [broker_id]})
                             for name, broker_id in SIDES.items()])
    finally:
        admin.close()
    for name in SIDES:
        fill(bootstrap, f"{TOPIC}-{name}", records)
    return c


def consume(dist: KafkaDist, c: LocalCluster, name: str, records: int) -> dict[str, float]:
    broker = next(p for p in c.by_role("broker") if p.id == SIDES[name])
    before = cpu_s(broker.pid)
    row = parse_consume(run_tool(dist.command(
        CONSUMER_PERF, "--bootstrap-server", str(c.to_json()["kafka_bootstrap"]), "--topic", f"{TOPIC}-{name}",
        "--num-records", str(records), "--timeout", "60000", heap="512m"), 300))
    used = cpu_s(broker.pid) - before
    gib = records * RECORD_BYTES / (1 << 30)
    # fetch.MB.sec: the consume without the group join (which, on a loaded machine, can be most of a short run)
    return {"mb_per_s": row["fetch_mb_per_sec"], "broker_cpu_s_per_gib": used / gib, "records": row["records"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="32 MiB, 2 rounds")
    ap.add_argument("--mib", type=int, help="MiB in the topic (default 256; 32 with --quick)")
    ap.add_argument("--repeat", type=int, help="rounds (default 3; 2 with --quick)")
    args = ap.parse_args()
    mib = args.mib or (32 if args.quick else 256)
    rounds = args.repeat or (2 if args.quick else 3)
    records = mib * 1024 * 1024 // RECORD_BYTES
    dist = ensure_kafka()
    runs: dict[str, list[dict[str, float]]] = {"zero_copy": [], "copy": []}
    with tempfile.TemporaryDirectory(prefix="bench-kafka-fetch-") as tmp:
        c = start(Path(tmp), records)
        try:
            for r in range(rounds):
                order = ["zero_copy", "copy"] if r % 2 == 0 else ["copy", "zero_copy"]
                for name in order:
                    runs[name].append(consume(dist, c, name, records))
                    print(name, runs[name][-1], flush=True)
        finally:
            c.down()
    med: dict[str, dict[str, float]] = {
        name: {k: statistics.median(run[k] for run in rs) for k in ("mb_per_s", "broker_cpu_s_per_gib")}
        for name, rs in runs.items()}
    ratios = {"mb_per_s": med["zero_copy"]["mb_per_s"] / med["copy"]["mb_per_s"],
              "broker_cpu_s_per_gib": med["zero_copy"]["broker_cpu_s_per_gib"] / med["copy"]["broker_cpu_s_per_gib"]}
    print(f"{'side':<10} {'MB/s':>8} {'broker CPU s/GiB':>18}")
    for name in ("zero_copy", "copy"):
        print(f"{name:<10} {med[name]['mb_per_s']:>8.1f} {med[name]['broker_cpu_s_per_gib']:>18.2f}")
    print(f"{'ratio':<10} {ratios['mb_per_s']:>8.2f} {ratios['broker_cpu_s_per_gib']:>18.2f}  (zero-copy / copy)")
    out: dict[str, Any] = {"mib": mib, "rounds": rounds, "record_bytes": RECORD_BYTES, "runs": runs,
                           "median": med, "ratio_zero_copy_over_copy": ratios,
                           "loadavg": os.getloadavg()}
    write_results(f"kafka_fetch{'_quick' if args.quick else ''}", {"mib": mib, "rounds": rounds}, out)


if __name__ == "__main__":
    main()
