"""The broker's quota managers: sensors per matched entity, fetch unrecording, request-quota cap, Kafka hook."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from gregor.broker.quota_manager import BrokerQuotas, QuotaCollector, throttle_kafka_response
from gregor.common.quotas import DEFAULT, QuotaEntity
from gregor.kafka import codec


def quotas_with(entity: QuotaEntity, configs: dict[str, str]) -> BrokerQuotas:
    q = BrokerQuotas()
    q.set_entity(entity, configs)
    return q


def test_nothing_is_recorded_without_any_quota() -> None:
    q = BrokerQuotas()
    assert not q.enabled
    view = q.connection("ANONYMOUS", "c1")
    assert view.record_produce(10**9) == 0
    assert not q.produce.sensors


def test_clients_sharing_a_client_id_share_its_quota() -> None:
    q = quotas_with(QuotaEntity(None, "shared"), {"producer_byte_rate": "1000"})
    a, b = q.connection("ANONYMOUS", "shared"), q.connection("bob", "shared")
    assert a.record_produce(600) == 0
    t = b.record_produce(600)
    assert t == 200  # 1200 B within the first 1 s window against 1000 B/s: 200 B of excess, 0.2 s
    assert list(q.produce.sensors) == [("", "shared")]
    assert b.channel.until > 0


def test_default_client_quota_gives_each_client_its_own() -> None:
    q = quotas_with(QuotaEntity(None, DEFAULT), {"producer_byte_rate": "1000"})
    assert q.connection("ANONYMOUS", "x").record_produce(900) == 0
    assert q.connection("ANONYMOUS", "y").record_produce(900) == 0
    assert q.connection("ANONYMOUS", "x").record_produce(900) == 800
    assert set(q.produce.sensors) == {("", "x"), ("", "y")}


def test_unquotad_clients_are_never_throttled() -> None:
    q = quotas_with(QuotaEntity(None, "greedy"), {"producer_byte_rate": "1000"})
    other = q.connection("ANONYMOUS", "polite")
    assert all(other.record_produce(10**7) == 0 for _ in range(5))


def test_a_throttled_fetch_takes_its_bytes_back() -> None:
    q = quotas_with(QuotaEntity("ANONYMOUS", None), {"consumer_byte_rate": "1000"})
    view = q.connection("ANONYMOUS", "c")
    assert view.record_fetch(900) == 0
    assert view.record_fetch(500) == 400  # over: answered empty
    sensor = q.fetch.sensors[("ANONYMOUS", "")]
    assert sum(s[1] for s in sensor.rate._samples) == 900  # the empty answer's bytes were taken back
    assert view.fetch_max_bytes(1 << 20) == 10_000  # never more than the quota allows in one window


def test_request_quota_throttle_is_capped_at_one_window() -> None:
    q = quotas_with(QuotaEntity(None, "c"), {"request_percentage": "1"})
    assert q.connection("ANONYMOUS", "c").record_request_time(5.0) == 1000


def test_quota_change_applies_to_the_next_request() -> None:
    q = quotas_with(QuotaEntity(None, "c"), {"producer_byte_rate": "1000"})
    view = q.connection("ANONYMOUS", "c")
    assert view.record_produce(20_000) > 0
    q.set_entity(QuotaEntity(None, "c"), {"producer_byte_rate": "1000000"})
    assert view.record_produce(1) == 0
    q.set_entity(QuotaEntity(None, "c"), {})
    assert not q.enabled


def test_malformed_stored_configs_are_ignored() -> None:
    q = quotas_with(QuotaEntity(None, "c"), {"producer_byte_rate": "lots"})
    assert not q.enabled


def test_kafka_produce_and_fetch_responses_carry_the_throttle() -> None:
    from kio.schema.fetch.v12 import response as fetch_v12
    from kio.schema.produce.v9 import response as produce_v9

    q = quotas_with(QuotaEntity(None, "k"), {"producer_byte_rate": "100", "consumer_byte_rate": "100"})
    view = q.connection("ANONYMOUS", "")
    produced = codec.build(produce_v9.ProduceResponse, responses=())
    out = throttle_kafka_response(view, 0, "k", 5000, produced)
    assert out.throttle_time > datetime.timedelta(0)
    part = codec.build(fetch_v12.PartitionData, partition_index=0, records=b"x" * 5000, high_watermark=1,
                       last_stable_offset=1, log_start_offset=0, preferred_read_replica=-1)
    fetched = codec.build(fetch_v12.FetchResponse, responses=(
        codec.build(fetch_v12.FetchableTopicResponse, topic="t", partitions=(part,)),))
    out = throttle_kafka_response(view, 1, "k", 100, fetched)
    assert out.throttle_time > datetime.timedelta(0) and out.responses == ()
    assert dataclasses.replace(out).throttle_time == out.throttle_time


def test_metrics_name_the_entity() -> None:
    q = quotas_with(QuotaEntity(None, "c"), {"producer_byte_rate": "1000"})
    q.connection("ANONYMOUS", "c").record_produce(20_000)
    families = {f.name: f for f in QuotaCollector(q).collect()}
    rate = families["gregor_client_quota_byte_rate"].samples
    assert [s.labels for s in rate] == [{"type": "Produce", "user": "", "client_id": "c"}]
    assert rate[0].value == pytest.approx(20_000.0, rel=0.01)
    throttle = families["gregor_client_quota_throttle_time_seconds"].samples
    assert throttle[0].value == 19.0  # the 19 kB over the quota drain in 19 s
