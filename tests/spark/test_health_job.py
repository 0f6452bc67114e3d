"""The cluster-health job against a cluster whose brokers publish __gregor_metrics and a real Prometheus
scraping every process: a broker is stopped, and both sources show the under-replicated partitions and the
controller's work (ControllerState rates, leader elections)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.helpers.cluster import running_cluster, stop_process
from tests.spark.conftest import create_topic, produce, run


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with running_cluster(str(tmp_path_factory.mktemp("health")), brokers=2, controllers=1, lease_ttl_ms=3000,
                         broker_overrides={"metrics.topic.enable": "true", "metrics.topic.interval.ms": "1000",
                                           "replica.lag.time.max.ms": "3000"},
                         prometheus=True, scrape_interval_s=1) as cluster:
        yield cluster


def test_health_job_sees_a_stopped_broker(spark: Any, watched: Any, tmp_path: Any) -> None:
    from gregor_spark.jobs import health

    bootstrap = watched.bootstrap
    run(create_topic(bootstrap, "health-t", 2, {}, replication_factor=2))
    run(produce(bootstrap, "health-t", [{"value": b"x"} for _ in range(20)]))
    victim = [p for p in watched.by_role("broker") if p.id == 1][0]
    stop_process(victim, signal.SIGKILL)
    prom = watched.to_json()["prometheus"]
    out = str(tmp_path / "health")
    deadline = time.monotonic() + 90
    # Wait (cheaply, without Spark) until Prometheus has scraped the broker's new state, then run the job;
    # the metrics topic gets a sample batch every second, so a second run at most is needed.
    while time.monotonic() < deadline and max(
            (v for _, _, v in health.query_range(prom, health.PROMQL["under_replicated"], time.time() - 60,
                                                 time.time())), default=0) < 2:
        time.sleep(1)
    for _ in range(3):
        result = health.run(spark, out, bootstrap=bootstrap.split(",")[0], prometheus=prom, minutes=5)
        g = result.get("topic_gauges")
        s = result["prometheus_series"]
        urp_topic = g[(g.name == "gregor_broker_under_replicated_partitions") & (g.id == 0)].value.max() if g is not None else 0
        urp_prom = s[s.series == "under_replicated"].value.max()
        if urp_topic == 2 and urp_prom == 2:
            break
        time.sleep(2)
    assert urp_topic == 2 and urp_prom == 2  # both partitions lost their follower on broker 1
    assert set(g[g.name == "gregor_broker_partitions"].id) >= {0}
    summary = result["prometheus_summary"]
    states = set(summary[summary.series == "controller_state_rate"].labels)
    assert any("TopicChange" in lab or "BrokerChange" in lab for lab in states), states
    assert os.path.exists(os.path.join(out, "prom_under_replicated.png"))
    assert os.path.exists(os.path.join(out, "topic_under_replicated.png"))
