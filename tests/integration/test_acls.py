"""Kafka's ACL authorizer (issue 23, points 3 and 5) with real processes: etcd, a controller, three brokers
and a group coordinator, all started with `authorizer.class.name` on, over plain text, so every client
and every service is `User:ANONYMOUS` (Kafka's PLAINTEXT principal) and the ACLs name it.

The operator's bootstrap ACLs go into etcd with `gregor acls add --etcd` before any service starts (as
kafka-acls.sh --authorizer-properties writes ZooKeeper): ClusterAction on the Cluster for the services'
own calls, Create on the Cluster, Alter/Describe on the Cluster for the Admin API's ACL calls, and topic
ACLs: Allow Write/Read/Describe on the prefix `app-`, Deny Write on `app-locked`, Describe only on
`secret`, for the coordinator All on `__consumer_offsets` and `__transaction_state`, Read on the group
prefix `ok-` and Write on the transactional id `tx-ok`.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

from gregor.cli.local_cluster import (LocalCluster, authorizer_properties, start_broker, start_controller,
                                      start_coordinator, start_etcd)
from gregor.client.admin import AdminClient
from gregor.common import errors
from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from gregor.common.authz import AclFilter
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.batches import make_batch, record_values
from tests.helpers.cluster import replica_values, tear_down
from tests.helpers.wait import until, wait_for

ANON = "User:ANONYMOUS"
WAIT_S = 60.0
# Issue 23: "an ACL change takes effect within a second on every broker".
PROPAGATION_S = 1.0
TOPICS = ("app-orders", "app-locked", "secret", "hidden", "late")


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def cli(*args: str, data_dir: str | None = None, check: bool = True, stdin: str | None = None) -> CliResult:
    """The gregor command line, run in this process (a fresh interpreter per command costs seconds here)."""
    from gregor.cli.main import cli as gregor, hoist_global_options

    env = {"GREGOR_DATA_DIR": data_dir} if data_dir else {}
    r = CliRunner().invoke(gregor, hoist_global_options(list(args)), env=env, input=stdin or "")
    out = CliResult(r.exit_code, r.stdout, r.stderr)
    if check:
        assert out.returncode == 0, f"gregor {' '.join(args)}: {out.stderr} {r.exception!r}"
    return out


def bootstrap_acls(etcd: str) -> None:
    """The operator's first ACLs, straight into etcd before any service runs (`gregor acls add --etcd`)."""
    direct = ("--etcd", f"http://{etcd}")
    for args in (
            ("--allow-principal", ANON, "--cluster", "--operation", "ClusterAction", "--operation", "Create",
             "--operation", "Alter", "--operation", "Describe", "--operation", "IdempotentWrite"),
            ("--allow-principal", ANON, "--topic", "app-", "--resource-pattern-type", "prefixed",
             "--operation", "Write", "--operation", "Read", "--operation", "Describe"),
            ("--deny-principal", ANON, "--topic", "app-locked", "--operation", "Write"),
            ("--allow-principal", ANON, "--topic", "secret", "--operation", "Describe"),
            ("--allow-principal", ANON, "--topic", "__consumer_offsets", "--operation", "All"),
            ("--allow-principal", ANON, "--group", "ok-", "--resource-pattern-type", "prefixed", "--operation", "Read"),
            ("--allow-principal", ANON, "--topic", "__transaction_state", "--operation", "All"),
            ("--allow-principal", ANON, "--transactional-id", "tx-ok", "--operation", "Write")):
        cli("acls", "add", *direct, *args)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir = str(tmp_path_factory.mktemp("acls"))
    c = LocalCluster(data_dir)
    try:
        etcd = start_etcd(data_dir)
        c.processes.append(etcd)
        bootstrap_acls(etcd.grpc)
        props = authorizer_properties(["User:CN=admin"])  # a super user no plain-text client can be
        c.processes.append(start_controller(data_dir, 0, etcd.grpc, lease_ttl_ms=3000, overrides=props))
        for b in range(3):
            c.processes.append(start_broker(data_dir, b, overrides={**props, "broker.session.timeout.ms": "3000"},
                                            etcd_endpoint=etcd.grpc))
        c.processes.append(start_coordinator(data_dir, 0, etcd.grpc, lease_ttl_ms=3000,
                                             overrides={**props, "offsets.topic.num.partitions": "2",
                                                        "offsets.topic.replication.factor": "1"}))
        c.save()
        yield c
    finally:
        tear_down(c)


