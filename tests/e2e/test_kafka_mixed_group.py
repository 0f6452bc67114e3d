"""One consumer group with members on both protocols (issue 22, point 3): a Gregor gRPC SDK consumer
(gregor.client.SyncConsumer, JoinGroup over gRPC to the coordinator) and a librdkafka consumer (confluent-kafka,
JoinGroup over a broker's Kafka listener, relayed to the same coordinator) join the same group on a real local
cluster (etcd, a controller, two brokers, a group coordinator).

Both speak Kafka's embedded consumer protocol (protocol type "consumer", ConsumerProtocol subscriptions and
assignments), so a group of both works when their assignors agree: the members' assignments are disjoint and
together cover the topic, and the offsets each commits are the ones the other reads. When the assignors share
none, the second to join gets Kafka's INCONSISTENT_GROUP_PROTOCOL (23) and the first keeps its assignment, in
either order.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition as KTopicPartition

from gregor.cli.local_cluster import LocalCluster
from gregor.client.consumer import SyncConsumer
from gregor.common import errors
from tests.e2e.test_kafka_protocol import WAIT_S, bootstrap, create_topic
from tests.helpers.wait import wait_for

PARTITIONS = 4
INCONSISTENT_GROUP_PROTOCOL = 23


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("kafka-mixed")), brokers=2, controllers=1, coordinators=1)
    try:
        yield c
    finally:
        c.down()


def sdk_consumer(c: LocalCluster, group: str, strategy: str) -> SyncConsumer:
    return SyncConsumer({"bootstrap.servers": c.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "partition.assignment.strategy": strategy,
                         "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000})


def kafka_consumer(c: LocalCluster, group: str, strategy: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap(c), "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "partition.assignment.strategy": strategy,
                     "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000})


def sdk_owned(s: SyncConsumer) -> set[int]:
    return {p for _, p in s.assignment()}


def kafka_owned(k: Consumer) -> set[int]:
    return {tp.partition for tp in k.assignment()}


@pytest.mark.parametrize("sdk_strategy,kafka_strategy", [
    ("range", "roundrobin,range"),  # eager; librdkafka also offers roundrobin, range is the one they share
    ("cooperative-sticky", "cooperative-sticky"),  # KIP-429 incremental rebalancing, user data read by both
])
def test_sdk_and_librdkafka_members_with_a_common_assignor_share_the_topic_and_its_offsets(
        cluster: LocalCluster, sdk_strategy: str, kafka_strategy: str) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    sdk = sdk_consumer(cluster, group, sdk_strategy)
    sdk.subscribe([topic])
    k = kafka_consumer(cluster, group, kafka_strategy)
    try:
        wait_for(lambda: sdk.poll(200) is not None and sdk_owned(sdk) == set(range(PARTITIONS)), WAIT_S,
                 "the SDK member owning every partition")
        k.subscribe([topic])

        def shared() -> bool:  # both poll: the rebalance needs each member to rejoin
            sdk.poll(100)
            k.poll(0.2)
            mine, theirs = sdk_owned(sdk), kafka_owned(k)
            return bool(mine) and bool(theirs) and not mine & theirs and mine | theirs == set(range(PARTITIONS))
        wait_for(shared, WAIT_S, "disjoint assignments of the SDK and the librdkafka member covering the topic")
        mine, theirs = sdk_owned(sdk), kafka_owned(k)
        assert len(mine) == len(theirs) == PARTITIONS // 2  # balanced: two partitions each

        # Each member commits offsets of its own partitions; the other member reads them.
        sdk.commit_sync({(topic, p): 2 + p for p in mine})
        k.commit(offsets=[KTopicPartition(topic, p, 3 + p) for p in theirs], asynchronous=False)
        seen_by_kafka = {tp.partition: tp.offset for tp in k.committed(
            [KTopicPartition(topic, p) for p in range(PARTITIONS)], timeout=WAIT_S)}
        seen_by_sdk = {p: o for (_, p), o in sdk.committed([(topic, p) for p in range(PARTITIONS)]).items()}
        expected = {**{p: 2 + p for p in mine}, **{p: 3 + p for p in theirs}}
        assert seen_by_kafka == expected and seen_by_sdk == expected
    finally:
        k.close()
        sdk.close()


def kafka_join_error(k: Consumer, until: float) -> KafkaError | None:
    while time.monotonic() < until:
        m = k.poll(0.2)
        err = m.error() if m is not None else None
        if err is not None and err.code() == INCONSISTENT_GROUP_PROTOCOL:
            return err
    return None


def test_librdkafka_joining_an_sdk_group_without_a_common_assignor_gets_inconsistent_group_protocol(
        cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    sdk = sdk_consumer(cluster, group, "range")
    sdk.subscribe([topic])
    k = kafka_consumer(cluster, group, "roundrobin")
    try:
        wait_for(lambda: sdk.poll(200) is not None and sdk_owned(sdk) == set(range(PARTITIONS)), WAIT_S,
                 "the SDK member owning every partition")
        k.subscribe([topic])
        err = kafka_join_error(k, time.monotonic() + WAIT_S)
        assert err is not None, "librdkafka was not told INCONSISTENT_GROUP_PROTOCOL"
        assert kafka_owned(k) == set()
        for _ in range(5):  # the first member's generation stands: it keeps every partition, no rebalance
            sdk.poll(200)
            assert sdk_owned(sdk) == set(range(PARTITIONS))
    finally:
        k.close()
        sdk.close()


def test_an_sdk_member_joining_a_librdkafka_group_without_a_common_assignor_gets_inconsistent_group_protocol(
        cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=PARTITIONS)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    k = kafka_consumer(cluster, group, "roundrobin")
    k.subscribe([topic])
    sdk = sdk_consumer(cluster, group, "range")
    try:
        wait_for(lambda: k.poll(0.2) is None and kafka_owned(k) == set(range(PARTITIONS)), WAIT_S,
                 "the librdkafka member owning every partition")
        sdk.subscribe([topic])
        caught: list[errors.GregorError] = []

        def refused() -> bool:
            k.poll(0.05)  # keeps heartbeating meanwhile
            try:
                sdk.poll(200)
            except errors.GregorError as exc:
                caught.append(exc)
            return bool(caught)
        wait_for(refused, WAIT_S, "the SDK member's poll() raising the join error")
        assert caught[0].code == INCONSISTENT_GROUP_PROTOCOL, caught[0]
        assert sdk_owned(sdk) == set()
        for _ in range(10):
            k.poll(0.1)
            assert kafka_owned(k) == set(range(PARTITIONS))
    finally:
        sdk.close()
        k.close()
