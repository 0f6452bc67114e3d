"""gregor.common.etcd_layout: one round trip per record kind, the exact bytes stored today still
decode (existing clusters stay readable), and no other module of services/ builds an etcd key."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from gregor.common.etcd import EtcdClient
from gregor.common.etcd_layout import (UNKNOWN_BROKER_EPOCH, BrokerIdsZNode, ControllerEpochZNode,
                                       ControllerRegistration, ControllerZNode, CoordinatorKey, CoordinatorsZNode,
                                       DeleteTopicsZNode, IsrChangeNotificationZNode, PartitionState,
                                       PartitionStateZNode, ProducerIdBlock, ProducerIdBlockZNode, TopicConfigZNode,
                                       TopicZNode, AclZNode, LOG_DIR_FAILURE_EVENT, LOG_DIR_ONLINE_EVENT,
                                       LogDirEventNotificationZNode)

ETCD = EtcdClient("http://127.0.0.1:2379", cluster="c")  # no connection: only its key prefix is used
SERVICES = pathlib.Path(__file__).resolve().parents[3] / "services" / "gregor"


def test_controller() -> None:
    assert ControllerZNode.key(ETCD) == b"/gregor/c/controller"
    reg = ControllerRegistration(3, 1700000000000, "h:9")
    assert ControllerZNode.decode(ControllerZNode.encode(reg)) == reg
    stored = b'{"version": 1, "brokerid": 3, "controller_id": 3, "timestamp": "1700000000000", "endpoint": "h:9"}'
    assert ControllerZNode.encode(reg) == stored
    # Kafka's own /controller JSON (no controller_id, no endpoint) reads too.
    assert ControllerZNode.decode(b'{"version":1,"brokerid":5,"timestamp":"7"}') == ControllerRegistration(5, 7, "")


def test_controller_epoch() -> None:
    assert ControllerEpochZNode.key(ETCD) == b"/gregor/c/controller_epoch"
    assert ControllerEpochZNode.encode(12) == b"12"
    assert ControllerEpochZNode.decode(ControllerEpochZNode.encode(12)) == 12


def test_broker_registration() -> None:
    key = BrokerIdsZNode.key(ETCD, 7)
    assert key == b"/gregor/c/brokers/ids/7" and key.startswith(BrokerIdsZNode.prefix(ETCD))
    assert BrokerIdsZNode.broker_id(ETCD, key) == 7
    assert BrokerIdsZNode.broker_id(ETCD, b"/gregor/c/brokers/ids/x") is None
    assert BrokerIdsZNode.broker_id(ETCD, b"/gregor/c/brokers/topics/t") is None
    info = {"host": "h", "grpc_port": 9092, "data_port": 9093, "rack": "r1"}
    value = BrokerIdsZNode.encode(info, 1700000000000)
    assert value == (b'{"version": 5, "host": "h", "grpc_port": 9092, "data_port": 9093, "rack": "r1", '
                     b'"timestamp": "1700000000000"}')
    decoded = BrokerIdsZNode.decode(value)
    assert {k: decoded[k] for k in info} == info and decoded["version"] == 5
    assert BrokerIdsZNode.grpc_endpoint(decoded) == "h:9092"
    assert BrokerIdsZNode.decode(b"") == {} and BrokerIdsZNode.decode(b"not json") == {}
    assert BrokerIdsZNode.decode(b"[1]") == {} and BrokerIdsZNode.grpc_endpoint({}) == ""


def test_topic_assignment() -> None:
    key = TopicZNode.key(ETCD, "t")
    assert key == b"/gregor/c/brokers/topics/t" and TopicZNode.topic(ETCD, key) == "t"
    assert TopicZNode.topic(ETCD, PartitionStateZNode.key(ETCD, "t", 0)) is None
    assert PartitionStateZNode.key(ETCD, "t", 0).startswith(TopicZNode.children_prefix(ETCD, "t"))
    assignment = {0: (1, 2), 1: (2, 3)}
    assert TopicZNode.decode(TopicZNode.encode(assignment)) == assignment
    stored = (b'{"version": 2, "partitions": {"0": [1, 2], "1": [2, 3]}, "adding_replicas": {}, '
              b'"removing_replicas": {}}')
    assert TopicZNode.encode(assignment) == stored and TopicZNode.partition_count(stored) == 2


def test_partition_state_and_the_version_rule() -> None:
    key = PartitionStateZNode.key(ETCD, "t", 4)
    assert key == b"/gregor/c/brokers/topics/t/partitions/4/state"
    assert PartitionStateZNode.topic_partition(ETCD, key) == ("t", 4)
    assert PartitionStateZNode.topic_partition(ETCD, TopicZNode.key(ETCD, "t")) is None
    state = PartitionState(leader=1, leader_epoch=3, isr=(1, 2), controller_epoch=2, partition_epoch=5,
                           leader_broker_epoch=40)
    # An etcd version v holds partition epoch v - 1; a writer expecting epoch E compares version E + 1.
    assert PartitionStateZNode.decode(PartitionStateZNode.encode(state), 6) == state
    assert PartitionStateZNode.expected_version(5) == 6 and PartitionStateZNode.expected_version(None) == 0
    stored = (b'{"controller_epoch": 2, "leader": 1, "version": 1, "leader_epoch": 3, "isr": [1, 2], '
              b'"leader_broker_epoch": 40}')
    assert PartitionStateZNode.encode(state) == stored
    # Written before leader_broker_epoch existed: it reads back unknown, and stays absent when rewritten.
    old = b'{"controller_epoch": 2, "leader": 1, "version": 1, "leader_epoch": 3, "isr": [1, 2]}'
    decoded = PartitionStateZNode.decode(old, 1)
    assert decoded.leader_broker_epoch == UNKNOWN_BROKER_EPOCH and decoded.partition_epoch == 0
    assert PartitionStateZNode.encode(decoded) == old
    assert decoded.with_isr([1]).isr == (1,) and decoded.with_isr([1]).leader_epoch == 3
    with pytest.raises(ValueError):
        PartitionStateZNode.decode(b"[]", 1)


def test_topic_config() -> None:
    key = TopicConfigZNode.key(ETCD, "t")
    assert key == b"/gregor/c/config/topics/t" and TopicConfigZNode.topic(ETCD, key) == "t"
    assert key.startswith(TopicConfigZNode.prefix(ETCD))
    configs = {"retention.ms": "1000", "cleanup.policy": "compact"}
    assert TopicConfigZNode.decode(TopicConfigZNode.encode(configs)) == configs
    stored = b'{"version": 1, "config": {"cleanup.policy": "compact", "retention.ms": "1000"}}'
    assert TopicConfigZNode.encode(configs) == stored


def test_delete_topic_mark() -> None:
    key = DeleteTopicsZNode.key(ETCD, "t")
    assert key == b"/gregor/c/admin/delete_topics/t" and DeleteTopicsZNode.topic(ETCD, key) == "t"
    assert key.startswith(DeleteTopicsZNode.prefix(ETCD)) and DeleteTopicsZNode.VALUE == b""


def test_isr_change_notification() -> None:
    key = IsrChangeNotificationZNode.key(ETCD, 123, 2, 9)
    assert key == b"/gregor/c/isr_change_notification/isr_change_00000000000000000123_2_9"
    assert key.startswith(IsrChangeNotificationZNode.prefix(ETCD))
    assert IsrChangeNotificationZNode.key(ETCD, 99, 1, 1) < IsrChangeNotificationZNode.key(ETCD, 100, 1, 1)
    changed = [("t", 0), ("u", 3)]
    assert IsrChangeNotificationZNode.decode(IsrChangeNotificationZNode.encode(changed)) == changed
    stored = b'{"version": 1, "partitions": [{"topic": "t", "partition": 0}, {"topic": "u", "partition": 3}]}'
    assert IsrChangeNotificationZNode.encode(changed) == stored
    with pytest.raises((ValueError, KeyError, TypeError)):
        IsrChangeNotificationZNode.decode(b'{"partitions": [{"topic": "t"}]}')


def test_log_dir_event_notification() -> None:
    key = LogDirEventNotificationZNode.key(ETCD, 123, 2, 9)
    assert key == b"/gregor/c/log_dir_event_notification/log_dir_event_00000000000000000123_2_9"
    assert key.startswith(LogDirEventNotificationZNode.prefix(ETCD))
    assert LogDirEventNotificationZNode.key(ETCD, 99, 1, 1) < LogDirEventNotificationZNode.key(ETCD, 100, 1, 1)
    # Kafka's value (LogDirFailureEvent = 1); 2 is Gregor's dir-back-online event.
    assert LogDirEventNotificationZNode.encode(2, LOG_DIR_FAILURE_EVENT) == b'{"version": 1, "broker": 2, "event": 1}'
    assert LogDirEventNotificationZNode.decode(LogDirEventNotificationZNode.encode(4, LOG_DIR_ONLINE_EVENT)) == (4, 2)
    assert LogDirEventNotificationZNode.decode(b'{"version":1,"broker":3}') == (3, LOG_DIR_FAILURE_EVENT)
    with pytest.raises((ValueError, KeyError, TypeError)):
        LogDirEventNotificationZNode.decode(b'{"version": 1}')


def test_producer_id_block() -> None:
    assert ProducerIdBlockZNode.key(ETCD) == b"/gregor/c/latest_producer_id_block"
    block = ProducerIdBlock(broker_id=1, block_start=1000, block_end=1999)
    assert ProducerIdBlockZNode.decode(ProducerIdBlockZNode.encode(block)) == block
    stored = b'{"version": 1, "broker": 1, "block_start": 1000, "block_end": 1999}'
    assert ProducerIdBlockZNode.encode(block) == stored


def test_coordinators() -> None:
    prefix = CoordinatorsZNode.prefix(ETCD)
    assert prefix == b"/gregor/c/coordinators/"
    id_key = CoordinatorsZNode.id_key(ETCD, 2)
    offsets = CoordinatorsZNode.claim_key(ETCD, CoordinatorsZNode.OFFSETS_CLAIMS, 5)
    txn = CoordinatorsZNode.claim_key(ETCD, CoordinatorsZNode.TXN_CLAIMS, 5)
    assert (id_key, offsets, txn) == (b"/gregor/c/coordinators/ids/2", b"/gregor/c/coordinators/partitions/5",
                                      b"/gregor/c/coordinators/txn-partitions/5")
    assert all(k.startswith(prefix) for k in (id_key, offsets, txn))
    assert CoordinatorsZNode.parse(ETCD, id_key) == CoordinatorKey("ids", 2)
    assert CoordinatorsZNode.parse(ETCD, txn) == CoordinatorKey("txn-partitions", 5)
    assert CoordinatorsZNode.parse(ETCD, b"/gregor/c/coordinators/other/5") is None
    with pytest.raises(ValueError):
        CoordinatorsZNode.claim_key(ETCD, "ids", 1)
    info = CoordinatorsZNode.encode_info(2, "h", 9000)
    assert info == b'{"coordinator_id": 2, "host": "h", "port": 9000}'
    assert CoordinatorsZNode.decode_info(info) == {"coordinator_id": 2, "host": "h", "port": 9000}
    assert CoordinatorsZNode.decode_claim(CoordinatorsZNode.encode_claim(2)) == 2
    assert CoordinatorsZNode.encode_claim(2) == b"2"


# -- no other module builds a key ----------------------------------------------

# Every key goes through EtcdClient.key (and is read back through EtcdClient.relative), so a call of either
# outside the layout is a key built by hand. A literal that spells a path of the layout (its top-level
# segments with a '/', the distinctive single-segment keys, the cluster prefix) is one too. "controller"
# and "controller_epoch" alone are too common in messages and JSON fields to be told apart here: their keys
# are caught by the .key() rule.
KEY_LITERAL = re.compile(r"^/?(brokers|config|admin|coordinators|isr_change_notification|acls)/|"
                         r"^(latest_producer_id_block|isr_change_notification)$|^/gregor/")
ALLOWED = {"common/etcd_layout.py", "common/etcd.py"}


def _violations(path: pathlib.Path, source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("key", "relative") and "etcd" in ast.unparse(node.func.value).lower():
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)[:80]}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
            if KEY_LITERAL.search(text):
                found.append(f"{path}:{node.lineno}: {text[:80]!r}")
    return found


def test_acl() -> None:
    from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType

    acl = AclBinding("User:CN=a,O=b", "*", ResourceType.GROUP, "team/a b", PatternType.PREFIXED, Operation.READ,
                     Permission.ALLOW)
    key = AclZNode.key(ETCD, acl)
    assert key.startswith(AclZNode.prefix(ETCD) + b"Group/Prefixed/team%2Fa%20b/")  # '/' in a name stays one segment
    assert key == AclZNode.key(ETCD, acl)  # the same binding is the same key: adding twice is idempotent
    assert key != AclZNode.key(ETCD, AclBinding(acl.principal, acl.host, acl.resource_type, acl.resource_name,
                                                acl.pattern_type, acl.operation, Permission.DENY))
    assert AclZNode.decode(AclZNode.encode(acl)) == acl
    assert b'"version": 1' in AclZNode.encode(acl)
    with pytest.raises(ValueError):
        AclZNode.decode(b"[]")
    with pytest.raises(ValueError):  # an ACL Kafka would refuse (Write on a Group) is refused on read too
        AclZNode.decode(AclZNode.encode(acl).replace(b'"Read"', b'"Write"'))


def test_the_scan_catches_a_hand_built_key() -> None:
    """The scan below can fail: each way of building a key by hand is caught."""
    for source in ('k = self.etcd.key("brokers", "ids", 1)', 'k = etcd.relative(kv.key)',
                   'p = "brokers/topics/"', 'k = f"coordinators/ids/{n}"', 'K = "isr_change_notification"',
                   'K = "latest_producer_id_block"', 'k = b"/gregor/c/x"', 'p = "acls/Topic/"'):
        assert _violations(pathlib.Path("x.py"), source), source
    assert not _violations(pathlib.Path("x.py"), 'log.info("controller %d moved", 1); s = "config"')


def test_no_module_outside_the_layout_builds_an_etcd_key() -> None:
    files = sorted(p for p in SERVICES.rglob("*.py") if "rpc/v1" not in p.as_posix())
    assert len(files) > 100
    found = []
    for path in files:
        rel = path.relative_to(SERVICES).as_posix()
        if rel not in ALLOWED:
            found += _violations(path.relative_to(SERVICES), path.read_text())
    assert found == [], "etcd keys built outside gregor.common.etcd_layout:\n" + "\n".join(found)


@pytest.mark.parametrize("znode, key, entity", [
    ("brokers", b"/gregor/c/config/brokers/<default>", "<default>"),
    ("quotas", b"/gregor/c/config/users/alice/clients/a%2Fb", ("alice", "a/b")),
])
def test_config_entity_apply_decodes_or_warns(caplog: pytest.LogCaptureFixture, znode: str, key: bytes,
                                             entity: object) -> None:
    """The quota and dynamic-broker-config watchers' apply (config_entity_apply): a stored entity's configs,
    {} when deleted or empty, nothing for a key of no entity or a malformed value (logged, to the watcher's
    logger, as `<what>: ignoring malformed <key>`)."""
    import logging

    from gregor.common.etcd import config_entity_apply
    from gregor.common.etcd_layout import BrokerConfigZNode, QuotaConfigZNode

    layout = BrokerConfigZNode if znode == "brokers" else QuotaConfigZNode
    got: list[tuple[object, dict[str, str]]] = []
    logger = logging.getLogger(f"test.{znode}")
    apply = config_entity_apply(lambda k: layout.entity(ETCD, k), layout.decode,
                                lambda e, configs: got.append((e, configs)), what=znode, logger=logger)

    def name(e: object) -> object:
        return e if isinstance(e, str) else (e.user, e.client_id)  # type: ignore[attr-defined]

    apply(key, b'{"version": 1, "config": {"k": "1"}}', 5)
    apply(key, None, 6)
    apply(key, b"", 7)
    apply(b"/gregor/c/config/topics/t", b'{"version": 1, "config": {"k": "1"}}', 8)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        apply(key, b"not json", 9)
    assert [(name(e), c) for e, c in got] == [(entity, {"k": "1"}), (entity, {}), (entity, {})]
    assert [r.name for r in caplog.records] == [logger.name]
    assert caplog.records[0].getMessage().startswith(f"{znode}: ignoring malformed {key!r}: ")
