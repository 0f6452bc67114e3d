"""Gregor against Apache Kafka, side by side on this machine, in the same run (issue 15).

`make bench-vs-kafka` (`QUICK=1` for the quick form, under 10 minutes). Both systems run the
same cells in the same topologies, alternately (round r starts with Gregor when r is even, with
Kafka otherwise), each round on a fresh cluster; every cell is repeated --repeat times (3).

Topologies: "single" = one broker (Kafka: one combined KRaft node; Gregor: etcd + one standalone
broker); "rf3" = three brokers (Kafka: one KRaft controller + 3 brokers; Gregor: etcd, one
controller, 3 brokers), topics with replication factor 3 and min.insync.replicas=2.

Each system is driven by its own perf tools with Kafka's flags: Kafka's ProducerPerformance,
ConsumerPerformance and EndToEndLatency (kafka-tools, `java -cp`), Gregor's `gregor perf produce /
consume / e2e`. Default producer settings on both, except the "16 KiB requests" cell
(max.request.size=17408 on both: one 16 KiB batch per request).

Cells: produce MB/s (single: acks=1 1 and 16 partitions, cold = first run on the fresh cluster,
then warm; rf3: acks=all 1 and 16 partitions, acks=1 16 partitions, acks=all 16 KiB requests),
consume MB/s, fixed-rate 2,000 rec/s acks=all (p50/p99/p99.9, worst and median 1-second window),
one-at-a-time end-to-end (acks=all), server CPU seconds per GiB produced and per second at the
fixed rate, idle cores of the rf3 cluster with a 100-partition topic, peak RSS of all servers.
Server = every process of the cluster (Gregor: etcd, controller, brokers; Kafka: controller and
broker JVMs), read from /proc. The load average is recorded with every cell.

Writes bench/results/vs_kafka[_quick].json (every round, every tool's parsed output) and prints
the Markdown table (also bench/results/vs_kafka[_quick].md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import RESULTS_DIR, run_tool, write_results  # noqa: E402
from bench.kafka_dist import (CONSUMER_PERF, END_TO_END_LATENCY, PRODUCER_PERF, KafkaCluster, KafkaDist,  # noqa: E402
                              ensure_kafka, proc_cpu_seconds, proc_status_kib)
from bench.vs_kafka_report import (build_rows, format_table, parse_consume, parse_e2e, parse_produce,  # noqa: E402
                                   window_stats)

ROOT = Path(__file__).resolve().parent.parent
RECORD_BYTES = 1024
FIXED_RATE = 2000  # records/s of the latency cell (the figure)
MIN_ISR = "2"
IDLE_PARTITIONS = 100
MATCHED_REQUEST = {"max.request.size": "17408"}  # one 16 KiB batch (+ overhead) per request, both systems
TOOL_TIMEOUT_S = 900


class Sizes:
    def __init__(self, quick: bool) -> None:
        self.single_records = 30_000 if quick else 300_000
        self.rf3_records = 20_000 if quick else 100_000
        self.fixed_s = 10 if quick else 25
        self.e2e_records = 200 if quick else 1000
        self.idle_s = 5 if quick else 15


METRICS = [  # (name, unit, better) in table order
    ("single produce acks=1 p1 cold", "MB/s", "higher"),
    ("single produce acks=1 p1 warm", "MB/s", "higher"),
    ("single produce acks=1 p16", "MB/s", "higher"),
    ("single server CPU per GiB (acks=1 p1)", "CPU s/GiB", "lower"),
    ("single consume", "MB/s", "higher"),
    ("single peak RSS", "MiB", "lower"),
    ("rf3 idle, 100 partitions", "cores", "lower"),
    ("rf3 produce acks=all p1 cold", "MB/s", "higher"),
    ("rf3 produce acks=all p1 warm", "MB/s", "higher"),
    ("rf3 produce acks=all p16", "MB/s", "higher"),
    ("rf3 produce acks=1 p16", "MB/s", "higher"),
    ("rf3 produce acks=all p16, 16 KiB requests", "MB/s", "higher"),
    ("rf3 server CPU per GiB (acks=all p16)", "CPU s/GiB", "lower"),
    ("rf3 consume p16", "MB/s", "higher"),
    ("fixed 2000/s p50", "ms", "lower"),
    ("fixed 2000/s p99", "ms", "lower"),
    ("fixed 2000/s p99.9", "ms", "lower"),
    ("fixed 2000/s worst 1-s window", "ms", "lower"),
    ("fixed 2000/s median 1-s window", "ms", "lower"),
    ("fixed 2000/s worst/median window", "x", "lower"),
    ("fixed 2000/s server CPU", "cores", "lower"),
    ("e2e one at a time p50", "ms", "lower"),
    ("e2e one at a time p99", "ms", "lower"),
    ("e2e one at a time p99.9", "ms", "lower"),
    ("rf3 peak RSS", "MiB", "lower"),
]


def _run(cmd: list[str], env: Optional[dict[str, str]] = None) -> list[str]:
    return run_tool(cmd, TOOL_TIMEOUT_S, env)


def _keep_logs(src: Path, name: str) -> None:
    """The servers' logs of the last round of each topology, under bench/results/logs/ (gitignored)."""
    if src.is_dir():
        dest = RESULTS_DIR / "logs" / name
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src, dest)


