"""py-spy flame graphs of the acks=all path at a fixed rate (issue 15): where a 2,000 rec/s RF 3
produce spends the brokers' CPU.

Starts etcd, a controller and 3 brokers, a topic of 1 partition with RF 3 and
min.insync.replicas=2, runs `gregor perf produce --throughput RATE --producer-props acks=all`
and records every broker and the producer with py-spy (pinned in pyproject's `bench` extra;
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

from bench.common import RESULTS_DIR  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TITLE = re.compile(r"<title>(.*?) \(([\d,]+) samples?, ([\d.]+)%\)</title>")


def top_frames(svg: Path, n: int = 12) -> list[tuple[str, float]]:
    """(frame, inclusive %) of the heaviest frames; a frame seen at several depths counts its largest share."""
    best: Counter[str] = Counter()
    for name, _samples, pct in TITLE.findall(svg.read_text(errors="replace")):
        name = name.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
        best[name] = max(best[name], float(pct))
    best.pop("all", None)
    return best.most_common(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=int, default=30, help="length of the produce run")
    ap.add_argument("--record-seconds", type=int, default=20, help="py-spy recording, started 5 s in")
    ap.add_argument("--out", default=str(ROOT / "docs" / "profiles"))
    ap.add_argument("--tag", default="", help="suffix of the SVG names (e.g. before/after)")
    args = ap.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(pyspy, os.X_OK):
        raise SystemExit("py-spy not found: `.venv/bin/pip install -e '.[bench]'` (make profile-acks-all does it)")
    from gregor.cli.local_cluster import LocalCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT)])}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=RESULTS_DIR) as tmp:
        cluster = LocalCluster.up(tmp, brokers=3, controllers=1)
        try:
            cli = [sys.executable, "-m", "gregor.cli.main", "--bootstrap", cluster.bootstrap]
            subprocess.run([*cli, "topics", "create", "latency", "--partitions", "1", "--replication-factor", "3",
                            "--config", "min.insync.replicas=2"], env=env, check=True, capture_output=True)
            described = subprocess.run([*cli, "-o", "json", "topics", "describe", "latency"], env=env,
                                       capture_output=True, text=True).stdout
            leader = int(m[1]) if (m := re.search(r'"leader":\s*(\d+)', described)) else -1
            producer = subprocess.Popen([*cli, "perf", "produce", "--topic", "latency", "--num-records",
                                         str(args.rate * args.seconds), "--record-size", "1024", "--throughput",
                                         str(args.rate), "--producer-props", "acks=all"], env=env,
                                        stdout=subprocess.PIPE, text=True)
            time.sleep(5)
            targets = [(f"broker-{p.id}{'-leader' if p.id == leader else ''}", p.pid)
                       for p in cluster.by_role("broker")] + [("producer", producer.pid)]
            suffix = f"-{args.tag}" if args.tag else ""
            spies = [(name, out / f"acks-all-{name}{suffix}.svg",
                      subprocess.Popen([pyspy, "record", "--pid", str(pid), "--duration", str(args.record_seconds),
                                        "--rate", "200", "--format", "flamegraph", "--nonblocking", "--output",
                                        str(out / f"acks-all-{name}{suffix}.svg")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                     for name, pid in targets]
            for _name, _svg, spy in spies:
                spy.wait()
            summary = producer.communicate()[0].strip().splitlines()
            print(summary[-1] if summary else "(no producer output)")
        finally:
            cluster.down()
    for name, svg, _spy in sorted(spies, key=lambda s: "leader" not in s[0]):
        if not svg.exists():
            print(f"{name}: no profile written")
            continue
        print(f"\n{name} ({svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg}):")
        for frame, pct in top_frames(svg):
            print(f"  {pct:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
