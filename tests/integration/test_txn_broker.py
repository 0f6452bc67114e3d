"""The broker's side of transactions against a real broker process (seed 003, §6.8).

Raw transactional batches and WriteTxnMarkers over gRPC, as the transactional
producer and the transaction coordinator send them: the LSO stops at the
oldest open transaction, read_committed fetches stop there and get the
aborted transactions of their range from the `.txnindex`, ListOffsets latest
is the LSO under read_committed, fenced markers and bad batches write nothing,
and an open transaction (LSO) and the aborted index survive SIGKILL and a
clean restart.
"""

from __future__ import annotations

import glob
import os
import signal
import time

import gregor_native as native
import pytest

from gregor.cli.local_cluster import Process, start_broker, stop_process
from gregor.client import Consumer
from gregor.common import errors
from gregor.common.control_records import encode_marker_batch
from gregor.common.records import build_batch
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.integration.test_idempotence import create_topic, init_producer_id, raw_produce

RC, RU = common_pb2.READ_COMMITTED, common_pb2.READ_UNCOMMITTED


def txn_batch(values: list[bytes], pid: int, epoch: int, seq: int, transactional: bool = True) -> bytes:
    return build_batch([(None, v, [], int(time.time() * 1000)) for v in values], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=transactional)


async def fetch(address: str, topic: str, isolation: int, offset: int = 0) -> broker_pb2.FetchResponse:
    async with channel(address) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=offset, max_bytes=1 << 20, min_bytes=0, max_wait_ms=0,
            isolation_level=isolation), timeout=10)


async def latest(address: str, topic: str, isolation: int) -> int:
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).ListOffsets(broker_pb2.ListOffsetsRequest(
            topic=topic, partition=0, timestamp_ms=-1, isolation_level=isolation), timeout=10)
    return r.offset


async def markers(address: str, pid: int, epoch: int, commit: bool, coordinator_epoch: int,
                  topic: str) -> broker_pb2.TxnMarkerPartitionResult:
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(
            markers=[broker_pb2.WriteTxnMarker(
                producer_id=pid, producer_epoch=epoch, committed=commit, coordinator_epoch=coordinator_epoch,
                partitions=[common_pb2.TopicPartition(topic=topic, partition=0)])], timeout_ms=10000), timeout=15)
    assert len(r.results) == 1
    return r.results[0]


def aborted(resp: broker_pb2.FetchResponse) -> list[tuple[int, int]]:
    return [(a.producer_id, a.first_offset) for a in resp.aborted_transactions]


async def test_lso_read_committed_and_aborted_index(broker: Process) -> None:
    await create_topic(broker.grpc, "t", 1)
    p1, _ = await init_producer_id(broker.grpc)
    p2, _ = await init_producer_id(broker.grpc)
    assert (await raw_produce(broker.grpc, "t", txn_batch([b"a1", b"a2"], p1, 0, 0))).base_offset == 0
    assert (await raw_produce(broker.grpc, "t", txn_batch([b"b1"], p2, 0, 0))).base_offset == 2
    # Both open: read_committed sees nothing, read_uncommitted everything below the HW.
    rc, ru = await fetch(broker.grpc, "t", RC), await fetch(broker.grpc, "t", RU)
    assert (rc.high_watermark, rc.last_stable_offset, rc.records) == (3, 0, b"")
    assert len(ru.records) > 0 and ru.last_stable_offset == 0
    assert (await latest(broker.grpc, "t", RC), await latest(broker.grpc, "t", RU)) == (0, 3)

    r = await markers(broker.grpc, p1, 0, False, 1, "t")  # abort p1
    assert (r.error.code, r.offset) == (0, 3)
    rc = await fetch(broker.grpc, "t", RC)
    assert rc.last_stable_offset == 2, "p2's transaction from offset 2 is still open"
    assert aborted(rc) == [(p1, 0)]
    assert [h.base_offset for h in native.parse_batches(rc.records)] == [0]

    r = await markers(broker.grpc, p2, 0, True, 1, "t")  # commit p2
    assert (r.error.code, r.offset) == (0, 4)
    rc = await fetch(broker.grpc, "t", RC)
    assert (rc.high_watermark, rc.last_stable_offset) == (5, 5)
    assert aborted(rc) == [(p1, 0)], "the commit is not an aborted transaction"
    assert aborted(await fetch(broker.grpc, "t", RC, offset=4)) == [], "the abort marker is below offset 4"
    assert aborted(await fetch(broker.grpc, "t", RU)) == [], "read_uncommitted gets no aborted list"
    assert await latest(broker.grpc, "t", RC) == 5
    assert glob.glob(os.path.join(broker.data_dir, "t-0", "*.txnindex"))


