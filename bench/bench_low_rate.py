"""The fixed-rate acks=all cell of `make bench-vs-kafka` on its own, Gregor only (issue 15, item 4):
2,000 rec/s of 1 KiB, acks=all, RF 3, min.insync.replicas=2, one partition, 3 brokers + 1 controller
+ etcd, `gregor perf produce --throughput 2000` with default producer settings (linger.ms=5).

Prints p50/p99/p99.9 of the producer and the server CPU in cores over the run, split per process
(etcd, controller, each broker, the leader marked), with the load average, for each of --rounds
fresh clusters. Kafka's figures of the same cell come from `make bench-vs-kafka`; this bench is the
quick loop for the replication path's CPU and latency (a few minutes, no JVM).

--baseline DIR runs every round twice, alternating which goes first: once with the services of
another checkout (DIR/services, e.g. `git archive main services | tar -x -C DIR`) on PYTHONPATH for
the servers and the perf tool, once with this checkout's, and prints the new/old ratio of the
medians (the native module is the same for both).

Each line also gives the server CPU per produce request (µs, every server process over the brokers'
ProduceStream requests, from their gregor_requests_total): on a loaded machine the producer's batches
grow with its latency, so cores alone compare runs of different request rates; the CPU per request
does not depend on that.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.kafka_dist import proc_cpu_seconds  # noqa: E402
from bench.vs_kafka_report import parse_produce, window_stats  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RATE = 2000
RECORD_BYTES = 1024


# The topics bench_vs_kafka's rf3 round has created by the time it runs the fixed-rate cell (RF 3 each):
# every follower's fetch to a leader carries all the partitions it copies from that leader.
OTHER_TOPICS = (("idle", 100), ("p1", 1), ("p16", 16), ("p16m", 16), ("p16a1", 16), ("e2e", 1))


def create_cell_topics(cli: list[str], env: dict[str, str], topic: str, others: bool) -> int:
    """The cell's one-partition RF 3 topic, after bench_vs_kafka's other rf3 topics when others;
    returns the topic's leader (-1 if unknown)."""
    for name, parts in [*(OTHER_TOPICS if others else ()), (topic, 1)]:
        subprocess.run([*cli, "topics", "create", name, "--partitions", str(parts), "--replication-factor", "3",
                        "--config", "min.insync.replicas=2"], env=env, check=True, capture_output=True)
    described = subprocess.run([*cli, "-o", "json", "topics", "describe", topic], env=env,
                               capture_output=True, text=True).stdout
    return int(m[1]) if (m := re.search(r'"leader":\s*(\d+)', described)) else -1


