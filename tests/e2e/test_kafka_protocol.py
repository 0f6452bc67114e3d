"""Kafka wire protocol (issue 22, first stage) proven with clients nobody here wrote: confluent-kafka
(librdkafka) and kafka-python, against a real local cluster (etcd, controller, 2 brokers, a group
coordinator). Every test talks to the brokers' Kafka listeners, so each fails without them.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.types import BrokerId
from kio.static.primitive import i8, i32, i32Timedelta, i64

from gregor.cli.local_cluster import LocalCluster
from tests.helpers.cluster import broker_metric_total
from tests.helpers.wait import wait_for

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
    # Metadata reaches the brokers asynchronously (UpdateMetadata), as in Kafka: wait until every
    # broker's Kafka listener shows every partition with a leader.
    deadline = time.monotonic() + WAIT_S
    for address in bootstrap(c).split(","):
        one = AdminClient({"bootstrap.servers": address})
        while True:
            t = one.list_topics(name, timeout=10).topics.get(name)
            if t is not None and t.error is None and len(t.partitions) == partitions and \
                    all(p.leader >= 0 for p in t.partitions.values()):
                break
            assert time.monotonic() < deadline, f"{name} not in {address}'s metadata"
            time.sleep(0.1)
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
        admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
        listed = admin.list_consumer_groups().result(timeout=WAIT_S)
        assert group in {g.group_id for g in listed.valid}
        described = admin.describe_consumer_groups([group])[group].result(timeout=WAIT_S)
        assert len(described.members) == 2 and str(described.state).endswith("STABLE")
    finally:
        a.close()
        b.close()
    # Both left (LeaveGroup): the empty group can be deleted over Kafka, and gRPC sees it gone.
    deleted = admin.delete_consumer_groups([group])[group]
    assert deleted.result(timeout=WAIT_S) is None
    listed_after = cli(cluster, "groups", "list", "--output", "json")
    assert listed_after.returncode == 0 and group not in listed_after.stdout


def test_admin_create_grow_and_delete_topics(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=3, rf=1)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    assert admin.list_topics(topic, timeout=10).topics[topic].partitions.keys() == {0, 1, 2}
    assert admin.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=WAIT_S) is None
    deadline = time.monotonic() + WAIT_S
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != 5:
        assert time.monotonic() < deadline, "the new partitions never showed in Metadata"
        time.sleep(0.1)
    fewer = admin.create_partitions([NewPartitions(topic, 2)])[topic].exception(timeout=WAIT_S)
    assert fewer is not None and fewer.args[0].name() == "INVALID_PARTITIONS"
    err = admin.create_topics([NewTopic(topic, 1, 1)])[topic].exception(timeout=WAIT_S)
    assert err is not None and err.args[0].name() == "TOPIC_ALREADY_EXISTS"
    assert admin.delete_topics([topic])[topic].result(timeout=WAIT_S) is None
    listed = cli(cluster, "topics", "list", "--output", "json")
    assert listed.returncode == 0 and topic not in listed.stdout


def incremental_fetches(c: LocalCluster) -> float:
    """gregor_kafka_incremental_fetches_total summed over the brokers' /metrics."""
    return broker_metric_total(c, "gregor_kafka_incremental_fetches_total ")