async def test_fenced_markers_and_bad_batches_write_nothing(broker: Process) -> None:
    await create_topic(broker.grpc, "f", 1)
    pid, _ = await init_producer_id(broker.grpc)
    await raw_produce(broker.grpc, "f", txn_batch([b"x"], pid, 0, 0))
    assert (await markers(broker.grpc, pid, 0, True, 5, "f")).error.code == 0  # LEO 2
    cases = [
        (await markers(broker.grpc, pid, 0, False, 4, "f"), "TRANSACTION_COORDINATOR_FENCED"),  # stale coordinator
        (await markers(broker.grpc, pid, 1, True, 5, "f"), None),  # an epoch bump (fencing): written, LEO 3
        (await markers(broker.grpc, pid, 0, True, 5, "f"), "INVALID_PRODUCER_EPOCH"),  # epoch going backwards
        (await markers(broker.grpc, -1, 0, True, 5, "f"), "INVALID_REQUEST"),
        (await markers(broker.grpc, pid, 1, True, 5, "nope"), "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    for result, expected in cases:
        assert (errors.code_name(result.error.code) if result.error.code else None) == expected, result
        assert expected is None or result.error.message
    with pytest.raises(errors.GregorError) as control:  # a producer may not write markers itself
        await raw_produce(broker.grpc, "f", encode_marker_batch(pid, 1, True, 5, 0))
    assert errors.code_name(control.value.code) == "INVALID_RECORD"
    await raw_produce(broker.grpc, "f", txn_batch([b"y"], pid, 1, 0))  # a new transaction at epoch 1, offset 3
    with pytest.raises(errors.GregorError) as state:  # non-transactional batch inside the open transaction
        await raw_produce(broker.grpc, "f", txn_batch([b"z"], pid, 1, 1, transactional=False))
    assert errors.code_name(state.value.code) == "INVALID_TXN_STATE"
    ru = await fetch(broker.grpc, "f", RU)
    assert (ru.high_watermark, ru.last_stable_offset) == (4, 3), "only the accepted batches and markers were written"


def restart(p: Process, sig: int) -> Process:
    stop_process(p, sig)
    return start_broker(os.path.dirname(p.data_dir), p.id)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_open_transaction_and_aborted_index_survive_restart(tmp_path: object, sig: int) -> None:
    b = start_broker(str(tmp_path), 0)
    try:
        # Small segments: rolls snapshot the producer state; the tail after the last snapshot is rescanned.
        await create_topic(b.grpc, "r", 1, configs={"segment.bytes": "300"})
        p1, _ = await init_producer_id(b.grpc)
        p2, _ = await init_producer_id(b.grpc)
        for i in range(4):
            await raw_produce(b.grpc, "r", txn_batch([b"a" * 40], p1, 0, i))  # 0..3
        await markers(b.grpc, p1, 0, False, 1, "r")  # 4: abort
        await raw_produce(b.grpc, "r", txn_batch([b"b" * 40], p2, 0, 0))  # 5: open
        for i in range(3):
            await raw_produce(b.grpc, "r", build_batch([(None, b"plain", [], 0)]))  # 6..8, no producer id
        before = await fetch(b.grpc, "r", RU)
        assert (before.high_watermark, before.last_stable_offset) == (9, 5)
        b = restart(b, sig)
        rc = await fetch(b.grpc, "r", RC)
        assert (rc.high_watermark, rc.last_stable_offset) == (9, 5), "the open transaction is restored"
        assert aborted(rc) == [(p1, 0)]
        assert (await markers(b.grpc, p2, 0, True, 1, "r")).offset == 9
        rc = await fetch(b.grpc, "r", RC)
        assert (rc.last_stable_offset, aborted(rc)) == (10, [(p1, 0)])
        # A stale coordinator is still fenced after the restart (the epoch is in the snapshot or the scan).
        assert errors.code_name((await markers(b.grpc, p2, 0, True, 0, "r")).error.code) == \
            "TRANSACTION_COORDINATOR_FENCED"
    finally:
        stop_process(b, signal.SIGKILL)



async def consume(address: str, topic: str, isolation: str, want: int, timeout_s: float = 5.0,
                  transport: str = "grpc") -> list[bytes]:
    """Values a consumer of partition 0 returns from the beginning until `want` arrive or the time runs out."""
    out: list[bytes] = []
    async with Consumer({"bootstrap.servers": address, "isolation.level": isolation,
                         "auto.offset.reset": "earliest", "fetch.max.wait.ms": 100,
                         "fetch.transport": transport}) as c:
        c.assign([(topic, 0)])
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            out += [r.value for r in await c.poll(200)]
    return out


@pytest.mark.parametrize("transport", ["grpc", "data"])
async def test_consumer_drops_aborted_and_control_batches(broker: Process, transport: str) -> None:
    topic = f"c-{transport}"
    await create_topic(broker.grpc, topic, 1)
    p1, _ = await init_producer_id(broker.grpc)
    p2, _ = await init_producer_id(broker.grpc)
    # Interleaved: p1 aborts, p2 commits, then a plain record; p1's second transaction stays open.
    await raw_produce(broker.grpc, topic, txn_batch([b"a1", b"a2"], p1, 0, 0))
    await raw_produce(broker.grpc, topic, txn_batch([b"b1"], p2, 0, 0))
    await raw_produce(broker.grpc, topic, txn_batch([b"a3"], p1, 0, 2))
    await markers(broker.grpc, p1, 0, False, 1, topic)
    await raw_produce(broker.grpc, topic, txn_batch([b"b2"], p2, 0, 1))
    await markers(broker.grpc, p2, 0, True, 1, topic)
    await raw_produce(broker.grpc, topic, build_batch([(None, b"plain", [], 0)]))
    await raw_produce(broker.grpc, topic, txn_batch([b"a4"], p1, 0, 3))  # open: the LSO stops here
    await raw_produce(broker.grpc, topic, build_batch([(None, b"after", [], 0)]))
    committed = await consume(broker.grpc, topic, "read_committed", 4, timeout_s=3.0, transport=transport)
    assert committed == [b"b1", b"b2", b"plain"], "aborted records hidden, nothing past the open transaction"
    uncommitted = await consume(broker.grpc, topic, "read_uncommitted", 8, transport=transport)
    assert uncommitted == [b"a1", b"a2", b"b1", b"a3", b"b2", b"plain", b"a4", b"after"], "no control records"
    await markers(broker.grpc, p1, 0, True, 1, topic)
    assert await consume(broker.grpc, topic, "read_committed", 5, transport=transport) == [b"b1", b"b2", b"plain", b"a4", b"after"]


async def test_position_moves_past_trailing_markers_and_aborted_batches(broker: Process) -> None:
    """A consumer that returned every record has its position at the end of the log, past the last
    marker and past a trailing aborted transaction (Kafka's nextFetchOffset)."""
    await create_topic(broker.grpc, "pos", 1)
    pid, _ = await init_producer_id(broker.grpc)
    await raw_produce(broker.grpc, "pos", build_batch([(None, b"plain", [], 0)]))  # 0
    await raw_produce(broker.grpc, "pos", txn_batch([b"gone"], pid, 0, 0))  # 1
    await markers(broker.grpc, pid, 0, False, 1, "pos")  # 2
    for isolation in ("read_committed", "read_uncommitted"):
        async with Consumer({"bootstrap.servers": broker.grpc, "isolation.level": isolation,
                             "auto.offset.reset": "earliest", "fetch.max.wait.ms": 50}) as c:
            c.assign([("pos", 0)])
            seen: list[bytes] = []
            deadline = time.monotonic() + 5
            while await c.position(("pos", 0)) < 3 and time.monotonic() < deadline:
                seen += [r.value for r in await c.poll(100)]
            assert await c.position(("pos", 0)) == 3, isolation
            assert seen == ([b"plain"] if isolation == "read_committed" else [b"plain", b"gone"])
