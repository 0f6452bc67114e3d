"""Idempotent producer throughput as a ratio to the same producer without idempotence, measured in the same run.

One standalone broker on loopback; the Python SDK Producer, acks=all, linger.ms 5,
batch.size 16 KiB, 1 KiB records without keys; 1 and 3 partitions. Runs alternate
(off, on, off, on, ...) so machine noise hits both sides alike; the median of each
side is compared. Idempotence costs a producer id, sequence stamping (header
rewrite + CRC per wire batch) and the broker's per-batch state check; the limit of
5 unacknowledged batches per partition is offset by merging ready batches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import print_ratio, write_results  # noqa: E402

RECORD_BYTES = 1024


async def produce(bootstrap: str, topic: str, partitions: int, n: int, idempotent: bool) -> float:
    from gregor.client import Producer

    value = os.urandom(RECORD_BYTES)
    cfg = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent}
    async with Producer(cfg) as p:
        await p.partitions_for(topic)
        start = time.perf_counter()
        for i in range(n):
            await p.send(topic, value, partition=i % partitions)
        await p.flush()
        return n / (time.perf_counter() - start)


async def run(records: int, rounds: int) -> dict[str, dict[str, float]]:
    from gregor.cli.local_cluster import start_broker, stop_process
    from gregor.client import AdminClient

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        broker = start_broker(d, 0)
        try:
            for partitions in (1, 3):
                topic = f"idem-{partitions}"
                async with AdminClient({"bootstrap.servers": broker.grpc}) as admin:
                    await admin.create_topic(topic, num_partitions=partitions, replication_factor=1)
                rates: dict[bool, list[float]] = {False: [], True: []}
                await produce(broker.grpc, topic, partitions, records // 4, True)  # warm-up
                for _ in range(rounds):
                    for idem in (False, True):
                        rates[idem].append(await produce(broker.grpc, topic, partitions, records, idem))
                base, idem_rate = statistics.median(rates[False]), statistics.median(rates[True])
                print_ratio(f"idempotent, {partitions} partition(s)", idem_rate, base, "records/s")
                out[f"{partitions}p"] = {"baseline_records_per_s": base, "idempotent_records_per_s": idem_rate,
                                         "ratio": idem_rate / base}
        finally:
            stop_process(broker)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = asyncio.run(run(args.records, args.rounds))
    write_results("idempotence", {"records": args.records, "rounds": args.rounds, "record_bytes": RECORD_BYTES},
                  results)


if __name__ == "__main__":
    main()
