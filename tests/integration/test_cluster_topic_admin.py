"""Topic administration in cluster mode, through the controller (seed 001), with real processes.

etcd, a controller and three brokers; every AdminService call goes to a broker,
which forwards it to the active controller (not the standalone broker's
local_admin). Each test reads the outcome where it lands: the keys in etcd, the
partition directories on every broker's disk, every broker's Metadata, and the
leader's answer to produce.

- DeleteTopics: StopReplica(delete) removes the partition directories on every
  broker, the topic's etcd keys go, Metadata forgets it, the name is free again.
- AlterConfigs / DescribeConfigs: the override lands in `config/topics/<t>`,
  DescribeConfigs reports it as an override (not a default), and the leader
  enforces it (max.message.bytes -> MESSAGE_TOO_LARGE); bad keys and values are
  INVALID_CONFIG and change nothing.
- CreatePartitions: added partitions get a leader and the full ISR on every
  broker and take acks=all writes; an equal or smaller count is INVALID_PARTITIONS.
- delete.topic.enable=false: DeleteTopics is TOPIC_DELETION_DISABLED, and a mark
  written straight into `admin/delete_topics/<t>` is dropped by the controller
  while the topic and its records stay.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.common import errors
from gregor.common.etcd import EtcdClient
from gregor.common.rpc import channel
from gregor.controller import metadata_store as store
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch, record_values
from tests.helpers.cluster import running_cluster, with_controller_flags
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

LEASE_TTL_MS = 2000  # controller lease and broker.session.timeout.ms
# Control requests are queued before the admin RPC answers, so brokers converge in well under a second;
# the bound leaves room for a loaded 2-core machine.
CONVERGE_S = 15.0
DEFAULT_MAX_MESSAGE_BYTES = "1048588"  # Kafka's max.message.bytes default


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("topic-admin")), brokers=3, controllers=1,
                         lease_ttl_ms=LEASE_TTL_MS) as c:
        yield c


@pytest.fixture
async def etcd(cluster: LocalCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(cluster.to_json()["etcd"], cluster="gregor") as client:
        yield client


async def admin(p: Process, method: str, request: object) -> object:
    """One AdminService call sent to a broker (which forwards it to the active controller)."""
    async with channel(p.grpc) as ch:
        return await getattr(controller_pb2_grpc.AdminServiceStub(ch), method)(request, timeout=30)


async def create_topic(p: Process, name: str, n: int, rf: int, configs: dict[str, str] | None = None) -> None:
    resp = await admin(p, "CreateTopics", controller_pb2.CreateTopicsRequest(topics=[controller_pb2.CreatableTopic(
        name=name, num_partitions=n, replication_factor=rf, configs=configs or {})]))
    assert resp.results[0].error.code == 0, resp  # type: ignore[attr-defined]


async def admin_error(p: Process, method: str, request: object) -> errors.GregorError:
    """The typed error of an admin call that must fail, whether in the status or in the result entry."""
    try:
        resp = await admin(p, method, request)
    except grpc.aio.AioRpcError as exc:
        return errors.from_rpc_error(exc)
    result = getattr(resp, "result", None) or resp.results[0]  # type: ignore[attr-defined]
    assert result.error.code != 0, f"{method} succeeded: {resp}"
    return errors.from_detail(result.error)


async def converged(brokers: list[Process], topic: str, n: int, rf: int) -> dict[int, tuple[int, int, tuple[int, ...],
                                                                                         tuple[int, ...]]]:
    """Every broker shows the same n partitions, each with a live leader and all rf replicas in sync; else {}."""
    views = [partitions(await metadata(b, topic)) for b in brokers]
    view = views[0]
    if len(view) != n or any(v != view for v in views):
        return {}
    ok = all(leader >= 0 and len(replicas) == rf and sorted(isr) == sorted(replicas)
             for leader, _, replicas, isr in view.values())
    return view if ok else {}


async def wait_converged(brokers: list[Process], topic: str, n: int, rf: int) -> dict[int, tuple[int, int, tuple[
        int, ...], tuple[int, ...]]]:
    view: dict = {}

    async def check() -> bool:
        nonlocal view
        view = await converged(brokers, topic, n, rf)
        return bool(view)

    await until(check, CONVERGE_S, f"{topic}: {n} partitions with a leader and full ISR on every broker")
    return view


async def produce(p: Process, topic: str, partition: int, values: list[bytes]) -> broker_pb2.ProduceResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=partition, records=make_batch(values), acks=-1, timeout_ms=10000), timeout=15)


async def fetch_values(p: Process, topic: str, partition: int) -> list[bytes]:
    async with channel(p.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=partition, fetch_offset=0, max_bytes=1 << 20), timeout=10)
    return record_values(resp.records)


def broker(c: LocalCluster, broker_id: int) -> Process:
    return next(p for p in c.by_role("broker") if p.id == broker_id)


def partition_dirs(b: Process, topic: str) -> list[str]:
    """The directories of the topic's partitions on a broker's disk (any suffix, e.g. a pending -delete)."""
    return sorted(d for d in os.listdir(b.data_dir) if d.startswith(f"{topic}-"))


async def topic_keys(etcd: EtcdClient, topic: str) -> list[str]:
    """Every etcd key that belongs to the topic: assignment, partition states, config, deletion mark."""
    found = [kv.key for kv in (await etcd.get_prefix(store.topic_key(etcd, topic) + b"/")).kvs]
    for key in (store.topic_key(etcd, topic), store.config_key(etcd, topic), store.delete_topic_key(etcd, topic)):
        if await etcd.get(key) is not None:
            found.append(key)
    return sorted(etcd.relative(k) for k in found)


async def test_delete_topic_stops_and_deletes_replicas_everywhere(cluster: LocalCluster, etcd: EtcdClient) -> None:
    brokers = cluster.by_role("broker")
    await create_topic(brokers[0], "doomed", 3, 3, {"retention.ms": "3600000"})
    view = await wait_converged(brokers, "doomed", 3, 3)
    for p, (leader, *_) in view.items():
        assert (await produce(broker(cluster, leader), "doomed", p, [b"a", b"b"])).last_offset == 1
    for b in brokers:
        assert partition_dirs(b, "doomed") == ["doomed-0", "doomed-1", "doomed-2"], b.id
    assert await topic_keys(etcd, "doomed") == [
        "brokers/topics/doomed", *(f"brokers/topics/doomed/partitions/{p}/state" for p in range(3)),
        "config/topics/doomed"]

    resp = await admin(brokers[1], "DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=["doomed"]))
    assert resp.results[0].error.code == 0, resp  # type: ignore[attr-defined]

    async def gone_from_disk() -> bool:
        return all(partition_dirs(b, "doomed") == [] for b in brokers)

    await until(gone_from_disk, CONVERGE_S, "StopReplica(delete) removed the partition directories on every broker")
    assert await topic_keys(etcd, "doomed") == []  # one guarded transaction, deletion mark included

    async def forgotten() -> bool:
        views = [(await metadata(b, "doomed")).topics[0] for b in brokers]
        return all(t.error == errors.Code.UNKNOWN_TOPIC_OR_PARTITION and not t.partitions for t in views)

    await until(forgotten, CONVERGE_S, "every broker's Metadata answers UNKNOWN_TOPIC_OR_PARTITION")
    err = await admin_error(brokers[2], "DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=["doomed"]))
    assert err.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION

    # The name is free again, and the new topic starts empty: nothing of the old log survived.
    await create_topic(brokers[0], "doomed", 1, 3)
    (leader, *_), = (await wait_converged(brokers, "doomed", 1, 3)).values()
    assert (await produce(broker(cluster, leader), "doomed", 0, [b"fresh"])).base_offset == 0
    assert await topic_keys(etcd, "doomed") == [
        "brokers/topics/doomed", "brokers/topics/doomed/partitions/0/state", "config/topics/doomed"]


def entries(resp: object) -> dict[str, tuple[str, bool]]:
    """name -> (value, is_default) of a DescribeConfigs result for one topic."""
    (result,) = resp.results  # type: ignore[attr-defined]
    assert result.error.code == 0, result
    return {e.name: (e.value, e.is_default) for e in result.entries}


async def test_alter_configs_is_stored_described_and_enforced_by_the_leader(cluster: LocalCluster,
                                                                           etcd: EtcdClient) -> None:
    brokers = cluster.by_role("broker")
    await create_topic(brokers[0], "configured", 1, 3)
    (leader_id, *_), = (await wait_converged(brokers, "configured", 1, 3)).values()
    leader = broker(cluster, leader_id)
    big = [b"x" * 4000]  # one batch of ~4 KB
    assert (await produce(leader, "configured", 0, big)).base_offset == 0

    described = entries(await admin(brokers[2], "DescribeConfigs",
                                    controller_pb2.DescribeConfigsRequest(topics=["configured"])))
    assert described["max.message.bytes"] == (DEFAULT_MAX_MESSAGE_BYTES, True)

    resp = await admin(brokers[1], "AlterConfigs", controller_pb2.AlterConfigsRequest(
        topic="configured", set={"max.message.bytes": "1024", "retention.ms": "600000"}))
    assert {e.name: e.value for e in resp.result.entries if not e.is_default} == {  # type: ignore[attr-defined]
        "max.message.bytes": "1024", "retention.ms": "600000"}
    stored = await etcd.get(store.config_key(etcd, "configured"))
    assert stored is not None
    assert store.decode_config(stored.value) == {"max.message.bytes": "1024", "retention.ms": "600000"}
    for b in brokers:  # whichever broker is asked, the controller's view: the override and where it comes from
        described = entries(await admin(b, "DescribeConfigs",
                                        controller_pb2.DescribeConfigsRequest(topics=["configured"])))
        assert described["max.message.bytes"] == ("1024", False)
        assert described["retention.ms"] == ("600000", False)
        assert described["cleanup.policy"] == ("delete", True)

    # The leader hears of it through the re-sent LeaderAndIsr and refuses the same batch now.
    async def refused() -> bool:
        try:
            await produce(leader, "configured", 0, big)
        except grpc.aio.AioRpcError as exc:
            return errors.from_rpc_error(exc).code == errors.Code.MESSAGE_TOO_LARGE
        return False

    await until(refused, CONVERGE_S, "the leader refuses a 4 KB batch with MESSAGE_TOO_LARGE")
    assert (await produce(leader, "configured", 0, [b"small"])).base_offset >= 1

    # Bad input: unknown key, bad value, unknown topic; nothing changes.
    for bad in ({"no.such.config": "1"}, {"max.message.bytes": "lots"}, {"min.insync.replicas": "0"}):
        err = await admin_error(brokers[0], "AlterConfigs",
                                controller_pb2.AlterConfigsRequest(topic="configured", set=bad))
        assert err.code == errors.Code.INVALID_CONFIG, (bad, err)
    err = await admin_error(brokers[0], "AlterConfigs", controller_pb2.AlterConfigsRequest(
        topic="no-such-topic", set={"retention.ms": "1"}))
    assert err.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    stored = await etcd.get(store.config_key(etcd, "configured"))
    assert stored is not None
    assert store.decode_config(stored.value) == {"max.message.bytes": "1024", "retention.ms": "600000"}

    # Deleting the override restores the default on the leader.
    resp = await admin(brokers[2], "AlterConfigs", controller_pb2.AlterConfigsRequest(
        topic="configured", delete=["max.message.bytes"]))
    assert entries(await admin(brokers[0], "DescribeConfigs", controller_pb2.DescribeConfigsRequest(
        topics=["configured"])))["max.message.bytes"] == (DEFAULT_MAX_MESSAGE_BYTES, True)

    async def accepted() -> bool:
        try:
            await produce(leader, "configured", 0, big)
        except grpc.aio.AioRpcError as exc:
            assert errors.from_rpc_error(exc).code == errors.Code.MESSAGE_TOO_LARGE
            return False
        return True

    await until(accepted, CONVERGE_S, "the leader takes the 4 KB batch again")


async def test_create_partitions_adds_led_fully_replicated_partitions(cluster: LocalCluster, etcd: EtcdClient) -> None:
    brokers = cluster.by_role("broker")
    await create_topic(brokers[0], "grown", 2, 3)
    before = await wait_converged(brokers, "grown", 2, 3)

    resp = await admin(brokers[2], "CreatePartitions", controller_pb2.CreatePartitionsRequest(topic="grown", count=5))
    assert resp.result.error.code == 0 and resp.result.num_partitions == 5, resp  # type: ignore[attr-defined]
    view = await wait_converged(brokers, "grown", 5, 3)
    assert {p: view[p] for p in before} == before, "existing partitions keep their leaders and epochs"
    stored = await etcd.get(store.topic_key(etcd, "grown"))
    assert stored is not None and sorted(store.decode_assignment(stored.value)) == [0, 1, 2, 3, 4]
    for p in (2, 3, 4):
        leader, epoch, replicas, isr = view[p]
        assert sorted(replicas) == [0, 1, 2] and leader == replicas[0] and epoch == 0
        resp = await produce(broker(cluster, leader), "grown", p, [b"new-1", b"new-2"])
        assert (resp.base_offset, resp.last_offset) == (0, 1)  # acks=all: the whole ISR has it
        for b in brokers:
            assert os.path.isdir(os.path.join(b.data_dir, f"grown-{p}")), (b.id, p)
    # Added partitions spread their leaders over the brokers like the first ones (seed 003's assignment).
    assert {view[p][0] for p in range(5)} == {0, 1, 2}

    for count in (5, 3):  # equal, then smaller
        err = await admin_error(brokers[0], "CreatePartitions",
                                controller_pb2.CreatePartitionsRequest(topic="grown", count=count))
        assert err.code == errors.Code.INVALID_PARTITIONS, (count, err)
    err = await admin_error(brokers[0], "CreatePartitions",
                            controller_pb2.CreatePartitionsRequest(topic="no-such-topic", count=3))
    assert err.code == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    assert len(partitions(await metadata(brokers[1], "grown"))) == 5


@pytest.fixture
def no_delete_cluster(tmp_path: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """etcd, a controller with --delete-topic-enable false, two brokers."""
    with with_controller_flags(str(tmp_path), 2, {"broker.session.timeout.ms": str(LEASE_TTL_MS)},
                               "--delete-topic-enable", "false") as c:
        yield c


async def test_delete_topic_disabled_refuses_and_ignores_a_deletion_mark(no_delete_cluster: LocalCluster) -> None:
    c = no_delete_cluster
    brokers = c.by_role("broker")
    await create_topic(brokers[0], "kept", 1, 2)
    (leader, *_), = (await wait_converged(brokers, "kept", 1, 2)).values()
    values = [b"one", b"two", b"three"]
    assert (await produce(broker(c, leader), "kept", 0, values)).last_offset == 2

    err = await admin_error(brokers[1], "DeleteTopics", controller_pb2.DeleteTopicsRequest(topics=["kept"]))
    assert err.code == errors.Code.TOPIC_DELETION_DISABLED
    assert "delete.topic.enable" in err.message

    async with EtcdClient(c.to_json()["etcd"], cluster="gregor") as etcd:
        assert await topic_keys(etcd, "kept") == [
            "brokers/topics/kept", "brokers/topics/kept/partitions/0/state", "config/topics/kept"]
        # Behind the API's back: a deletion mark written straight into etcd, as an old tool would.
        await etcd.put(store.delete_topic_key(etcd, "kept"), b"")

        async def mark_dropped() -> bool:
            return await etcd.get(store.delete_topic_key(etcd, "kept")) is None

        # The controller's TopicDeletion event handled the mark (removing it) without deleting anything.
        await until(mark_dropped, CONVERGE_S, "the controller drops the deletion mark")
        assert await topic_keys(etcd, "kept") == [
            "brokers/topics/kept", "brokers/topics/kept/partitions/0/state", "config/topics/kept"]
    with open(c.by_role("controller")[0].log, errors="replace") as f:
        assert "delete.topic.enable is false; ignoring deletion of ['kept']" in f.read()

    view = await converged(brokers, "kept", 1, 2)
    assert view and view[0][0] == leader, "same leader, full ISR on both brokers"
    for b in brokers:
        assert partition_dirs(b, "kept") == ["kept-0"], b.id
    assert await fetch_values(broker(c, leader), "kept", 0) == values
    assert (await produce(broker(c, leader), "kept", 0, [b"four"])).base_offset == 3


def test_an_oversized_create_is_refused_up_front_and_the_cluster_keeps_serving(cluster: LocalCluster) -> None:
    """`topics create z --partitions 100000` once ran the broker out of file descriptors; Kafka 4 refuses
    more than 10,000 new partitions in one operation before placing any replica. So do we: at once, with
    an error naming the limit, nothing created, and the cluster answers the next request."""
    from tests.integration.test_cli import failed, gregor, ok

    boot = cluster.bootstrap
    r = gregor("topics", "create", "huge", "--partitions", "100000", "--replication-factor", "1", bootstrap=boot)
    failed(r, "POLICY_VIOLATION")
    assert "10000" in r.stderr and "CreatePartitions" in r.stderr
    assert "huge" not in ok(gregor("topics", "list", bootstrap=boot)).split()
    ok(gregor("topics", "create", "huge", "--partitions", "2", "--replication-factor", "1", bootstrap=boot))
    r = gregor("topics", "alter", "huge", "--partitions", "10003", bootstrap=boot)
    failed(r, "POLICY_VIOLATION")
    assert "10001 > 10000" in r.stderr
    assert "PartitionCount: 2" in ok(gregor("topics", "describe", "huge", bootstrap=boot)).replace("\t", " ")
