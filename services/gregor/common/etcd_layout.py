"""Every etcd key Gregor uses and the codec of every value stored there (Kafka's ZkData).

One section per record kind; nothing else in services/ builds a key or parses a stored value
(tests/unit/common/test_etcd_layout.py scans for it). Keys live under the cluster prefix
`/gregor/<cluster>/` that `EtcdClient.key` adds; the paths below are relative to it:

- `controller`: the active controller (lease-bound), Kafka's /controller JSON
- `controller_epoch`: the controller epoch as a decimal; its mod_revision fences older controllers
- `brokers/ids/<id>`: a broker registration (lease-bound); its create_revision is the broker epoch
- `brokers/topics/<topic>`: a topic's replica assignment
- `brokers/topics/<topic>/partitions/<p>/state`: a partition's leader, epochs and ISR
- `config/topics/<topic>`: a topic's config overrides
- `config/brokers/<id>`, `config/brokers/<default>`: dynamic broker configs, per broker and cluster-wide
  (Kafka's /config/brokers/<id> and /config/brokers/<default>; common/broker_configs.py)
- `config/users/<user>`, `config/clients/<client-id>`, `config/users/<user>/clients/<client-id>`: client
  quota configs (Kafka's ZooKeeper paths; names URL-encoded as Kafka's Sanitizer does, `<default>` literal)
- `admin/delete_topics/<topic>`: empty; the topic is queued for deletion
- `isr_change_notification/isr_change_<ns>_<broker>_<seq>`: ISR changes a leader made
- `log_dir_event_notification/log_dir_event_<ns>_<broker>_<seq>`: a broker's log dir went offline or came back
- `latest_producer_id_block`: the last producer id block handed out
- `coordinators/ids/<id>`: a live coordinator (lease-bound)
- `coordinators/partitions/<p>`, `coordinators/txn-partitions/<p>`: the coordinator serving that
  __consumer_offsets / __transaction_state partition (lease-bound; the value is its id)
- `acls/<ResourceType>/<PatternType>/<name>/<id>`: one ACL binding (Kafka's /kafka-acl)

Versioning rules: every JSON value carries Kafka's `"version"` field, readers accept what older
writers stored (a missing optional field reads as unknown) and ignore fields they do not know.
A partition state's etcd `version` (1 on create, +1 per put) is ZooKeeper's zkVersion:
partition_epoch = version - 1 (`PartitionStateZNode.partition_epoch`), and a writer expecting
partition epoch E compares the key's version against E + 1 (absent key: 0).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import quote, unquote


from gregor.common import uuid
from gregor.common.quotas import DEFAULT, QuotaEntity
from gregor.common.acl import AclBinding


class KeySpace(Protocol):
    """What the layout needs of an etcd client: the cluster prefix (gregor.common.etcd.EtcdClient)."""

    def key(self, *parts: str | int) -> bytes: ...

    def relative(self, key: bytes) -> str: ...


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _object(value: bytes) -> dict[str, Any]:
    """A JSON object value; ValueError for anything else (a clear error, never a crash later)."""
    raw = json.loads(value)
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    return raw


def _prefix(etcd: KeySpace, *parts: str | int) -> bytes:
    return etcd.key(*parts) + b"/"


def _child(etcd: KeySpace, key: bytes, *parts: str) -> str | None:
    """The one path segment below `parts` in key, None when key is not exactly one level below."""
    rel = etcd.relative(key).split("/")
    if len(rel) != len(parts) + 1 or tuple(rel[:len(parts)]) != parts or not rel[-1]:
        return None
    return rel[-1]


# -- controller election -------------------------------------------------------

@dataclass(frozen=True)
class ControllerRegistration:
    """The value of the `controller` key: who is active and since when (ZooKeeper's /controller JSON)."""

    controller_id: int
    timestamp_ms: int
    # host:port of the controller's gRPC server, so brokers can forward AdminService calls.
    endpoint: str = ""

    def encode(self) -> bytes:
        # "brokerid" keeps Kafka's field name for tools that read /controller; "controller_id" is ours.
        return _json({"version": 1, "brokerid": self.controller_id, "controller_id": self.controller_id,
                      "timestamp": str(self.timestamp_ms), "endpoint": self.endpoint})

    @classmethod
    def decode(cls, value: bytes) -> "ControllerRegistration":
        raw = _object(value)
        return cls(int(raw.get("controller_id", raw.get("brokerid", -1))), int(raw.get("timestamp", 0)),
                   str(raw.get("endpoint", "")))


class ControllerZNode:
    """`controller`: lease-bound, created by the election transaction (Kafka's ControllerZNode)."""

    PATH = "controller"

    @staticmethod
    def key(etcd: KeySpace) -> bytes:
        return etcd.key(ControllerZNode.PATH)

    @staticmethod
    def encode(registration: ControllerRegistration) -> bytes:
        return registration.encode()

    @staticmethod
    def decode(value: bytes) -> ControllerRegistration:
        return ControllerRegistration.decode(value)


class ControllerEpochZNode:
    """`controller_epoch`: the epoch as a decimal string (Kafka's ControllerEpochZNode)."""

    PATH = "controller_epoch"

    @staticmethod
    def key(etcd: KeySpace) -> bytes:
        return etcd.key(ControllerEpochZNode.PATH)

    @staticmethod
    def encode(epoch: int) -> bytes:
        return str(epoch).encode()

    @staticmethod
    def decode(value: bytes) -> int:
        return int(value)


# -- broker registrations ------------------------------------------------------

class BrokerIdsZNode:
    """`brokers/ids/<id>`: a broker's registration (Kafka's BrokerIdZNode, JSON version 5).

    The value is the broker's info (host, grpc_port, data_port, rack, ...) plus "version" and
    "timestamp"; the key's create_revision is the broker epoch.
    """

    PATH = "brokers/ids"
    VERSION = 5

    @staticmethod
    def key(etcd: KeySpace, broker_id: int) -> bytes:
        return etcd.key("brokers", "ids", broker_id)

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, "brokers", "ids")

    @staticmethod
    def broker_id(etcd: KeySpace, key: bytes) -> int | None:
        """The id in a `brokers/ids/<id>` key, None for any other key."""
        child = _child(etcd, key, "brokers", "ids")
        return int(child) if child is not None and child.isdigit() else None

    @staticmethod
    def encode(info: Mapping[str, Any], timestamp_ms: int) -> bytes:
        return _json({"version": BrokerIdsZNode.VERSION, **info, "timestamp": str(timestamp_ms)})

    @staticmethod
    def decode(value: bytes) -> dict[str, Any]:
        """The registration's fields; an empty or malformed value reads as no fields (never raises)."""
        try:
            raw = json.loads(value) if value else {}
        except ValueError:
            return {}
        return raw if isinstance(raw, dict) else {}

    @staticmethod
    def grpc_endpoint(info: Mapping[str, Any]) -> str:
        """host:grpc_port of a decoded registration ("" when it names none)."""
        host, port = info.get("host"), info.get("grpc_port")
        return f"{host}:{port}" if host and port else ""


