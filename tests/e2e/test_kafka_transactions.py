"""Kafka wire protocol, second stage (issue 22): transactions (KIP-98) and read_committed through the brokers'
Kafka listeners, proven with confluent-kafka (librdkafka) and raw kio requests against a real local cluster
(etcd, controller, 2 brokers, a group/transaction coordinator). Both APIs see the same transactions: a
librdkafka transaction is read back by Gregor's own read_committed consumer and listed by
`gregor transactions list`. Every test talks to the Kafka listeners, so each fails without them.
"""

from __future__ import annotations

import gc
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from gregor.cli.local_cluster import LocalCluster
from tests.helpers.wait import wait_for
from tests.e2e.test_kafka_protocol import (RawClient as FlexibleRawClient, WAIT_S, bootstrap, cli, create_topic, drain,
                                           zero_copy_bytes)


class RawClient(FlexibleRawClient):
    """The protocol test's raw connection, also for non-flexible versions (header v1, response header v0)."""

    def call(self, request: Any) -> Any:
        import io
        import struct

        from kio.index import load_response_from_request
        from kio.serial import entity_reader, entity_writer

        if type(request).__flexible__:
            return super().call(request)
        self.corr += 1
        out = io.BytesIO()
        out.write(struct.pack(">hhih", request.__api_key__, request.__version__, self.corr, 3) + b"raw")
        entity_writer(type(request))(out, request)
        frame = out.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        data = self._recv(struct.unpack(">i", self._recv(4))[0])
        assert struct.unpack_from(">i", data, 0)[0] == self.corr
        value, _ = entity_reader(load_response_from_request(request))(memoryview(data), 4)
        return value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("kafka-txn")), brokers=2, controllers=1, coordinators=1)
    try:
        yield c
    finally:
        gc.collect()  # librdkafka handles the tests dropped are destroyed while their brokers still answer
        c.down()


def txn_producer(c: LocalCluster, tid: str) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap(c), "transactional.id": tid, "transaction.timeout.ms": 60000})
    p.init_transactions(WAIT_S)  # the first one also has the coordinator create __transaction_state
    return p


def committed_consumer(c: LocalCluster, group: str, isolation: str = "read_committed") -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap(c), "group.id": group, "enable.auto.commit": False,
                     "isolation.level": isolation, "auto.offset.reset": "earliest"})


def read_all(c: LocalCluster, topic: str, partitions: int, isolation: str) -> list[bytes]:
    """Every record a consumer of this isolation level gets, read until it reaches the partitions' ends."""
    # The ends are high watermarks (a read_committed consumer's own watermarks would be LSOs, which lag while a
    # committed transaction's markers are still being written): a read_committed consumer only gets past a
    # transaction's records once its marker is there.
    hw = committed_consumer(c, f"hw-{uuid.uuid4().hex[:6]}", "read_uncommitted")
    try:
        ends = {p: hw.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        hw.close()
    cons = committed_consumer(c, f"reader-{uuid.uuid4().hex[:6]}", isolation)
    cons.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    at = {p: 0 for p in range(partitions)}
    deadline = time.monotonic() + WAIT_S
    try:
        # read_committed stops at the LSO and skips aborted records and markers: poll until positions pass ends
        while time.monotonic() < deadline:
            m = cons.poll(0.3)
            if m is not None:
                assert m.error() is None or m.error().code() == KafkaError._PARTITION_EOF, m.error()
                if m.error() is None:
                    got.append(m.value())
                    at[m.partition()] = m.offset() + 1
            pos = {tp.partition: tp.offset for tp in cons.position([TopicPartition(topic, p) for p in range(partitions)])}
            if all(pos[p] >= ends[p] for p in range(partitions)):
                break
        else:
            raise AssertionError(f"{isolation} consumer stuck at {pos}, ends {ends}")
    finally:
        cons.close()
    return got


def grpc_consume(c: LocalCluster, topic: str, n: int, isolation: str) -> list[str]:
    out = cli(c, "consume", topic, "--from-beginning", "--max-messages", str(n), "--timeout-ms", "20000",
              "--isolation-level", isolation, "--output", "json")
    return [json.loads(line)["value"] for line in out.stdout.splitlines() if line.strip()]


def test_librdkafka_transactions_commit_and_abort_seen_alike_by_both_apis(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=2)
    tid = f"tx-{topic}"
    p = txn_producer(cluster, tid)
    try:
        p.begin_transaction()
        for i in range(6):
            p.produce(topic, value=f"c1-{i}", partition=i % 2)
        p.commit_transaction(WAIT_S)
        p.begin_transaction()
        for i in range(4):
            p.produce(topic, value=f"ab-{i}", partition=i % 2)
        p.flush(WAIT_S)  # written to the log (and visible read_uncommitted) before the abort
        p.abort_transaction(WAIT_S)
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, value=f"c2-{i}", partition=i % 2)
        p.commit_transaction(WAIT_S)
    finally:
        p.flush(5)
    committed = sorted([f"c1-{i}" for i in range(6)] + [f"c2-{i}" for i in range(3)])
    aborted = [f"ab-{i}" for i in range(4)]
    assert sorted(v.decode() for v in read_all(cluster, topic, 2, "read_committed")) == committed
    assert sorted(v.decode() for v in read_all(cluster, topic, 2, "read_uncommitted")) == sorted(committed + aborted)
    # Gregor's own gRPC consumer sees the same transactions.
    # (9 asked: in each partition the aborted records lie between the two committed transactions, so a consumer
    # that let them through would stop before the second transaction's records.)
    assert sorted(grpc_consume(cluster, topic, 9, "read_committed")) == committed
    assert sorted(grpc_consume(cluster, topic, 13, "read_uncommitted")) == sorted(committed + aborted)
    # ...and the gRPC admin lists the Kafka client's transactional id.
    listed = cli(cluster, "transactions", "list", "--output", "json")
    assert listed.returncode == 0, listed.stderr
    assert tid in listed.stdout