@pytest.fixture(scope="module")
def topics(cluster: LocalCluster) -> dict[str, int]:
    """The test topics (Create on the Cluster lets ANONYMOUS create them), each with its leader broker id."""

    async def create() -> dict[str, int]:
        async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
            for name in TOPICS:
                await admin.create_topic(name, 1, 3)
        leaders: dict[str, int] = {}

        async def led() -> bool:
            md = await metadata(cluster.by_role("broker")[0].grpc, list(TOPICS))
            for t in md.topics:
                if t.name in ("app-orders", "app-locked", "secret") and t.partitions and t.partitions[0].leader >= 0:
                    leaders[t.name] = t.partitions[0].leader
            return len(leaders) == 3
        await until(led, WAIT_S, "leaders for the test topics")
        return leaders

    return asyncio.run(create())


async def metadata(address: str, names: list[str] | None = None) -> broker_pb2.MetadataResponse:
    async with channel(address) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=names or []),
                                                                      timeout=10)


def broker(cluster: LocalCluster, broker_id: int) -> Any:
    return next(p for p in cluster.by_role("broker") if p.id == broker_id)


async def produce(address: str, topic: str, values: list[bytes]) -> broker_pb2.ProduceResponse:
    async with channel(address) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=topic, partition=0, records=make_batch(values), acks=-1, timeout_ms=10000), timeout=15)


async def fetch(address: str, topic: str) -> list[bytes]:
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(broker_pb2.FetchRequest(
            topic=topic, partition=0, fetch_offset=0, max_bytes=1 << 20, max_wait_ms=0), timeout=10)
    return record_values(r.records)


