"""The broker's client quotas (Kafka's ClientQuotaManager x3 and the channel throttling around them).

Every broker enforces the quotas on its own, as Kafka's do: a client with a 1 MB/s produce quota may
send 1 MB/s to *each* broker. The configs come from etcd (`config/users/...`, `config/clients/...`,
common/etcd_layout.QuotaConfigZNode), read at start and kept current by a watch, so an
AlterClientQuotas applies on every broker within a second.

Per request (never per record) the broker records the request's bytes in the sensor of the quota that
applies (common/quotas.py) and, over the quota, answers at once with `throttle_time_ms` and then mutes
the client's channel for that long (KIP-219; the client also waits before its next request). A channel:

- a ProduceStream is one: its reader reads no further request until the throttle time has passed;
- a unary gRPC call has the client's HTTP/2 connection (`context.peer()`): the next call from that
  connection waits for the end of the throttle before it is handled;
- the data port and the Kafka listener: the TCP connection reads its next request after the delay.

request_percentage (KIP-124) is the handler time of every request: rpc_method meters each unary call of a
servicer with a `request_quota` (admit / charge below), and the ProduceStream, the data port and the
Kafka listener record theirs; the time is the event loop's inside the request (common/loop_time.py), so
a request waiting for data or acks costs nothing meanwhile. Exempt as in Kafka: ClusterAction requests
and follower fetches.

A throttled consumer fetch (gRPC, data port) is answered without records, as Kafka answers a throttled
fetch, and its bytes are taken back out of the sensor; a fetch never asks more than the quota allows in
one window (Kafka's getMaxValueInQuotaWindow). Follower fetches are never throttled (they use the
ReplicaFetch stream, which has no hook at all).

The group/transaction coordinators use this same view for request_percentage on their calls
(coordinator/quotas.py: BrokerQuotas with their own `exempt`).

Identity: the user is the connection's principal name (`principal_of`: `ANONYMOUS` on plain text, the
certificate subject mapped by ssl.principal.mapping.rules with TLS) and the client id comes from the
`client-id` gRPC metadata (FetchRequest.client_id on the data port, the request header on the Kafka
listener). With no quota configured anywhere nothing is recorded (Kafka's quotasEnabled).

Concurrency: event-loop owned; one watch task keeps the configs current.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from gregor.common.etcd_layout import QuotaConfigZNode
from gregor.common.etcd import WatchTask
from gregor.common.quotas import (
    ANONYMOUS, CLIENT_ID_METADATA, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QUOTA_WINDOW_NUM, QUOTA_WINDOW_SIZE_SECONDS,
    REQUEST_PERCENTAGE, QuotaConfigError, QuotaConfigs, QuotaEntity, Rate, validate_quota_configs,
)

log = logging.getLogger(__name__)

RETRY_S = 1.0  # etcd unreachable: read again after this long
SENSOR_EXPIRY_S = 3600.0  # Kafka drops a quota sensor idle for an hour (InactiveSensorExpirationTimeSeconds)
SENSORS_MAX = 10_000  # bound on live sensors per quota type (distinct user/client-id pairs)


def _now_ms() -> float:
    return time.monotonic() * 1000


@dataclass
class Sensor:
    """One quota entity's usage (Kafka's sensor `<type>-<user>:<client-id>`) and its throttle totals."""

    rate: Rate = field(default_factory=lambda: Rate(QUOTA_WINDOW_NUM, QUOTA_WINDOW_SIZE_SECONDS * 1000))
    bound: float = 0.0
    throttled_requests: int = 0
    throttle_ms_total: float = 0.0
    last_ms: float = 0.0


class ClientQuotaManager:
    """Kafka's ClientQuotaManager for one quota type (Produce, Fetch or Request)."""

    def __init__(self, quota_type: str, config_name: str, configs: QuotaConfigs,
                 max_throttle_ms: Optional[float] = None) -> None:
        self.quota_type = quota_type
        self.config_name = config_name
        self.configs = configs
        self.sensors: dict[tuple[str, str], Sensor] = {}
        # Kafka caps the request quota's throttle at one window (ClientRequestQuotaManager.maxThrottleTimeMs).
        self.max_throttle_ms = max_throttle_ms

    def _sensor(self, user: str, client_id: str) -> Optional[Sensor]:
        match = self.configs.resolve(self.config_name, user, client_id)
        if match.bound is None:
            return None
        key = (match.user_tag, match.client_tag)
        sensor = self.sensors.get(key)
        if sensor is None:
            if len(self.sensors) >= SENSORS_MAX:
                self.expire(_now_ms())
            sensor = self.sensors[key] = Sensor()
        sensor.bound = match.bound
        return sensor

    def record_and_get_throttle_time_ms(self, user: str, client_id: str, value: float,
                                        now_ms: Optional[float] = None) -> int:
        """Record value (bytes, or request-time percent) and return the throttle time (0: within quota)."""
        sensor = self._sensor(user, client_id)
        if sensor is None:
            return 0
        now = _now_ms() if now_ms is None else now_ms
        sensor.rate.record(value, now)
        sensor.last_ms = now
        throttle = sensor.rate.throttle_time_ms(sensor.bound, now)
        if self.max_throttle_ms is not None:
            throttle = min(throttle, int(self.max_throttle_ms))
        if throttle > 0:
            sensor.throttled_requests += 1
            sensor.throttle_ms_total += throttle
        return throttle

    def unrecord(self, user: str, client_id: str, value: float, now_ms: Optional[float] = None) -> None:
        """Take a recorded value back (a throttled fetch is answered empty: its bytes were never sent)."""
        sensor = self._sensor(user, client_id)
        if sensor is not None:
            sensor.rate.record(-value, _now_ms() if now_ms is None else now_ms)

    def max_value_in_window(self, user: str, client_id: str) -> Optional[float]:
        """The most one request may take under the quota (None: no quota)."""
        match = self.configs.resolve(self.config_name, user, client_id)
        if match.bound is None:
            return None
        return Rate(QUOTA_WINDOW_NUM, QUOTA_WINDOW_SIZE_SECONDS * 1000).max_value_in_window(match.bound)

    def expire(self, now_ms: float) -> None:
        """Drop sensors idle for SENSOR_EXPIRY_S (their series leave /metrics)."""
        cutoff = now_ms - SENSOR_EXPIRY_S * 1000
        for key in [k for k, s in self.sensors.items() if s.last_ms < cutoff]:
            del self.sensors[key]


