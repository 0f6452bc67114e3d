"""The cluster control plane with real processes: etcd, a controller and three brokers in cluster mode (seed 001).

Topic creation through any broker's AdminService, the same metadata on every broker,
leaders answering produce and followers refusing it, leader failover after a SIGKILL,
a bounced broker coming back with a new epoch, and broker-side fencing of stale
control requests.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, stop_process
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch
from tests.helpers.wait import until

LEASE_TTL_MS = 2000  # controller lease and broker.session.timeout.ms; etcd rounds up to 2 s anyway
FAILOVER_MARGIN_S = 6.0  # lease expiry check (TTL/3 keepalives) + watch + election + LeaderAndIsr + slack
TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("cluster")), brokers=3, controllers=1,
                        lease_ttl_ms=LEASE_TTL_MS)
    try:
        yield c
    finally:
        c.down()
        for p in c.processes:  # a broker restarted by a test is not in cluster.json's original list
            stop_process(p, signal.SIGKILL)



async def metadata(p: Process, topic: str = TOPIC) -> broker_pb2.MetadataResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=[topic]),
                                                                    timeout=5)


def partitions(resp: broker_pb2.MetadataResponse) -> dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    """partition -> (leader, leader epoch, replicas, isr) of the first topic."""
    t = resp.topics[0]
    if t.error:
        return {}
    return {p.partition: (p.leader, p.leader_epoch, tuple(p.replicas), tuple(p.isr)) for p in t.partitions}


async def same_metadata_everywhere(brokers: list[Process]) -> dict[int, tuple[int, int, tuple[int, ...], tuple[int, ...]]]:
    views = [partitions(await metadata(b)) for b in brokers]
    return views[0] if views[0] and all(v == views[0] for v in views) else {}


async def create(target: str, name: str, partitions_: int, rf: int) -> controller_pb2.TopicResult:
    async with channel(target) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=name, num_partitions=partitions_, replication_factor=rf)]),
            timeout=30)
    return resp.results[0]


async def produce(p: Process, partition: int, topic: str = TOPIC) -> broker_pb2.ProduceResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=partition, records=make_batch([b"v1", b"v2"]), acks=1, timeout_ms=5000),
            timeout=10)


def broker(c: LocalCluster, broker_id: int) -> Process:
    return next(p for p in c.by_role("broker") if p.id == broker_id)


async def test_create_topic_rf3_same_metadata_everywhere_and_produce(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    assert [p.role for p in cluster.by_role("controller")] == ["controller"]
    await until(lambda: _describe_has_brokers(brokers[0], 3), 15, "the controller sees 3 brokers")
    result = await create(brokers[1].grpc, TOPIC, 3, 3)  # any broker forwards to the controller
    assert result.error.code == 0, result
    assert (result.num_partitions, result.replication_factor) == (3, 3)

    view: dict = {}

    async def converged() -> bool:
        nonlocal view
        view = await same_metadata_everywhere(brokers)
        return len(view) == 3 and all(leader >= 0 for leader, *_ in view.values())

    await until(converged, 10, "every broker shows the same leaders")
    for leader, epoch, replicas, isr in view.values():
        assert sorted(replicas) == [0, 1, 2] and sorted(isr) == [0, 1, 2]
        assert leader == replicas[0] and epoch == 0  # the preferred replica leads a new partition

    leader, *_ = view[0]
    resp = await produce(broker(cluster, leader), 0)
    assert (resp.base_offset, resp.last_offset) == (0, 1)
    follower = next(b for b in brokers if b.id != leader)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await produce(follower, 0)
    err = errors.from_rpc_error(info.value)
    assert err.code == errors.Code.NOT_LEADER_OR_FOLLOWER and err.leader_id == leader


async def _describe_has_brokers(p: Process, n: int) -> bool:
    async with channel(p.grpc) as ch:
        try:
            resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                controller_pb2.DescribeClusterRequest(), timeout=5)
        except grpc.aio.AioRpcError:
            return False
    return len(resp.brokers) == n and resp.controller_id >= 0


async def test_replication_factor_larger_than_brokers_fails(cluster: LocalCluster) -> None:
    result = await create(cluster.by_role("broker")[0].grpc, "too-wide", 1, 4)
    assert result.error.code == errors.Code.INVALID_REPLICATION_FACTOR
    assert result.error.message == "Replication factor: 4 larger than available brokers: 3."


async def test_stale_control_requests_are_fenced(cluster: LocalCluster) -> None:
    target = cluster.by_role("broker")[0]
    state = broker_pb2.LeaderAndIsrPartitionState(topic=TOPIC, partition=0, controller_epoch=0, leader=target.id,
                                                  leader_epoch=99, isr=[target.id], replicas=[0, 1, 2])
    async with channel(target.grpc) as ch:
        stub = broker_pb2_grpc.BrokerControlServiceStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.LeaderAndIsr(broker_pb2.LeaderAndIsrRequest(
                controller_id=7, controller_epoch=0, broker_epoch=target.extra["broker_epoch"],
                partition_states=[state]), timeout=5)
        assert errors.from_rpc_error(info.value).code == errors.Code.STALE_CONTROLLER_EPOCH
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.UpdateMetadata(broker_pb2.UpdateMetadataRequest(
                controller_id=7, controller_epoch=1 << 20, broker_epoch=target.extra["broker_epoch"] - 1), timeout=5)
        assert errors.from_rpc_error(info.value).code == errors.Code.STALE_BROKER_EPOCH
    # Nothing changed: every broker still agrees on the controller's view.
    assert await same_metadata_everywhere(cluster.by_role("broker"))


async def test_leader_killed_new_leader_from_isr_then_broker_bounces_back(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    before = await same_metadata_everywhere(brokers)
    assert before, "the topic exists on every broker (earlier test)"
    old_leader, old_epoch, replicas, _ = before[0]
    victim = broker(cluster, old_leader)
    survivors = [b for b in brokers if b.id != old_leader]
    stop_process(victim, signal.SIGKILL)

    async def failed_over() -> bool:
        view = await same_metadata_everywhere(survivors)
        return bool(view) and all(leader not in (old_leader, -1) and old_leader not in isr
                                  for leader, _, _, isr in view.values() if old_leader in replicas)

    took = await until(failed_over, LEASE_TTL_MS / 1000 + FAILOVER_MARGIN_S, "a new leader from the ISR")
    view = await same_metadata_everywhere(survivors)
    new_leader, new_epoch, _, isr = view[0]
    assert new_leader in isr and new_epoch == old_epoch + 1, (view, took)
    resp = await produce(broker(cluster, new_leader), 0)
    assert resp.base_offset >= 0

    # The same id comes back: a new registration, hence a new (larger) broker epoch.
    back = start_broker(victim.data_dir.rsplit("/", 1)[0], victim.id, overrides={
        "broker.session.timeout.ms": str(LEASE_TTL_MS)}, etcd_endpoint=cluster.by_role("etcd")[0].grpc)
    cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
    assert back.extra["broker_epoch"] > victim.extra["broker_epoch"]

    async def rejoined() -> bool:
        view = await same_metadata_everywhere([back, *survivors])
        if not view:
            return False
        # LeaderAndIsr made it a follower of partition 0 (it hosts the partition again), or its leader: the
        # controller's first auto leader rebalance (5 s after it became active, as Kafka's) can hand the
        # preferred replica its leadership back at any moment of this test (seen in CI on a loaded machine).
        try:
            await produce(back, 0)
        except grpc.aio.AioRpcError as exc:
            return errors.from_rpc_error(exc).code == errors.Code.NOT_LEADER_OR_FOLLOWER
        return True

    await until(rejoined, 30, "the restarted broker gets UpdateMetadata and LeaderAndIsr")
    async with channel(back.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(controller_pb2.DescribeClusterRequest(),
                                                                              timeout=5)
    epochs = {b.broker_id: b.broker_epoch for b in resp.brokers}
    assert epochs[back.id] == back.extra["broker_epoch"]
