"""`gregor dashboards list|queries|render`: Gregor's Grafana dashboards (deploy/grafana/*.json) evaluated
against a real Prometheus, and drawn with matplotlib for people without Grafana.

The same code takes every panel's PromQL, substitutes the dashboard variables and runs it as a
range query; the live dashboard test uses it too, so what is drawn is what was proven.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from gregor.cli.common import obj

DASHBOARDS_ENV = "GREGOR_DASHBOARDS_DIR"
QUERY_TIMEOUT_S = 10.0  # one range query; a local Prometheus answers in milliseconds
DEFAULT_RANGE_S = 900  # render the last 15 minutes unless told otherwise
MAX_POINTS = 300  # steps per range query: enough for a panel a few hundred pixels wide
MAX_LINES = 10  # lines per drawn panel (the largest ones): more is unreadable at this size


class DashboardError(click.ClickException):
    """A dashboard, a query or Prometheus failed; the message says which."""


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    ref: str
    expr: str  # variables substituted
    legend: str
    unit: str
    kind: str


def dashboards_dir() -> Path:
    override = os.environ.get(DASHBOARDS_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[3] / "deploy" / "grafana"


def names() -> list[str]:
    return sorted(p.stem for p in dashboards_dir().glob("*.json"))


def load(name: str) -> dict[str, Any]:
    path = dashboards_dir() / f"{name}.json"
    if not path.exists():
        raise DashboardError(f"no dashboard {name!r}; known: {', '.join(names()) or 'none'} (in {dashboards_dir()})")
    return dict(json.loads(path.read_text()))


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable syntax ($name, ${name}, [[name]]), longest names first so $__rate_interval wins."""
    for name in sorted(values, key=len, reverse=True):
        value = values[name]
        expr = expr.replace("${" + name + "}", value).replace("[[" + name + "]]", value)
        expr = re.sub(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])", lambda _m: value, expr)
    return expr


def variable_values(dash: dict[str, Any], cluster: str, rate_interval: str, overrides: dict[str, str]) -> dict[str, str]:
    """Every variable of the dashboard: cluster as given, multi-value ones as `.*` (All) unless overridden."""
    values = {"__rate_interval": rate_interval, "__interval": rate_interval, "__range": rate_interval}
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "datasource":
            continue
        values[var["name"]] = var.get("allValue") or ".*"
    values["cluster"] = cluster
    values.update(overrides)
    return values


def queries(name: str, cluster: str = "gregor", rate_interval: str = "1m",
            overrides: dict[str, str] | None = None) -> list[Query]:
    dash = load(name)
    values = variable_values(dash, cluster, rate_interval, overrides or {})
    out = []
    for panel in dash.get("panels", []):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append(Query(name, panel["title"], target.get("refId", ""), substitute(target["expr"], values),
                                 target.get("legendFormat", ""), unit, panel.get("type", "timeseries")))
    return out


