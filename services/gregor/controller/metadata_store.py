"""The cluster metadata in etcd: keys and Kafka's ZooKeeper JSON formats for topics, partition states and configs.

Keys (under /gregor/<cluster>/, shared/DESIGN.md):

- `brokers/topics/<topic>`: `{"version":3,"topic_id":"<22 base64url chars>","partitions":{"0":[1,2,3],...},
  "adding_replicas":{},"removing_replicas":{}}` (Kafka's TopicZNode v3, KIP-516). A key written before topic
  ids (version 2, no `topic_id`) gets one from the next active controller (`topic_id_backfill_ops`)
- `brokers/topics/<topic>/partitions/<p>/state`:
  `{"controller_epoch":E,"leader":L,"version":1,"leader_epoch":N,"isr":[...],"leader_broker_epoch":B}`;
  the key's etcd `version` (1 on create, +1 per put) is ZooKeeper's zkVersion: partition_epoch =
  version - 1. `leader_broker_epoch` (the leader's registration when it was elected) is absent when
  unknown; leaders' ISR writes keep it (they rewrite only `isr`)
- `config/topics/<topic>`: `{"version":1,"config":{"retention.ms":"1000",...}}`
- `admin/delete_topics/<topic>`: empty; the topic is queued for deletion
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gregor.common import uuid
from gregor.common.etcd import Compare, Delete, EtcdClient, KeyValue, Put, mod_revision_is, version_is
from gregor.controller.requests import PartitionStateWrite
from gregor.controller.state import UNKNOWN_BROKER_EPOCH, LeaderAndIsr, TopicPartition

BROKER_TOPICS = "brokers/topics/"
CONFIG_TOPICS = "config/topics/"
DELETE_TOPICS = "admin/delete_topics/"


def topic_key(etcd: EtcdClient, topic: str) -> bytes:
    return etcd.key("brokers", "topics", topic)


def partition_state_key(etcd: EtcdClient, tp: TopicPartition) -> bytes:
    return etcd.key("brokers", "topics", tp.topic, "partitions", tp.partition, "state")


def config_key(etcd: EtcdClient, topic: str) -> bytes:
    return etcd.key("config", "topics", topic)


def delete_topic_key(etcd: EtcdClient, topic: str) -> bytes:
    return etcd.key("admin", "delete_topics", topic)


# -- Kafka's JSON formats -------------------------------------------------------

def encode_assignment(assignment: Mapping[int, Sequence[int]], topic_id: bytes) -> bytes:
    """Kafka's TopicZNode v3: the assignment and the topic id (KIP-516)."""
    partitions = {str(p): list(replicas) for p, replicas in sorted(assignment.items())}
    return json.dumps({"version": 3, "topic_id": uuid.to_string(topic_id), "partitions": partitions,
                       "adding_replicas": {}, "removing_replicas": {}}).encode()


def decode_assignment(value: bytes) -> dict[int, tuple[int, ...]]:
    raw = json.loads(value)
    return {int(p): tuple(int(r) for r in replicas) for p, replicas in raw.get("partitions", {}).items()}


def decode_topic_id(value: bytes) -> bytes:
    """The topic id of a `brokers/topics/<topic>` value; b"" for a key written before topic ids."""
    text = json.loads(value).get("topic_id")
    if not text:
        return b""
    topic_id = uuid.from_string(str(text))
    return topic_id if uuid.is_assigned(topic_id) else b""


def encode_partition_state(lai: LeaderAndIsr) -> bytes:
    """Kafka's state JSON; `leader_broker_epoch` only when known, so an unknown one reads back as before."""
    state = {"controller_epoch": lai.controller_epoch, "leader": lai.leader, "version": 1,
             "leader_epoch": lai.leader_epoch, "isr": list(lai.isr)}
    if lai.leader_broker_epoch != UNKNOWN_BROKER_EPOCH:
        state["leader_broker_epoch"] = lai.leader_broker_epoch
    return json.dumps(state).encode()


def decode_partition_state(kv: KeyValue) -> LeaderAndIsr:
    """A missing `leader_broker_epoch` (a state written before it existed) is unknown."""
    raw = json.loads(kv.value)
    return LeaderAndIsr(leader=int(raw["leader"]), leader_epoch=int(raw["leader_epoch"]),
                        isr=tuple(int(r) for r in raw["isr"]), controller_epoch=int(raw["controller_epoch"]),
                        partition_epoch=kv.version - 1,
                        leader_broker_epoch=int(raw.get("leader_broker_epoch", UNKNOWN_BROKER_EPOCH)))


