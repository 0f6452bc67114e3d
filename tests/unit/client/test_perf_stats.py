"""`gregor perf produce` statistics: grouped recording equals per-record recording, the histogram's
percentiles equal Kafka's sorted-array percentiles, and batch latencies come from the record timestamps."""

from __future__ import annotations

import random

from gregor.cli.perf import Stats, batch_latency_counts
from gregor.client.accumulator import RecordAccumulator

STAT_FIELDS = ("count", "bytes", "max_latency", "total_latency", "w_count", "w_bytes", "w_max", "w_total")


def kafka_percentile(latencies: list[int], p: float) -> int:
    """ProducerPerformance.Stats.percentiles on an unsampled run: sorted[int(p * n)]."""
    ordered = sorted(latencies)
    return ordered[int(p * len(ordered))]


def test_record_counts_matches_record_one_by_one() -> None:
    one, grouped = Stats(10, echo=False), Stats(10, echo=False)
    batches = [[3, 1, 4], [1, 5], [9, 2, 6, 5], [7, 7, 7]]
    for lats in batches:
        counts: dict[int, int] = {}
        for lat in lats:
            one.record(lat, 100, one.window_start)
            counts[lat] = counts.get(lat, 0) + 1
        grouped.record_counts(counts, 100 * len(lats), grouped.window_start)
    grouped.record_counts({}, 0, grouped.window_start)
    for attr in STAT_FIELDS:
        assert getattr(one, attr) == getattr(grouped, attr), attr
    assert one.histogram == grouped.histogram == {1: 2, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1, 7: 3, 9: 1}
    s = grouped.summary()
    assert s["records"] == 12 and s["max_latency_ms"] == 9.0 and s["avg_latency_ms"] == 57 / 12
    assert s["p50_ms"] == kafka_percentile([x for b in batches for x in b], 0.5) == 5


def test_histogram_percentiles_equal_the_sorted_array_ones() -> None:
    rng = random.Random(5)
    for n in (1, 2, 7, 100, 1001, 20_000):
        latencies = [int(rng.expovariate(1 / 40)) for _ in range(n)]
        stats = Stats(n, echo=False)
        for lat in latencies:
            stats.record(lat, 1, stats.window_start)
        ps = [0.5, 0.95, 0.99, 0.999]
        assert stats.percentiles(ps) == [kafka_percentile(latencies, p) for p in ps], n
    assert Stats(1, echo=False).percentiles([0.5, 0.99]) == [0, 0]


async def test_batch_latency_counts_are_ack_time_minus_each_record_timestamp() -> None:
    acc = RecordAccumulator(batch_size=1 << 20, linger_ms=5, buffer_memory=1 << 24, max_block_ms=100,
                            delivery_timeout_ms=1000, retry_backoff_ms=10)
    sent_ms = [10_000, 10_000, 10_001, 10_003, 10_003, 10_003, 9_999]  # the wall clock may step back
    for ts in sent_ms:
        acc.try_append("t", 0, None, b"v", (), ts, 30)
    (batch,) = acc.batches[("t", 0)]
    expected: dict[int, int] = {}
    for ts in sent_ms:
        expected[10_050 - ts] = expected.get(10_050 - ts, 0) + 1
    assert batch_latency_counts(batch, 10_050) == expected == {50: 2, 49: 1, 47: 3, 51: 1}
    # The usual batch (one millisecond) takes the short path with the same answer.
    acc2 = RecordAccumulator(batch_size=1 << 20, linger_ms=5, buffer_memory=1 << 24, max_block_ms=100,
                             delivery_timeout_ms=1000, retry_backoff_ms=10)
    for _ in range(4):
        acc2.try_append("t", 0, None, b"v", (), 20_000, 30)
    assert batch_latency_counts(acc2.batches[("t", 0)][0], 20_007) == {7: 4}
    # One millisecond again, but after its first record the clock stepped back: not the short path's answer.
    acc3 = RecordAccumulator(batch_size=1 << 20, linger_ms=5, buffer_memory=1 << 24, max_block_ms=100,
                             delivery_timeout_ms=1000, retry_backoff_ms=10)
    for ts in (30_000, 29_999, 29_999):
        acc3.try_append("t", 0, None, b"v", (), ts, 30)
    assert batch_latency_counts(acc3.batches[("t", 0)][0], 30_010) == {10: 1, 11: 2}


def test_reporting_interval_sets_the_progress_window(capsys) -> None:  # type: ignore[no-untyped-def]
    """--reporting-interval (Kafka's flag): a 1 s interval prints a window line each second of records."""
    stats = Stats(10, echo=True, interval_s=1.0)
    start = stats.window_start
    stats.record_counts({5: 10}, 1000, start + 0.5)  # inside the first second: no line yet
    stats.record_counts({7: 10}, 1000, start + 1.0)  # the window closes
    stats.record_counts({40: 2}, 200, start + 1.5)
    stats.record_counts({2: 2}, 200, start + 2.0)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("20 records sent, ") and lines[0].endswith("6.0 ms avg latency, 7.0 ms max latency.")
    assert lines[1].startswith("4 records sent, ") and "21.0 ms avg latency, 40.0 ms max latency." in lines[1]
