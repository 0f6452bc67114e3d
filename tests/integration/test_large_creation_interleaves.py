"""A large topic creation does not hold the controller's event queue (issue 24).

etcd, one controller started with `--new-partitions-per-event 50`, three brokers. A
CreateTopics of 1,500 partitions is sent; once its topic key is in etcd (the creation
is under way), a small CreateTopics and a DescribeConfigs are sent. Both are answered,
and the controller's own record of processed events (DescribeControllerEvents) shows
them processed before the large creation's last NewPartitionCreation batch: they did
not wait behind it. On a controller that creates every partition in one event they
would run only after it (and there would be no batches at all).

The large creation answers with the full assignment it was written with, and every
broker converges on 1,500 partitions with leaders. It answers once its topic key is
written and its first batch is online, as Kafka answers CreateTopics once the topic
is in the metadata: a 1,000-partition creation (twenty events) is answered while
partitions are still to be created, and the controller answers a DescribeConfigs
in the meantime (before, the answer waited for the last batch, and a 10,000-partition
creation outlived the brokers' 30 s forward timeout).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.common.etcd import EtcdClient
from gregor.common.rpc import channel
from gregor.controller import metadata_store as store
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import running_cluster, with_controller_flags
from tests.helpers.wait import until
from tests.integration.test_cluster_topic_admin import admin, wait_converged

LARGE = 1_500  # partitions of the large creation, RF 1 (few files per broker); thirty events: with the states
# written 100 to an etcd transaction, 400 (eight events) were all created before a small request arrived
ANSWERED = 1_000  # partitions of the creation answered before its last batch (twenty events)
PER_EVENT = 50  # --new-partitions-per-event: the large creation takes thirty events
FAILOVER_PER_EVENT = 10  # smaller batches for the failover test: forty events, time to kill the controller


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with with_controller_flags(str(tmp_path_factory.mktemp("large-creation")), 3,
                               {"broker.session.timeout.ms": "2000"},
                               "--new-partitions-per-event", str(PER_EVENT)) as c:
        yield c


@pytest.fixture
async def etcd(cluster: LocalCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(cluster.to_json()["etcd"], cluster="gregor") as client:
        yield client


def controller(c: LocalCluster) -> Process:
    return c.by_role("controller")[0]


async def create(p: Process, name: str, n: int) -> controller_pb2.CreateTopicsResponse:
    """CreateTopics straight to the controller's AdminService (no broker forwarding in between)."""
    async with channel(p.grpc) as ch:
        return await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=name, num_partitions=n, replication_factor=1)]), timeout=120)


async def processed_events(p: Process) -> list[str]:
    """Names of the controller's processed events, oldest first."""
    async with channel(p.grpc) as ch:
        resp = await controller_pb2_grpc.ControllerServiceStub(ch).DescribeControllerEvents(
            controller_pb2.DescribeControllerEventsRequest(), timeout=10)
    return [e.name for e in reversed(resp.processed)]


async def test_small_requests_are_answered_between_the_batches_of_a_large_creation(
        cluster: LocalCluster, etcd: EtcdClient) -> None:
    c = cluster
    ctl = controller(c)
    brokers = c.by_role("broker")

    async def three_brokers() -> bool:
        async with channel(ctl.grpc) as ch:
            resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                controller_pb2.DescribeClusterRequest(), timeout=5)
        return resp.controller_id == ctl.id and len(resp.brokers) == 3

    await until(three_brokers, 30, "controller active with three brokers")

    large = asyncio.create_task(create(ctl, "large", LARGE))
    await until(lambda: etcd.get(store.topic_key(etcd, "large")), 60, "the large topic's key written")

    small = await create(ctl, "small", 1)
    assert small.results[0].error.code == 0, small
    async with channel(ctl.grpc) as ch:
        configs = await controller_pb2_grpc.AdminServiceStub(ch).DescribeConfigs(
            controller_pb2.DescribeConfigsRequest(topics=["small"]), timeout=30)
    assert configs.results[0].error.code == 0, configs

    resp = await large
    assert resp.results[0].error.code == 0, resp
    assert resp.results[0].num_partitions == LARGE

    # 1,500 partitions at 50 per event: the first 50 inline, the other 1,450 in 29 more events (the answer
    # came after the first).
    events: list[str] = []

    async def all_batches() -> bool:
        nonlocal events
        events = await processed_events(ctl)
        return events.count("NewPartitionCreation") >= LARGE // PER_EVENT - 1

    await until(all_batches, 60, "the large creation's 29 NewPartitionCreation events processed")
    batches = [i for i, name in enumerate(events) if name == "NewPartitionCreation"]
    assert len(batches) == LARGE // PER_EVENT - 1, events
    small_at = max(i for i, name in enumerate(events) if name == "CreateTopics" and i > events.index("CreateTopics"))
    describe_at = events.index("DescribeConfigs")
    assert small_at < batches[-1] and describe_at < batches[-1], events

    # Every partition was created once, under the one topic id, and every broker sees it led.
    assignment = store.decode_assignment((await etcd.get(store.topic_key(etcd, "large"))).value)  # type: ignore[union-attr]
    assert sorted(assignment) == list(range(LARGE))
    view = await wait_converged(brokers, "large", LARGE, 1)
    assert sorted(view) == list(range(LARGE))


