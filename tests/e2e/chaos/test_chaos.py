"""The chaos suite's CI form: every Gregor process in its own network namespace, each implemented fault kind
once from a fixed seed under the full workload, then the checker's verdict. `make chaos` runs longer ones.

Needs root (CI runs as root): without it the run exits 3 with a message naming what is missing, and this
test fails saying so rather than skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.chaos.faults import KINDS, schedule
from tests.e2e.chaos.netns import SMALL_FS_MARK, our_namespaces

SEED = int(os.environ.get("GREGOR_CHAOS_SEED", "7"))
DURATION_S = 150  # every kind once fits in it (asserted below)
REPO = Path(__file__).resolve().parents[3]


def _run(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.e2e.chaos.run", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)  # type: ignore[call-overload]


def test_the_ci_schedule_covers_every_fault_kind() -> None:
    faults = schedule(SEED, DURATION_S, every_kind_once=True)
    assert sorted(f.kind for f in faults) == sorted(KINDS)
    assert schedule(SEED, DURATION_S, True) == faults  # the same seed, the same schedule


@pytest.mark.timeout(900)
def test_chaos_short_schedule(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    proc = _run("--seed", str(SEED), "--duration", str(DURATION_S), "--every-kind-once", "--out", str(out))
    log, _ = proc.communicate(timeout=880)
    assert proc.returncode != 3, f"the chaos suite lacks a capability (run it as root):\n{log}"
    verdict_path = out / "verdict.json"
    assert verdict_path.exists(), log
    verdict = json.loads(verdict_path.read_text())
    if proc.returncode != 0:
        _keep(out)
    assert proc.returncode == 0 and verdict["valid"], f"{log}\n{json.dumps(verdict['anomalies'], indent=1)[:6000]}"
    assert sorted(verdict["fault_kinds_fired"]) == sorted(KINDS), log
    stats = verdict["stats"]
    assert stats["values_acknowledged"] > 0 and stats["partitions_with_final_read"] == 4
    assert {"send", "poll", "txn", "commit_offsets", "hw", "replica", "controller"} <= set(stats["ops"])
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]
    gateway_txns = {o["outcome"] for o in ops if o["op"] == "txn" and o.get("client") == "gateway"}
    assert "ok" in gateway_txns, "no transaction through the gateway's TransactionalProduceStream committed"
    degrade = [o for o in ops if o["op"] == "nemesis" and o.get("fault") == "network-degrade" and o["phase"] == "stop"]
    counts = degrade[0]["detail"].get("netem_counts")  # only where the kernel lacks sch_netem (user-space netem)
    assert counts is None or (counts["packets"] > 0 and counts["delayed"] > 0), degrade
    assert sum(stats["ops"]["replica"].values()) == 12  # 3 replicas of 4 partitions, both of broker-0's dirs
    assert our_namespaces() == []


def test_interrupted_run_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = _run("--seed", "1", "--duration", "60", "--out", str(tmp_path / "chaos"))
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    seen = ""
    while "cluster up" not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert "cluster up" in seen, seen
    assert our_namespaces()  # it did create them
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest
    assert our_namespaces() == []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert " gch" not in links
    assert SMALL_FS_MARK not in Path("/proc/mounts").read_text()


def _keep(out: Path) -> None:
    """Copy a failing run's output where CI artifacts can pick it up."""
    dest = REPO / "chaos-out-failed"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(out, dest, ignore=shutil.ignore_patterns("data", "*.log.*"))