def produce_requests(metrics_endpoints: list[str], api: str = "ProduceStream") -> float:
    """Requests of api the brokers have answered (gregor_requests_total, every code)."""
    total = 0.0
    for endpoint in metrics_endpoints:
        url = endpoint if endpoint.startswith("http") else f"http://{endpoint}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("gregor_requests_total{") and f'api="{api}"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def one_round(seconds: int, baseline: str | None, others: bool = True) -> dict[str, Any]:
    """A fresh cluster, one fixed-rate produce run: latency percentiles and per-process CPU cores."""
    from gregor.cli.local_cluster import LocalCluster

    services = os.path.join(baseline, "services") if baseline else str(ROOT / "services")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([services, str(ROOT)])}
    env.pop("GREGOR_BOOTSTRAP", None)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]  # the servers LocalCluster starts inherit it
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        try:
            cluster = LocalCluster.up(tmp, brokers=3, controllers=1)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        try:
            cli = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", cluster.bootstrap]
            leader = create_cell_topics(cli, env, "fixed", others)
            time.sleep(5)  # every partition's followers caught up, as in bench_vs_kafka
            procs = {(f"{p.role}-{p.id}" + ("*" if p.role == "broker" and p.id == leader else "")): p.pid
                     for p in cluster.processes}
            brokers = [p.metrics for p in cluster.by_role("broker")]
            requests0, fetches0 = produce_requests(brokers), produce_requests(brokers, "ReplicaFetch")
            cpu0 = {name: proc_cpu_seconds(pid) for name, pid in procs.items()}
            t0 = time.monotonic()
            out = subprocess.run([*cli, "perf", "produce", "--topic", "fixed", "--num-records",
                                  str(RATE * seconds), "--record-size", str(RECORD_BYTES), "--throughput",
                                  str(RATE), "--reporting-interval", "1000", "--producer-props", "acks=all"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            wall = time.monotonic() - t0
            cores = {name: (proc_cpu_seconds(pid) - cpu0[name]) / wall for name, pid in procs.items()}
            requests = produce_requests(brokers) - requests0
            fetches = produce_requests(brokers, "ReplicaFetch") - fetches0
        finally:
            cluster.down()
    result = parse_produce(out.splitlines())
    result.update(window_stats(result["windows"]))
    return {"legacy": baseline is not None, "load": os.getloadavg()[0], "wall_s": wall, "cores": cores,
            "server_cores": sum(cores.values()), "produce_requests": requests, "replica_fetches": fetches,
            "us_per_request": sum(cores.values()) * wall / requests * 1e6 if requests else 0.0, **{k: v for k, v in result.items() if k != "windows"}}


def show(r: dict[str, Any]) -> None:
    per = "  ".join(f"{name} {c:.3f}" for name, c in sorted(r["cores"].items()))
    print(f"  {'old' if r['legacy'] else 'new'}  p50 {r['p50_ms']:.0f}  p99 {r['p99_ms']:.0f}  "
          f"p99.9 {r['p999_ms']:.0f} ms  median 1-s window {r['median_window_ms']:.2f} ms  "
          f"server {r['server_cores']:.3f} cores ({per})  {r['produce_requests']:.0f} requests, "
          f"{r['us_per_request']:.0f} µs CPU each, {r['replica_fetches'] / max(r['produce_requests'], 1):.2f} replica "
          f"fetches each  load {r['load']:.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=20, help="length of each produce run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--alone", action="store_true",
                    help="only the fixed topic (default: also bench_vs_kafka's other topics, 150 partitions)")
    ap.add_argument("--baseline", help="a checkout whose services/ to run each round with too (the old code)")
    args = ap.parse_args()
    runs: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = [True, False] if args.baseline and i % 2 == 0 else [False, True] if args.baseline else [False]
        for legacy in order:
            r = one_round(args.seconds, args.baseline if legacy else None, not args.alone)
            runs.append(r)
            show(r)
    for legacy in ([True, False] if args.baseline else [False]):
        rs = [r for r in runs if r["legacy"] == legacy]
        print(f"{'old' if legacy else 'new'} median of {len(rs)}: p50 {statistics.median(r['p50_ms'] for r in rs):.1f} ms"
              f"  p99 {statistics.median(r['p99_ms'] for r in rs):.1f} ms"
              f"  server {statistics.median(r['server_cores'] for r in rs):.3f} cores"
              f"  {statistics.median(r['us_per_request'] for r in rs):.0f} µs CPU per produce request")
    if args.baseline:
        old = [r for r in runs if r["legacy"]]
        new = [r for r in runs if not r["legacy"]]
        for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("median_window_ms", "median 1-s window"),
                           ("server_cores", "server CPU"), ("us_per_request", "CPU per produce request")):
            o, n = statistics.median(r[key] for r in old), statistics.median(r[key] for r in new)
            print(f"new/old {label}: {n:.3f} / {o:.3f} = {n / o:.2f}x" if o else f"new/old {label}: {n} / {o}")
    write_results("low_rate", {"seconds": args.seconds, "rounds": args.rounds, "baseline": args.baseline,
                               "rate": RATE, "record_bytes": RECORD_BYTES}, runs)


if __name__ == "__main__":
    main()
