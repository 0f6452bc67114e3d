"""The cost of TLS (issue 23): produce and consume throughput and p99 latency with mTLS against plain text,
both measured in the same run on the same machine.

Two local clusters (`LocalCluster.up`, as `gregor cluster up [--tls]`): one standalone broker each, one
plain text and one with `--tls` (ECDSA P-256 certificates, TLS 1.3, ssl.client.auth=required). Rounds
alternate plain / TLS so load from other processes hits both alike; figures are medians over rounds.

- produce: the SDK Producer (acks=1, linger.ms 5, batch.size 64 KiB), --records records of --size bytes
  on one partition; throughput in MB/s and p99 of send-to-acknowledgement latency;
- consume over gRPC (fetch.transport=grpc) and over the data port (fetch.transport=data): the whole
  partition from the beginning; throughput and p99 of poll() calls that returned records.

On the data port TLS replaces sendfile(2) by a read of the segment range plus encryption (broker/data_port.py),
so the data-port ratio is the zero-copy loss Kafka also has under TLS. Prints ratios (TLS / plain) and
writes bench/results/tls.json. Never gates on an absolute time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import mb_per_s, print_ratio, write_results  # noqa: E402

TOPIC = "bench-tls"


def p99(samples: list[float]) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * 0.99))] if s else float("nan")


async def produce(config: dict[str, str], records: int, size: int) -> dict[str, float]:
    from gregor.client import Producer

    value = os.urandom(size)
    latencies: list[float] = []
    async with Producer({**config, "acks": "1", "linger.ms": 5, "batch.size": 65536}) as p:
        await (await p.send(TOPIC, value, partition=0))  # metadata and connections before the clock starts
        start = time.perf_counter()
        pending = []
        for _ in range(records):
            t0 = time.perf_counter()
            fut = await p.send(TOPIC, value, partition=0)
            fut.add_done_callback(lambda _md, _exc, t0=t0: latencies.append(time.perf_counter() - t0))
            pending.append(fut)
        await p.flush()
        elapsed = time.perf_counter() - start
    return {"mb_s": mb_per_s(records * size, elapsed), "p99_ms": p99(latencies) * 1000}


async def consume(config: dict[str, str], transport: str, expected: int, size: int) -> dict[str, float]:
    from gregor.client import Consumer

    polls: list[float] = []
    got = 0
    async with Consumer({**config, "fetch.transport": transport, "enable.auto.commit": False,
                         "max.partition.fetch.bytes": 1048576, "max.poll.records": 2000}) as c:
        c.assign([(TOPIC, 0)])
        c.seek_to_beginning((TOPIC, 0))
        start = time.perf_counter()
        while got < expected:
            t0 = time.perf_counter()
            batch = await c.poll(timeout_ms=1000)
            if batch:
                polls.append(time.perf_counter() - t0)
                got += len(batch)
        elapsed = time.perf_counter() - start
    return {"mb_s": mb_per_s(got * size, elapsed), "p99_ms": p99(polls) * 1000}


async def one_round(config: dict[str, str], records: int, size: int, total: int) -> dict[str, dict[str, float]]:
    out = {"produce": await produce(config, records, size)}
    for transport in ("grpc", "data"):
        out[f"consume_{transport}"] = await consume(config, transport, total, size)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=20000, help="records produced per round")
    ap.add_argument("--size", type=int, default=1024, help="bytes per record")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="CI size (run_all.py --quick): 2000 records, 1 round")
    a = ap.parse_args()
    if a.quick:
        a.records, a.rounds = 2000, 1

    from gregor.cli.local_cluster import LocalCluster
    from gregor.client import AdminClient

    base = tempfile.mkdtemp(prefix="bench-tls-")
    clusters: dict[str, Any] = {}
    try:
        for mode in ("plain", "tls"):
            clusters[mode] = LocalCluster.up(os.path.join(base, mode), brokers=1, controllers=0,
                                             tls=(mode == "tls"))

            async def create(cfg: dict[str, str]) -> None:
                async with AdminClient(cfg) as admin:
                    await admin.create_topic(TOPIC, 1, 1)
            asyncio.run(create(clusters[mode].client_config()))
        results: dict[str, list[dict[str, dict[str, float]]]] = {"plain": [], "tls": []}
        for r in range(a.rounds):
            for mode in ("plain", "tls"):
                total = (r + 1) * a.records + 1  # every round reads the whole partition (the warm-up record too)
                results[mode].append(asyncio.run(one_round(clusters[mode].client_config(), a.records, a.size, total)))
                print(f"round {r} {mode}: " + ", ".join(f"{k} {v['mb_s']:.1f} MB/s p99 {v['p99_ms']:.1f} ms"
                                                         for k, v in results[mode][-1].items()), flush=True)
        summary: dict[str, dict[str, float]] = {}
        print(f"\nTLS vs plain text, medians of {a.rounds} rounds ({a.records} x {a.size} B records per round; "
              f"machine shared with other work: figures are contended)")
        for kind in ("produce", "consume_grpc", "consume_data"):
            med = {mode: {m: statistics.median(r[kind][m] for r in results[mode]) for m in ("mb_s", "p99_ms")}
                   for mode in ("plain", "tls")}
            summary[kind] = {"plain_mb_s": med["plain"]["mb_s"], "tls_mb_s": med["tls"]["mb_s"],
                             "plain_p99_ms": med["plain"]["p99_ms"], "tls_p99_ms": med["tls"]["p99_ms"],
                             "throughput_ratio": print_ratio(f"{kind} throughput TLS", med["tls"]["mb_s"],
                                                             med["plain"]["mb_s"], "MB/s"),
                             "p99_ratio": print_ratio(f"{kind} p99 TLS", med["tls"]["p99_ms"],
                                                      med["plain"]["p99_ms"], "ms", higher_is_better=False)}
        path = write_results("tls", vars(a), {"rounds": results, "summary": summary})
        print(f"wrote {path}")
    finally:
        for c in clusters.values():
            c.down()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
