"""The chart's two hooks run against a real local cluster (etcd, a controller, two brokers, a gateway).

- the `helm test` script (deploy/helm/gregor/files/helm-test/produce_consume.py) produces
  through the gateway and through the brokers and reads every record back; pointed at a
  gateway that is not there, it fails with a reason;
- the brokers' preStop command (`python -m gregor.broker.controlled_shutdown`, the
  `gregor-broker-shutdown` script) moves every leadership off a broker that keeps running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gregor.cli.local_cluster import free_port
from tests.helpers.cluster import LocalCluster, running_cluster
from tests.helpers.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "helm" / "gregor" / "files" / "helm-test" / "produce_consume.py"
GREGOR = str(Path(sys.executable).with_name("gregor"))
ENV = {**os.environ, "GREGOR_CLI": GREGOR}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("hooks")), brokers=2, controllers=1, gateways=1,
                         lease_ttl_ms=4000) as c:
        yield c


def bootstrap(c: LocalCluster) -> str:
    return ",".join(p.grpc for p in c.by_role("broker"))


def helm_test(c: LocalCluster, gateway: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--bootstrap", bootstrap(c), "--gateway", gateway,
                           "--records", "10", "--replication-factor", "2", "--timeout-s", "30"],
                          capture_output=True, text=True, timeout=180, env=ENV)


def test_helm_test_script_produces_both_ways_and_reads_everything_back(cluster: LocalCluster) -> None:
    done = helm_test(cluster, cluster.by_role("gateway")[0].grpc)
    assert done.returncode == 0, done.stderr
    assert "produced 10 records through the gateway" in done.stdout
    assert "consumed all 20 records back" in done.stdout


def test_helm_test_script_fails_without_a_gateway(cluster: LocalCluster) -> None:
    done = helm_test(cluster, f"127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "helm test failed" in done.stderr


def leaders(c: LocalCluster, topic: str) -> dict[int, int]:
    out = subprocess.run([GREGOR, "--bootstrap", bootstrap(c), "--output", "json", "topics", "describe", topic],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return {p["partition"]: p["leader"] for p in json.loads(out)[0]["partitions"]}



def test_prestop_moves_every_leadership_off_a_running_broker(cluster: LocalCluster, tmp_path: Path) -> None:
    subprocess.run([GREGOR, "--bootstrap", bootstrap(cluster), "topics", "create", "prestop", "--partitions", "4",
                    "--replication-factor", "2"], check=True, capture_output=True, timeout=60)
    wait_for(lambda: 0 in leaders(cluster, "prestop").values(), 30, "broker 0 to lead a partition")
    props = tmp_path / "server.properties"
    etcd = ",".join(f"http://{p.grpc}" for p in cluster.by_role("etcd"))
    props.write_text(f"# as the chart writes it\netcd.endpoints={etcd}\ncluster.id=gregor\n"
                     "controlled.shutdown.max.retries=5\ncontrolled.shutdown.retry.backoff.ms=500\n")
    done = subprocess.run([sys.executable, "-m", "gregor.broker.controlled_shutdown", "--broker-id", "0",
                           "--config", str(props)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    broker0 = [p for p in cluster.by_role("broker") if p.id == 0][0]
    assert broker0.alive(), "the hook must leave stopping to SIGTERM"
    wait_for(lambda: set(leaders(cluster, "prestop").values()) == {1}, 30, "broker 1 to lead every partition")


def test_prestop_refuses_a_standalone_config(tmp_path: Path) -> None:
    props = tmp_path / "server.properties"
    props.write_text("num.partitions=3\n")
    done = subprocess.run([sys.executable, "-m", "gregor.broker.controlled_shutdown", "--broker-id", "0",
                           "--config", str(props)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "etcd.endpoints is not set" in done.stderr
