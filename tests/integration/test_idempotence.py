"""Idempotence end to end with real processes (seed 003): producer ids, sequences, duplicates, gaps, restarts.

A fault proxy between producer and broker drops answers (the broker appended,
the producer retries): an idempotent producer still leaves every record once,
offsets contiguous, in send order; the same run without idempotence leaves
duplicates (so the test can fail). Raw batches through gRPC check the broker's
rules (duplicate, gap, stale epoch), their survival across SIGKILL and clean
restarts (snapshot + header scan), and a 3-broker RF 3 cluster keeps exactly
once across a SIGKILLed leader.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import gregor_native as native
import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, stop_process
from gregor.client import AdminClient, Producer
from gregor.common import errors
from gregor.common.records import build_batch
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.batches import record_values
from tests.helpers.cluster import tear_down
from tests.helpers.grpc_proxy import GrpcFaultProxy, ProducePolicy
from tests.integration.test_cli import failed, gregor
from tests.integration.test_cluster_control import broker as broker_by_id
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until


async def create_topic(address: str, topic: str, partitions_: int = 1, rf: int = 1,
                       configs: dict[str, str] | None = None) -> None:
    async with AdminClient({"bootstrap.servers": address}) as admin:
        await admin.create_topic(topic, num_partitions=partitions_, replication_factor=rf, configs=configs or {})


async def read_all(address: str, topic: str, partition: int = 0) -> tuple[list[int], list[bytes]]:
    """(offsets, values) of every record of a partition below its high watermark, read from the broker."""
    data, pos = b"", 0
    async with channel(address) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        while True:
            resp = await stub.Fetch(broker_pb2.FetchRequest(topic=topic, partition=partition, fetch_offset=pos,
                                                            max_bytes=1 << 22, min_bytes=0, max_wait_ms=0), timeout=10)
            if not resp.records:
                break
            data += resp.records
            pos = native.parse_batches(resp.records)[-1].next_offset
    offsets = [o for h in native.parse_batches(data) for o in range(h.base_offset, h.last_offset + 1)]
    return offsets, record_values(data)


def metric(p: Process, name: str) -> float:
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def produce_all(address: str, topic: str, values: list[bytes], partitions_: int = 1,
                      **config: object) -> list[object]:
    """Send values round-robin over partitions; every record's metadata or exception."""
    # Small batches and requests: many requests, so the proxy's faults hit many of them.
    cfg = {"bootstrap.servers": address, "linger.ms": 0, "batch.size": 200, "max.request.size": 700,
           "retry.backoff.ms": 20,
           "request.timeout.ms": 5000, "delivery.timeout.ms": 60000, **config}
    async with Producer(cfg) as p:
        handles = [await p.send(topic, v, partition=i % partitions_) for i, v in enumerate(values)]
        await p.flush()
        out: list[object] = []
        for h in handles:
            try:
                out.append(await h)
            except errors.GregorError as exc:
                out.append(exc)
        return out


# ---------------------------------------------------------------- (a) answers dropped on the way back
async def test_dropped_responses_retried_without_duplicates(broker: Process) -> None:
    await create_topic(broker.grpc, "drops", 1)
    values = [f"r{i:04d}".encode() for i in range(800)]
    with GrpcFaultProxy(broker.grpc, ProducePolicy(drop_responses=10, every=2)) as proxy:
        results = await produce_all(proxy.address, "drops", values)
        assert proxy.policy.responses_dropped == 10
    assert all(not isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)]
    offsets, seen = await read_all(broker.grpc, "drops")
    assert seen == values  # exactly once, in send order
    # A dropped answer breaks the producer's stream (as a lost answer breaks Kafka's connection), so the
    # requests in flight on it (at most max.in.flight = 5) are retried; each the leader had appended comes
    # back as a duplicate, the dropped one among them.
    dups = metric(broker, 'gregor_broker_produce_duplicate_requests_total{topic="drops"}')
    assert 10 <= dups <= 10 * 5, dups
    assert offsets == list(range(len(values)))  # contiguous
    assert sorted(r.offset for r in results) == offsets  # type: ignore[attr-defined]


