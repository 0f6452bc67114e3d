"""The same client on both sides (issue 22, point 6): Kafka's own perf tools against Gregor's Kafka listener
and against Apache Kafka in the same run, and Gregor's gRPC path against its Kafka path.

`make bench-vs-kafka` runs it after bench_vs_kafka.py (`QUICK=1`: the quick form, a few minutes); alone:
`python bench/bench_same_client.py [--quick] [--repeat N]`. Every cell drives ProducerPerformance,
ConsumerPerformance or EndToEndLatency (kafka-tools 4.4.0, `java -cp`, 1 KiB records, default producer
settings plus the cell's) at a bootstrap address: Gregor's brokers' Kafka listeners or Kafka's brokers.
Rounds alternate which system goes first; each round starts fresh clusters.

Cells (Kafka's tools on both systems unless said):
  single   one broker (Kafka: one combined KRaft node; Gregor: etcd, a controller, one broker, a group
           coordinator: the roles Kafka's one node plays):
           produce acks=1 (1 partition), consume.
  rf3      three brokers (Kafka: a KRaft controller + 3 brokers; Gregor: etcd, a controller, 3 brokers, a
           group coordinator),
           topics with replication factor 3 and min.insync.replicas=2: produce acks=all (1 and 8 partitions),
           a fixed rate acks=all (1,000 rec/s; 100 with --quick; p50/p99 of every record, and the p99 of
           the records after the first WARMUP_S seconds' worth, ProducerPerformance's --warmup-records;
           on Gregor also the p99 of the listener's own Produce time meanwhile, from the brokers'
           gregor_kafka_request_duration_seconds histogram: what the listener adds, without the client's
           queueing), EndToEndLatency one record at a time (acks=all).
  path     Gregor only, rf3: the same acks=all load through `gregor perf produce` (the gRPC client) and through
           ProducerPerformance (the Kafka listener): MB/s and the fixed-rate p99 of each, and their ratio.
  rdkafka  librdkafka (confluent-kafka, bench/rdkafka_perf.py in a process of its own: the native client,
           where the JVM producer starved on a shared machine was the bottleneck of the cells above), rf3, on
           both systems: acks=all with 1 and 8 partitions (MB/s; with 8 also the MB/s after the first second,
           the client's start left out, and the CPU seconds of every server process per GiB produced, /proc
           utime + stime), a fixed rate acks=all (p50/p99 of the
           produce()-to-delivery-report latencies, the p99 after warm-up and the listener's p99 as above, and
           every server process's CPU over the run in cores: issue 24's low-rate floor).
           Producer settings: librdkafka's defaults plus acks=all,
           enable.idempotence=true, linger.ms=5 (the gRPC client's and Kafka's Java producer's linger). Each
           system's round starts with an unmeasured librdkafka run (Sizes.rdkafka_records into 8 partitions):
           Kafka's brokers are JVMs, and without the JVM cells before them they would be measured cold.
  rdkafka path  Gregor only, rf3: the same loads through librdkafka (the Kafka listener) and through
           `gregor perf produce` (gRPC; its defaults: acks=all, idempotence, linger.ms=5), same records, record
           size, partitions; which of the two goes first alternates by round. The throughput pair sends
           Sizes.path_records (1,000,000; 300,000 with --quick) so that librdkafka's idempotent start (~0.5 s,
           its producer-id timer, against either system) is not a third of the run as in the 200,000-record
           cell above: MB/s, the servers' and the client process's CPU per GiB; "after the first second":
           librdkafka's records delivered after it, perf produce's progress windows after the first. The
           fixed-rate p50/p99. Ratio Kafka listener / gRPC.

`--only rdkafka` runs the rf3 topology with the librdkafka and rdkafka-path cells only (no JVM tools).

Writes bench/results/same_client[_quick][_ONLY].json and .md and prints the table (median and spread per system,
ratio Gregor/Kafka, median load average while the cell ran).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import RESULTS_DIR, run_tool, write_results  # noqa: E402
from bench.kafka_dist import (CONSUMER_PERF, END_TO_END_LATENCY, GROUP_SETTINGS, PRODUCER_PERF,  # noqa: E402
                              KafkaCluster, KafkaDist, ensure_kafka)
from bench.vs_kafka_report import build_rows, format_table, parse_consume, parse_e2e, parse_produce  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECORD_BYTES = 1024
TICKS = os.sysconf("SC_CLK_TCK")
TOOL_TIMEOUT_S = 600
MIN_ISR = "2"
# The fixed-rate cells' first seconds are the producer's start (a JVM's class loading and JIT, the first
# Metadata, InitProducerId): records sent meanwhile queue up and then go out at once. ProducerPerformance's
# --warmup-records leaves this many seconds' worth out of a second, steady-state summary.
WARMUP_S = 2


class Sizes:
    def __init__(self, quick: bool) -> None:
        self.single_records = 20_000 if quick else 200_000
        self.rf3_records = 10_000 if quick else 100_000
        self.fixed_s = 8 if quick else 30
        self.e2e_records = 200 if quick else 2000
        # well under what the slowest side sustains, so the cell measures latency, not a queue: on the shared
        # 2-core machine a starved producer JVM manages ~300 records/s of 1 KiB with acks=all
        self.fixed_rate = 100 if quick else 1000
        # librdkafka's cells: enough records that a native client's run lasts seconds, not a fraction of one
        self.rdkafka_records = 60_000 if quick else 200_000
        # the throughput pair of the rdkafka path cells: long enough that librdkafka's idempotent start (its
        # producer-id timer waits ~0.5 s before InitProducerId, against either system) is a small share of the
        # run; 200,000 records take ~1.5 s, a third of it that start (measured: 2026-11-27 20:40 UTC)
        self.path_records = 300_000 if quick else 1_000_000


METRICS = [  # (name, unit, better), table order
    ("single produce acks=1 p1 (ProducerPerformance)", "MB/s", "higher"),
    ("single consume (ConsumerPerformance)", "MB/s", "higher"),
    ("rf3 produce acks=all p1 (ProducerPerformance)", "MB/s", "higher"),
    ("rf3 produce acks=all p8 (ProducerPerformance)", "MB/s", "higher"),
    ("rf3 fixed rate acks=all p50 (ProducerPerformance)", "ms", "lower"),
    ("rf3 fixed rate acks=all p99 (ProducerPerformance)", "ms", "lower"),
    ("rf3 fixed rate acks=all p99 after warm-up (ProducerPerformance)", "ms", "lower"),
    ("rf3 fixed rate acks=all listener Produce p99 (ProducerPerformance)", "ms", "lower"),
    ("rf3 e2e one at a time p50 (EndToEndLatency)", "ms", "lower"),
    ("rf3 e2e one at a time p99 (EndToEndLatency)", "ms", "lower"),
]
PATH_METRICS = [  # Gregor only: gRPC client vs Kafka listener, same cluster, same load
    ("rf3 produce acks=all p8", "MB/s", "higher"),
    ("rf3 fixed rate acks=all p99", "ms", "lower"),
]
RDKAFKA_METRICS = [  # librdkafka on both systems, rf3
    ("rf3 produce acks=all p1 (librdkafka)", "MB/s", "higher"),
    ("rf3 produce acks=all p8 (librdkafka)", "MB/s", "higher"),
    ("rf3 produce acks=all p8 after the first second (librdkafka)", "MB/s", "higher"),
    ("rf3 produce acks=all p8 server CPU (librdkafka)", "s/GiB", "lower"),
    ("rf3 fixed rate acks=all p50 (librdkafka)", "ms", "lower"),
    ("rf3 fixed rate acks=all p99 (librdkafka)", "ms", "lower"),
    ("rf3 fixed rate acks=all p99 after warm-up (librdkafka)", "ms", "lower"),
    ("rf3 fixed rate acks=all listener Produce p99 (librdkafka)", "ms", "lower"),
    ("rf3 fixed rate acks=all, every server's CPU (librdkafka)", "cores", "lower"),
]
RDKAFKA_PATH_METRICS = [  # Gregor only: `gregor perf produce` (gRPC) vs librdkafka (Kafka listener)
    ("rf3 produce acks=all p8, librdkafka", "MB/s", "higher"),
    ("rf3 produce acks=all p8 after the first second, librdkafka", "MB/s", "higher"),
    ("rf3 produce acks=all p8 server CPU, librdkafka", "s/GiB", "lower"),
    ("rf3 produce acks=all p8 client CPU, librdkafka", "s/GiB", "lower"),
    ("rf3 fixed rate acks=all p50, librdkafka", "ms", "lower"),
    ("rf3 fixed rate acks=all p99, librdkafka", "ms", "lower"),
]
RDKAFKA_PROPS = ["acks=all", "enable.idempotence=true", "linger.ms=5"]


def cpu_s(pids: list[int]) -> float:
    """utime + stime of these processes (/proc), seconds; a process gone since counts nothing."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def children_cpu_s() -> float:
    """utime + stime of this process's waited-for children (the client tools run to completion), seconds."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def drop_page_cache() -> None:
    """sync, then drop the clean page cache (vm.drop_caches=1) where allowed (root)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        pass


