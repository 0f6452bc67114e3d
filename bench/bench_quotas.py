"""Two tenants on one broker, one of them greedy: does a client quota keep the other's throughput and latency?

A local cluster (etcd, a controller, one broker). The polite tenant (client.id `polite`) offers a fixed
load, 1 KiB records at --polite-rate records/s, and measures each record's send-to-ack latency. The greedy
tenant (client.id `greedy`) produces as fast as its producer can. Three phases, same run, same broker:

1. baseline: the polite tenant alone;
2. quota: both, the greedy one under `producer_byte_rate` = --quota-kbps (set with AlterClientQuotas);
3. no quota: both, the quota removed (what the quota prevents).

Each tenant is its own process, so the tenants share the broker, not an event loop. The phases run in
--rounds rounds, their order rotating, and the medians are reported. Printed: the polite tenant's
throughput and p50/p99 latency in phases 2 and 3 as ratios against phase 1, and the greedy tenant's
rate against its quota. Nothing gates on an absolute time. The greedy tenant is one Python producer:
on a small machine it is CPU-bound itself and may not saturate the broker, so phase 3 can look benign.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import print_ratio, print_row, write_results  # noqa: E402

RECORD = b"r" * 1024
GREEDY_CFG = {"acks": "1", "linger.ms": 5, "batch.size": 65536, "max.request.size": 262144,
              "enable.idempotence": False}
POLITE_CFG = {"acks": "1", "linger.ms": 0}


async def tenant(bootstrap: str, client_id: str, topic: str, seconds: float, rate: float) -> dict[str, Any]:
    """One tenant's run: rate records/s (0: as fast as the producer goes); its throughput and latencies."""
    from gregor.client.producer import Producer

    cfg = GREEDY_CFG if rate == 0 else POLITE_CFG
    latencies: list[float] = []
    acked = 0
    async with Producer({"bootstrap.servers": bootstrap, "client.id": client_id, **cfg}) as p:
        await p.partitions_for(topic)
        pending: set[asyncio.Future[Any]] = set()

        def done(sent_at: float, f: asyncio.Future[Any]) -> None:
            nonlocal acked
            if not f.cancelled() and f.exception() is None:
                acked += 1
                latencies.append(time.perf_counter() - sent_at)

        start = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - start < seconds:
            if rate and sent >= (now - start) * rate:
                await asyncio.sleep(min(0.005, sent / rate - (now - start)))
                continue
            fut = asyncio.ensure_future(await p.send(topic, RECORD))
            fut.add_done_callback(functools.partial(done, time.perf_counter()))
            pending.add(fut)
            fut.add_done_callback(pending.discard)
            sent += 1
            if len(pending) >= 256:
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        elapsed = time.perf_counter() - start
        acked_in_window = acked
        metrics = p.metrics()
    latencies.sort()

    def pick(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return {"client_id": client_id, "records": acked_in_window, "kib_per_s": acked_in_window / elapsed,
            "p50_ms": pick(0.50), "p99_ms": pick(0.99),
            "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
            "throttle_max_ms": metrics["produce-throttle-time-max"], "cpu_s": time.process_time()}


def run_tenants(bootstrap: str, topic: str, seconds: float, polite_rate: float, greedy: bool) -> dict[str, Any]:
    """The tenants as processes, started together; their JSON results by client id."""
    procs = {}
    plan = [("polite", polite_rate)] + ([("greedy", 0.0)] if greedy else [])
    for client_id, rate in plan:
        procs[client_id] = subprocess.Popen(
            [sys.executable, __file__, "--tenant", client_id, "--bootstrap", bootstrap, "--topic", topic,
             "--seconds", str(seconds), "--rate", str(rate)], stdout=subprocess.PIPE, text=True)
    out = {}
    for client_id, proc in procs.items():
        stdout, _ = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"tenant {client_id} failed ({proc.returncode})")
        out[client_id] = json.loads(stdout.strip().splitlines()[-1])
    return out


