"""Prometheus helpers: the /metrics endpoint and shared metric conventions (gregor_ prefix, base units)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, start_http_server

# Request latency buckets in seconds: 100 µs .. 30 s, covering long polls.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def serve_metrics(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> int:
    """Start the /metrics HTTP endpoint in a daemon thread; returns the bound port (port 0 picks one)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


@contextmanager
def observe_seconds(histogram: Histogram) -> Iterator[None]:
    """Observe the wall time of the block into a histogram (already labelled)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - start)
