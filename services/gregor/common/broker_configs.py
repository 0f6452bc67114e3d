"""Kafka's dynamic broker configs (KIP-226): which broker keys may change at run time, their validation, and how a
broker resolves a key through its layers with Kafka's precedence and DescribeConfigs sources.

Layers, highest first (Kafka's DynamicBrokerConfig):

- DYNAMIC_BROKER_CONFIG: this broker's dynamic configs, etcd `config/brokers/<id>` (ZooKeeper's /config/brokers/<id>)
- DYNAMIC_DEFAULT_BROKER_CONFIG: the cluster-wide dynamic default, etcd `config/brokers/<default>`
- STATIC_BROKER_CONFIG: the broker's properties file (and --override)
- DEFAULT_CONFIG: Kafka's default

The controller is the one writer of the etcd keys (AdminService.AlterBrokerConfigs); every broker watches
`config/brokers/` (broker/dynamic_config.py) and re-applies the topic defaults to its hosted topics.

Accepted (DYNAMIC_KEYS): the broker-level topic defaults that Kafka updates dynamically (cluster-wide in Kafka's
"Dynamic Update Mode" column) and that Gregor's brokers apply to their logs and partitions: a topic without its
own override follows the new default, as in Kafka. Every other broker key is read-only here; keys Kafka can update
but Gregor would not apply (thread counts, replication throttles, listeners, SSL stores, unclean.leader.election
.enable which Gregor's controller reads from topic overrides only) are refused the same way rather than stored
without effect.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gregor.common import errors
from gregor.common.config import BROKER_TOPIC_DEFAULT_KEYS, TOPIC_CONFIGS, BrokerConfig, TIME_PRECEDENCE

DEFAULT_ENTITY = "<default>"  # Kafka's ConfigEntityName.Default

# Kafka's DescribeConfigsResponse ConfigSource ids.
UNKNOWN = 0
TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
SOURCE_NAMES = {TOPIC_CONFIG: "DYNAMIC_TOPIC_CONFIG", DYNAMIC_BROKER_CONFIG: "DYNAMIC_BROKER_CONFIG",
                DYNAMIC_DEFAULT_BROKER_CONFIG: "DYNAMIC_DEFAULT_BROKER_CONFIG",
                STATIC_BROKER_CONFIG: "STATIC_BROKER_CONFIG", DEFAULT_CONFIG: "DEFAULT_CONFIG", UNKNOWN: "UNKNOWN"}

# Keys Kafka updates dynamically that Gregor has no live effect for (or does not have): refused as read-only
# (INVALID_REQUEST "Cannot update these configs dynamically") rather than stored and ignored.
# unclean.leader.election.enable: Gregor's controller reads it from topic overrides only.
KAFKA_DYNAMIC_NOT_APPLIED = frozenset({
    "unclean.leader.election.enable", "num.io.threads", "num.network.threads", "num.replica.fetchers",
    "num.recovery.threads.per.data.dir", "background.threads", "log.cleaner.threads",
    "log.cleaner.io.max.bytes.per.second", "log.cleaner.dedupe.buffer.size", "log.cleaner.backoff.ms",
    "leader.replication.throttled.rate", "follower.replication.throttled.rate",
    "replica.alter.log.dirs.io.max.bytes.per.second", "max.connections", "max.connections.per.ip",
    "max.connection.creation.rate", "listeners", "advertised.listeners", "ssl.keystore.location",
    "ssl.keystore.password", "ssl.key.password", "ssl.truststore.location", "ssl.truststore.password",
    "sasl.jaas.config", "message.timestamp.type", "log.message.timestamp.type", "log.message.downconversion.enable",
    "metric.reporters", "producer.id.expiration.ms",
})

# Broker key -> the topic config it defaults (the time keys with units included, Kafka's synonyms).
TOPIC_DEFAULT_OF: dict[str, str] = {
    **{k: v for k, v in BROKER_TOPIC_DEFAULT_KEYS.items() if k not in KAFKA_DYNAMIC_NOT_APPLIED},
    **{key: topic for topic, keys in TIME_PRECEDENCE.items() for key, _ in keys},
}
DYNAMIC_KEYS = frozenset(TOPIC_DEFAULT_OF)

# Topic config -> its broker synonyms, highest precedence first (Kafka's ServerTopicConfigSynonyms).
SYNONYMS: dict[str, tuple[str, ...]] = {
    **{topic: (key,) for key, topic in BROKER_TOPIC_DEFAULT_KEYS.items()},
    **{topic: tuple(k for k, _ in keys) for topic, keys in TIME_PRECEDENCE.items()},
}

# The broker-level name DescribeConfigs lists for each topic default (Kafka lists every synonym; the unit-suffixed
# time keys are listed as their synonyms of log.retention.ms / log.roll.ms).
_LISTED: dict[str, str] = {keys[0]: topic for topic, keys in SYNONYMS.items()}
_TIME_UNIT_MS = {key: ms for keys in TIME_PRECEDENCE.values() for key, ms in keys}


def is_sensitive(name: str) -> bool:
    """Kafka's PASSWORD-typed configs (and JAAS configs) are sensitive: DescribeConfigs hides their values."""
    return name.endswith(".password") or name.endswith("sasl.jaas.config")


