"""Kafka admin APIs that need three brokers or a whole cluster's state, through clients nobody here wrote
(confluent-kafka / librdkafka, kafka-python): DeleteRecords waiting for every replica (Kafka's
DelayedDeleteRecords), the legacy AlterConfigs (API 33) and the client-quota APIs (48/49).

One cluster for the module: etcd, a controller, three brokers, a group coordinator.
"""

from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   ResourceType)

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.client.admin import AdminClient as GregorAdmin, SyncAdminClient
from gregor.common import errors
from tests.helpers.cluster import broker_metric_total
from tests.helpers.kafka_admin import create_topic_everywhere
from tests.helpers.wait import wait_for

WAIT_S = 60.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("kadmin")), brokers=3, controllers=1, coordinators=1)
    try:
        yield c
    finally:
        c.down()


def bootstrap(c: LocalCluster) -> str:
    return str(c.to_json()["kafka_bootstrap"])


def create_topic(c: LocalCluster, partitions: int = 1, rf: int = 3, configs: dict[str, str] | None = None) -> str:
    return create_topic_everywhere(bootstrap(c), f"a-{uuid.uuid4().hex[:8]}", partitions, rf, configs, WAIT_S)


def produce(c: LocalCluster, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap(c), "acks": "all", "enable.idempotence": True})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=0)
    assert p.flush(WAIT_S) == 0


def log_start_offsets(c: LocalCluster, topic: str, exclude: int = -1) -> dict[int, int]:
    """Broker id -> gregor_log_start_offset of its replica of `topic` (one partition), from each /metrics (but
    `exclude`'s: a stopped broker does not answer)."""
    out: dict[int, int] = {}
    for p in c.by_role("broker"):
        if p.id == exclude:
            continue
        with urllib.request.urlopen(p.metrics, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("gregor_log_start_offset{") and f'topic="{topic}"' in line:
                    out[p.id] = int(float(line.split()[-1]))
    return out


def leader_of(c: LocalCluster, topic: str) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap(c)}).list_topics(topic, timeout=10)
    return int(md.topics[topic].partitions[0].leader)


def test_delete_records_answers_once_every_replica_moved_its_log_start(cluster: LocalCluster) -> None:
    """RF 3: when DeleteRecords answers, the leader and both followers already start at the asked offset (Kafka's
    low watermark), with no waiting after the answer; -1 deletes up to the high watermark."""
    topic = create_topic(cluster)
    produce(cluster, topic, 10)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    [fut] = admin.delete_records([TopicPartition(topic, 0, 4)], operation_timeout=30).values()
    assert fut.result(timeout=WAIT_S).low_watermark == 4
    assert log_start_offsets(cluster, topic) == {0: 4, 1: 4, 2: 4}  # read right after the answer
    [fut] = admin.delete_records([TopicPartition(topic, 0, -1)], operation_timeout=30).values()
    assert fut.result(timeout=WAIT_S).low_watermark == 10
    assert log_start_offsets(cluster, topic) == {0: 10, 1: 10, 2: 10}
    [fut] = admin.delete_records([TopicPartition(topic, 0, 11)]).values()
    err = fut.exception(timeout=WAIT_S)
    assert err is not None and err.args[0].name() == "OFFSET_OUT_OF_RANGE", err


def test_delete_records_times_out_while_a_follower_does_not_fetch(cluster: LocalCluster) -> None:
    """A follower that is live but stopped (SIGSTOP) holds the low watermark back: the answer is REQUEST_TIMED_OUT
    after the request's timeout; once it runs again it catches up to the leader's log start."""
    topic = create_topic(cluster)
    produce(cluster, topic, 6)
    leader = leader_of(cluster, topic)
    follower: Process = next(p for p in cluster.by_role("broker") if p.id != leader)
    # Bootstrapped from the leader and connected before the follower stops: librdkafka asks for the partition's
    # leader on a connection it has, and one to the stopped broker timed the request out ("Failed to query
    # partition leaders", a fresh-clone CI run) while the follower stayed stopped past its lease.
    admin = broker_admin(cluster, leader)
    assert admin.list_topics(topic, timeout=WAIT_S).topics[topic].error is None
    os.kill(follower.pid, signal.SIGSTOP)
    try:
        [fut] = admin.delete_records([TopicPartition(topic, 0, 3)], operation_timeout=2,
                                     request_timeout=30).values()
        err = fut.exception(timeout=WAIT_S)
        assert isinstance(err, KafkaException) and err.args[0].name() == "REQUEST_TIMED_OUT", err
        starts = log_start_offsets(cluster, topic, exclude=follower.id)
        assert starts[leader] == 3
    finally:
        os.kill(follower.pid, signal.SIGCONT)
    wait_for(lambda: log_start_offsets(cluster, topic) == {0: 3, 1: 3, 2: 3}, WAIT_S,
             "the follower takes the leader's log start offset once it runs again")
    [fut] = admin.delete_records([TopicPartition(topic, 0, 5)], operation_timeout=30).values()
    assert fut.result(timeout=WAIT_S).low_watermark == 5