def test_kafka_python_produces_and_consumes_with_incremental_fetch_sessions(cluster: LocalCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer  # type: ignore[import-untyped]

    before = incremental_fetches(cluster)
    topic = create_topic(cluster, partitions=2)
    prod = KafkaProducer(bootstrap_servers=bootstrap(cluster).split(","), acks="all")
    for i in range(10):
        prod.send(topic, key=b"k", value=f"py{i}".encode()).get(timeout=WAIT_S)
    cons = KafkaConsumer(topic, bootstrap_servers=bootstrap(cluster).split(","), group_id=f"py-{topic}",
                         auto_offset_reset="earliest", consumer_timeout_ms=15000)
    try:
        values = [m.value for _, m in zip(range(10), cons)]
        for i in range(10, 20):  # more while the consumer's fetch sessions are open
            prod.send(topic, key=b"k", value=f"py{i}".encode()).get(timeout=WAIT_S)
        values += [m.value for _, m in zip(range(10), cons)]
    finally:
        cons.close()
        prod.close()
    assert values == [f"py{i}".encode() for i in range(20)]  # one key: one partition, in order
    assert incremental_fetches(cluster) > before  # kafka-python's FetchSessionHandler used KIP-227 sessions


# ---- raw protocol through kio's writers: fetch sessions, OffsetForLeaderEpoch -------------------------

class RawClient:
    """One connection speaking flexible (header v2) requests built with kio, for what clients hide."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "connection closed"
            data += chunk
        return data

    def send(self, request: Any) -> None:
        from kio.serial import entity_writer

        self.corr += 1
        out = io.BytesIO()
        out.write(struct.pack(">hhih", request.__api_key__, request.__version__, self.corr, 3) + b"raw" + b"\0")
        entity_writer(type(request))(out, request)
        frame = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def call(self, request: Any) -> Any:
        from kio.index import load_response_from_request
        from kio.serial import entity_reader

        self.send(request)
        size = struct.unpack(">i", self._recv(4))[0]
        data = self._recv(size)
        assert struct.unpack_from(">i", data, 0)[0] == self.corr
        # Response header v1 (a tagged-fields byte) except for ApiVersions, whose header is always v0.
        start = 4 if request.__api_key__ == 18 else 5
        value, _ = entity_reader(load_response_from_request(request))(memoryview(data), start)
        return value


def leader_address(c: LocalCluster, topic: str) -> tuple[str, int]:
    md = AdminClient({"bootstrap.servers": bootstrap(c)}).list_topics(topic, timeout=10)
    b = md.brokers[md.topics[topic].partitions[0].leader]
    return f"{b.host}:{b.port}", md.topics[topic].partitions[0].leader


def produce_values(c: LocalCluster, topic: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap(c), "enable.idempotence": True})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(WAIT_S) == 0


def test_fetch_sessions_answer_only_what_changed(cluster: LocalCluster) -> None:
    from kio.schema.fetch.v12 import request as fr
    from kio.schema.types import TopicName

    topic = create_topic(cluster, partitions=1, rf=2)
    produce_values(cluster, topic, ["a", "b", "c"])
    address, _ = leader_address(cluster, topic)
    raw = RawClient(address)

    def fetch(session_id: int, epoch: int, offset: int | None) -> Any:
        parts = () if offset is None else (fr.FetchTopic(topic=TopicName(topic), partitions=(fr.FetchPartition(
            partition=i32(0), current_leader_epoch=i32(-1), fetch_offset=i64(offset), last_fetched_epoch=i32(-1),
            log_start_offset=i64(-1), partition_max_bytes=i32(1 << 20)),)),)
        return raw.call(fr.FetchRequest(
            replica_id=BrokerId(-1), max_wait=i32Timedelta.parse(timedelta(milliseconds=50)), min_bytes=i32(1),
            max_bytes=i32(1 << 20), isolation_level=i8(0), session_id=i32(session_id), session_epoch=i32(epoch),
            topics=parts, forgotten_topics_data=(), rack_id=""))

    try:
        full = fetch(0, 0, 0)  # a full fetch at epoch 0 opens a session
        assert full.error_code.value == 0 and full.session_id > 0
        [[part]] = [t.partitions for t in full.responses]
        assert part.high_watermark == 3 and part.records
        quiet = fetch(full.session_id, 1, 3)  # caught up, nothing new: the partition is left out
        assert quiet.error_code.value == 0 and quiet.session_id == full.session_id and quiet.responses == ()
        produce_values(cluster, topic, ["d"])
        more = fetch(full.session_id, 2, None)  # named in no request, the session's partition has news
        [[part]] = [t.partitions for t in more.responses]
        assert part.high_watermark == 4 and part.records
        assert fetch(full.session_id, 2, None).error_code.value == 71  # INVALID_FETCH_SESSION_EPOCH
        assert fetch(987654, 1, None).error_code.value == 70  # FETCH_SESSION_ID_NOT_FOUND
        sessionless = fetch(0, -1, 0)  # FINAL epoch without a session: a plain full fetch
        assert sessionless.session_id == 0 and sessionless.responses[0].partitions[0].high_watermark == 4
    finally:
        raw.close()


def test_offset_for_leader_epoch_answers_the_leaders_end_offset(cluster: LocalCluster) -> None:
    from kio.schema.offset_for_leader_epoch.v4 import request as oe
    from kio.schema.types import TopicName

    topic = create_topic(cluster, partitions=1, rf=2)
    produce_values(cluster, topic, ["x", "y"])
    address, _ = leader_address(cluster, topic)
    raw = RawClient(address)
    try:
        resp = raw.call(oe.OffsetForLeaderEpochRequest(replica_id=BrokerId(-1), topics=(oe.OffsetForLeaderTopic(
            topic=TopicName(topic), partitions=(oe.OffsetForLeaderPartition(
                partition=i32(0), current_leader_epoch=i32(-1), leader_epoch=i32(0)),)),)))
        [[p]] = [t.partitions for t in resp.topics]
        assert (p.error_code.value, p.leader_epoch, p.end_offset) == (0, 0, 2)
        resp = raw.call(oe.OffsetForLeaderEpochRequest(replica_id=BrokerId(-1), topics=(oe.OffsetForLeaderTopic(
            topic=TopicName("no-such-topic"), partitions=(oe.OffsetForLeaderPartition(
                partition=i32(0), current_leader_epoch=i32(-1), leader_epoch=i32(0)),)),)))
        assert resp.topics[0].partitions[0].error_code.value == 3  # UNKNOWN_TOPIC_OR_PARTITION
    finally:
        raw.close()


def test_admin_describes_configs_and_cluster(cluster: LocalCluster) -> None:
    from confluent_kafka.admin import ConfigResource

    topic = create_topic(cluster, partitions=1, rf=1)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([res])[res].result(timeout=WAIT_S)
    assert configs["retention.ms"].value == "604800000" and configs["cleanup.policy"].value == "delete"
    desc = admin.describe_cluster().result(timeout=WAIT_S)
    assert sorted(n.id for n in desc.nodes) == [0, 1]
    assert sorted(f"{n.host}:{n.port}" for n in desc.nodes) == sorted(bootstrap(cluster).split(","))


def test_kcat_produces_lists_and_consumes(cluster: LocalCluster) -> None:
    kcat = shutil.which("kcat")
    assert kcat, "kcat from Debian (apt-get install kcat; .ci/run installs it)"
    topic = create_topic(cluster, partitions=1, rf=2)
    bs = bootstrap(cluster)
    put = subprocess.run([kcat, "-b", bs, "-t", topic, "-P", "-K", ":", "-X", "enable.idempotence=true"],
                         input="a:1\nb:2\nc:3\n", capture_output=True, text=True, timeout=WAIT_S)
    assert put.returncode == 0, put.stderr
    meta = subprocess.run([kcat, "-b", bs, "-L", "-J", "-t", topic], capture_output=True, text=True, timeout=WAIT_S)
    assert meta.returncode == 0, meta.stderr
    md = json.loads(meta.stdout)
    assert len(md["brokers"]) == 2 and md["topics"][0]["partitions"][0]["partition"] == 0
    got = subprocess.run([kcat, "-b", bs, "-t", topic, "-C", "-o", "beginning", "-e", "-f", "%k=%s@%o\n"],
                         capture_output=True, text=True, timeout=WAIT_S)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["a=1@0", "b=2@1", "c=3@2"]
    out = cli(cluster, "consume", topic, "--from-beginning", "--max-messages", "3", "--timeout-ms", "20000",
              "--output", "json")
    assert [json.loads(line)["key"] for line in out.stdout.splitlines()] == ["a", "b", "c"]


def test_produce_acks_0_gets_no_response_and_the_next_answer_is_in_order(cluster: LocalCluster) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.produce.v9 import request as pr
    from kio.schema.types import TopicName
    from kio.static.primitive import Records, i16

    from gregor.common.records import build_batch

    topic = create_topic(cluster, partitions=1, rf=2)
    address, _ = leader_address(cluster, topic)
    raw = RawClient(address)
    try:
        batch = build_batch([(b"k", b"fire-and-forget", [], int(time.time() * 1000))])
        produce = pr.ProduceRequest(transactional_id=None, acks=i16(0), timeout=i32Timedelta.parse(
            timedelta(seconds=5)), topic_data=(pr.TopicProduceData(name=TopicName(topic), partition_data=(
                pr.PartitionProduceData(index=i32(0), records=Records(batch)),)),))
        raw.send(produce)  # acks=0: nothing comes back for it
        versions = raw.call(ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        assert versions.error_code.value == 0 and raw.corr == 2  # call() checked the correlation id is 2's
    finally:
        raw.close()
    out = cli(cluster, "consume", topic, "--from-beginning", "--max-messages", "1", "--timeout-ms", "20000",
              "--output", "json")
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()] == ["fire-and-forget"]


def test_standalone_broker_serves_kafka_clients(tmp_path: Any) -> None:
    """No etcd, no controller: the one broker is every Kafka node (Metadata from its own listener)."""
    c = LocalCluster.up(str(tmp_path), brokers=1)
    try:
        assert cli(c, "topics", "create", "solo", "--partitions", "1", "--replication-factor", "1").returncode == 0
        bs = bootstrap(c)
        p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
        for i in range(3):
            p.produce("solo", value=f"s{i}")
        assert p.flush(WAIT_S) == 0
        cons = Consumer({"bootstrap.servers": bs, "group.id": "solo", "enable.auto.commit": False})
        cons.assign([TopicPartition("solo", 0, 0)])
        try:
            assert [m.value() for m in drain(cons, 3)] == [b"s0", b"s1", b"s2"]
        finally:
            cons.close()
    finally:
        c.down()



def zero_copy_bytes(c: LocalCluster) -> float:
    """gregor_kafka_zero_copy_bytes_total summed over the brokers (/metrics)."""
    return broker_metric_total(c, "gregor_kafka_zero_copy_bytes_total ")


@pytest.mark.parametrize("zero_copy", [True, False])
def test_fetch_with_and_without_zero_copy(tmp_path: Any, zero_copy: bool) -> None:
    """kafka.fetch.zero.copy.enable: on (the default) a plain-text Fetch sends the records with sendfile and the
    zero-copy counter counts them; off, the slices are read into the response and the counter stays at 0. Either
    way librdkafka and kafka-python (Fetch v12 flexible, and the legacy v11 kafka-python may pick) read every
    record at its offset."""
    from kafka import KafkaConsumer  # type: ignore[import-untyped]
    from kafka import TopicPartition as KTP

    c = LocalCluster.up(str(tmp_path), brokers=1,
                        broker_overrides={"kafka.fetch.zero.copy.enable": str(zero_copy).lower()})
    try:
        assert cli(c, "topics", "create", "zc", "--partitions", "2", "--replication-factor", "1").returncode == 0
        bs = bootstrap(c)
        p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
        values = [f"zc-{i}-" + "x" * 100 for i in range(2000)]
        for i, v in enumerate(values):
            p.produce("zc", value=v, partition=i % 2)
        assert p.flush(WAIT_S) == 0
        cons = Consumer({"bootstrap.servers": bs, "group.id": "zc", "enable.auto.commit": False})
        cons.assign([TopicPartition("zc", 0, 0), TopicPartition("zc", 1, 0)])
        try:
            got = drain(cons, len(values))
        finally:
            cons.close()
        for part in (0, 1):
            mine = [m for m in got if m.partition() == part]
            assert [m.value().decode() for m in mine] == values[part::2]
            assert [m.offset() for m in mine] == list(range(len(values) // 2))
        kp = KafkaConsumer(bootstrap_servers=bs.split(","), enable_auto_commit=False, consumer_timeout_ms=20000)
        try:
            kp.assign([KTP("zc", 0)])
            kp.seek_to_beginning()
            assert [m.value.decode() for _, m in zip(range(len(values) // 2), kp)] == values[0::2]
        finally:
            kp.close()
        sent = zero_copy_bytes(c)
        assert (sent >= len(values) * 100) if zero_copy else sent == 0, sent
    finally:
        c.down()


def test_metadata_carries_the_topic_id_gregor_shows(cluster: LocalCluster) -> None:
    """KIP-516 through the Kafka listener: librdkafka's describe_topics sees the id `gregor topics describe` prints."""
    from confluent_kafka import TopicCollection

    name = create_topic(cluster, partitions=1, rf=1)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    seen = admin.describe_topics(TopicCollection([name]))[name].result(30).topic_id
    # librdkafka prints a Uuid in standard base64, Kafka's Java tools (and gregor) in the URL-safe alphabet:
    # compare the 16 bytes.
    by_librdkafka = base64.b64decode(str(seen) + "==")
    shown = cli(cluster, "topics", "describe", name)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.split("TopicId:")[1].split()[0]
    assert base64.urlsafe_b64decode(text + "==") == by_librdkafka != bytes(16), (str(seen), shown.stdout)


# ---- stage-1 admin APIs: IncrementalAlterConfigs, DeleteRecords, ElectLeaders ------------------------

def test_admin_incremental_alter_configs_reach_the_controller(cluster: LocalCluster) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    topic = create_topic(cluster, partitions=1, rf=1)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)])
    assert admin.incremental_alter_configs([res])[res].result(timeout=WAIT_S) is None
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    configs = list(described.values())[0].result(timeout=WAIT_S)
    assert configs["retention.ms"].value == "3600000" and configs["cleanup.policy"].value == "delete,compact"
    shown = cli(cluster, "topics", "describe", topic)  # the gRPC side sees the same overrides
    assert "retention.ms=3600000" in shown.stdout, shown.stdout
    undo = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)])
    admin.incremental_alter_configs([undo])[undo].result(timeout=WAIT_S)
    configs = list(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values())[0].result(
        timeout=WAIT_S)
    assert configs["retention.ms"].value == "604800000" and configs["cleanup.policy"].value == "compact"
    broker = ConfigResource(ConfigResource.Type.BROKER, "0", incremental_configs=[
        ConfigEntry("broker.id", "7", incremental_operation=AlterConfigOpType.SET)])  # read-only (KIP-226)
    err = admin.incremental_alter_configs([broker])[broker].exception(timeout=WAIT_S)
    assert err is not None and err.args[0].name() == "INVALID_REQUEST", err


