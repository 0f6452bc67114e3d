"""The broker's drivers tested directly: proto in, gRPC status and ErrorDetail out.

An in-process broker (standalone, real gRPC server, real data port, real logs)
answers BrokerService, BrokerControlService and the data port; replication states a
standalone broker never reaches (a follower, an ISR of two, a follower fetch) are set
up through the same ReplicaManager entry points LeaderAndIsr uses. Every error code
named in broker.proto's comments for these RPCs is produced here at least once
(COORDINATOR_LOAD_IN_PROGRESS and the coordinator's own codes live in
test_find_coordinator.py and test_idempotence.py, which need a controller).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import gregor_native as native
import grpc
import pytest

from gregor.broker.broker import Broker
from gregor.common import errors
from gregor.common.config import BrokerConfig
from gregor.common.clock import now_ms
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc, coordinator_pb2
from tests.helpers.batches import make_batch
from tests.helpers.wait import until

Code = errors.Code


@dataclass
class Running:
    broker: Broker
    stub: broker_pb2_grpc.BrokerServiceStub
    control: broker_pb2_grpc.BrokerControlServiceStub
    admin: controller_pb2_grpc.AdminServiceStub


@pytest.fixture
async def running(tmp_path: os.PathLike[str]) -> AsyncIterator[Running]:
    # A short replica.lag.time.max.ms: a follower that left the ISR stops holding the HW 0.1 s later.
    cfg = BrokerConfig(broker_id=0, log_dirs=os.path.join(str(tmp_path), "logs"), port=0, data_port=0,
                       metrics_port=-1, replica_lag_time_max_ms=100)
    broker = Broker(cfg)
    await broker.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc_port}")
    run = Running(broker, broker_pb2_grpc.BrokerServiceStub(ch), broker_pb2_grpc.BrokerControlServiceStub(ch),
                  controller_pb2_grpc.AdminServiceStub(ch))
    resp = await run.admin.CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
        controller_pb2.CreatableTopic(name="t", num_partitions=1, replication_factor=1),
        controller_pb2.CreatableTopic(name="small", num_partitions=1, replication_factor=1,
                                configs={"max.message.bytes": "200"}),
        controller_pb2.CreatableTopic(name="strict", num_partitions=1, replication_factor=1,
                                configs={"min.insync.replicas": "2"})]))
    assert all(not r.HasField("error") or not r.error.code for r in resp.results)
    try:
        yield run
    finally:
        await ch.close()
        await broker.stop(0)


async def status_of(call: object) -> errors.GregorError:
    """Await a call that must fail; its typed error."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    err = errors.from_rpc_error(info.value)
    assert err.code != Code.UNKNOWN_SERVER_ERROR, err
    return err


def produce(topic: str, records: bytes, acks: int = 1, timeout_ms: int = 1000) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(topic=topic, partition=0, records=records, acks=acks, timeout_ms=timeout_ms)