def _run(cmd: list[str], env: Optional[dict[str, str]] = None) -> list[str]:
    return run_tool(cmd, TOOL_TIMEOUT_S, env)


class Tools:
    """Kafka's perf tools at one bootstrap address."""

    def __init__(self, dist: KafkaDist, bootstrap: str) -> None:
        self.dist, self.bootstrap = dist, bootstrap

    def produce(self, topic: str, records: int, acks: str, throughput: int = -1, warmup: int = 0) -> dict[str, Any]:
        return parse_produce(_run(self.dist.command(
            PRODUCER_PERF, "--bootstrap-server", self.bootstrap, "--topic", topic, "--num-records", str(records),
            "--record-size", str(RECORD_BYTES), "--throughput", str(throughput), "--reporting-interval", "1000",
            *(["--warmup-records", str(warmup)] if warmup else []), "--producer-props", f"acks={acks}", heap="512m")))

    def consume(self, topic: str, records: int) -> dict[str, float]:
        return parse_consume(_run(self.dist.command(
            CONSUMER_PERF, "--bootstrap-server", self.bootstrap, "--topic", topic, "--num-records", str(records),
            "--timeout", "60000", heap="512m")))

    def rdkafka(self, topic: str, records: int, throughput: int = -1, warmup: int = 0) -> dict[str, Any]:
        """librdkafka's producer (bench/rdkafka_perf.py) in a process of its own."""
        import json

        out = _run([sys.executable, str(ROOT / "bench" / "rdkafka_perf.py"), "--bootstrap", self.bootstrap,
                    "--topic", topic, "--num-records", str(records), "--record-size", str(RECORD_BYTES),
                    "--throughput", str(throughput), "--warmup-records", str(warmup), "--producer-props",
                    *RDKAFKA_PROPS])
        return dict(json.loads(out[-1]))

    def e2e(self, topic: str, records: int) -> dict[str, float]:
        return parse_e2e(_run(self.dist.command(END_TO_END_LATENCY, self.bootstrap, topic, str(records), "all",
                                                str(RECORD_BYTES), heap="512m")))