def log_start_offsets(c: LocalCluster, topic: str) -> float:
    """gregor_log_start_offset of `topic` summed over every broker's replicas (/metrics)."""
    total = 0.0
    for p in c.by_role("broker"):
        with urllib.request.urlopen(p.metrics, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("gregor_log_start_offset{") and f'topic="{topic}"' in line:
                    total += float(line.split()[-1])
    return total


def test_admin_delete_records_moves_the_log_start_offset(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=1, rf=2)
    produce_values(cluster, topic, [f"d{i}" for i in range(10)])
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    done = admin.delete_records([TopicPartition(topic, 0, 4)])
    [(tp, fut)] = done.items()
    assert fut.result(timeout=WAIT_S).low_watermark == 4
    c = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": f"dr-{topic}", "enable.auto.commit": False})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (4, 10)
    finally:
        c.close()
    out = cli(cluster, "consume", topic, "--from-beginning", "--max-messages", "6", "--timeout-ms", "20000",
              "--output", "json")
    assert [json.loads(line)["offset"] for line in out.stdout.splitlines()] == list(range(4, 10))
    # The follower takes the leader's log start offset from its next replica fetch: both replicas start at 4.
    wait_for(lambda: log_start_offsets(cluster, topic) == 8, WAIT_S, "both replicas' log start offsets at 4")
    beyond = admin.delete_records([TopicPartition(topic, 0, 11)])
    err = list(beyond.values())[0].exception(timeout=WAIT_S)
    assert err is not None and err.args[0].name() == "OFFSET_OUT_OF_RANGE", err


def test_admin_elect_leaders_relays_to_the_controller(cluster: LocalCluster) -> None:
    from confluent_kafka import ElectionType

    topic = create_topic(cluster, partitions=1, rf=2)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    res = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0), TopicPartition(topic, 7)]).result(
        timeout=WAIT_S)
    by_partition = {tp.partition: err for tp, err in res.items()}
    assert by_partition[0] is not None and by_partition[0].name() == "ELECTION_NOT_NEEDED"
    assert by_partition[7] is not None and by_partition[7].code() == 3  # UNKNOWN_TOPIC_OR_PARTITION
    res = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(topic, 0)]).result(timeout=WAIT_S)
    [err] = res.values()  # the leader is live: an unclean election is not needed either
    assert err is not None and err.name() == "ELECTION_NOT_NEEDED"


