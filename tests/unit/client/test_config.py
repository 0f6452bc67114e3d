"""Client configuration: Kafka's names and defaults, validated in one place."""

from __future__ import annotations

import pytest

from gregor.client.config import (
    ConfigError, consumer_config, parse_bootstrap, producer_config,
)
from gregor.common.errors import GregorError


def test_producer_defaults_are_kafkas() -> None:
    cfg = producer_config()
    assert cfg["acks"] == "-1"  # "all"
    assert cfg["batch.size"] == 16384
    assert cfg["linger.ms"] == 5  # Kafka 4's default
    assert cfg["buffer.memory"] == 33554432
    assert cfg["max.block.ms"] == 60000
    assert cfg["max.in.flight.requests.per.connection"] == 5
    assert cfg["retries"] == 2147483647
    assert cfg["retry.backoff.ms"] == 100
    assert cfg["delivery.timeout.ms"] == 120000
    assert cfg["request.timeout.ms"] == 30000
    assert cfg["compression.type"] == "none"
    assert cfg["max.request.size"] == 1048576


def test_consumer_defaults_are_kafkas() -> None:
    cfg = consumer_config()
    assert cfg["auto.offset.reset"] == "latest"
    assert cfg["fetch.min.bytes"] == 1
    assert cfg["fetch.max.wait.ms"] == 500
    assert cfg["max.partition.fetch.bytes"] == 1048576
    assert cfg["fetch.max.bytes"] == 52428800
    assert cfg["max.poll.records"] == 500
    assert cfg["isolation.level"] == "read_uncommitted"
    assert cfg["enable.auto.commit"] is True


def test_values_are_parsed_from_strings_and_underscored_kwargs() -> None:
    cfg = producer_config({"linger.ms": "10", "acks": "1"}, batch_size=100)
    assert (cfg["linger.ms"], cfg["acks"], cfg["batch.size"]) == (10, "1", 100)


@pytest.mark.parametrize("raw,fragment", [
    ({"lingerms": 1}, "Unknown producer configuration 'lingerms'"),
    ({"acks": "2"}, "acks"),
    ({"compression.type": "brotli"}, "compression.type"),
    ({"batch.size": "-1"}, "batch.size"),
    ({"batch.size": "big"}, "expected int"),
    ({"delivery.timeout.ms": 1000}, "delivery.timeout.ms should be equal to or larger"),
    ({"enable.idempotence": "true", "acks": "1"}, "Must set acks to all in order to use the idempotent producer"),
    ({"enable.idempotence": "true", "retries": 0}, "Must set retries to non-zero"),
    ({"enable.idempotence": "true", "max.in.flight.requests.per.connection": 6},
     "Must set max.in.flight.requests.per.connection to at most 5"),
])
def test_bad_producer_configs_raise_a_clear_config_error(raw: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        producer_config(raw)
    assert fragment in str(info.value)
    assert isinstance(info.value, GregorError) and info.value.name == "INVALID_CONFIG"


def test_bad_consumer_configs() -> None:
    with pytest.raises(ConfigError, match="auto.offset.reset"):
        consumer_config({"auto.offset.reset": "smallest"})
    with pytest.raises(ConfigError, match="Unknown consumer configuration 'batch.size'"):
        consumer_config({"batch.size": 1})


def test_bootstrap_parsing() -> None:
    assert parse_bootstrap(" a:1, b:2 ,") == ["a:1", "b:2"]
    for bad in ("", "nohost", "h:port", ":9092"):
        with pytest.raises(ConfigError):
            parse_bootstrap(bad)


def test_idempotence_is_on_by_default_and_quietly_off_when_incompatible() -> None:
    """Kafka 3.x: the default turns itself off for acks != all, retries=0 or > 5 in flight; explicit true fails."""
    assert producer_config()["enable.idempotence"] is True
    assert producer_config(acks="1")["enable.idempotence"] is False
    assert producer_config(retries=0)["enable.idempotence"] is False
    assert producer_config({"max.in.flight.requests.per.connection": 6})["enable.idempotence"] is False
    assert producer_config(enable_idempotence=False)["enable.idempotence"] is False
