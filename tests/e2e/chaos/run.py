"""One chaos run: the namespaced cluster, the workload in a client namespace, the seeded faults, healing,
the final read, replica and controller histories, then the checker's verdict.

    python -m tests.e2e.chaos.run --seed 7 --duration 600 --out chaos-out [--counts full|ci|etcd=3,...]
                                  [--every-kind-once]

Prints the seed and the schedule first; writes OUT/history.jsonl, OUT/verdict.json, OUT/summary.txt and
every process log under OUT/cluster/logs. Exit 0 valid, 1 an anomaly, 2 the run itself failed,
3 a missing capability. Everything it creates is removed on exit, Ctrl-C included
(`python -m tests.e2e.chaos.netns` removes what a SIGKILLed run left).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from gregor.chaos import checker
from tests.e2e.chaos.faults import KINDS, MISSING, Nemesis, describe, schedule
from gregor.chaos.history import OK, HistoryWriter
from tests.e2e.chaos.netns import CapabilityError, cleanup, ns_name, require_capabilities
from tests.e2e.chaos.topology import CI, FULL, ChaosCluster, Counts
from gregor.chaos.workload import TOPIC, TXN_TOPIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def replica_digests(cluster: ChaosCluster, partitions: int, h: HistoryWriter) -> None:
    """Each replica of the workload's topics read through the native engine (a copy of its directory,
    so recovery on open changes nothing): its log end offset and the sha256 of every batch's bytes.
    broker-0's replicas may live in either of its log dirs."""
    from gregor_native import Log, LogConfig

    for b in cluster.by_role("broker"):
        for topic in (TOPIC, TXN_TOPIC):
            for p in range(partitions):
                dirs = [b.data_dir] + ([cluster.small_dir] if b.id == 0 and cluster.small_dir_mb else [])
                found = [os.path.join(d, f"{topic}-{p}") for d in dirs if os.path.isdir(os.path.join(d, f"{topic}-{p}"))]
                if not found:
                    continue
                src = found[0]
                t0 = time.time()
                with tempfile.TemporaryDirectory() as tmp:
                    copy = os.path.join(tmp, "log")
                    shutil.copytree(src, copy)
                    log = Log(copy, LogConfig())
                    digest = hashlib.sha256()
                    offset, end = log.log_start_offset, log.log_end_offset
                    while offset < end:
                        data = log.read(offset, 1 << 20)
                        if not data:
                            break
                        digest.update(data)
                        from gregor_native import parse_batches

                        offset = parse_batches(data, False)[-1].next_offset
                    h.record(process="final", op="replica", invoke=t0, complete=time.time(), outcome=OK, topic=topic,
                             partition=p, broker=b.id, log_start_offset=log.log_start_offset, log_end_offset=end,
                             digest=digest.hexdigest(), truncated_on_open=log.recovered_bytes_truncated)


