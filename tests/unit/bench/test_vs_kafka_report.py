"""The pure parts of bench/bench_vs_kafka.py: parsing both systems' perf-tool output (Kafka's format)
and the side-by-side table. The harness itself (real Kafka, real Gregor) is `make bench-vs-kafka`."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from bench.vs_kafka_report import (ParseError, build_rows, format_table, parse_consume, parse_e2e,  # noqa: E402
                                   parse_produce, window_stats)

PRODUCER_OUT = """\
1995 records sent, 398.9 records/sec (0.39 MB/sec), 12.3 ms avg latency, 310.0 ms max latency.
2001 records sent, 2000.0 records/sec (1.95 MB/sec), 5.1 ms avg latency, 20.0 ms max latency.
2000 records sent, 1999.2 records/sec (1.95 MB/sec), 40.4 ms avg latency, 90.0 ms max latency.
2000 records sent, 2000.1 records/sec (1.95 MB/sec), 6.0 ms avg latency, 11.0 ms max latency.
2000 records sent, 2000.1 records/sec (1.95 MB/sec), 7.0 ms avg latency, 12.0 ms max latency.
12 records sent, 12.0 records/sec (0.01 MB/sec), 99.0 ms avg latency, 99.0 ms max latency.
10008 records sent, 1998.402878 records/sec (1.95 MB/sec), 13.45 ms avg latency, 310.00 ms max latency, 6 ms 50th, \
88 ms 95th, 120 ms 99th, 300 ms 99.9th.
"""


def test_parse_produce_summary_and_windows() -> None:
    r = parse_produce(PRODUCER_OUT.splitlines())
    assert r["records"] == 10008 and r["mb_per_sec"] == 1.95
    assert (r["p50_ms"], r["p99_ms"], r["p999_ms"]) == (6, 120, 300)
    assert len(r["windows"]) == 6 and r["windows"][2]["avg_ms"] == 40.4


def test_parse_produce_steady_state_summary_of_warmup_records() -> None:
    out = PRODUCER_OUT + ("8008 steady state records sent, 2000.1 records/sec (1.95 MB/sec), 6.50 ms avg latency, "
                          "90.00 ms max latency, 6 ms 50th, 11 ms 95th, 40 ms 99th, 88 ms 99.9th.\n")
    r = parse_produce(out.splitlines())
    assert r["p99_ms"] == 120  # the whole run's summary stays the cell's
    assert r["steady"]["records"] == 8008 and r["steady"]["p99_ms"] == 40 and r["steady"]["p50_ms"] == 6
    assert "steady" not in parse_produce(PRODUCER_OUT.splitlines())


def test_window_stats_skips_the_first_and_a_partial_last_window() -> None:
    ws = window_stats(parse_produce(PRODUCER_OUT.splitlines())["windows"])
    assert ws["worst_window_ms"] == 40.4  # not the 12.3 ms first window nor the 12-record tail
    assert ws["median_window_ms"] == 6.5
    assert ws["worst_over_median"] == pytest.approx(40.4 / 6.5)
    assert math.isnan(window_stats([])["worst_window_ms"])


def test_parse_consume_row_after_header() -> None:
    out = ["start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
           "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec",
           "2026-11-24 23:01:02:003, 2026-11-24 23:01:04:003, 97.6563, 48.8281, 100000, 50000.0000, 120, 1880, "
           "51.9449, 53191.4894"]
    r = parse_consume(out)
    assert r["mb_per_sec"] == 48.8281 and r["records"] == 100000 and r["fetch_mb_per_sec"] == 51.9449


def test_parse_e2e() -> None:
    r = parse_e2e(["0\t12.5", "Avg latency: 2.5000 ms", "", "Percentiles: 50th = 2, 99th = 14, 99.9th = 111"])
    assert r == {"avg_ms": 2.5, "p50_ms": 2, "p99_ms": 14, "p999_ms": 111}


@pytest.mark.parametrize("parse", [parse_produce, parse_consume, parse_e2e])
def test_unexpected_output_is_a_parse_error(parse) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParseError):
        parse(["Exception in thread main java.lang.NoClassDefFoundError"])


def test_table_medians_spread_ratio_and_winner() -> None:
    rounds = [{"system": "gregor", "values": {"mbps": 100.0, "p99": 30.0}, "load": {"mbps": 2.0}},
              {"system": "gregor", "values": {"mbps": 140.0, "p99": 10.0}, "load": {"mbps": 4.0}},
              {"system": "gregor", "values": {"mbps": 120.0, "p99": 20.0}, "load": {}},
              {"system": "kafka", "values": {"mbps": 40.0, "p99": 10.0}, "load": {"mbps": 3.0}}]
    rows = build_rows(rounds, [("mbps", "MB/s", "higher"), ("p99", "ms", "lower"), ("absent", "x", "lower")])
    assert [r.metric for r in rows] == ["mbps", "p99"]
    assert rows[0].ratio == 3.0 and rows[0].wins is True
    assert rows[1].ratio == 2.0 and rows[1].wins is False
    table = format_table(rows).splitlines()
    assert table[2] == "| mbps | MB/s | 120 (100-140) | 40.0 | 3.00 | Gregor | 3.00 |"
    assert table[3].endswith("| 2.00 | Kafka |  |")
