"""Producer gateway throughput as a ratio to direct SDK produce, measured in the same run.

One standalone broker and one gateway (`python -m gregor.gateway`, default
config: acks=all, linger.ms 5, batch.size 16 KiB) on loopback; topic of 3
partitions; 1 KiB records without keys.

- baseline: the Python SDK Producer in this process, acks=all, straight to the broker;
- gateway stream: ProduceStream, one GatewayRecord per record (what a thin client
  such as examples/node does), results read as they come;
- gateway stream batch: ProduceStreamBatch, 500 records per GatewayRecordBatch, results
  coalesced per message (a thin client that batches, as Kafka's clients do);
- gateway unary: Produce calls of 500 records each, 4 in flight (a client that batches);
- the same two against a null gateway (answers every record at once, writes nothing): the ceiling
  of the gRPC transport itself, so the gateway's own cost shows apart from it.

The gateway pays a gRPC message and a protobuf parse per record on top of the SDK
producer it runs, so the ratio says what the front door costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import print_ratio, write_results  # noqa: E402

# A null gateway: answers every record at once (offset = correlation id) and writes nothing. Its
# throughput is the ceiling of one-record-per-message gRPC streaming in Python on this machine.
NULL_GATEWAY = r'''
import asyncio
from gregor.common.rpc import make_server
from gregor.rpc.v1 import gateway_pb2, gateway_pb2_grpc
class Null(gateway_pb2_grpc.ProducerGatewayServiceServicer):
    async def Produce(self, request, context):
        return gateway_pb2.GatewayProduceResponse(results=[
            gateway_pb2.GatewayRecordResult(correlation_id=i, offset=i) for i in range(len(request.records))])
    async def ProduceStream(self, request_iterator, context):
        # Reads in its own task and writes from the handler, as the gateway does.
        q = asyncio.Queue()
        async def read():
            async for m in request_iterator:
                q.put_nowait(gateway_pb2.GatewayRecordResult(correlation_id=m.correlation_id, offset=m.correlation_id))
            q.put_nowait(None)
        reader = asyncio.ensure_future(read())
        while (item := await q.get()) is not None:
            yield item
    async def ProduceStreamBatch(self, request_iterator, context):
        async for b in request_iterator:
            yield gateway_pb2.GatewayRecordResultBatch(results=[
                gateway_pb2.GatewayRecordResult(correlation_id=m.correlation_id, offset=m.correlation_id)
                for m in b.records])
async def main():
    s = make_server(); gateway_pb2_grpc.add_ProducerGatewayServiceServicer_to_server(Null(), s)
    port = s.add_insecure_port("127.0.0.1:0"); await s.start(); print(port, flush=True)
    await s.wait_for_termination()
asyncio.run(main())
'''

RECORD_BYTES = 1024
PARTITIONS = 3
UNARY_RECORDS = 500
UNARY_IN_FLIGHT = 4
STREAM_WINDOW = 20000  # unanswered records on the stream (20 MiB < buffer.memory 32 MiB)
STREAM_BATCH = 500  # records per GatewayRecordBatch on ProduceStreamBatch


async def sdk_produce(bootstrap: str, topic: str, n: int, payload: bytes) -> float:
    from gregor.client.producer import Producer

    async with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as p:
        await (await p.send(topic, payload))  # warm-up: metadata, channel
        start = time.perf_counter()
        last = None
        for _ in range(n):
            last = await p.send(topic, payload)
        await p.flush()
        assert last is not None and (await last).offset >= 0
        return n / (time.perf_counter() - start)


async def gateway_stream(target: str, topic: str, n: int, payload: bytes) -> float:
    """ProduceStream, one record per message; the client writes with call.write() in one task and reads
    results in another (an async-generator request iterator is ~30% slower on the client side)."""
    import grpc

    from gregor.gateway.client import GatewayClient, record
    from gregor.rpc.v1 import gateway_pb2

    rec = record(payload)
    window = asyncio.Semaphore(STREAM_WINDOW)
    async with GatewayClient(target) as client:
        await client.produce(topic, [rec])  # warm-up
        start = time.perf_counter()
        call = client.stub().ProduceStream()

        async def write() -> None:
            for i in range(n):
                await window.acquire()
                await call.write(gateway_pb2.GatewayRecord(topic=topic, record=rec, correlation_id=i))
            await call.done_writing()

        writer = asyncio.ensure_future(write())
        got = errors = 0
        while (res := await call.read()) is not grpc.aio.EOF:
            window.release()
            got += 1
            errors += res.error.code != 0
        await writer
        elapsed = time.perf_counter() - start
    if errors or got != n:
        raise RuntimeError(f"gateway stream: {errors} errors, {got} of {n} answered")
    return n / elapsed


async def gateway_stream_batch(target: str, topic: str, n: int, payload: bytes) -> float:
    """ProduceStreamBatch: STREAM_BATCH records per message, results coalesced per message."""
    import grpc

    from gregor.gateway.client import GatewayClient, record
    from gregor.rpc.v1 import gateway_pb2

    rec = record(payload)
    outstanding = 0
    room = asyncio.Event()
    room.set()
    async with GatewayClient(target) as client:
        await client.produce(topic, [rec])  # warm-up
        start = time.perf_counter()
        call = client.stub().ProduceStreamBatch()

        async def write() -> None:
            nonlocal outstanding
            for first in range(0, n, STREAM_BATCH):
                while outstanding >= STREAM_WINDOW:
                    room.clear()
                    await room.wait()
                msgs = [gateway_pb2.GatewayRecord(topic=topic, record=rec, correlation_id=i)
                        for i in range(first, min(n, first + STREAM_BATCH))]
                outstanding += len(msgs)
                await call.write(gateway_pb2.GatewayRecordBatch(records=msgs))
            await call.done_writing()

        writer = asyncio.ensure_future(write())
        got = errors = 0
        while (res := await call.read()) is not grpc.aio.EOF:
            outstanding -= len(res.results)
            room.set()
            got += len(res.results)
            errors += sum(1 for r in res.results if r.error.code != 0)
        await writer
        elapsed = time.perf_counter() - start
    if errors or got != n:
        raise RuntimeError(f"gateway stream batch: {errors} errors, {got} of {n} answered")
    return n / elapsed


async def gateway_unary(target: str, topic: str, n: int, payload: bytes) -> float:
    from gregor.gateway.client import GatewayClient, record

    records = [record(payload)] * UNARY_RECORDS
    calls = max(1, n // UNARY_RECORDS)
    sem = asyncio.Semaphore(UNARY_IN_FLIGHT)
    async with GatewayClient(target) as client:
        await client.produce(topic, records[:1])  # warm-up

        async def one() -> int:
            async with sem:
                results = await client.produce(topic, records)
                return sum(1 for r in results if r.error.code != 0)

        start = time.perf_counter()
        failed = sum(await asyncio.gather(*(one() for _ in range(calls))))
        elapsed = time.perf_counter() - start
    if failed:
        raise RuntimeError(f"gateway unary: {failed} records failed")
    return calls * UNARY_RECORDS / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes for CI smoke runs")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=2, help="alternating runs; the best of each side is kept")
    args = ap.parse_args()
    n = 20_000 if args.quick else args.records
    payload = os.urandom(RECORD_BYTES)

    from gregor.cli.local_cluster import LocalCluster
    from gregor.client.admin import AdminClient

    results: dict[str, float] = {"sdk_records_s": 0.0, "gateway_stream_records_s": 0.0,
                                 "gateway_stream_batch_records_s": 0.0,
                                 "gateway_unary_records_s": 0.0, "null_stream_records_s": 0.0,
                                 "null_stream_batch_records_s": 0.0, "null_unary_records_s": 0.0}
    import subprocess

    null = subprocess.Popen([sys.executable, "-c", NULL_GATEWAY], stdout=subprocess.PIPE, text=True)
    try:
        null_target = f"127.0.0.1:{null.stdout.readline().strip()}"  # type: ignore[union-attr]
        for _ in range(args.runs):
            results["null_stream_records_s"] = max(results["null_stream_records_s"],
                                                   asyncio.run(gateway_stream(null_target, "bench", n, payload)))
            results["null_stream_batch_records_s"] = max(
                results["null_stream_batch_records_s"],
                asyncio.run(gateway_stream_batch(null_target, "bench", n, payload)))
            results["null_unary_records_s"] = max(results["null_unary_records_s"],
                                                  asyncio.run(gateway_unary(null_target, "bench", n, payload)))
    finally:
        null.kill()
    with tempfile.TemporaryDirectory(dir=os.path.join(os.path.dirname(__file__), "..")) as tmp:
        cluster = LocalCluster.up(tmp, brokers=1, gateways=1)
        try:
            gw = cluster.by_role("gateway")[0].grpc

            async def create() -> None:
                async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
                    await admin.create_topic("bench", PARTITIONS, 1)

            asyncio.run(create())
            for _ in range(args.runs):  # alternate, so neither side always runs on a warmer machine
                results["sdk_records_s"] = max(results["sdk_records_s"],
                                               asyncio.run(sdk_produce(cluster.bootstrap, "bench", n, payload)))
                results["gateway_stream_records_s"] = max(results["gateway_stream_records_s"],
                                                          asyncio.run(gateway_stream(gw, "bench", n, payload)))
                results["gateway_stream_batch_records_s"] = max(
                    results["gateway_stream_batch_records_s"],
                    asyncio.run(gateway_stream_batch(gw, "bench", n, payload)))
                results["gateway_unary_records_s"] = max(results["gateway_unary_records_s"],
                                                         asyncio.run(gateway_unary(gw, "bench", n, payload)))
        finally:
            cluster.down()

    print(f"{n} records of {RECORD_BYTES} B, acks=all, {PARTITIONS} partitions, one broker, one gateway:")
    base = results["sdk_records_s"]
    print_ratio("gateway ProduceStream (1 record/message)", results["gateway_stream_records_s"], base, "records/s")
    print_ratio(f"gateway ProduceStreamBatch ({STREAM_BATCH} records/message)",
                results["gateway_stream_batch_records_s"], base, "records/s")
    print_ratio(f"gateway Produce ({UNARY_RECORDS} records/call, {UNARY_IN_FLIGHT} in flight)",
                results["gateway_unary_records_s"], base, "records/s")
    print_ratio("gateway ProduceStreamBatch vs gateway ProduceStream", results["gateway_stream_batch_records_s"],
                results["gateway_stream_records_s"], "records/s")
    print("the same calls against a null gateway (no producer, answers at once): the gRPC ceiling")
    print_ratio("gateway ProduceStream vs null stream", results["gateway_stream_records_s"],
                results["null_stream_records_s"], "records/s")
    print_ratio("gateway ProduceStreamBatch vs null ProduceStreamBatch", results["gateway_stream_batch_records_s"],
                results["null_stream_batch_records_s"], "records/s")
    print_ratio("gateway Produce vs null Produce", results["gateway_unary_records_s"],
                results["null_unary_records_s"], "records/s")
    path = write_results("gateway_quick" if args.quick else "gateway",
                         {"quick": args.quick, "records": n, "record_bytes": RECORD_BYTES, "partitions": PARTITIONS,
                          "unary_records": UNARY_RECORDS, "stream_batch": STREAM_BATCH, "unary_in_flight": UNARY_IN_FLIGHT, "runs": args.runs},
                         results)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
