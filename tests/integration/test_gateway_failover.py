"""Failures around the producer gateway, with real processes.

A gateway SIGKILLed under load: the client fails over to the other gateway on
UNAVAILABLE and resends what was not answered; every acknowledged record is in
the log where its result said, and a record appears twice only if its first
attempt went unanswered. A partition leader SIGKILLed behind the gateway (RF 3):
the gateway's producer retries on the new leader and clients see only successes,
and, the producer being idempotent, no record is written twice.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time

import grpc

from gregor.cli.local_cluster import LocalCluster, stop_process
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer, ConsumerRecord
from gregor.common import errors
from gregor.gateway.client import GatewayClient, record
from gregor.rpc.v1 import gateway_pb2
from tests.helpers.cluster import tear_down

Code = errors.Code


async def read_all(bootstrap: str, topic: str, partitions: int, expected: int,
                   timeout_s: float = 30.0) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            out += await consumer.poll(500)
        out += await consumer.poll(500)
    return out


async def test_gateway_sigkill_under_load_loses_no_acknowledged_record(tmp_path: object) -> None:
    c = LocalCluster.up(str(tmp_path), brokers=1, gateways=2)
    try:
        async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
            await admin.create_topic("kill", 3, 1)
        g0, g1 = c.by_role("gateway")
        acked: dict[bytes, tuple[int, int]] = {}
        retried: set[bytes] = set()
        failovers = 0
        batches_per_worker, batch = 40, 20

        async def worker(w: int) -> None:
            nonlocal failovers
            async with GatewayClient([g0.grpc, g1.grpc]) as client:
                for b in range(batches_per_worker):
                    todo = [b"w%d-%03d-%02d" % (w, b, i) for i in range(batch)]
                    while todo:
                        req = gateway_pb2.GatewayProduceRequest(topic="kill", records=[record(v) for v in todo])
                        try:
                            resp = await client.stub().Produce(req, timeout=30)
                        except grpc.RpcError as exc:
                            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                            retried.update(todo)  # unanswered: may or may not be in the log
                            client.fail_over()
                            failovers += 1
                            await asyncio.sleep(0.05)
                            continue
                        again = []
                        for v, r in zip(todo, resp.results):
                            if r.error.code == Code.NONE:
                                assert v not in acked
                                acked[v] = (r.partition, r.offset)
                            else:
                                assert r.error.retriable, r.error
                                again.append(v)
                        todo = again

        load = asyncio.gather(*(worker(w) for w in range(4)))
        deadline = time.monotonic() + 30
        while len(acked) < 300 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(acked) >= 300
        stop_process(g0, signal.SIGKILL)
        await load
        total = 4 * batches_per_worker * batch
        assert len(acked) == total and failovers >= 1
        log = await read_all(c.bootstrap, "kill", 3, total)
        at = {(r.partition, r.offset): r.value for r in log}
        for v, pos in acked.items():  # every acknowledged record is where its result said
            assert at.get(pos) == v, (v, pos)
        counts = collections.Counter(r.value for r in log)
        assert set(counts) == set(acked)
        duplicated = {v for v, n in counts.items() if n > 1}
        assert duplicated <= retried  # only records whose first attempt went unanswered
    finally:
        tear_down(c)


async def _leader_once_propagated(admin: AdminClient, topic: str, timeout_s: float = 15.0) -> int:
    """CreateTopics answers once the controller wrote the topic; brokers learn it by UpdateMetadata a
    moment later (as in Kafka), so wait until a broker names partition 0's leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            leader = (await admin.describe_topics([topic]))[topic].partitions[0].leader
            if leader >= 0:
                return leader
        except errors.UnknownTopicOrPartitionError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}-0 has no leader after {timeout_s}s")
        await asyncio.sleep(0.05)


async def test_leader_change_behind_the_gateway_is_invisible_to_clients(tmp_path: object) -> None:
    c = LocalCluster.up(str(tmp_path), brokers=3, controllers=1, lease_ttl_ms=2000, gateways=1)
    try:
        async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
            await admin.create_topic("ha", 2, 3, configs={"min.insync.replicas": "2"})
            leader = await _leader_once_propagated(admin, "ha")
        gw = c.by_role("gateway")[0]
        total = 1500
        results: list[gateway_pb2.GatewayRecordResult] = []
        killed = asyncio.Event()

        async def gen():  # type: ignore[no-untyped-def]
            for i in range(total):
                if i == 300:
                    killed.set()
                yield gateway_pb2.GatewayRecord(topic="ha", record=record(b"ha-%05d" % i), correlation_id=i,
                                                partition=i % 2)
                await asyncio.sleep(0.004)

        async def produce() -> None:
            async with GatewayClient(gw.grpc) as client:
                async for r in client.stub().ProduceStream(gen(), timeout=120):
                    results.append(r)

        task = asyncio.ensure_future(produce())
        await killed.wait()
        victim = next(b for b in c.by_role("broker") if b.id == leader)
        stop_process(victim, signal.SIGKILL)
        await task
        assert len(results) == total
        assert [r for r in results if r.error.code != Code.NONE] == []
        by_cid = {r.correlation_id: r for r in results}
        for p in (0, 1):  # per partition, offsets follow send order
            offsets = [by_cid[i].offset for i in range(p, total, 2)]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        survivors = ",".join(b.grpc for b in c.by_role("broker") if b.id != leader)
        async with AdminClient({"bootstrap.servers": survivors}) as admin:
            new_leader = (await admin.describe_topics(["ha"]))["ha"].partitions[0].leader
        assert new_leader not in (-1, leader)  # the records after the kill went to another leader
        log = await read_all(survivors, "ha", 2, total)
        at = {(r.partition, r.offset): r.value for r in log}
        for i, r in by_cid.items():
            assert at.get((r.partition, r.offset)) == b"ha-%05d" % i
        # The gateway's producer is idempotent (the SDK has it): its retries across the leader
        # change wrote nothing twice.
        assert gw.extra["idempotence"] is True
        assert len(log) == total and len({r.value for r in log}) == total
    finally:
        tear_down(c)
