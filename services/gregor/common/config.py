"""Broker and topic configuration with Kafka's names, defaults and validation.

Every limit lives here with its default and a one-line reason, so the broker,
the controller and the CLI agree on what `retention.ms` means.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]
from gregor.common.tls import TLS_KEYS, TlsConfig

LONG_MAX = 9223372036854775807


@dataclass(frozen=True)
class ConfigDef:
    """One config key: its type, default, check and documentation."""

    name: str
    type: type
    default: Any
    doc: str
    check: Callable[[Any], bool] = lambda v: True
    choices: tuple[str, ...] = ()

    def parse(self, raw: Any) -> Any:
        try:
            if self.type is bool:
                if isinstance(raw, bool):
                    value: Any = raw
                elif str(raw).lower() in ("true", "false"):
                    value = str(raw).lower() == "true"
                else:
                    raise ValueError(raw)
            elif self.type is float:
                value = float(raw)
            elif self.type is int:
                value = int(raw)
            else:
                value = str(raw)
        except (TypeError, ValueError):
            raise InvalidConfigError(f"Invalid value {raw!r} for configuration {self.name}: expected {self.type.__name__}")
        if self.choices and value not in self.choices:
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {self.name}: must be one of {list(self.choices)}")
        if not self.check(value):
            raise InvalidConfigError(f"Invalid value {value!r} for configuration {self.name}: {self.doc}")
        return value


def _nonneg(v: int) -> bool:
    return v >= 0


def _pos(v: int) -> bool:
    return v > 0


def _unlimited_or_nonneg(v: int) -> bool:
    return v >= -1


# cleanup.policy values (Kafka's is a list; both orders of the pair are accepted).
CLEANUP_POLICIES = ("delete", "compact", "compact,delete", "delete,compact")


def is_compacted(topic_configs: Mapping[str, Any]) -> bool:
    """cleanup.policy includes compact: the log cleaner owns this log."""
    return "compact" in str(topic_configs.get("cleanup.policy", "delete")).split(",")


def is_retained_by_deletion(topic_configs: Mapping[str, Any]) -> bool:
    """cleanup.policy includes delete: retention.ms / retention.bytes apply."""
    return "delete" in str(topic_configs.get("cleanup.policy", "delete")).split(",")


# compression.type (topic and broker default): `producer` keeps the producer's codec; any other value
# makes the partition leader recompress batches in another codec (Kafka's LogValidator, KIP-390 levels).
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
COMPRESSION_CODECS = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def recompression_target(topic_configs: Mapping[str, Any]) -> tuple[int, int | None] | None:
    """(codec id, level) a leader recompresses produced batches into; None for compression.type=producer.

    The level is compression.gzip.level / .lz4.level / .zstd.level of that codec (None: the
    codec's default, gzip's -1 included).
    """
    codec = COMPRESSION_CODECS.get(str(topic_configs.get("compression.type", "producer")))
    if codec is None:
        return None
    level_key = {1: "compression.gzip.level", 3: "compression.lz4.level", 4: "compression.zstd.level"}.get(codec)
    level = topic_configs.get(level_key) if level_key else None
    return codec, (None if level is None or (codec == 1 and int(level) == -1) else int(level))


# Topic-level configs (kafka-topics --config), Kafka's defaults.
TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef("cleanup.policy", str, "delete",
                  "delete (retention), compact (log compaction) or both",
                  choices=CLEANUP_POLICIES),
        ConfigDef("compression.type", str, "producer",
                  "String must be one of: " + ", ".join(COMPRESSION_TYPES), lambda v: v in COMPRESSION_TYPES),
        ConfigDef("compression.gzip.level", int, -1, "Value must be between 1 and 9 or equal to -1",
                  lambda v: 1 <= v <= 9 or v == -1),
        ConfigDef("compression.lz4.level", int, 9, "Value must be between 1 and 17", lambda v: 1 <= v <= 17),
        ConfigDef("compression.zstd.level", int, 3, "Value must be between -131072 and 22",
                  lambda v: -131072 <= v <= 22),
        ConfigDef("delete.retention.ms", int, 86400000, "how long tombstones are kept (compacted topics)", _nonneg),
        ConfigDef("flush.messages", int, LONG_MAX, "fsync after this many messages", _pos),
        ConfigDef("flush.ms", int, LONG_MAX, "fsync when the last flush is older than this", _nonneg),
        ConfigDef("index.interval.bytes", int, 4096, "bytes between offset index entries", _nonneg),
        ConfigDef("max.message.bytes", int, 1048588, "largest record batch accepted", _pos),
        ConfigDef("message.timestamp.type", str, "CreateTime", "CreateTime only for now", choices=("CreateTime",)),
        ConfigDef("min.cleanable.dirty.ratio", float, 0.5, "between 0 and 1", lambda v: 0 <= v <= 1),
        ConfigDef("max.compaction.lag.ms", int, LONG_MAX, "must be >= 1", _pos),
        ConfigDef("min.compaction.lag.ms", int, 0, "must be >= 0", _nonneg),
        ConfigDef("min.insync.replicas", int, 1, "acks=all needs this many in-sync replicas", _pos),
        ConfigDef("retention.bytes", int, -1, "-1 for unlimited, else >= 0", _unlimited_or_nonneg),
        ConfigDef("retention.ms", int, 604800000, "-1 for unlimited, else >= 0", _unlimited_or_nonneg),
        ConfigDef("segment.bytes", int, 1073741824, "at least 14 bytes", lambda v: v >= 14),
        ConfigDef("segment.index.bytes", int, 10485760, "at least one 8-byte entry", lambda v: v >= 8),
        ConfigDef("segment.ms", int, 604800000, "at least 1", _pos),
        ConfigDef("unclean.leader.election.enable", bool, False, "true or false"),
    ]
}

# Broker-level names of the topic defaults (server.properties), Kafka's mapping.
BROKER_TOPIC_DEFAULT_KEYS: dict[str, str] = {
    "log.cleanup.policy": "cleanup.policy",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "log.retention.bytes": "retention.bytes",
    "log.segment.bytes": "segment.bytes",
    "log.index.size.max.bytes": "segment.index.bytes",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}


def validate_topic_configs(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Parse topic overrides; unknown keys and bad values raise InvalidConfigError."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            raise InvalidConfigError(f"Unknown topic config name: {key}")
        out[key] = definition.parse(value)
    return out


def effective_topic_configs(overrides: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every topic config: overrides over broker defaults over Kafka's defaults."""
    merged = {name: d.default for name, d in TOPIC_CONFIGS.items()}
    merged.update(defaults or {})
    merged.update(validate_topic_configs(overrides))
    return merged


