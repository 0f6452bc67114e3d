"""Kafka's client quotas as pure logic: the quota configs, their entities and precedence, and the rate.

A quota entity is a user principal name, a client id, or both, each possibly `<default>`. For a
request from (user, client-id) the quota of a type is the first entity, in Kafka's order, that sets it:

    1. /config/users/<user>/clients/<client-id>     5. /config/users/<default>/clients/<default>
    2. /config/users/<user>/clients/<default>       6. /config/users/<default>
    3. /config/users/<user>                         7. /config/clients/<client-id>
    4. /config/users/<default>/clients/<client-id>  8. /config/clients/<default>

The entity that matched also names the *sensor* the request's bytes go to (Kafka's quotaMetricTags):
a user-level quota is shared by every client id of that user, a client-id-level quota by every user
with that client id, and a `<default>` level gives each user / client id its own quota of that size.

`Rate` is Kafka's SampledStat-based rate: `quota.window.num` (11) samples of `quota.window.size.seconds`
(1 s), the retained total divided by the time since the oldest retained sample. Over the quota the
throttle time is Kafka's `(observed - quota) / quota * window`: how long the excess takes to drain at
the quota rate.

One deliberate difference: the window is at least one sample window, as in Kafka's SimpleRate (which
its replication throttle uses), not (num - 1) windows as in the Rate its client quotas use. Rate
assumes 10 s of empty history for a new (or long idle) client, so a greedy client may send 10 s worth
of quota at once; and because it takes that budget back whenever the burst's sample expires, it does
so again every 11 s for as long as it runs. Measured on a real broker (50 kB/s quota, 8 kB requests):
throughput over 30 s windows swung between 0.80 and 1.10 of the quota with Rate; with SimpleRate's
window every 30 s window is within 2 % (and tests/unit/common/test_quotas.py checks 10 %).

Concurrency: none (plain objects, owned by one event loop; times are passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

CLIENT_ID_METADATA = "client-id"  # the gRPC metadata key carrying client.id (Kafka's request header field)
# Marks a coordinator call a Gregor service makes for a request it metered already (the Kafka listener relaying
# JoinGroup, EndTxn...) or for itself (coordinator to coordinator): the coordinators do not meter it again, as
# Kafka meters a request once, on the broker that received it (coordinator/quotas.py; honoured from a caller
# allowed ClusterAction when the authorizer is on).
RELAYED_METADATA = ("gregor-relayed", "1")
DEFAULT = "<default>"  # Kafka's ConfigEntityName.Default
ANONYMOUS = "ANONYMOUS"  # KafkaPrincipal.ANONYMOUS's name: the user of a plain-text connection

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
QUOTA_CONFIGS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)

# Kafka's broker defaults: quota.window.num and quota.window.size.seconds.
QUOTA_WINDOW_NUM = 11
QUOTA_WINDOW_SIZE_SECONDS = 1


class QuotaConfigError(ValueError):
    """A quota config name or value Kafka would refuse (INVALID_CONFIG / INVALID_REQUEST)."""


def validate_quota_configs(configs: Mapping[str, str]) -> dict[str, float]:
    """The configs as numbers; QuotaConfigError for an unknown name or a value that is not a positive number."""
    unknown = sorted(set(configs) - set(QUOTA_CONFIGS))
    if unknown:
        raise QuotaConfigError(f"Invalid config(s): {','.join(unknown)} (client quotas take "
                               f"{', '.join(QUOTA_CONFIGS)})")
    out: dict[str, float] = {}
    for name, raw in configs.items():
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise QuotaConfigError(f"Invalid value {raw!r} for quota config {name}: not a number") from None
        if not math.isfinite(value) or not value > 0:
            raise QuotaConfigError(f"Invalid value {raw!r} for quota config {name}: must be a positive number")
        if name != REQUEST_PERCENTAGE and value != int(value):
            raise QuotaConfigError(f"Invalid value {raw!r} for quota config {name}: not an integer (a LONG)")
        out[name] = value
    return out


@dataclass(frozen=True, order=True)
class QuotaEntity:
    """A quota config entity: user and/or client id (each a name, DEFAULT, or None when not part of it)."""

    user: Optional[str] = None
    client_id: Optional[str] = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise QuotaConfigError("a quota entity names a user, a client id, or both")

    def describe(self) -> str:
        """kafka-configs.sh's words: `user-principal 'alice', client-id 'c1'` / `the default user-principal`."""
        parts = []
        if self.user is not None:
            parts.append("the default user-principal" if self.user == DEFAULT else f"user-principal '{self.user}'")
        if self.client_id is not None:
            parts.append("the default client-id" if self.client_id == DEFAULT else f"client-id '{self.client_id}'")
        return ", ".join(parts)


@dataclass(frozen=True)
class QuotaMatch:
    """The quota that applies to a request and the sensor its usage is recorded under (user, client-id tags)."""

    bound: Optional[float]  # None: no quota of this type applies
    user_tag: str
    client_tag: str


NO_QUOTA = QuotaMatch(None, "", "")


