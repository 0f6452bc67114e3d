"""bench_same_client's pure parts: the listener's Produce p99 read off two histogram snapshots."""

from __future__ import annotations

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from bench.bench_same_client import listener_p99_ms  # noqa: E402
from bench.rdkafka_perf import percentile  # noqa: E402

INF = float("inf")


def test_listener_p99_is_the_bucket_holding_the_99th_percentile_of_the_requests_between_snapshots() -> None:
    before = {0.005: 50.0, 0.01: 90.0, 0.1: 100.0, 0.25: 100.0, INF: 100.0}  # an earlier cell's 100 requests
    # 1,000 more: 900 within 5 ms, 985 within 10 ms, 995 within 100 ms, all within 250 ms
    after = {0.005: 950.0, 0.01: 1075.0, 0.1: 1095.0, 0.25: 1100.0, INF: 1100.0}
    assert listener_p99_ms(before, after) == 100.0
    assert listener_p99_ms(before, {**after, 0.01: 1080.0}) == 10.0  # 990 of 1,000 within 10 ms


def test_listener_p99_without_requests_is_nan() -> None:
    assert math.isnan(listener_p99_ms({0.005: 3.0, INF: 3.0}, {0.005: 3.0, INF: 3.0}))
    assert math.isnan(listener_p99_ms({}, {}))


def test_percentile_as_kafka_producer_performance() -> None:
    ms = [float(i) for i in range(1, 101)]  # index (int)(q * count) of the sorted latencies
    assert (percentile(ms, 0.5), percentile(ms, 0.99), percentile(ms, 0.999)) == (51.0, 100.0, 100.0)
    assert math.isnan(percentile([], 0.99))


def test_steady_throughput_leaves_the_first_window_out() -> None:
    from bench.bench_same_client import steady_mb_per_sec

    windows = [{"records": 100.0, "records_per_sec": 100.0},  # the client's start: 1 s for 100 records
               {"records": 2048.0, "records_per_sec": 2048.0},  # 2 MiB in 1 s
               {"records": 1024.0, "records_per_sec": 2048.0}]  # 1 MiB in 0.5 s
    assert steady_mb_per_sec(windows) == 3 / 1.5
    assert math.isnan(steady_mb_per_sec(windows[:1]))