def idempotent(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    section = native.encode_records([(None, v, [], 0) for v in values])
    return native.build_batch(section, len(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def lead_with(run: Running, topic: str, epoch: int, isr: list[int], replicas: list[int]) -> None:
    """Make broker 0 leader at `epoch` as a LeaderAndIsr would (the standalone broker has no controller)."""
    rm = run.broker.replica_manager
    state = broker_pb2.LeaderAndIsrPartitionState(topic=topic, partition=0, leader=0, leader_epoch=epoch, isr=isr,
                                                  replicas=replicas, partition_epoch=epoch)
    assert rm.become_leader_or_follower([state], {}) == {}


def follower_5_lagging(p: Any) -> bool:
    """The leader's own rule says follower 5 is out of sync: an ISR without it is what it would propose."""
    return p.state.out_of_sync_isr(p.log_end_offset, now_ms()) == [0]


# -- Produce ---------------------------------------------------------------------------------


async def test_produce_rejects_bad_requests_with_typed_errors(running: Running) -> None:
    s = running.stub
    assert (await status_of(s.Produce(produce("nope", make_batch([b"a"]))))).code == Code.UNKNOWN_TOPIC_OR_PARTITION
    assert (await status_of(s.Produce(produce("t", make_batch([b"a"]), acks=2)))).code == Code.INVALID_REQUIRED_ACKS
    assert (await status_of(s.Produce(produce("t", b"")))).code == Code.CORRUPT_MESSAGE
    bad_crc = bytearray(make_batch([b"a"]))
    bad_crc[-1] ^= 0xFF
    assert (await status_of(s.Produce(produce("t", bytes(bad_crc))))).code == Code.CORRUPT_MESSAGE
    assert (await status_of(s.Produce(produce("small", make_batch([b"x" * 500]))))).code == Code.MESSAGE_TOO_LARGE
    not_a_batch = make_batch([b"a"])[:20]
    assert (await status_of(s.Produce(produce("t", not_a_batch)))).code in (Code.CORRUPT_MESSAGE,
                                                                              Code.INVALID_RECORD)
    # Nothing of the above was appended.
    out = await s.ListOffsets(broker_pb2.ListOffsetsRequest(topic="t", partition=0, timestamp_ms=-1))
    assert out.offset == 0


async def test_produce_acks_all_below_min_insync_is_refused_before_any_write(running: Running) -> None:
    err = await status_of(running.stub.Produce(produce("strict", make_batch([b"a"]), acks=-1)))
    assert err.code == Code.NOT_ENOUGH_REPLICAS and err.topic == "strict"
    out = await running.stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic="strict", partition=0, timestamp_ms=-1))
    assert out.offset == 0
    await running.stub.Produce(produce("strict", make_batch([b"a"]), acks=1))  # acks=1 does not need the ISR


async def test_acks_all_times_out_then_fails_after_append_when_the_isr_shrinks(running: Running) -> None:
    lead_with(running, "strict", 1, [0, 5], [0, 5])
    err = await status_of(running.stub.Produce(produce("strict", make_batch([b"a"]), acks=-1, timeout_ms=100)))
    assert err.code == Code.REQUEST_TIMED_OUT
    pending = asyncio.ensure_future(running.stub.Produce(produce("strict", make_batch([b"b"]), acks=-1,
                                                                 timeout_ms=10_000)))
    await asyncio.sleep(0.2)
    rm = running.broker.replica_manager
    p = rm.partitions[("strict", 0)]
    rm.run_effects(p, p.on_isr_write_result(1, [0], p.partition_epoch + 1))  # follower 5 left the ISR
    assert (await status_of(pending)).code == Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND


async def test_a_follower_answers_not_leader_and_parked_produces_wake_up(running: Running) -> None:
    lead_with(running, "strict", 1, [0, 5], [0, 5])
    pending = asyncio.ensure_future(running.stub.Produce(produce("strict", make_batch([b"a"]), acks=-1,
                                                                 timeout_ms=10_000)))
    await asyncio.sleep(0.2)
    rm = running.broker.replica_manager
    state = broker_pb2.LeaderAndIsrPartitionState(topic="strict", partition=0, leader=5, leader_epoch=2, isr=[5],
                                                  replicas=[0, 5], partition_epoch=3)
    assert rm.become_leader_or_follower([state], {}) == {}
    err = await status_of(pending)
    assert err.code == Code.NOT_LEADER_OR_FOLLOWER
    err = await status_of(running.stub.Produce(produce("strict", make_batch([b"b"]))))
    assert err.code == Code.NOT_LEADER_OR_FOLLOWER and err.leader_id == 5 and err.leader_epoch == 2
    # The same LeaderAndIsr again is stale (Kafka applies only a newer leader epoch).
    assert rm.become_leader_or_follower([state], {}) == {("strict", 0): Code.STALE_CONTROLLER_EPOCH}


def part(topic: str, records: bytes) -> broker_pb2.ProducePartitionData:
    return broker_pb2.ProducePartitionData(topic=topic, partition=0, records=records)


def produce_many(*parts: broker_pb2.ProducePartitionData, acks: int = 1,
                 timeout_ms: int = 1000) -> broker_pb2.ProducePartitionsRequest:
    return broker_pb2.ProducePartitionsRequest(acks=acks, timeout_ms=timeout_ms, partitions=parts)


async def test_produce_partitions_answers_each_partition_and_one_failure_spares_the_others(
        running: Running) -> None:
    s = running.stub
    await s.Produce(produce("t", make_batch([b"0", b"1"])))
    bad_crc = bytearray(make_batch([b"a"]))
    bad_crc[-1] ^= 0xFF
    resp = await s.ProducePartitions(produce_many(
        part("t", make_batch([b"a", b"b", b"c"])), part("nope", make_batch([b"a"])),
        part("small", make_batch([b"x" * 500])), part("strict", make_batch([b"s"])),
        broker_pb2.ProducePartitionData(topic="t", partition=7, records=make_batch([b"a"]))))
    assert [(r.topic, r.partition) for r in resp.results] == [("t", 0), ("nope", 0), ("small", 0), ("strict", 0),
                                                              ("t", 7)]
    ok, unknown, too_large, strict, no_partition = resp.results
    assert not ok.HasField("error") and (ok.base_offset, ok.last_offset) == (2, 4)
    assert unknown.error.code == Code.UNKNOWN_TOPIC_OR_PARTITION and unknown.error.topic == "nope"
    assert too_large.error.code == Code.MESSAGE_TOO_LARGE
    assert not strict.HasField("error") and strict.base_offset == 0  # acks=1 does not need min.insync.replicas
    assert no_partition.error.code == Code.UNKNOWN_TOPIC_OR_PARTITION and no_partition.error.partition == 7
    resp = await s.ProducePartitions(produce_many(part("t", bytes(bad_crc)), part("small", make_batch([b"y"]))))
    assert resp.results[0].error.code == Code.CORRUPT_MESSAGE and resp.results[1].base_offset == 0
    out = await s.ListOffsets(broker_pb2.ListOffsetsRequest(topic="t", partition=0, timestamp_ms=-1))
    assert out.offset == 5  # the damaged batch was not appended; the good ones were


async def test_produce_partitions_refuses_a_malformed_request_as_a_whole(running: Running) -> None:
    s = running.stub
    assert (await status_of(s.ProducePartitions(produce_many()))).code == Code.INVALID_REQUEST
    twice = produce_many(part("t", make_batch([b"a"])), part("t", make_batch([b"b"])))
    assert (await status_of(s.ProducePartitions(twice))).code == Code.INVALID_REQUEST
    bad_acks = produce_many(part("t", make_batch([b"a"])), acks=2)
    assert (await status_of(s.ProducePartitions(bad_acks))).code == Code.INVALID_REQUIRED_ACKS
    out = await s.ListOffsets(broker_pb2.ListOffsetsRequest(topic="t", partition=0, timestamp_ms=-1))
    assert out.offset == 0


async def test_produce_partitions_acks_all_waits_for_every_partition(running: Running) -> None:
    """acks=-1: the answer comes when every partition is replicated or failed; acks=0 answers -1 offsets."""
    lead_with(running, "strict", 1, [0, 5], [0, 5])
    rm = running.broker.replica_manager
    pending = asyncio.ensure_future(running.stub.ProducePartitions(produce_many(
        part("t", make_batch([b"a"])), part("strict", make_batch([b"b"])), acks=-1, timeout_ms=10_000)))
    p = rm.partitions[("strict", 0)]
    # Both partitions are appended ("t", ISR of one, is committed at once) and the request is parked in
    # the produce purgatory: it is not answered while "strict" waits for follower 5.
    await until(lambda: rm.produce_purgatory.size() > 0 and p.log_end_offset == 1
                and rm.partitions[("t", 0)].high_watermark == 1, 10, "the request parked in purgatory")
    assert not pending.done()
    await until(lambda: follower_5_lagging(p), 10, "follower 5 is past replica.lag.time.max.ms")
    rm.run_effects(p, p.on_isr_write_result(1, [0], p.partition_epoch + 1))  # follower 5 left the ISR
    t_result, strict_result = (await pending).results
    assert not t_result.HasField("error") and t_result.base_offset == 0
    assert strict_result.error.code == Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    resp = await running.stub.ProducePartitions(produce_many(part("t", make_batch([b"z"])), acks=0))
    assert resp.results[0].base_offset == -1 and not resp.results[0].HasField("error")
    out = await running.stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic="t", partition=0, timestamp_ms=-1))
    assert out.offset == 2


