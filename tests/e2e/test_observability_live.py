"""Observability against real processes, one cluster start: `cluster up --prometheus` (a real Prometheus
with file_sd and the shared rules), promtool's lint of every role's /metrics, the controller's live
event view, every dashboard query proven against the live Prometheus under produce/consume load,
and a dashboard drawn as a PNG."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest

from gregor.cli import dashboards
from gregor.cli.local_cluster import LocalCluster, start_broker
from gregor.cli.local_prometheus import prometheus_binary
from tests.helpers.cluster import tear_down
from tests.helpers.wait import wait_for

GREGOR = [sys.executable, "-m", "gregor.cli.main"]
GREGOR_ROLES = ("controller", "broker", "coordinator", "gateway")
# Families each role must expose (a sample of the list; docs/metrics.md lists them all).
REQUIRED = {
    "controller": ["gregor_controller_state", "gregor_controller_state_rate_and_time_seconds",
                   "gregor_controller_event_queue_size", "gregor_controller_event_queue_time_seconds",
                   "gregor_controller_event_processing_time_seconds", "gregor_controller_active_controller",
                   "gregor_controller_epoch", "gregor_controller_leader_elections_total",
                   "gregor_controller_channel_queue_size", "gregor_etcd_request_duration_seconds",
                   "gregor_etcd_lease_keepalive_failures_total", "gregor_build_info", "process_cpu_seconds_total"],
    "broker": ["gregor_broker_under_replicated_partitions", "gregor_broker_at_min_isr_partitions",
               "gregor_broker_offline_replicas", "gregor_log_size_bytes", "gregor_log_segments",
               "gregor_log_start_offset", "gregor_log_end_offset", "gregor_broker_purgatory_size",
               "gregor_request_remote_time_seconds", "gregor_broker_log_dir_free_bytes",
               "gregor_broker_log_recovery_seconds_total", "gregor_broker_topic_bytes_in_total", "gregor_build_info"],
    "coordinator": ["gregor_coordinator_groups", "gregor_coordinator_committed_offset",
                    "gregor_coordinator_rebalance_duration_seconds", "gregor_build_info"],
    "gateway": ["gregor_gateway_batches_in_total", "gregor_gateway_records_per_batch",
                "gregor_gateway_batch_size_bytes", "gregor_gateway_compression_ratio", "gregor_gateway_retries_total",
                "gregor_build_info"],
}


def run_cli(data_dir: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": data_dir}
    return subprocess.run([*GREGOR, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def prom_query(url: str, expr: str) -> list[dict[str, Any]]:
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        return list(json.load(r)["data"]["result"])



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir = str(tmp_path_factory.mktemp("obs"))
    c = LocalCluster.up(data_dir, brokers=2, controllers=2, coordinators=1, gateways=1, prometheus=True,
                        scrape_interval_s=1, coordinator_overrides={"offsets.topic.num.partitions": "2"})
    try:
        yield c
    finally:
        tear_down(c)


@pytest.fixture(scope="module")
def loaded(cluster: LocalCluster) -> LocalCluster:
    """Produce (SDK and gateway) and consume with a group at once, for ~10 s, then let Prometheus scrape."""
    d = cluster.data_dir
    for topic in ("obs", "obs-gw"):
        r = run_cli(d, "topics", "create", topic, "--partitions", "2", "--replication-factor", "2")
        assert r.returncode == 0, r.stderr
    env = {**os.environ, "GREGOR_DATA_DIR": d}
    load = [
        [*GREGOR, "perf", "produce", "--topic", "obs", "--num-records", "20000", "--record-size", "200",
         "--throughput", "2000"],
        [*GREGOR, "perf", "produce", "--topic", "obs-gw", "--num-records", "8000", "--record-size", "200",
         "--throughput", "800", "--via-gateway"],
        [*GREGOR, "consume", "obs", "--group", "obs-g", "--from-beginning", "--max-messages", "15000",
         "--timeout-ms", "30000"],
    ]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL) for cmd in load]
    for cmd, p in zip(load, procs):
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, f"{' '.join(cmd[3:])} failed: {err[-2000:]}"
    url = cluster.by_role("prometheus")[0].extra["url"]
    # The recording rules run every 15 s: wait until the lag rule has seen the committed offsets.
    wait_for(lambda: prom_query(url, 'gregor:consumergroup_lag:sum{group="obs-g"}'), 45, "the consumer lag rule")
    return cluster


def test_promtool_check_metrics_passes_on_every_role(cluster: LocalCluster) -> None:
    promtool = prometheus_binary("promtool")
    families: dict[str, int] = {}
    for p in cluster.processes:
        if p.role not in GREGOR_ROLES:
            continue
        text = urllib.request.urlopen(p.metrics, timeout=5).read().decode()
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, f"{p.role} {p.id}: {check.stdout}{check.stderr}"
        names = {line.split()[2].removesuffix("_total") for line in text.splitlines() if line.startswith("# TYPE ")}
        missing = [m for m in REQUIRED[p.role] if m.removesuffix("_total") not in names]
        assert not missing, f"{p.role} {p.id} lacks {missing}"
        families[p.role] = max(families.get(p.role, 0), sum(1 for n in names if n.startswith("gregor_")))
    assert set(families) == set(GREGOR_ROLES)
    print(f"gregor_ metric families per role: {families}")


def test_controller_events_shows_the_active_controller_live(cluster: LocalCluster) -> None:
    r = run_cli(cluster.data_dir, "-o", "json", "controller", "events", "--all", "--last", "50")
    assert r.returncode == 0, r.stderr
    views = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(views) == 2 and sorted(v["active"] for v in views) == [False, True]
    active = next(v for v in views if v["active"])
    assert active["controller_epoch"] >= 1 and active["state"]
    assert any(e["state"] == "BrokerChange" for e in active["processed"]), active["processed"]
    assert all(e["processing_time_ms"] >= 0 and e["queue_time_ms"] >= 0 for e in active["processed"])
    text = run_cli(cluster.data_dir, "controller", "events", "--watch", "--iterations", "2")
    assert text.returncode == 0 and text.stdout.count("ControllerState:") == 2, text.stderr
    bad = run_cli(cluster.data_dir, "controller", "events", "--controller", "127.0.0.1:1")
    assert bad.returncode == 1 and "no controller answered" in bad.stderr
    asyncio.run(_negative_max_processed_is_invalid(active["endpoint"]))


async def _negative_max_processed_is_invalid(target: str) -> None:
    from gregor.common import errors
    from gregor.common.rpc import channel
    from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

    async with channel(target) as ch:
        with pytest.raises(grpc.RpcError) as info:
            await controller_pb2_grpc.ControllerServiceStub(ch).DescribeControllerEvents(
                controller_pb2.DescribeControllerEventsRequest(max_processed=-1), timeout=5)
    assert errors.from_rpc_error(info.value).code == errors.Code.INVALID_REQUEST


def test_prometheus_scrapes_every_process_and_evaluates_the_shared_rules(loaded: LocalCluster) -> None:
    url = loaded.by_role("prometheus")[0].extra["url"]
    roles = {s["metric"]["role"] for s in prom_query(url, "up == 1")}
    assert roles >= {"etcd", "controller", "broker", "coordinator", "gateway", "prometheus"}
    with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=5) as r:
        groups = {g["name"]: g for g in json.load(r)["data"]["groups"]}
    assert set(groups) == {"gregor.recording", "gregor.alerts"}
    rules = [rule for g in groups.values() for rule in g["rules"]]
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
    # file_sd follows cluster.json: a broker added later is scraped without restarting Prometheus.
    loaded.processes.append(start_broker(loaded.data_dir, 2, etcd_endpoint=loaded.by_role("etcd")[0].grpc))
    loaded.save()
    wait_for(lambda: prom_query(url, 'up{role="broker", id="2"} == 1'), 30, "the added broker to be scraped")


def test_every_dashboard_query_returns_series_under_load(loaded: LocalCluster) -> None:
    url = loaded.by_role("prometheus")[0].extra["url"]
    end = time.time()
    proven, failures = 0, []
    for name in dashboards.names():
        for q in dashboards.queries(name, cluster="gregor", rate_interval="15s"):
            try:
                result = dashboards.query_range(url, q.expr, end - 90, end, 2)
            except dashboards.DashboardError as exc:
                failures.append(f"{name} / {q.panel} [{q.ref}]: {exc.message}")
                continue
            if not result:
                failures.append(f"{name} / {q.panel} [{q.ref}]: no series for {q.expr}")
            proven += 1
    assert not failures, "\n".join(failures)
    assert proven >= 80
    print(f"dashboard queries proven: {proven} in {len(dashboards.names())} dashboards")


def test_dashboard_render_draws_a_png_from_prometheus(loaded: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "overview.png"
    r = run_cli(loaded.data_dir, "dashboards", "render", "overview", "--out", str(out), "--range", "120",
                "--rate-interval", "15s", timeout=120)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    missing = run_cli(loaded.data_dir, "dashboards", "render", "nope", "--out", str(tmp_path / "x.png"))
    assert missing.returncode == 1 and "no dashboard 'nope'" in missing.stderr


def test_cluster_down_stops_prometheus(cluster: LocalCluster) -> None:
    """Last in this module: `gregor cluster down` stops Prometheus with the rest."""
    prom = cluster.by_role("prometheus")[0]
    assert prom.alive()
    # Brokers go first with controlled shutdown (up to controlled.shutdown.max.retries x backoff each).
    started = time.monotonic()
    r = run_cli(cluster.data_dir, "cluster", "down", "--data-dir", cluster.data_dir, timeout=240)
    assert r.returncode == 0, r.stderr
    print(f"cluster down took {time.monotonic() - started:.1f} s")
    assert not prom.alive() and not any(p.alive() for p in cluster.processes)
