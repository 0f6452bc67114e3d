"""Topic ids (KIP-516) with real processes: etcd, two controllers, three brokers.

- Every topic gets a random id at creation, the same in etcd (`brokers/topics/<t>`), in every broker's
  Metadata, in the admin client and `gregor topics describe`, and in every replica's partition.metadata;
  ids stay the same across a controller failover and a broker restart. A topic written without an id
  (as before topic ids) gets one from the next active controller, and its replicas adopt it.
- A topic deleted and re-created under its name has a new id. A consumer positioned on the old topic
  gets UNKNOWN_TOPIC_ID from poll() instead of the new topic's records at its old offsets.
- A broker that was down while a topic was deleted keeps the old log on disk; when the topic is
  re-created it does not serve or extend that log as the new topic's: the directory is renamed
  `-stray` and the replica copies the new topic from its leader.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.client import AdminClient, Consumer, Producer
from gregor.common import errors, uuid
from gregor.common.etcd import EtcdClient
from gregor.common.rpc import channel
from gregor.broker.log_manager import PARTITION_METADATA, read_partition_metadata
from gregor.controller import elector
from gregor.controller import metadata_store as store
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.cluster import replica_values, restart_broker, running_cluster, stop_process
from tests.helpers.wait import until

LEASE_TTL_MS = 2000
CONVERGE_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("topic-ids")), brokers=3, controllers=2, coordinators=1,
                         lease_ttl_ms=LEASE_TTL_MS,
                         coordinator_overrides={"group.initial.rebalance.delay.ms": "0",
                                                "offsets.topic.num.partitions": "3"}) as c:
        yield c


@pytest.fixture
async def etcd(cluster: LocalCluster) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(cluster.to_json()["etcd"], cluster="gregor") as client:
        yield client


def brokers(cluster: LocalCluster) -> list[Process]:
    return [b for b in cluster.by_role("broker") if b.alive()]


async def metadata_ids(b: Process, topics: list[str]) -> dict[str, bytes]:
    async with channel(b.grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=topics),
                                                                    timeout=10)
    return {t.name: t.topic_id for t in resp.topics if t.error == 0}


async def stored_id(etcd: EtcdClient, topic: str) -> bytes:
    kv = await etcd.get(store.topic_key(etcd, topic))
    assert kv is not None, f"no key for {topic}"
    return store.decode_topic_id(kv.value)


def disk_ids(b: Process, topic: str) -> dict[int, bytes]:
    """partition -> topic id of every replica directory of topic on broker b."""
    out = {}
    for path in glob.glob(os.path.join(b.data_dir, f"{topic}-*")):
        suffix = path.rsplit("-", 1)[1]
        if suffix.isdigit() and os.path.exists(os.path.join(path, PARTITION_METADATA)):
            out[int(suffix)] = read_partition_metadata(path)
    return out


async def create(boot: str, name: str, partitions: int, rf: int) -> None:
    async with AdminClient({"bootstrap.servers": boot}) as admin:
        await admin.create_topic(name, partitions, rf)


async def delete(boot: str, name: str) -> None:
    async with AdminClient({"bootstrap.servers": boot}) as admin:
        await admin.delete_topic(name)


async def described_ids(boot: str, names: list[str]) -> dict[str, bytes]:
    """The admin client's ids, once every named topic is in the metadata (UpdateMetadata is asynchronous)."""
    async def known() -> dict[str, bytes] | None:
        async with AdminClient({"bootstrap.servers": boot}) as admin:
            try:
                return {n: i.topic_id for n, i in (await admin.describe_topics(names)).items()}
            except errors.UnknownTopicOrPartitionError:  # type: ignore[attr-defined]
                return None
    out: dict[str, bytes] = {}

    async def found() -> bool:
        got = await known()
        if got is not None:
            out.update(got)
        return got is not None
    await until(found, CONVERGE_S, f"{names} in the metadata")
    return out


