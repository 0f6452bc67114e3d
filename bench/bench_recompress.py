"""Broker-side recompression (topic compression.type) as a ratio of the pass-through path, same run.

One standalone broker on loopback. Pre-built Produce requests, one 64 KiB
(uncompressed) batch of ~512-byte JSON-like records each, 4 requests in
flight, acks=1, raw gRPC (no client SDK on the clock). For each source codec
the same requests go alternately (pass, recompress, pass, ...) to a topic with
compression.type=producer (the leader appends the producer's bytes as they
are) and to one with compression.type=zstd (the leader decompresses, walks the
records, recompresses with zstd level 3 and rebuilds every batch in one native
call); the medians of each side are compared, in uncompressed MB/s. The zstd
source is the control: already in the topic's codec, so no rewrite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import MIB, print_ratio, write_results  # noqa: E402

BATCH_BYTES = 64 * 1024
IN_FLIGHT = 4
SOURCES = ("none", "gzip", "lz4", "zstd")


def make_batch(codec: str, seed: int) -> tuple[bytes, int]:
    """(batch, uncompressed record bytes) of JSON-like records, as logs and events compress."""
    from gregor.common.records import build_batch

    rows, size, i = [], 0, 0
    while size < BATCH_BYTES:
        value = json.dumps({"id": seed * 100000 + i, "user": f"user-{(seed * 31 + i) % 977}",
                            "event": ("click", "view", "buy")[i % 3], "path": f"/shop/item/{i % 311}",
                            "payload": os.urandom(96).hex()}).encode()
        rows.append((b"k%d" % (i % 64), value, [], 1_700_000_000_000 + i))
        size += len(value) + 4
        i += 1
    return build_batch(rows, compression=codec), size


async def produce_load(address: str, topic: str, batches: list[bytes], rounds: int) -> float:
    """Seconds to send every batch `rounds` times with IN_FLIGHT requests outstanding."""
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    reqs = [broker_pb2.ProduceRequest(topic=topic, partition=0, records=b, acks=1, timeout_ms=30000) for b in batches]
    async with channel(address) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        await stub.Produce(reqs[0], timeout=30)  # warm-up
        todo = [r for _ in range(rounds) for r in reqs]

        async def worker(k: int) -> None:
            for r in todo[k::IN_FLIGHT]:
                await stub.Produce(r, timeout=30)  # an error is a grpc.aio.AioRpcError: the bench stops

        start = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(IN_FLIGHT)))
        return time.perf_counter() - start


async def run(total_mib: int, rounds: int) -> dict[str, dict[str, float]]:
    from gregor.cli.local_cluster import start_broker, stop_process
    from gregor.client import AdminClient

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as d:
        broker = start_broker(d, 0)
        try:
            async with AdminClient({"bootstrap.servers": broker.grpc}) as admin:
                for src in SOURCES:
                    await admin.create_topic(f"pass-{src}", num_partitions=1, replication_factor=1,
                                             configs={"retention.bytes": str(256 * MIB), "segment.bytes": str(64 * MIB)})
                    await admin.create_topic(f"zstd-{src}", num_partitions=1, replication_factor=1,
                                             configs={"compression.type": "zstd", "retention.bytes": str(256 * MIB),
                                                      "segment.bytes": str(64 * MIB)})
            for src in SOURCES:
                made = [make_batch(src, s) for s in range(16)]
                batches = [b for b, _ in made]
                raw_bytes = sum(n for _, n in made)
                reps = max(1, total_mib * MIB // raw_bytes)
                rates: dict[str, list[float]] = {"pass": [], "zstd": []}
                for _ in range(rounds):
                    for side in ("pass", "zstd"):
                        secs = await produce_load(broker.grpc, f"{side}-{src}", batches, reps)
                        rates[side].append(raw_bytes * reps / MIB / secs)
                base, rec = statistics.median(rates["pass"]), statistics.median(rates["zstd"])
                label = f"{src} -> zstd topic" + (" (no rewrite: control)" if src == "zstd" else "")
                print_ratio(label, rec, base, "MB/s (uncompressed)")
                out[src] = {"pass_through_mb_s": base, "recompress_mb_s": rec, "ratio": rec / base}
        finally:
            stop_process(broker)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="uncompressed MiB per side per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small sizes for CI smoke runs (8 MiB, 1 round)")
    args = ap.parse_args()
    mib, rounds = (8, 1) if args.quick else (args.mib, args.rounds)
    results = asyncio.run(run(mib, rounds))
    write_results("recompress_quick" if args.quick else "recompress",
                  {"quick": args.quick, "mib": mib, "rounds": rounds, "batch_bytes": BATCH_BYTES,
                   "in_flight": IN_FLIGHT}, results)


if __name__ == "__main__":
    main()
