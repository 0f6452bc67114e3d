"""metrics.topic.enable=true: a broker publishes one sample batch per interval to __gregor_metrics
(docs/metrics.md), read back here with the ordinary consumer CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.common.metrics_reporter import METRICS_TOPIC, decode
from tests.helpers.cluster import tear_down


@pytest.fixture
def cluster(tmp_path) -> Iterator[LocalCluster]:  # type: ignore[no-untyped-def]
    c = LocalCluster.up(str(tmp_path / "c"), brokers=1, controllers=1,
                        broker_overrides={"metrics.topic.enable": "true", "metrics.topic.interval.ms": "300"})
    try:
        yield c
    finally:
        tear_down(c)


def test_broker_publishes_sample_batches_to_the_metrics_topic(cluster: LocalCluster) -> None:
    env = {**os.environ, "GREGOR_DATA_DIR": cluster.data_dir}
    r = subprocess.run([sys.executable, "-m", "gregor.cli.main", "-o", "json", "consume", METRICS_TOPIC,
                        "--from-beginning", "--max-messages", "3", "--timeout-ms", "30000"],
                       capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(records) == 3 and all(rec["key"] == "broker-0" for rec in records)
    batches = [decode(rec["value"].encode()) for rec in records]
    times = [b["timestamp_ms"] for b in batches]
    assert times == sorted(times) and times[-1] - times[0] >= 500  # one batch per 300 ms interval
    for b in batches:
        assert b["role"] == "broker" and b["id"] == 0
        names = {s["name"] for s in b["samples"]}
        assert {"gregor_broker_partitions", "process_cpu_seconds_total", "gregor_build_info"} <= names
        assert not any(n.endswith("_bucket") for n in names)
    partitions = next(s for s in batches[-1]["samples"] if s["name"] == "gregor_broker_partitions")
    assert partitions["type"] == "gauge" and partitions["value"] >= 1  # it hosts __gregor_metrics itself