async def test_without_idempotence_the_same_drops_duplicate_records(broker: Process) -> None:
    """The control: the proxy really makes the producer resend appended batches."""
    await create_topic(broker.grpc, "dups", 1)
    values = [f"r{i:04d}".encode() for i in range(200)]
    with GrpcFaultProxy(broker.grpc, ProducePolicy(drop_responses=3, every=1)) as proxy:
        results = await produce_all(proxy.address, "dups", values, **{"enable.idempotence": False})
        assert proxy.policy.responses_dropped == 3
    assert all(not isinstance(r, BaseException) for r in results)
    _, seen = await read_all(broker.grpc, "dups")
    assert len(seen) > len(values) and set(seen) == set(values)


# ---------------------------------------------------------------- (b) order with 5 in flight and retries
async def test_partition_order_with_five_in_flight_and_induced_retries(broker: Process) -> None:
    await create_topic(broker.grpc, "ordered", 3)
    values = [f"v{i:05d}".encode() for i in range(1500)]
    policy = ProducePolicy(drop_responses=15, drop_requests=15, every=4, max_delay_s=0.03, seed=7)
    with GrpcFaultProxy(broker.grpc, policy) as proxy:
        results = await produce_all(proxy.address, "ordered", values, partitions_=3, **{
            "max.in.flight.requests.per.connection": 5, "enable.idempotence": True})
    assert all(not isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)][:3]
    assert policy.responses_dropped > 0 and policy.requests_dropped > 0
    assert policy.max_concurrent >= 2  # requests of one producer really overlapped
    for p in range(3):
        offsets, seen = await read_all(broker.grpc, "ordered", p)
        assert seen == values[p::3], f"partition {p}: order or count differs"
        assert offsets == list(range(len(seen)))


# ---------------------------------------------------------------- (c) the broker's rules on raw batches
async def init_producer_id(address: str) -> tuple[int, int]:
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).InitProducerId(
            broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=15)
    return r.producer_id, r.producer_epoch


def idem_batch(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([(None, v, [], int(time.time() * 1000)) for v in values], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq)


async def raw_produce(address: str, topic: str, records: bytes, acks: int = -1) -> broker_pb2.ProduceResponse:
    async with channel(address) as ch:
        try:
            return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
                topic=topic, partition=0, records=records, acks=acks, timeout_ms=10000), timeout=15)
        except grpc.aio.AioRpcError as exc:
            raise errors.from_rpc_error(exc) from None


async def test_gap_duplicate_and_stale_epoch_on_raw_batches(broker: Process) -> None:
    await create_topic(broker.grpc, "raw", 1)
    pid, epoch = await init_producer_id(broker.grpc)
    pid2, _ = await init_producer_id(broker.grpc)
    assert epoch == 0 and pid2 != pid
    first = await raw_produce(broker.grpc, "raw", idem_batch([b"a", b"b"], pid, 0, 0))
    assert (first.base_offset, first.duplicate) == (0, False)
    again = await raw_produce(broker.grpc, "raw", idem_batch([b"a", b"b"], pid, 0, 0))
    assert (again.base_offset, again.last_offset, again.duplicate) == (0, 1, True)
    with pytest.raises(errors.GregorError) as gap:
        await raw_produce(broker.grpc, "raw", idem_batch([b"c"], pid, 0, 5))
    assert errors.code_name(gap.value.code) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert (await raw_produce(broker.grpc, "raw", idem_batch([b"c"], pid, 0, 2))).base_offset == 2
    assert (await raw_produce(broker.grpc, "raw", idem_batch([b"d"], pid, 1, 0))).base_offset == 3  # new epoch
    with pytest.raises(errors.GregorError) as stale:
        await raw_produce(broker.grpc, "raw", idem_batch([b"e"], pid, 0, 3))
    assert errors.code_name(stale.value.code) == "INVALID_PRODUCER_EPOCH"
    with pytest.raises(errors.GregorError) as unknown:
        await raw_produce(broker.grpc, "raw", idem_batch([b"f"], pid2, 0, 4))
    assert errors.code_name(unknown.value.code) == "UNKNOWN_PRODUCER_ID"
    offsets, seen = await read_all(broker.grpc, "raw")
    assert seen == [b"a", b"b", b"c", b"d"] and offsets == [0, 1, 2, 3]