class Gregor:
    name = "gregor"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cluster: Any = None
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT)])}

    def start(self, brokers: int) -> str:
        from gregor.cli.local_cluster import LocalCluster

        # A controller and a group coordinator even for one broker: Kafka's single node is its own controller
        # and group coordinator, and ConsumerPerformance consumes in a group.
        self.cluster = LocalCluster.up(str(self.base / f"gregor-{brokers}-{time.monotonic_ns()}"), brokers=brokers,
                                       controllers=1, coordinators=1, coordinator_overrides=dict(GROUP_SETTINGS))
        return str(self.cluster.to_json()["kafka_bootstrap"])

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.down()
            shutil.rmtree(self.cluster.data_dir, ignore_errors=True)
            self.cluster = None

    def server_pids(self) -> list[int]:
        """Every server process: etcd, the controller, the brokers, the group coordinator."""
        return [p.pid for p in self.cluster.processes]

    def produce_histogram(self) -> dict[float, float]:
        """The brokers' gregor_kafka_request_duration_seconds{api="Produce"} buckets, summed: le -> count."""
        import urllib.request

        out: dict[float, float] = {}
        prefix = 'gregor_kafka_request_duration_seconds_bucket{api="Produce",le="'
        for b in self.cluster.by_role("broker"):
            with urllib.request.urlopen(b.metrics, timeout=10) as resp:
                for line in resp.read().decode().splitlines():
                    if line.startswith(prefix):
                        le = float(line[len(prefix):].split('"', 1)[0])
                        out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def gregor(self, *args: str) -> list[str]:
        return _run([sys.executable, "-m", "gregor.cli.main", "--bootstrap", self.cluster.bootstrap, *args],
                    env=self.env)

    def create_topic(self, name: str, partitions: int, rf: int) -> None:
        args = ["topics", "create", name, "--partitions", str(partitions), "--replication-factor", str(rf)]
        self.gregor(*args, *(["--config", f"min.insync.replicas={MIN_ISR}"] if rf > 1 else []))

    def grpc_produce(self, topic: str, records: int, acks: str, throughput: int = -1) -> dict[str, Any]:
        return parse_produce(self.gregor("perf", "produce", "--topic", topic, "--num-records", str(records),
                                         "--record-size", str(RECORD_BYTES), "--throughput", str(throughput),
                                         "--reporting-interval", "1000", "--producer-props", f"acks={acks}"))