# -- topics --------------------------------------------------------------------

class TopicZNode:
    """`brokers/topics/<topic>`: the replica assignment and the topic id (Kafka's TopicZNode, JSON version 3,
    KIP-516; a key written before topic ids is version 2, without `topic_id`)."""

    PATH = "brokers/topics"

    @staticmethod
    def key(etcd: KeySpace, topic: str) -> bytes:
        return etcd.key("brokers", "topics", topic)

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        """Every topic key and every partition state key lies under it."""
        return _prefix(etcd, "brokers", "topics")

    @staticmethod
    def children_prefix(etcd: KeySpace, topic: str) -> bytes:
        """The topic's partition state keys (not the topic key itself)."""
        return _prefix(etcd, "brokers", "topics", topic)

    @staticmethod
    def topic(etcd: KeySpace, key: bytes) -> str | None:
        """The topic of a `brokers/topics/<topic>` key, None for partition state and other keys."""
        return _child(etcd, key, "brokers", "topics")

    @staticmethod
    def encode(assignment: Mapping[int, Sequence[int]], topic_id: bytes = b"") -> bytes:
        """Version 3 with the topic id; without one (only to write what a pre-id release wrote) version 2."""
        partitions = {str(p): list(replicas) for p, replicas in sorted(assignment.items())}
        if not topic_id:
            return _json({"version": 2, "partitions": partitions, "adding_replicas": {}, "removing_replicas": {}})
        return _json({"version": 3, "topic_id": uuid.to_string(topic_id), "partitions": partitions,
                      "adding_replicas": {}, "removing_replicas": {}})

    @staticmethod
    def topic_id(value: bytes) -> bytes:
        """The topic id of a topic value; b"" for a key written before topic ids."""
        text = _object(value).get("topic_id")
        if not text:
            return b""
        topic_id = uuid.from_string(str(text))
        return topic_id if uuid.is_assigned(topic_id) else b""

    @staticmethod
    def decode(value: bytes) -> dict[int, tuple[int, ...]]:
        raw = _object(value)
        return {int(p): tuple(int(r) for r in replicas) for p, replicas in raw.get("partitions", {}).items()}

    @staticmethod
    def partition_count(value: bytes) -> int:
        return len(TopicZNode.decode(value))


