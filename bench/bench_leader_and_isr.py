"""How fast a 3-broker Gregor cluster takes a large RF 3 topic (issue 24: 10,000 partitions), and why.

Not in CI (minutes per cell at 5,000-10,000 partitions). Per partition count, on a fresh
`gregor cluster up --brokers 3 --controllers 1` cluster:

- create s: librdkafka's CreateTopics until its future returns;
- leaders s: from the same start until Metadata shows every partition with a leader;
- write all s: one record to every partition (acks=all, failed sends sent again) until every
  delivery report is in, timed from the same start as create (so it includes the two above);
- writes s: write all s minus leaders s, the writes alone;
- probe max s: the slowest answer of a gRPC Metadata call made to each broker every 0.5 s while
  the above runs (how long a broker's event loop was unable to answer anything);
- re-registrations: how often a broker registered again in etcd (a lost lease), from its log.

With --trees A B the same cell runs once per source tree (PYTHONPATH of the servers), alternating,
so a before/after comparison shares the machine's conditions. --native-paths gives each tree a
directory holding its own build of gregor_native, put first on the servers' PYTHONPATH ("-" for
the venv's), for a change to native/ compared before the shared wheel is rebuilt. With --profile the first broker is
sampled by py-spy (--py-spy PATH) from the creation until every partition took its write, and the
hottest functions (self and inclusive) are printed.

Usage:
  PYTHONPATH=services python bench/bench_leader_and_isr.py --partitions 1000 5000 10000 \
      --trees /work/main /work/wt/lai10k
  ... --trees /work/main /work/wt/epoch --native-paths - /work/wt/epoch/native_build
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_partitions import StepFailed, all_led, create_topic, poll, write_every_partition  # noqa: E402

RF = 3


class Prober(threading.Thread):
    """A gRPC Metadata (one unknown topic) to each broker every 0.5 s; keeps the slowest answer."""

    def __init__(self, targets: list[str]) -> None:
        super().__init__(daemon=True, name="probe")
        self.targets = targets
        self.worst: dict[str, float] = {t: 0.0 for t in targets}
        self.failed: dict[str, int] = {t: 0 for t in targets}
        self._halt = threading.Event()

    def run(self) -> None:
        import grpc

        from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

        chans = {t: grpc.insecure_channel(t) for t in self.targets}
        stubs = {t: broker_pb2_grpc.BrokerServiceStub(c) for t, c in chans.items()}
        while not self._halt.is_set():
            for t, stub in stubs.items():
                start = time.monotonic()
                try:
                    stub.Metadata(broker_pb2.MetadataRequest(topics=["probe-none"]), timeout=60)
                except grpc.RpcError:
                    self.failed[t] += 1
                self.worst[t] = max(self.worst[t], time.monotonic() - start)
            self._halt.wait(0.5)
        for c in chans.values():
            c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(70)


def summarize_profile(raw: Path, top: int = 25) -> str:
    """Top functions by self and by inclusive samples from py-spy's raw (collapsed) output."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        self_n[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    out = [f"{total} samples", "self:"]
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in self_n.most_common(top)]
    out.append("inclusive:")
    out += [f"  {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top * 2)]
    return "\n".join(out)


def run_cell(tree: str, partitions: int, args: argparse.Namespace, base: Path, native: str = "-") -> dict[str, Any]:
    from gregor.cli.local_cluster import LocalCluster

    os.environ["PYTHONPATH"] = ("" if native == "-" else f"{native}:") + f"{tree}/services:{tree}/spark"
    values: dict[str, Any] = {"tree": tree, "partitions": partitions}
    if native != "-":
        values["native"] = native
    cluster = LocalCluster.up(str(base / f"c-{time.monotonic_ns()}"), brokers=3, controllers=1)
    brokers = cluster.by_role("broker")
    prober = Prober([b.grpc for b in brokers])
    spy: subprocess.Popen[bytes] | None = None
    raw = base / f"profile-{partitions}.txt"
    step = "create"
    try:
        bootstrap = str(cluster.to_json()["kafka_bootstrap"])
        topic = f"p{partitions}"
        if args.profile:
            spy = subprocess.Popen([args.py_spy, "record", "-p", str(brokers[0].pid), "-r", "50", "--format",
                                    "raw", "-o", str(raw), "-d", str(int(args.step_timeout))],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        prober.start()
        start = time.monotonic()
        try:
            values["create s"] = create_topic(bootstrap, topic, partitions, RF, args.step_timeout)
        except Exception as exc:
            # CreateTopics answers REQUEST_TIMED_OUT when the creation outlives the call (a broker forwards it
            # with at most 30 s), as Kafka does; the creation goes on, so the cell does too.
            if "REQUEST_TIMED_OUT" not in str(exc):
                raise
            values["create s"] = f"timed out after {time.monotonic() - start:.1f} s (creation went on)"
        step = "leaders"
        poll(lambda: all_led(bootstrap, topic, partitions), args.step_timeout, "every partition led", 0.2)
        values["leaders s"] = time.monotonic() - start
        step = "write all"
        write_every_partition(bootstrap, topic, partitions, args.step_timeout)
        values["write all s"] = time.monotonic() - start
        values["writes s"] = values["write all s"] - values["leaders s"]
    except (StepFailed, Exception) as exc:
        values["broken"] = f"{step}: {str(exc)[:300]}"
    finally:
        try:
            if prober.is_alive():
                prober.stop()
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            values["probe max s"] = max(prober.worst.values())
            values["probe failures"] = sum(prober.failed.values())
            regs = 0
            for b in brokers:
                text = Path(b.log).read_text(errors="replace")
                regs += max(0, text.count("registered with broker epoch") - 1)
            values["re-registrations"] = regs
            values["load"] = os.getloadavg()[0]
            if values.get("broken") and args.keep_logs:
                dest = Path(args.keep_logs) / f"{Path(tree).name}-{partitions}"
                shutil.rmtree(dest, ignore_errors=True)
                shutil.copytree(Path(cluster.data_dir) / "logs", dest)
        finally:
            # The cell's files stay until the run's temporary directory goes: deleting thousands of partition
            # directories here made the next cell's brokers pay for it (bench_partitions.py,
            # KEEP_FILES_UNTIL_THE_END; a second 5,000-partition cell led in 11.8 s instead of ~3.5).
            cluster.down()
    if args.profile and raw.exists():
        values["profile"] = summarize_profile(raw)
    return values


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, nargs="+", default=[1000, 5000, 10000])
    ap.add_argument("--trees", nargs="+", default=[str(Path(__file__).resolve().parent.parent)],
                    help="source trees whose services/ the servers run (alternated per count)")
    ap.add_argument("--native-paths", nargs="+",
                    help="per tree, a directory with its gregor_native first on the servers' PYTHONPATH ('-': the venv's)")
    ap.add_argument("--step-timeout", type=float, default=300.0)
    ap.add_argument("--repeat", type=int, default=1, help="rounds; each round runs every count for every tree")
    ap.add_argument("--profile", action="store_true", help="py-spy the first broker until every partition took its write")
    ap.add_argument("--py-spy", default="py-spy")
    ap.add_argument("--keep-logs", help="copy a broken cell's server logs under this directory")
    ap.add_argument("--json", help="write the cells here")
    args = ap.parse_args()
    natives = args.native_paths or ["-"] * len(args.trees)
    if len(natives) != len(args.trees):
        ap.error(f"--native-paths needs one entry per tree ({len(args.trees)}), got {len(natives)}")
    cells = []
    pairs = list(zip(args.trees, natives))
    with tempfile.TemporaryDirectory(prefix="bench-lai-") as tmp:
        for r, p in ((r, p) for r in range(args.repeat) for p in args.partitions):
            for tree, native in (pairs[::-1] if r % 2 else pairs):  # the trees alternate which goes first
                print(f"{tree} at {p:,} partitions (load {os.getloadavg()[0]:.1f})", flush=True)
                cell = run_cell(tree, p, args, Path(tmp), native)
                cell["round"] = r
                profile = cell.pop("profile", None)
                print("  " + json.dumps(cell), flush=True)
                if profile:
                    print(profile, flush=True)
                cells.append(cell)
    if args.json:
        Path(args.json).write_text(json.dumps(cells, indent=1))


if __name__ == "__main__":
    main()
