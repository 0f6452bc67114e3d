"""Dynamic broker configs (KIP-226), the pure part: which keys are taken, Kafka's errors for the others, and the
precedence per-broker > default > static > Kafka's default with its DescribeConfigs sources."""

from __future__ import annotations

import pytest

from gregor.common import broker_configs as bc, errors
from gregor.common.config import BrokerConfig


def test_only_dynamic_keys_are_taken_with_kafkas_errors_for_the_others() -> None:
    assert bc.validate({"log.retention.ms": "3600000", "log.cleanup.policy": "compact"}) == {
        "log.retention.ms": "3600000", "log.cleanup.policy": "compact"}
    with pytest.raises(errors.GregorError) as read_only:
        bc.validate({"broker.id": "3", "num.io.threads": "8", "log.segment.bytes": "1000"})
    assert read_only.value.code == errors.Code.INVALID_REQUEST
    assert read_only.value.message == "Cannot update these configs dynamically: Set(broker.id, num.io.threads)"
    with pytest.raises(errors.GregorError) as unknown:
        bc.validate({"log.retention.fortnights": "1"})
    assert unknown.value.code == errors.Code.INVALID_CONFIG
    for bad in ({"log.segment.bytes": "big"}, {"log.segment.bytes": "1"}, {"log.cleanup.policy": "shred"},
                {"log.roll.hours": "0"}):
        with pytest.raises(errors.GregorError) as invalid:
            bc.validate(bad)
        assert invalid.value.code == errors.Code.INVALID_CONFIG, bad


def test_altered_keeps_deletes_and_replaces() -> None:
    current = {"log.retention.ms": "1000", "log.segment.bytes": "2048"}
    assert bc.altered(current, {"log.retention.bytes": "10"}, ["log.segment.bytes"]) == {
        "log.retention.ms": "1000", "log.retention.bytes": "10"}
    assert bc.altered(current, {"log.retention.bytes": "10"}, [], replace=True) == {"log.retention.bytes": "10"}


def test_per_broker_beats_default_beats_static_and_units_resolve_after_merging() -> None:
    static = {"log.retention.hours": "1", "log.segment.bytes": "4096"}
    assert bc.topic_defaults(static, {}, {}) == {"retention.ms": 3_600_000, "segment.bytes": 4096}
    assert bc.topic_defaults(static, {"log.segment.bytes": "8192", "log.retention.minutes": "2"},
                             {"log.segment.bytes": "16384"}) == {"retention.ms": 120_000, "segment.bytes": 16384}
    # Kafka merges the layers first: a static log.retention.ms beats a dynamic log.retention.hours.
    assert bc.topic_defaults({"log.retention.ms": "5000"}, {"log.retention.hours": "3"}, {})["retention.ms"] == 5000
    assert bc.topic_defaults({}, {"log.segment.bytes": "x"}, {}, {"segment.bytes": 999}) == {"segment.bytes": 999}


def test_describe_reports_each_layer_as_its_source_with_synonyms() -> None:
    cfg = BrokerConfig.from_properties({"log.retention.hours": "1", "num.partitions": "3"}, broker_id=2)
    default, mine = {"log.retention.ms": "7000", "log.segment.bytes": "8192"}, {"log.retention.ms": "9000"}
    cfg.topic_defaults = bc.topic_defaults(cfg.static_properties, default, mine)
    entries = {e.name: e for e in bc.broker_entries(cfg, cfg.static_properties, default, mine)}
    retention = entries["log.retention.ms"]
    assert (retention.value, retention.source, retention.read_only) == ("9000", bc.DYNAMIC_BROKER_CONFIG, False)
    assert list(retention.synonyms) == [
        ("log.retention.ms", "9000", bc.DYNAMIC_BROKER_CONFIG),
        ("log.retention.ms", "7000", bc.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.retention.hours", "1", bc.STATIC_BROKER_CONFIG),
        ("log.retention.ms", "604800000", bc.DEFAULT_CONFIG)]
    assert (entries["log.segment.bytes"].value, entries["log.segment.bytes"].source) == (
        "8192", bc.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert (entries["num.partitions"].value, entries["num.partitions"].source,
            entries["num.partitions"].read_only) == ("3", bc.STATIC_BROKER_CONFIG, True)
    assert (entries["broker.id"].source, entries["log.cleanup.policy"].source) == (
        bc.DEFAULT_CONFIG, bc.DEFAULT_CONFIG)
    assert entries["unclean.leader.election.enable"].read_only  # dynamic in Kafka, not applied here
    assert [(e.name, e.value, e.source) for e in bc.default_entries(default)] == [
        ("log.retention.ms", "7000", bc.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ("log.segment.bytes", "8192", bc.DYNAMIC_DEFAULT_BROKER_CONFIG)]
    inherited = bc.inherited_topic_entry("segment.bytes", 8192, cfg.static_properties, default, mine)
    assert (inherited.value, inherited.source) == ("8192", bc.DYNAMIC_DEFAULT_BROKER_CONFIG)
