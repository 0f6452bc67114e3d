"""One consumer reading many partitions: fetch sessions per broker against one fetch per partition (issue 24).

The consumer's two fetch paths, measured in the same run against the same broker and data:
`fetch.transport=grpc` (one FetchPartitions long poll per leader broker with an incremental fetch
session, KIP-227) and `fetch.transport=partition` (the old path: one task and one single-partition
Fetch RPC per assigned partition). A standalone broker hosts one topic of --partitions partitions
holding --records-per-partition records of --record-bytes each (written once with ProducePartitions);
each round lets a fresh consumer of each path (alternating which goes first) assign every partition,
seek to 0 and poll until it has every record, then poll on idle for --idle-s seconds.

Per path: records/s of the read, the broker's CPU seconds (utime + stime from /proc) per MB read,
the broker's CPU while the consumer idles, and the fetch RPCs the broker served (its
gregor_requests_total for Fetch and FetchPartitions). Prints the new/old ratios.
Quick form (default): 1,000 partitions, 20 records of 100 B each, 1 round: well under a minute.

    .venv/bin/python bench/bench_consumer_partitions.py [--partitions 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import print_ratio, print_row, write_results  # noqa: E402
from bench.kafka_dist import proc_cpu_seconds  # noqa: E402
from gregor.cli.local_cluster import start_broker, stop_process  # noqa: E402
from gregor.client import AdminClient, Consumer  # noqa: E402
from gregor.common import records  # noqa: E402
from gregor.common.rpc import channel  # noqa: E402
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc  # noqa: E402

TOPIC = "many"
PATHS = ("grpc", "partition")


def fetch_rpcs(metrics_url: str) -> dict[str, float]:
    body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out = {"Fetch": 0.0, "FetchPartitions": 0.0}
    for line in body.splitlines():
        if line.startswith("gregor_requests_total{") and 'service="BrokerService"' in line:
            for api in out:
                if f'api="{api}"' in line:
                    out[api] += float(line.split()[-1])
    return out


async def fill(address: str, partitions: int, per_partition: int, record_bytes: int) -> int:
    async with AdminClient({"bootstrap.servers": address}) as admin:
        await admin.create_topic(TOPIC, num_partitions=partitions, replication_factor=1)
    value = b"v" * record_bytes
    batch = records.build_batch([(None, value, [], int(time.time() * 1000))] * per_partition)
    async with channel(address) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        for start in range(0, partitions, 200):
            await stub.ProducePartitions(broker_pb2.ProducePartitionsRequest(acks=1, timeout_ms=30000, partitions=[
                broker_pb2.ProducePartitionData(topic=TOPIC, partition=p, records=batch)
                for p in range(start, min(partitions, start + 200))]), timeout=60)
    return len(batch) * partitions


async def read_all(address: str, path: str, partitions: int, total: int, idle_s: float, pid: int,
                   metrics_url: str) -> dict[str, float]:
    config = {"bootstrap.servers": address, "fetch.transport": path, "fetch.max.wait.ms": 500}
    async with Consumer(config) as c:
        tps = [(TOPIC, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        rpc0, cpu0, t0 = fetch_rpcs(metrics_url), proc_cpu_seconds(pid), time.perf_counter()
        got, nbytes = 0, 0
        while got < total:
            recs = await c.poll(1000)
            got += len(recs)
            nbytes += sum(len(r.value or b"") for r in recs)
        read_s, cpu1, rpc1 = time.perf_counter() - t0, proc_cpu_seconds(pid), fetch_rpcs(metrics_url)
        end = time.perf_counter() + idle_s
        while time.perf_counter() < end:
            await c.poll(int(max(1, (end - time.perf_counter()) * 1000)))
        cpu2, rpc2 = proc_cpu_seconds(pid), fetch_rpcs(metrics_url)
    mb = nbytes / 1e6
    return {"records_per_s": got / read_s, "read_s": read_s, "broker_cpu_s": cpu1 - cpu0,
            "broker_cpu_s_per_mb": (cpu1 - cpu0) / mb, "idle_broker_cores": (cpu2 - cpu1) / idle_s,
            "read_rpcs": sum(rpc1.values()) - sum(rpc0.values()),
            "idle_rpcs_per_s": (sum(rpc2.values()) - sum(rpc1.values())) / idle_s}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--records-per-partition", type=int, default=20)
    ap.add_argument("--record-bytes", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--idle-s", type=float, default=2.0)
    args = ap.parse_args()
    total = args.partitions * args.records_per_partition
    with tempfile.TemporaryDirectory(prefix="bench-consumer-partitions-") as data_dir:
        broker = start_broker(data_dir, 0)
        try:
            await fill(broker.grpc, args.partitions, args.records_per_partition, args.record_bytes)
            runs: dict[str, list[dict[str, float]]] = {p: [] for p in PATHS}
            for r in range(args.rounds):
                order = PATHS if r % 2 == 0 else PATHS[::-1]
                for path in order:
                    res = await read_all(broker.grpc, path, args.partitions, total, args.idle_s, broker.pid,
                                         broker.metrics)
                    runs[path].append(res)
                    print_row(f"round {r} {path}", **res)
        finally:
            stop_process(broker)
    med: dict[str, dict[str, float]] = {p: {k: statistics.median(x[k] for x in runs[p]) for k in runs[p][0]}
                                        for p in PATHS}
    new, old = med["grpc"], med["partition"]
    print(f"one consumer, {args.partitions} partitions, {total} records of {args.record_bytes} B "
          f"(median of {args.rounds} round(s); new = fetch sessions per broker, baseline = one Fetch per partition)")
    print_ratio("records/s", new["records_per_s"], old["records_per_s"], "rec/s")
    print_ratio("broker CPU per MB read", new["broker_cpu_s_per_mb"], old["broker_cpu_s_per_mb"], "s/MB",
                higher_is_better=False)
    print_ratio("broker cores while the consumer idles", new["idle_broker_cores"], old["idle_broker_cores"],
                "cores", higher_is_better=False)
    print_ratio("fetch RPCs to read everything", new["read_rpcs"], old["read_rpcs"], "calls",
                higher_is_better=False)
    print_ratio("fetch RPCs/s while idle", new["idle_rpcs_per_s"], old["idle_rpcs_per_s"], "calls/s",
                higher_is_better=False)
    path = write_results("consumer_partitions", vars(args), {"median": med, "runs": runs})
    print(f"results: {path}")


if __name__ == "__main__":
    asyncio.run(main())
