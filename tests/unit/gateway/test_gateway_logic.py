"""Pure logic of the producer gateway: its producer config, buffer.memory admission, metrics."""

from __future__ import annotations

import pytest

from gregor.client.accumulator import record_size
from gregor.client.config import ConfigError
from gregor.common import errors
from gregor.gateway.gateway import GatewayMetrics, InRecord, ProducerGateway, gateway_producer_config, \
    idempotence_supported
from gregor.gateway.server import in_record, result_proto
from gregor.gateway.client import record


def test_config_forces_acks_all_and_keeps_user_settings() -> None:
    cfg = gateway_producer_config({"compression.type": "zstd", "buffer.memory": "1000"}, "h:1")
    assert cfg["acks"] == "-1" and cfg["compression.type"] == "zstd" and cfg["buffer.memory"] == 1000
    assert cfg["max.block.ms"] == 0  # a full buffer answers at once instead of blocking
    assert cfg["enable.idempotence"] is idempotence_supported()
    with pytest.raises(ConfigError, match="acks=all"):
        gateway_producer_config({"acks": "1"}, "h:1")
    with pytest.raises(ConfigError):
        gateway_producer_config({"compression.type": "brotli"}, "h:1")


def test_throttled_only_when_the_buffer_lacks_room() -> None:
    gw = ProducerGateway("127.0.0.1:1", {"buffer.memory": "1000"})
    assert gw.throttled(1000) is None  # empty buffer: fits exactly
    assert gw.throttled(5000) is None  # larger than buffer.memory itself: send() says MESSAGE_TOO_LARGE
    gw.buffered_bytes = lambda: 600  # type: ignore[method-assign]
    err = gw.throttled(500)
    assert err is not None and err.code == errors.Code.THROTTLING_QUOTA_EXCEEDED and err.retriable
    assert err.status_code.name == "RESOURCE_EXHAUSTED"
    assert gw.throttled(400) is None


def test_proto_conversion_keeps_nulls_headers_and_partition() -> None:
    rec = in_record("t", record(None, key=b"k", headers=[("h", b"v")], timestamp_ms=5), 0)
    assert rec == InRecord("t", b"k", None, [("h", b"v")], 0, 5)
    assert in_record("t", record(b"v"), None).timestamp_ms is None  # 0 means now
    assert ProducerGateway.size_of(rec) == record_size(b"k", None, [("h", b"v")])
    ok = result_proto(7, (1, 42, 99, None))
    assert (ok.correlation_id, ok.partition, ok.offset, ok.timestamp_ms, ok.HasField("error")) == (7, 1, 42, 99, False)
    bad = result_proto(8, (-1, -1, -1, errors.MessageTooLargeError("big", topic="t")))  # type: ignore[attr-defined]
    assert bad.error.code == errors.Code.MESSAGE_TOO_LARGE and bad.error.topic == "t"


def test_metrics_histogram_is_cumulative() -> None:
    m = GatewayMetrics()
    for s in (0.00005, 0.003, 0.003, 100.0):
        m.observe(s)
    m.records_in, m.errors["X"] = 4, 1
    fams = {f.name: f for f in m.collect()}
    hist = fams["gregor_gateway_record_latency_seconds"]
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets["0.0001"] == 1 and buckets["0.005"] == 3 and buckets["30.0"] == 3 and buckets["+Inf"] == 4
    assert fams["gregor_gateway_records_in"].samples[0].value == 4


def test_batch_done_answers_every_member_of_a_produce_batch_once() -> None:
    """send_many's per-produce-batch completion (ProduceStreamBatch): one list of results per batch."""
    import asyncio
    from types import SimpleNamespace

    from gregor.client.accumulator import RecordMetadata

    recs = [InRecord("t", None, b"v", [], None, None)] * 3
    loop = asyncio.new_event_loop()
    try:
        def handle(offset: int) -> SimpleNamespace:
            return SimpleNamespace(batch=SimpleNamespace(partition=2),
                                   result=lambda: RecordMetadata("t", 2, offset, 77))

        got: list[list[tuple[int, object]]] = []
        ok = loop.create_future()
        ok.set_result(10)
        ProducerGateway._batch_done(recs, [(0, handle(10)), (2, handle(11))], 0.0, got.append, ok)  # type: ignore[arg-type]
        assert got == [[(0, (2, 10, 77, None)), (2, (2, 11, 77, None))]]
        failed = loop.create_future()
        failed.set_exception(errors.NotEnoughReplicasError("2 of 3"))  # type: ignore[attr-defined]
        ProducerGateway._batch_done(recs, [(1, handle(0))], 0.0, got.append, failed)  # type: ignore[arg-type]
        (idx, (part, offset, _, err)), = got[1]
        assert (idx, part, offset) == (1, 2, -1)
        assert err.code == errors.Code.NOT_ENOUGH_REPLICAS and err.topic == "t"  # type: ignore[union-attr]
    finally:
        loop.close()