def test_kafka_python_deletes_group_offsets(cluster: LocalCluster) -> None:
    """OffsetDelete through kafka-python's admin: an Empty group's offsets go; a consumer group with members keeps
    the offsets of topics it subscribes to (GROUP_SUBSCRIBED_TO_TOPIC), and gRPC's `groups describe` agrees."""
    from kafka import KafkaAdminClient  # type: ignore[import-untyped]
    from kafka import TopicPartition as KTP

    topic = create_topic(cluster, partitions=2, rf=1)
    other = create_topic(cluster, partitions=1, rf=1)
    group = f"od-{topic}"
    c = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": group, "enable.auto.commit": False,
                  "session.timeout.ms": 10000})
    c.subscribe([topic])
    deadline = time.monotonic() + WAIT_S
    while len(c.assignment()) < 2:
        assert time.monotonic() < deadline, "the consumer never got its partitions"
        c.poll(0.2)
    c.commit(offsets=[TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 4), TopicPartition(other, 0, 5)],
             asynchronous=False)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster).split(","))
    try:
        res = admin.delete_group_offsets(group, [KTP(topic, 0), KTP(other, 0)])
        codes = {(tp.topic, tp.partition): err.errno for tp, err in res.items()}  # kafka.errors classes
        assert codes == {(topic, 0): 86, (other, 0): 0}, res  # GROUP_SUBSCRIBED_TO_TOPIC for the subscribed one
        c.close()  # Empty now: every offset may go
        res = admin.delete_group_offsets(group, [KTP(topic, 0)])
        assert [err.errno for err in res.values()] == [0], res
    finally:
        admin.close()
    desc = cli(cluster, "groups", "describe", group, "--output", "json")
    assert desc.returncode == 0, desc.stderr
    rows = json.loads(desc.stdout)["partitions"]
    assert sorted((r["topic"], r["partition"], r["current_offset"]) for r in rows
                  if r["current_offset"] is not None and r["current_offset"] >= 0) == [(topic, 1, 4)], rows