def static_keys() -> list[str]:
    """Every broker key Gregor knows that is not a topic default (BrokerConfig's scalar settings)."""
    return [f.name.replace("_", ".") for f in dataclasses.fields(BrokerConfig)
            if f.name not in ("topic_defaults", "tls", "static_properties")]


def entity_name(resource_name: str) -> str:
    """The etcd entity of a Kafka BROKER resource name: "" is the cluster-wide default."""
    return DEFAULT_ENTITY if resource_name in ("", DEFAULT_ENTITY) else resource_name


def check_entity(entity: str) -> None:
    if entity != DEFAULT_ENTITY and not entity.isdigit():
        raise errors.error_for(errors.Code.INVALID_REQUEST,
                               f"Invalid broker id {entity!r}: a broker id or the default ('' / {DEFAULT_ENTITY})")


def validate(configs: Mapping[str, str]) -> dict[str, str]:
    """A broker entity's dynamic configs as they would be stored; GregorError otherwise (Kafka's checks):
    a known but not dynamically updatable key -> INVALID_REQUEST "Cannot update these configs dynamically: ...",
    an unknown key or a bad value -> INVALID_CONFIG."""
    known = set(static_keys()) | set(BROKER_TOPIC_DEFAULT_KEYS) | KAFKA_DYNAMIC_NOT_APPLIED
    read_only = sorted(k for k in configs if k not in DYNAMIC_KEYS and k in known)
    if read_only:
        raise errors.error_for(errors.Code.INVALID_REQUEST,
                               f"Cannot update these configs dynamically: Set({', '.join(read_only)})")
    unknown = sorted(k for k in configs if k not in DYNAMIC_KEYS)
    if unknown:
        raise errors.error_for(errors.Code.INVALID_CONFIG, f"Unknown broker config name: {', '.join(unknown)}")
    out: dict[str, str] = {}
    for key, value in configs.items():
        try:
            if key in _TIME_UNIT_MS:
                parsed = int(value)
                millis = parsed * _TIME_UNIT_MS[key]
                TOPIC_CONFIGS[TOPIC_DEFAULT_OF[key]].parse(-1 if millis < 0 and TOPIC_DEFAULT_OF[key] == "retention.ms"
                                                            else millis)
            else:
                TOPIC_CONFIGS[TOPIC_DEFAULT_OF[key]].parse(value)
        except (ValueError, errors.GregorError) as exc:
            raise errors.error_for(errors.Code.INVALID_CONFIG,
                                   f"Invalid value {value!r} for configuration {key}: "
                                   f"{getattr(exc, 'message', exc)}") from None
        out[key] = str(value)
    return out


def altered(current: Mapping[str, str], set_: Mapping[str, str], delete: Iterable[str],
            replace: bool = False) -> dict[str, str]:
    """An entity's configs after an alter (replace: Kafka's legacy AlterConfigs, the given set replaces all)."""
    configs = {} if replace else {k: v for k, v in current.items() if k not in set(delete)}
    configs.update({k: str(v) for k, v in set_.items()})
    return validate(configs)