@dataclass
class ChannelThrottle:
    """A connection's mute: requests read after `until` (monotonic seconds) only."""

    until: float = 0.0

    def mute(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self.until = max(self.until, time.monotonic() + throttle_ms / 1000)

    async def wait(self) -> None:
        delay = self.until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


class StreamQuota:
    """The quota view of one connection-like stream (ProduceStream, data port, Kafka connection)."""

    def __init__(self, quotas: "BrokerQuotas", user: str, client_id: str) -> None:
        self.quotas = quotas
        self.user = user
        self.client_id = client_id
        self.channel = ChannelThrottle()

    def record_produce(self, nbytes: int) -> int:
        """Record a produce request's bytes; its throttle time (the channel is muted that long)."""
        if not self.quotas.enabled:
            return 0
        throttle = self.quotas.produce.record_and_get_throttle_time_ms(self.user, self.client_id, nbytes)
        self.channel.mute(throttle)
        return throttle

    def record_fetch(self, nbytes: int) -> int:
        """Record a consumer fetch's bytes; over the quota they are taken back (the answer goes out
        empty) and the throttle time is returned."""
        if not self.quotas.enabled:
            return 0
        fetch = self.quotas.fetch
        throttle = fetch.record_and_get_throttle_time_ms(self.user, self.client_id, nbytes)
        if throttle > 0:
            fetch.unrecord(self.user, self.client_id, nbytes)
        self.channel.mute(throttle)
        return throttle

    def record_request_time(self, seconds: float) -> int:
        """Record the handler time of a request (request_percentage); its throttle time."""
        if not self.quotas.enabled:
            return 0
        throttle = self.quotas.request.record_and_get_throttle_time_ms(self.user, self.client_id, seconds * 100)
        self.channel.mute(throttle)
        return throttle

    def fetch_max_bytes(self, requested: int) -> int:
        """requested, capped at what the fetch quota allows in one window."""
        if not self.quotas.enabled:
            return requested
        cap = self.quotas.fetch.max_value_in_window(self.user, self.client_id)
        return requested if cap is None else max(1, min(requested, int(cap)))


class BrokerQuotas:
    """The broker's three quota managers, their configs from etcd and the muted gRPC connections."""

    def __init__(self) -> None:
        self.configs = QuotaConfigs()
        self.produce = ClientQuotaManager("Produce", PRODUCER_BYTE_RATE, self.configs)
        self.fetch = ClientQuotaManager("Fetch", CONSUMER_BYTE_RATE, self.configs)
        self.request = ClientQuotaManager("Request", REQUEST_PERCENTAGE, self.configs,
                                          max_throttle_ms=QUOTA_WINDOW_SIZE_SECONDS * 1000)
        self.enabled = False
        # The principal name of a gRPC call (TLS sets it from the certificate); plain text: ANONYMOUS.
        self.principal_of: Callable[[Any], str] = lambda context: ANONYMOUS
        self._peers: dict[str, ChannelThrottle] = {}
        self._watcher = WatchTask("client-quotas")
        self._etcd: Any = None
        self.synced = asyncio.Event()

    # -- configs ---------------------------------------------------------------------------------

    def set_entity(self, entity: QuotaEntity, configs: dict[str, str]) -> None:
        """Apply one entity's stored configs (empty: removed); a malformed value is logged and skipped."""
        try:
            values = validate_quota_configs(configs)
        except QuotaConfigError as exc:
            log.warning("quotas: ignoring %s: %s", entity.describe(), exc)
            values = {}
        self.configs.set(entity, values)
        self.enabled = bool(self.configs.entities)

    def start(self, etcd: Any) -> None:
        """Read the quota configs from etcd and watch them (cluster mode); returns at once."""
        self._etcd = etcd
        self._watcher.start(self._watch)

    async def stop(self) -> None:
        await self._watcher.stop()

    async def _watch(self) -> None:
        from gregor.common.etcd import config_entity_apply, follow_prefix

        def loaded(_revision: int) -> None:
            self.enabled = bool(self.configs.entities)
            self.synced.set()

        apply = config_entity_apply(lambda key: QuotaConfigZNode.entity(self._etcd, key), QuotaConfigZNode.decode,
                                    self.set_entity, what="quotas", logger=log)
        await follow_prefix(self._etcd, QuotaConfigZNode.watch_prefix(self._etcd),
                            reset=lambda: self.configs.replace_all({}), apply=apply, loaded=loaded,
                            what="quotas", retry_s=RETRY_S)

    # -- identity and channels -------------------------------------------------------------------

    def client_id_of(self, context: Any) -> str:
        for key, value in context.invocation_metadata() or ():
            if key == CLIENT_ID_METADATA:
                return str(value)
        return ""

    def stream(self, context: Any) -> StreamQuota:
        """The quota view of a gRPC stream (its identity is read once: a stream is a connection)."""
        return StreamQuota(self, self.principal_of(context), self.client_id_of(context))

    def connection(self, user: str, client_id: str) -> StreamQuota:
        """The quota view of a raw connection (data port, Kafka listener)."""
        return StreamQuota(self, user, client_id)

    def peer_channel(self, context: Any) -> ChannelThrottle:
        """The throttle of the HTTP/2 connection a unary call came on."""
        peer = context.peer()
        channel = self._peers.get(peer)
        if channel is None:
            if len(self._peers) > SENSORS_MAX:  # forget connections whose mutes are long over
                now = time.monotonic()
                self._peers = {p: c for p, c in self._peers.items() if c.until > now}
            channel = self._peers[peer] = ChannelThrottle()
        return channel

    # -- request quota (request_percentage) of every call: rpc_method's RequestQuota hook -----------

    async def admit(self, api: str, request: Any, context: Any) -> Optional[StreamQuota]:
        """A unary call's quota view after its connection's mute; None when nothing is configured or the call
        is exempt (`exempt`)."""
        if not self.enabled or self.exempt(api, request, context):
            return None
        return await self.unary(context)

    def exempt(self, api: str, request: Any, context: Any) -> bool:
        """Calls outside the request quota, as in Kafka: ClusterAction requests (controller and inter-broker)
        and follower fetches. The coordinators' view (coordinator/quotas.py) names its own."""
        return api in CLUSTER_ACTION_APIS or from_follower(request)

    def charge(self, view: StreamQuota, seconds: float, response: Any) -> None:
        """Record a call's handler time; over request_percentage the connection is muted and a response with
        a throttle_time_ms field carries the longer of its own throttle and this one (Kafka's rule)."""
        throttle = view.record_request_time(seconds)
        if throttle and response is not None and _has_throttle_field(response):
            response.throttle_time_ms = max(response.throttle_time_ms, throttle)

    async def unary(self, context: Any) -> Optional[StreamQuota]:
        """A unary call's quota view, after its connection's mute (None with no quota anywhere)."""
        if not self.enabled:
            return None
        view = self.stream(context)
        view.channel = self.peer_channel(context)
        await view.channel.wait()
        return view

    # -- metrics ---------------------------------------------------------------------------------

    def managers(self) -> Iterator[ClientQuotaManager]:
        yield from (self.produce, self.fetch, self.request)


# Kafka exempts the requests its brokers and controller send each other (ApiKeys with clusterAction) from
# the request quota, and follower fetches: the gRPC APIs that need ClusterAction on the Cluster.
CLUSTER_ACTION_APIS = frozenset({"LeaderAndIsr", "StopReplica", "UpdateMetadata", "WriteTxnMarkers",
                                 "ControlledShutdown", "AllocateProducerIds", "ReplicaFetch"})
# The Kafka listener's: LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown, WriteTxnMarkers.
KAFKA_CLUSTER_ACTION_KEYS = frozenset({4, 5, 6, 7, 27})
_THROTTLE_FIELD: dict[Any, bool] = {}


def from_follower(request: Any) -> bool:
    """A follower's fetch (replica_id set, as Kafka's isFromFollower)."""
    try:
        return bool(request.HasField("replica_id")) and request.replica_id >= 0
    except (ValueError, AttributeError):
        return False


def _has_throttle_field(response: Any) -> bool:
    kind = type(response)
    known = _THROTTLE_FIELD.get(kind)
    if known is None:
        descriptor = getattr(response, "DESCRIPTOR", None)
        known = _THROTTLE_FIELD[kind] = descriptor is not None and "throttle_time_ms" in descriptor.fields_by_name
    return known


class QuotaCollector(Collector):
    """Kafka's per-entity quota metrics (type=Produce|Fetch|Request, user, client-id), read at scrape time."""

    def __init__(self, quotas: BrokerQuotas) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[Any]:
        labels = ["type", "user", "client_id"]
        rate = GaugeMetricFamily("gregor_client_quota_byte_rate",
                                 "Bytes per second of a client quota entity over the quota window "
                                 "(Kafka's byte-rate, type=Produce|Fetch)", labels=labels)
        request = GaugeMetricFamily("gregor_client_quota_request_time_ratio",
                                    "Request handler time of a client quota entity as a fraction of one "
                                    "thread (Kafka's request-time / 100)", labels=labels)
        limit = GaugeMetricFamily("gregor_client_quota_limit",
                                  "The quota in force for the entity (bytes per second; a fraction of one "
                                  "thread for type=Request)", labels=labels)
        throttle = CounterMetricFamily("gregor_client_quota_throttle_time_seconds",
                                       "Throttle time handed to the entity's requests (Kafka's throttle-time; "
                                       "rate() over the count gives its average)", labels=labels)
        throttled = CounterMetricFamily("gregor_client_quota_throttled_requests",
                                        "Requests of the entity answered with a throttle time", labels=labels)
        now = _now_ms()
        for manager in self.quotas.managers():
            manager.expire(now)
            for (user, client_id), s in list(manager.sensors.items()):
                values = [manager.quota_type, user, client_id]
                measured = s.rate.measure(now)
                if manager.quota_type == "Request":
                    request.add_metric(values, measured / 100)
                    limit.add_metric(values, s.bound / 100)
                else:
                    rate.add_metric(values, measured)
                    limit.add_metric(values, s.bound)
                throttle.add_metric(values, s.throttle_ms_total / 1000)
                throttled.add_metric(values, s.throttled_requests)
        yield from (rate, request, limit, throttle, throttled)


_COLLECTORS: dict[int, QuotaCollector] = {}


def watch_quotas(quotas: BrokerQuotas) -> None:
    """Export this broker's quota sensors at scrape time (until unwatch_quotas)."""
    collector = QuotaCollector(quotas)
    REGISTRY.register(collector)
    _COLLECTORS[id(quotas)] = collector


def unwatch_quotas(quotas: BrokerQuotas) -> None:
    collector = _COLLECTORS.pop(id(quotas), None)
    if collector is not None:
        REGISTRY.unregister(collector)


# -- the Kafka listener ------------------------------------------------------------------------------

KAFKA_PRODUCE, KAFKA_FETCH = 0, 1


def kafka_fetch_bytes(body: Any) -> int:
    """The record bytes of a kio FetchResponse (per partition, never per record)."""
    return sum(len(p.records or b"") for t in body.responses for p in t.partitions)


def throttle_kafka_response(view: StreamQuota, api_key: int, client_id: str, request_bytes: int, body: Any,
                            handler_seconds: float = 0.0, exempt: bool = False,
                            fetch_bytes: int | None = None) -> Any:
    """Record a Kafka request against the connection's quotas: a Produce's size or a consumer Fetch's
    records answered (byte rates; fetch_bytes when they go by sendfile and the body holds markers), and the
    handler time of every request not exempt (request_percentage). Over a quota the response carries the
    longest throttle_time (where the response has the field) and, for a Fetch over its byte rate, no data
    (Kafka's getThrottledResponse). The caller mutes the connection (view.channel.wait()) after writing."""
    import dataclasses
    import datetime

    view.client_id = client_id
    exempt = exempt or api_key in KAFKA_CLUSTER_ACTION_KEYS
    throttle = 0 if exempt else view.record_request_time(handler_seconds)
    if body is None:
        if api_key == KAFKA_PRODUCE:
            view.record_produce(request_bytes)  # acks=0: no answer, the mute still holds the channel
        return body
    changes: dict[str, Any] = {}
    if api_key == KAFKA_PRODUCE:
        throttle = max(throttle, view.record_produce(request_bytes))
    elif api_key == KAFKA_FETCH and not exempt:
        fetch_throttle = view.record_fetch(kafka_fetch_bytes(body) if fetch_bytes is None else fetch_bytes)
        if fetch_throttle:
            throttle = max(throttle, fetch_throttle)
            changes["responses"] = ()
    if throttle and hasattr(body, "throttle_time"):
        current = body.throttle_time
        current_ms = int(current.total_seconds() * 1000) if isinstance(current, datetime.timedelta) else int(current or 0)
        changes["throttle_time"] = datetime.timedelta(milliseconds=max(throttle, current_ms))
    return dataclasses.replace(body, **changes) if changes else body
