"""One broker over gRPC on loopback: produce (acks=1) and fetch throughput of 1 KiB records.

Baseline, measured in the same run: a null gRPC servicer in the same kind of
process that accepts the same Produce requests and discards them (and answers
Fetch with the same bytes from memory). The ratio broker/null says how much of
the transport ceiling the broker keeps; the absolute MiB/s are compared with the
issue's targets (>= 150 MiB/s produce, >= 300 MiB/s fetch on 2 cores).

Requests carry 16 KiB batches of 1 KiB records bundled into 1 MiB requests,
as the producer's accumulator sends them; several requests are in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import print_ratio, write_results  # noqa: E402
from gregor.common.memory import tune_allocator  # noqa: E402

RECORD_BYTES = 1024
BATCH_RECORDS = 16  # 16 KiB batches (batch.size)
REQUEST_BATCHES = 64  # 1 MiB requests (max.request.size)
IN_FLIGHT = 5  # max.in.flight.requests.per.connection

NULL_SERVER = r'''
import asyncio, sys
from gregor.common.rpc import make_server
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
class Null(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self): self.data = b""
    async def Produce(self, request, context):
        if not self.data: self.data = request.records
        return broker_pb2.ProduceResponse(base_offset=0, last_offset=0)
    async def Fetch(self, request, context):
        return broker_pb2.FetchResponse(records=self.data)
async def main():
    s = make_server(); broker_pb2_grpc.add_BrokerServiceServicer_to_server(Null(), s)
    port = s.add_insecure_port("127.0.0.1:0"); await s.start(); print(port, flush=True)
    await s.wait_for_termination()
asyncio.run(main())
'''


def request_payload() -> bytes:
    from tests.helpers.batches import make_batch

    batch = make_batch([os.urandom(RECORD_BYTES) for _ in range(BATCH_RECORDS)])
    return batch * REQUEST_BATCHES


async def produce_load(target: str, topic: str, payload: bytes, total_bytes: int) -> float:
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    n_requests = max(1, total_bytes // len(payload))
    async with channel(target) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        req = broker_pb2.ProduceRequest(topic=topic, partition=0, records=payload, acks=1, timeout_ms=30000)
        await stub.Produce(req)  # warm-up
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one() -> None:
            async with sem:
                await stub.Produce(req)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n_requests)))
        elapsed = time.perf_counter() - start
    return n_requests * len(payload) / elapsed / 1048576


async def fetch_load(target: str, topic: str, total_bytes: int, max_bytes: int = 1 << 20) -> float:
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    async with channel(target) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        got, offset = 0, 0
        start = time.perf_counter()
        while got < total_bytes:
            resp = await stub.Fetch(broker_pb2.FetchRequest(topic=topic, partition=0, fetch_offset=offset,
                                                            max_bytes=max_bytes))
            if not resp.records:
                offset = 0  # the null server and a short log both wrap around
                continue
            got += len(resp.records)
            last = resp.records
            if resp.high_watermark:
                # next offset = last batch's last offset + 1; parse only the last header cheaply
                offset = _next_offset(last)
                if offset >= resp.high_watermark:
                    offset = 0
        elapsed = time.perf_counter() - start
    return got / elapsed / 1048576


def _next_offset(data: bytes) -> int:
    import gregor_native as native

    return native.parse_batches(data, verify_crc=False)[-1].next_offset


def data_port_fetch(address: str, topic: str, total_bytes: int, hw: int, max_bytes: int = 1 << 20) -> float:
    from gregor.rpc.v1 import broker_pb2

    host, port = address.rsplit(":", 1)
    got, offset = 0, 0
    buf = bytearray(max_bytes + (1 << 20))
    view = memoryview(buf)
    with socket.create_connection((host, int(port))) as s:
        start = time.perf_counter()
        while got < total_bytes:
            body = broker_pb2.FetchRequest(topic=topic, partition=0, fetch_offset=offset,
                                           max_bytes=max_bytes).SerializeToString()
            s.sendall(struct.pack(">I", len(body)) + body)
            (n,) = struct.unpack(">I", _recv_exact(s, 4))
            header = broker_pb2.DataFetchResponseHeader.FromString(_recv_exact(s, n))
            length = header.records_length
            pos = 0
            while pos < length:
                pos += s.recv_into(view[pos:length])
            got += length
            offset = _last_next(view[:length])
            if offset >= hw:
                offset = 0
        elapsed = time.perf_counter() - start
    return got / elapsed / 1048576


def _last_next(records: memoryview) -> int:
    # Walk batch headers (baseOffset i64, batchLength i32 ... lastOffsetDelta at 23) without copying records.
    pos, nxt = 0, 0
    while pos + 61 <= len(records):
        base, length = struct.unpack_from(">qi", records, pos)
        (delta,) = struct.unpack_from(">i", records, pos + 23)
        nxt = base + delta + 1
        pos += 12 + length
    return nxt


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes for CI smoke runs")
    ap.add_argument("--mb", type=int, default=1024, help="MB to produce and to fetch")
    args = ap.parse_args()
    total = (64 if args.quick else args.mb) * 1_000_000
    tune_allocator()  # the same allocator settings as the broker (gregor.common.memory)
    payload = request_payload()

    from tests.helpers.cluster import broker_process

    results: dict[str, float] = {}
    null = subprocess.Popen([sys.executable, "-c", "from gregor.common.memory import tune_allocator; tune_allocator()\n" + NULL_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        null_target = f"127.0.0.1:{null.stdout.readline().strip()}"  # type: ignore[union-attr]
        results["null_produce_mb_s"] = asyncio.run(produce_load(null_target, "t", payload, total))
        results["null_fetch_mb_s"] = asyncio.run(fetch_load(null_target, "t", total))
    finally:
        null.kill()

    with tempfile.TemporaryDirectory(dir=os.path.join(os.path.dirname(__file__), "..")) as tmp, \
            broker_process(tmp) as b:
        from tests.integration.test_broker import create_topic

        asyncio.run(create_topic(b.grpc, "bench"))
        results["broker_produce_mb_s"] = asyncio.run(produce_load(b.grpc, "bench", payload, total))
        hw = max(1, total // len(payload)) * REQUEST_BATCHES * BATCH_RECORDS
        results["broker_fetch_grpc_mb_s"] = asyncio.run(fetch_load(b.grpc, "bench", total))
        results["broker_fetch_data_port_mb_s"] = data_port_fetch(b.data, "bench", total, hw)

    print(f"produce acks=1, 1 KiB records, 16 KiB batches in 1 MiB requests, {IN_FLIGHT} in flight:")
    report("broker produce", results["broker_produce_mb_s"], results["null_produce_mb_s"], 150.0)
    print("fetch of the same data, 1 MiB max_bytes (max.partition.fetch.bytes):")
    report("broker fetch (gRPC)", results["broker_fetch_grpc_mb_s"], results["null_fetch_mb_s"], 300.0)
    report("broker fetch (data port, sendfile)", results["broker_fetch_data_port_mb_s"],
           results["null_fetch_mb_s"], 300.0)
    path = write_results("broker_quick" if args.quick else "broker",
                         {"quick": args.quick, "total_mb": total / 1e6, "record_bytes": RECORD_BYTES,
                          "batch_records": BATCH_RECORDS, "request_batches": REQUEST_BATCHES, "in_flight": IN_FLIGHT},
                         results)
    print(f"results: {path}")


def report(label: str, value_mb_s: float, baseline_mb_s: float, target_mb_s: float) -> None:
    """Ratio against the null-gRPC baseline of this run, then the absolute figure against the issue's target."""
    print_ratio(f"{label} vs null gRPC", value_mb_s, baseline_mb_s, "MiB/s")
    verdict = "OK" if value_mb_s >= target_mb_s else "MISSED"
    print(f"  {label}: {value_mb_s:,.1f} MiB/s (target >= {target_mb_s:.0f} MiB/s on 2 cores: {verdict})", flush=True)


if __name__ == "__main__":
    main()
