"""The controller's etcd formats, topic deletion, assignment checks and control-request protos (no processes)."""

from __future__ import annotations

import pytest

from gregor.common import errors
from gregor.common.etcd import EtcdClient, KeyValue
from gregor.controller import metadata_store as store
from gregor.controller.channel_manager import ControllerChannelManager
from gregor.controller.requests import ControllerActions, PartitionStateWrite, StopReplicaRequest
from gregor.controller.state import (UNKNOWN_BROKER_EPOCH, ControllerContext, LeaderAndIsr, PartitionState,
                                     TopicPartition)
from gregor.controller.topic_admin import check_assignment
from gregor.controller.topics import on_new_partition_creation, on_topic_deletion
from gregor.rpc.v1 import common_pb2
from prometheus_client import CollectorRegistry

ETCD = EtcdClient("http://127.0.0.1:1", cluster="c")  # never connects: only key building is used
TP = TopicPartition("t", 0)


def test_kafka_json_formats_round_trip() -> None:
    topic_id = bytes(range(16))
    raw = store.encode_assignment({1: [2, 3], 0: [1, 2]}, topic_id)
    # Kafka's TopicZNode v3 (KIP-516): the topic id in base64url without padding.
    assert raw == (b'{"version": 3, "topic_id": "AAECAwQFBgcICQoLDA0ODw", "partitions": {"0": [1, 2], '
                   b'"1": [2, 3]}, "adding_replicas": {}, "removing_replicas": {}}')
    assert store.decode_assignment(raw) == {0: (1, 2), 1: (2, 3)}
    assert store.decode_topic_id(raw) == topic_id
    # A key written before topic ids (version 2) has none: the controller assigns one on load.
    legacy = b'{"version": 2, "partitions": {"0": [1, 2]}, "adding_replicas": {}, "removing_replicas": {}}'
    assert store.decode_assignment(legacy) == {0: (1, 2)}
    assert store.decode_topic_id(legacy) == b""
    lai = LeaderAndIsr(2, leader_epoch=4, isr=(2, 3), controller_epoch=7)
    kv = KeyValue(store.partition_state_key(ETCD, TP), store.encode_partition_state(lai), version=3)
    # The key's etcd version plays ZooKeeper's zkVersion: partition_epoch = version - 1.
    assert store.decode_partition_state(kv) == LeaderAndIsr(2, 4, (2, 3), 7, partition_epoch=2)
    assert store.decode_config(store.encode_config({"retention.ms": "5"})) == {"retention.ms": "5"}
    assert ETCD.relative(store.partition_state_key(ETCD, TP)) == "brokers/topics/t/partitions/0/state"
    assert store.is_topic_key(ETCD, store.topic_key(ETCD, "t"))
    assert not store.is_topic_key(ETCD, store.partition_state_key(ETCD, TP))


def test_leader_broker_epoch_is_stored_when_known_and_missing_means_unknown() -> None:
    key = store.partition_state_key(ETCD, TP)
    known = LeaderAndIsr(2, 4, (2, 3), 7, leader_broker_epoch=41)
    assert b'"leader_broker_epoch": 41' in store.encode_partition_state(known)
    assert store.decode_partition_state(KeyValue(key, store.encode_partition_state(known), version=1)) == known
    # Unknown is not written: the JSON stays what states written before the field look like.
    assert b"leader_broker_epoch" not in store.encode_partition_state(known.with_leader_broker_epoch(-1))
    legacy = b'{"controller_epoch": 7, "leader": 2, "version": 1, "leader_epoch": 4, "isr": [2, 3]}'
    assert store.decode_partition_state(KeyValue(key, legacy, version=1)).leader_broker_epoch == UNKNOWN_BROKER_EPOCH


def test_partition_state_writes_compare_the_version() -> None:
    create = PartitionStateWrite(TP, None, LeaderAndIsr(1))
    update = PartitionStateWrite(TP, 2, LeaderAndIsr(1, partition_epoch=3))
    assert store.partition_state_write(ETCD, create)[0][0].expected == 0
    assert store.partition_state_write(ETCD, update)[0][0].expected == 3


def test_topic_deletion_stops_and_deletes_every_replica_and_forgets_the_topic() -> None:
    ctx = ControllerContext(live_broker_epochs={1: 11, 2: 12}, epoch=3)
    ctx.all_topics.add("t")
    ctx.topic_configs["t"] = {"retention.ms": "1"}
    ctx.update_partition_replica_assignment(TP, (1, 2))
    on_new_partition_creation(ctx, [TP], ControllerActions())
    actions = ControllerActions()
    assert on_topic_deletion(ctx, ["t", "unknown"], actions) == {"t"}
    assert not actions.writes  # the driver deletes the keys instead
    requests = actions.batch.build(ctx, controller_id=9)
    for broker_id in (1, 2):
        stops = [r for r in requests[broker_id] if isinstance(r, StopReplicaRequest)]
        assert stops and stops[0].partitions == ((TP, True),)
    assert "t" not in ctx.all_topics and "t" not in ctx.topic_configs
    assert ctx.partition_state(TP) is PartitionState.NON_EXISTENT and not ctx.replica_states