async def test_create_partitions_during_a_creation_keeps_the_partitions_still_to_come(
        cluster: LocalCluster, etcd: EtcdClient) -> None:
    """A CreatePartitions answered between the batches grows the whole topic, not the part created so far."""
    ctl = controller(cluster)
    large = asyncio.create_task(create(ctl, "growing", LARGE))
    await until(lambda: etcd.get(store.topic_key(etcd, "growing")), 60, "the topic's key written")
    grown = await admin(ctl, "CreatePartitions", controller_pb2.CreatePartitionsRequest(
        topic="growing", count=LARGE + 10))
    assert grown.result.error.code == 0, grown  # type: ignore[attr-defined]
    assert (await large).results[0].error.code == 0
    assignment = store.decode_assignment((await etcd.get(store.topic_key(etcd, "growing"))).value)  # type: ignore[union-attr]
    assert sorted(assignment) == list(range(LARGE + 10))
    view = await wait_converged(cluster.by_role("broker"), "growing", LARGE + 10, 1)
    assert len(view) == LARGE + 10


async def test_a_large_creation_is_answered_before_its_last_batch(cluster: LocalCluster, etcd: EtcdClient) -> None:
    ctl = controller(cluster)
    resp = await create(ctl, "answered", ANSWERED)
    # What etcd holds when the answer is in: the whole assignment, not yet every partition's state.
    states = (await etcd.get_prefix(store.topic_key(etcd, "answered") + b"/")).kvs
    assert resp.results[0].error.code == 0 and resp.results[0].num_partitions == ANSWERED, resp
    assignment = store.decode_assignment((await etcd.get(store.topic_key(etcd, "answered"))).value)  # type: ignore[union-attr]
    assert sorted(assignment) == list(range(ANSWERED))
    assert PER_EVENT <= len(states) < ANSWERED, f"answered after {len(states)} of {ANSWERED} partitions were created"
    # The controller answers other admin requests while the creation goes on.
    async with channel(ctl.grpc) as ch:
        configs = await controller_pb2_grpc.AdminServiceStub(ch).DescribeConfigs(
            controller_pb2.DescribeConfigsRequest(topics=["answered"]), timeout=30)
    assert configs.results[0].error.code == 0, configs
    view = await wait_converged(cluster.by_role("broker"), "answered", ANSWERED, 1)
    assert sorted(view) == list(range(ANSWERED))


@pytest.fixture(scope="module")
def two_controllers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("large-creation-failover")), brokers=3, controllers=2,
                         lease_ttl_ms=2000, controller_overrides={"new.partitions.per.event": str(FAILOVER_PER_EVENT)}) as c:
        yield c


async def test_a_controller_killed_mid_creation_leaves_the_rest_to_the_next_one(two_controllers: LocalCluster) -> None:
    """The topic key holds every partition from the start, so the standby creates what the dead one had not."""
    c = two_controllers
    async with EtcdClient(c.to_json()["etcd"], cluster="gregor") as etcd:
        async def active() -> Process | None:
            async with channel(c.by_role("controller")[0].grpc) as ch:
                resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                    controller_pb2.DescribeClusterRequest(), timeout=5)
            if len(resp.brokers) != 3:
                return None
            return next((p for p in c.by_role("controller") if p.id == resp.controller_id), None)

        await until(active, 30, "an active controller with three brokers")
        victim = await active()
        assert victim is not None
        large = asyncio.create_task(create(victim, "orphan", LARGE))
        await until(lambda: etcd.get(store.topic_key(etcd, "orphan")), 60, "the topic's key written")
        os.kill(victim.pid, signal.SIGKILL)
        # The kill came mid-creation: not every partition had its state written yet.
        states = (await etcd.get_prefix(store.topic_key(etcd, "orphan") + b"/")).kvs
        assert len(states) < LARGE, "the creation finished before the kill: nothing left for the standby"
        try:
            await large
        except Exception:
            pass  # the dead controller's answer is lost with it; the topic is not
        view = await wait_converged(c.by_role("broker"), "orphan", LARGE, 1)
        assert sorted(view) == list(range(LARGE))