async def produce(boot: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    async with Producer({"bootstrap.servers": boot, "acks": "all"}) as p:
        handles = [await p.send(topic, v, partition=partition) for v in values]
        for h in handles:
            await h


async def converged(cluster: LocalCluster, topic: str, topic_id: bytes, partitions: int, rf: int) -> bool:
    """Every live broker's Metadata has the id, and the replicas' partition.metadata files say it."""
    live = brokers(cluster)
    for b in live:
        if (await metadata_ids(b, [topic])).get(topic) != topic_id:
            return False
    on_disk = [i for b in live for i in disk_ids(b, topic).values()]
    return len(on_disk) == partitions * min(rf, len(live)) and set(on_disk) == {topic_id}


async def test_ids_are_random_stored_everywhere_and_stable_across_failover_and_restart(
        cluster: LocalCluster, etcd: EtcdClient) -> None:
    boot = cluster.bootstrap
    await create(boot, "ids-a", 2, 3)
    await create(boot, "ids-b", 1, 2)
    ids = await described_ids(boot, ["ids-a", "ids-b"])
    assert len(set(ids.values())) == 2
    for topic, topic_id in ids.items():
        assert uuid.is_assigned(topic_id) and topic_id not in uuid.RESERVED
        assert len(uuid.to_string(topic_id)) == 22 and not uuid.to_string(topic_id).startswith("-")
        assert await stored_id(etcd, topic) == topic_id
    await until(lambda: converged(cluster, "ids-a", ids["ids-a"], 2, 3), CONVERGE_S, "ids-a everywhere")
    await until(lambda: converged(cluster, "ids-b", ids["ids-b"], 1, 2), CONVERGE_S, "ids-b everywhere")

    # A topic written as before topic ids (TopicZNode v2, no id; as an old controller left it).
    legacy_assignment = {0: [b.id for b in brokers(cluster)][:2]}
    await etcd.put(store.config_key(etcd, "ids-legacy"), store.encode_config({}))
    await etcd.put(store.topic_key(etcd, "ids-legacy"), json.dumps(
        {"version": 2, "partitions": {"0": legacy_assignment[0]}, "adding_replicas": {},
         "removing_replicas": {}}).encode())
    await until(lambda: _led(cluster, "ids-legacy"), CONVERGE_S, "the legacy topic is led")
    assert await stored_id(etcd, "ids-legacy") == b""
    assert all(not disk_ids(b, "ids-legacy") for b in brokers(cluster))  # no id yet: no partition.metadata

    # Controller failover: the new controller keeps every id and backfills the legacy topic's.
    active_id = await elector.read_controller_id(etcd)
    active = next(c for c in cluster.by_role("controller") if c.id == active_id)
    stop_process(active, signal.SIGKILL)

    async def other_active() -> bool:
        return await elector.read_controller_id(etcd) not in (active_id, elector.NO_CONTROLLER)
    await until(other_active, LEASE_TTL_MS / 1000 + 15, "the standby controller took over")
    await until(lambda: _has_id(etcd, "ids-legacy"), CONVERGE_S, "the new controller gave the legacy topic an id")
    legacy_id = await stored_id(etcd, "ids-legacy")
    assert uuid.is_assigned(legacy_id) and legacy_id not in ids.values()
    assert await stored_id(etcd, "ids-a") == ids["ids-a"] and await stored_id(etcd, "ids-b") == ids["ids-b"]
    # The replicas of the legacy topic adopt the id (their logs are kept, not quarantined).
    await until(lambda: converged(cluster, "ids-legacy", legacy_id, 1, 2), CONVERGE_S, "legacy id adopted")
    for b in brokers(cluster):
        assert not glob.glob(os.path.join(b.data_dir, "ids-legacy-0.*-stray"))

    # Broker restart: same ids in its Metadata and on its disk.
    victim = brokers(cluster)[0]
    before = {t: disk_ids(victim, t) for t in ("ids-a", "ids-b")}
    stop_process(victim, signal.SIGTERM)
    back = restart_broker(cluster, victim)
    await until(lambda: converged(cluster, "ids-a", ids["ids-a"], 2, 3), CONVERGE_S, "ids-a after restart")
    assert (await metadata_ids(back, ["ids-a", "ids-b"])) == ids
    assert {t: disk_ids(back, t) for t in ("ids-a", "ids-b")} == before
    assert await described_ids(boot, ["ids-a", "ids-b", "ids-legacy"]) == {**ids, "ids-legacy": legacy_id}


async def _has_id(etcd: EtcdClient, topic: str) -> bool:
    return bool(await stored_id(etcd, topic))


async def _led(cluster: LocalCluster, topic: str) -> bool:
    async with channel(brokers(cluster)[0].grpc) as ch:
        resp = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=[topic]),
                                                                    timeout=10)
    return bool(resp.topics) and resp.topics[0].error == 0 and all(p.leader >= 0 for p in resp.topics[0].partitions)


