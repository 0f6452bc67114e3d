"""Spark's own Kafka source and sink (format("kafka"), spark-sql-kafka-0-10 with its kafka-clients) against
Gregor's Kafka listener (issue 22, point 5): a DataFrame written with format("kafka") is read back with
format("kafka") in batch mode and by a streaming query with a checkpoint, and through Gregor's own gRPC
data source the same records sit at the same offsets. Spark in local mode, a real local cluster; every read
and write goes through the Kafka listener, so each fails without it.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.spark.conftest import create_topic, run

# Each test runs several Spark jobs (a write, reads, a streaming query twice): on the shared 2-core machine the
# first Kafka job alone loads hundreds of classes; the suite-wide 300 s includes the session's start.
pytestmark = pytest.mark.timeout(600)


def kafka_bootstrap(gregor: Any) -> str:
    return str(gregor.to_json()["kafka_bootstrap"])


def write_kafka(spark: Any, bootstrap: str, topic: str, rows: list[tuple[str, str]]) -> None:
    (spark.createDataFrame(rows, "key string, value string").write.format("kafka")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.enable.idempotence", "true").option("kafka.acks", "all").save())


def read_kafka(spark: Any, bootstrap: str, topic: str) -> list[tuple[int, int, str, str]]:
    df = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    return sorted((r.partition, r.offset, r.key.decode(), r.value.decode()) for r in
                  df.select("partition", "offset", "key", "value").collect())


def test_kafka_sink_then_kafka_source_batch_round_trip(spark: Any, gregor: Any) -> None:
    bootstrap, topic = kafka_bootstrap(gregor), f"sk-{uuid.uuid4().hex[:8]}"
    run(create_topic(gregor.bootstrap, topic, 3))
    rows = [(f"k{i % 10}", f"value-{i}") for i in range(300)]
    write_kafka(spark, bootstrap, topic, rows)
    got = read_kafka(spark, bootstrap, topic)
    assert len(got) == 300 and sorted((k, v) for _, _, k, v in got) == sorted(rows)
    by_partition: dict[int, list[int]] = {}
    for p, o, _, _ in got:
        by_partition.setdefault(p, []).append(o)
    assert len(by_partition) > 1 and all(sorted(o) == list(range(len(o))) for o in by_partition.values())
    keys_in = {k: {p for p, _, kk, _ in got if kk == k} for k in {k for k, _ in rows}}
    assert all(len(ps) == 1 for ps in keys_in.values())  # Kafka's partitioner: a key stays in one partition
    # The same records at the same offsets through Gregor's own gRPC source.
    grpc = sorted((r.partition, r.offset, r.key.decode(), r.value.decode()) for r in
                  spark.read.format("gregor").option("subscribe", topic).load()
                  .select("partition", "offset", "key", "value").collect())
    assert grpc == got


def test_kafka_source_streaming_query_resumes_from_its_checkpoint(spark: Any, gregor: Any, tmp_path: Any) -> None:
    bootstrap = kafka_bootstrap(gregor)
    source, sink = f"ss-{uuid.uuid4().hex[:8]}", f"sd-{uuid.uuid4().hex[:8]}"
    run(create_topic(gregor.bootstrap, source, 2))
    run(create_topic(gregor.bootstrap, sink, 2))
    checkpoint = str(tmp_path / "checkpoint")

    def copy_available() -> int:
        """One availableNow run of a Kafka-to-Kafka streaming query (upper-cased values), from the checkpoint."""
        q = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "40").load()
             .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
             .writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
        q.awaitTermination(240)
        assert not q.isActive and q.exception() is None, q.exception()
        return sum(p["numInputRows"] for p in q.recentProgress)

    first = [(f"k{i % 6}", f"a{i}") for i in range(100)]
    write_kafka(spark, bootstrap, source, first)
    assert copy_available() == 100  # in micro-batches of at most 40
    second = [(f"k{i % 6}", f"b{i}") for i in range(50)]
    write_kafka(spark, bootstrap, source, second)
    assert copy_available() == 50  # the checkpoint's offsets: only what is new
    got = read_kafka(spark, bootstrap, sink)
    assert sorted((k, v) for _, _, k, v in got) == sorted((k, v.upper()) for k, v in first + second)


def test_kafka_source_read_committed_skips_an_aborted_transaction(spark: Any, gregor: Any) -> None:
    """Spark's `kafka` source with kafka.isolation.level=read_committed (Fetch's LSO and aborted transactions,
    ListOffsets' LSO through the listener): of an aborted and then a committed transaction, written by
    librdkafka's transactional producer, only the committed values; the default (read_uncommitted) reads both."""
    from confluent_kafka import Producer

    bootstrap, topic = kafka_bootstrap(gregor), f"sk-{uuid.uuid4().hex[:8]}"
    run(create_topic(gregor.bootstrap, topic, 1))
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(60)
    for outcome, written in (("abort", ["aborted-1", "aborted-2"]), ("commit", ["committed-1", "committed-2"])):
        producer.begin_transaction()
        for v in written:
            producer.produce(topic, key=outcome, value=v)
        producer.flush(60)
        if outcome == "abort":
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)

    def values(isolation: str | None) -> list[str]:
        reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
                  .option("startingOffsets", "earliest").option("endingOffsets", "latest"))
        if isolation is not None:
            reader = reader.option("kafka.isolation.level", isolation)
        return [r.value.decode() for r in reader.load().orderBy("offset").select("value").collect()]

    assert values("read_committed") == ["committed-1", "committed-2"]
    assert values(None) == ["aborted-1", "aborted-2", "committed-1", "committed-2"]