def controller_history(cluster: ChaosCluster, h: HistoryWriter) -> int:
    """Every change of `controller` and `controller_epoch` in etcd's history (watched from revision 1), one
    `controller` op per revision: the epoch and holder after that revision."""
    from gregor.common.etcd import EtcdClient

    async def collect() -> list[Any]:
        events: list[Any] = []
        async with EtcdClient(cluster.etcd_endpoints) as etcd:
            prefix = etcd.key("controller")
            it = etcd.watch(prefix, start_revision=1, prefix=True).__aiter__()
            while True:
                try:
                    events.append(await asyncio.wait_for(it.__anext__(), 3))
                except (asyncio.TimeoutError, StopAsyncIteration):
                    break
            await it.aclose()  # type: ignore[attr-defined]
            return [(etcd.relative(e.key), e) for e in events]

    events = asyncio.run(collect())
    epoch: int | None = None
    holder: int | None = None
    version = 0
    by_rev: dict[int, list[Any]] = {}
    for name, e in events:
        by_rev.setdefault(e.mod_revision, []).append((name, e))
    n = 0
    for rev in sorted(by_rev):
        changed = False
        for name, e in by_rev[rev]:
            if name == "controller_epoch" and e.type == "put":
                epoch = int(e.value)
                changed = True
            elif name == "controller":
                if e.type == "put":
                    holder = int(json.loads(e.value)["controller_id"])
                    version = e.version
                else:
                    holder, version = None, 0
                changed = True
        if changed:
            h.record(process="etcd", op="controller", invoke=0.0, complete=0.0, outcome=OK, revision=rev,
                     epoch=epoch, controller=holder, version=version or None)
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A Jepsen-style chaos run of Gregor across network namespaces.")
    ap.add_argument("--seed", type=int, default=None, help="schedule seed (default: random, printed)")
    ap.add_argument("--duration", type=float, default=180, help="seconds of workload under faults")
    ap.add_argument("--out", default="chaos-out")
    ap.add_argument("--counts", default="ci", help="full (the issue's 3/2/3/2/2), ci, or role=n,...")
    ap.add_argument("--every-kind-once", action="store_true", help="each fault kind once (the CI schedule)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--kinds", default="", help="only these fault kinds (comma-separated; default all)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    counts = FULL if a.counts == "full" else CI if a.counts == "ci" else Counts.parse(a.counts)
    kinds = tuple(k for k in a.kinds.split(",") if k) or KINDS
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    faults = schedule(seed, a.duration, a.every_kind_once, kinds)
    print(f"chaos seed {seed} (re-run: make chaos SEED={seed} DURATION={a.duration:g})", flush=True)
    print(f"topology {counts}", flush=True)
    print("schedule: " + json.dumps(describe(faults)), flush=True)
    if MISSING:
        print(f"fault kinds not implemented: {MISSING}", flush=True)
    try:
        features = require_capabilities()
    except CapabilityError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 3
    if not features["netem"]:
        print("note: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM): network-degrade runs netem in user "
              "space (tests/e2e/chaos/netem_user.py, NFQUEUE)", flush=True)

    out = os.path.abspath(a.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cluster = ChaosCluster(os.path.join(out, "cluster"), counts)
    rf = min(3, counts.brokers)
    cluster.coordinator_overrides = {
        "offsets.topic.replication.factor": str(rf), "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(rf), "transaction.state.log.num.partitions": "4",
        "transaction.state.log.min.isr": str(min(2, rf)),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        "transaction.max.timeout.ms": "60000", "group.initial.rebalance.delay.ms": "0"}
    atexit.register(cleanup)
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    workload: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        cluster.up()
        print(f"cluster up in {time.monotonic() - started:.1f} s: {cluster.bootstrap}", flush=True)
        hist_workload = os.path.join(out, "workload.jsonl")
        healed = os.path.join(out, "healed")
        wlog = os.path.join(out, "workload.log")
        with open(wlog, "ab") as wl:
            workload = subprocess.Popen(
                ["ip", "netns", "exec", ns_name(cluster.clients[0]), sys.executable, "-m", "gregor.cli.main", "chaos", "workload",
                 "--bootstrap", cluster.bootstrap, "--gateway", cluster.gateways, "--seconds", str(a.duration),
                 "--history", hist_workload, "--healed-file", healed, "--partitions", str(a.partitions),
                 "--replication-factor", str(rf), "--seed", str(seed)],
                stdout=wl, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        deadline = time.monotonic() + 180
        while "WORKLOAD STARTED" not in open(wlog, errors="replace").read():
            if workload.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workload did not start; see {wlog}")
            time.sleep(0.2)
        t_start = time.monotonic()
        nemesis_hist = HistoryWriter(os.path.join(out, "nemesis.jsonl"))
        nemesis = Nemesis(cluster, nemesis_hist, features["netem"])
        for f in faults:
            time.sleep(max(0.0, t_start + f.at - time.monotonic()))
            nemesis.apply(f)
        time.sleep(max(0.0, t_start + a.duration - time.monotonic()))
        nemesis.heal_everything()
        nemesis_hist.record(process="nemesis", op="nemesis", invoke=time.time(), complete=time.time(), outcome=OK,
                            fault="heal-everything", phase="stop", targets=None, partitions=None)
        open(healed, "w").close()
        print("healed; waiting for the final read", flush=True)
        rc = workload.wait(timeout=600)
        if rc != 0:
            raise RuntimeError(f"workload exited with {rc}; see {wlog}")
        time.sleep(5)  # followers catch up with the last appends
        for b in cluster.by_role("broker"):
            cluster.kill(b.name, signal.SIGTERM)
        replica_digests(cluster, a.partitions, nemesis_hist)
        n = controller_history(cluster, nemesis_hist)
        print(f"{n} controller changes in etcd's history", flush=True)
        nemesis_hist.close()
        history = os.path.join(out, "history.jsonl")
        with open(history, "w") as hf:
            for part in (hist_workload, os.path.join(out, "nemesis.jsonl")):
                with open(part) as pf:
                    shutil.copyfileobj(pf, hf)
        ops = checker.load_history(history)
        verdict = checker.check(ops)
        fired = set(verdict["stats"]["faults"]) - {"heal-everything"}
        verdict["fault_kinds_fired"] = sorted(fired)
        verdict["fault_kinds_missing"] = MISSING
        verdict["seed"] = seed
        verdict["wall_s"] = round(time.monotonic() - started, 1)
        with open(os.path.join(out, "verdict.json"), "w") as vf:
            json.dump(verdict, vf, indent=2, default=str)
        text = checker.summary(verdict) + f"\nseed {seed}; fault kinds fired: {', '.join(sorted(fired))}"
        with open(os.path.join(out, "summary.txt"), "w") as sf:
            sf.write(text + "\n")
        print(text, flush=True)
        return 0 if verdict["valid"] else 1
    except KeyboardInterrupt:
        print("chaos: interrupted; cleaning up", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the run failed (not the system under test): say why
        print(f"chaos: run failed: {exc!r}", file=sys.stderr)
        return 2
    finally:
        if workload is not None and workload.poll() is None:
            workload.kill()
            workload.wait()
        try:
            cluster.down()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            leftovers = cleanup()
            if leftovers:
                print(f"removed leftovers: {leftovers}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["KINDS", "main"]
