"""The cluster metadata in etcd as the controller reads and writes it: topics, partition states, configs.

Keys and value formats are gregor.common.etcd_layout's (TopicZNode, PartitionStateZNode,
TopicConfigZNode, DeleteTopicsZNode); this module converts between them and the controller's
LeaderAndIsr, loads snapshots, and builds the conditional writes. A topic key carries the topic id
(KIP-516, TopicZNode v3); a key written before ids (v2) gets one from the next active controller
(`topic_id_backfill_ops`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gregor.common.etcd import Compare, Delete, EtcdClient, KeyValue, Put, mod_revision_is, version_is
from gregor.common.etcd_layout import (DeleteTopicsZNode, PartitionState, PartitionStateZNode, TopicConfigZNode,
                                       TopicZNode)
from gregor.controller.requests import PartitionStateWrite
from gregor.controller.state import LeaderAndIsr, TopicPartition


def topic_key(etcd: EtcdClient, topic: str) -> bytes:
    return TopicZNode.key(etcd, topic)


def partition_state_key(etcd: EtcdClient, tp: TopicPartition) -> bytes:
    return PartitionStateZNode.key(etcd, tp.topic, tp.partition)


def config_key(etcd: EtcdClient, topic: str) -> bytes:
    return TopicConfigZNode.key(etcd, topic)


def delete_topic_key(etcd: EtcdClient, topic: str) -> bytes:
    return DeleteTopicsZNode.key(etcd, topic)


# -- values (codecs in etcd_layout) ------------------------------------------------

encode_assignment = TopicZNode.encode
decode_assignment = TopicZNode.decode
decode_topic_id = TopicZNode.topic_id
encode_config = TopicConfigZNode.encode
decode_config = TopicConfigZNode.decode


def encode_partition_state(lai: LeaderAndIsr) -> bytes:
    return PartitionStateZNode.encode(PartitionState(lai.leader, lai.leader_epoch, tuple(lai.isr),
                                                     lai.controller_epoch, lai.partition_epoch,
                                                     lai.leader_broker_epoch))


def decode_partition_state(kv: KeyValue) -> LeaderAndIsr:
    s = PartitionStateZNode.decode(kv.value, kv.version)
    return LeaderAndIsr(leader=s.leader, leader_epoch=s.leader_epoch, isr=s.isr, controller_epoch=s.controller_epoch,
                        partition_epoch=s.partition_epoch, leader_broker_epoch=s.leader_broker_epoch)


# -- loads ---------------------------------------------------------------------

@dataclass
class TopicsSnapshot:
    """Every topic's assignment, partition states, configs and deletion marks, read at `revision`."""

    revision: int = 0
    assignments: dict[str, dict[int, tuple[int, ...]]] = field(default_factory=dict)
    # Topic ids (KIP-516); a topic written before ids is absent here until backfilled.
    topic_ids: dict[str, bytes] = field(default_factory=dict)
    # mod_revision of each `brokers/topics/<topic>` key (the backfill's compare).
    topic_revisions: dict[str, int] = field(default_factory=dict)
    states: dict[TopicPartition, LeaderAndIsr] = field(default_factory=dict)
    configs: dict[str, dict[str, str]] = field(default_factory=dict)
    topics_to_delete: set[str] = field(default_factory=set)


def _parse_topic_keys(etcd: EtcdClient, kvs: Sequence[KeyValue], snap: TopicsSnapshot, states: bool = True) -> None:
    """Topic keys into snap; partition state keys too unless `states` is False (their JSON is then not
    parsed: the topic prefix holds every partition's state, 10,000 of them behind one TopicChange)."""
    for kv in kvs:
        if not states and kv.key.endswith(b"/state"):
            continue  # a partition state key (a topic key has no '/' after the prefix)
        topic = TopicZNode.topic(etcd, kv.key)
        if topic is not None:
            snap.assignments[topic] = decode_assignment(kv.value)
            snap.topic_revisions[topic] = kv.mod_revision
            topic_id = decode_topic_id(kv.value)
            if topic_id:
                snap.topic_ids[topic] = topic_id
        elif states and (tp := PartitionStateZNode.topic_partition(etcd, kv.key)) is not None:
            snap.states[TopicPartition(*tp)] = decode_partition_state(kv)