def test_list_offsets_read_committed_stops_at_the_open_transaction(cluster: LocalCluster) -> None:
    """ListOffsets with isolation level (v2+): latest is the LSO for read_committed while a transaction is open;
    DescribeProducers shows the open transaction's first offset; DescribeTransactions / ListTransactions show it."""
    from confluent_kafka import IsolationLevel
    from confluent_kafka.admin import AdminClient, OffsetSpec

    topic = create_topic(cluster, partitions=1)
    tid = f"tx-{topic}"
    plain = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True})
    for i in range(3):
        plain.produce(topic, value=f"p{i}", partition=0)
    assert plain.flush(WAIT_S) == 0
    p = txn_producer(cluster, tid)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, value=f"t{i}", partition=0)
    p.flush(WAIT_S)
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    tp = TopicPartition(topic, 0)

    def latest(level: Any) -> int:
        res = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)
        return int(res[tp].result(timeout=WAIT_S).offset)

    try:
        assert latest(IsolationLevel.READ_UNCOMMITTED) == 5 and latest(IsolationLevel.READ_COMMITTED) == 3
        # kafka-python's admin: DescribeProducers to the leader, DescribeTransactions to the id's coordinator
        # (FindCoordinator TRANSACTION), ListTransactions to every broker (answers concatenated).
        from kafka import KafkaAdminClient  # type: ignore[import-untyped]
        from kafka import TopicPartition as KTP

        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster).split(","))
        try:
            [state] = kadmin.describe_producers([KTP(topic, 0)]).values()
            open_txns = [s for s in state.active_producers if s.current_transaction_start_offset >= 0]
            assert [s.current_transaction_start_offset for s in open_txns] == [3]
            described = kadmin.describe_transactions([tid])[tid]
            assert str(getattr(described.state, "value", described.state)) == "Ongoing"
            assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {(topic, 0)}
            assert described.producer_id == open_txns[0].producer_id
            listed = [x for per_broker in kadmin.list_transactions(state_filters=["Ongoing"]).values()
                      for x in per_broker]
            assert [x.transactional_id for x in listed].count(tid) == 1  # every broker asked, listed once
            assert all(str(getattr(x.state, "value", x.state)) == "Ongoing" for x in listed)
        finally:
            kadmin.close()
        p.commit_transaction(WAIT_S)
        # 3 records, 2 transactional, their COMMIT marker
        wait_for(lambda: latest(IsolationLevel.READ_COMMITTED) == 6, WAIT_S, "the LSO past the committed transaction")
    finally:
        p.flush(5)


def describe_transactions_request(tid: str) -> Any:
    from kio.schema.describe_transactions.v0 import request as dt
    from kio.schema.types import TransactionalId

    return dt.DescribeTransactionsRequest(transactional_ids=(TransactionalId(tid),))


