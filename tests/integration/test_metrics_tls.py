"""/metrics over HTTPS in a `--tls` cluster (issue 23), scraped by a real Prometheus.

Every service serves /metrics with its own certificate (metrics.security.protocol follows
security.protocol); `cluster up --tls --prometheus` writes a Prometheus config whose HTTPS targets
(`__scheme__` https in the file_sd targets) are scraped with `tls_config` (the cluster's CA). Real
processes: etcd, a controller, a broker, a coordinator, a gateway and Prometheus.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gregor.cli.local_cluster import LocalCluster
from tests.helpers.cluster import tear_down
from tests.helpers.wait import wait_for

ROLES = ("broker", "controller", "coordinator", "gateway", "etcd")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("metrics-tls")), brokers=1, controllers=1, coordinators=1,
                        gateways=1, tls=True, prometheus=True, scrape_interval_s=1)
    try:
        yield c
    finally:
        tear_down(c)


def test_every_service_serves_metrics_over_https_with_its_certificate(cluster: LocalCluster) -> None:
    assert cluster.tls is not None
    ctx = ssl.create_default_context(cafile=cluster.tls.path("ca.crt"))  # hostname checked: 127.0.0.1 is a SAN
    for role in ("broker", "controller", "coordinator", "gateway"):
        url = cluster.by_role(role)[0].metrics
        assert url.startswith("https://"), (role, url)
        with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
            assert resp.status == 200 and b"gregor_build_info" in resp.read(), role
        plain = "http://" + url.split("://", 1)[1]
        with pytest.raises(OSError):  # urllib's URLError and a reset both are OSErrors: no plain-text answer
            urllib.request.urlopen(plain, timeout=10).read()
        untrusting = ssl.create_default_context()  # the system CAs only: the cluster's CA is not among them
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=10, context=untrusting).read()


def prom_up(url: str) -> dict[str, float]:
    q = urllib.parse.urlencode({"query": "up"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
    return {s["metric"]["role"]: float(s["value"][1]) for s in result}


def test_prometheus_scrapes_the_https_targets(cluster: LocalCluster) -> None:
    prometheus = cluster.by_role("prometheus")[0]
    with open(prometheus.extra["config"]) as f:
        job = next(j for j in json.load(f)["scrape_configs"] if j["job_name"] == "gregor")
    assert job["tls_config"]["ca_file"].endswith("ca.crt")

    def all_up() -> bool:
        up = prom_up(prometheus.extra["url"])
        return all(up.get(role) == 1.0 for role in ROLES)
    wait_for(all_up, 60, "every HTTPS target up in Prometheus")
