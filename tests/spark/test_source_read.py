"""The `gregor` data source read with Spark for real (local[2]) from a real local cluster: schema equal to
Spark's Kafka source, batch reads equal row for row to what was produced across codecs, offset options."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                               TimestampType)

from tests.spark.conftest import create_topic, produce, run

# Spark's Kafka source schema, as KafkaRecordToRowConverter declares it (every field nullable).
KAFKA_SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType()),
                           StructField("topic", StringType()), StructField("partition", IntegerType()),
                           StructField("offset", LongType()), StructField("timestamp", TimestampType()),
                           StructField("timestampType", IntegerType())])
KAFKA_HEADERS = StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                             StructField("value", BinaryType())])))
BASE_TS = 1_760_000_000_000


def ORDER(row: tuple[Any, ...]) -> tuple[str, int, int]:  # noqa: N802 - (topic, partition, offset)
    return row[4], row[0], row[1]


def records(n: int, tag: str) -> list[dict[str, Any]]:
    """Keys (some null), values of varied size (one empty, one null), headers (one with an empty value)."""
    out = []
    for i in range(n):
        headers = [("h", f"{tag}{i}".encode()), ("e", b"")] if i % 3 == 0 else []
        out.append({"key": None if i % 5 == 0 else f"k{i % 7}".encode(),
                    "value": None if i == 7 else b"" if i == 8 else f"{tag}-{i}-".encode() * (i % 4 + 1),
                    "headers": headers, "timestamp": BASE_TS + i * 1000})
    return out


def expected_rows(topic: str, sent: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(((r["partition"], r["offset"], r["key"], r["value"], topic,
                    datetime.datetime.fromtimestamp(r["timestamp"] / 1000, datetime.timezone.utc).replace(tzinfo=None),
                    0, [(k, v) for k, v in r["headers"]]) for r in sent), key=ORDER)


def got_rows(rows: list[Any]) -> list[tuple[Any, ...]]:
    return sorted(((r.partition, r.offset, r.key, r.value, r.topic, r.timestamp, r.timestampType,
                    [(h.key, h.value) for h in r.headers]) for r in rows), key=ORDER)


def test_schema_is_sparks_kafka_schema(spark: Any, gregor: Any) -> None:
    run(create_topic(gregor.bootstrap, "schema-t", 1))
    df = spark.read.format("gregor").option("subscribe", "schema-t").load()
    assert df.schema == KAFKA_SCHEMA
    with_headers = spark.read.format("gregor").option("subscribe", "schema-t").option("includeHeaders", "true").load()
    assert with_headers.schema == StructType(KAFKA_SCHEMA.fields + [KAFKA_HEADERS])


CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def test_batch_read_equals_what_was_produced_across_codecs(spark: Any, gregor: Any) -> None:
    """One topic per codec, read together through subscribePattern (one Spark job for all five)."""
    expected = []
    for codec in CODECS:
        topic = f"codec-{codec}"
        run(create_topic(gregor.bootstrap, topic, 3))
        sent = run(produce(gregor.bootstrap, topic, records(60, codec), **{"compression.type": codec}))
        expected += expected_rows(topic, sent)
    df = spark.read.format("gregor").option("subscribePattern", "codec-.*").option("includeHeaders", "true").load()
    rows = df.collect()
    assert got_rows(rows) == sorted(expected, key=ORDER)
    # The aggregate path (no rows back to Python) sees the same data.
    n, size = df.selectExpr("count(*)", "sum(length(value))").first()
    assert (n, size) == (300, sum(len(r[3] or b"") for r in expected))


def test_offsets_json_timestamps_and_min_partitions(spark: Any, gregor: Any) -> None:
    topic = "offsets-t"
    run(create_topic(gregor.bootstrap, topic, 2))
    sent = run(produce(gregor.bootstrap, topic, [{**r, "partition": i % 2} for i, r in enumerate(records(40, "o"))]))
    by_tp = {(r["partition"], r["offset"]) for r in sent}
    assert len(by_tp) == 40

    def offsets(df: Any) -> set[tuple[int, int]]:
        return {(r.partition, r.offset) for r in df.select("partition", "offset").collect()}

    reader = spark.read.format("gregor").option("subscribe", topic)
    # Per-partition JSON with -2 (earliest) and -1 (latest) as Spark's Kafka source takes it.
    df = (reader.option("startingOffsets", '{"offsets-t":{"0":5,"1":-2}}')
          .option("endingOffsets", '{"offsets-t":{"0":-1,"1":7}}').load())
    assert offsets(df) == {(0, o) for o in range(5, 20)} | {(1, o) for o in range(0, 7)}
    # minPartitions splits the ranges; the rows stay the same.
    split = spark.read.format("gregor").option("subscribe", topic).option("minPartitions", "7").load()
    assert split.rdd.getNumPartitions() >= 7
    assert offsets(split) == by_tp
    # startingTimestamp: record i has timestamp BASE_TS + i s; records 30.. are at or after BASE_TS + 30 s.
    ts = spark.read.format("gregor").option("subscribe", topic).option("startingTimestamp", str(BASE_TS + 30_000)).load()
    assert offsets(ts) == {(r["partition"], r["offset"]) for r in sent if r["timestamp"] >= BASE_TS + 30_000}
    # assign and subscribePattern pick partitions and topics.
    assigned = spark.read.format("gregor").option("assign", '{"offsets-t":[1]}').load()
    assert offsets(assigned) == {tp for tp in by_tp if tp[0] == 1}
    pattern = spark.read.format("gregor").option("subscribePattern", "offsets-.*").load()
    assert offsets(pattern) == by_tp


def test_batch_ranges_are_fixed_at_planning(spark: Any, gregor: Any) -> None:
    """A DataFrame planned before more records arrive reads the same records again (capped at the HW)."""
    topic = "fixed-t"
    run(create_topic(gregor.bootstrap, topic, 1))
    run(produce(gregor.bootstrap, topic, records(10, "a")))
    df = spark.read.format("gregor").option("subscribe", topic).load().cache()
    assert df.count() == 10
    run(produce(gregor.bootstrap, topic, records(5, "b")))
    assert df.count() == 10
    assert spark.read.format("gregor").option("subscribe", topic).load().count() == 15