async def test_produce_stream_appends_in_order_and_answers_by_correlation_id(running: Running) -> None:
    """ProduceStream: appends in arrival order, an acks=all request does not hold up later ones, answers
    carry their correlation id, a malformed request is answered with an error and the stream goes on."""
    lead_with(running, "strict", 1, [0, 5], [0, 5])
    rm = running.broker.replica_manager
    pid = (await running.stub.InitProducerId(broker_pb2.InitProducerIdRequest())).producer_id
    call = running.stub.ProduceStream()
    waiting = produce_many(part("strict", make_batch([b"w"])), acks=-1, timeout_ms=10_000)
    waiting.correlation_id = 7
    await call.write(waiting)
    for cid, seq in ((8, 0), (9, 1), (10, 2)):  # one idempotent producer's batches back to back: in order
        req = produce_many(part("t", idempotent([b"s%d" % seq], pid, 0, seq)))
        req.correlation_id = cid
        await call.write(req)
    bad = produce_many(part("t", make_batch([b"x"])), acks=5)
    bad.correlation_id = 11
    await call.write(bad)
    answers = [await call.read() for _ in range(4)]
    assert [a.correlation_id for a in answers] == [8, 9, 10, 11]  # the acks=all one (7) is still waiting
    assert [a.results[0].base_offset for a in answers[:3]] == [0, 1, 2]
    assert answers[3].error.code == Code.INVALID_REQUIRED_ACKS and not answers[3].results
    p = rm.partitions[("strict", 0)]
    await until(lambda: follower_5_lagging(p), 10, "follower 5 is past replica.lag.time.max.ms")
    rm.run_effects(p, p.on_isr_write_result(1, [0], p.partition_epoch + 1))  # follower 5 left the ISR
    late = await call.read()
    assert late.correlation_id == 7 and late.results[0].error.code == Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF  # the producer closed its side: the stream ends cleanly
    assert await call.code() == grpc.StatusCode.OK


