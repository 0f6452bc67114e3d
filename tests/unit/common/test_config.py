"""Topic and broker configs keep Kafka's names and defaults and reject bad values clearly."""

from __future__ import annotations

import pytest

from gregor.common import errors
from gregor.common.config import BrokerConfig, effective_topic_configs, log_config_kwargs, validate_topic_configs


def test_kafka_defaults() -> None:
    c = effective_topic_configs({})
    assert c["segment.bytes"] == 1073741824 and c["segment.ms"] == 604800000
    assert c["index.interval.bytes"] == 4096 and c["segment.index.bytes"] == 10485760
    assert c["retention.ms"] == 604800000 and c["retention.bytes"] == -1
    assert c["min.insync.replicas"] == 1 and c["unclean.leader.election.enable"] is False
    assert c["max.message.bytes"] == 1048588 and c["cleanup.policy"] == "delete"
    assert c["flush.messages"] == 2**63 - 1 and c["flush.ms"] == 2**63 - 1  # Long.MAX_VALUE: leave fsync to the OS
    assert c["compression.type"] == "producer" and c["min.cleanable.dirty.ratio"] == 0.5
    assert c["delete.retention.ms"] == 86400000 and c["min.compaction.lag.ms"] == 0


def test_overrides_beat_broker_defaults_beat_kafka_defaults() -> None:
    broker = BrokerConfig.from_properties({"log.retention.hours": "1", "log.segment.bytes": "1024"})
    c = effective_topic_configs({"segment.bytes": "2048"}, broker.topic_defaults)
    assert c["retention.ms"] == 3600000 and c["segment.bytes"] == 2048
    assert log_config_kwargs(c)["segment_bytes"] == 2048


@pytest.mark.parametrize("raw", [{"retention.ms": "soon"}, {"segment.bytes": "3"}, {"cleanup.policy": "keep"},
                                 {"min.insync.replicas": "0"}, {"unclean.leader.election.enable": "maybe"},
                                 {"not.a.config": "1"}])
def test_bad_topic_configs_raise_invalid_config(raw: dict[str, str]) -> None:
    with pytest.raises(errors.GregorError) as info:
        validate_topic_configs(raw)
    assert info.value.code == errors.Code.INVALID_CONFIG
    assert list(raw)[0] in str(info.value)


def test_broker_properties() -> None:
    cfg = BrokerConfig.from_properties({"delete.topic.enable": "false", "num.partitions": "3"}, broker_id=4)
    assert cfg.delete_topic_enable is False and cfg.num_partitions == 3 and cfg.broker_id == 4
    with pytest.raises(errors.GregorError):
        BrokerConfig.from_properties({"no.such.key": "1"})
    with pytest.raises(errors.GregorError):
        BrokerConfig.from_properties({"num.partitions": "many"})


def test_replica_fetch_transport_is_data_or_grpc() -> None:
    assert BrokerConfig().replica_fetch_transport == "data"
    assert BrokerConfig.from_properties({"replica.fetch.transport": "grpc"}).replica_fetch_transport == "grpc"
    with pytest.raises(errors.GregorError) as info:
        BrokerConfig.from_properties({"replica.fetch.transport": "tcp"})
    assert info.value.code == errors.Code.INVALID_CONFIG and "replica.fetch.transport" in str(info.value)


@pytest.mark.parametrize("props, retention_ms", [
    ({"log.retention.ms": "5000", "log.retention.hours": "1"}, 5000),
    ({"log.retention.hours": "1", "log.retention.ms": "5000"}, 5000),
    ({"log.retention.hours": "1", "log.retention.minutes": "2"}, 120000),
    ({"log.retention.minutes": "2", "log.retention.ms": "7"}, 7),
    ({"log.retention.hours": "2"}, 7200000),
    ({"log.retention.hours": "-1"}, -1),
])
def test_retention_time_units_follow_kafkas_precedence(props: dict[str, str], retention_ms: int) -> None:
    assert BrokerConfig.from_properties(props).topic_defaults["retention.ms"] == retention_ms


def test_num_recovery_threads_per_data_dir_is_kafkas_default_and_settable() -> None:
    assert BrokerConfig().num_recovery_threads_per_data_dir == 2
    assert BrokerConfig.from_properties({"num.recovery.threads.per.data.dir": "6"}).num_recovery_threads_per_data_dir == 6


def test_roll_ms_beats_roll_hours() -> None:
    for props in ({"log.roll.hours": "1", "log.roll.ms": "500"}, {"log.roll.ms": "500", "log.roll.hours": "1"}):
        assert BrokerConfig.from_properties(props).topic_defaults["segment.ms"] == 500
    assert BrokerConfig.from_properties({"log.roll.hours": "2"}).topic_defaults["segment.ms"] == 7200000


@pytest.mark.parametrize("props", [{"log.retention.hours": "soon"}, {"log.retention.minutes": "1.5"},
                                   {"log.roll.hours": "x"}, {"log.roll.ms": "0"}, {"log.retention.ms": "abc"},
                                   {"delete.topic.enable": "maybe"}, {"port": None},
                                   {"num.recovery.threads.per.data.dir": "0"}])
def test_bad_broker_values_raise_invalid_config_not_value_error(props: dict[str, str]) -> None:
    with pytest.raises(errors.GregorError) as info:
        BrokerConfig.from_properties(props)
    assert info.value.code == errors.Code.INVALID_CONFIG


@pytest.mark.parametrize("raw", [{"compression.type": "none"}, {"compression.type": "brotli"},
                                 {"compression.gzip.level": "10"}, {"compression.gzip.level": "0"},
                                 {"compression.lz4.level": "18"}, {"compression.zstd.level": "23"}])
def test_bad_compression_configs_are_rejected(raw: dict[str, str]) -> None:
    with pytest.raises(errors.GregorError) as info:
        validate_topic_configs(raw)
    assert info.value.code == errors.Code.INVALID_CONFIG
    assert list(raw.values())[0] in str(info.value)


def test_implemented_values_of_restricted_topic_configs_are_accepted() -> None:
    assert validate_topic_configs({"cleanup.policy": "delete", "compression.type": "producer"}) == {
        "cleanup.policy": "delete", "compression.type": "producer"}