async def test_a_consumer_of_a_deleted_and_recreated_topic_gets_unknown_topic_id(cluster: LocalCluster) -> None:
    boot = cluster.bootstrap
    await create(boot, "ids-recreated", 1, 3)
    await produce(boot, "ids-recreated", [f"old-{i}".encode() for i in range(5)])
    old_id = (await described_ids(boot, ["ids-recreated"]))["ids-recreated"]
    async with Consumer({"bootstrap.servers": boot, "fetch.max.wait.ms": 100}) as c:
        c.assign([("ids-recreated", 0)])
        c.seek(("ids-recreated", 0), 0)
        got: list[bytes | None] = []
        while len(got) < 5:
            got += [r.value for r in await c.poll(timeout_ms=1000)]
        assert got == [f"old-{i}".encode() for i in range(5)]

        await delete(boot, "ids-recreated")
        await until(lambda: _gone(cluster, "ids-recreated"), CONVERGE_S, "the topic is gone everywhere")
        await create(boot, "ids-recreated", 1, 3)
        new_id = (await described_ids(boot, ["ids-recreated"]))["ids-recreated"]
        assert uuid.is_assigned(new_id) and new_id != old_id
        # The new topic has more records than the consumer's position: without ids it would read
        # new-5.. as if they followed old-4.
        await produce(boot, "ids-recreated", [f"new-{i}".encode() for i in range(10)])

        with pytest.raises(errors.UnknownTopicIdError) as info:  # type: ignore[attr-defined]
            for _ in range(60):
                leaked = await c.poll(timeout_ms=500)
                assert not leaked, f"read the re-created topic's records as the old one's: {leaked}"
        assert info.value.code == errors.Code.UNKNOWN_TOPIC_ID
        assert uuid.to_string(old_id) in str(info.value) and uuid.to_string(new_id) in str(info.value)
        # A seek starts over, on the new topic.
        c.seek(("ids-recreated", 0), 0)
        fresh: list[bytes | None] = []
        while len(fresh) < 10:
            fresh += [r.value for r in await c.poll(timeout_ms=1000)]
        assert fresh == [f"new-{i}".encode() for i in range(10)]


async def _gone(cluster: LocalCluster, topic: str) -> bool:
    for b in brokers(cluster):
        if topic in await metadata_ids(b, [topic]):
            return False
    return True