REPLICA_FETCH_TRANSPORTS = ("data", "grpc")  # replica.fetch.transport


@dataclass
class BrokerConfig:
    """A broker's settings, server.properties names in snake case."""

    broker_id: int = 0
    log_dirs: str = "/tmp/gregor-logs"
    host: str = "127.0.0.1"
    port: int = 9092
    data_port: int = 0  # raw zero-copy fetch port; 0 picks a free one, -1 disables
    # listeners / advertised.listeners: the Kafka-protocol listener, PLAINTEXT://host:port (port 0 picks a
    # free one); empty: no Kafka listener. `gregor cluster up` turns it on (docs/kafka-protocol.md).
    listeners: str = ""
    advertised_listeners: str = ""
    metrics_port: int = 0  # Prometheus /metrics; 0 picks a free one, -1 disables
    cluster_id: str = "gregor"  # with etcd: the cluster name, keys live under /gregor/<cluster_id>/
    etcd_endpoints: str = ""  # zookeeper.connect's counterpart; empty runs the broker standalone
    broker_session_timeout_ms: int = 10000  # lease TTL of brokers/ids/<id>: a dead broker is noticed within it
    broker_rack: str = ""  # broker.rack
    num_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor
    delete_topic_enable: bool = True  # delete.topic.enable
    auto_create_topics_enable: bool = False  # deliberate deviation: explicit topics only
    log_retention_check_interval_ms: int = 300000  # log.retention.check.interval.ms
    log_flush_scheduler_interval_ms: int = LONG_MAX  # log.flush.scheduler.interval.ms
    log_cleaner_enable: bool = True  # log.cleaner.enable: compact topics with cleanup.policy=compact
    log_cleaner_threads: int = 1  # log.cleaner.threads
    # num.recovery.threads.per.data.dir (Kafka's default 2): threads per log dir that flush and close the logs at
    # shutdown (LogManager.close); a log is opened when a LeaderAndIsr names it, on the loop (LogManager.open_logs).
    num_recovery_threads_per_data_dir: int = 2
    log_cleaner_backoff_ms: int = 15000  # log.cleaner.backoff.ms: sleep when no log needs cleaning
    log_cleaner_dedupe_buffer_size: int = 134217728  # log.cleaner.dedupe.buffer.size (all threads together)
    replica_lag_time_max_ms: int = 30000  # replica.lag.time.max.ms
    # replica.fetch.transport: how a follower fetches from its leaders. data (default): the leader's data port, a
    # framed TCP connection per leader (data_port.py; gRPC when the leader has no data port); grpc: the gRPC
    # ReplicaFetch stream. Both carry the same fetch session (docs/replication.md).
    replica_fetch_transport: str = "data"
    controlled_shutdown_enable: bool = True  # controlled.shutdown.enable: move leadership away before stopping
    controlled_shutdown_max_retries: int = 3  # controlled.shutdown.max.retries
    controlled_shutdown_retry_backoff_ms: int = 5000  # controlled.shutdown.retry.backoff.ms
    producer_id_expiration_ms: int = 86400000  # producer.id.expiration.ms: idle producers' state is dropped
    socket_request_max_bytes: int = 104857600  # socket.request.max.bytes: largest gRPC message
    fetch_max_bytes: int = 57671680  # fetch.max.bytes (broker cap on one fetch response)
    # max.incremental.fetch.session.cache.slots: consumer fetch sessions (KIP-227) the broker keeps, least
    # recently used evicted first; the Kafka listener's and the gRPC consumers' sessions share the cache.
    max_incremental_fetch_session_cache_slots: int = 1000
    num_network_threads: int = 3  # num.network.threads: threads that run the data port's sendfile transfers
    data_port_send_timeout_ms: int = 30000  # a data-port peer that reads nothing for this long is disconnected
    # kafka.fetch.zero.copy.enable: Fetch on a plain-text Kafka listener sends the records with sendfile (on the
    # num.network.threads pool); false reads them into the response as TLS connections do (kafka/zero_copy.py).
    kafka_fetch_zero_copy_enable: bool = True
    # metrics.partition.level.enable: per-partition log metrics (one series per replica); topic-level by default
    # so a broker with thousands of partitions does not flood Prometheus.
    metrics_partition_level_enable: bool = False
    # metrics.topic.enable: publish this broker's samples to __gregor_metrics (docs/metrics.md), off by default.
    metrics_topic_enable: bool = False
    metrics_topic_interval_ms: int = 10000  # metrics.topic.interval.ms: one sample batch per interval
    metrics_topic_replication_factor: int = 1  # metrics.topic.replication.factor, used when the broker creates it
    # The authorizer (issue 23, docs/security.md): any non-empty authorizer.class.name turns it on (the ACLs
    # live in etcd); super.users is `User:a;User:b`; allow.everyone.if.no.acl.found is false as in Kafka.
    authorizer_class_name: str = ""
    super_users: str = ""
    allow_everyone_if_no_acl_found: bool = False
    ssl_principal_mapping_rules: str = "DEFAULT"  # ssl.principal.mapping.rules: certificate subject -> user name
    topic_defaults: dict[str, Any] = field(default_factory=dict)  # from log.* keys
    # The properties the broker was started with (its STATIC_BROKER_CONFIG layer): dynamic broker configs
    # (common/broker_configs.py) are resolved over them, and DescribeConfigs tells static from default.
    static_properties: dict[str, str] = field(default_factory=dict)
    # security.protocol / ssl.*: TLS on the gRPC port, the data port, the Kafka listener and every channel
    # the broker opens (gregor.common.tls, docs/security.md).
    tls: TlsConfig = field(default_factory=TlsConfig)

    @property
    def log_dir_list(self) -> list[str]:
        """log.dirs as a list (comma-separated, empty entries ignored)."""
        return [d for d in self.log_dirs.split(",") if d]

    @classmethod
    def from_properties(cls, props: Mapping[str, str], **base: Any) -> "BrokerConfig":
        """Build from Kafka-style dotted keys (`log.retention.ms=...`); bad values raise InvalidConfigError.

        Time units follow Kafka's precedence: log.retention.ms over log.retention.minutes over
        log.retention.hours, and log.roll.ms over log.roll.hours, whatever the order of the keys.
        """
        cfg = cls(**base)
        names = {f.name for f in dataclasses.fields(cls)}
        topic_defaults: dict[str, Any] = {}
        timed: dict[str, int] = {}  # the unit-suffixed time keys, resolved once all keys are read
        if any(key in TLS_KEYS for key in props):
            cfg.tls = TlsConfig.from_properties(props)
        for key, value in props.items():
            if key in TLS_KEYS:
                continue
            if key in _TIME_UNIT_KEYS:
                timed[key] = _parse_int(key, value)
            elif key in BROKER_TOPIC_DEFAULT_KEYS:
                topic_name = BROKER_TOPIC_DEFAULT_KEYS[key]
                topic_defaults[topic_name] = TOPIC_CONFIGS[topic_name].parse(value)
            elif key.replace(".", "_") in names:
                attr = key.replace(".", "_")
                current = getattr(cfg, attr)
                if isinstance(current, bool):
                    if str(value).lower() not in ("true", "false"):
                        raise InvalidConfigError(f"Invalid value {value!r} for broker configuration {key}: "
                                                 f"expected true or false")
                    parsed: Any = str(value).lower() == "true"
                else:
                    try:
                        parsed = type(current)(value)
                    except (TypeError, ValueError):
                        raise InvalidConfigError(
                            f"Invalid value {value!r} for broker configuration {key}: "
                            f"expected {type(current).__name__}") from None
                setattr(cfg, attr, parsed)
            else:
                raise InvalidConfigError(f"Unknown broker configuration: {key}")
        for topic_name, keys in TIME_PRECEDENCE.items():
            for key, millis_per_unit in keys:
                if key in timed:
                    millis = timed[key] * millis_per_unit
                    if topic_name == "retention.ms" and millis < 0:
                        millis = -1  # Kafka: any negative retention means unlimited
                    topic_defaults[topic_name] = TOPIC_CONFIGS[topic_name].parse(millis)
                    break
        if cfg.replica_fetch_transport not in REPLICA_FETCH_TRANSPORTS:
            raise InvalidConfigError(f"Invalid value {cfg.replica_fetch_transport!r} for broker configuration "
                                     f"replica.fetch.transport: must be one of {list(REPLICA_FETCH_TRANSPORTS)}")
        if cfg.num_recovery_threads_per_data_dir < 1:
            raise InvalidConfigError(f"Invalid value {cfg.num_recovery_threads_per_data_dir} for broker configuration "
                                     f"num.recovery.threads.per.data.dir: Value must be at least 1")
        cfg.topic_defaults = {**cfg.topic_defaults, **topic_defaults}
        cfg.static_properties = {**cfg.static_properties, **{str(k): str(v) for k, v in props.items()}}
        return cfg


