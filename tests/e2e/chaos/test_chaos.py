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
from typing import Any

import pytest

from tests.e2e.chaos.faults import ETCD_KINDS, KINDS, schedule
from tests.e2e.chaos.netns import SMALL_FS_MARK, our_namespaces

SEED = int(os.environ.get("GREGOR_CHAOS_SEED", "7"))
DURATION_S = 150  # every kind once fits in it (asserted below)
REPO = Path(__file__).resolve().parents[3]


# Starts the run the way a harness that blocks SIGINT would (the mask survives exec): the run must unblock it.
_SIGINT_BLOCKED = ("import os, signal, sys; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
                   "os.execv(sys.executable, [sys.executable, '-m', 'tests.e2e.chaos.run', *sys.argv[1:]])")


def _run(*args: str, sigint_blocked: bool = False, **kw: object) -> subprocess.Popen[str]:
    run = ["-c", _SIGINT_BLOCKED] if sigint_blocked else ["-m", "tests.e2e.chaos.run"]
    return subprocess.Popen([sys.executable, *run, *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)  # type: ignore[call-overload]


def test_the_ci_schedule_covers_every_fault_kind() -> None:
    faults = schedule(SEED, DURATION_S, every_kind_once=True)
    assert sorted(f.kind for f in faults) == sorted(KINDS)
    assert schedule(SEED, DURATION_S, True) == faults  # the same seed, the same schedule
    assert all(f.leader for f in faults if f.kind in ETCD_KINDS)  # both etcd faults aim at the leader


def _etcd_leader_hit(ops: list[dict[str, Any]], kinds: tuple[str, ...]) -> None:
    """Each etcd fault of the run found the etcd leader and hit it (the nemesis records detail.leader)."""
    starts = [o for o in ops if o["op"] == "nemesis" and o.get("fault") in kinds and o["phase"] == "start"]
    assert sorted(o["fault"] for o in starts) == sorted(kinds), starts
    assert all(o["detail"]["leader"] is True for o in starts), starts


def _clock_jumped(ops: list[dict[str, Any]], shm_before: set[str]) -> None:
    """clock-skew moved the running target's wall clock forward, then back, then to the real clock again,
    and the process showed each offset (the Date of its /metrics answers), all within one instance."""
    stop = [o for o in ops if o["op"] == "nemesis" and o.get("fault") == "clock-skew" and o["phase"] == "stop"]
    assert len(stop) == 1, stop
    jumps = stop[0]["detail"]["jumps"]
    assert [j["set"] > 0 for j in jumps[1:3]] == [True, False] and jumps[0]["set"] == jumps[-1]["set"] == 0, jumps
    for j in jumps:  # Date has one-second resolution; 2 s of slack for a second boundary crossed while asking
        assert j["observed"] is not None and abs(j["observed"] - j["set"]) <= 2, jumps
    assert {f for f in os.listdir("/dev/shm") if "faketime" in f} <= shm_before  # libfaketime's shm removed


def _valid_run(out: Path, *args: str) -> tuple[str, dict[str, Any]]:
    """One chaos run into out: its log and verdict, asserting it had every capability and is VALID (a failing
    run's output is kept for CI's artifacts)."""
    proc = _run(*args, "--out", str(out))
    log, _ = proc.communicate(timeout=880)
    assert proc.returncode != 3, f"the chaos suite lacks a capability (run it as root):\n{log}"
    verdict_path = out / "verdict.json"
    assert verdict_path.exists(), log
    verdict = json.loads(verdict_path.read_text())
    if proc.returncode != 0:
        _keep(out)
    assert proc.returncode == 0 and verdict["valid"], f"{log}\n{json.dumps(verdict['anomalies'], indent=1)[:6000]}"
    return log, verdict


@pytest.mark.timeout(900)
def test_chaos_short_schedule(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    shm_before = {f for f in os.listdir("/dev/shm") if "faketime" in f}
    log, verdict = _valid_run(out, "--seed", str(SEED), "--duration", str(DURATION_S), "--every-kind-once")
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
    _etcd_leader_hit(ops, ETCD_KINDS)
    _clock_jumped(ops, shm_before)
    # While broker-0's small log dir was full, the partitions with no replica in it kept taking acks=all writes.
    assert verdict["disk_full"] and all(not d["not_served"] for d in verdict["disk_full"]), verdict["disk_full"]
    assert our_namespaces() == []


TLS_KINDS = ("kill", "partition-isolate", "controller-failover", "etcd-kill", "rolling-restart")
TLS_DURATION_S = 60  # the five kinds above once each fit in it (asserted below)


@pytest.mark.timeout(900)
def test_chaos_tls_schedule(tmp_path: Path) -> None:
    """The reconnecting faults (kills, an isolated node, a controller failover, an etcd member lost, every
    process restarted) with mTLS everywhere: the verdict is VALID, and TLS was really on: the run's probe found
    every gRPC port, the broker's data port and etcd refusing plain text and certificate-less TLS clients
    while accepting client.crt, and the workload's clients (SDK, sync, gateway) all wrote through it."""
    assert sorted(f.kind for f in schedule(SEED, TLS_DURATION_S, True, TLS_KINDS)) == sorted(TLS_KINDS)
    out = tmp_path / "chaos"
    log, verdict = _valid_run(out, "--seed", str(SEED), "--duration", str(TLS_DURATION_S), "--every-kind-once",
                              "--kinds", ",".join(TLS_KINDS), "--tls")
    assert sorted(verdict["fault_kinds_fired"]) == sorted(TLS_KINDS), log
    probe = verdict["tls"]
    assert probe is not None, log
    assert set(probe) == {"broker", "controller", "coordinator", "gateway", "broker_data", "etcd"}
    for what, seen in probe.items():
        assert seen["mtls"] is True, (what, seen)
        assert seen["tls_no_cert"] is False, (what, seen)
        assert seen.get("plaintext", False) is False, (what, seen)
    topology = json.loads((out / "cluster" / "topology.json").read_text())
    assert all(e.startswith("https://") for e in topology["etcd"].split(","))
    assert (out / "client.properties").read_text().count("security.protocol=SSL") == 1
    ops = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines() if line.strip()]
    ok_by_client = {o.get("client") for o in ops if o["op"] in ("send", "txn") and o["outcome"] == "ok"}
    assert {"sdk", "sync", "gateway"} <= ok_by_client, ok_by_client
    _etcd_leader_hit(ops, ("etcd-kill",))
    assert verdict["stats"]["values_acknowledged"] > 0 and verdict["stats"]["partitions_with_final_read"] == 4
    assert our_namespaces() == []


def _signal_state(pid: int) -> str:
    """Each thread's blocked, ignored, caught and pending signals (for the failure message)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = (task / "status").read_text().splitlines()
        except OSError:
            continue
        lines.append(f"{task.name}: " + " ".join(s.replace("\t", "") for s in status if s.startswith("Sig")))
    return "\n".join(lines)


def test_interrupted_run_leaves_nothing_behind(tmp_path: Path) -> None:
    """Ctrl-C during a run: it stops (exit 130) and removes its namespaces, veths and mounts; with SIGINT
    blocked in the mask it was started with, too."""
    proc = _run("--seed", "1", "--duration", "60", "--out", str(tmp_path / "chaos"), sigint_blocked=True)
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
    state = _signal_state(proc.pid)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + rest + "\nsignal state after SIGINT:\n" + state
    assert our_namespaces() == []
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert " gch" not in links
    assert SMALL_FS_MARK not in Path("/proc/mounts").read_text()


def _keep(out: Path) -> None:
    """Copy a failing run's output where CI artifacts can pick it up."""
    dest = REPO / "chaos-out-failed"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(out, dest, ignore=shutil.ignore_patterns("data", "*.log.*"))
