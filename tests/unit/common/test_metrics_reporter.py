"""The __gregor_metrics record schema: one batch of samples, buckets left out, NaN/Inf as strings."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gregor.common.metrics_reporter import SCHEMA_VERSION, decode, encode, sample_batch
from gregor.common.config import BrokerConfig


def test_sample_batch_encodes_published_families_only_and_round_trips() -> None:
    registry = CollectorRegistry()
    Counter("gregor_things_total", "things", ["kind"], registry=registry).labels(kind="a").inc(3)
    Gauge("gregor_nan", "not a number", registry=registry).set(float("nan"))
    Gauge("gregor_inf", "infinite", registry=registry).set(float("-inf"))
    Histogram("gregor_wait_seconds", "waits", registry=registry, buckets=(1.0,)).observe(0.5)
    Gauge("other_gauge", "not published", registry=registry).set(1)
    batch = sample_batch(registry, "broker", 7, 1234, host="h")
    value = encode(batch)
    back = decode(value)
    assert back["schema"] == SCHEMA_VERSION and back["timestamp_ms"] == 1234
    assert (back["role"], back["id"], back["host"]) == ("broker", 7, "h")
    by_name = {s["name"]: s for s in back["samples"]}
    assert by_name["gregor_things_total"] == {"name": "gregor_things_total", "type": "counter",
                                              "labels": {"kind": "a"}, "value": 3.0}
    assert by_name["gregor_nan"]["value"] == "NaN" and by_name["gregor_inf"]["value"] == "-Inf"
    assert by_name["gregor_wait_seconds_count"]["value"] == 1 and by_name["gregor_wait_seconds_sum"]["value"] == 0.5
    assert not any(n.endswith(("_bucket", "_created")) or n.startswith("other") for n in by_name)
    json.loads(value, parse_constant=lambda c: pytest.fail(f"bare {c} in the record"))  # strict JSON


def test_other_schema_versions_are_refused_and_the_topic_is_off_by_default() -> None:
    with pytest.raises(ValueError):
        decode(b'{"schema": 99, "samples": []}')
    assert BrokerConfig().metrics_topic_enable is False
    assert BrokerConfig.from_properties({"metrics.topic.enable": "true"}).metrics_topic_enable is True
