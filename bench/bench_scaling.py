"""Scaling figures, Gregor and Apache Kafka side by side (issue 15): producer throughput and latency
against the partition count (1, 16, 128), the record size (100 B, 1 KiB, 10 KiB) and the broker
count (1 broker acks=1; 3 brokers RF 3 acks=all, min.insync.replicas=2).

Same systems, tools and alternation as bench_vs_kafka.py (its KafkaSide / GregorSide); each cell
moves --mib MiB of record values with --throughput -1 and default producer settings, and reports
MB/s and the tool's p99 latency (at full speed, so it is queueing latency, not the idle path).
Writes bench/results/scaling.json and .md, and with --chart docs/scaling.png (matplotlib, in the
`bench` extra).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_vs_kafka import GregorSide, KafkaSide  # noqa: E402
from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.kafka_dist import ensure_kafka  # noqa: E402
from bench.vs_kafka_report import build_rows, format_table, parse_produce  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = (1, 16, 128)
RECORD_SIZES = (100, 1024, 10240)
BASE_PARTITIONS = 16  # the record-size sweep's partition count
BASE_SIZE = 1024  # the partition sweep's record size


def cells() -> list[tuple[int, int]]:
    """(partitions, record bytes) of every cell: the partition sweep at 1 KiB, the size sweep at 16 partitions."""
    out = [(p, BASE_SIZE) for p in PARTITIONS]
    out += [(BASE_PARTITIONS, s) for s in RECORD_SIZES if (BASE_PARTITIONS, s) not in out]
    return out


def run_topology(side: Any, brokers: int, mib: int) -> dict[str, float]:
    values: dict[str, float] = {}
    acks = "1" if brokers == 1 else "all"
    side.start(brokers)
    try:
        for partitions, size in cells():
            topic = f"s-{partitions}-{size}"
            side.create_topic(topic, partitions, min(brokers, 3))
            records = max(1000, mib * (1 << 20) // size)
            result = parse_produce(side.produce(topic, records, -1, {"acks": acks}, 5000, record_size=size))
            label = f"{brokers}b {partitions}p {size}B"
            values[f"{label} MB/s"] = result["mb_per_sec"]
            values[f"{label} p99 ms"] = result["p99_ms"]
            print(f"  {side.name:<6} {label:<18} {result['mb_per_sec']:8.2f} MB/s  p99 {result['p99_ms']:.0f} ms "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        side.stop()
    return values


def chart(rounds: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import statistics

    def med(system: str, key: str) -> float:
        vs = [r["values"][key] for r in rounds if r["system"] == system and key in r["values"]]
        return statistics.median(vs) if vs else float("nan")

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for row, brokers in enumerate((1, 3)):
        for col, (sweep, xs) in enumerate((("partitions", PARTITIONS), ("record bytes", RECORD_SIZES))):
            ax = axes[row][col]
            for system, style in (("gregor", "o-"), ("kafka", "s--")):
                keys = [f"{brokers}b {x}p {BASE_SIZE}B MB/s" if sweep == "partitions" else
                        f"{brokers}b {BASE_PARTITIONS}p {x}B MB/s" for x in xs]
                ax.plot([str(x) for x in xs], [med(system, k) for k in keys], style, label=system.capitalize())
            ax.set_title(f"{brokers} broker{'s RF 3 acks=all' if brokers > 1 else ' acks=1'}: MB/s vs {sweep}")
            ax.set_xlabel(sweep)
            ax.set_ylabel("MB/s (medians)")
            ax.set_yscale("log")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=30, help="MiB of record values per cell")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--chart", action="store_true", help="write docs/scaling.png")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dist = ensure_kafka()
    rounds: list[dict[str, Any]] = []
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        base = Path(tmp)
        for rep in range(args.repeat):
            order = ["gregor", "kafka"] if rep % 2 == 0 else ["kafka", "gregor"]
            for brokers in (1, 3):
                for system in order:
                    side = GregorSide(base) if system == "gregor" else KafkaSide(dist, base)
                    print(f"round {rep + 1}/{args.repeat} {brokers} broker(s) {system}", flush=True)
                    values = run_topology(side, brokers, args.mib)
                    rounds.append({"system": system, "round": rep, "values": values, "load": {}})
    metrics = []
    for brokers in (1, 3):
        for partitions, size in cells():
            label = f"{brokers}b {partitions}p {size}B"
            metrics += [(f"{label} MB/s", "MB/s", "higher"), (f"{label} p99 ms", "ms", "lower")]
    table = format_table(build_rows(rounds, metrics))
    write_results("scaling", {"mib": args.mib, "repeat": args.repeat, "cells": cells()}, rounds)
    (RESULTS_DIR / "scaling.md").write_text(table + "\n")
    print(table)
    if args.chart:
        chart(rounds, ROOT / "docs" / "scaling.png")
        print("chart: docs/scaling.png")


if __name__ == "__main__":
    main()
