"""The data curve of issue 24: a standalone broker's CPU per chunk appended as one topic grows.

One etcd + one standalone broker; one 16-partition topic (bench_send_path's cell); `gregor perf produce`
appends chunks of --records records of 1 KiB (acks=1) until --gb GB are in the topic. After every
chunk this prints the broker's user and system CPU seconds for that chunk, the topic's bytes on disk,
its segment count, the broker's open file descriptors and memory maps, and the machine's dirty page
cache, so a bend in the curve shows with what moved alongside it. --segment-mib sets the topic's
segment.bytes (default: the broker's 1 GiB), e.g. 64 for Kafka-sized small segments.

This is the measurement behind the "CPU per 300,000 records tripled once ~1.5 GB was in the topic"
report (bench_send_path.py's docstring); docs/benchmarks.md has the curve.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_send_path import PARTITIONS, RECORD_BYTES, services_env  # noqa: E402
from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.vs_kafka_report import parse_produce  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def dirty_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Dirty:"):
            return int(line.split()[1]) / 1024
    return 0.0


def topic_stats(broker_dir: Path, topic: str) -> tuple[int, int]:
    """(bytes of the topic's segment files, number of segments) under the broker's log dir."""
    size = segments = 0
    for part in broker_dir.rglob(f"{topic}-*"):
        if part.is_dir():
            for f in part.iterdir():
                if f.suffix == ".log":
                    size += f.stat().st_size
                    segments += 1
    return size, segments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000, help="records of 1 KiB per chunk")
    ap.add_argument("--gb", type=float, default=3.0, help="stop once the topic holds this many GB")
    ap.add_argument("--segment-mib", type=int, default=0, help="the topic's segment.bytes in MiB (0: default)")
    ap.add_argument("--sync", action="store_true", help="sync(2) before every chunk (no dirty pages carried over)")
    ap.add_argument("--quick", action="store_true", help="30,000-record chunks up to 0.3 GB (smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.records, args.gb = 30_000, 0.3
    from gregor.cli.local_cluster import LocalCluster

    env = services_env(ROOT / "services")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        cluster = LocalCluster.up(tmp, brokers=1, controllers=0)
        try:
            cli = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", cluster.bootstrap]
            create = [*cli, "topics", "create", "curve", "--partitions", str(PARTITIONS), "--replication-factor", "1"]
            if args.segment_mib:
                create += ["--config", f"segment.bytes={args.segment_mib << 20}"]
            subprocess.run(create, env=env, check=True, capture_output=True)
            broker = cluster.by_role("broker")[0]
            broker_dir = Path(broker.data_dir)
            print(f"{'GB before':>9} {'MB/s':>7} {'user s':>7} {'sys s':>7} {'segs':>5} {'fds':>5} {'maps':>6} "
                  f"{'dirty MiB':>9}", flush=True)
            while True:
                size, segments = topic_stats(broker_dir, "curve")
                if size >= args.gb * 1e9:
                    break
                if args.sync:
                    os.sync()
                dirty = dirty_mib()
                u0, s0 = cpu_split(broker.pid)
                out = subprocess.run([*cli, "perf", "produce", "--topic", "curve", "--num-records", str(args.records),
                                      "--record-size", str(RECORD_BYTES), "--throughput", "-1",
                                      "--producer-props", "acks=1"], env=env, capture_output=True, text=True,
                                     check=True).stdout
                u1, s1 = cpu_split(broker.pid)
                row = {"gb_before": size / 1e9, "segments": segments,
                       "mb_per_sec": parse_produce(out.splitlines())["mb_per_sec"],
                       "user_s": u1 - u0, "sys_s": s1 - s0, "dirty_mib_before": dirty,
                       "fds": len(os.listdir(f"/proc/{broker.pid}/fd")),
                       "maps": len(Path(f"/proc/{broker.pid}/maps").read_text().splitlines()),
                       "load": os.getloadavg()[0]}
                rows.append(row)
                print(f"{row['gb_before']:9.2f} {row['mb_per_sec']:7.1f} {row['user_s']:7.2f} {row['sys_s']:7.2f} "
                      f"{segments:5d} {row['fds']:5d} {row['maps']:6d} {dirty:9.0f}", flush=True)
        finally:
            cluster.down()
    if len(rows) >= 4:
        half = len(rows) // 2
        first = statistics.median(r["user_s"] + r["sys_s"] for r in rows[:half])
        last = statistics.median(r["user_s"] + r["sys_s"] for r in rows[half:])
        print(f"broker CPU per chunk, median: first half {first:.2f} s, second half {last:.2f} s "
              f"(ratio {last / first:.2f})")
    write_results("data_curve", {"records": args.records, "gb": args.gb, "segment_mib": args.segment_mib,
                                 "sync": args.sync, "partitions": PARTITIONS, "record_bytes": RECORD_BYTES}, rows)


if __name__ == "__main__":
    main()