def _kv(props: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in props.items()]


# ---------------------------------------------------------------- the two systems, one interface
class KafkaSide:
    name = "kafka"

    def __init__(self, dist: KafkaDist, base: Path) -> None:
        self.dist, self.base, self.cluster = dist, base, None

    def start(self, brokers: int) -> None:
        self.cluster = KafkaCluster(self.dist, self.base / f"kafka-{brokers}-{time.monotonic_ns()}", brokers=brokers)
        self.cluster.start()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            for node in self.cluster.nodes:
                _keep_logs(node.directory / "logs", f"kafka-{len(self.cluster.nodes)}-{node.node_id}")
            shutil.rmtree(self.cluster.base_dir, ignore_errors=True)
            self.cluster = None

    @property
    def pids(self) -> list[int]:
        return self.cluster.pids

    def create_topic(self, name: str, partitions: int, rf: int) -> None:
        self.cluster.create_topic(name, partitions, rf, {"min.insync.replicas": MIN_ISR} if rf > 1 else None)

    def produce(self, topic: str, records: int, throughput: int, props: dict[str, str], interval_ms: int,
                record_size: int = RECORD_BYTES) -> list[str]:
        return _run(self.dist.command(PRODUCER_PERF, "--bootstrap-server", self.cluster.bootstrap, "--topic", topic,
                                      "--num-records", str(records), "--record-size", str(record_size),
                                      "--throughput", str(throughput), "--reporting-interval", str(interval_ms),
                                      "--producer-props", *_kv(props), heap="512m"))

    def consume(self, topic: str, records: int) -> list[str]:
        return _run(self.dist.command(CONSUMER_PERF, "--bootstrap-server", self.cluster.bootstrap, "--topic", topic,
                                      "--num-records", str(records), "--timeout", "30000", heap="512m"))

    def e2e(self, topic: str, records: int) -> list[str]:
        return _run(self.dist.command(END_TO_END_LATENCY, self.cluster.bootstrap, topic, str(records), "all",
                                      str(RECORD_BYTES), heap="512m"))