def test_consume_transform_produce_commits_offsets_with_the_transaction(cluster: LocalCluster) -> None:
    src = create_topic(cluster, partitions=2)
    dst = create_topic(cluster, partitions=2)
    group = f"ctp-{src}"
    plain = Producer({"bootstrap.servers": bootstrap(cluster), "enable.idempotence": True})
    for i in range(10):
        plain.produce(src, value=f"in{i}", partition=i % 2)
    assert plain.flush(WAIT_S) == 0
    cons = committed_consumer(cluster, group)
    cons.subscribe([src])
    p = txn_producer(cluster, f"tx-{group}")
    try:
        # First round: transformed and offsets sent, but aborted: neither the output nor the offsets stay.
        batch = drain(cons, 10)
        assert len(batch) == 10
        p.begin_transaction()
        for m in batch:
            p.produce(dst, value=m.value().upper(), partition=m.partition())
        p.send_offsets_to_transaction(cons.position(cons.assignment()), cons.consumer_group_metadata(), WAIT_S)
        # While the transaction holds the group's offsets, a require_stable OffsetFetch is told to wait.
        assert offset_fetch_stable_code(cluster, group, src) == 88  # UNSTABLE_OFFSET_COMMIT
        assert offset_fetch_stable_code(cluster, group, dst) == 0  # no offsets pending there: stable
        p.abort_transaction(WAIT_S)
        # Stable again once the abort's markers are written (EndTxn answers when the decision is durable).
        wait_for(lambda: offset_fetch_stable_code(cluster, group, src) == 0, WAIT_S, "the group's offsets stable")
        # Second round: the same input again (rewound to the committed offsets, none), committed.
        for tp in cons.assignment():
            cons.seek(TopicPartition(src, tp.partition, 0))
        batch = drain(cons, 10)
        assert sorted(m.value() for m in batch) == sorted(f"in{i}".encode() for i in range(10))
        p.begin_transaction()
        for m in batch:
            p.produce(dst, value=m.value().upper(), partition=m.partition())
        p.send_offsets_to_transaction(cons.position(cons.assignment()), cons.consumer_group_metadata(), WAIT_S)
        p.commit_transaction(WAIT_S)
    finally:
        cons.close()
        p.flush(5)
    out = read_all(cluster, dst, 2, "read_committed")
    assert sorted(out) == sorted(f"IN{i}".encode() for i in range(10)), (out, read_all(cluster, dst, 2, "read_uncommitted"))
    desc = cli(cluster, "groups", "describe", group, "--output", "json")
    assert desc.returncode == 0, desc.stderr
    rows = json.loads(desc.stdout)["partitions"]
    assert sorted((r["partition"], r["current_offset"]) for r in rows) == [(0, 5), (1, 5)]
    # A librdkafka consumer of the group starts at the transaction's offsets.
    again = committed_consumer(cluster, group)
    try:
        committed = again.committed([TopicPartition(src, 0), TopicPartition(src, 1)], timeout=WAIT_S)
        assert sorted((tp.partition, tp.offset) for tp in committed) == [(0, 5), (1, 5)]
    finally:
        again.close()


def offset_fetch_stable_code(c: LocalCluster, group: str, topic: str) -> int:
    """OffsetFetch v7 with require_stable through a raw connection: partition 0's error code."""
    from kio.schema.offset_fetch.v7 import request as of
    from kio.schema.types import GroupId, TopicName
    from kio.static.primitive import i32

    raw = RawClient(bootstrap(c).split(",")[0])
    try:
        resp = raw.call(of.OffsetFetchRequest(group_id=GroupId(group), require_stable=True, topics=(
            of.OffsetFetchRequestTopic(name=TopicName(topic), partition_indexes=(i32(0),)),)))
    finally:
        raw.close()
    assert resp.error_code.value == 0
    return int(resp.topics[0].partitions[0].error_code.value)


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=1)
    tid = f"tx-{topic}"
    first = txn_producer(cluster, tid)
    first.begin_transaction()
    first.produce(topic, value="zombie", partition=0)
    first.flush(WAIT_S)
    second = txn_producer(cluster, tid)  # bumps the epoch, aborts the first one's open transaction
    second.begin_transaction()
    second.produce(topic, value="winner", partition=0)
    second.commit_transaction(WAIT_S)
    with pytest.raises(KafkaException) as caught:
        first.produce(topic, value="late", partition=0)
        first.commit_transaction(WAIT_S)
    err = caught.value.args[0]
    assert err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                         KafkaError.INVALID_PRODUCER_EPOCH), err
    assert [v.decode() for v in read_all(cluster, topic, 1, "read_committed")] == ["winner"]
    # Raw: an EndTxn with the old epoch is PRODUCER_FENCED (v4), INVALID_PRODUCER_EPOCH for v1.
    raw = RawClient(bootstrap(cluster).split(",")[0])
    try:
        described = raw.call(describe_transactions_request(tid)).transaction_states[0]
        assert described.producer_epoch >= 1
        codes = [raw.call(end_txn_request(v, tid, described.producer_id, described.producer_epoch - 1)).error_code.value
                 for v in (4, 1)]
        # KIP-360: InitProducerId naming an old epoch must not fence the current instance in turn.
        init_codes = [raw.call(init_producer_id_request(v, tid, described.producer_id, described.producer_epoch - 1)
                               ).error_code.value for v in (4, 3)]
        after = raw.call(describe_transactions_request(tid)).transaction_states[0]
    finally:
        raw.close()
    assert codes == [90, 47] and init_codes == [90, 47]
    assert (after.producer_id, after.producer_epoch) == (described.producer_id, described.producer_epoch)


