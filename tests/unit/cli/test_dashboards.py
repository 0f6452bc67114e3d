"""Dashboards: the committed JSON is what scripts/gen_dashboards.py writes, every panel has a unit,
a Prometheus datasource variable and the cluster/instance variables; variable substitution."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from gregor.cli import dashboards

ROOT = Path(__file__).resolve().parents[3]


def test_committed_dashboards_match_the_generator() -> None:
    spec = importlib.util.spec_from_file_location("gen_dashboards", ROOT / "scripts" / "gen_dashboards.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert sorted(f"{uid.removeprefix('gregor-')}" for uid in gen.DASHBOARDS) == dashboards.names()
    for uid, (title, panels, extra) in gen.DASHBOARDS.items():
        committed = json.loads((ROOT / "deploy" / "grafana" / f"{uid.removeprefix('gregor-')}.json").read_text())
        assert committed == json.loads(json.dumps(gen.dashboard(uid, title, [dict(p) for p in panels], extra))), (
            f"{uid}: run scripts/gen_dashboards.py")


def test_every_dashboard_has_variables_units_and_prometheus_targets() -> None:
    for name in dashboards.names():
        dash = dashboards.load(name)
        assert dash["schemaVersion"] >= 39
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert {"cluster", "instance"} <= set(variables)
        for panel in dash["panels"]:
            assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])


def test_substitution_and_legends() -> None:
    values = {"cluster": "c1", "topic": ".*", "__rate_interval": "1m", "__interval": "15s"}
    expr = 'rate(x{cluster="$cluster", topic=~"${topic}"}[$__rate_interval]) + y{c="[[cluster]]"} + $clusterx'
    assert dashboards.substitute(expr, values) == 'rate(x{cluster="c1", topic=~".*"}[1m]) + y{c="c1"} + $clusterx'
    assert dashboards.legend("{{group}} {{topic}}", {"group": "g", "topic": "t"}) == "g t"
    assert dashboards.legend("", {"__name__": "m", "api": "Produce"}) == "api=Produce"
    assert dashboards.format_value(0.254, "percentunit") == "25.4%"
    assert dashboards.format_value(2048, "Bps") == "2.0 KiB/s"
    assert dashboards.format_value(0.0123, "s") == "12.3 ms"
    queries = dashboards.queries("topics", cluster="prod", rate_interval="30s", overrides={"topic": "orders"})
    assert queries and all("$" not in q.expr for q in queries)
    assert any('topic=~"orders"' in q.expr and 'cluster="prod"' in q.expr for q in queries)