@pytest.mark.parametrize("assignment, message", [
    ({1: [1]}, "consecutive"),
    ({0: [1, 2], 1: [1]}, "same number"),
    ({0: [1, 1]}, "Duplicate"),
    ({0: [1, 9]}, "Unknown broker"),
])
def test_explicit_assignments_are_checked(assignment: dict[int, list[int]], message: str) -> None:
    with pytest.raises(errors.GregorError, match=message) as info:
        check_assignment("t", assignment, {1, 2, 3})
    assert info.value.code == errors.Code.INVALID_REPLICA_ASSIGNMENT


async def test_channel_manager_builds_protos_per_broker_and_drops_unknown_brokers() -> None:
    manager = ControllerChannelManager(controller_id=9, registry=CollectorRegistry())
    manager.add_broker(common_pb2.BrokerEndpoint(broker_id=1, host="127.0.0.1", grpc_port=1, broker_epoch=11))
    try:
        stop = StopReplicaRequest(9, 3, 11, ((TP, False), (TopicPartition("t", 1), True)))
        protos = manager._to_proto(stop, {}, [])
        assert [(api, m.delete_partitions, len(m.partitions)) for api, m in protos] == [
            ("StopReplica", False, 1), ("StopReplica", True, 1)]
        manager.send({1: [stop], 2: [stop]}, {})
        assert manager.queue_size(1) in (1, 2) and manager.queue_size(2) == 0  # the sender may have taken one
    finally:
        manager.shutdown()
    assert manager.broker_ids == set()


async def test_a_failover_batch_builds_each_partition_state_proto_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failover sends every partition to every broker in UpdateMetadata and to each replica in LeaderAndIsr:
    the same states again and again. Each distinct state is built once per send (at 10,000 partitions on 3
    brokers: 10,000 protos instead of 60,000 on the event task), and every request still gets its own copy."""
    from gregor.controller import channel_manager
    from gregor.controller.channel_manager import RequestSender
    from gregor.controller.requests import ControlRequestBatch

    ctx = ControllerContext()
    ctx.epoch = 4
    ctx.add_live_brokers({1: 11, 2: 12, 3: 13})
    parts = [TopicPartition("t", p) for p in range(2)]
    for tp in parts:
        ctx.update_partition_replica_assignment(tp, [1, 2, 3])
        ctx.put_partition_leadership_info(tp, LeaderAndIsr(1 + tp.partition, 5, (1, 2, 3), 3, 2))
    batch = ControlRequestBatch()
    batch.add_update_metadata({1, 2, 3}, parts)
    for tp in parts:
        batch.add_leader_and_isr(ctx, [1, 2, 3], tp, ctx.partition_leadership_info[tp])
    built: list[TopicPartition] = []
    real = channel_manager.partition_state_pb

    def counting(info, topic_ids=None):  # type: ignore[no-untyped-def]
        built.append(info.topic_partition)
        return real(info, topic_ids)

    sent: dict[int, list[tuple[str, object]]] = {}
    monkeypatch.setattr(channel_manager, "partition_state_pb", counting)
    monkeypatch.setattr(RequestSender, "enqueue",
                        lambda self, api, message: sent.setdefault(self.broker_id, []).append((api, message)))
    manager = ControllerChannelManager(controller_id=9, registry=CollectorRegistry())
    for b in (1, 2, 3):
        manager.add_broker(common_pb2.BrokerEndpoint(broker_id=b, host="127.0.0.1", grpc_port=1, broker_epoch=10 + b))
    try:
        manager.send(batch.build(ctx, 9), {}, (), {"t": bytes(range(16))})
    finally:
        manager.shutdown()
    assert sorted(built) == parts  # two protos built for twelve partition states sent
    assert {b: [api for api, _ in reqs] for b, reqs in sent.items()} == {
        b: ["LeaderAndIsr", "UpdateMetadata"] for b in (1, 2, 3)}
    states = [[(s.topic, s.partition, s.leader, s.leader_epoch, list(s.isr), list(s.replicas), s.topic_id)
               for s in m.partition_states] for reqs in sent.values() for _, m in reqs]  # type: ignore[attr-defined]
    assert all(s == states[0] for s in states)
    assert states[0] == [("t", 0, 1, 5, [1, 2, 3], [1, 2, 3], bytes(range(16))),
                         ("t", 1, 2, 5, [1, 2, 3], [1, 2, 3], bytes(range(16)))]
    sent[1][1][1].partition_states[0].leader = 99  # type: ignore[attr-defined]
    assert sent[2][1][1].partition_states[0].leader == 1  # type: ignore[attr-defined]