def test_pipelined_acks_all_produce_requests_are_answered_in_order(cluster: LocalCluster) -> None:
    """Five acks=all Produce requests and an ApiVersions sent back to back on one connection (as a client's
    max.in.flight does): the listener appends the Produce requests while earlier ones wait for their ISR,
    and every answer comes back in request order, offsets in the order the batches were sent."""
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.produce.v9 import request as pr
    from kio.schema.produce.v9.response import ProduceResponse
    from kio.schema.types import TopicName
    from kio.serial import entity_reader
    from kio.static.primitive import Records, i16

    from gregor.common.records import build_batch

    topic = create_topic(cluster, partitions=1, rf=2)
    address, _ = leader_address(cluster, topic)
    raw = RawClient(address)
    try:
        for i in range(5):
            batch = build_batch([(b"k", f"pipelined-{i}".encode(), [], int(time.time() * 1000))] * 3)
            raw.send(pr.ProduceRequest(transactional_id=None, acks=i16(-1), timeout=i32Timedelta.parse(
                timedelta(seconds=20)), topic_data=(pr.TopicProduceData(name=TopicName(topic), partition_data=(
                    pr.PartitionProduceData(index=i32(0), records=Records(batch)),)),)))
        raw.send(ApiVersionsRequest(client_software_name="raw", client_software_version="1"))
        answers = []
        for corr in range(1, 7):
            size = struct.unpack(">i", raw._recv(4))[0]
            data = raw._recv(size)
            assert struct.unpack_from(">i", data, 0)[0] == corr  # in request order
            if corr <= 5:
                answers.append(entity_reader(ProduceResponse)(memoryview(data), 5)[0])
    finally:
        raw.close()
    parts = [a.responses[0].partition_responses[0] for a in answers]
    assert [p.error_code.value for p in parts] == [0] * 5
    assert [p.base_offset for p in parts] == [0, 3, 6, 9, 12]
    out = cli(cluster, "consume", topic, "--from-beginning", "--max-messages", "15", "--timeout-ms", "20000",
              "--output", "json")
    assert [json.loads(line)["value"] for line in out.stdout.splitlines()] == \
        [f"pipelined-{i}" for i in range(5) for _ in range(3)]