# ---------------------------------------------------------------- (d) restarts keep the producer state
def restart(p: Process, sig: int) -> Process:
    stop_process(p, sig)
    return start_broker(os.path.dirname(p.data_dir), p.id)


async def test_duplicate_recognised_after_sigkill_and_clean_restart(tmp_path: object) -> None:
    data_dir = str(tmp_path)
    b = start_broker(data_dir, 0)
    try:
        # Small segments: rolls write snapshots, and the tail after the last one is rebuilt by a header scan.
        await create_topic(b.grpc, "restart", 1, configs={"segment.bytes": "400"})
        pid, _ = await init_producer_id(b.grpc)
        sent = [idem_batch([f"m{i}".encode() * 10], pid, 0, i) for i in range(12)]
        offsets = [(await raw_produce(b.grpc, "restart", batch)).base_offset for batch in sent]
        assert offsets == list(range(12))
        part_dir = os.path.join(b.data_dir, "restart-0")
        assert glob.glob(os.path.join(part_dir, "*.snapshot")), "a segment roll leaves a snapshot"

        b = restart(b, signal.SIGKILL)
        for i in (11, 8):  # the last batch and one further back, both among the last 5
            r = await raw_produce(b.grpc, "restart", sent[i])
            assert (r.base_offset, r.duplicate) == (i, True)
        with pytest.raises(errors.GregorError) as gap:
            await raw_produce(b.grpc, "restart", idem_batch([b"x"], pid, 0, 14))
        assert errors.code_name(gap.value.code) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
        assert (await raw_produce(b.grpc, "restart", idem_batch([b"n12"], pid, 0, 12))).base_offset == 12

        b = restart(b, signal.SIGTERM)  # clean: snapshot at the LEO, loaded without a scan
        assert os.path.exists(os.path.join(part_dir, f"{13:020d}.snapshot"))
        r = await raw_produce(b.grpc, "restart", idem_batch([b"n12"], pid, 0, 12))
        assert (r.base_offset, r.duplicate) == (12, True)
        _, seen = await read_all(b.grpc, "restart")
        assert len(seen) == 13
        # A new producer id after restart never repeats one handed out before (persistent block).
        assert (await init_producer_id(b.grpc))[0] > pid
    finally:
        stop_process(b, signal.SIGKILL)


# ---------------------------------------------------------------- (e) RF 3, leader killed mid-stream
@pytest.fixture(scope="module")
def rf3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("idem-rf3")), brokers=3, controllers=1, lease_ttl_ms=2000,
                        broker_overrides={"replica.lag.time.max.ms": "2000", "broker.session.timeout.ms": "4000"})
    try:
        yield c
    finally:
        tear_down(c)


async def test_producer_ids_come_from_controller_blocks(rf3: LocalCluster) -> None:
    b0, b1 = rf3.by_role("broker")[:2]
    pids0 = [(await init_producer_id(b0.grpc))[0] for _ in range(3)]
    pid1, _ = await init_producer_id(b1.grpc)
    assert pids0 == [pids0[0], pids0[0] + 1, pids0[0] + 2]
    assert abs(pid1 - pids0[0]) >= 1000  # another broker, another block of 1000


