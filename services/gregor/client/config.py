"""Producer, consumer and admin client configuration: Kafka's key names, defaults and validation, in one place.

Users carry their Kafka knowledge over: `linger.ms`, `batch.size`,
`fetch.max.wait.ms` mean here what they mean for the Java client. Unknown keys
and bad values raise ConfigError (an INVALID_CONFIG GregorError) before any
connection is made.
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping

from dataclasses import dataclass

from gregor.client.partitioner import PartitionerClassError, resolve_partitioner_class
from gregor.common.config import ConfigDef
from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]

INT32_MAX = 2147483647


class ConfigError(InvalidConfigError):  # type: ignore[misc,valid-type]
    """A client configuration key is unknown or its value is invalid."""


def _nonneg(v: int) -> bool:
    return v >= 0


def _pos(v: int) -> bool:
    return v > 0


def _d(name: str, type_: type, default: Any, doc: str, check: Any = None, choices: tuple[str, ...] = ()) -> ConfigDef:
    return ConfigDef(name, type_, default, doc, check or (lambda v: True), choices)


@dataclass(frozen=True)
class _PartitionerClassDef(ConfigDef):
    """partitioner.class: Kafka's CLASS type. The value becomes the class (or instance) it names; None or ""
    keep the built-in partitioner."""

    def parse(self, raw: Any) -> Any:
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        try:
            return resolve_partitioner_class(raw)
        except PartitionerClassError as exc:  # Kafka's ConfigException wording
            raise InvalidConfigError(f"Invalid value {raw} for configuration {self.name}: {exc}") from None


_COMMON = [
    _d("bootstrap.servers", str, "", "host:port[,host:port...] of any brokers; the rest is discovered"),
    _d("client.id", str, "", "a name for this client in broker logs and metrics"),
    _d("request.timeout.ms", int, 30000, "how long to wait for one RPC before failing or retrying it", _pos),
    _d("retry.backoff.ms", int, 100, "pause before retrying a failed request", _nonneg),
    _d("metadata.max.age.ms", int, 300000, "refresh metadata at least this often", _nonneg),
    _d("fetch.transport", str, "grpc", "grpc: one FetchPartitions session per leader broker (KIP-227); partition: "
       "one gRPC Fetch per partition (the old path, kept for comparison); data: the broker's zero-copy data port, "
       "one connection per partition (consumer only)", choices=("grpc", "partition", "data")),
    # Transport security (gregor.common.tls, docs/security.md): Kafka's client keys, PEM files.
    _d("security.protocol", str, "PLAINTEXT", "PLAINTEXT or SSL (TLS to every broker and coordinator)",
       choices=("PLAINTEXT", "SSL")),
    _d("ssl.truststore.location", str, "", "PEM file of the CA that signed the servers' certificates"),
    _d("ssl.truststore.type", str, "PEM", "PEM only", choices=("PEM",)),
    _d("ssl.keystore.location", str, "", "PEM file of this client's certificate (with its key unless "
       "ssl.key.location): presented to servers that require client authentication"),
    _d("ssl.keystore.type", str, "PEM", "PEM only", choices=("PEM",)),
    _d("ssl.key.location", str, "", "PEM file of this client's private key"),
    _d("ssl.endpoint.identification.algorithm", str, "https",
       "https: the server's certificate must name the host connected to; empty turns the check off",
       choices=("https", "")),
]

PRODUCER_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _COMMON + [
    _d("acks", str, "all", "0: no answer, 1: leader appended, all/-1: every in-sync replica has it",
       choices=("0", "1", "all", "-1")),
    _d("batch.size", int, 16384, "bytes per partition batch before it is sent without waiting for linger", _nonneg),
    # Kafka 3 defaults linger.ms to 0; Kafka 4 (KIP-1030) uses 5 ms, which batches far better
    # for a fraction of the latency. We follow Kafka 4.
    _d("linger.ms", int, 5, "wait this long for more records before sending a partial batch", _nonneg),
    _d("buffer.memory", int, 33554432, "bytes of records waiting to be sent; send() blocks beyond", _pos),
    _d("max.block.ms", int, 60000, "how long send() may block for buffer space or metadata", _nonneg),
    _d("max.in.flight.requests.per.connection", int, 5, "unanswered produce requests per broker", _pos),
    _d("retries", int, INT32_MAX, "resend a batch this often on retriable errors (bounded by delivery.timeout.ms)",
       _nonneg),
    _d("delivery.timeout.ms", int, 120000, "upper bound on reporting success or failure after send()", _pos),
    _d("compression.type", str, "none", "codec of produced batches",
       choices=("none", "gzip", "snappy", "lz4", "zstd")),
    _d("max.request.size", int, 1048576, "largest produce request (and so record) this producer sends", _pos),
    _d("partitioner.ignore.keys", bool, False, "true: sticky partitioning even for keyed records"),
    _PartitionerClassDef("partitioner.class", object, None,
                         "a Partitioner (gregor.client.partitioner) for records without a partition: an import "
                         "path package.module.Class or package.module:Class, one of Kafka's class names "
                         "(org.apache.kafka.clients.producer.RoundRobinPartitioner), or a class or instance; "
                         "unset: murmur2 of the key, sticky partitioning for null keys"),
    # Kafka 3.x: on by default; silently off when acks/retries/max.in.flight do not allow it,
    # unless set explicitly, then those are errors (seed 003: retries > 0, max.in.flight <= 5, acks = -1).
    _d("enable.idempotence", bool, True, "producer id + per-partition sequences: a retry never duplicates or "
       "reorders records (needs acks=all, retries > 0, max.in.flight.requests.per.connection <= 5)"),
    _d("transactional.id", str, "", "makes the producer transactional (seed 003): init_transactions(), "
       "begin/commit/abort_transaction(); implies enable.idempotence (and so acks=all)"),
    _d("transaction.timeout.ms", int, 60000, "the coordinator aborts a transaction open longer than this "
       "(bounded by the cluster's transaction.max.timeout.ms)", _pos),
]}

CONSUMER_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _COMMON + [
    _d("group.id", str, "", "consumer group: needed by subscribe() and commits"),
    # Consumer groups (seed 003, 6.4-6.5): membership, rebalance and assignor settings.
    _d("group.instance.id", str, "", "static membership: a restart within session.timeout.ms keeps the assignment"),
    _d("partition.assignment.strategy", str, "range",
       "assignors, most preferred first: range, roundrobin, sticky, cooperative-sticky (or Kafka's class names)"),
    _d("session.timeout.ms", int, 45000, "the coordinator drops a member it has not heard from for this long", _pos),
    _d("heartbeat.interval.ms", int, 3000, "heartbeat period (well under session.timeout.ms)", _pos),
    _d("max.poll.interval.ms", int, 300000, "leave the group when poll() is not called for this long", _pos),
    _d("default.api.timeout.ms", int, 60000, "time bound of blocking calls: commit_sync, committed, ...", _pos),
    _d("coordinator.bootstrap.servers", str, "",
       "Gregor only: host:port[,...] of any group coordinator, asked FindCoordinator when brokers do not answer it"),
    _d("auto.offset.reset", str, "latest", "where to start without a valid position",
       choices=("earliest", "latest", "none")),
    _d("enable.auto.commit", bool, True, "commit positions periodically (needs a group)"),
    _d("auto.commit.interval.ms", int, 5000, "how often to auto-commit", _nonneg),
    _d("fetch.min.bytes", int, 1, "the broker answers a fetch once this many bytes are there...", _nonneg),
    _d("fetch.max.wait.ms", int, 500, "...or after this long", _nonneg),
    _d("max.partition.fetch.bytes", int, 1048576, "bytes per partition per fetch (one batch at least)", _pos),
    _d("fetch.max.bytes", int, 52428800, "bytes buffered across partitions before fetching pauses", _pos),
    _d("max.poll.records", int, 500, "records one poll() returns at most", _pos),
    _d("isolation.level", str, "read_uncommitted", "read_committed hides aborted and open transactions",
       choices=("read_uncommitted", "read_committed")),
    _d("check.crcs", bool, True, "verify the CRC of every fetched batch"),
]}

ADMIN_CONFIGS: dict[str, ConfigDef] = {d.name: d for d in _COMMON}


def _validate(defs: Mapping[str, ConfigDef], raw: Mapping[str, Any] | None, kind: str) -> dict[str, Any]:
    out = {name: d.default for name, d in defs.items()}
    for key, value in (raw or {}).items():
        key = key.replace("_", ".") if key not in defs else key
        definition = defs.get(key)
        if definition is None:
            raise ConfigError(f"Unknown {kind} configuration {key!r}; known keys: {', '.join(sorted(defs))}")
        try:
            out[key] = definition.parse(value)
        except InvalidConfigError as exc:
            raise ConfigError(exc.message) from None
    return out


MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION_FOR_IDEMPOTENCE = 5  # the broker retains the last 5 batches per producer


def producer_config(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    """Every producer key with its value; kwargs may use underscores (linger_ms=10)."""
    given = {**(raw or {}), **kwargs}
    cfg = _validate(PRODUCER_CONFIGS, given, "producer")
    if cfg["acks"] == "all":
        cfg["acks"] = "-1"
    if cfg["delivery.timeout.ms"] < cfg["linger.ms"] + cfg["request.timeout.ms"]:
        # Kafka's rule: a batch must get at least one full attempt before it can expire.
        raise ConfigError("delivery.timeout.ms should be equal to or larger than linger.ms + request.timeout.ms")
    user_set = any((k if k in PRODUCER_CONFIGS else k.replace("_", ".")) == "enable.idempotence" for k in given)
    _validate_idempotence(cfg, user_set or bool(cfg["transactional.id"]))
    if cfg["transactional.id"] and not cfg["enable.idempotence"]:
        raise ConfigError("Cannot set a transactional.id without also enabling idempotence.")
    return cfg


def _validate_idempotence(cfg: dict[str, Any], user_set: bool) -> None:
    """Kafka 3.x's postProcessAndValidateIdempotenceConfigs, with its ConfigException messages.

    An explicit enable.idempotence=true with retries=0, acks other than all, or more
    than 5 requests in flight is an error; the default (true) quietly turns off.
    """
    if not cfg["enable.idempotence"]:
        return
    problems = []
    if cfg["retries"] == 0:
        problems.append("Must set retries to non-zero when using the idempotent producer.")
    if cfg["acks"] != "-1":
        problems.append("Must set acks to all in order to use the idempotent producer. "
                        "Otherwise we cannot guarantee idempotence.")
    if cfg["max.in.flight.requests.per.connection"] > MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION_FOR_IDEMPOTENCE:
        problems.append("Must set max.in.flight.requests.per.connection to at most 5 to use the idempotent "
                        "producer.")
    if problems and user_set:
        raise ConfigError(problems[0])
    if problems:
        cfg["enable.idempotence"] = False


def consumer_config(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return _validate(CONSUMER_CONFIGS, {**(raw or {}), **kwargs}, "consumer")


def admin_config(raw: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return _validate(ADMIN_CONFIGS, {**(raw or {}), **kwargs}, "admin")


def parse_bootstrap(servers: str) -> list[str]:
    """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2']; ConfigError if empty or malformed."""
    out = [s.strip() for s in servers.split(",") if s.strip()]
    if not out:
        raise ConfigError("bootstrap.servers is empty: give at least one host:port")
    for s in out:
        host, sep, port = s.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"bootstrap.servers entry {s!r} is not host:port")
    return out


# Kafka's client id sequences (ProducerConfig, ConsumerConfig, AdminClientConfig): one per kind of client.
_CLIENT_ID_SEQUENCES = {"producer": itertools.count(1), "consumer": itertools.count(1),
                        "adminclient": itertools.count(1)}


def client_id_for(cfg: Mapping[str, Any], kind: str) -> str:
    """client.id, or Kafka's default for a client of `kind`: producer-<transactional.id> or producer-N,
    consumer-<group.id>-N or consumer-N, adminclient-N. Every call of the client carries it (ClusterMetadata)."""
    given = str(cfg.get("client.id") or "")
    if given:
        return given
    if kind == "producer" and cfg.get("transactional.id"):
        return f"producer-{cfg['transactional.id']}"
    group = str(cfg.get("group.id") or "") if kind == "consumer" else ""
    return f"{kind}-{group}-{next(_CLIENT_ID_SEQUENCES[kind])}" if group else \
        f"{kind}-{next(_CLIENT_ID_SEQUENCES[kind])}"
