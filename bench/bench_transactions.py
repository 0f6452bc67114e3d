"""Transactions: producer and consumer throughput as ratios to their non-transactional baselines, same run.

One local cluster (etcd, controller, broker, group/transaction coordinator) on
loopback. Producer: the SDK Producer with transactional.id, committing every
10, 100 and 1000 ms, against the idempotent producer (acks=all, the same
records) — KIP-98's design figure is about 3% overhead at a 100 ms commit
interval. Rounds alternate baseline and transactional so machine noise hits
both alike; medians are compared. Consumer: a read_committed consumer against
a read_uncommitted one over the same log (transactions of 100 ms, every tenth
aborted, so the per-batch aborted filter runs), in log records scanned per
second.
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
OVERRIDES = {"offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "1",
             "transaction.state.log.replication.factor": "1", "transaction.state.log.num.partitions": "1"}


async def produce(bootstrap: str, topic: str, seconds: float, commit_ms: int | None, tid: str,
                  abort_every: int = 0) -> tuple[float, int]:
    """(records/s, records sent) over `seconds`; commit_ms None is the idempotent baseline."""
    from gregor.client import Producer

    value = os.urandom(RECORD_BYTES)
    cfg: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}
    if commit_ms is not None:
        cfg["transactional.id"] = tid
    async with Producer(cfg) as p:
        await p.partitions_for(topic)
        if commit_ms is not None:
            await p.init_transactions()
        n, txns = 0, 0
        start = time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            if commit_ms is not None:
                await p.begin_transaction()
            txn_end = time.perf_counter() + (commit_ms or 50) / 1000
            while time.perf_counter() < txn_end:
                for _ in range(64):  # a few sends between clock reads
                    await p.send(topic, value, partition=0)
                n += 64
                await asyncio.sleep(0)
            txns += 1
            if commit_ms is not None:
                if abort_every and txns % abort_every == 0:
                    await p.abort_transaction()
                else:
                    await p.commit_transaction()
        await p.flush()
        return n / (time.perf_counter() - start), n


async def consume(bootstrap: str, topic: str, isolation: str, log_records: int) -> float:
    """Log records scanned per second reading the whole partition from the beginning."""
    from gregor.client import Consumer

    async with Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation,
                         "auto.offset.reset": "earliest", "max.poll.records": 10000}) as c:
        c.assign([(topic, 0)])
        start = time.perf_counter()
        while await c.position((topic, 0)) < log_records:
            await c.poll(100)
        return log_records / (time.perf_counter() - start)


async def run(seconds: float, rounds: int) -> dict[str, object]:
    from gregor.cli.local_cluster import LocalCluster
    from gregor.client import AdminClient

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster.up(d, brokers=1, controllers=1, coordinators=1, coordinator_overrides=OVERRIDES)
        try:
            b = cluster.bootstrap
            async with AdminClient({"bootstrap.servers": b}) as admin:
                for t in ("bench-base", "bench-txn", "bench-read"):
                    await admin.create_topic(t, num_partitions=1, replication_factor=1)
            await produce(b, "bench-txn", 1.0, 100, "warm")  # creates __transaction_state, warms up
            for interval in (10, 100, 1000):
                rates: dict[str, list[float]] = {"base": [], "txn": []}
                for r in range(rounds):
                    rates["base"].append((await produce(b, "bench-base", seconds, None, ""))[0])
                    rates["txn"].append((await produce(b, "bench-txn", seconds, interval, f"bench-{interval}"))[0])
                base, txn = statistics.median(rates["base"]), statistics.median(rates["txn"])
                print_ratio(f"transactional producer, commit every {interval} ms", txn, base, "records/s")
                out[f"producer_commit_{interval}ms"] = {"idempotent_records_per_s": base,
                                                       "transactional_records_per_s": txn, "ratio": txn / base}
            _, n = await produce(b, "bench-read", max(seconds * 2, 2.0), 100, "bench-read", abort_every=10)
            from gregor.client import Consumer
            async with Consumer({"bootstrap.servers": b}) as c:
                log_end = (await c.end_offsets([("bench-read", 0)]))[("bench-read", 0)]
            reads: dict[str, list[float]] = {"read_uncommitted": [], "read_committed": []}
            for _ in range(rounds):
                for iso in reads:
                    reads[iso].append(await consume(b, "bench-read", iso, log_end))
            ru, rc = statistics.median(reads["read_uncommitted"]), statistics.median(reads["read_committed"])
            print_ratio("read_committed consumer (10% aborted)", rc, ru, "log records/s")
            out["consumer"] = {"records": n, "log_records": log_end, "read_uncommitted_per_s": ru,
                               "read_committed_per_s": rc, "ratio": rc / ru}
        finally:
            cluster.down()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each producer round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="1 s rounds, 1 round each")
    args = ap.parse_args()
    seconds, rounds = (1.0, 1) if args.quick else (args.seconds, args.rounds)
    results = asyncio.run(run(seconds, rounds))
    write_results("transactions", {"seconds": seconds, "rounds": rounds, "record_bytes": RECORD_BYTES}, results)


if __name__ == "__main__":
    main()