async def test_a_stopping_broker_answers_what_waits_and_ends_its_produce_streams(tmp_path: os.PathLike[str]) -> None:
    """Broker.stop answers a request still waiting for its acks (NOT_LEADER_OR_FOLLOWER, retriable) and
    ends the stream with OK, as Kafka closes its connections: the server's stop does not wait out its
    grace period for the stream and then cancel it (it did, 2 s per broker stop)."""
    cfg = BrokerConfig(broker_id=0, log_dirs=os.path.join(str(tmp_path), "logs"), port=0, data_port=-1,
                       metrics_port=-1)
    broker = Broker(cfg)
    await broker.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{broker.grpc_port}") as ch:
        run = Running(broker, broker_pb2_grpc.BrokerServiceStub(ch), broker_pb2_grpc.BrokerControlServiceStub(ch),
                      controller_pb2_grpc.AdminServiceStub(ch))
        await run.admin.CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(name="strict", num_partitions=1, replication_factor=1)]))
        lead_with(run, "strict", 1, [0, 5], [0, 5])
        call = run.stub.ProduceStream()
        req = produce_many(part("strict", make_batch([b"w"])), acks=-1, timeout_ms=60_000)
        req.correlation_id = 3
        await call.write(req)
        await asyncio.sleep(0.2)
        assert len(broker.produce_streams) == 1
        stopping = asyncio.ensure_future(broker.stop(60))  # a grace far beyond the test's own timeout
        answer = await call.read()
        assert answer.correlation_id == 3 and answer.results[0].error.code == Code.NOT_LEADER_OR_FOLLOWER
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(stopping, 30)
        assert not broker.produce_streams


def fetch_part(topic: str, offset: int, epoch: int = 1) -> broker_pb2.ReplicaFetchPartition:
    return broker_pb2.ReplicaFetchPartition(topic=topic, partition=0, fetch_offset=offset, current_leader_epoch=epoch,
                                            max_bytes=1 << 20)


async def test_replica_fetch_session_answers_only_partitions_with_news(running: Running) -> None:
    """KIP-227 on the ReplicaFetch stream: after a full request, an incremental one names only moved
    partitions and is answered only for partitions with records, a new HW or an error."""
    lead_with(running, "t", 1, [0, 5], [0, 5])
    lead_with(running, "strict", 1, [0, 5], [0, 5])
    call = running.stub.ReplicaFetch()

    async def fetch(*parts: broker_pb2.ReplicaFetchPartition, incremental: bool = True,
                    wait_ms: int = 3000) -> list[tuple[str, int, int]]:
        await call.write(broker_pb2.ReplicaFetchRequest(replica_id=5, min_bytes=1, max_wait_ms=wait_ms,
                                                        partitions=parts, incremental=incremental))
        resp = await call.read()
        return [(q.topic, q.high_watermark, len(q.records)) for q in resp.partitions]

    # Full: every partition is answered once (the session has told the follower nothing yet).
    assert await fetch(fetch_part("t", 0), fetch_part("strict", 0), incremental=False) == [("t", 0, 0),
                                                                                            ("strict", 0, 0)]
    # Incremental, nothing moved: parked until an append to a session partition, then only that one.
    pending = asyncio.ensure_future(fetch())
    await asyncio.sleep(0.2)
    assert not pending.done(), took
    await running.stub.Produce(produce("t", make_batch([b"a"])))
    answered = await asyncio.wait_for(pending, 5)
    assert [(t, hw) for t, hw, _ in answered] == [("t", 0)] and answered[0][2] > 0
    # The follower names "t" at its new offset: the HW moves, and only "t" is answered with it.
    assert await fetch(fetch_part("t", 1)) == [("t", 1, 0)]
    # Nothing new anywhere: the poll runs its max wait and comes back empty.
    started = asyncio.get_running_loop().time()
    assert await fetch(wait_ms=300) == []
    assert asyncio.get_running_loop().time() - started >= 0.25
    call.cancel()


