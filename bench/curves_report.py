"""Pure parts of the issue-24 curves (bench_clients.py, bench_data_scaling.py): medians with their spread,
the Gregor/Kafka side-by-side table, the chart, a percentile and the rebalance-time rule. No clusters here;
tests/unit/bench/test_curves_report.py covers what can be computed without one.

A *cell* is one system's measurements at one point of one round:
``{"system": "gregor"|"kafka", "point": <hashable>, "values": {metric: float}, "broken": str (optional)}``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

NAN = float("nan")
Metric = tuple[str, str, str]  # (key, unit, "lower" | "higher" is better)


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the values that are numbers; NaNs when there are none."""
    vs = [v for v in values if v == v]
    if not vs:
        return NAN, NAN, NAN
    return statistics.median(vs), min(vs), max(vs)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank rule (what Kafka's perf tools print); NaN if empty."""
    if not values:
        return NAN
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0-100")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def cell_spread(cells: Sequence[dict[str, Any]], system: str, point: Any, key: str) -> tuple[float, float, float]:
    return spread([c["values"][key] for c in cells
                   if c["system"] == system and c["point"] == point and key in c["values"]])


def _fmt(v: float, lo: float, hi: float) -> str:
    if v != v:
        return "—"
    digits = 3 if abs(v) < 1 else 2
    text = f"{v:.{digits}f}"
    return text + (f" ({lo:.{digits}f}–{hi:.{digits}f})" if hi > lo else "")


def side_by_side(cells: Sequence[dict[str, Any]], points: Sequence[Any],
                 metrics: Sequence[Metric] | Callable[[Any], Sequence[Metric]],
                 point_name: str, label: Callable[[Any], str] = str) -> str:
    """A markdown table: per point and metric, Gregor's and Kafka's medians (with min–max when rounds
    differ) and the Gregor/Kafka ratio of the medians; metrics neither side measured at a point are left
    out, broken cells listed below the table. `metrics` is one list for every point, or a function of the
    point (when different points measure different things under the same metric names)."""
    lines = [f"| {point_name} | metric | Gregor | Kafka | Gregor/Kafka |", "|---|---|---:|---:|---:|"]
    for p in points:
        for key, _unit, better in (metrics(p) if callable(metrics) else metrics):
            g = cell_spread(cells, "gregor", p, key)
            k = cell_spread(cells, "kafka", p, key)
            if g[0] != g[0] and k[0] != k[0]:
                continue
            ratio = f"{g[0] / k[0]:.2f}x" if g[0] == g[0] and k[0] == k[0] and k[0] > 0 else "—"
            lines.append(f"| {label(p)} | {key} ({better} is better) | {_fmt(*g)} | {_fmt(*k)} | {ratio} |")
    broken = [f"- {c['system']} at {label(c['point'])} broke at {c['broken']}" for c in cells if c.get("broken")]
    return "\n".join(lines + ([""] + broken if broken else [])) + "\n"


def chart_path(root: Path, results_dir: Path, name: str, curve: str) -> Path:
    """Where a curve's PNG goes: docs/<curve>.png for the standard full run (results named `curve`), else
    next to that run's results, bench/results/<name>.png: a QUICK or partial run must not overwrite the
    chart docs/benchmarks.md shows (it did: `make bench-scaling QUICK=1` redrew all three)."""
    return root / "docs" / f"{curve}.png" if name == curve else results_dir / f"{name}.png"


def chart(cells: Sequence[dict[str, Any]], series: Sequence[tuple[str, Sequence[Any], Sequence[float]]],
          metrics: Sequence[Metric], path: Path, title: str, xlabel: str, xlog: bool = False) -> None:
    """One panel per metric; per panel one line per (system, series): series are (name, points, x values)
    so one chart can hold e.g. the producers and the consumers of the clients curve. matplotlib (the
    `bench` extra) is imported here only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(metrics))
    rows = (len(metrics) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows), squeeze=False)
    for ax, (key, unit, better) in zip(axes.flat, metrics):
        drawn = False
        for i, (name, points, xs) in enumerate(series):
            for system, marker, color in (("gregor", "o", "tab:blue"), ("kafka", "s", "tab:orange")):
                pairs = [(x, cell_spread(cells, system, p, key)) for p, x in zip(points, xs)]
                pairs = [(x, s) for x, s in pairs if s[0] == s[0]]
                if not pairs:
                    continue
                ax.errorbar([x for x, _ in pairs], [s[0] for _, s in pairs],
                            yerr=[[s[0] - s[1] for _, s in pairs], [s[2] - s[0] for _, s in pairs]],
                            fmt=marker, linestyle=("-", "--", ":", "-.")[i % 4], color=color, capsize=3,
                            label=f"{system} {name}".strip())
                drawn = True
        if xlog:
            ax.set_xscale("log")
        ax.set_title(f"{key} ({better} is better)", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_xlabel(xlabel, fontsize=8)
        if drawn:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- the rebalance-time rule
@dataclass
class MemberTimeline:
    """What one group member saw, on one monotonic clock: when each assignment was handed to it
    (on_assign) with its partitions, and when each record arrived."""

    assigns: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    records: list[float] = field(default_factory=list)
    revokes: list[float] = field(default_factory=list)  # on_revoke: told to give its partitions up and rejoin

    def resumed_after(self, t0: float) -> Optional[float]:
        """The first record after this member's latest assignment given at or after t0; None while it has
        had no assignment since t0, an empty one, or no record since."""
        given = [(t, parts) for t, parts in self.assigns if t >= t0]
        if not given:
            return None
        t_assign, parts = given[-1]
        if not parts:
            return None
        after = [t for t in self.records if t >= t_assign]
        return min(after) if after else None


def first_told(t0: float, members: Sequence[MemberTimeline]) -> Optional[float]:
    """Seconds from t0 until the first member was told to rejoin (its first on_revoke after t0), None if none was.
    With the eager protocol members learn of a rebalance from their next heartbeat (heartbeat.interval.ms, 3 s by
    default), so this is mostly the heartbeat phase the new member happened to join at; what follows it is the
    join, the sync and the first fetch."""
    told = [t for m in members for t in m.revokes if t >= t0]
    return min(told) - t0 if told else None


def rebalance_time(t0: float, members: Sequence[MemberTimeline], partitions: int) -> Optional[float]:
    """Seconds from t0 (the joining member's subscribe) until every member holds a new assignment and has
    consumed a record under it, and the latest assignments cover every partition exactly once; None until
    then. The same rule on both systems: it is read off client-side callbacks only."""
    resumed = [m.resumed_after(t0) for m in members]
    if not members or any(r is None for r in resumed):
        return None
    latest = [m.assigns[-1][1] for m in members]
    owned = sorted(p for parts in latest for p in parts)
    if owned != list(range(partitions)):
        return None
    return max(r for r in resumed if r is not None) - t0