async def refused(call: Any) -> errors.GregorError:
    with pytest.raises(grpc.RpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    return errors.from_rpc_error(info.value)


def scrape_denials(metrics_url: str, resource_type: str, operation: str) -> float:
    body = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    want = f'gregor_authorizer_denials_total{{operation="{operation}",resource_type="{resource_type}"}}'
    return sum(float(line.split()[-1]) for line in body.splitlines() if line.startswith(want))


async def test_a_principal_without_write_cannot_produce_and_the_log_is_unchanged(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    leader = broker(cluster, topics["secret"])
    before = replica_values(leader, "secret", 0)
    err = await refused(produce(leader.grpc, "secret", [b"must-not-land"]))
    assert err.code == errors.Code.TOPIC_AUTHORIZATION_FAILED and err.topic == "secret"
    assert "User:ANONYMOUS" in err.message
    # Describe is allowed on secret, so its end offset can be read: still 0; the files hold nothing new.
    async with channel(leader.grpc) as ch:
        end = await broker_pb2_grpc.BrokerServiceStub(ch).ListOffsets(broker_pb2.ListOffsetsRequest(
            topic="secret", partition=0, timestamp_ms=-1), timeout=10)
    assert end.offset == 0
    assert replica_values(leader, "secret", 0) == before == []
    # Read is not implied by Describe either.
    assert (await refused(fetch(leader.grpc, "secret"))).code == errors.Code.TOPIC_AUTHORIZATION_FAILED
    # Counted and audited: Prometheus counter and one JSON line on the gregor.audit logger.
    assert scrape_denials(leader.metrics, "Topic", "Write") >= 1
    with open(leader.log) as f:
        audits = [json.loads(line.split("gregor.audit: ", 1)[1]) for line in f if "gregor.audit: " in line]
    assert {"principal": ANON, "operation": "Write", "resource_type": "Topic", "resource_name": "secret",
            "api": "Produce", "decision": "Denied"}.items() <= next(
        a for a in audits if a["resource_name"] == "secret" and a["operation"] == "Write").items()


async def test_a_prefixed_acl_allows_every_topic_under_it_and_replication_keeps_working(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    leader = broker(cluster, topics["app-orders"])
    r = await produce(leader.grpc, "app-orders", [b"a", b"b"])  # acks=all: both followers fetched it
    assert r.base_offset >= 0
    assert (await fetch(leader.grpc, "app-orders"))[-2:] == [b"a", b"b"]
    for b in cluster.by_role("broker"):  # the followers' fetches passed their ClusterAction check
        await until(lambda b=b: replica_values(b, "app-orders", 0)[-2:] == [b"a", b"b"], WAIT_S,
                    f"app-orders replicated to broker {b.id}")


async def test_deny_beats_allow(cluster: LocalCluster, topics: dict[str, int]) -> None:
    leader = broker(cluster, topics["app-locked"])
    err = await refused(produce(leader.grpc, "app-locked", [b"x"]))  # the prefix allows Write, the Deny wins
    assert err.code == errors.Code.TOPIC_AUTHORIZATION_FAILED
    assert await fetch(leader.grpc, "app-locked") == []  # Read is still allowed by the prefix
    assert replica_values(leader, "app-locked", 0) == []


async def test_a_multi_partition_fetch_needs_read_on_each_partitions_topic(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """FetchPartitions (the consumer's fetch session, issue 24) checks Read per partition: a topic without
    it is that partition's TOPIC_AUTHORIZATION_FAILED, the others are read."""
    address = broker(cluster, topics["app-orders"]).grpc
    await produce(address, "app-orders", [b"multi"])
    parts = [broker_pb2.FetchPartition(topic=t, partition=0, fetch_offset=0, current_leader_epoch=-1,
                                       partition_max_bytes=1 << 20) for t in ("app-orders", "secret")]
    async with channel(address) as ch:
        r = await broker_pb2_grpc.BrokerServiceStub(ch).FetchPartitions(broker_pb2.FetchPartitionsRequest(
            max_bytes=1 << 20, session_epoch=0, partitions=parts), timeout=10)
    got = {p.topic: p for p in r.partitions}
    assert got["secret"].error.code == errors.Code.TOPIC_AUTHORIZATION_FAILED
    assert not got["app-orders"].error.code and b"multi" in record_values(got["app-orders"].records)


async def test_metadata_hides_unauthorized_topics(cluster: LocalCluster, topics: dict[str, int]) -> None:
    for b in cluster.by_role("broker"):
        listed = {t.name for t in (await metadata(b.grpc)).topics}
        assert {"app-orders", "app-locked", "secret"} <= listed
        assert "hidden" not in listed and "late" not in listed
        named = {t.name: t for t in (await metadata(b.grpc, ["hidden", "app-orders"])).topics}
        assert named["hidden"].error == errors.Code.TOPIC_AUTHORIZATION_FAILED and not named["hidden"].partitions
        assert named["app-orders"].error == 0 and named["app-orders"].partitions


async def test_an_acl_change_takes_effect_within_a_second_on_every_service(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Every broker (Metadata: Describe on the topic), the controller (DescribeConfigs on the topic) and the
    coordinator (DescribeGroups: Describe on the group) follow one CreateAcls, then one DeleteAcls, each
    within a second of the call's answer, all watched at once."""
    from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

    acls = [AclBinding(ANON, "*", ResourceType.TOPIC, "late", PatternType.LITERAL, op, Permission.ALLOW)
            for op in (Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS)]
    acls.append(AclBinding(ANON, "*", ResourceType.GROUP, "late-group", PatternType.LITERAL, Operation.DESCRIBE,
                           Permission.ALLOW))

    async def broker_allows(address: str) -> bool:
        return (await metadata(address, ["late"])).topics[0].error == 0

    async def controller_allows(address: str) -> bool:
        async with channel(address) as ch:
            r = await controller_pb2_grpc.AdminServiceStub(ch).DescribeConfigs(
                controller_pb2.DescribeConfigsRequest(topics=["late"]), timeout=10)
        return r.results[0].error.code != errors.Code.TOPIC_AUTHORIZATION_FAILED

    async def coordinator_allows(address: str) -> bool:
        async with channel(address) as ch:
            r = await coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch).DescribeGroups(
                coordinator_pb2.DescribeGroupsRequest(group_ids=["late-group"]), timeout=10)
        return r.groups[0].error.code != errors.Code.GROUP_AUTHORIZATION_FAILED

    services = [(f"broker {b.id}", broker_allows, b.grpc) for b in cluster.by_role("broker")]
    services += [("the controller", controller_allows, cluster.by_role("controller")[0].grpc),
                 ("the coordinator", coordinator_allows, cluster.by_role("coordinator")[0].grpc)]

    async def everywhere(allowed: bool, what: str) -> None:
        async def one(name: str, check: Any, address: str) -> float:
            async def holds() -> bool:
                return await check(address) == allowed
            return await until(holds, PROPAGATION_S, f"{what} on {name}", interval_s=0.01)
        await asyncio.gather(*(one(*s) for s in services))

    await everywhere(False, "no ACL yet")
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        await admin.create_acls(acls)  # the Admin API: forwarded by a broker to the controller, into etcd
        await everywhere(True, "the new ACLs")
        deleted = await admin.delete_acls([AclFilter(principal=ANON, resource_name=n, pattern_type="Literal")
                                           for n in ("late", "late-group")])
        assert sorted(deleted, key=str) == sorted(acls, key=str)
        await everywhere(False, "the removal")


async def not_(aw: Any) -> bool:
    return not await aw


def test_cli_lists_in_kafka_acls_format_and_removes(cluster: LocalCluster, topics: dict[str, int]) -> None:
    out = cli("acls", "list", "--topic", "app-", "--resource-pattern-type", "prefixed", data_dir=cluster.data_dir)
    assert "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=app-, patternType=PREFIXED)`: " \
        in out.stdout
    assert " \t(principal=User:ANONYMOUS, host=*, operation=WRITE, permissionType=ALLOW) " in out.stdout
    # match: every ACL that applies to app-locked (the prefix and the literal Deny)
    found = json.loads(cli("acls", "list", "--topic", "app-locked", "--resource-pattern-type", "match",
                           "-o", "json", data_dir=cluster.data_dir).stdout)["acls"]
    assert {(a["resource_name"], a["permission"], a["operation"]) for a in found} == {
        ("app-", "Allow", "Write"), ("app-", "Allow", "Read"), ("app-", "Allow", "Describe"),
        ("app-locked", "Deny", "Write")}
    out = cli("acls", "add", "--allow-principal", "User:bob", "--producer", "--topic", "cli-t",
              "--transactional-id", "tx", data_dir=cluster.data_dir)
    assert "Adding ACLs for resource `ResourcePattern(resourceType=TRANSACTIONAL_ID, name=tx, patternType=LITERAL)`" \
        in out.stdout
    listed = json.loads(cli("acls", "list", "--principal", "User:bob", "-o", "json",
                            data_dir=cluster.data_dir).stdout)["acls"]
    assert sorted((a["resource_type"], a["operation"]) for a in listed) == [
        ("Topic", "Create"), ("Topic", "Describe"), ("Topic", "Write"),
        ("TransactionalId", "Describe"), ("TransactionalId", "Write")]
    cli("acls", "remove", "--topic", "cli-t", "--transactional-id", "tx", "--force", data_dir=cluster.data_dir)
    assert json.loads(cli("acls", "list", "--principal", "User:bob", "-o", "json",
                          data_dir=cluster.data_dir).stdout)["acls"] == []
    bad = cli("acls", "add", "--allow-principal", ANON, "--group", "g", "--operation", "Write",
              data_dir=cluster.data_dir, check=False)
    assert bad.returncode != 0 and "operation Write is not valid for resource type Group" in bad.stderr


async def test_group_apis_check_read_on_the_group(cluster: LocalCluster, topics: dict[str, int]) -> None:
    from gregor.client.consumer import Consumer

    async def consume_one(group: str) -> list[bytes]:
        async with Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                             "auto.offset.reset": "earliest"}) as consumer:
            consumer.subscribe(["app-orders"])
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                got = await consumer.poll(1000)
                if got:
                    await consumer.commit_sync()
                    return [r.value for r in got]
            return []

    await produce(broker(cluster, topics["app-orders"]).grpc, "app-orders", [b"for-groups"])
    assert await consume_one("ok-billing")  # Read on the group prefix ok-: joins, consumes, commits
    with pytest.raises(errors.GregorError) as info:
        await consume_one("other-group")
    assert info.value.code == errors.Code.GROUP_AUTHORIZATION_FAILED


async def test_transactions_check_write_on_the_transactional_id(cluster: LocalCluster, topics: dict[str, int]) -> None:
    from gregor.client.producer import Producer

    leader = broker(cluster, topics["app-orders"])
    async with Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "tx-ok"}) as producer:
        await producer.init_transactions()  # Write on tx-ok: InitProducerId, AddPartitionsToTxn, EndTxn pass
        await producer.begin_transaction()
        await producer.send("app-orders", b"in-a-transaction", partition=0)
        await producer.commit_transaction()
    assert b"in-a-transaction" in await fetch(leader.grpc, "app-orders")
    async with Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "tx-other",
                         "max.block.ms": 10000}) as producer:
        with pytest.raises(errors.GregorError) as info:
            await producer.init_transactions()
    assert info.value.code == errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_super_users_are_allowed_everything_with_cluster_up_authorizer(tmp_path: Any) -> None:
    """`gregor cluster up --authorizer`: the CLI's principal (User:ANONYMOUS on plain text) is the super
    user, so a Deny ACL on it changes nothing; the same ACL binds a cluster where it is not one."""
    data_dir = str(tmp_path)
    cli("cluster", "up", "--data-dir", data_dir, "--authorizer", "--brokers", "1", "--controllers", "1",
        "--coordinators", "0", "--gateways", "0")
    try:
        cli("topics", "create", "t", "--partitions", "1", "--replication-factor", "1", data_dir=data_dir)
        cli("acls", "add", "--deny-principal", ANON, "--topic", "t", "--operation", "All", data_dir=data_dir)
        cli("produce", "t", stdin="v\n", data_dir=data_dir)
        assert cli("consume", "t", "--from-beginning", "--max-messages", "1", "--timeout-ms", "30000",
                   data_dir=data_dir).stdout.strip().endswith("v")
    finally:
        cli("cluster", "down", "--data-dir", data_dir, check=False)


