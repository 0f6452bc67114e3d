"""Client quotas as pure logic: Kafka's precedence, the Rate's window, the throttle formula, the etcd keys."""

from __future__ import annotations

import itertools
import random

import pytest

from gregor.common.etcd_layout import QuotaConfigZNode
from gregor.common.quotas import (
    CONSUMER_BYTE_RATE, DEFAULT, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, QuotaConfigError, QuotaConfigs, QuotaEntity,
    Rate, alter_configs, validate_quota_configs,
)


class Keys:
    """The KeySpace of an EtcdClient for cluster `c` (prefix /gregor/c/)."""

    def key(self, *parts: str | int) -> bytes:
        return ("/gregor/c/" + "/".join(str(p) for p in parts)).encode()

    def relative(self, key: bytes) -> str:
        return key.decode().removeprefix("/gregor/c/")


# Kafka's documented order (docs: "Quotas" / the ZooKeeper paths), most specific first.
ORDER = [("alice", "c1"), ("alice", DEFAULT), ("alice", None), (DEFAULT, "c1"), (DEFAULT, DEFAULT), (DEFAULT, None),
         (None, "c1"), (None, DEFAULT)]


@pytest.mark.parametrize("present", [mask for mask in itertools.product([False, True], repeat=8) if any(mask)][::7])
def test_the_most_specific_entity_that_sets_the_quota_wins(present: tuple[bool, ...]) -> None:
    configs = QuotaConfigs()
    for i, (u, c) in enumerate(ORDER):
        if present[i]:
            configs.set(QuotaEntity(u, c), {PRODUCER_BYTE_RATE: 1000.0 + i})
    winner = present.index(True)
    assert configs.resolve(PRODUCER_BYTE_RATE, "alice", "c1").bound == 1000.0 + winner


def test_every_precedence_level_in_turn() -> None:
    configs = QuotaConfigs()
    for i, (u, c) in enumerate(ORDER):
        configs.set(QuotaEntity(u, c), {PRODUCER_BYTE_RATE: float(i + 1)})
    for i in range(len(ORDER)):
        assert configs.resolve(PRODUCER_BYTE_RATE, "alice", "c1").bound == float(i + 1)
        configs.set(QuotaEntity(*ORDER[i]), {})  # removing the winner exposes the next level


def test_sensor_tags_follow_the_matched_level() -> None:
    """A user quota is shared by the user's client ids; a client-id quota by every user of the id;
    a <default> level gives each its own sensor (Kafka's quotaMetricTags)."""
    configs = QuotaConfigs()
    configs.set(QuotaEntity("alice", None), {PRODUCER_BYTE_RATE: 10.0})
    m = configs.resolve(PRODUCER_BYTE_RATE, "alice", "c1")
    assert (m.user_tag, m.client_tag) == ("alice", "")
    configs.set(QuotaEntity(None, DEFAULT), {CONSUMER_BYTE_RATE: 5.0})
    m = configs.resolve(CONSUMER_BYTE_RATE, "bob", "c9")
    assert (m.bound, m.user_tag, m.client_tag) == (5.0, "", "c9")
    configs.set(QuotaEntity(DEFAULT, DEFAULT), {CONSUMER_BYTE_RATE: 7.0})
    m = configs.resolve(CONSUMER_BYTE_RATE, "bob", "c9")
    assert (m.bound, m.user_tag, m.client_tag) == (7.0, "bob", "c9")


def test_quota_types_resolve_independently() -> None:
    configs = QuotaConfigs()
    configs.set(QuotaEntity("alice", None), {PRODUCER_BYTE_RATE: 10.0})
    configs.set(QuotaEntity(None, DEFAULT), {CONSUMER_BYTE_RATE: 20.0})
    assert configs.resolve(PRODUCER_BYTE_RATE, "alice", "x").bound == 10.0
    assert configs.resolve(CONSUMER_BYTE_RATE, "alice", "x").bound == 20.0
    assert configs.resolve(REQUEST_PERCENTAGE, "alice", "x").bound is None
    assert configs.resolve(PRODUCER_BYTE_RATE, "bob", "x").bound is None


def test_rate_divides_by_the_time_since_the_oldest_sample() -> None:
    rate = Rate(11, 1000)
    rate.record(10_000, 0)
    assert rate.window_size_ms(0) == 1000  # at least one window (Kafka's SimpleRate)
    assert rate.measure(0) == pytest.approx(10_000.0)
    rate.record(10_000, 4000)
    assert rate.window_size_ms(5000) == 5000
    assert rate.measure(5000) == pytest.approx(4000.0)
    # Samples older than 11 windows are dropped.
    assert rate.measure(20_000) == 0.0


