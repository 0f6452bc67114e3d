"""py-spy flame graphs of the acks=all path at a fixed rate (issue 15): where a 2,000 rec/s RF 3
produce spends the brokers' CPU.

Starts etcd, a controller and 3 brokers, a topic of 1 partition with RF 3 and
min.insync.replicas=2 (beside bench_vs_kafka's other rf3 topics, 150 partitions, unless --alone),
runs `gregor perf produce --throughput RATE --producer-props acks=all` and records every broker and the producer with py-spy (pinned in pyproject's `bench` extra;
`make profile-acks-all`) for the middle of the run. Writes one SVG per process to --out
(default docs/profiles/) and prints the top frames of each by inclusive share of samples (parsed
from the SVG's frame titles), the leader first.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_low_rate import create_cell_topics  # noqa: E402
from bench.common import RESULTS_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FRAME = re.compile(r"^(.*?) \((.*?):\d+\)$")


def _function(frame: str) -> str:
    """'handler (gregor/common/rpc.py:63)' -> 'gregor/common/rpc.py:handler' (lines merged)."""
    m = FRAME.match(frame.strip())
    return f"{m[2]}:{m[1]}" if m else frame.strip()


def top_costs(raw: Path, n: int = 12) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: (self %, inclusive % of gregor/grpc/native frames), heaviest first."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [_function(f) for f in stack.split(";")]
        own[frames[-1]] += samples
        for f in set(frames):
            if "gregor" in f or "grpc" in f or "protobuf" in f:
                incl[f] += samples
    if not total:
        return [], []
    return ([(f, 100 * c / total) for f, c in own.most_common(n)],
            [(f, 100 * c / total) for f, c in incl.most_common(n)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=30, help="length of the produce run")
    ap.add_argument("--record-seconds", type=int, default=20, help="py-spy recording, started 5 s in")
    ap.add_argument("--out", default=str(ROOT / "docs" / "profiles"))
    ap.add_argument("--tag", default="", help="suffix of the SVG names (e.g. before/after)")
    ap.add_argument("--alone", action="store_true",
                    help="only the profiled topic (default: also bench_vs_kafka's other rf3 topics, 150 partitions, "
                         "as in its fixed-rate cell)")
    ap.add_argument("--native", action="store_true", help="py-spy --native: C/Rust frames too (gRPC core, the poller)")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(pyspy, os.X_OK):
        raise SystemExit("py-spy not found: `.venv/bin/pip install -e '.[bench]'` (make profile-acks-all does it)")
    from gregor.cli.local_cluster import LocalCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT)])}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    spies: list[tuple[str, Path, Path]] = []
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        cluster = LocalCluster.up(tmp, brokers=3, controllers=1)
        try:
            cli = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", cluster.bootstrap]
            leader = create_cell_topics(cli, env, "latency", not args.alone)
            producer = subprocess.Popen([*cli, "perf", "produce", "--topic", "latency", "--num-records",
                                         str(args.rate * args.seconds), "--record-size", "1024", "--throughput",
                                         str(args.rate), "--producer-props", "acks=all"], env=env,
                                        stdout=subprocess.PIPE, text=True)
            time.sleep(5)
            targets = [(f"broker-{p.id}{'-leader' if p.id == leader else ''}", p.pid)
                       for p in cluster.by_role("broker")] + [("producer", producer.pid)]
            suffix = f"-{args.tag}" if args.tag else ""
            procs = []
            for name, pid in targets:  # one flame graph (committed) and one raw copy (for the top costs)
                svg, raw = out / f"acks-all-{name}{suffix}.svg", Path(tmp) / f"{name}.txt"
                spies.append((name, svg, raw))
                for fmt, path in (("flamegraph", svg), ("raw", raw)):
                    procs.append(subprocess.Popen(
                        [pyspy, "record", "--pid", str(pid), "--duration", str(args.record_seconds), "--rate", "100",
                         "--format", fmt, *(["--native"] if args.native else ["--nonblocking"]),
                         "--output", str(path)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for spy in procs:
                spy.wait()
            summary = producer.communicate()[0].strip().splitlines()
            print(summary[-1] if summary else "(no producer output)")
        finally:
            cluster.down()
        for name, svg, raw in sorted(spies, key=lambda s: "leader" not in s[0]):
            if not raw.exists():
                print(f"{name}: no profile written")
                continue
            own, incl = top_costs(raw)
            print(f"\n{name} ({svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg}): self")
            for frame, pct in own:
                print(f"  {pct:5.1f}%  {frame}")
            print("  inclusive (gregor / grpc / protobuf frames):")
            for frame, pct in incl:
                print(f"  {pct:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