def topic_overrides(c: LocalCluster, topic: str) -> dict[str, str]:
    """The topic's dynamic overrides, as DescribeConfigs (API 32) answers them."""
    admin = AdminClient({"bootstrap.servers": bootstrap(c)})
    res = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([res])[res].result(timeout=WAIT_S)
    return {k: e.value for k, e in entries.items() if not e.is_default}


def test_legacy_alter_configs_replaces_a_topics_configs_whole(cluster: LocalCluster) -> None:
    """AlterConfigs (API 33) through librdkafka's alter_configs: the given configs are set and every other override
    goes back to its default; validate_only changes nothing; a bad value is INVALID_CONFIG; a broker's read-only
    config is INVALID_REQUEST (Kafka's "Cannot update these configs dynamically")."""
    topic = create_topic(cluster, rf=1, configs={"retention.ms": "3600000", "max.message.bytes": "200000"})
    assert topic_overrides(cluster, topic) == {"retention.ms": "3600000", "max.message.bytes": "200000"}
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    res = ConfigResource(ResourceType.TOPIC, topic, set_config={"segment.ms": "600000"})
    [fut] = admin.alter_configs([res], validate_only=True).values()
    assert fut.result(timeout=WAIT_S) is None
    assert topic_overrides(cluster, topic) == {"retention.ms": "3600000", "max.message.bytes": "200000"}
    [fut] = admin.alter_configs([res]).values()
    assert fut.result(timeout=WAIT_S) is None
    assert topic_overrides(cluster, topic) == {"segment.ms": "600000"}  # retention.ms, max.message.bytes: defaults
    bad = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "soon"})
    err = admin.alter_configs([bad])[bad].exception(timeout=WAIT_S)
    assert isinstance(err, KafkaException) and err.args[0].name() == "INVALID_CONFIG", err
    assert topic_overrides(cluster, topic) == {"segment.ms": "600000"}
    broker = ConfigResource(ResourceType.BROKER, "0", set_config={"num.partitions": "3"})
    err = admin.alter_configs([broker])[broker].exception(timeout=WAIT_S)
    assert isinstance(err, KafkaException) and err.args[0].name() == "INVALID_REQUEST", err
    assert "Cannot update these configs dynamically" in str(err), err


def kafka_requests(c: LocalCluster, api: str) -> float:
    """gregor_kafka_requests_total{api} summed over the brokers and the request versions."""
    return broker_metric_total(c, f'gregor_kafka_requests_total{{api="{api}",')


def test_kafka_python_alter_configs_over_the_legacy_api(cluster: LocalCluster) -> None:
    """kafka-python's alter_configs with incremental=False sends AlterConfigs (API 33): it reads the topic's
    overrides first and sends them with the change, since the legacy API resets whatever is left out."""
    from kafka import KafkaAdminClient  # type: ignore[import-untyped]
    from kafka.admin import ConfigResource as KConfigResource, ConfigResourceType  # type: ignore[import-untyped]

    topic = create_topic(cluster, rf=1, configs={"retention.ms": "3600000"})
    before = kafka_requests(cluster, "AlterConfigs")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster).split(","))
    try:
        admin.alter_configs([KConfigResource(ConfigResourceType.TOPIC, topic, configs={"cleanup.policy": "compact"})],
                            incremental=False)
    finally:
        admin.close()
    assert topic_overrides(cluster, topic) == {"cleanup.policy": "compact", "retention.ms": "3600000"}
    assert kafka_requests(cluster, "AlterConfigs") == before + 1


# ---- dynamic broker configs (KIP-226) -----------------------------------------------------------------