def encode_config(configs: Mapping[str, str]) -> bytes:
    return json.dumps({"version": 1, "config": {k: str(v) for k, v in sorted(configs.items())}}).encode()


def decode_config(value: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in json.loads(value).get("config", {}).items()}


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


def _parse_topic_keys(etcd: EtcdClient, kvs: Sequence[KeyValue], snap: TopicsSnapshot) -> None:
    for kv in kvs:
        parts = etcd.relative(kv.key)[len(BROKER_TOPICS):].split("/")
        if len(parts) == 1 and parts[0]:
            snap.assignments[parts[0]] = decode_assignment(kv.value)
            snap.topic_revisions[parts[0]] = kv.mod_revision
            topic_id = decode_topic_id(kv.value)
            if topic_id:
                snap.topic_ids[parts[0]] = topic_id
        elif len(parts) == 4 and parts[1] == "partitions" and parts[3] == "state" and parts[2].isdigit():
            snap.states[TopicPartition(parts[0], int(parts[2]))] = decode_partition_state(kv)


async def load_topics(etcd: EtcdClient) -> TopicsSnapshot:
    """Read topics, partition states, configs and pending deletions (controller failover)."""
    snap = TopicsSnapshot()
    topics = await etcd.get_prefix(etcd.key(BROKER_TOPICS))
    snap.revision = topics.revision
    _parse_topic_keys(etcd, topics.kvs, snap)
    # A state whose topic key is gone is a leftover of a half-done deletion: ignore it.
    snap.states = {tp: s for tp, s in snap.states.items() if tp.partition in snap.assignments.get(tp.topic, {})}
    for kv in (await etcd.get_prefix(etcd.key(CONFIG_TOPICS))).kvs:
        snap.configs[etcd.relative(kv.key)[len(CONFIG_TOPICS):]] = decode_config(kv.value)
    for kv in (await etcd.get_prefix(etcd.key(DELETE_TOPICS))).kvs:
        snap.topics_to_delete.add(etcd.relative(kv.key)[len(DELETE_TOPICS):])
    return snap


async def load_assignments(etcd: EtcdClient) -> dict[str, dict[int, tuple[int, ...]]]:
    """Only the `brokers/topics/<topic>` keys (TopicChange)."""
    return (await load_topic_keys(etcd)).assignments


async def load_topic_keys(etcd: EtcdClient) -> TopicsSnapshot:
    """The `brokers/topics/<topic>` keys: assignments, topic ids and revisions (TopicChange)."""
    snap = TopicsSnapshot()
    _parse_topic_keys(etcd, (await etcd.get_prefix(etcd.key(BROKER_TOPICS))).kvs, snap)
    snap.states = {}
    return snap


async def load_partition_states(etcd: EtcdClient) -> dict[TopicPartition, LeaderAndIsr]:
    """Every partition state as etcd holds it now, in one range read (Kafka's getTopicPartitionStatesFromZk)."""
    snap = TopicsSnapshot()
    _parse_topic_keys(etcd, (await etcd.get_prefix(etcd.key(BROKER_TOPICS))).kvs, snap)
    return snap.states


async def load_partition_state(etcd: EtcdClient, tp: TopicPartition) -> LeaderAndIsr | None:
    kv = await etcd.get(partition_state_key(etcd, tp))
    return decode_partition_state(kv) if kv is not None else None


async def load_topics_to_delete(etcd: EtcdClient) -> set[str]:
    kvs = (await etcd.get_prefix(etcd.key(DELETE_TOPICS))).kvs
    return {etcd.relative(kv.key)[len(DELETE_TOPICS):] for kv in kvs}


def is_topic_key(etcd: EtcdClient, key: bytes) -> bool:
    """True for `brokers/topics/<topic>` itself, False for its partition state keys."""
    rest = etcd.relative(key)[len(BROKER_TOPICS):]
    return bool(rest) and "/" not in rest


# -- conditional writes (the caller adds the controller epoch guard) -------------

def partition_state_write(etcd: EtcdClient, write: PartitionStateWrite) -> tuple[list[Compare], list[Put | Delete]]:
    """A create (key absent) or an update (zkVersion still expected + 1) of one partition state."""
    key = partition_state_key(etcd, write.topic_partition)
    expected_version = 0 if write.expected_partition_epoch is None else write.expected_partition_epoch + 1
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
    return [Delete(topic_key(etcd, topic) + b"/", prefix=True), Delete(topic_key(etcd, topic)),
            Delete(config_key(etcd, topic)), Delete(delete_topic_key(etcd, topic))]