# Kafka's sentinels in these records: LeaderAndIsr.NoLeader (a partition state's "leader") and
# AbstractControlRequest.UNKNOWN_BROKER_EPOCH (no registration known). Every role takes them from here.
NO_LEADER = -1
UNKNOWN_BROKER_EPOCH = -1


@dataclass(frozen=True)
class PartitionState:
    """A decoded `.../partitions/<p>/state`; partition_epoch comes from the key's etcd version."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    partition_epoch: int = 0
    leader_broker_epoch: int = UNKNOWN_BROKER_EPOCH

    def with_isr(self, isr: Iterable[int]) -> "PartitionState":
        """The same state with another ISR (a leader's AlterIsr keeps everything else)."""
        return replace(self, isr=tuple(isr))


class PartitionStateZNode:
    """`brokers/topics/<topic>/partitions/<p>/state` (Kafka's TopicPartitionStateZNode, JSON version 1).

    `{"controller_epoch":E,"leader":L,"version":1,"leader_epoch":N,"isr":[...],"leader_broker_epoch":B}`;
    `leader_broker_epoch` is written only when known and reads back as UNKNOWN_BROKER_EPOCH when absent.
    """

    @staticmethod
    def key(etcd: KeySpace, topic: str, partition: int) -> bytes:
        return etcd.key("brokers", "topics", topic, "partitions", partition, "state")

    @staticmethod
    def topic_partition(etcd: KeySpace, key: bytes) -> tuple[str, int] | None:
        """(topic, partition) of a partition state key, None for any other key."""
        rel = etcd.relative(key).split("/")
        if (len(rel) == 6 and rel[:2] == ["brokers", "topics"] and rel[2] and rel[3] == "partitions"
                and rel[4].isdigit() and rel[5] == "state"):
            return rel[2], int(rel[4])
        return None

    @staticmethod
    def encode(state: PartitionState) -> bytes:
        raw: dict[str, Any] = {"controller_epoch": state.controller_epoch, "leader": state.leader, "version": 1,
                               "leader_epoch": state.leader_epoch, "isr": list(state.isr)}
        if state.leader_broker_epoch != UNKNOWN_BROKER_EPOCH:
            raw["leader_broker_epoch"] = state.leader_broker_epoch
        return _json(raw)

    @staticmethod
    def decode(value: bytes, etcd_version: int) -> PartitionState:
        """The stored state; etcd_version is the key's KeyValue.version (the zkVersion)."""
        raw = _object(value)
        return PartitionState(leader=int(raw["leader"]), leader_epoch=int(raw["leader_epoch"]),
                              isr=tuple(int(r) for r in raw["isr"]), controller_epoch=int(raw["controller_epoch"]),
                              partition_epoch=PartitionStateZNode.partition_epoch(etcd_version),
                              leader_broker_epoch=int(raw.get("leader_broker_epoch", UNKNOWN_BROKER_EPOCH)))

    @staticmethod
    def partition_epoch(etcd_version: int) -> int:
        """The partition epoch of a state whose key has this etcd version (zkVersion = version - 1)."""
        return etcd_version - 1

    @staticmethod
    def expected_version(partition_epoch: int | None) -> int:
        """The etcd version a writer compares against when it expects partition_epoch (None: key absent)."""
        return 0 if partition_epoch is None else partition_epoch + 1


class TopicConfigZNode:
    """`config/topics/<topic>`: the topic's config overrides (Kafka's ConfigEntityZNode, JSON version 1)."""

    @staticmethod
    def key(etcd: KeySpace, topic: str) -> bytes:
        return etcd.key("config", "topics", topic)

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, "config", "topics")

    @staticmethod
    def topic(etcd: KeySpace, key: bytes) -> str | None:
        return _child(etcd, key, "config", "topics")

    @staticmethod
    def encode(configs: Mapping[str, str]) -> bytes:
        return _json({"version": 1, "config": {k: str(v) for k, v in sorted(configs.items())}})

    @staticmethod
    def decode(value: bytes) -> dict[str, str]:
        return {str(k): str(v) for k, v in _object(value).get("config", {}).items()}


