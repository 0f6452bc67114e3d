"""Publish a process's own metric samples to the `__gregor_metrics` topic (off by default).

Shared by every role (broker, controller, coordinator, gateway), hence in common/. The reporter
itself is a client of the brokers: it produces through the client SDK's Producer and AdminClient,
imported when it starts (the one use of gregor.client from common/, see docs/architecture.md).

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
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

from prometheus_client import REGISTRY, CollectorRegistry

from gregor.common import errors
from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.etcd_layout import BrokerIdsZNode
from gregor.common.properties import parse_bool

log = logging.getLogger(__name__)

METRICS_TOPIC = "__gregor_metrics"
SCHEMA_VERSION = 1
INTERVAL_MS_DEFAULT = 10000  # metrics.topic.interval.ms: a sample batch every 10 s (Prometheus scrapes faster)
# Families published: Gregor's own and the process collector's. Histogram buckets are left out (the
# _count and _sum samples stay): they multiply the record size by ~17 for little analytic value.
PREFIXES = ("gregor_", "process_")
TOPIC_RETENTION_MS = 7 * 24 * 3600 * 1000  # metrics history kept a week, like Cruise Control's default
CREATE_RETRY_S = 2.0  # the topic is created once the cluster answers; retried until then

# The same keys for every role (broker, controller, coordinator, gateway): key -> (dest, parser, default),
# the shape common.properties.settle takes.
METRICS_TOPIC_KEYS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "metrics.topic.enable": ("metrics_topic_enable", parse_bool, False),
    "metrics.topic.interval.ms": ("metrics_topic_interval_ms", int, INTERVAL_MS_DEFAULT),
    "metrics.topic.replication.factor": ("metrics_topic_replication_factor", int, 1),
}


@dataclass(frozen=True)
class MetricsTopicConfig:
    """The metrics.topic.* settings of one process; off by default."""
    enable: bool = False
    interval_ms: int = INTERVAL_MS_DEFAULT
    replication_factor: int = 1

    @classmethod
    def from_namespace(cls, ns: Any) -> "MetricsTopicConfig":
        """From the dests METRICS_TOPIC_KEYS settled on ns; out-of-range values raise InvalidConfigError."""
        config = cls(*(getattr(ns, dest) for dest, _, _ in METRICS_TOPIC_KEYS.values()))
        if config.interval_ms <= 0:
            raise InvalidConfigError(f"metrics.topic.interval.ms={config.interval_ms}: must be positive")
        if config.replication_factor < 1:
            raise InvalidConfigError(f"metrics.topic.replication.factor={config.replication_factor}: must be >= 1")
        return config

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "MetricsTopicConfig":
        """Pop the metrics.topic.* keys out of props (the gateway's producer properties) and parse them."""
        ns = SimpleNamespace()
        for key, (dest, parse, default) in METRICS_TOPIC_KEYS.items():
            raw = props.pop(key, None)
            try:
                setattr(ns, dest, default if raw is None else parse(raw))
            except ValueError:
                raise InvalidConfigError(f"{key}={raw!r}: invalid value") from None
        return cls.from_namespace(ns)


async def etcd_bootstrap(etcd: Any, poll_s: float = 0.2) -> str:
    """bootstrap.servers from the brokers registered in etcd `brokers/ids/*`, waiting for at least one.

    Roles without a broker list of their own (the controller, a coordinator without --bootstrap) publish
    through it.
    """
    while True:
        res = await etcd.get_prefix(BrokerIdsZNode.prefix(etcd))
        endpoints = (BrokerIdsZNode.grpc_endpoint(BrokerIdsZNode.decode(kv.value)) for kv in res.kvs)
        addrs = [e for e in endpoints if e]
        if addrs:
            return ",".join(addrs)
        await asyncio.sleep(poll_s)


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

    bootstrap is the brokers' host:port list, or a coroutine function finding it (etcd_bootstrap) for roles
    that learn the brokers at run time. Every role writes through the ordinary client producer.

    Concurrency: runs on the owning process's event loop; a failed send is logged and the next
    interval tries again (metrics must never take the service down).
    """

    def __init__(self, bootstrap: str | Callable[[], Awaitable[str]], role: str, instance_id: int, interval_ms: int = INTERVAL_MS_DEFAULT,
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

    @classmethod
    def started(cls, config: MetricsTopicConfig, bootstrap: str | Callable[[], Awaitable[str]], role: str,
                instance_id: int) -> "MetricsReporter | None":
        """A running reporter when config.enable, else None (metrics.topic.enable is off by default)."""
        if not config.enable:
            return None
        reporter = cls(bootstrap, role, instance_id, config.interval_ms, config.replication_factor)
        reporter.start()
        return reporter

    async def _run(self) -> None:
        from gregor.client.producer import Producer

        if not isinstance(self.bootstrap, str):
            self.bootstrap = await self.bootstrap()
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

