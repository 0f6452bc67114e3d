"""Publish a process's own metric samples to the `__gregor_metrics` topic (off by default).

Kafka's metric reporters feed Cruise Control the same way: every `metrics.topic.interval.ms` the
process collects its Prometheus registry and produces ONE record (a sample batch) keyed by
`<role>-<id>`, so analytics (the Spark job) can read metrics history without Prometheus. The
record value is UTF-8 JSON, schema in docs/metrics.md ("The __gregor_metrics topic").
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import time
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from gregor.common import errors

log = logging.getLogger(__name__)

METRICS_TOPIC = "__gregor_metrics"
SCHEMA_VERSION = 1
INTERVAL_MS_DEFAULT = 10000  # metrics.topic.interval.ms: a sample batch every 10 s (Prometheus scrapes faster)
# Families published: Gregor's own and the process collector's. Histogram buckets are left out (the
# _count and _sum samples stay): they multiply the record size by ~17 for little analytic value.
PREFIXES = ("gregor_", "process_")
TOPIC_RETENTION_MS = 7 * 24 * 3600 * 1000  # metrics history kept a week, like Cruise Control's default
CREATE_RETRY_S = 2.0  # the topic is created once the cluster answers; retried until then


def sample_batch(registry: CollectorRegistry, role: str, instance_id: int, now_ms: int,
                 host: str | None = None) -> dict[str, Any]:
    """One record's value: every sample of the published families at now_ms."""
    samples = []
    for family in registry.collect():
        if not family.name.startswith(PREFIXES):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            samples.append({"name": s.name, "type": family.type, "labels": dict(s.labels), "value": s.value})
    return {"schema": SCHEMA_VERSION, "timestamp_ms": now_ms, "role": role, "id": instance_id,
            "host": host or socket.gethostname(), "samples": samples}


def encode(batch: dict[str, Any]) -> bytes:
    """Compact JSON; NaN and ±Inf (valid sample values without a JSON literal) travel as "NaN", "+Inf", "-Inf"."""
    def value(v: float) -> float | str:
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")

    batch = {**batch, "samples": [{**s, "value": value(s["value"])} for s in batch["samples"]]}
    return json.dumps(batch, separators=(",", ":")).encode()


def decode(value: bytes) -> dict[str, Any]:
    """A record value back to its sample batch; raises ValueError for another schema version."""
    batch = dict(json.loads(value))
    if batch.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"unknown __gregor_metrics schema {batch.get('schema')!r}")
    return batch


class MetricsReporter:
    """One asyncio task that creates the topic if needed, then produces a sample batch per interval.

    Concurrency: runs on the owning process's event loop; a failed send is logged and the next
    interval tries again (metrics must never take the service down).
    """

    def __init__(self, bootstrap: str, role: str, instance_id: int, interval_ms: int = INTERVAL_MS_DEFAULT,
                 replication_factor: int = 1, registry: CollectorRegistry = REGISTRY) -> None:
        self.bootstrap = bootstrap
        self.role, self.instance_id = role, instance_id
        self.interval_s = interval_ms / 1000
        self.replication_factor = replication_factor
        self.registry = registry
        self.sent = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="metrics-reporter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _ensure_topic(self) -> None:
        from gregor.client.admin import AdminClient

        while True:
            try:
                async with AdminClient({"bootstrap.servers": self.bootstrap}) as admin:
                    await admin.create_topic(METRICS_TOPIC, 1, self.replication_factor,
                                             {"retention.ms": str(TOPIC_RETENTION_MS)})
                return
            except errors.GregorError as exc:
                if exc.code == errors.Code.TOPIC_ALREADY_EXISTS:
                    return
                log.info("cannot create %s yet (%s); retrying", METRICS_TOPIC, exc)
            await asyncio.sleep(CREATE_RETRY_S)

    async def _run(self) -> None:
        from gregor.client.producer import Producer

        await self._ensure_topic()
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "1", "linger.ms": 0})
        await producer.start()
        key = f"{self.role}-{self.instance_id}".encode()
        try:
            while True:
                value = encode(sample_batch(self.registry, self.role, self.instance_id, int(time.time() * 1000)))
                try:
                    await producer.send_and_wait(METRICS_TOPIC, value, key)
                    self.sent += 1
                except errors.GregorError as exc:
                    log.warning("publishing metrics to %s failed: %s", METRICS_TOPIC, exc)
                await asyncio.sleep(self.interval_s)
        finally:
            await producer.close(timeout=5)