def _parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"Invalid value {value!r} for broker configuration {key}: expected int")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"Invalid value {value!r} for broker configuration {key}: expected int") from None


# Broker time keys with a unit, highest precedence first (Kafka's KafkaConfig.logRetentionTimeMillis / logRollTimeMillis).
TIME_PRECEDENCE: dict[str, tuple[tuple[str, int], ...]] = {
    "retention.ms": (("log.retention.ms", 1), ("log.retention.minutes", 60_000), ("log.retention.hours", 3_600_000)),
    "segment.ms": (("log.roll.ms", 1), ("log.roll.hours", 3_600_000)),
}
_TIME_UNIT_KEYS = frozenset(key for keys in TIME_PRECEDENCE.values() for key, _ in keys)


def log_config_kwargs(topic_configs: Mapping[str, Any]) -> dict[str, Any]:
    """The native LogConfig arguments for a topic's effective configs."""
    c = topic_configs
    deletes = is_retained_by_deletion(c)  # compact alone: no time or size retention (Kafka)
    return {
        "segment_bytes": int(c["segment.bytes"]),
        "segment_ms": int(c["segment.ms"]),
        "segment_index_bytes": int(c["segment.index.bytes"]),
        "index_interval_bytes": int(c["index.interval.bytes"]),
        "retention_bytes": int(c["retention.bytes"]) if deletes else -1,
        "retention_ms": int(c["retention.ms"]) if deletes else -1,
        "flush_messages": int(c["flush.messages"]),
        "flush_ms": int(c["flush.ms"]),
        "max_message_bytes": int(c["max.message.bytes"]),
        "compact": is_compacted(c),  # leader appends then refuse keyless records (INVALID_RECORD)
    }