def set_quota(bootstrap: str, kbps: float | None) -> None:
    from gregor.client.admin import AdminClient

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": bootstrap}) as a:
            if kbps is None:
                await a.alter_client_quotas(None, "greedy", delete=["producer_byte_rate"])
            else:
                await a.alter_client_quotas(None, "greedy", {"producer_byte_rate": str(int(kbps * 1024))})

    asyncio.run(go())


def create_topic(bootstrap: str, name: str) -> None:
    from gregor.client.admin import AdminClient

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": bootstrap}) as a:
            await a.create_topic(name, 2, 1)

    asyncio.run(go())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s phases (CI smoke size)")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the three phases (medians are reported)")
    ap.add_argument("--polite-rate", type=float, default=300.0, help="the polite tenant's records/s")
    ap.add_argument("--quota-kbps", type=float, default=1024.0, help="the greedy tenant's quota, KiB/s")
    ap.add_argument("--tenant", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tenant:
        print(json.dumps(asyncio.run(tenant(args.bootstrap, args.tenant, args.topic, args.seconds, args.rate))))
        return 0
    seconds = 5.0 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds

    from gregor.cli.local_cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="bench-quotas-") as data_dir:
        cluster = LocalCluster.up(data_dir, brokers=1, controllers=1)
        try:
            bootstrap = str(cluster.to_json()["bootstrap"])
            create_topic(bootstrap, "tenants")
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "quota": [], "no_quota": []}
            order = list(runs)
            for i in range(rounds):  # the phases rotate between rounds, so drift does not favour one
                for name in order[i % 3:] + order[:i % 3]:
                    set_quota(bootstrap, None if name == "no_quota" else args.quota_kbps)
                    runs[name].append(run_tenants(bootstrap, "tenants", seconds, args.polite_rate,
                                                  greedy=name != "baseline"))
        finally:
            cluster.down()
    phases: dict[str, dict[str, dict[str, Any]]] = {
        name: {cid: {k: statistics.median(run[cid][k] for run in rs) for k in rs[0][cid] if k != "client_id"}
               for cid in rs[0]} for name, rs in runs.items()}
    base = phases["baseline"]["polite"]
    print(f"polite tenant offers {args.polite_rate:g} records/s of 1 KiB; greedy quota {args.quota_kbps:g} KiB/s; "
          f"{seconds:g} s per phase, {rounds} round(s), medians")
    for name, by_client in phases.items():
        for client_id, r in by_client.items():
            print_row(f"{name}/{client_id}", kib_per_s=r["kib_per_s"], p50_ms=r["p50_ms"], p99_ms=r["p99_ms"],
                      throttle_max_ms=r["throttle_max_ms"], cpu_s=r["cpu_s"])
    results: dict[str, Any] = {"phases": phases, "runs": runs}
    for name in ("quota", "no_quota"):
        polite = phases[name]["polite"]
        results[f"{name}_throughput_ratio"] = print_ratio(
            f"polite throughput, greedy tenant {name.replace('_', ' ')}", polite["kib_per_s"], base["kib_per_s"],
            "KiB/s")
        results[f"{name}_p99_ratio"] = print_ratio(
            f"polite p99 latency, greedy tenant {name.replace('_', ' ')}", polite["p99_ms"], base["p99_ms"], "ms",
            higher_is_better=False)
    results["greedy_vs_quota"] = print_ratio("greedy tenant under its quota", phases["quota"]["greedy"]["kib_per_s"],
                                             args.quota_kbps, "KiB/s")
    results["greedy_unquotad_vs_quota"] = phases["no_quota"]["greedy"]["kib_per_s"] / args.quota_kbps
    path = write_results("bench_quotas", {"seconds": seconds, "rounds": rounds, "polite_rate": args.polite_rate,
                                          "quota_kbps": args.quota_kbps}, results)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