def query_range(prometheus_url: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """Prometheus's /api/v1/query_range; a bad expression or an unreachable server raises DashboardError."""
    params = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})
    try:
        with urllib.request.urlopen(f"{prometheus_url}/api/v1/query_range?{params}", timeout=QUERY_TIMEOUT_S) as r:
            body = json.load(r)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        try:
            detail = json.loads(detail).get("error", detail)
        except ValueError:
            pass
        raise DashboardError(f"Prometheus rejected {expr!r}: {detail}") from None
    except (OSError, ValueError) as exc:
        raise DashboardError(f"cannot query Prometheus at {prometheus_url}: {exc}") from None
    if body.get("status") != "success":
        raise DashboardError(f"Prometheus failed {expr!r}: {body.get('error')}")
    return list(body["data"]["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()
    return text or ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__") or "value"


def prometheus_url(data_dir: str, flag: str | None) -> str:
    """--prometheus URL, else the Prometheus of the local cluster (cluster up --prometheus)."""
    if flag:
        return flag.rstrip("/")
    path = os.path.join(data_dir, "cluster.json")
    try:
        with open(path) as f:
            url = json.load(f).get("prometheus", "")
    except FileNotFoundError:
        raise DashboardError(f"no Prometheus: pass --prometheus URL or run `gregor cluster up --prometheus` "
                             f"(looked for {path})") from None
    if not url:
        raise DashboardError(f"the cluster of {path} has no Prometheus: start it with `gregor cluster up --prometheus`")
    return str(url).split(",")[0]


def render(name: str, url: str, out: str, cluster: str, range_s: float, rate_interval: str) -> int:
    """Draw every panel of a dashboard into one PNG; returns the number of queries drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DashboardError("matplotlib is missing: pip install 'gregor[dashboards]' (make setup installs it)")
    dash = load(name)
    qs = queries(name, cluster, rate_interval)
    panels: dict[str, list[Query]] = {}
    for q in qs:
        panels.setdefault(q.panel, []).append(q)
    end = time.time()
    start = end - range_s
    step = max(1.0, range_s / MAX_POINTS)
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.5, rows * 3.0), squeeze=False)
    fig.suptitle(f"{dash['title']} (cluster {cluster}, last {range_s / 60:g} min)", fontsize=14)
    for ax, (title, panel_qs) in zip(axes.flat, panels.items()):
        _draw_panel(ax, title, panel_qs, url, start, end, step)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return len(qs)


def _finite_points(series: dict[str, Any], end: float) -> list[tuple[float, float]]:
    return [(float(t) - end, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf", "-Inf")]


def _draw_panel(ax: Any, title: str, panel_qs: list[Query], url: str, start: float, end: float, step: float) -> None:
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    lines = []
    for q in panel_qs:
        for series in query_range(url, q.expr, start, end, step):
            points = _finite_points(series, end)
            if points:  # a quantile over an idle API is NaN throughout: nothing to draw
                lines.append((legend(q.legend, series["metric"]), points))
    unit = panel_qs[0].unit
    if not lines:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    if panel_qs[0].kind == "stat":  # Grafana's stat: the last value, large
        ax.axis("off")
        ax.text(0.5, 0.45, format_value(lines[0][1][-1][1], unit), ha="center", va="center", fontsize=26,
                transform=ax.transAxes)
        return
    lines.sort(key=lambda line: max(v for _, v in line[1]), reverse=True)
    for label, points in lines[:MAX_LINES]:
        xs, ys = zip(*points)
        ax.plot([x / 60 for x in xs], ys, label=label, linewidth=1.2)
    ax.set_xlabel("minutes ago", fontsize=7)
    ax.set_ylabel(unit, fontsize=7)
    ax.legend(fontsize=6, loc="upper left")


def format_value(value: float, unit: str) -> str:
    """A stat panel's number in its Grafana unit (the common ones; others as plain numbers)."""
    if unit == "percentunit":
        return f"{value:.1%}"
    if unit in ("bytes", "Bps"):
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024 or suffix == "TiB":
                return f"{value:.1f} {suffix}{'/s' if unit == 'Bps' else ''}"
            value /= 1024
    if unit == "s":
        return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


@click.group("dashboards")
def dashboards_group() -> None:
    """Gregor's Grafana dashboards (deploy/grafana), evaluated against Prometheus."""


@dashboards_group.command("list")
@click.pass_context
def list_cmd(ctx: click.Context) -> None:
    """Dashboard names and their panel count."""
    for name in names():
        dash = load(name)
        if obj(ctx).json:
            click.echo(json.dumps({"name": name, "title": dash["title"], "panels": len(dash["panels"])}))
        else:
            click.echo(f"{name}\t{dash['title']}\t{len(dash['panels'])} panels")


@dashboards_group.command("render")
@click.argument("name")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="PNG file to write")
@click.option("--prometheus", "prom_flag", metavar="URL", help="Prometheus base URL (default: the local cluster's)")
@click.option("--cluster", default="gregor", show_default=True, help="value of the dashboard's cluster variable")
@click.option("--range", "range_s", type=click.FloatRange(min=60), default=DEFAULT_RANGE_S, show_default=True,
              help="seconds of history to draw")
@click.option("--rate-interval", default="1m", show_default=True, help="what $__rate_interval stands for")
@click.pass_context
def render_cmd(ctx: click.Context, name: str, out: str, prom_flag: str | None, cluster: str, range_s: float,
               rate_interval: str) -> None:
    """Draw dashboard NAME's panels from the same PromQL as Grafana would run, into FILE.png."""
    url = prometheus_url(obj(ctx).data_dir, prom_flag)
    n = render(name, url, out, cluster, range_s, rate_interval)
    click.echo(f"wrote {out}: {n} queries of dashboard {name}")
