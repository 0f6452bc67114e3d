"""`gregor perf produce` statistics: per-batch recording equals per-record recording."""

from __future__ import annotations

from gregor.cli.perf import Stats


def test_record_many_matches_record_one_by_one() -> None:
    one, many = Stats(10, echo=False), Stats(10, echo=False)
    batches = [[3, 1, 4], [1, 5], [9, 2, 6, 5]]
    for lats in batches:
        for lat in lats:
            one.record(lat, 100, one.window_start)
        many.record_many(lats, 100, many.window_start)
    many.record_many([], 100, many.window_start)
    for attr in ("count", "bytes", "max_latency", "total_latency", "w_count", "w_bytes", "w_max", "w_total"):
        assert getattr(one, attr) == getattr(many, attr), attr
    assert list(one.latencies) == list(many.latencies)
    s = many.summary()
    assert s["records"] == 9 and s["max_latency_ms"] == 9.0 and s["p50_ms"] == 4