class GregorSide:
    name = "gregor"

    def __init__(self, base: Path) -> None:
        self.base, self.cluster = base, None
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT)])}
        self.env.pop("GREGOR_BOOTSTRAP", None)

    def start(self, brokers: int) -> None:
        from gregor.cli.local_cluster import LocalCluster

        data_dir = self.base / f"gregor-{brokers}-{time.monotonic_ns()}"
        self.cluster = LocalCluster.up(str(data_dir), brokers=brokers, controllers=1 if brokers > 1 else 0)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.down()
            _keep_logs(Path(self.cluster.data_dir) / "logs", f"gregor-{len(self.cluster.by_role('broker'))}")
            shutil.rmtree(self.cluster.data_dir, ignore_errors=True)
            self.cluster = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.cluster.processes if p.alive()]

    def _gregor(self, *args: str) -> list[str]:
        return _run([sys.executable, "-m", "gregor.cli.main", "--bootstrap", self.cluster.bootstrap, *args],
                    env=self.env)

    def create_topic(self, name: str, partitions: int, rf: int) -> None:
        args = ["topics", "create", name, "--partitions", str(partitions), "--replication-factor", str(rf)]
        if rf > 1:
            args += ["--config", f"min.insync.replicas={MIN_ISR}"]
        self._gregor(*args)

    def produce(self, topic: str, records: int, throughput: int, props: dict[str, str], interval_ms: int,
                record_size: int = RECORD_BYTES) -> list[str]:
        return self._gregor("perf", "produce", "--topic", topic, "--num-records", str(records), "--record-size",
                            str(record_size), "--throughput", str(throughput), "--reporting-interval",
                            str(interval_ms), "--producer-props", *_kv(props))

    def consume(self, topic: str, records: int) -> list[str]:
        return self._gregor("perf", "consume", "--topic", topic, "--messages", str(records), "--timeout", "30000")

    def e2e(self, topic: str, records: int) -> list[str]:
        return self._gregor("perf", "e2e", "--topic", topic, "--num-records", str(records), "--producer-acks", "all",
                            "--record-size", str(RECORD_BYTES))


# ---------------------------------------------------------------- one round of one system
class Round:
    """The values of one system's round, with the load average at each cell and the raw tool output."""

    def __init__(self, side: Any) -> None:
        self.side = side
        self.values: dict[str, float] = {}
        self.load: dict[str, float] = {}
        self.raw: dict[str, Any] = {}

    def put(self, metric: str, value: float) -> None:
        self.values[metric] = value
        self.load[metric] = os.getloadavg()[0]
        print(f"  {self.side.name:<6} {metric:<44} {value:,.3f}  (load {self.load[metric]:.2f})", flush=True)

    def server_cpu(self) -> float:
        return sum(proc_cpu_seconds(pid) for pid in self.side.pids)

    def peak_rss_mib(self) -> float:
        return sum(proc_status_kib(pid, "VmHWM") for pid in self.side.pids) / 1024

    def produce(self, metric: str, topic: str, records: int, props: dict[str, str],
                throughput: int = -1, interval_ms: int = 5000) -> dict[str, Any]:
        cpu0 = self.server_cpu()
        t0 = time.monotonic()
        result = parse_produce(self.side.produce(topic, records, throughput, props, interval_ms))
        result["server_cpu_s"] = self.server_cpu() - cpu0
        result["wall_s"] = time.monotonic() - t0
        self.raw[metric] = result
        if throughput < 0:
            self.put(metric, result["mb_per_sec"])
        return result


def single_round(side: Any, sizes: Sizes) -> Round:
    r = Round(side)
    side.start(1)
    try:
        side.create_topic("p1", 1, 1)
        side.create_topic("p16", 16, 1)
        n = sizes.single_records
        r.produce("single produce acks=1 p1 cold", "p1", n, {"acks": "1"})
        warm = r.produce("single produce acks=1 p1 warm", "p1", n, {"acks": "1"})
        r.put("single server CPU per GiB (acks=1 p1)", warm["server_cpu_s"] / (n * RECORD_BYTES / (1 << 30)))
        r.produce("single produce acks=1 p16", "p16", n, {"acks": "1"})
        consumed = parse_consume(side.consume("p1", 2 * n))
        r.raw["single consume"] = consumed
        r.put("single consume", consumed["mb_per_sec"])
        r.put("single peak RSS", r.peak_rss_mib())
    finally:
        side.stop()
    return r