def broker_admin(c: LocalCluster, broker: int | None = None) -> AdminClient:
    """An AdminClient bootstrapped from one broker's listener (all of them when None)."""
    boot = bootstrap(c) if broker is None else next(p.kafka for p in c.by_role("broker") if p.id == broker)
    return AdminClient({"bootstrap.servers": boot})


def grpc_admin(c: LocalCluster, call: Callable[[GregorAdmin], Awaitable[T]]) -> T:
    async def go() -> T:
        async with GregorAdmin({"bootstrap.servers": c.bootstrap}) as a:
            return await call(a)
    return asyncio.run(go())


def set_broker_configs(c: LocalCluster, name: str, set_: dict[str, str] | None = None,
                       delete: tuple[str, ...] = (), validate_only: bool = False) -> None:
    """IncrementalAlterConfigs of BROKER `name` through confluent-kafka; the cluster-wide default ("") through
    Gregor's gRPC AdminClient (librdkafka refuses a BROKER resource with an empty name)."""
    if name == "":
        grpc_admin(c, lambda a: a.alter_broker_configs(None, set_, delete, validate_only))
        return
    res = ConfigResource(ResourceType.BROKER, name, incremental_configs=[
        *(ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in (set_ or {}).items()),
        *(ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete)])
    admin = broker_admin(c)  # kept: a collected client fails its futures
    [fut] = admin.incremental_alter_configs([res], validate_only=validate_only).values()
    assert fut.result(timeout=WAIT_S) is None


def broker_configs(c: LocalCluster, name: str) -> dict[str, ConfigEntry]:
    """DescribeConfigs of BROKER `name` with synonyms (confluent-kafka); the default ("") over gRPC."""
    if name == "":
        found = grpc_admin(c, lambda a: a.describe_broker_configs(None))
        return {e.name: ConfigEntry(e.name, e.value, source=ConfigSource(e.source), is_read_only=e.read_only)
                for e in found}
    res = ConfigResource(ResourceType.BROKER, name)
    admin = broker_admin(c)
    [fut] = admin.describe_configs([res]).values()
    return dict(fut.result(timeout=WAIT_S))


@pytest.fixture
def clean_broker_configs(cluster: LocalCluster) -> Iterator[None]:
    """The module's other tests share the cluster: every dynamic broker config a test set is removed after it."""
    yield
    for name in ("", "0", "1", "2"):
        stored = [k for k, e in broker_configs(cluster, name).items()
                  if e.source in (ConfigSource.DYNAMIC_BROKER_CONFIG.value, ConfigSource.DYNAMIC_BROKER_CONFIG,
                                  ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)]
        if stored:
            set_broker_configs(cluster, name, delete=tuple(stored))