class Kafka:
    name = "kafka"

    def __init__(self, dist: KafkaDist, base: Path) -> None:
        self.dist, self.base = dist, base
        self.cluster: Optional[KafkaCluster] = None

    def start(self, brokers: int) -> str:
        self.cluster = KafkaCluster(self.dist, self.base / f"kafka-{brokers}-{time.monotonic_ns()}", brokers=brokers)
        self.cluster.start()
        return self.cluster.bootstrap

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            shutil.rmtree(self.cluster.base_dir, ignore_errors=True)
            self.cluster = None

    def server_pids(self) -> list[int]:
        assert self.cluster is not None
        return self.cluster.pids

    def create_topic(self, name: str, partitions: int, rf: int) -> None:
        assert self.cluster is not None
        self.cluster.create_topic(name, partitions, rf, {"min.insync.replicas": MIN_ISR} if rf > 1 else None)


class Round:
    def __init__(self, system: str) -> None:
        self.system = system
        self.values: dict[str, float] = {}
        self.load: dict[str, float] = {}
        self.raw: dict[str, Any] = {}

    def put(self, metric: str, value: float, raw: Any = None) -> None:
        self.values[metric] = value
        self.load[metric] = os.getloadavg()[0]
        if raw is not None:
            self.raw[metric] = raw
        print(f"  {self.system:<12} {metric:<52} {value:,.2f}  (load {self.load[metric]:.2f})", flush=True)


def single_round(side: Any, dist: KafkaDist, sizes: Sizes) -> Round:
    r = Round(side.name)
    tools = Tools(dist, side.start(1))
    try:
        side.create_topic("p1", 1, 1)
        n = sizes.single_records
        out = tools.produce("p1", n, "1")
        r.put(METRICS[0][0], out["mb_per_sec"], out)
        consumed = tools.consume("p1", n)
        r.put(METRICS[1][0], consumed["mb_per_sec"], consumed)
    finally:
        side.stop()
    return r


def rf3_round(side: Any, dist: KafkaDist, sizes: Sizes, jvm: bool = True, rdkafka: bool = True,
              rep: int = 0) -> tuple[Round, list[Round]]:
    """Kafka's tools and librdkafka on either system; on Gregor also the gRPC client with the same loads (the
    `path` cells: one merged round per client compared, JVM and librdkafka)."""
    r = Round(side.name)
    gregor = isinstance(side, Gregor)
    paths: list[Round] = []
    tools = Tools(dist, side.start(3))
    try:
        topics = [("p1", 1), ("p8", 8), ("p8g", 8), ("fixed", 1), ("fixedg", 1), ("e2e", 1)] if jvm else []
        topics += [("warmup", 8), ("r1", 1), ("r8", 8), ("rfixed", 1), ("rp8", 8), ("r8g", 8), ("rfixedg", 1)] if rdkafka else []
        for name, parts in topics:
            side.create_topic(name, parts, 3)
        if jvm:
            paths += _jvm_cells(side, tools, r, sizes)
        if rdkafka:
            paths += _rdkafka_cells(side, tools, r, sizes, grpc_first=gregor and rep % 2 == 1)
    finally:
        side.stop()
    return r, paths