def rf3_round(side: Any, sizes: Sizes) -> Round:
    r = Round(side)
    side.start(3)
    try:
        side.create_topic("idle", IDLE_PARTITIONS, 3)
        for name, parts in (("p1", 1), ("p16", 16), ("p16m", 16), ("p16a1", 16), ("fixed", 1), ("e2e", 1)):
            side.create_topic(name, parts, 3)
        time.sleep(5)  # leaders elected, followers caught up: what is left is the idle cost
        cpu0, t0 = r.server_cpu(), time.monotonic()
        time.sleep(sizes.idle_s)
        r.put("rf3 idle, 100 partitions", (r.server_cpu() - cpu0) / (time.monotonic() - t0))
        n = sizes.rf3_records
        r.produce("rf3 produce acks=all p1 cold", "p1", n, {"acks": "all"})
        r.produce("rf3 produce acks=all p1 warm", "p1", n, {"acks": "all"})
        big = r.produce("rf3 produce acks=all p16", "p16", n, {"acks": "all"})
        r.put("rf3 server CPU per GiB (acks=all p16)", big["server_cpu_s"] / (n * RECORD_BYTES / (1 << 30)))
        r.produce("rf3 produce acks=1 p16", "p16a1", n, {"acks": "1"})
        r.produce("rf3 produce acks=all p16, 16 KiB requests", "p16m", n, {"acks": "all", **MATCHED_REQUEST})
        consumed = parse_consume(side.consume("p16", n))
        r.raw["rf3 consume p16"] = consumed
        r.put("rf3 consume p16", consumed["mb_per_sec"])
        fixed = r.produce("fixed", "fixed", FIXED_RATE * sizes.fixed_s, {"acks": "all"}, throughput=FIXED_RATE,
                          interval_ms=1000)
        r.put("fixed 2000/s p50", fixed["p50_ms"])
        r.put("fixed 2000/s p99", fixed["p99_ms"])
        r.put("fixed 2000/s p99.9", fixed["p999_ms"])
        ws = window_stats(fixed["windows"])
        fixed.update(ws)
        r.put("fixed 2000/s worst 1-s window", ws["worst_window_ms"])
        r.put("fixed 2000/s median 1-s window", ws["median_window_ms"])
        r.put("fixed 2000/s worst/median window", ws["worst_over_median"])
        r.put("fixed 2000/s server CPU", fixed["server_cpu_s"] / fixed["wall_s"])
        e2e = parse_e2e(side.e2e("e2e", sizes.e2e_records))
        r.raw["e2e"] = e2e
        r.put("e2e one at a time p50", e2e["p50_ms"])
        r.put("e2e one at a time p99", e2e["p99_ms"])
        r.put("e2e one at a time p99.9", e2e["p999_ms"])
        r.put("rf3 peak RSS", r.peak_rss_mib())
    finally:
        side.stop()
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round (under 10 minutes)")
    ap.add_argument("--repeat", type=int, help="rounds per system (default 3; 1 with --quick)")
    ap.add_argument("--only", choices=["single", "rf3"], help="one topology only")
    ap.add_argument("--systems", default="gregor,kafka", help="comma-separated: gregor,kafka")
    args = ap.parse_args()
    # SIGTERM unwinds like an exception, so every round's finally stops its cluster (no orphaned JVMs).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    repeat = args.repeat or (1 if args.quick else 3)
    sizes = Sizes(args.quick)
    systems = args.systems.split(",")
    dist = ensure_kafka() if "kafka" in systems else None
    rounds: list[dict[str, Any]] = []
    topologies: list[tuple[str, Callable[[Any, Sizes], Round]]] = [("single", single_round), ("rf3", rf3_round)]
    if args.only:
        topologies = [t for t in topologies if t[0] == args.only]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        base = Path(tmp)
        make = {"kafka": lambda: KafkaSide(dist, base), "gregor": lambda: GregorSide(base)}
        for rep in range(repeat):
            order = systems if rep % 2 == 0 else list(reversed(systems))
            for topo_name, fn in topologies:
                for system in order:
                    print(f"round {rep + 1}/{repeat} {topo_name} {system}", flush=True)
                    r = fn(make[system](), sizes)
                    rounds.append({"system": system, "round": rep, "topology": topo_name, "values": r.values,
                                   "load": r.load, "raw": r.raw})
    rows = build_rows(rounds, METRICS)
    table = format_table(rows)
    name = "vs_kafka_quick" if args.quick else "vs_kafka"
    params = {"repeat": repeat, "quick": args.quick, "record_bytes": RECORD_BYTES, "fixed_rate": FIXED_RATE,
              "sizes": vars(sizes), "kafka_version": dist.version if dist else None, "systems": systems}
    path = write_results(name, params, rounds)
    (RESULTS_DIR / f"{name}.md").write_text(table + "\n")
    print(table)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