class BrokerConfigZNode:
    """`config/brokers/<id>` and `config/brokers/<default>`: a broker's (or every broker's default) dynamic configs
    (Kafka's ConfigEntityZNode for brokers, JSON version 1, the same codec as a topic's). Written by the
    controller (AdminService.AlterBrokerConfigs), watched by every broker."""

    @staticmethod
    def key(etcd: KeySpace, entity: str) -> bytes:
        return etcd.key("config", "brokers", entity)

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, "config", "brokers")

    @staticmethod
    def entity(etcd: KeySpace, key: bytes) -> str | None:
        """The broker id (as text) or `<default>` of a key, None for any other key."""
        return _child(etcd, key, "config", "brokers")

    @staticmethod
    def encode(configs: Mapping[str, str]) -> bytes:
        return TopicConfigZNode.encode(configs)

    @staticmethod
    def decode(value: bytes) -> dict[str, str]:
        return TopicConfigZNode.decode(value)


class QuotaConfigZNode:
    """`config/users/<user>[/clients/<client-id>]` and `config/clients/<client-id>`: an entity's client
    quota configs (Kafka's ConfigEntityZNode for users and clients, JSON version 1, the same codec as a
    topic's). User and client names are URL-encoded (Kafka's Sanitizer), so a name with `/` stays one
    path segment; `<default>` is stored as is."""

    @staticmethod
    def _segment(name: str) -> str:
        return name if name == DEFAULT else quote(name, safe="")

    @staticmethod
    def _name(segment: str) -> str:
        return segment if segment == DEFAULT else unquote(segment)

    @staticmethod
    def key(etcd: KeySpace, entity: QuotaEntity) -> bytes:
        seg = QuotaConfigZNode._segment
        if entity.user is not None and entity.client_id is not None:
            return etcd.key("config", "users", seg(entity.user), "clients", seg(entity.client_id))
        if entity.user is not None:
            return etcd.key("config", "users", seg(entity.user))
        assert entity.client_id is not None  # QuotaEntity refuses an empty entity
        return etcd.key("config", "clients", seg(entity.client_id))

    @staticmethod
    def watch_prefix(etcd: KeySpace) -> bytes:
        """`config/`: one watch covers users and clients (topic config keys parse as no entity)."""
        return _prefix(etcd, "config")

    @staticmethod
    def entity(etcd: KeySpace, key: bytes) -> QuotaEntity | None:
        """The entity of a quota key, None for any other key."""
        rel = etcd.relative(key).split("/")
        name = QuotaConfigZNode._name
        if len(rel) == 3 and rel[0] == "config" and rel[2]:
            if rel[1] == "users":
                return QuotaEntity(name(rel[2]), None)
            if rel[1] == "clients":
                return QuotaEntity(None, name(rel[2]))
        if len(rel) == 5 and rel[:2] == ["config", "users"] and rel[2] and rel[3] == "clients" and rel[4]:
            return QuotaEntity(name(rel[2]), name(rel[4]))
        return None

    @staticmethod
    def encode(configs: Mapping[str, float]) -> bytes:
        return _json({"version": 1, "config": {k: _number(v) for k, v in sorted(configs.items())}})

    @staticmethod
    def decode(value: bytes) -> dict[str, str]:
        return {str(k): str(v) for k, v in _object(value).get("config", {}).items()}


def _number(value: float) -> str:
    """A config value as Kafka writes it: an integral number without a fraction."""
    return str(int(value)) if float(value).is_integer() else str(value)


