"""Test helpers that start REAL processes (brokers, etcd) through the same code as `gregor cluster up`."""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Iterator

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, start_etcd, stop_process

__all__ = ["LocalCluster", "Process", "broker_process", "etcd_process", "stop_process", "tear_down"]


@contextlib.contextmanager
def broker_process(data_dir: str, broker_id: int = 0, overrides: dict[str, str] | None = None,
                   port: int = 0) -> Iterator[Process]:
    """A broker subprocess on loopback; killed (SIGKILL if SIGTERM is not enough) on exit."""
    proc = start_broker(str(data_dir), broker_id, overrides=overrides, port=port)
    try:
        yield proc
    finally:
        stop_process(proc, signal.SIGTERM)


@contextlib.contextmanager
def etcd_process(data_dir: str) -> Iterator[Process]:
    proc = start_etcd(str(data_dir))
    try:
        yield proc
    finally:
        stop_process(proc, signal.SIGTERM)


def tear_down(cluster: LocalCluster) -> None:
    """Stop a test cluster even if some of its processes are paused (SIGSTOP) or stuck."""
    for p in cluster.processes:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
    cluster.down()
    for p in cluster.processes:
        stop_process(p, signal.SIGKILL)
