"""The broker's MetadataCache: UpdateMetadata in, Metadata answers out."""

from __future__ import annotations

from gregor.broker.metadata_cache import MetadataCache
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, common_pb2


def _state(partition: int, leader: int, epoch: int = 0) -> broker_pb2.LeaderAndIsrPartitionState:
    return broker_pb2.LeaderAndIsrPartitionState(topic="t", partition=partition, leader=leader, leader_epoch=epoch,
                                                 isr=[1, 2], replicas=[1, 2, 3])


def test_update_metadata_then_answer_metadata() -> None:
    cache = MetadataCache("c")
    live = [common_pb2.BrokerEndpoint(broker_id=b, host="h", grpc_port=b) for b in (1, 2)]
    cache.update_metadata(5, live, [_state(0, 1), _state(1, 3, 2)], [])
    resp = cache.metadata_response([])
    assert resp.controller_id == 5 and [b.broker_id for b in resp.brokers] == [1, 2]
    [topic] = resp.topics
    p0, p1 = topic.partitions
    assert (p0.leader, list(p0.isr), list(p0.offline_replicas), p0.error) == (1, [1, 2], [3], errors.Code.NONE)
    # A leader that is not live is reported as -1 with LEADER_NOT_AVAILABLE.
    assert (p1.leader, p1.leader_epoch, p1.error) == (-1, 2, errors.Code.LEADER_NOT_AVAILABLE)
    assert cache.metadata_response(["nope"]).topics[0].error == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
    cache.update_metadata(5, live, [], ["t"])
    assert not cache.contains("t")


def test_topic_ids_are_answered_and_a_new_id_replaces_the_old_topic() -> None:
    cache = MetadataCache("c")
    live = [common_pb2.BrokerEndpoint(broker_id=b, host="h", grpc_port=b) for b in (1, 2, 3)]
    old, new = b"\x01" * 16, b"\x02" * 16
    states = [_state(0, 1), _state(1, 2)]
    for s in states:
        s.topic_id = old
    cache.update_metadata(5, live, states, [])
    assert cache.metadata_response(["t"]).topics[0].topic_id == old
    # The same name with another id is another topic: the old one's partitions do not linger.
    fresh = _state(0, 3)
    fresh.topic_id = new
    cache.update_metadata(5, live, [fresh], [])
    [topic] = cache.metadata_response(["t"]).topics
    assert topic.topic_id == new and [p.partition for p in topic.partitions] == [0]
    cache.update_metadata(5, live, [], ["t"])
    assert cache.metadata_response(["t"]).topics[0].topic_id == b""


def test_the_answer_built_once_follows_every_change() -> None:
    """Each topic's answer is built once per change (issue 24: 10,000 partitions per Metadata request), and
    any UpdateMetadata that touches the topic or the set of live brokers is seen in the next answer."""
    cache = MetadataCache("c")
    live = [common_pb2.BrokerEndpoint(broker_id=b, host="h", grpc_port=b) for b in (1, 2, 3)]
    cache.update_metadata(5, live, [_state(0, 1), _state(1, 3)], [])
    first = cache.metadata_response(["t"])
    first.topics[0].partitions[0].leader = 99  # a caller editing its answer does not edit the cache
    assert [p.leader for p in cache.metadata_response(["t"]).topics[0].partitions] == [1, 3]
    cache.update_metadata(5, live, [_state(0, 2, 1)], [])  # a leader moved
    assert [p.leader for p in cache.metadata_response(["t"]).topics[0].partitions] == [2, 3]
    cache.update_metadata(5, live[:2], [], [])  # broker 3 died: its partition has no live leader
    p1 = cache.metadata_response(["t"]).topics[0].partitions[1]
    assert (p1.leader, list(p1.offline_replicas)) == (-1, [3])
    cache.update_metadata(5, live[:2], [], ["t"])
    assert cache.metadata_response(["t"]).topics[0].error == errors.Code.UNKNOWN_TOPIC_OR_PARTITION