async def test_a_broker_that_missed_the_delete_quarantines_the_old_log(cluster: LocalCluster) -> None:
    boot = cluster.bootstrap
    topic = "ids-missed"
    await create(boot, topic, 1, 3)
    old_values = [f"old-{i}".encode() for i in range(20)]
    await produce(boot, topic, old_values)
    old_id = (await described_ids(boot, [topic]))[topic]
    await until(lambda: converged(cluster, topic, old_id, 1, 3), CONVERGE_S, "old topic on every broker")
    live = brokers(cluster)
    victim = next(b for b in live if b.id == max(x.id for x in live))
    await until(lambda: replica_values(victim, topic, 0) == old_values, CONVERGE_S, "the victim has the old log")

    # The victim is down while the topic is deleted: its StopReplica(delete) never arrives.
    stop_process(victim, signal.SIGTERM)
    await delete(boot, topic)
    await until(lambda: _gone(cluster, topic), CONVERGE_S, "the topic is gone from the live brokers")
    back = restart_broker(cluster, victim)
    assert replica_values(back, topic, 0) == old_values  # still on its disk, under the name
    await until(lambda: len(brokers(cluster)) == 3 and _registered(cluster), CONVERGE_S, "the victim is back")

    # Re-created under the same name: a new topic whose replicas include the victim.
    await create(boot, topic, 1, 3)
    new_id = (await described_ids(boot, [topic]))[topic]
    assert new_id != old_id
    new_values = [f"new-{i}".encode() for i in range(7)]
    await produce(boot, topic, new_values)
    await until(lambda: converged(cluster, topic, new_id, 1, 3), CONVERGE_S, "the new topic on every broker")
    await until(lambda: replica_values(back, topic, 0) == new_values, CONVERGE_S,
                "the victim's replica holds exactly the new topic's records")
    # The old log is kept aside, untouched, under a -stray name carrying its topic id.
    stray = glob.glob(os.path.join(back.data_dir, f"{topic}-0.{old_id.hex()}-stray"))
    assert len(stray) == 1, os.listdir(back.data_dir)
    assert read_partition_metadata(stray[0]) == old_id
    # Consumers read the new topic from the victim's partners and the victim alike: only new records.
    async with Consumer({"bootstrap.servers": boot, "fetch.max.wait.ms": 100}) as c:
        c.assign([(topic, 0)])
        c.seek((topic, 0), 0)
        got: list[bytes | None] = []
        while len(got) < len(new_values):
            got += [r.value for r in await c.poll(timeout_ms=1000)]
        assert got == new_values


async def _registered(cluster: LocalCluster) -> bool:
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        return len((await admin.describe_cluster()).brokers) == 3


async def test_a_groups_offsets_go_with_a_deleted_topic(cluster: LocalCluster) -> None:
    """Kafka deletes a deleted topic's committed offsets from every group: a member that later gets the
    re-created topic's partition starts at auto.offset.reset, never at the old topic's committed offset."""
    boot = cluster.bootstrap
    topic, tp = "ids-group", ("ids-group", 0)
    await create(boot, topic, 1, 3)
    await produce(boot, topic, [f"old-{i}".encode() for i in range(5)])
    cfg = {"bootstrap.servers": boot, "group.id": "ids-group-g", "auto.offset.reset": "earliest",
           "enable.auto.commit": False, "fetch.max.wait.ms": 100}
    async with Consumer(cfg) as c:
        c.subscribe([topic])
        got: list[bytes | None] = []
        for _ in range(60):
            got += [r.value for r in await c.poll(timeout_ms=500)]
            if len(got) >= 5:
                break
        assert got == [f"old-{i}".encode() for i in range(5)]
        await c.commit_sync()
        assert (await c.committed([tp]))[tp] == 5
    await delete(boot, topic)
    await until(lambda: _gone(cluster, topic), CONVERGE_S, "the topic is gone everywhere")
    async with Consumer(cfg) as c:
        async def offsets_gone() -> bool:
            return (await c.committed([tp]))[tp] is None
        await until(offsets_gone, CONVERGE_S, "the group's offsets of the deleted topic are gone")
    await create(boot, topic, 1, 3)
    await produce(boot, topic, [f"new-{i}".encode() for i in range(8)])
    async with Consumer(cfg) as c:
        c.subscribe([topic])
        fresh: list[bytes | None] = []
        for _ in range(60):
            fresh += [r.value for r in await c.poll(timeout_ms=500)]
            if len(fresh) >= 8:
                break
        assert fresh == [f"new-{i}".encode() for i in range(8)], "read from the old topic's committed offset"
