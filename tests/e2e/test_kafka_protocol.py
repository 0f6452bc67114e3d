"""Kafka wire protocol (issue 22, first stage) proven with clients nobody here wrote: confluent-kafka
(librdkafka) and kafka-python, against a real local cluster (etcd, controller, 2 brokers, a group
coordinator). Every test talks to the brokers' Kafka listeners, so each fails without them.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gregor.cli.local_cluster import LocalCluster

GREGOR = [sys.executable, "-m", "gregor.cli.main"]
WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("kafka")), brokers=2, controllers=1, coordinators=1)
    try:
        yield c
    finally:
        c.down()


def bootstrap(c: LocalCluster) -> str:
    return str(c.to_json()["kafka_bootstrap"])


def cli(c: LocalCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": c.data_dir}
    return subprocess.run([*GREGOR, *args], capture_output=True, text=True, timeout=WAIT_S, env=env,
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL)


def create_topic(c: LocalCluster, partitions: int = 2, rf: int = 2) -> str:
    name = f"k-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap(c)})
    for f in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf)]).values():
        assert f.result(timeout=WAIT_S) is None
    return name


def drain(consumer: Consumer, want: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


def test_cluster_json_names_each_brokers_kafka_listener(cluster: LocalCluster) -> None:
    doc = json.load(open(cluster.path))
    brokers = [p for p in doc["processes"] if p["role"] == "broker"]
    assert len(brokers) == 2 and all(p["kafka"] for p in brokers)
    assert doc["kafka_bootstrap"] == ",".join(p["kafka"] for p in brokers)
    assert all("kafka" not in p for p in doc["processes"] if p["role"] != "broker")


def _frame(api_key: int, version: int, corr: int, body: bytes = b"") -> bytes:
    head = struct.pack(">hhih", api_key, version, corr, 4) + b"test"
    return struct.pack(">i", len(head) + len(body)) + head + body


def test_api_versions_unknown_version_answers_v0_with_unsupported_version(cluster: LocalCluster) -> None:
    host, port = bootstrap(cluster).split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_frame(18, 99, 7))
        size = struct.unpack(">i", s.recv(4))[0]
        data = b""
        while len(data) < size:
            data += s.recv(size - len(data))
    corr, err, n = struct.unpack_from(">ihi", data, 0)
    assert (corr, err) == (7, 35)  # UNSUPPORTED_VERSION, v0 body: error code, then the api keys array
    keys = {struct.unpack_from(">hhh", data, 10 + 6 * i)[0] for i in range(n)}
    assert {0, 1, 3, 18} <= keys


def test_librdkafka_idempotent_produce_is_read_back_through_grpc(cluster: LocalCluster) -> None:
    topic = create_topic(cluster)
    p = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True, "acks": "all"})
    acked: list[tuple[int, int]] = []

    def done(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append((msg.partition(), msg.offset()))

    for i in range(20):
        p.produce(topic, key=f"k{i}", value=f"v{i}", on_delivery=done)
    assert p.flush(WAIT_S) == 0 and len(acked) == 20
    out = cli(cluster, "consume", topic, "--from-beginning", "--max-messages", "20", "--timeout-ms", "20000",
              "--output", "json")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert sorted(r["value"] for r in rows) == sorted(f"v{i}" for i in range(20))
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(acked)


def test_grpc_produce_is_read_by_librdkafka(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=1)
    lines = "".join(f"key{i}:val{i}\n" for i in range(10))
    out = cli(cluster, "produce", topic, "--acks", "all", "--key-separator", ":", stdin=lines)
    assert out.returncode == 0, out.stderr
    c = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": f"g-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        got = drain(c, 10)
    finally:
        c.close()
    assert [(m.key(), m.value(), m.offset()) for m in got] == [
        (f"key{i}".encode(), f"val{i}".encode(), i) for i in range(10)]


def test_librdkafka_group_rebalances_and_commits_offsets_seen_by_gregor_groups(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=4)
    group = f"grp-{topic}"
    p = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True})
    for i in range(40):
        p.produce(topic, value=f"m{i}", partition=i % 4)
    assert p.flush(WAIT_S) == 0
    conf = {"bootstrap.servers": bootstrap(cluster), "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10000, "heartbeat.interval.ms": 500}
    assigned: dict[str, list[int]] = {"a": [], "b": []}
    a, b = Consumer(conf), Consumer(conf)
    a.subscribe([topic], on_assign=lambda c, ps: assigned.__setitem__("a", [q.partition for q in ps]))
    first = drain(a, 40)  # alone: all four partitions
    assert len(first) == 40 and sorted(assigned["a"]) == [0, 1, 2, 3]
    a.commit(asynchronous=False)
    b.subscribe([topic], on_assign=lambda c, ps: assigned.__setitem__("b", [q.partition for q in ps]))
    deadline = time.monotonic() + WAIT_S
    while not (assigned["b"] and len(assigned["a"]) == 2) and time.monotonic() < deadline:
        a.poll(0.2)
        b.poll(0.2)
    try:
        assert sorted(assigned["a"] + assigned["b"]) == [0, 1, 2, 3] and len(assigned["b"]) == 2  # rebalanced
        desc = cli(cluster, "groups", "describe", group, "--output", "json")
        assert desc.returncode == 0, desc.stderr
        rows = json.loads(desc.stdout)["partitions"]
        assert sorted((r["partition"], r["current_offset"]) for r in rows) == [(i, 10) for i in range(4)]
    finally:
        a.close()
        b.close()


def test_admin_create_and_delete_topics(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=3, rf=1)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    assert admin.list_topics(topic, timeout=10).topics[topic].partitions.keys() == {0, 1, 2}
    err = admin.create_topics([NewTopic(topic, 1, 1)])[topic].exception(timeout=WAIT_S)
    assert err is not None and err.args[0].name() == "TOPIC_ALREADY_EXISTS"
    assert admin.delete_topics([topic])[topic].result(timeout=WAIT_S) is None
    listed = cli(cluster, "topics", "list", "--output", "json")
    assert listed.returncode == 0 and topic not in listed.stdout


def test_kafka_python_produces_and_consumes(cluster: LocalCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    topic = create_topic(cluster, partitions=2)
    prod = KafkaProducer(bootstrap_servers=bootstrap(cluster).split(","), acks="all")
    for i in range(10):
        prod.send(topic, key=b"k", value=f"py{i}".encode()).get(timeout=WAIT_S)
    prod.close()
    cons = KafkaConsumer(topic, bootstrap_servers=bootstrap(cluster).split(","), group_id=f"py-{topic}",
                         auto_offset_reset="earliest", consumer_timeout_ms=15000)
    try:
        values = [m.value for _, m in zip(range(10), cons)]
    finally:
        cons.close()
    assert values == [f"py{i}".encode() for i in range(10)]  # one key: one partition, in order