def offset_fetch_versions(c: LocalCluster, version: int) -> float:
    """gregor_kafka_requests_total{api="OffsetFetch",version} summed over the brokers."""
    return broker_metric_total(c, f'gregor_kafka_requests_total{{api="OffsetFetch",version="{version}"}}')


def test_kafka_python_lists_several_groups_offsets_in_one_offset_fetch_v8(cluster: LocalCluster) -> None:
    """kafka-python's admin list_group_offsets asks for several groups in one OffsetFetch v8 (KIP-709): all of one
    group's offsets (null topics), chosen partitions of another, and a group that has none."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    topic = create_topic(cluster, partitions=2, rf=1)
    groups = {f"of8a-{topic}": {0: 3, 1: 4}, f"of8b-{topic}": {0: 9, 1: 10}}
    for group, offsets in groups.items():
        c = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": group, "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        c.close()
    a, b = groups
    empty = f"of8none-{topic}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster).split(","))
    before = offset_fetch_versions(cluster, 8)
    try:
        got = admin.list_group_offsets({a: None, b: [KTP(topic, 1)], empty: None})
    finally:
        admin.close()
    assert offset_fetch_versions(cluster, 8) > before
    assert {g: {(tp.topic, tp.partition): om.offset for tp, om in offs.items()} for g, offs in got.items()} == {
        a: {(topic, 0): 3, (topic, 1): 4}, b: {(topic, 1): 10}, empty: {}}, got