async def test_idempotent_producer_errors(running: Running) -> None:
    s = running.stub
    init = await s.InitProducerId(broker_pb2.InitProducerIdRequest())
    pid = init.producer_id
    first = await s.Produce(produce("t", idempotent([b"a"], pid, 0, 0)))
    again = await s.Produce(produce("t", idempotent([b"a"], pid, 0, 0)))
    assert again.duplicate and again.base_offset == first.base_offset
    assert (await status_of(s.Produce(produce("t", idempotent([b"c"], pid, 0, 5))))).code == \
        Code.OUT_OF_ORDER_SEQUENCE_NUMBER
    await s.Produce(produce("t", idempotent([b"b"], pid, 1, 0)))  # a bumped epoch starts at 0
    assert (await status_of(s.Produce(produce("t", idempotent([b"d"], pid, 0, 1))))).code == \
        Code.INVALID_PRODUCER_EPOCH
    assert (await status_of(s.Produce(produce("t", idempotent([b"e"], pid + 999, 0, 7))))).code == \
        Code.UNKNOWN_PRODUCER_ID
    assert (await status_of(s.InitProducerId(broker_pb2.InitProducerIdRequest(transactional_id="tx"))))\
        .code == Code.INVALID_REQUEST


async def test_storage_error_when_the_log_is_gone(running: Running) -> None:
    p = running.broker.replica_manager.partitions[("t", 0)]
    p.log.close()
    assert (await status_of(running.stub.Produce(produce("t", make_batch([b"a"]))))).code == \
        Code.KAFKA_STORAGE_ERROR


# -- Fetch, ListOffsets, OffsetForLeaderEpoch -------------------------------------------------------


def fetch(**kw: object) -> broker_pb2.FetchRequest:
    base: dict[str, object] = dict(topic="t", partition=0, fetch_offset=0, max_bytes=1 << 20, min_bytes=0,
                                   max_wait_ms=0)
    base.update(kw)
    return broker_pb2.FetchRequest(**base)  # type: ignore[arg-type]


async def test_fetch_errors(running: Running) -> None:
    s = running.stub
    await s.Produce(produce("t", make_batch([b"a", b"b"])))
    assert (await status_of(s.Fetch(fetch(topic="nope")))).code == Code.UNKNOWN_TOPIC_OR_PARTITION
    assert (await status_of(s.Fetch(fetch(fetch_offset=3)))).code == Code.OFFSET_OUT_OF_RANGE
    assert (await status_of(s.Fetch(fetch(max_bytes=0)))).code == Code.INVALID_FETCH_SIZE
    assert (await status_of(s.Fetch(fetch(min_bytes=-1)))).code == Code.INVALID_FETCH_SIZE
    assert (await status_of(s.Fetch(fetch(max_wait_ms=-1)))).code == Code.INVALID_REQUEST
    epoch = running.broker.replica_manager.partitions[("t", 0)].leader_epoch
    lead_with(running, "t", epoch + 2, [0], [0])
    assert (await status_of(s.Fetch(fetch(current_leader_epoch=epoch)))).code == Code.FENCED_LEADER_EPOCH
    assert (await status_of(s.Fetch(fetch(current_leader_epoch=epoch + 3)))).code == Code.UNKNOWN_LEADER_EPOCH
    ok = await s.Fetch(fetch(current_leader_epoch=epoch + 2))
    assert ok.high_watermark == 2 and ok.leader_epoch == epoch + 2


async def test_follower_fetch_moves_the_hw_and_fences_older_incarnations(running: Running) -> None:
    lead_with(running, "t", 1, [0, 5], [0, 5])
    s = running.stub
    await s.Produce(produce("t", make_batch([b"a", b"b"])))
    assert (await s.Fetch(fetch())).records == b""  # consumers see nothing above the HW (0)
    await s.Fetch(fetch(replica_id=5, fetch_offset=2, replica_broker_epoch=10, current_leader_epoch=1))
    consumer = await s.Fetch(fetch())
    assert consumer.high_watermark == 2 and consumer.records
    err = await status_of(s.Fetch(fetch(replica_id=5, fetch_offset=2, replica_broker_epoch=9)))
    assert err.code == Code.STALE_BROKER_EPOCH


