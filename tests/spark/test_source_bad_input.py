"""Bad options fail the Spark job with Spark's Kafka-source wording, naming the option."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gregor_spark import ranges
from gregor_spark.options import GregorSourceError, parse_source
from tests.spark.conftest import create_topic, produce, run


@pytest.fixture(scope="module")
def bad_topic(gregor: Any) -> str:
    run(create_topic(gregor.bootstrap, "bad-t", 1))
    return "bad-t"


def _load(spark: Any, **options: str) -> Any:
    reader = spark.read.format("gregor")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().collect()


@pytest.mark.parametrize("options,message", [
    ({}, "One of the following options must be specified for Gregor source: subscribe, subscribePattern, assign"),
    ({"subscribe": "bad-t", "assign": '{"bad-t":[0]}'},
     "Only one of the following options can be specified for Gregor source"),
    ({"subscribe": "bad-t", "startingOffsets": '{"bad-t":{"0":'}, 'Expected e.g. {"topicA":{"0":23'),
    ({"assign": '["bad-t"]'}, 'Expected e.g. {"topicA":[0,1]'),
    ({"subscribe": "no-such-topic"}, "UNKNOWN_TOPIC_OR_PARTITION: topic(s) no-such-topic given in option 'subscribe'"),
    ({"subscribe": "bad-t", "startingOffsets": '{"bad-t":{"0":500}}'}, 'source option "failOnDataLoss" to "false"'),
    ({"subscribe": "bad-t", "startingOffsets": "latest"}, "starting offset can't be latest for batch queries"),
    ({"subscribe": "bad-t", "minPartitions": "0"}, "'minPartitions', must be a positive integer"),
])
def test_bad_read_options(spark: Any, bad_topic: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(Exception) as info:
        _load(spark, **options)
    assert message in str(info.value)


def test_out_of_range_without_fail_on_data_loss_warns_and_skips(spark: Any, gregor: Any, caplog: Any) -> None:
    run(create_topic(gregor.bootstrap, "loss-t", 1))
    run(produce(gregor.bootstrap, "loss-t", [{"value": b"x"} for _ in range(3)]))
    rows = _load(spark, subscribe="loss-t", startingOffsets='{"loss-t":{"0":500}}', failOnDataLoss="false")
    assert rows == []
    with caplog.at_level(logging.WARNING, logger="gregor_spark"):  # the rule itself, as the planner applies it
        assert ranges.checked_start(("loss-t", 0), 500, 0, 3, fail=False) == 3
        assert ranges.checked_start(("loss-t", 0), 1, 2, 3, fail=False) == 2
    assert len(caplog.records) == 2 and 'failOnDataLoss" to "true"' in caplog.records[0].getMessage()


def test_bad_stream_and_write_options(spark: Any, bad_topic: str) -> None:
    q = (spark.readStream.format("gregor").option("subscribe", "bad-t").option("endingOffsets", "latest")
         .load().writeStream.format("console").start())
    with pytest.raises(Exception, match="Ending offset not valid in streaming queries"):
        q.awaitTermination(120)
    with pytest.raises(Exception, match="Required attribute 'value' not found"):
        spark.createDataFrame([(b"k",)], "key binary").write.format("gregor").option("topic", "bad-t").mode("append").save()
    with pytest.raises(Exception, match="topic option required when no 'topic' attribute is present"):
        spark.createDataFrame([(b"v",)], "value binary").write.format("gregor").mode("append").save()


def test_option_parsing_is_case_insensitive_and_checked() -> None:
    opts = parse_source({"SUBSCRIBE": "a,b", "startingoffsets": '{"a":{"0":-2,"1":5}}', "bootstrap": "h:1",
                         "maxOffsetsPerTrigger": "10"}, streaming=True)
    assert opts.topics == ("a", "b") and opts.max_offsets_per_trigger == 10
    assert opts.starting.resolve(("a", 1), "latest") == ("offset", 5)
    assert opts.starting.resolve(("a", 0), "latest") == ("earliest", -2)
    assert opts.starting.resolve(("b", 0), "latest") == ("latest", -1)
    with pytest.raises(GregorSourceError, match="option 'failOnDataLoss' must be true or false"):
        parse_source({"subscribe": "a", "bootstrap": "h:1", "failOnDataLoss": "maybe"}, streaming=False)
    with pytest.raises(GregorSourceError, match="endingOffsets for a-0 can't be earliest"):
        parse_source({"subscribe": "a", "bootstrap": "h:1", "endingOffsets": '{"a":{"0":-2}}'}, streaming=False)


def test_rate_limit_and_split_follow_spark() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 100}
    end = {("t", 0): 1000, ("t", 1): 10, ("t", 2): 101}
    capped = ranges.rate_limit(start, end, 100)
    # Shares of the 1011-offset backlog: 98.9 -> 98 (floored), 0.99 and 0.1 -> 1 (rounded up so they move).
    assert capped == {("t", 0): 98, ("t", 1): 1, ("t", 2): 101}
    assert ranges.rate_limit(start, end, 10_000) == end
    parts = ranges.split([ranges.RangePartition("t", 0, 0, 90, "h:1"), ranges.RangePartition("t", 1, 0, 10, "h:1")], 10)
    assert [(p.partition, p.start, p.end) for p in parts][:2] == [(0, 0, 10), (0, 10, 20)]
    assert sum(p.size for p in parts) == 100 and len(parts) == 10