def end_txn_request(version: int, tid: str, pid: int, epoch: int) -> Any:
    import importlib

    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i16

    mod = importlib.import_module(f"kio.schema.end_txn.v{version}.request")
    return mod.EndTxnRequest(transactional_id=TransactionalId(tid), producer_id=ProducerId(pid),
                             producer_epoch=i16(epoch), committed=True)


def test_grpc_transactions_are_read_and_fenced_through_the_kafka_listener(cluster: LocalCluster) -> None:
    """The other direction: Gregor's own gRPC transactional producer commits and aborts, librdkafka's
    read_committed consumer sees only the committed records, kafka-python's admin describes the gRPC
    producer's transaction, and a librdkafka producer with the same transactional.id fences it."""
    from kafka import KafkaAdminClient  # type: ignore[import-untyped]

    from gregor.client.producer import SyncProducer
    from gregor.common import errors

    topic = create_topic(cluster, partitions=1)
    tid = f"grpc-tx-{topic}"
    g = SyncProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "acks": "all"})
    try:
        g.init_transactions()
        g.begin_transaction()
        for i in range(3):
            g.send(topic, f"kept{i}".encode(), partition=0)
        g.commit_transaction()
        g.begin_transaction()
        for i in range(2):
            g.send(topic, f"dropped{i}".encode(), partition=0)
        g.flush()
        g.abort_transaction()
        assert [v.decode() for v in read_all(cluster, topic, 1, "read_committed")] == [f"kept{i}" for i in range(3)]
        g.begin_transaction()
        g.send(topic, b"fenced", partition=0)
        g.flush()
        kadmin = KafkaAdminClient(bootstrap_servers=bootstrap(cluster).split(","))
        try:
            described = kadmin.describe_transactions([tid])[tid]
            assert str(getattr(described.state, "value", described.state)) == "Ongoing"
        finally:
            kadmin.close()
        k = txn_producer(cluster, tid)  # librdkafka's InitProducerId fences the gRPC producer
        k.begin_transaction()
        k.produce(topic, value="from-librdkafka", partition=0)
        k.commit_transaction(WAIT_S)
        with pytest.raises(errors.GregorError) as caught:
            g.commit_transaction()
        assert caught.value.code in (errors.Code.PRODUCER_FENCED, errors.Code.INVALID_PRODUCER_EPOCH), caught.value
    finally:
        try:
            g.close()
        except errors.GregorError:
            pass
    assert [v.decode() for v in read_all(cluster, topic, 1, "read_committed")] == [
        *(f"kept{i}" for i in range(3)), "from-librdkafka"]


def init_producer_id_request(version: int, tid: str, pid: int, epoch: int) -> Any:
    import importlib
    from datetime import timedelta

    from kio.schema.types import ProducerId, TransactionalId
    from kio.static.primitive import i16, i32Timedelta

    mod = importlib.import_module(f"kio.schema.init_producer_id.v{version}.request")
    return mod.InitProducerIdRequest(transactional_id=TransactionalId(tid), transaction_timeout=i32Timedelta.parse(
        timedelta(seconds=60)), producer_id=ProducerId(pid), producer_epoch=i16(epoch))


def test_read_committed_fetches_go_by_sendfile_on_plain_text(cluster: LocalCluster) -> None:
    """Fetch on a plain-text listener sends the records with sendfile (kafka/zero_copy.py): librdkafka reads
    several partitions' committed records, aborted ones skipped, each value at its place, and the brokers'
    zero-copy counter grew by at least the committed values' bytes (with kafka.fetch.zero.copy.enable=false it
    stays put: test_kafka_protocol's test_fetch_with_and_without_zero_copy)."""
    topic = create_topic(cluster, partitions=3)
    p = txn_producer(cluster, f"tx-{topic}")
    value = "v" * 200
    try:
        for round_ in range(4):  # committed, aborted, committed, aborted
            p.begin_transaction()
            for i in range(300):
                p.produce(topic, value=f"{round_}-{i}-{value}", partition=i % 3)
            p.flush(WAIT_S)
            if round_ % 2:
                p.abort_transaction(WAIT_S)
            else:
                p.commit_transaction(WAIT_S)
    finally:
        p.flush(5)
    before = zero_copy_bytes(cluster)
    got = [v.decode() for v in read_all(cluster, topic, 3, "read_committed")]
    committed = [f"{r}-{i}-{value}" for r in (0, 2) for i in range(300)]
    assert sorted(got) == sorted(committed)
    for part in range(3):  # within a partition in produce order
        mine = [v for v in got if int(v.split("-")[1]) % 3 == part]
        assert mine == [v for v in committed if int(v.split("-")[1]) % 3 == part]
    assert zero_copy_bytes(cluster) - before >= len(committed) * len(value)