def test_throttle_time_is_kafkas_formula() -> None:
    """(observed - quota) / quota * window: the time the excess takes to drain at the quota."""
    rate = Rate(11, 1000)
    rate.record(20_000, 0)
    rate.record(20_000, 9_999)  # 40 kB over 10 s: 4000 B/s against a quota of 1000 B/s
    assert rate.throttle_time_ms(1000.0, 10_000) == 30_000
    assert rate.throttle_time_ms(4000.0, 10_000) == 0


@pytest.mark.parametrize("quota, size", [(10_000.0, 2500), (10_000.0, 1000), (50_000.0, 8300),
                                         (100_000.0, 16384), (1_000_000.0, 65536)])
def test_a_greedy_client_that_honours_throttle_times_holds_its_quota_in_every_30s_window(
        quota: float, size: int) -> None:
    """A client sending as fast as it may (1-4 ms apart unless throttled) and waiting each throttle time
    out: every 30 s window, the first included, carries the quota within 10 %."""
    rng = random.Random(f"{quota}-{size}")
    rate, now, sent = Rate(11, 1000), 0.0, []
    while now < 90_000:
        rate.record(size, now)
        sent.append(now)
        now += max(1.0, rate.throttle_time_ms(quota, now)) + rng.random() * 3
    for start in range(0, 60_000, 1000):
        carried = size * sum(1 for t in sent if start <= t < start + 30_000)
        assert carried / 30 == pytest.approx(quota, rel=0.10), start


def test_max_value_in_window() -> None:
    assert Rate(11, 1000).max_value_in_window(1000.0) == 10_000.0


def test_validation_refuses_unknown_names_and_bad_values() -> None:
    assert validate_quota_configs({"producer_byte_rate": "1024", "request_percentage": "12.5"}) == {
        PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 12.5}
    for bad in ({"producer_byte_rat": "1"}, {"producer_byte_rate": "x"}, {"producer_byte_rate": "0"},
                {"consumer_byte_rate": "-5"}, {"producer_byte_rate": "1.5"}, {"request_percentage": "nan"}):
        with pytest.raises(QuotaConfigError):
            validate_quota_configs(bad)
    with pytest.raises(QuotaConfigError):
        QuotaEntity(None, None)


def test_alter_adds_and_deletes() -> None:
    assert alter_configs({PRODUCER_BYTE_RATE: 1.0}, {"consumer_byte_rate": "2"}, ["producer_byte_rate"]) == {
        CONSUMER_BYTE_RATE: 2.0}
    with pytest.raises(QuotaConfigError):
        alter_configs({}, {}, ["nope"])


@pytest.mark.parametrize("entity, path", [
    (QuotaEntity("alice", None), "config/users/alice"),
    (QuotaEntity(None, "c1"), "config/clients/c1"),
    (QuotaEntity("CN=a/b,O=x", "c 1"), "config/users/CN%3Da%2Fb%2CO%3Dx/clients/c%201"),
    (QuotaEntity(DEFAULT, DEFAULT), "config/users/<default>/clients/<default>"),
    (QuotaEntity(None, DEFAULT), "config/clients/<default>"),
])
def test_quota_keys_round_trip(entity: QuotaEntity, path: str) -> None:
    keys = Keys()
    key = QuotaConfigZNode.key(keys, entity)
    assert key == b"/gregor/c/" + path.encode()
    assert QuotaConfigZNode.entity(keys, key) == entity
    assert key.startswith(QuotaConfigZNode.watch_prefix(keys))


def test_other_config_keys_are_no_quota_entity() -> None:
    keys = Keys()
    assert QuotaConfigZNode.entity(keys, keys.key("config", "topics", "t")) is None
    assert QuotaConfigZNode.entity(keys, keys.key("config", "users", "a", "x", "b")) is None


def test_codec_writes_kafkas_config_entity_json() -> None:
    raw = QuotaConfigZNode.encode({PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 12.5})
    assert raw == b'{"version": 1, "config": {"producer_byte_rate": "1024", "request_percentage": "12.5"}}'
    assert QuotaConfigZNode.decode(raw) == {"producer_byte_rate": "1024", "request_percentage": "12.5"}