def test_the_kafka_listener_enforces_the_same_acls_for_confluent_kafka(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    from confluent_kafka import KafkaError, Producer
    from confluent_kafka.admin import AdminClient as KafkaAdmin

    boot = str(cluster.to_json()["kafka_bootstrap"])
    listed = KafkaAdmin({"bootstrap.servers": boot}).list_topics(timeout=10).topics
    assert "app-orders" in listed and "secret" in listed and "hidden" not in listed
    secret_leader = broker(cluster, topics["secret"])
    before = replica_values(secret_leader, "secret", 0)
    reports: dict[str, Any] = {}
    producer = Producer({"bootstrap.servers": boot, "message.timeout.ms": 20000})
    for topic in ("app-orders", "secret", "hidden", "app-locked"):
        producer.produce(topic, b"via-kafka", partition=0,
                         on_delivery=lambda err, msg, topic=topic: reports.__setitem__(topic, err))
    assert producer.flush(30) == 0
    assert reports["app-orders"] is None
    for topic in ("secret", "hidden", "app-locked"):
        assert reports[topic] is not None and reports[topic].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, \
            (topic, reports[topic])
    assert replica_values(secret_leader, "secret", 0) == before


def test_kafka_admin_clients_manage_acls_over_the_kafka_listener(cluster: LocalCluster, topics: dict[str, int]) -> None:
    """CreateAcls / DescribeAcls / DeleteAcls on the Kafka listener, with confluent-kafka's AdminClient (the
    calls kafka-acls.sh --bootstrap-server makes); gregor acls sees what it wrote."""
    from confluent_kafka.admin import AclBinding as KAcl, AclBindingFilter, AclOperation, AclPermissionType
    from confluent_kafka.admin import AdminClient as KafkaAdmin, ResourcePatternType, ResourceType as KType

    admin = KafkaAdmin({"bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"])})
    new = [KAcl(KType.TOPIC, "kafka-made", ResourcePatternType.PREFIXED, "User:kafka", "*", AclOperation.READ,
                AclPermissionType.ALLOW),
           KAcl(KType.GROUP, "kafka-group", ResourcePatternType.LITERAL, "User:kafka", "10.1.1.1",
                AclOperation.DELETE, AclPermissionType.DENY)]
    for f in admin.create_acls(new).values():
        assert f.result(timeout=WAIT_S) is None
    mine = AclBindingFilter(KType.ANY, None, ResourcePatternType.ANY, "User:kafka", None, AclOperation.ANY,
                            AclPermissionType.ANY)
    assert sorted(map(str, admin.describe_acls(mine).result(timeout=WAIT_S))) == sorted(map(str, new))
    listed = json.loads(cli("acls", "list", "--principal", "User:kafka", "-o", "json",
                            data_dir=cluster.data_dir).stdout)["acls"]
    assert {(a["resource_type"], a["resource_name"], a["pattern_type"], a["host"], a["operation"], a["permission"])
            for a in listed} == {("Topic", "kafka-made", "Prefixed", "*", "Read", "Allow"),
                                 ("Group", "kafka-group", "Literal", "10.1.1.1", "Delete", "Deny")}
    match = AclBindingFilter(KType.TOPIC, "kafka-made-x", ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    assert [b.name for b in admin.describe_acls(match).result(timeout=WAIT_S)] == ["kafka-made"]
    deleted = list(admin.delete_acls([mine]).values())[0].result(timeout=WAIT_S)
    assert sorted(map(str, deleted)) == sorted(map(str, new))
    assert admin.describe_acls(mine).result(timeout=WAIT_S) == []
    bad = KAcl(KType.GROUP, "g", ResourcePatternType.LITERAL, "User:kafka", "*", AclOperation.WRITE,
               AclPermissionType.ALLOW)  # Write is not an operation of a Group
    with pytest.raises(Exception, match="INVALID_REQUEST|not valid"):
        list(admin.create_acls([bad]).values())[0].result(timeout=WAIT_S)


def test_find_coordinator_on_the_kafka_listener_needs_describe_on_the_group_or_transactional_id(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Kafka's FindCoordinator checks Describe on the key's resource: a group or transactional id the caller
    may not describe gets GROUP_ / TRANSACTIONAL_ID_AUTHORIZATION_FAILED (Read on `ok-*` implies Describe)."""
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.static.primitive import i8

    from tests.e2e.test_kafka_protocol import RawClient

    raw = RawClient(str(cluster.to_json()["kafka_bootstrap"]).split(",")[0])

    def codes(key_type: int, *keys: str) -> dict[str, int]:
        resp = raw.call(FindCoordinatorRequest(key_type=i8(key_type), coordinator_keys=keys))
        return {str(c.key): int(c.error_code.value) for c in resp.coordinators}
    try:
        assert codes(0, "ok-group", "nope-group") == {"ok-group": 0,
                                                      "nope-group": int(errors.Code.GROUP_AUTHORIZATION_FAILED)}
        assert codes(1, "tx-ok", "tx-nope") == {
            "tx-ok": 0, "tx-nope": int(errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)}
    finally:
        raw.close()


async def test_offset_fetch_answers_topic_authorization_failed_per_requested_partition(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Kafka's OffsetFetch: a requested partition of a topic the caller may not Describe is answered
    TOPIC_AUTHORIZATION_FAILED (offset -1) while the others are answered; asked for all of the group's
    offsets, such topics are left out. Over gRPC (the coordinator) and the Kafka listener (confluent-kafka)."""
    from confluent_kafka import Consumer as KafkaConsumer, KafkaError, TopicPartition as KafkaTP

    from gregor.rpc.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

    group = "ok-offsets"
    read_hidden = AclBinding(ANON, "*", ResourceType.TOPIC, "hidden", PatternType.LITERAL, Operation.READ,
                             Permission.ALLOW)
    coordinator = cluster.by_role("coordinator")[0].grpc

    async def call(name: str, request: Any) -> Any:
        async with channel(coordinator) as ch:
            return await getattr(coordinator_pb2_grpc.GroupCoordinatorServiceStub(ch), name)(request, timeout=10)

    async def commit(topic: str, offset: int) -> bool:
        try:
            r = await call("OffsetCommit", coordinator_pb2.OffsetCommitRequest(
                group_id=group, generation_id=-1, partitions=[coordinator_pb2.OffsetCommitPartition(
                    topic=topic, partition=0, offset=offset, leader_epoch=-1)]))
        except grpc.RpcError as exc:  # the coordinator still loading its offsets partition
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False
        return all(x.error.code == 0 for x in r.results)

    async def fetch(*asked: str) -> dict[str, tuple[int, int]]:
        r = await call("OffsetFetch", coordinator_pb2.OffsetFetchRequest(
            group_id=group, partitions=[common_pb2.TopicPartition(topic=t, partition=0) for t in asked]))
        return {p.topic: (p.offset, p.error.code) for p in r.partitions}

    await until(lambda: commit("app-orders", 3), WAIT_S, "a commit on app-orders")
    async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        await admin.create_acls([read_hidden])  # for a moment ANONYMOUS may Read (so Describe) hidden
        try:
            await until(lambda: commit("hidden", 5), WAIT_S, "a commit on hidden")
        finally:
            await admin.delete_acls([AclFilter(principal=ANON, resource_name="hidden", pattern_type="Literal")])

    async def hidden_gone() -> bool:
        return "hidden" not in await fetch()
    await until(hidden_gone, WAIT_S, "hidden left out of the group's offsets")
    assert await fetch() == {"app-orders": (3, 0)}  # all the group's offsets: hidden left out, no error
    assert await fetch("app-orders", "hidden") == {"app-orders": (3, 0),
                                                  "hidden": (-1, errors.Code.TOPIC_AUTHORIZATION_FAILED)}

    consumer = KafkaConsumer({"bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"]), "group.id": group})
    try:
        got = {tp.topic: tp for tp in consumer.committed([KafkaTP("app-orders", 0), KafkaTP("hidden", 0)],
                                                         timeout=20)}
    finally:
        consumer.close()
    assert got["app-orders"].offset == 3 and got["app-orders"].error is None
    assert got["hidden"].error is not None and got["hidden"].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_client_quota_apis_on_the_kafka_listener_need_configs_operations_on_the_cluster(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Kafka's DescribeClientQuotas needs DescribeConfigs on the Cluster and AlterClientQuotas AlterConfigs on the
    Cluster (ANONYMOUS has neither here: CLUSTER_AUTHORIZATION_FAILED, nothing written); with an ACL for them both
    work. DescribeUserScramCredentials needs Describe on the Cluster (ANONYMOUS has it)."""
    from kio.schema.alter_client_quotas.v1 import request as alter
    from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
    from kio.schema.describe_user_scram_credentials.v0.request import DescribeUserScramCredentialsRequest, UserName
    from kio.static.primitive import f64, i8

    from tests.e2e.test_kafka_protocol import RawClient

    denied = int(errors.Code.CLUSTER_AUTHORIZATION_FAILED)
    raw = RawClient(str(cluster.to_json()["kafka_bootstrap"]).split(",")[0])
    change = alter.AlterClientQuotasRequest(entries=(alter.EntryData(
        entity=(alter.EntityData(entity_type="user", entity_name="quota-acl"),),
        ops=(alter.OpData(key="producer_byte_rate", value=f64(1048576.0), remove=False),)),), validate_only=False)
    describe = DescribeClientQuotasRequest(components=(ComponentData(entity_type="user", match_type=i8(0),
                                                                     match="quota-acl"),), strict=False)
    try:
        assert int(raw.call(change).entries[0].error_code.value) == denied
        assert int(raw.call(describe).error_code.value) == denied
        scram = raw.call(DescribeUserScramCredentialsRequest(users=(UserName(name="quota-acl"),)))
        assert int(scram.error_code.value) == 0 and int(scram.results[0].error_code.value) == 91  # RESOURCE_NOT_FOUND
        cli("acls", "add", "--allow-principal", ANON, "--cluster", "--operation", "AlterConfigs",
            "--operation", "DescribeConfigs", data_dir=cluster.data_dir)
        try:
            deadline = time.monotonic() + WAIT_S
            while int(raw.call(change).entries[0].error_code.value) == denied:  # ACLs reach the broker within ~1 s
                assert time.monotonic() < deadline, "the new ACL never reached the broker"
                time.sleep(0.2)
            found = raw.call(describe)
            assert int(found.error_code.value) == 0
            assert [(str(e.entity[0].entity_name), {str(v.key): float(v.value) for v in e.values})
                    for e in found.entries] == [("quota-acl", {"producer_byte_rate": 1048576.0})]
        finally:
            cli("acls", "remove", "--allow-principal", ANON, "--cluster", "--operation", "AlterConfigs",
                "--operation", "DescribeConfigs", "--force", data_dir=cluster.data_dir)
    finally:
        raw.close()


def test_dynamic_broker_configs_need_configs_operations_on_the_cluster(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """Kafka's rule for BROKER resources: IncrementalAlterConfigs needs AlterConfigs on the Cluster and
    DescribeConfigs needs DescribeConfigs on the Cluster. ANONYMOUS has neither here: confluent-kafka gets
    CLUSTER_AUTHORIZATION_FAILED for the resource, the gRPC AdminClient ClusterAuthorizationFailed, and nothing is
    written; with the ACLs both work."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient as KafkaAdmin, AlterConfigOpType, ConfigEntry, ConfigResource
    from confluent_kafka.admin import ConfigSource, ResourceType as KType

    admin = KafkaAdmin({"bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"])})
    change = ConfigResource(KType.BROKER, "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET)])
    describe = ConfigResource(KType.BROKER, "0")

    def grpc(call: Any) -> Any:
        async def go() -> Any:
            async with AdminClient({"bootstrap.servers": cluster.bootstrap}) as a:
                return await call(a)
        return asyncio.run(go())

    err = admin.incremental_alter_configs([change])[change].exception(timeout=WAIT_S)
    assert isinstance(err, KafkaException) and err.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED", err
    err = admin.describe_configs([describe])[describe].exception(timeout=WAIT_S)
    assert isinstance(err, KafkaException) and err.args[0].name() == "CLUSTER_AUTHORIZATION_FAILED", err
    with pytest.raises(errors.GregorError) as denied:
        grpc(lambda a: a.alter_broker_configs(None, {"log.retention.ms": "7200000"}))
    assert denied.value.code == errors.Code.CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(errors.GregorError) as denied:
        grpc(lambda a: a.describe_broker_configs(1))
    assert denied.value.code == errors.Code.CLUSTER_AUTHORIZATION_FAILED
    cli("acls", "add", "--allow-principal", ANON, "--cluster", "--operation", "AlterConfigs",
        "--operation", "DescribeConfigs", data_dir=cluster.data_dir)
    try:
        def described() -> Any:
            fut = admin.describe_configs([describe])[describe]
            return None if fut.exception(timeout=WAIT_S) is not None else fut.result()
        wait_for(lambda: described() is not None, WAIT_S, "the new ACLs reach the broker")
        entry = described()["log.retention.ms"]
        assert entry.source == ConfigSource.DEFAULT_CONFIG.value, entry  # the refused changes wrote nothing
        assert grpc(lambda a: a.describe_broker_configs(None)) == []
        assert admin.incremental_alter_configs([change])[change].result(timeout=WAIT_S) is None
        entry = admin.describe_configs([describe])[describe].result(timeout=WAIT_S)["log.retention.ms"]
        assert (entry.value, entry.source) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        grpc(lambda a: a.alter_broker_configs(0, delete=["log.retention.ms"]))
    finally:
        cli("acls", "remove", "--allow-principal", ANON, "--cluster", "--operation", "AlterConfigs",
            "--operation", "DescribeConfigs", "--force", data_dir=cluster.data_dir)


def test_offset_fetch_v8_authorizes_each_group_and_topic_over_the_kafka_listener(
        cluster: LocalCluster, topics: dict[str, int]) -> None:
    """OffsetFetch v8 (several groups) through a broker's Kafka listener, relayed with the connection's
    principal as v7 is: a group ANONYMOUS may not Describe gets GROUP_AUTHORIZATION_FAILED (30) in its own
    error_code while an allowed group in the same request is answered; in the allowed group, a requested
    partition of a topic it may not Describe gets TOPIC_AUTHORIZATION_FAILED (29)."""
    from confluent_kafka import Consumer, TopicPartition as KTP
    from kio.schema.offset_fetch.v8 import request as of
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32

    from tests.e2e.test_kafka_protocol import RawClient

    boot = str(cluster.to_json()["kafka_bootstrap"])
    allowed, denied = "ok-v8", "nope-v8"
    c = Consumer({"bootstrap.servers": boot, "group.id": allowed, "enable.auto.commit": False})
    try:
        c.commit(offsets=[KTP("app-orders", 0, 7)], asynchronous=False)
    finally:
        c.close()
    raw = RawClient(boot.split(",")[0])
    try:
        resp = raw.call(of.OffsetFetchRequest(require_stable=False, groups=(
            of.OffsetFetchRequestGroup(group_id=GroupId(allowed), topics=(
                of.OffsetFetchRequestTopics(name=TopicName("app-orders"), partition_indexes=(i32(0),)),
                of.OffsetFetchRequestTopics(name=TopicName("hidden"), partition_indexes=(i32(0),)))),
            of.OffsetFetchRequestGroup(group_id=GroupId(denied), topics=None))))
    finally:
        raw.close()
    got = {str(g.group_id): (int(g.error_code.value), {
        str(t.name): (int(p.committed_offset), int(p.error_code.value)) for t in g.topics for p in t.partitions})
        for g in resp.groups}
    assert got == {allowed: (0, {"app-orders": (7, 0), "hidden": (-1, 29)}), denied: (30, {})}, got