def steady_mb_per_sec(windows: list[dict[str, float]]) -> float:
    """A perf tool's throughput after its first progress window (1 s): the client's start left out. The records
    of the windows after the first over their durations (records / records_per_sec); NaN with fewer than two."""
    ws = [w for w in windows[1:] if w["records_per_sec"] > 0]
    if not ws:
        return float("nan")
    return sum(w["records"] for w in ws) * RECORD_BYTES / 2**20 / sum(w["records"] / w["records_per_sec"] for w in ws)


def listener_p99_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound (ms) of the histogram bucket holding the 99th percentile of the Produce requests
    between two snapshots: the listener's own time for a Produce (read, append, acks, answer built), without
    the client's queueing. Coarse: prometheus's default buckets (5, 10, 25, 50, 75, 100, 250, 500 ms, ...)."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1] if delta else 0.0
    for le, count in delta:
        if total and count >= 0.99 * total:
            return le * 1000.0
    return float("nan")


def _fixed_listener_p99(side: Any, run: Any) -> tuple[Any, float]:
    """run() on either system; on Gregor also the listener's own Produce p99 meanwhile."""
    if not isinstance(side, Gregor):
        return run(), float("nan")
    before = side.produce_histogram()
    out = run()
    return out, listener_p99_ms(before, side.produce_histogram())


def _jvm_cells(side: Any, tools: Tools, r: Round, sizes: Sizes) -> list[Round]:
    n = sizes.rf3_records
    out = tools.produce("p1", n, "all")
    r.put(METRICS[2][0], out["mb_per_sec"], out)
    out = tools.produce("p8", n, "all")
    r.put(METRICS[3][0], out["mb_per_sec"], out)
    fixed, listener_p99 = _fixed_listener_p99(side, lambda: tools.produce(
        "fixed", sizes.fixed_rate * sizes.fixed_s, "all", throughput=sizes.fixed_rate, warmup=sizes.fixed_rate * WARMUP_S))
    r.put(METRICS[4][0], fixed["p50_ms"], fixed)
    r.put(METRICS[5][0], fixed["p99_ms"])
    r.put(METRICS[6][0], fixed["steady"]["p99_ms"] if "steady" in fixed else float("nan"))
    if listener_p99 == listener_p99:
        r.put(METRICS[7][0], listener_p99)
    e2e = tools.e2e("e2e", sizes.e2e_records)
    r.put(METRICS[8][0], e2e["p50_ms"], e2e)
    r.put(METRICS[9][0], e2e["p99_ms"])
    if not isinstance(side, Gregor):
        return []
    grpc, kafka_path = Round("gregor-grpc"), Round("gregor-kafka")
    kafka_path.put(PATH_METRICS[0][0], r.values[METRICS[3][0]])
    kafka_path.put(PATH_METRICS[1][0], r.values[METRICS[5][0]])  # p99 of the whole run, as perf produce's
    out = side.grpc_produce("p8g", n, "all")
    grpc.put(PATH_METRICS[0][0], out["mb_per_sec"], out)
    out = side.grpc_produce("fixedg", sizes.fixed_rate * sizes.fixed_s, "all", throughput=sizes.fixed_rate)
    grpc.put(PATH_METRICS[1][0], out["p99_ms"], out)
    return [_merge(grpc, kafka_path, "path")]


