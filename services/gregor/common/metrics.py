"""Prometheus helpers: the /metrics endpoint, build info and shared conventions (gregor_ prefix, base units)."""

from __future__ import annotations

import bisect
import platform
import time
from contextlib import contextmanager
from importlib import metadata
from typing import Any, Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Gauge, Histogram, disable_created_metrics, start_http_server
from prometheus_client.core import HistogramMetricFamily

# No `<name>_created` series next to every counter and histogram: they double what Prometheus stores and no
# dashboard or rule of ours reads them (Prometheus 3 tracks counter resets itself).
disable_created_metrics()

# Request latency buckets in seconds: 100 µs .. 30 s, covering long polls.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Stream lifetime buckets in seconds: 10 ms .. 1 day (a follower's ReplicaFetch stream lives as long as its leader).
STREAM_DURATION_BUCKETS_S = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)
# Size buckets in bytes: 64 B .. 8 MiB in powers of four (a record batch is 16 KiB by default).
SIZE_BUCKETS_BYTES = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 8388608)
# Count buckets (records per batch, members per group): 1 .. 10,000.
COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# Series of one per-partition family (e.g. consumer lag) a process exposes at most: above it the largest
# values are kept, so a cluster with 100k partitions cannot blow up Prometheus.
PARTITION_SERIES_MAX = 1000

BUILD_INFO = Gauge("gregor_build_info", "Always 1; labels carry the version of Gregor, its native module and Python",
                   ["version", "native_version", "python_version", "role"])


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def register_build_info(role: str) -> None:
    """Export gregor_build_info for this process (prometheus-client's process collector is on by default)."""
    BUILD_INFO.labels(version=_version("gregor"), native_version=_version("gregor-native"),
                      python_version=platform.python_version(), role=role).set(1)


def serve_metrics(host: str, port: int, registry: CollectorRegistry = REGISTRY, tls: Any = None) -> int:
    """Start the /metrics endpoint in a daemon thread; returns the bound port (port 0 picks one).

    tls (a gregor.common.tls.TlsConfig, default the process's): with metrics.security.protocol=SSL (by
    default whenever security.protocol=SSL) /metrics is HTTPS with the process's certificate, scrapers'
    certificates checked per metrics.ssl.client.auth (Prometheus: scheme https and tls_config ca_file)."""
    if tls is None:
        from gregor.common.tls import effective

        tls = effective(None)
    server, _thread = start_http_server(port, addr=host, registry=registry, **tls.metrics_server_args())
    return int(server.server_port)


@contextmanager
def observe_seconds(histogram: Histogram) -> Iterator[None]:
    """Observe the wall time of the block into a histogram (already labelled)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        histogram.observe(time.perf_counter() - start)


class PlainHistogram:
    """A histogram kept as plain numbers by one owner (the event loop) and exported at scrape time.

    prometheus_client's Histogram takes a lock per observation; on a per-request path of a
    single-threaded loop an integer add and a bisect do the same job for a fraction of the cost.
    """

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.buckets = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += count
        self.total += value * count

    def add_to(self, family: HistogramMetricFamily, labels: Sequence[str]) -> None:
        """Add this histogram as one labelled series of `family` (cumulative buckets)."""
        cumulative, running = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], list(self.buckets)):
            running += n
            cumulative.append((bound, running))
        family.add_metric(list(labels), cumulative, self.total)


def top_series(values: dict[tuple[str, ...], float], limit: int = PARTITION_SERIES_MAX) -> list[tuple[tuple[str, ...], float]]:
    """The `limit` largest values (all when fewer), so per-partition families stay bounded."""
    items = sorted(values.items(), key=lambda kv: kv[1], reverse=True)
    return items[:limit]
