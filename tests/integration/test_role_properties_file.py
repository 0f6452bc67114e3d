"""A controller started from a properties file alone (what the chart's ConfigMap gives it) runs against a
real etcd: etcd.endpoints and cluster.id come from the file, and --override goes over it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from gregor.cli.local_cluster import Process, _spawn, _wait_ready
from gregor.common.etcd import EtcdClient
from gregor.controller import elector

ELECTED_WITHIN_S = 15.0  # first election on an idle etcd: well under a second; slack for a loaded machine


async def active_controller(endpoint: str, cluster: str, wait_for: int | None = None) -> int:
    """The active controller id under /gregor/<cluster>/ (NO_CONTROLLER if none), polled until `wait_for`."""
    async with EtcdClient(endpoint, cluster=cluster) as client:
        deadline = time.monotonic() + ELECTED_WITHIN_S
        while True:
            got = await elector.read_controller_id(client)
            if wait_for is None or got == wait_for or time.monotonic() > deadline:
                return got
            await asyncio.sleep(0.1)


def test_controller_takes_etcd_and_cluster_from_its_properties_file(tmp_path: Path, etcd: Process) -> None:
    conf = tmp_path / "server.properties"
    conf.write_text(f"# as the chart writes it\netcd.endpoints=http://{etcd.grpc}\ncluster.id=from-file\n"
                    "delete.topic.enable=false\nleader.imbalance.per.broker.percentage=10\n")
    ready, log_path = str(tmp_path / "ready.json"), str(tmp_path / "controller.log")
    proc = _spawn([sys.executable, "-m", "gregor.controller", "--controller-id=7", f"--config={conf}",
                   "--override=cluster.id=from-override", "--port=0", "--metrics-port=-1", f"--ready-file={ready}",
                   "--lease-ttl-ms=2000"], log_path)
    try:
        _wait_ready(proc, ready, log_path)
        endpoint = f"http://{etcd.grpc}"
        assert asyncio.run(active_controller(endpoint, "from-override", wait_for=7)) == 7, \
            open(log_path).read()[-2000:]
        assert asyncio.run(active_controller(endpoint, "from-file")) == elector.NO_CONTROLLER
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