def _rdkafka_cells(side: Any, tools: Tools, r: Round, sizes: Sizes, grpc_first: bool) -> list[Round]:
    """librdkafka's cells; on Gregor each of the path loads goes through gRPC right before or after (by round)
    the same load through librdkafka, so the two paths of a pair run in the same minute."""
    n, rate, fixed_n = sizes.rdkafka_records, sizes.fixed_rate, sizes.fixed_rate * sizes.fixed_s
    grpc, kafka_path = Round("gregor-grpc"), Round("gregor-kafka")
    gregor = isinstance(side, Gregor)
    # Unmeasured warm-up on both systems: a JVM broker runs interpreted until its JIT has compiled the produce
    # path. With the JVM cells before (the full form) Kafka's brokers are warm; with --only rdkafka they were not,
    # and Run 5 in docs/benchmarks.md compared Gregor with a cold Kafka (33.6 s/GiB of server CPU against 11.3
    # once warm, 2026-11-27 21:40 UTC).
    tools.rdkafka("warmup", n)
    out = tools.rdkafka("r1", n)
    r.put(RDKAFKA_METRICS[0][0], out["mb_per_sec"], out)

    def pair(kafka_cell: Any, grpc_cell: Any) -> None:
        if not gregor:
            kafka_cell()
        elif grpc_first:
            grpc_cell(), kafka_cell()
        else:
            kafka_cell(), grpc_cell()

    def r8() -> None:
        cpu0 = cpu_s(side.server_pids())
        out = tools.rdkafka("r8", n)
        r.put(RDKAFKA_METRICS[1][0], out["mb_per_sec"], out)
        r.put(RDKAFKA_METRICS[2][0], out["steady_mb_per_sec"])
        r.put(RDKAFKA_METRICS[3][0], (cpu_s(side.server_pids()) - cpu0) / (n * RECORD_BYTES / 2**30))

    path_n = sizes.path_records
    path_gib = path_n * RECORD_BYTES / 2**30
    mb, steady, server_cpu, client_cpu = (m[0] for m in RDKAFKA_PATH_METRICS[:4])

    def measured(path: Round, produce: Any) -> dict[str, Any]:
        """One path's throughput run: the servers' and the client process's CPU per GiB beside its figures.
        Each run writes 3 GiB (RF 3); past ~2.4 GB of written data this VM's page cache costs every writer
        2-3x the system time ("the 1.5 GB CPU cliff" in docs/benchmarks.md), which made the second run of a
        pair ~1.9x the server CPU per GiB of the first whichever path it was. So the page cache is written
        back and dropped before each run (root only; otherwise only written back)."""
        drop_page_cache()
        cpu0, client0 = cpu_s(side.server_pids()), children_cpu_s()
        out = produce()
        path.put(server_cpu, (cpu_s(side.server_pids()) - cpu0) / path_gib)
        path.put(client_cpu, (children_cpu_s() - client0) / path_gib)
        path.put(mb, out["mb_per_sec"], out)
        return dict(out)

    def p8() -> None:
        out = measured(kafka_path, lambda: tools.rdkafka("rp8", path_n))
        kafka_path.put(steady, out["steady_mb_per_sec"])

    def g8() -> None:
        out = measured(grpc, lambda: side.grpc_produce("r8g", path_n, "all"))
        grpc.put(steady, steady_mb_per_sec(out["windows"]))

    def rfixed() -> None:
        # issue 24's low-rate floor, its CPU half: every server process (Gregor: etcd, the controller, the
        # brokers, the group coordinator; Kafka: its controller and brokers) over the fixed-rate run
        cpu0, t0 = cpu_s(side.server_pids()), time.monotonic()
        out, listener_p99 = _fixed_listener_p99(side, lambda: tools.rdkafka("rfixed", fixed_n, throughput=rate,
                                                                            warmup=rate * WARMUP_S))
        r.put(RDKAFKA_METRICS[8][0], (cpu_s(side.server_pids()) - cpu0) / (time.monotonic() - t0))
        r.put(RDKAFKA_METRICS[4][0], out["p50_ms"], out)
        r.put(RDKAFKA_METRICS[5][0], out["p99_ms"])
        r.put(RDKAFKA_METRICS[6][0], out["steady"]["p99_ms"])
        if listener_p99 == listener_p99:
            r.put(RDKAFKA_METRICS[7][0], listener_p99)
        if gregor:
            kafka_path.put(RDKAFKA_PATH_METRICS[4][0], out["p50_ms"])
            kafka_path.put(RDKAFKA_PATH_METRICS[5][0], out["p99_ms"])

    def gfixed() -> None:
        out = side.grpc_produce("rfixedg", fixed_n, "all", throughput=rate)
        grpc.put(RDKAFKA_PATH_METRICS[4][0], out["p50_ms"], out)
        grpc.put(RDKAFKA_PATH_METRICS[5][0], out["p99_ms"])

    r8()
    if gregor:  # the path pair: Gregor's two paths only
        pair(p8, g8)
    pair(rfixed, gfixed)
    return [_merge(grpc, kafka_path, "rdkafka-path")] if gregor else []