def topic_defaults(static: Mapping[str, str], default_layer: Mapping[str, str],
                   broker_layer: Mapping[str, str], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The broker's topic defaults with the dynamic layers over the static properties, resolved as Kafka resolves
    its merged properties (log.retention.ms over .minutes over .hours). A stored value that no longer validates is
    skipped, never fatal. base: the topic defaults the broker started with (a BrokerConfig built in code has
    them without properties), under whatever the properties and layers set."""
    merged: dict[str, str] = {k: v for k, v in static.items() if k in BROKER_TOPIC_DEFAULT_KEYS or k in _TIME_UNIT_MS}
    for layer in (default_layer, broker_layer):
        for k, v in layer.items():
            if k in DYNAMIC_KEYS:
                try:
                    validate({k: v})
                except errors.GregorError:
                    continue
                merged[k] = v
    return {**(base or {}), **BrokerConfig.from_properties(merged).topic_defaults}


@dataclass(frozen=True)
class Entry:
    """One DescribeConfigs entry of a BROKER (or an inherited TOPIC) resource."""

    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool = False
    synonyms: tuple[tuple[str, str | None, int], ...] = ()
    documentation: str = ""

    @property
    def is_default(self) -> bool:
        return self.source == DEFAULT_CONFIG


def _str(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _layers(static: Mapping[str, str], default_layer: Mapping[str, str],
            broker_layer: Mapping[str, str] | None) -> list[tuple[int, Mapping[str, str]]]:
    layers: list[tuple[int, Mapping[str, str]]] = []
    if broker_layer is not None:
        layers.append((DYNAMIC_BROKER_CONFIG, broker_layer))
    layers.append((DYNAMIC_DEFAULT_BROKER_CONFIG, default_layer))
    layers.append((STATIC_BROKER_CONFIG, static))
    return layers


def _synonyms(topic: str, layers: list[tuple[int, Mapping[str, str]]]) -> list[tuple[str, str | None, int]]:
    out: list[tuple[str, str | None, int]] = []
    for source, layer in layers:
        for key in SYNONYMS[topic]:
            if key in layer and (source == STATIC_BROKER_CONFIG or key in DYNAMIC_KEYS):
                out.append((key, layer[key], source))
    first = SYNONYMS[topic][0]
    out.append((first, _str(TOPIC_CONFIGS[topic].default), DEFAULT_CONFIG))
    return out


def broker_entries(config: BrokerConfig, static: Mapping[str, str], default_layer: Mapping[str, str],
                   broker_layer: Mapping[str, str]) -> list[Entry]:
    """Every config of this broker (Kafka's DescribeConfigs of BROKER <id>), with its source and synonyms."""
    out: list[Entry] = []
    layers = _layers(static, default_layer, broker_layer)
    effective = config.topic_defaults
    for name, topic in sorted(_LISTED.items()):
        syn = _synonyms(topic, layers)
        value = effective.get(topic, TOPIC_CONFIGS[topic].default)
        out.append(Entry(name, _str(value), syn[0][2], name not in DYNAMIC_KEYS, is_sensitive(name), tuple(syn),
                         TOPIC_CONFIGS[topic].doc))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f.name.replace("_", ".")
        if not isinstance(value, (int, str, bool)) or f.name in ("topic_defaults", "static_properties"):
            continue
        source = STATIC_BROKER_CONFIG if name in static else DEFAULT_CONFIG
        sensitive = is_sensitive(name)
        shown = None if sensitive else _str(value)
        out.append(Entry(name, shown, source, True, sensitive, ((name, shown, source),)))
    return sorted(out, key=lambda e: e.name)


def default_entries(default_layer: Mapping[str, str]) -> list[Entry]:
    """Kafka's DescribeConfigs of BROKER "" (the cluster-wide default): the stored dynamic defaults only."""
    return [Entry(k, None if is_sensitive(k) else v, DYNAMIC_DEFAULT_BROKER_CONFIG, False, is_sensitive(k),
                  ((k, v, DYNAMIC_DEFAULT_BROKER_CONFIG),))
            for k, v in sorted(default_layer.items())]


def inherited_topic_entry(topic: str, value: Any, static: Mapping[str, str], default_layer: Mapping[str, str],
                          broker_layer: Mapping[str, str]) -> Entry:
    """A topic config without a topic override: the broker's value, with the source of the layer it came from
    (DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG or DEFAULT_CONFIG), as Kafka
    describes a topic."""
    if topic not in SYNONYMS:
        return Entry(topic, _str(value), DEFAULT_CONFIG, False, False, ((topic, _str(value), DEFAULT_CONFIG),),
                     TOPIC_CONFIGS[topic].doc)
    syn = _synonyms(topic, _layers(static, default_layer, broker_layer))
    return Entry(topic, _str(value), syn[0][2], False, False, tuple(syn), TOPIC_CONFIGS[topic].doc)