async def load_topics(etcd: EtcdClient) -> TopicsSnapshot:
    """Read topics, partition states, configs and pending deletions (controller failover)."""
    snap = TopicsSnapshot()
    topics = await etcd.get_prefix(TopicZNode.prefix(etcd))
    snap.revision = topics.revision
    _parse_topic_keys(etcd, topics.kvs, snap)
    # A state whose topic key is gone is a leftover of a half-done deletion: ignore it.
    snap.states = {tp: s for tp, s in snap.states.items() if tp.partition in snap.assignments.get(tp.topic, {})}
    for kv in (await etcd.get_prefix(TopicConfigZNode.prefix(etcd))).kvs:
        if (topic := TopicConfigZNode.topic(etcd, kv.key)) is not None:
            snap.configs[topic] = decode_config(kv.value)
    snap.topics_to_delete = _topics_to_delete(etcd, (await etcd.get_prefix(DeleteTopicsZNode.prefix(etcd))).kvs)
    return snap


async def load_assignments(etcd: EtcdClient) -> dict[str, dict[int, tuple[int, ...]]]:
    """Only the `brokers/topics/<topic>` keys (TopicChange)."""
    return (await load_topic_keys(etcd)).assignments


async def load_topic_keys(etcd: EtcdClient) -> TopicsSnapshot:
    """The `brokers/topics/<topic>` keys: assignments, topic ids and revisions (TopicChange)."""
    snap = TopicsSnapshot()
    _parse_topic_keys(etcd, (await etcd.get_prefix(TopicZNode.prefix(etcd))).kvs, snap, states=False)
    return snap


async def load_partition_states(etcd: EtcdClient) -> dict[TopicPartition, LeaderAndIsr]:
    """Every partition state as etcd holds it now, in one range read (Kafka's getTopicPartitionStatesFromZk)."""
    snap = TopicsSnapshot()
    _parse_topic_keys(etcd, (await etcd.get_prefix(TopicZNode.prefix(etcd))).kvs, snap)
    return snap.states


async def load_partition_state(etcd: EtcdClient, tp: TopicPartition) -> LeaderAndIsr | None:
    kv = await etcd.get(partition_state_key(etcd, tp))
    return decode_partition_state(kv) if kv is not None else None


def _topics_to_delete(etcd: EtcdClient, kvs: Sequence[KeyValue]) -> set[str]:
    return {topic for kv in kvs if (topic := DeleteTopicsZNode.topic(etcd, kv.key)) is not None}


async def load_topics_to_delete(etcd: EtcdClient) -> set[str]:
    return _topics_to_delete(etcd, (await etcd.get_prefix(DeleteTopicsZNode.prefix(etcd))).kvs)


def is_topic_key(etcd: EtcdClient, key: bytes) -> bool:
    """True for `brokers/topics/<topic>` itself, False for its partition state keys."""
    return TopicZNode.topic(etcd, key) is not None


# -- conditional writes (the caller adds the controller epoch guard) -------------

def partition_state_write(etcd: EtcdClient, write: PartitionStateWrite) -> tuple[list[Compare], list[Put | Delete]]:
    """A create (key absent) or an update (zkVersion still expected + 1) of one partition state."""
    key = partition_state_key(etcd, write.topic_partition)
    expected_version = PartitionStateZNode.expected_version(write.expected_partition_epoch)
    return [version_is(key, expected_version)], [Put(key, encode_partition_state(write.new_state))]


def create_topic_ops(etcd: EtcdClient, topic: str, assignment: Mapping[int, Sequence[int]],
                     configs: Mapping[str, str], topic_id: bytes) -> tuple[list[Compare], list[Put | Delete]]:
    """Create `brokers/topics/<topic>` (with its new topic id) and `config/topics/<topic>` together,
    only if the topic is new."""
    key = topic_key(etcd, topic)
    return ([version_is(key, 0), version_is(delete_topic_key(etcd, topic), 0)],
            [Put(config_key(etcd, topic), encode_config(configs)), Put(key, encode_assignment(assignment, topic_id))])


def topic_id_backfill_ops(etcd: EtcdClient, topic: str, assignment: Mapping[int, Sequence[int]],
                          topic_id: bytes, mod_revision: int) -> tuple[list[Compare], list[Put | Delete]]:
    """Give a topic written before topic ids its id (Kafka's controller does so on upgrade), only if
    its key is still the one read (a concurrent change wins; the next load retries)."""
    key = topic_key(etcd, topic)
    return [mod_revision_is(key, mod_revision)], [Put(key, encode_assignment(assignment, topic_id))]


def delete_topic_ops(etcd: EtcdClient, topic: str) -> list[Put | Delete]:
    """Remove every key of a deleted topic, the deletion mark last."""
    return [Delete(TopicZNode.children_prefix(etcd, topic), prefix=True), Delete(topic_key(etcd, topic)),
            Delete(config_key(etcd, topic)), Delete(delete_topic_key(etcd, topic))]