def _merge(grpc: Round, kafka_path: Round, name: str) -> Round:
    """The path cells as one round: the gRPC client in the "gregor" column, the Kafka listener in "kafka"."""
    merged = Round(name)
    merged.values = {f"grpc:{k}": v for k, v in grpc.values.items()}
    merged.values.update({f"kafka:{k}": v for k, v in kafka_path.values.items()})
    merged.load = {**{f"grpc:{k}": v for k, v in grpc.load.items()},
                   **{f"kafka:{k}": v for k, v in kafka_path.load.items()}}
    merged.raw = grpc.raw
    return merged


def path_rows(paths: list[Round], metrics: list[tuple[str, str, str]]) -> str:
    """gRPC client vs Kafka listener on Gregor: median of each, ratio gRPC/Kafka path."""
    rounds = []
    for p in paths:
        rounds.append({"system": "gregor", "values": {k[5:]: v for k, v in p.values.items() if k.startswith("grpc:")},
                       "load": {k[5:]: v for k, v in p.load.items() if k.startswith("grpc:")}})
        rounds.append({"system": "kafka", "values": {k[6:]: v for k, v in p.values.items() if k.startswith("kafka:")},
                       "load": {k[6:]: v for k, v in p.load.items() if k.startswith("kafka:")}})
    table = format_table(build_rows(rounds, metrics))
    table = table.replace("Gregor median", "gRPC client median").replace("Kafka median", "Kafka listener median")
    table = table.replace("Gregor/Kafka", "gRPC/Kafka listener")
    return "\n".join(line.replace("| Gregor |", "| gRPC |").replace("| Kafka |", "| Kafka listener |")
                     for line in table.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round (a few minutes)")
    ap.add_argument("--repeat", type=int, help="rounds per system (default 3; 1 with --quick)")
    ap.add_argument("--only", choices=["single", "rf3", "rdkafka"],
                    help="one topology only (rdkafka: rf3 with the librdkafka cells only)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every round's finally stops its cluster
    repeat = args.repeat or (1 if args.quick else 3)
    sizes = Sizes(args.quick)
    dist = ensure_kafka()
    rounds: list[dict[str, Any]] = []
    paths: list[Round] = []
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    topologies = {None: ("single", "rf3"), "single": ("single",), "rf3": ("rf3",), "rdkafka": ("rf3",)}[args.only]
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        base = Path(tmp)
        for rep in range(repeat):
            order: list[Any] = [Gregor(base), Kafka(dist, base)]
            if rep % 2:
                order.reverse()
            for topo in topologies:
                for side in order:
                    print(f"round {rep + 1}/{repeat} {topo} {side.name}", flush=True)
                    if topo == "single":
                        r = single_round(side, dist, sizes)
                    else:
                        r, path_rounds = rf3_round(side, dist, sizes, jvm=args.only != "rdkafka", rep=rep)
                        paths += path_rounds
                    rounds.append({"system": r.system, "round": rep, "topology": topo, "values": r.values,
                                   "load": r.load, "raw": r.raw})
    table = format_table(build_rows(rounds, METRICS + RDKAFKA_METRICS))
    jvm_paths = [p for p in paths if p.system == "path"]
    rdkafka_paths = [p for p in paths if p.system == "rdkafka-path"]
    text = f"{table}\n\nGregor's two paths (same rf3 cluster, same load; ratio = gRPC / Kafka listener):\n\n"
    text += "Kafka's Java producer on the Kafka listener:\n\n"
    text += path_rows(jvm_paths, PATH_METRICS) if jvm_paths else "(not run)"
    text += "\n\nlibrdkafka on the Kafka listener:\n\n"
    text += path_rows(rdkafka_paths, RDKAFKA_PATH_METRICS) if rdkafka_paths else "(not run)"
    name = "same_client_quick" if args.quick else "same_client"
    if args.only:
        name += f"_{args.only}"
    params = {"repeat": repeat, "quick": args.quick, "only": args.only, "record_bytes": RECORD_BYTES,
              "sizes": vars(sizes), "kafka_version": dist.version, "rdkafka_props": RDKAFKA_PROPS,
              "wall_s": round(time.monotonic() - t0, 1)}
    path = write_results(name, params, rounds + [{"system": p.system, "round": i, "values": p.values,
                                                  "load": p.load, "raw": p.raw} for i, p in enumerate(paths)])
    (RESULTS_DIR / f"{name}.md").write_text(text + "\n")
    print(text)
    print(f"results: {path} ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
