"""The file wall of issue 24: 10,000 partitions at RF 3 on 3 brokers within the machine's open-file limit.

`gregor cluster up`'s code starts etcd, one controller and three brokers, which inherit this shell's
`ulimit -n`. One `topics create` of --partitions partitions at RF 3; then one producer writes one
record to every partition (acks=1, then acks=all), once every partition is online with a full ISR. Printed and written to
bench/results/partition_fds.json: the time until every broker has created all its replicas, the time
until every write is acknowledged and how many failed, and per broker the open descriptors (all, on
the log dir, on index files), the open-file limit, memory maps (vm.max_map_count counts them) and RSS
before and after, from which the RSS per replica. Before issue 24 a broker held three descriptors per
replica and stopped at 6,659 replicas under a 20,000 limit; 5,560 of 10,000 sends timed out.

The CI form is tests/integration/test_broker_open_files.py (40 partitions, one descriptor per segment).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_send_path import services_env  # noqa: E402
from bench.common import RESULTS_DIR, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "wall"


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def open_file_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft = line.split()[3]
            return -1 if soft == "unlimited" else int(soft)
    return -1


def broker_figures(pid: int, data_dir: str) -> dict[str, int]:
    data = os.path.realpath(data_dir) + os.sep
    fds = on_dir = on_index = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        fds += 1
        if target.startswith(data):
            on_dir += 1
            on_index += target.endswith((".index", ".timeindex", ".txnindex"))
    return {"fds": fds, "fds_on_log_dir": on_dir, "fds_on_index_files": on_index,
            "open_file_limit": open_file_limit(pid), "maps": len(Path(f"/proc/{pid}/maps").read_text().splitlines()),
            "rss_kib": proc_status(pid, "VmRSS")}


def replica_dirs(data_dir: str) -> int:
    return sum(1 for d in Path(data_dir).rglob(f"{TOPIC}-*") if d.is_dir())


async def write_everywhere(bootstrap: str, partitions: int, acks: str) -> tuple[float, int]:
    """One record to every partition; (seconds until all are answered, how many failed)."""
    from gregor.client.producer import Producer

    async with Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5}) as p:
        t0 = time.monotonic()
        sent = [await p.send(TOPIC, acks.encode(), partition=i) for i in range(partitions)]
        failed = 0
        for f in sent:
            try:
                await f
            except Exception:  # noqa: BLE001 - counted, the figure is how many failed
                failed += 1
        return time.monotonic() - t0, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=10_000)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--converge-s", type=float, default=900.0, help="give up waiting for replicas after this long")
    args = ap.parse_args()
    from gregor.cli.local_cluster import LocalCluster

    env = services_env(ROOT / "services")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"ulimit_n_of_this_shell": open_file_limit(os.getpid())}
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        cluster = LocalCluster.up(tmp, brokers=args.brokers, controllers=1)
        try:
            brokers = cluster.by_role("broker")
            time.sleep(2)
            idle = {b.id: broker_figures(b.pid, b.data_dir) for b in brokers}
            cli = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", cluster.bootstrap]
            t0 = time.monotonic()
            out = subprocess.run([*cli, "topics", "create", TOPIC, "--partitions", str(args.partitions),
                                  "--replication-factor", str(args.replication_factor)], env=env,
                                 capture_output=True, text=True, timeout=args.converge_s)
            result["create_s"] = time.monotonic() - t0
            result["create_output"] = (out.stdout + out.stderr).strip()[-400:]
            print(f"topics create: {result['create_s']:.1f} s, exit {out.returncode}: {result['create_output']}",
                  flush=True)
            per_broker = args.partitions * args.replication_factor // args.brokers
            deadline = time.monotonic() + args.converge_s
            while time.monotonic() < deadline:
                counts = [replica_dirs(b.data_dir) for b in brokers]
                if min(counts) >= per_broker:
                    break
                time.sleep(2)
            result["replicas_created_s"] = time.monotonic() - t0
            result["replicas_per_broker"] = [replica_dirs(b.data_dir) for b in brokers]
            print(f"replicas on disk after {result['replicas_created_s']:.1f} s: {result['replicas_per_broker']}",
                  flush=True)
            # Every partition online with its full ISR (nothing under-replicated or unavailable).
            result["online_full_isr"] = False
            while time.monotonic() < deadline:
                lagging = [subprocess.run([*cli, "topics", "describe", TOPIC, flag], env=env, capture_output=True,
                                          text=True, timeout=120) for flag in
                           ("--under-replicated-partitions", "--unavailable-partitions")]
                if all(r.returncode == 0 and not r.stdout.strip() for r in lagging):
                    result["online_full_isr"] = True
                    break
                time.sleep(5)
            result["online_full_isr_s"] = time.monotonic() - t0
            print(f"every partition online with a full ISR: {result['online_full_isr']} after "
                  f"{result['online_full_isr_s']:.1f} s", flush=True)
            for acks in ("1", "all"):
                seconds, failed = asyncio.run(write_everywhere(cluster.bootstrap, args.partitions, acks))
                result[f"write_acks_{acks}_s"], result[f"write_acks_{acks}_failed"] = seconds, failed
                print(f"one record to each of {args.partitions} partitions, acks={acks}: {seconds:.1f} s, "
                      f"{failed} failed", flush=True)
            time.sleep(2)
            loaded = {b.id: broker_figures(b.pid, b.data_dir) for b in brokers}
            result["brokers"] = []
            for b in brokers:
                row = {"broker": b.id, "idle": idle[b.id], "loaded": loaded[b.id],
                       "rss_kib_per_replica": (loaded[b.id]["rss_kib"] - idle[b.id]["rss_kib"]) / max(1, per_broker)}
                result["brokers"].append(row)
                print(f"broker {b.id}: fds {loaded[b.id]['fds']} (log dir {loaded[b.id]['fds_on_log_dir']}, "
                      f"index files {loaded[b.id]['fds_on_index_files']}) of limit {loaded[b.id]['open_file_limit']}, "
                      f"maps {loaded[b.id]['maps']}, RSS {idle[b.id]['rss_kib'] / 1024:.0f} -> "
                      f"{loaded[b.id]['rss_kib'] / 1024:.0f} MiB ({row['rss_kib_per_replica']:.1f} KiB per replica)",
                      flush=True)
        finally:
            cluster.down()
    path = write_results("partition_fds", vars(args), result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
