"""Streaming reads (exactly-once into a file sink across a restart, maxOffsetsPerTrigger, new partitions) and
batch/streaming writes through the idempotent producer, with Spark for real against a real local cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.spark.conftest import create_topic, produce, run


def _add_partitions(bootstrap: str, topic: str, total: int) -> None:
    from gregor.client import AdminClient

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            await admin.create_partitions(topic, total)
    run(go())


def _start(spark: Any, topic: str, out: str, ckpt: str, max_per_trigger: int) -> Any:
    return (spark.readStream.format("gregor").option("subscribe", topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_per_trigger)).load()
            .selectExpr("partition", "offset", "value")
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
            .trigger(processingTime="0 seconds").start())


def test_stream_exactly_once_across_restart(spark: Any, gregor: Any, tmp_path: Any) -> None:
    topic, out, ckpt = "stream-t", str(tmp_path / "out"), str(tmp_path / "ckpt")
    run(create_topic(gregor.bootstrap, topic, 2))
    sent = run(produce(gregor.bootstrap, topic, [{"value": f"a{i}".encode(), "partition": i % 2} for i in range(60)]))
    q = _start(spark, topic, out, ckpt, 7)
    deadline = time.monotonic() + 120
    while sum(p["numInputRows"] for p in q.recentProgress) < 14 and time.monotonic() < deadline:
        time.sleep(0.2)
    q.stop()  # stopped with records still to read
    first = [p["numInputRows"] for p in q.recentProgress]
    assert 14 <= sum(first) < 60 and max(first) <= 7  # maxOffsetsPerTrigger caps every micro-batch

    # A partition added and more records while the query is down: the restart picks them up.
    _add_partitions(gregor.bootstrap, topic, 3)
    sent += run(produce(gregor.bootstrap, topic, [{"value": f"b{i}".encode(), "partition": i % 3} for i in range(30)]))
    q = _start(spark, topic, out, ckpt, 25)
    q.processAllAvailable()
    q.stop()
    assert max(p["numInputRows"] for p in q.recentProgress) <= 25
    rows = [(r.partition, r.offset, r.value) for r in spark.read.parquet(out).collect()]
    assert len(rows) == len(set(rows)) == 90  # every record exactly once
    assert sorted(rows) == sorted((r["partition"], r["offset"], r["value"]) for r in sent)


def test_batch_write_round_trip(spark: Any, gregor: Any) -> None:
    topic = "write-t"
    run(create_topic(gregor.bootstrap, topic, 3))
    data = [(f"k{i}".encode(), f"v{i}".encode() * (i % 5), [("h", str(i).encode())], i % 3) for i in range(200)]
    df = spark.createDataFrame(data, "key binary, value binary, headers array<struct<key:string,value:binary>>, "
                                     "partition int")
    df.write.format("gregor").option("topic", topic).mode("append").save()
    back = spark.read.format("gregor").option("subscribe", topic).option("includeHeaders", "true").load()
    got = sorted((r.key, r.value, [(h.key, h.value) for h in r.headers], r.partition) for r in back.collect())
    assert got == sorted((k, v, h, p) for k, v, h, p in data)
    # A topic column instead of the option; string values as Spark's Kafka sink takes them.
    run(create_topic(gregor.bootstrap, "write-a", 1))
    run(create_topic(gregor.bootstrap, "write-b", 1))
    rows = spark.createDataFrame([("write-a" if i % 2 else "write-b", f"s{i}") for i in range(20)], "topic string, value string")
    rows.write.format("gregor").mode("append").save()
    for t, parity in (("write-a", 1), ("write-b", 0)):
        vals = {r.value.decode() for r in spark.read.format("gregor").option("subscribe", t).load().collect()}
        assert vals == {f"s{i}" for i in range(20) if i % 2 == parity}


def test_stream_write_round_trip(spark: Any, gregor: Any, tmp_path: Any) -> None:
    src, dst = "swrite-src", "swrite-dst"
    run(create_topic(gregor.bootstrap, src, 2))
    run(create_topic(gregor.bootstrap, dst, 2))
    run(produce(gregor.bootstrap, src, [{"key": f"k{i}".encode(), "value": f"v{i}".encode()} for i in range(50)]))
    q = (spark.readStream.format("gregor").option("subscribe", src).option("startingOffsets", "earliest").load()
         .selectExpr("key", "upper(cast(value as string)) as value")
         .writeStream.format("gregor").option("topic", dst).option("checkpointLocation", str(tmp_path / "c")).start())
    q.processAllAvailable()
    q.stop()
    got = sorted((r.key, r.value) for r in spark.read.format("gregor").option("subscribe", dst).load().collect())
    assert got == sorted((f"k{i}".encode(), f"V{i}".encode()) for i in range(50))


def test_write_error_names_the_broker_error(spark: Any, gregor: Any) -> None:
    topic = "write-small"
    run(create_topic(gregor.bootstrap, topic, 1, {"max.message.bytes": "1000"}))
    df = spark.createDataFrame([(b"x" * 5000,)], "value binary")
    with pytest.raises(Exception, match="MESSAGE_TOO_LARGE"):
        df.write.format("gregor").option("topic", topic).mode("append").save()


def test_available_now_reads_what_was_there_and_stops(spark: Any, gregor: Any, tmp_path: Any) -> None:
    topic, out = "avail-t", str(tmp_path / "out")
    run(create_topic(gregor.bootstrap, topic, 2))
    run(produce(gregor.bootstrap, topic, [{"value": f"n{i}".encode()} for i in range(40)]))
    q = (spark.readStream.format("gregor").option("subscribe", topic).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "15").load().selectExpr("partition", "offset")
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "c"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120)  # the query ends by itself once the target offsets are read
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(batches) == 40 and max(batches) <= 15 and len(batches) >= 3
    assert spark.read.parquet(out).count() == 40