class DeleteTopicsZNode:
    """`admin/delete_topics/<topic>`: empty; the topic is queued for deletion (Kafka's DeleteTopicsTopicZNode)."""

    VALUE = b""

    @staticmethod
    def key(etcd: KeySpace, topic: str) -> bytes:
        return etcd.key("admin", "delete_topics", topic)

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, "admin", "delete_topics")

    @staticmethod
    def topic(etcd: KeySpace, key: bytes) -> str | None:
        return _child(etcd, key, "admin", "delete_topics")


# -- ISR change notifications --------------------------------------------------

class IsrChangeNotificationZNode:
    """`isr_change_notification/isr_change_<ns>_<broker>_<seq>` (Kafka's IsrChangeNotificationSequenceZNode).

    etcd has no sequential nodes: the time in ns, the broker id and a per-broker counter keep the
    names unique and in order. Value: `{"version":1,"partitions":[{"topic":T,"partition":P},...]}`.
    """

    PATH = "isr_change_notification"

    @staticmethod
    def key(etcd: KeySpace, time_ns: int, broker_id: int, seq: int) -> bytes:
        return etcd.key(IsrChangeNotificationZNode.PATH, f"isr_change_{time_ns:020d}_{broker_id}_{seq}")

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, IsrChangeNotificationZNode.PATH)

    @staticmethod
    def encode(partitions: Iterable[tuple[str, int]]) -> bytes:
        return _json({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in partitions]})

    @staticmethod
    def decode(value: bytes) -> list[tuple[str, int]]:
        """The changed partitions; ValueError (or KeyError/TypeError) for a malformed value."""
        return [(str(e["topic"]), int(e["partition"])) for e in _object(value).get("partitions", [])]


# -- log dir event notifications -----------------------------------------------

# Kafka's LogDirEventNotificationHandler.LogDirFailureEvent; LOG_DIR_ONLINE_EVENT is Gregor's (a dir comes back
# without a restart, docs/architecture.md "A full log dir"). The controller handles both the same way.
LOG_DIR_FAILURE_EVENT = 1
LOG_DIR_ONLINE_EVENT = 2


class LogDirEventNotificationZNode:
    """`log_dir_event_notification/log_dir_event_<ns>_<broker>_<seq>` (Kafka's LogDirEventNotificationSequenceZNode).

    Written by a broker whose log dir went offline (or came back); the controller deletes it and asks the
    broker, with LeaderAndIsr, which of its replicas are offline. etcd has no sequential nodes: the time in ns,
    the broker id and a per-broker counter keep the names unique and in order (as for ISR changes).
    Value: Kafka's `{"version":1,"broker":B,"event":E}`.
    """

    PATH = "log_dir_event_notification"

    @staticmethod
    def key(etcd: KeySpace, time_ns: int, broker_id: int, seq: int) -> bytes:
        return etcd.key(LogDirEventNotificationZNode.PATH, f"log_dir_event_{time_ns:020d}_{broker_id}_{seq}")

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, LogDirEventNotificationZNode.PATH)

    @staticmethod
    def encode(broker_id: int, event: int) -> bytes:
        return _json({"version": 1, "broker": broker_id, "event": event})

    @staticmethod
    def decode(value: bytes) -> tuple[int, int]:
        """(broker id, event); ValueError (or KeyError/TypeError) for a malformed value."""
        raw = _object(value)
        return int(raw["broker"]), int(raw.get("event", LOG_DIR_FAILURE_EVENT))


# -- producer ids --------------------------------------------------------------

@dataclass(frozen=True)
class ProducerIdBlock:
    broker_id: int
    block_start: int
    block_end: int  # inclusive


class ProducerIdBlockZNode:
    """`latest_producer_id_block`: the last block handed out (Kafka's ProducerIdBlockZNode, version 1)."""

    PATH = "latest_producer_id_block"

    @staticmethod
    def key(etcd: KeySpace) -> bytes:
        return etcd.key(ProducerIdBlockZNode.PATH)

    @staticmethod
    def encode(block: ProducerIdBlock) -> bytes:
        return _json({"version": 1, "broker": block.broker_id, "block_start": block.block_start,
                      "block_end": block.block_end})

    @staticmethod
    def decode(value: bytes) -> ProducerIdBlock:
        raw = _object(value)
        return ProducerIdBlock(int(raw["broker"]), int(raw["block_start"]), int(raw["block_end"]))