def precedence(user: str, client_id: str) -> list[tuple[QuotaEntity, tuple[str, str]]]:
    """The eight entities in Kafka's order, each with the sensor tags a match there gives."""
    both = (user, client_id)
    return [(QuotaEntity(user, client_id), both), (QuotaEntity(user, DEFAULT), both),
            (QuotaEntity(user, None), (user, "")), (QuotaEntity(DEFAULT, client_id), both),
            (QuotaEntity(DEFAULT, DEFAULT), both), (QuotaEntity(DEFAULT, None), (user, "")),
            (QuotaEntity(None, client_id), ("", client_id)), (QuotaEntity(None, DEFAULT), ("", client_id))]


class QuotaConfigs:
    """Every quota entity's configs, and the resolution of (user, client-id) to a quota per type (cached)."""

    def __init__(self) -> None:
        self.entities: dict[QuotaEntity, dict[str, float]] = {}
        self._resolved: dict[tuple[str, str, str], QuotaMatch] = {}

    def set(self, entity: QuotaEntity, configs: Mapping[str, float]) -> None:
        """Replace an entity's configs (empty: the entity has none left)."""
        if configs:
            self.entities[entity] = dict(configs)
        else:
            self.entities.pop(entity, None)
        self._resolved.clear()

    def replace_all(self, entities: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        self.entities = {e: dict(c) for e, c in entities.items() if c}
        self._resolved.clear()

    def any_of(self, quota: str) -> bool:
        return any(quota in c for c in self.entities.values())

    def resolve(self, quota: str, user: str, client_id: str) -> QuotaMatch:
        """The quota of type `quota` for (user, client-id), by Kafka's precedence; NO_QUOTA without one."""
        key = (quota, user, client_id)
        match = self._resolved.get(key)
        if match is None:
            match = NO_QUOTA
            for entity, (u, c) in precedence(user, client_id):
                bound = self.entities.get(entity, {}).get(quota)
                if bound is not None:
                    match = QuotaMatch(bound, u, c)
                    break
            if len(self._resolved) > 100_000:  # many distinct client ids: never grow without bound
                self._resolved.clear()
            self._resolved[key] = match
        return match

    def describe(self, user: Optional[str] = None,
                 client_id: Optional[str] = None) -> list[tuple[QuotaEntity, dict[str, float]]]:
        """Entities and their configs, sorted; with user and/or client_id given, only that exact entity."""
        if user is None and client_id is None:
            return sorted(self.entities.items(), key=lambda kv: _sort_key(kv[0]))
        entity = QuotaEntity(user, client_id)
        return [(entity, dict(self.entities[entity]))] if entity in self.entities else []


def _sort_key(e: QuotaEntity) -> tuple[str, str]:
    return (e.user if e.user is not None else "\x00", e.client_id if e.client_id is not None else "\x00")


def alter_configs(current: Mapping[str, float], add: Mapping[str, str], delete: Iterable[str]) -> dict[str, float]:
    """An entity's configs after kafka-configs.sh's --add-config / --delete-config (validated)."""
    removing = set(delete)
    unknown = sorted(removing - set(QUOTA_CONFIGS))
    if unknown:
        raise QuotaConfigError(f"Invalid config(s): {','.join(unknown)}")
    out = {k: v for k, v in current.items() if k not in removing}
    out.update(validate_quota_configs(add))
    return out


@dataclass
class Rate:
    """Kafka's Rate over a SampledStat (WindowedSum): per-second rate over the retained samples."""

    samples: int = QUOTA_WINDOW_NUM
    window_ms: int = QUOTA_WINDOW_SIZE_SECONDS * 1000
    # Each sample is [start_ms, value]; `_current` indexes the one being filled.
    _samples: list[list[float]] = field(default_factory=list)
    _current: int = 0

    def record(self, value: float, now_ms: float) -> None:
        if not self._samples:
            self._samples.append([now_ms, 0.0])
            self._current = 0
        sample = self._samples[self._current]
        if now_ms - sample[0] >= self.window_ms:  # complete: move to the next sample (reusing the oldest)
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._samples):
                self._samples.append([now_ms, 0.0])
            else:
                self._samples[self._current][:] = [now_ms, 0.0]
            sample = self._samples[self._current]
        sample[1] += value

    def _purge(self, now_ms: float) -> None:
        expire_ms = self.samples * self.window_ms
        for sample in self._samples:
            if now_ms - sample[0] >= expire_ms:
                sample[:] = [now_ms, 0.0]

    def window_size_ms(self, now_ms: float) -> float:
        """The window the rate divides by: since the oldest retained sample, at least one window
        (Kafka's SimpleRate; see the module docstring for why not Rate's (samples - 1) windows)."""
        self._purge(now_ms)
        oldest = min((s[0] for s in self._samples), default=now_ms)
        return max(now_ms - oldest, float(self.window_ms))

    def measure(self, now_ms: float) -> float:
        """The rate per second."""
        window = self.window_size_ms(now_ms)
        return sum(s[1] for s in self._samples) / (window / 1000)

    def throttle_time_ms(self, bound: float, now_ms: float) -> int:
        """Kafka's throttle time for this rate against `bound` per second: 0 when within it."""
        window = self.window_size_ms(now_ms)
        observed = sum(s[1] for s in self._samples) / (window / 1000)
        if observed <= bound:
            return 0
        return round((observed - bound) / bound * window)

    def max_value_in_window(self, bound: float) -> float:
        """Kafka's getMaxValueInQuotaWindow: the most a single request may take (bound x (num - 1) windows)."""
        return bound * (self.samples - 1) * self.window_ms / 1000
