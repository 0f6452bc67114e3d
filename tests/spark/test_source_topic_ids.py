"""Topic ids (KIP-516) in the Spark source: a topic deleted and re-created under its name while a query
reads it fails the query clearly instead of reading the new topic at the old topic's offsets."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gregor_spark import ranges
from gregor_spark.cluster import GregorCluster
from gregor_spark.options import parse_source
from tests.spark.conftest import create_topic, produce, run


def _recreate(bootstrap: str, topic: str) -> None:
    from gregor.client import AdminClient

    async def go() -> None:
        async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            await admin.delete_topic(topic)
            deadline = time.monotonic() + 60
            while True:  # the name is free once the deletion is done
                try:
                    await admin.create_topic(topic, 1, 1)
                    return
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    run(go())


def _query(spark: Any, topic: str, tmp_path: Any) -> Any:
    return (spark.readStream.format("gregor").option("subscribe", topic).option("startingOffsets", "earliest")
            .load().selectExpr("offset", "value").writeStream.format("parquet").option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="0 seconds").start())


def test_stream_fails_when_its_topic_is_recreated(spark: Any, gregor: Any, tmp_path: Any) -> None:
    """The checkpointed offsets carry the topic id: a query restarted after its topic was deleted and
    re-created (more records than before, so the old offsets are all valid) fails, naming both ids.
    (A deletion seen by a running query is Spark's data loss, "is gone", as before.)"""
    topic = "ids-stream"
    run(create_topic(gregor.bootstrap, topic, 1))
    run(produce(gregor.bootstrap, topic, [{"value": f"a{i}".encode(), "partition": 0} for i in range(10)]))
    q = _query(spark, topic, tmp_path)
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert spark.read.parquet(str(tmp_path / "out")).count() == 10
    _recreate(gregor.bootstrap, topic)
    run(produce(gregor.bootstrap, topic, [{"value": f"b{i}".encode(), "partition": 0} for i in range(30)]))
    q = _query(spark, topic, tmp_path)
    try:
        with pytest.raises(Exception) as info:
            q.processAllAvailable()
    finally:
        q.stop()
    message = str(info.value) + "".join(str(a) for a in getattr(info.value, "args", ()))
    assert q.exception() is not None
    full = message + str(q.exception())
    assert "INCONSISTENT_TOPIC_ID" in full and f"topic '{topic}' was deleted and re-created" in full, full
    # Nothing of the new topic was written as the old one's continuation.
    assert spark.read.parquet(str(tmp_path / "out")).count() == 10


def test_a_range_planned_before_a_recreate_fails_its_task(gregor: Any) -> None:
    topic = "ids-batch"
    run(create_topic(gregor.bootstrap, topic, 1))
    run(produce(gregor.bootstrap, topic, [{"value": f"a{i}".encode(), "partition": 0} for i in range(5)]))
    opts = parse_source({"subscribe": topic, "kafka.bootstrap.servers": gregor.bootstrap}, streaming=False)
    cluster = GregorCluster.of(opts)
    try:
        [planned] = ranges.plan(cluster, opts)
    finally:
        cluster.close()
    assert planned.topic_id and (planned.start, planned.end) == (0, 5)
    _recreate(gregor.bootstrap, topic)
    run(produce(gregor.bootstrap, topic, [{"value": f"b{i}".encode(), "partition": 0} for i in range(9)]))
    with pytest.raises(ranges.TopicIdChangedError, match="UNKNOWN_TOPIC_ID: topic 'ids-batch' was deleted"):
        list(ranges.read_range(planned))
