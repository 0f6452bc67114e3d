"""The pure parts of the issue-24 curves (bench/curves_report.py): spread, percentile, the side-by-side table
and the rebalance-time rule. The harnesses themselves (real Kafka, real Gregor) are `make bench-scaling`."""

from __future__ import annotations

import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".."))

from bench.curves_report import MemberTimeline, chart_path, first_told, percentile, rebalance_time, side_by_side, spread  # noqa: E402


def test_spread_is_median_min_max_and_ignores_nan() -> None:
    assert spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert spread([4.0, float("nan"), 2.0]) == (3.0, 2.0, 4.0)
    assert all(math.isnan(v) for v in spread([]))


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 50) == 50.0
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 99))
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_side_by_side_medians_ratio_spread_and_broken() -> None:
    cells = [
        {"system": "gregor", "point": "producers 1", "values": {"p99 ms": 2.0}},
        {"system": "gregor", "point": "producers 1", "values": {"p99 ms": 4.0}},
        {"system": "gregor", "point": "producers 1", "values": {"p99 ms": 3.0}},
        {"system": "kafka", "point": "producers 1", "values": {"p99 ms": 6.0}},
        {"system": "kafka", "point": "producers 10", "values": {}, "broken": "10 producers: 5 of 10 delivered"},
    ]
    md = side_by_side(cells, ["producers 1", "producers 10"], [("p99 ms", "ms", "lower")], "point")
    assert "| producers 1 | p99 ms (lower is better) | 3.00 (2.00–4.00) | 6.00 | 0.50x |" in md
    assert "producers 10 | p99" not in md  # neither side measured it
    assert "- kafka at producers 10 broke at 10 producers: 5 of 10 delivered" in md


def test_side_by_side_metrics_per_point() -> None:
    cells = [{"system": "gregor", "point": "a", "values": {"x": 1.0, "y": 2.0}},
             {"system": "kafka", "point": "a", "values": {"x": 2.0, "y": 4.0}},
             {"system": "gregor", "point": "b", "values": {"x": 3.0}}]
    md = side_by_side(cells, ["a", "b"], lambda p: [("y", "s", "lower")] if p == "a" else [("x", "s", "lower")],
                      "point")
    rows = [line for line in md.splitlines() if line.startswith("| a") or line.startswith("| b")]
    assert rows == ["| a | y (lower is better) | 2.00 | 4.00 | 0.50x |", "| b | x (lower is better) | 3.00 | — | — |"]


def _member(*assigns: tuple[float, tuple[int, ...]], records: tuple[float, ...] = ()) -> MemberTimeline:
    return MemberTimeline(assigns=list(assigns), records=list(records))


def test_rebalance_time_is_the_last_member_to_resume() -> None:
    t0 = 10.0
    members = [
        _member((1.0, (0, 1)), (11.0, (0,)), records=(2.0, 11.5)),
        _member((1.0, (2,)), (11.2, (1,)), records=(3.0, 12.5)),
        _member((10.9, ()), (11.1, (2,)), records=(11.3,)),  # the newcomer: empty first, then its partition
    ]
    assert rebalance_time(t0, members, 3) == pytest.approx(2.5)


def test_rebalance_not_done_until_every_member_resumed_under_a_new_assignment() -> None:
    t0 = 10.0
    stale = _member((1.0, (0, 1)), records=(11.0,))  # consumed after t0, but under its old assignment
    fresh = _member((11.0, (2,)), records=(11.2,))
    assert rebalance_time(t0, [stale, fresh], 3) is None
    no_record = _member((11.0, (0, 1)), records=(10.5,))  # assigned, nothing read since
    assert rebalance_time(t0, [no_record, fresh], 3) is None
    assert rebalance_time(t0, [], 3) is None


def test_rebalance_not_done_while_assignments_overlap_or_leave_a_gap() -> None:
    t0 = 0.0
    a = _member((1.0, (0, 1)), records=(1.1,))
    b = _member((1.0, (1,)), records=(1.2,))  # partition 1 twice, partition 2 unowned
    assert rebalance_time(t0, [a, b], 3) is None
    c = _member((1.0, (2,)), records=(1.3,))
    assert rebalance_time(t0, [_member((1.0, (0, 1)), records=(1.1,)), c], 3) == pytest.approx(1.3)


def test_first_told_is_the_earliest_revoke_after_t0() -> None:
    early = MemberTimeline(revokes=[3.0, 10.8])  # a revoke before t0 belongs to the group's formation
    late = MemberTimeline(revokes=[11.4])
    assert first_told(10.0, [late, early]) == pytest.approx(0.8)
    assert first_told(10.0, [MemberTimeline(revokes=[9.0])]) is None
    assert first_told(10.0, []) is None


def test_chart_path_only_the_full_run_draws_into_docs(tmp_path) -> None:
    results = tmp_path / "bench" / "results"
    assert chart_path(tmp_path, results, "partitions", "partitions") == tmp_path / "docs" / "partitions.png"
    # QUICK, partial and renamed runs keep their chart beside their results
    assert chart_path(tmp_path, results, "partitions_quick", "partitions") == results / "partitions_quick.png"
    assert chart_path(tmp_path, results, "clients_partial", "clients") == results / "clients_partial.png"