async def test_leader_killed_mid_stream_no_duplicates_no_loss(rf3: LocalCluster) -> None:
    brokers = rf3.by_role("broker")
    topic = "idem-failover"
    await create_topic(brokers[0].grpc, topic, 1, 3, {"min.insync.replicas": "2"})

    async def led() -> bool:
        v = partitions(await metadata(brokers[0], topic))
        return bool(v) and v[0][0] >= 0 and len(v[0][3]) == 3
    await until(led, 20, "a leader with a full ISR")
    leader_id = partitions(await metadata(brokers[0], topic))[0][0]
    victim = broker_by_id(rf3, leader_id)
    values = [f"f{i:05d}".encode() for i in range(3000)]
    cfg = {"bootstrap.servers": rf3.bootstrap, "linger.ms": 2, "batch.size": 400, "max.request.size": 2000,
           "retry.backoff.ms": 50,
           "request.timeout.ms": 3000, "delivery.timeout.ms": 90000}
    async with Producer(cfg) as p:
        handles = []
        for i, v in enumerate(values):
            handles.append(await p.send(topic, v, partition=0))
            if i == 1000:  # requests are in flight now: their answers die with the leader
                stop_process(victim, signal.SIGKILL)
            if i % 20 == 0:
                await asyncio.sleep(0.02)  # a stream of ~3 s, not one burst
        await p.flush()
        results = []
        for h in handles:
            try:
                results.append(await h)
            except errors.GregorError as exc:
                results.append(exc)
    assert all(not isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)][:3]
    survivors = [b for b in brokers if b.id != leader_id]
    new_leader = broker_by_id(rf3, partitions(await metadata(survivors[0], topic))[0][0])
    offsets, seen = await read_all(new_leader.grpc, topic)
    assert len(seen) == len(values) and seen == values  # no duplicate, no loss, in order
    assert offsets == list(range(len(values)))
    epochs = {h.partition_leader_epoch for h in native.parse_batches(b"".join(
        open(f, "rb").read() for f in sorted(glob.glob(os.path.join(new_leader.data_dir, f"{topic}-0", "*.log")))))}
    assert len(epochs) >= 2, epochs  # the stream really crossed the failover
    back = start_broker(os.path.dirname(victim.data_dir), victim.id, etcd_endpoint=rf3.by_role("etcd")[0].grpc,
                        overrides={"replica.lag.time.max.ms": "2000", "broker.session.timeout.ms": "4000"})
    rf3.processes = [q for q in rf3.processes if q.pid != victim.pid] + [back]


# ---------------------------------------------------------------- (f) configuration errors in the CLI
@pytest.mark.parametrize("flags, message", [
    (["--acks", "1"], "Must set acks to all in order to use the idempotent producer"),
    (["--producer-property", "retries=0"], "Must set retries to non-zero when using the idempotent producer"),
    (["--producer-property", "max.in.flight.requests.per.connection=6"],
     "Must set max.in.flight.requests.per.connection to at most 5 to use the idempotent producer"),
])
def test_cli_refuses_invalid_idempotence_configs(flags: list[str], message: str) -> None:
    proc = gregor("produce", "t", "--producer-property", "enable.idempotence=true", *flags, input="x\n",
                  bootstrap="127.0.0.1:1")
    failed(proc, message, code=2)


def test_cli_default_idempotence_quietly_off_with_acks_1(broker: Process) -> None:
    asyncio.run(create_topic(broker.grpc, "acks1", 1))
    proc = gregor("--output", "json", "produce", "acks1", "--acks", "1", input="a\nb\n", bootstrap=broker.grpc)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line] == [
        '{"partition":0,"offset":0,"key":null,"value":"a"}', '{"partition":0,"offset":1,"key":null,"value":"b"}']


async def test_merged_batch_over_max_message_bytes_is_split_and_keeps_order(broker: Process) -> None:
    """Ready batches leave merged into one wire batch; over the topic's max.message.bytes they go one by one."""
    await create_topic(broker.grpc, "split", 1, configs={"max.message.bytes": "1200"})
    values = [f"s{i:04d}".encode() * 4 for i in range(600)]
    results = await produce_all(broker.grpc, "split", values, **{"batch.size": 600, "max.request.size": 8000,
                                                                 "linger.ms": 20})
    assert all(not isinstance(r, BaseException) for r in results), [r for r in results if isinstance(r, BaseException)][:3]
    offsets, seen = await read_all(broker.grpc, "split")
    assert seen == values and offsets == list(range(len(values)))
    _, data_sizes = offsets, [h.size_bytes for h in native.parse_batches(b"".join(
        open(f, "rb").read() for f in sorted(glob.glob(os.path.join(broker.data_dir, "split-0", "*.log")))))]
    assert max(data_sizes) <= 1200