# -- group and transaction coordinators ----------------------------------------

@dataclass(frozen=True)
class CoordinatorKey:
    """A parsed `coordinators/<kind>/<n>` key: kind is IDS, OFFSETS_CLAIMS or TXN_CLAIMS."""

    kind: str
    n: int


class CoordinatorsZNode:
    """`coordinators/...`: live coordinators and their partition claims (lease-bound; ours, not Kafka's).

    `coordinators/ids/<id>` = `{"coordinator_id":I,"host":H,"port":P}`;
    `coordinators/partitions/<p>` and `coordinators/txn-partitions/<p>` = the owner's id as a decimal.
    """

    IDS = "ids"
    OFFSETS_CLAIMS = "partitions"
    TXN_CLAIMS = "txn-partitions"

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        """Every coordinator key (ids and both kinds of claims)."""
        return _prefix(etcd, "coordinators")

    @staticmethod
    def id_key(etcd: KeySpace, coordinator_id: int) -> bytes:
        return etcd.key("coordinators", CoordinatorsZNode.IDS, coordinator_id)

    @staticmethod
    def claim_key(etcd: KeySpace, kind: str, partition: int) -> bytes:
        if kind not in (CoordinatorsZNode.OFFSETS_CLAIMS, CoordinatorsZNode.TXN_CLAIMS):
            raise ValueError(f"unknown coordinator claim kind {kind!r}")
        return etcd.key("coordinators", kind, partition)

    @staticmethod
    def parse(etcd: KeySpace, key: bytes) -> CoordinatorKey | None:
        """The kind and number of a coordinator key, None for any other key."""
        rel = etcd.relative(key).split("/")
        if len(rel) != 3 or rel[0] != "coordinators" or not rel[2].isdigit():
            return None
        if rel[1] not in (CoordinatorsZNode.IDS, CoordinatorsZNode.OFFSETS_CLAIMS, CoordinatorsZNode.TXN_CLAIMS):
            return None
        return CoordinatorKey(rel[1], int(rel[2]))

    @staticmethod
    def encode_info(coordinator_id: int, host: str, port: int) -> bytes:
        return _json({"coordinator_id": coordinator_id, "host": host, "port": port})

    @staticmethod
    def decode_info(value: bytes) -> dict[str, Any]:
        return _object(value)

    @staticmethod
    def encode_claim(coordinator_id: int) -> bytes:
        return str(coordinator_id).encode()

    @staticmethod
    def decode_claim(value: bytes) -> int:
        return int(value)


# -- ACLs (issue 23) -----------------------------------------------------------

class AclZNode:
    """`acls/<ResourceType>/<PatternType>/<name>/<id>`: one ACL binding per key (Kafka's /kafka-acl and
    /kafka-acl-extended/prefixed, one key per binding instead of one JSON list per resource so that adding
    and removing are idempotent puts and deletes that never race).

    `<name>` is the resource name percent-encoded (group and transactional ids may hold '/'); `<id>` is a
    digest of the binding, so adding the same ACL twice writes the same key. The value is the binding as
    JSON (`AclBinding.to_json`, plus Kafka's `"version":1`). Every service watches `acls/`.
    """

    VERSION = 1

    @staticmethod
    def prefix(etcd: KeySpace) -> bytes:
        return _prefix(etcd, "acls")

    @staticmethod
    def key(etcd: KeySpace, acl: AclBinding) -> bytes:
        digest = hashlib.sha256(acl.to_json().encode()).hexdigest()[:32]
        return etcd.key("acls", acl.resource_type.value, acl.pattern_type.value,
                        quote(acl.resource_name, safe=""), digest)

    @staticmethod
    def encode(acl: AclBinding) -> bytes:
        return _json({"version": AclZNode.VERSION, **json.loads(acl.to_json())})

    @staticmethod
    def decode(value: bytes) -> AclBinding:
        """The stored binding; ValueError (or KeyError) for a malformed value."""
        raw = _object(value)
        raw.pop("version", None)
        return AclBinding.from_json(json.dumps(raw)).validate()
