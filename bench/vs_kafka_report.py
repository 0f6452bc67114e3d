"""Pure parts of bench_vs_kafka.py: parsing the perf tools' output (Kafka's format, which Gregor's
tools print too) and building the side-by-side table. No processes here, so it is unit-tested.

A cell's value per round is one float; a row of the table is a metric with the median of the
rounds for each system, the spread (min-max) and the Gregor/Kafka ratio. ``better`` says which
direction wins ("higher" for throughput, "lower" for latency, CPU and memory).
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Optional

PRODUCE_SUMMARY = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                             r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th\.$")
# --warmup-records: the same summary for the records after the warm-up ("N steady state records sent, ...")
PRODUCE_STEADY = re.compile(r"^(\d+) steady state records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg "
                            r"latency, ([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, "
                            r"(\d+) ms 99\.9th\.$")
PRODUCE_WINDOW = re.compile(r"^(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                            r"([\d.]+) ms max latency\.$")
CONSUME_ROW = re.compile(r"^(\S+ \S+), (\S+ \S+), ([\d.]+), ([\d.]+), (\d+), ([\d.]+), (-?\d+), (-?\d+), ([\d.]+), "
                         r"([\d.]+)$")
E2E_AVG = re.compile(r"^Avg latency: ([\d.]+) ms")
E2E_PERCENTILES = re.compile(r"^Percentiles: 50th = (\d+), 99th = (\d+), 99\.9th = (\d+)")


class ParseError(ValueError):
    """A perf tool printed something other than its documented format."""


def parse_produce(lines: Iterable[str]) -> dict[str, Any]:
    """kafka-producer-perf-test output: the summary line plus every progress window (avg, max ms); with
    --warmup-records also the steady-state summary, under "steady"."""
    windows: list[dict[str, float]] = []
    summary: Optional[dict[str, float]] = None
    steady: Optional[dict[str, float]] = None
    keys = ("records", "records_per_sec", "mb_per_sec", "avg_latency_ms", "max_latency_ms", "p50_ms",
            "p95_ms", "p99_ms", "p999_ms")
    for line in lines:
        line = line.strip()
        if m := PRODUCE_SUMMARY.match(line):
            summary = dict(zip(keys, map(float, m.groups())))
        elif m := PRODUCE_STEADY.match(line):
            steady = dict(zip(keys, map(float, m.groups())))
        elif m := PRODUCE_WINDOW.match(line):
            windows.append({"records": float(m[1]), "records_per_sec": float(m[2]), "avg_ms": float(m[4]),
                            "max_ms": float(m[5])})
    if summary is None:
        raise ParseError("no producer summary line in the output")
    return {**summary, "windows": windows, **({"steady": steady} if steady is not None else {})}


def window_stats(windows: list[dict[str, float]], skip_first: int = 1) -> dict[str, float]:
    """Worst and median progress-window average latency; the first window (connection, metadata,
    JIT) is skipped, and so is a trailing partial window of fewer records than half the median."""
    ws = windows[skip_first:]
    if ws:
        typical = statistics.median(w["records"] for w in ws)
        ws = [w for w in ws if w["records"] >= typical / 2]
    if not ws:
        return {"worst_window_ms": float("nan"), "median_window_ms": float("nan"), "worst_over_median": float("nan")}
    avgs = [w["avg_ms"] for w in ws]
    worst, med = max(avgs), statistics.median(avgs)
    return {"worst_window_ms": worst, "median_window_ms": med,
            "worst_over_median": worst / med if med > 0 else float("inf")}


def parse_consume(lines: Iterable[str]) -> dict[str, float]:
    """kafka-consumer-perf-test's result row (after its header)."""
    for line in lines:
        if m := CONSUME_ROW.match(line.strip()):
            return {"mb": float(m[3]), "mb_per_sec": float(m[4]), "records": float(m[5]),
                    "records_per_sec": float(m[6]), "fetch_mb_per_sec": float(m[9])}
    raise ParseError("no consumer result row in the output")


def parse_e2e(lines: Iterable[str]) -> dict[str, float]:
    """EndToEndLatency's "Avg latency" and "Percentiles" lines."""
    out: dict[str, float] = {}
    for line in lines:
        line = line.strip()
        if m := E2E_AVG.match(line):
            out["avg_ms"] = float(m[1])
        elif m := E2E_PERCENTILES.match(line):
            out.update(p50_ms=float(m[1]), p99_ms=float(m[2]), p999_ms=float(m[3]))
    if "p99_ms" not in out:
        raise ParseError("no end-to-end latency percentiles in the output")
    return out


@dataclass
class Row:
    metric: str
    unit: str
    better: str  # "higher" or "lower"
    gregor: list[float]
    kafka: list[float]
    load: list[float]

    @staticmethod
    def _med(values: list[float]) -> float:
        values = [v for v in values if v == v]  # drop NaN
        return statistics.median(values) if values else float("nan")

    @property
    def ratio(self) -> float:
        g, k = self._med(self.gregor), self._med(self.kafka)
        return g / k if k else float("inf")

    @property
    def wins(self) -> Optional[bool]:
        r = self.ratio
        if r != r:
            return None
        return r >= 1.0 if self.better == "higher" else r <= 1.0


def _fmt(v: float) -> str:
    if v != v:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def _spread(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if len(values) < 2:
        return ""
    return f"{_fmt(min(values))}-{_fmt(max(values))}"


def build_rows(rounds: list[dict[str, Any]], metrics: list[tuple[str, str, str]]) -> list[Row]:
    """rounds: [{"system": "gregor"|"kafka", "values": {metric: v}, "load": {metric: l}}]; metrics: (name, unit,
    better) in table order. Metrics a system did not measure are left out of its list."""
    rows = []
    for name, unit, better in metrics:
        g = [r["values"][name] for r in rounds if r["system"] == "gregor" and name in r["values"]]
        k = [r["values"][name] for r in rounds if r["system"] == "kafka" and name in r["values"]]
        load = [r["load"][name] for r in rounds if name in r.get("load", {})]
        if g or k:
            rows.append(Row(name, unit, better, g, k, load))
    return rows


def format_table(rows: list[Row]) -> str:
    """A Markdown table: median (spread) per system, ratio, who wins, median load average."""
    out = ["| cell | unit | Gregor median (min-max) | Kafka median (min-max) | Gregor/Kafka | better | load avg |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = f"{_fmt(r._med(r.gregor))}" + (f" ({_spread(r.gregor)})" if _spread(r.gregor) else "")
        k = f"{_fmt(r._med(r.kafka))}" + (f" ({_spread(r.kafka)})" if _spread(r.kafka) else "")
        verdict = {True: "Gregor", False: "Kafka", None: "-"}[r.wins]
        load = _fmt(statistics.median(r.load)) if r.load else ""
        out.append(f"| {r.metric} | {r.unit} | {g} | {k} | {_fmt(r.ratio)} | {verdict} | {load} |")
    return "\n".join(out)
