"""metrics.topic.enable on every role: the controller, broker, group coordinator and producer gateway each
publish sample batches (docs/metrics.md schema) to __gregor_metrics; with the option off nothing is written."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client import AdminClient, Consumer
from gregor.common.metrics_reporter import METRICS_TOPIC, decode
from tests.helpers.cluster import tear_down

ROLES = ("controller", "broker", "coordinator", "gateway")
# One sample each role must carry: its own family, besides the process collector's.
ROLE_SAMPLE = {"controller": ("gregor_controller_active_controller", "gauge"),
               "broker": ("gregor_broker_partitions", "gauge"),
               "coordinator": ("process_cpu_seconds_total", "counter"),
               "gateway": ("gregor_gateway_records_in_total", "counter")}


def _up(tmp_path: Any, props: dict[str, str]) -> LocalCluster:
    return LocalCluster.up(str(tmp_path / "c"), brokers=1, controllers=1, coordinators=1, gateways=1,
                           broker_overrides=props, controller_overrides=props, coordinator_overrides=props,
                           gateway_props=props)


def _gregor(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": cluster.data_dir}
    return subprocess.run([sys.executable, "-m", "gregor.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def _check_schema(batch: dict[str, Any]) -> None:
    assert set(batch) == {"schema", "timestamp_ms", "role", "id", "host", "samples"}
    assert isinstance(batch["timestamp_ms"], int) and isinstance(batch["host"], str) and batch["samples"]
    for s in batch["samples"]:
        assert set(s) == {"name", "type", "labels", "value"}
        assert s["name"].startswith(("gregor_", "process_")) and not s["name"].endswith("_bucket")
        assert isinstance(s["labels"], dict)
        assert isinstance(s["value"], (int, float)) or s["value"] in ("NaN", "+Inf", "-Inf")


def test_every_role_publishes_to_the_metrics_topic(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = _up(tmp_path, {"metrics.topic.enable": "true", "metrics.topic.interval.ms": "300"})
    try:
        latest: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 25
        while set(latest) != set(ROLES) and time.monotonic() < deadline:
            r = _gregor(cluster, "-o", "json", "consume", METRICS_TOPIC, "--from-beginning",
                        "--max-messages", "40", "--timeout-ms", "5000")
            assert r.returncode == 0, r.stderr
            for line in r.stdout.splitlines():
                rec = json.loads(line)
                batch = decode(rec["value"].encode())
                _check_schema(batch)
                assert rec["key"] == f"{batch['role']}-{batch['id']}"
                latest[batch["role"]] = batch
        assert set(latest) == set(ROLES), f"roles seen: {sorted(latest)}"
        for role, (name, kind) in ROLE_SAMPLE.items():
            b = latest[role]
            assert b["id"] == 0
            sample = next((s for s in b["samples"] if s["name"] == name), None)
            assert sample is not None, f"{role} batch lacks {name}"
            assert sample["type"] == kind
        active = next(s for s in latest["controller"]["samples"] if s["name"] == "gregor_controller_active_controller")
        assert active["value"] == 1.0  # the only controller is the active one
        info = {s["labels"].get("role") for s in latest["gateway"]["samples"] if s["name"] == "gregor_build_info"}
        assert info == {"gateway"}
    finally:
        tear_down(cluster)


async def _count_batches_by_role(bootstrap: str, control: str, enough: int) -> dict[str, int]:
    """Batches in __gregor_metrics by role, read from the beginning until the control role has `enough`."""
    counts: dict[str, int] = {}
    async with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        deadline = time.monotonic() + 25
        while METRICS_TOPIC not in await admin.list_topics(include_internal=True) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(METRICS_TOPIC, p) for p in await consumer.partitions_for(METRICS_TOPIC)])
        while counts.get(control, 0) < enough and time.monotonic() < deadline:
            for rec in await consumer.poll(timeout_ms=500):
                role = decode(rec.value)["role"]
                counts[role] = counts.get(role, 0) + 1
    return counts


@pytest.mark.parametrize("on_role", ["broker", "controller"])
def test_nothing_is_written_with_the_option_off(tmp_path, on_role: str) -> None:  # type: ignore[no-untyped-def]
    """One role publishes (the control), every other role has the interval set but metrics.topic.enable at
    its default (false): while the control publishes several batches, no other role writes one."""
    off = {"metrics.topic.interval.ms": "200"}
    on = {**off, "metrics.topic.enable": "true"}
    props = {role: (on if role == on_role else off) for role in ROLES}
    cluster = LocalCluster.up(str(tmp_path / "c"), brokers=1, controllers=1, coordinators=1, gateways=1,
                              broker_overrides=props["broker"], controller_overrides=props["controller"],
                              coordinator_overrides=props["coordinator"], gateway_props=props["gateway"])
    try:
        counts = asyncio.run(_count_batches_by_role(cluster.bootstrap, on_role, 10))
        assert counts.get(on_role, 0) >= 10, f"the control role {on_role} published {counts}"
        assert set(counts) == {on_role}, f"roles with metrics.topic.enable off published: {counts}"
    finally:
        tear_down(cluster)