async def test_list_offsets_and_offset_for_leader_epoch(running: Running) -> None:
    s = running.stub
    await s.Produce(produce("t", make_batch([b"a", b"b"])))
    err = await status_of(s.ListOffsets(broker_pb2.ListOffsetsRequest(topic="t", partition=0, timestamp_ms=-7)))
    assert err.code == Code.INVALID_REQUEST
    assert (await status_of(s.ListOffsets(broker_pb2.ListOffsetsRequest(topic="x", partition=0, timestamp_ms=-1))))\
        .code == Code.UNKNOWN_TOPIC_OR_PARTITION
    epoch = running.broker.replica_manager.partitions[("t", 0)].leader_epoch
    out = await s.OffsetForLeaderEpoch(broker_pb2.OffsetForLeaderEpochRequest(topic="t", partition=0,
                                                                               leader_epoch=epoch))
    assert (out.leader_epoch, out.end_offset) == (epoch, 2)
    err = await status_of(s.OffsetForLeaderEpoch(broker_pb2.OffsetForLeaderEpochRequest(
        topic="t", partition=0, leader_epoch=epoch, current_leader_epoch=epoch + 1)))
    assert err.code == Code.UNKNOWN_LEADER_EPOCH
    assert (await status_of(s.OffsetForLeaderEpoch(broker_pb2.OffsetForLeaderEpochRequest(
        topic="x", partition=0, leader_epoch=0)))).code == Code.UNKNOWN_TOPIC_OR_PARTITION


async def test_find_coordinator_on_a_standalone_broker(running: Running) -> None:
    err = await status_of(running.stub.FindCoordinator(coordinator_pb2.FindCoordinatorRequest(group_id="g")))
    assert err.code == Code.COORDINATOR_NOT_AVAILABLE


async def test_control_service_is_not_served_standalone(running: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await running.control.LeaderAndIsr(broker_pb2.LeaderAndIsrRequest(controller_epoch=1))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_control_request_fence(running: Running) -> None:
    fence = running.broker.replica_manager.control_fence
    fence.check(3, -1, 7)
    for args, code in (((2, -1, 7), Code.STALE_CONTROLLER_EPOCH), ((4, 6, 7), Code.STALE_BROKER_EPOCH)):
        with pytest.raises(errors.GregorError) as info:
            fence.check(*args)
        assert info.value.code == code
    assert fence.controller_epoch == 3  # a request refused for its broker epoch moves nothing


# -- the data port ---------------------------------------------------------------------------------


def _data_port(port: int, payload: bytes) -> tuple[broker_pb2.DataFetchResponseHeader, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        f = sock.makefile("rb")
        (n,) = struct.unpack(">I", f.read(4))
        header = broker_pb2.DataFetchResponseHeader.FromString(f.read(n))
        return header, f.read(header.records_length) if header.records_length else b""


def _frame(req: broker_pb2.FetchRequest) -> bytes:
    body = req.SerializeToString()
    return struct.pack(">I", len(body)) + body


async def test_data_port_answers_with_the_same_errors_as_grpc(running: Running) -> None:
    await running.stub.Produce(produce("t", make_batch([b"a"])))
    port = running.broker.data_port.port  # type: ignore[union-attr]
    header, raw = await asyncio.to_thread(_data_port, port, _frame(fetch()))
    assert header.response.high_watermark == 1 and len(raw) == header.records_length > 0
    for req, code in ((fetch(topic="nope"), Code.UNKNOWN_TOPIC_OR_PARTITION),
                      (fetch(fetch_offset=9), Code.OFFSET_OUT_OF_RANGE),
                      (fetch(max_bytes=0), Code.INVALID_FETCH_SIZE)):
        header, _ = await asyncio.to_thread(_data_port, port, _frame(req))
        assert header.error.code == code and header.records_length == 0
    header, _ = await asyncio.to_thread(_data_port, port, struct.pack(">I", 0))
    assert header.error.code == Code.INVALID_REQUEST
    header, _ = await asyncio.to_thread(_data_port, port, struct.pack(">I", 3) + b"\xff\xff\xff")
    assert header.error.code == Code.INVALID_REQUEST
