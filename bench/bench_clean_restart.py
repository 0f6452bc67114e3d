"""A broker's clean restart at P partitions, RF 3 on 3 brokers, with the phases of its shutdown (issue 24).

`make bench-clean-restart [PARTITIONS=N]`; CI form: tests/integration/test_broker_clean_restart.py.

A fresh `gregor cluster up`-style cluster (etcd, one controller, three brokers); librdkafka creates one
topic of P partitions at RF 3 and writes one record to every partition (acks=all, so every replica has
it and a loaded producer state); once broker 1 is in every ISR it gets SIGTERM. Measured: the exit
(SIGTERM until the process is gone), the broker's own phase lines (`[Broker id=1] <phase> shut down in
X s`, `closed N logs on T threads`), the relaunch and the time until Metadata shows it back in every ISR,
and what the new process's first LeaderAndIsr says about recovery (skipped for the logs shut down
cleanly). --pyspy records the exiting process with py-spy (raw collapsed stacks, --idle) next to the
results. To compare two trees, run it alternately with each on PYTHONPATH (the brokers inherit it).

Writes bench/results/clean_restart_<P>.json (--name another name).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.bench_partitions import (all_led, back_in_every_isr, create_topic, poll,  # noqa: E402
                                    write_every_partition)
from bench.common import RESULTS_DIR  # noqa: E402

VICTIM = 1
PHASE = re.compile(r"\[Broker id=\d+\] (.*) shut down in (\d+\.\d+) s")


def shutdown_phases(log_text: str) -> dict[str, Any]:
    """The last shutdown's phase lines of a broker log: {phase: seconds}, and the LogManager's close line."""
    lines = log_text.splitlines()
    starts = [i for i, line in enumerate(lines) if "shutting down" in line and "[Broker id=" in line]
    tail = lines[starts[-1]:] if starts else []
    phases = {m.group(1): float(m.group(2)) for m in map(PHASE.search, tail) if m}
    closed = next((line.split(": ", 1)[1] for line in tail if "gregor.broker.log_manager: closed " in line), "")
    return {"phases s": phases, "close line": closed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=2000)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker config for every broker, e.g. num.recovery.threads.per.data.dir=4")
    ap.add_argument("--pyspy", action="store_true", help="py-spy record the exiting broker (needs py-spy)")
    ap.add_argument("--name", default="")
    args = ap.parse_args()
    from gregor.cli.local_cluster import LocalCluster, start_broker

    overrides = dict(kv.split("=", 1) for kv in args.override)
    p = args.partitions
    base = Path(tempfile.mkdtemp(prefix=f"clean-restart-{p}-"))
    out: dict[str, Any] = {"partitions": p, "overrides": overrides, "gregor": __import__("gregor").__file__,
                           "load avg at start": os.getloadavg()}
    cluster = LocalCluster.up(str(base), brokers=3, controllers=1, broker_overrides=overrides)
    try:
        boot = str(cluster.to_json()["kafka_bootstrap"])
        out["create s"] = round(create_topic(boot, "t", p, 3, 600), 2)
        poll(lambda: all_led(boot, "t", p), 600, "every partition led", 0.5)
        out["write all s"] = round(write_every_partition(boot, "t", p, 600), 2)
        victim = next(b for b in cluster.by_role("broker") if b.id == VICTIM)
        poll(lambda: back_in_every_isr(boot, "t", p, VICTIM), 600, "broker in every ISR", 0.5)
        out["load avg at stop"] = os.getloadavg()
        start = time.monotonic()
        os.kill(victim.pid, signal.SIGTERM)
        spy = None
        if args.pyspy:
            spy = subprocess.Popen([shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy"),
                                    "record", "--pid", str(victim.pid), "--idle", "--threads", "-r", "25", "-f", "raw",
                                    "-o", str(base / "pyspy.txt"), "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while victim.alive():
            time.sleep(0.05)
        out["exit s"] = round(time.monotonic() - start, 2)
        if spy is not None:
            spy.wait(60)
        out.update(shutdown_phases(Path(victim.log).read_text()))
        old_log_size = os.path.getsize(victim.log)
        port = int(victim.kafka.rsplit(":", 1)[1])  # the same Kafka listener port: clients know it
        new = start_broker(cluster.data_dir, VICTIM, overrides={**overrides, "listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                           etcd_endpoint=",".join(e.grpc for e in cluster.by_role("etcd")))
        cluster.processes[cluster.processes.index(victim)] = new
        cluster.save()
        out["relaunched s"] = round(time.monotonic() - start, 2)
        poll(lambda: back_in_every_isr(boot, "t", p, VICTIM), 900, "broker back in every ISR", 0.5)
        out["back in every ISR s"] = round(time.monotonic() - start, 2)
        with open(new.log) as f:
            f.seek(old_log_size)
            out["recovery"] = [line.split(": ", 1)[1].rstrip() for line in f if "existing logs loaded" in line]
    finally:
        cluster.down()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{args.name or f'clean_restart_{p}'}.json"
    path.write_text(json.dumps(out, indent=1))
    if args.pyspy and (base / "pyspy.txt").exists():
        shutil.copy(base / "pyspy.txt", path.with_suffix(".pyspy.txt"))
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
