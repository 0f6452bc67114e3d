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


def test_offsets_json_carries_topic_ids_and_reads_old_checkpoints() -> None:
    from gregor.common import uuid
    from gregor_spark.source import check_topic_ids, from_json, to_json, topic_ids_of

    a, b = uuid.random_topic_id(), uuid.random_topic_id()
    offsets = to_json({("t", 0): 5, ("t", 1): 7}, {"t": a, "other": b})
    assert offsets == {"t": {"0": 5, "1": 7}, "@topicIds": {"t": uuid.to_string(a)}}  # only topics read
    assert from_json(offsets) == {("t", 0): 5, ("t", 1): 7} and topic_ids_of(offsets) == {"t": a}
    old_checkpoint = {"t": {"0": 5}}  # written before topic ids: no ids, nothing to compare
    assert topic_ids_of(old_checkpoint) == {} and from_json(old_checkpoint) == {("t", 0): 5}
    check_topic_ids(topic_ids_of(old_checkpoint), {"t": b})
    check_topic_ids({"t": a}, {"t": a, "u": b})
    check_topic_ids({"t": a}, {})  # deleted and not re-created: data loss, decided elsewhere
    with pytest.raises(ranges.TopicIdChangedError, match="INCONSISTENT_TOPIC_ID: topic 't' was deleted"):
        check_topic_ids({"t": a}, {"t": b})