def test_incremental_alter_configs_on_a_broker_and_the_default_with_kafkas_precedence(
        cluster: LocalCluster, clean_broker_configs: None) -> None:
    """confluent-kafka's incremental_alter_configs on BROKER "0" and on the cluster-wide default (""), then
    describe_configs: broker 0's own value wins (DYNAMIC_BROKER_CONFIG),
    broker 1 takes the default (DYNAMIC_DEFAULT_BROKER_CONFIG), "" lists only the stored default; a read-only key
    is refused per resource and nothing of that resource is written; an unknown key and a bad value are
    INVALID_CONFIG; validate_only writes nothing."""
    set_broker_configs(cluster, "0", {"log.retention.ms": "7200000"})
    set_broker_configs(cluster, "", {"log.retention.ms": "172800000", "log.retention.bytes": "1073741824"})
    zero = broker_configs(cluster, "0")["log.retention.ms"]
    assert (zero.value, zero.source, zero.is_read_only) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value, False)
    one = broker_configs(cluster, "1")
    assert (one["log.retention.ms"].value, one["log.retention.ms"].source) == (
        "172800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert one["broker.id"].is_read_only and one["broker.id"].value == "1"
    default = broker_configs(cluster, "")
    assert {k: (e.value, e.source) for k, e in default.items()} == {
        "log.retention.ms": ("172800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        "log.retention.bytes": ("1073741824", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)}

    admin = broker_admin(cluster)
    mixed = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.segment.bytes", "2000000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("num.io.threads", "16", incremental_operation=AlterConfigOpType.SET)])
    err = admin.incremental_alter_configs([mixed])[mixed].exception(timeout=WAIT_S)
    assert isinstance(err, KafkaException) and err.args[0].name() == "INVALID_REQUEST", err
    assert "Cannot update these configs dynamically: Set(num.io.threads)" in str(err), err
    for key, value in (("no.such.config", "1"), ("log.segment.bytes", "big")):
        bad = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        err = admin.incremental_alter_configs([bad])[bad].exception(timeout=WAIT_S)
        assert isinstance(err, KafkaException) and err.args[0].name() == "INVALID_CONFIG", (key, err)
    set_broker_configs(cluster, "1", {"log.segment.bytes": "2000000"}, validate_only=True)
    after = broker_configs(cluster, "1")["log.segment.bytes"]
    assert after.source == ConfigSource.DEFAULT_CONFIG.value and after.value == "1073741824"  # nothing written

    set_broker_configs(cluster, "0", delete=("log.retention.ms",))
    zero = broker_configs(cluster, "0")["log.retention.ms"]
    assert (zero.value, zero.source) == ("172800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)


def log_segments(c: LocalCluster, topic: str) -> dict[int, int]:
    """Broker id -> gregor_log_segments of `topic` on it, from each broker's /metrics."""
    out: dict[int, int] = {}
    for p in c.by_role("broker"):
        with urllib.request.urlopen(p.metrics, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("gregor_log_segments{") and f'topic="{topic}"' in line:
                    out[p.id] = int(float(line.split()[-1]))
    return out


def test_a_topic_without_an_override_follows_a_changed_broker_default(
        cluster: LocalCluster, clean_broker_configs: None) -> None:
    """Kafka's inheritance: a topic without segment.bytes / retention.ms of its own takes the new cluster-wide
    default within the watch's delay on every replica -- its logs roll at the new segment size, and
    DescribeConfigs of the topic shows the inherited value with source DYNAMIC_DEFAULT_BROKER_CONFIG -- while a
    topic with its own override keeps it."""
    plain = create_topic(cluster)
    pinned = create_topic(cluster, configs={"segment.bytes": "1073741824"})
    set_broker_configs(cluster, "", {"log.segment.bytes": "1024", "log.retention.ms": "86400000"})

    def described(topic: str) -> dict[str, ConfigEntry]:
        res = ConfigResource(ResourceType.TOPIC, topic)
        admin = broker_admin(cluster, 1)
        [fut] = admin.describe_configs([res]).values()
        return dict(fut.result(timeout=WAIT_S))

    def inherited() -> bool:
        e = described(plain)["segment.bytes"]
        return e.value == "1024" and e.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    wait_for(inherited, WAIT_S, "the topic's segment.bytes follows the dynamic default")
    retention = described(plain)["retention.ms"]
    assert (retention.value, retention.source) == ("86400000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    own = described(pinned)["segment.bytes"]
    assert (own.value, own.source) == ("1073741824", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)

    for topic in (plain, pinned):
        p = Producer({"bootstrap.servers": bootstrap(cluster), "acks": "all", "linger.ms": 0})
        for i in range(20):
            p.produce(topic, value=b"x" * 400, partition=0)
            p.flush(WAIT_S)  # one batch each: 20 batches of ~450 bytes
    wait_for(lambda: all(n >= 5 for n in log_segments(cluster, plain).values())
             and len(log_segments(cluster, plain)) == 3, WAIT_S,
             "every replica of the topic without an override rolls 1 KiB segments")
    assert set(log_segments(cluster, pinned).values()) == {1}  # its own segment.bytes: one segment


def test_legacy_alter_configs_replaces_a_brokers_dynamic_configs_whole(
        cluster: LocalCluster, clean_broker_configs: None) -> None:
    """AlterConfigs (API 33) on BROKER "2": the given dynamic configs replace every stored one of that broker (the
    legacy API's semantics); validate_only writes nothing."""
    admin = broker_admin(cluster)
    first = ConfigResource(ResourceType.BROKER, "2", set_config={"log.retention.bytes": "1073741824",
                                                                 "log.cleaner.delete.retention.ms": "3600000"})
    assert admin.alter_configs([first])[first].result(timeout=WAIT_S) is None
    second = ConfigResource(ResourceType.BROKER, "2", set_config={"log.retention.bytes": "2147483648"})
    assert admin.alter_configs([second], validate_only=True)[second].result(timeout=WAIT_S) is None

    def dynamic() -> dict[str, str | None]:
        return {k: e.value for k, e in broker_configs(cluster, "2").items()
                if e.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value}
    assert dynamic() == {"log.retention.bytes": "1073741824", "log.cleaner.delete.retention.ms": "3600000"}
    assert admin.alter_configs([second])[second].result(timeout=WAIT_S) is None
    assert dynamic() == {"log.retention.bytes": "2147483648"}


def test_the_blocking_admin_client_alters_and_describes_broker_configs(
        cluster: LocalCluster, clean_broker_configs: None) -> None:
    """The same dynamic broker configs through SyncAdminClient, the blocking facade of Gregor's gRPC AdminClient:
    broker 2's own value and the cluster-wide default each with its source, validate_only writing nothing, a
    read-only key refused with Kafka's message and nothing of the request written, a delete falling back."""
    with SyncAdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
        def described(broker: int | None) -> dict[str, tuple[str | None, int]]:
            return {e.name: (e.value, e.source) for e in admin.describe_broker_configs(broker)}

        assert admin.alter_broker_configs(2, {"log.retention.ms": "3600000"}) == {"log.retention.ms": "3600000"}
        assert admin.alter_broker_configs(None, {"log.retention.ms": "7200000"}) == {"log.retention.ms": "7200000"}
        assert described(2)["log.retention.ms"] == ("3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        assert described(1)["log.retention.ms"] == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert described(None) == {"log.retention.ms": ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)}

        # validate_only answers what the configs would be, and writes nothing
        assert admin.alter_broker_configs(2, {"log.segment.bytes": "2000000"}, validate_only=True) == {
            "log.retention.ms": "3600000", "log.segment.bytes": "2000000"}
        assert described(2)["log.segment.bytes"] == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
        with pytest.raises(errors.GregorError) as refused:
            admin.alter_broker_configs(2, {"log.segment.bytes": "2000000", "num.io.threads": "16"})
        assert refused.value.code == errors.Code.INVALID_REQUEST, refused.value
        assert "Cannot update these configs dynamically: Set(num.io.threads)" in str(refused.value)
        assert described(2)["log.segment.bytes"] == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)

        assert admin.alter_broker_configs(2, delete=["log.retention.ms"]) == {}
        assert described(2)["log.retention.ms"] == ("7200000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)


def test_a_topics_configs_are_the_same_through_grpc_and_the_kafka_listener(
        cluster: LocalCluster, clean_broker_configs: None) -> None:
    """DescribeConfigs of a topic through Gregor's gRPC AdminClient and through librdkafka on the Kafka listener
    give every config the same value and source: the topic's override (DYNAMIC_TOPIC_CONFIG), a cluster-wide
    dynamic default (DYNAMIC_DEFAULT_BROKER_CONFIG) and Kafka's default (DEFAULT_CONFIG). Before, the gRPC answer
    was the controller's alone, Kafka's defaults where the brokers had the dynamic default."""
    topic = create_topic(cluster, configs={"segment.bytes": "2000000"})
    set_broker_configs(cluster, "", {"log.retention.ms": "172800000"})

    def kafka_view() -> dict[str, tuple[str | None, int]]:
        res = ConfigResource(ResourceType.TOPIC, topic)
        admin = broker_admin(cluster)  # kept: a collected client fails its futures
        [fut] = admin.describe_configs([res]).values()
        return {k: (e.value, int(e.source)) for k, e in fut.result(timeout=WAIT_S).items()}

    def grpc_view() -> dict[str, tuple[str | None, int]]:
        found = grpc_admin(cluster, lambda a: a.describe_configs([topic]))[topic]
        return {e.name: (e.value, e.source) for e in found}

    # every broker applies the new default within its watch's delay
    wait_for(lambda: kafka_view()["retention.ms"][0] == "172800000" == grpc_view()["retention.ms"][0], WAIT_S,
             "the new default on the broker answering each view")
    kafka, grpc_ = kafka_view(), grpc_view()
    assert grpc_["segment.bytes"] == ("2000000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert grpc_["retention.ms"] == ("172800000", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
    assert grpc_["cleanup.policy"] == ("delete", ConfigSource.DEFAULT_CONFIG.value)
    assert grpc_ == kafka
    altered = grpc_admin(cluster, lambda a: a.alter_configs(topic, {"retention.bytes": "1048576"}))
    assert {e.name: (e.value, e.source) for e in altered} == {
        **kafka, "retention.bytes": ("1048576", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)}
