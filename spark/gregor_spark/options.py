"""The source's options, named and worded as Spark's Kafka source names and words them (pure: no I/O).

Spark passes options case-insensitively (a CaseInsensitiveDict), so every lookup
here lower-cases; the messages name options in Spark's documented camelCase.
Offsets JSON is Spark's: `{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}` with -2
earliest and -1 latest; `assign` is `{"topicA":[0,1],"topicB":[2,4]}`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

EARLIEST = -2  # Kafka's ListOffsets sentinel, and Spark's per-partition JSON value for "earliest"
LATEST = -1  # ... and for "latest"

STRATEGY_KEYS = ("subscribe", "subscribePattern", "assign")
OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[0,1]}'
TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":-1}}'

# Defaults, one place each, with why.
DEFAULT_FETCH_TIMEOUT_MS = 120000  # Spark's kafkaConsumer.pollTimeoutMs: a fetch that long means the broker is gone
DEFAULT_BOOTSTRAP_DATA_DIR = "./.gregor"  # the CLI's default local cluster (DESIGN.md: GREGOR_DATA_DIR)

TopicPartition = tuple[str, int]


class GregorSourceError(ValueError):
    """A bad option, worded as Spark's Kafka source words it (IllegalArgumentException there)."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: earliest/latest, per-partition offsets, or timestamps."""

    kind: str  # "earliest" | "latest" | "offsets" | "timestamps" | "timestamp"
    offsets: Mapping[TopicPartition, int] = field(default_factory=dict)  # offsets, or timestamps (ms)
    timestamp: int = -1  # kind "timestamp": one time for every partition

    def resolve(self, tp: TopicPartition, default: str) -> tuple[str, int]:
        """("offset", o) / ("earliest", -2) / ("latest", -1) / ("timestamp", ms) for one partition."""
        if self.kind in ("earliest", "latest"):
            return self.kind, EARLIEST if self.kind == "earliest" else LATEST
        if self.kind == "timestamp":
            return "timestamp", self.timestamp
        if tp not in self.offsets:
            return default, EARLIEST if default == "earliest" else LATEST
        v = self.offsets[tp]
        if self.kind == "timestamps":
            return ("latest", LATEST) if v == LATEST else ("earliest", EARLIEST) if v == EARLIEST else ("timestamp", v)
        return ("earliest", EARLIEST) if v == EARLIEST else ("latest", LATEST) if v == LATEST else ("offset", v)


@dataclass(frozen=True)
class SourceOptions:
    strategy: str  # subscribe | subscribePattern | assign
    topics: tuple[str, ...] = ()
    pattern: Optional[str] = None
    assign: tuple[TopicPartition, ...] = ()
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    max_offsets_per_trigger: Optional[int] = None
    min_partitions: Optional[int] = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    bootstrap: str = ""
    isolation_read_committed: bool = False
    timestamp_strategy_latest: bool = False  # startingOffsetsByTimestampStrategy=latest
    fetch_transport: str = "grpc"
    fetch_timeout_ms: int = DEFAULT_FETCH_TIMEOUT_MS
    # kafka.security.protocol, kafka.ssl.truststore.location, ... (Spark's kafka.-prefixed consumer options):
    # TLS to the brokers, as the Gregor client takes them (gregor.common.tls).
    security: tuple[tuple[str, str], ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether a topic is part of this source (subscribe / subscribePattern)."""
        if self.strategy == "subscribe":
            return topic in self.topics
        assert self.pattern is not None
        return re.fullmatch(self.pattern, topic) is not None


def lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise GregorSourceError(f"option '{key}' must be true or false, got '{raw}'")
    return raw.strip().lower() == "true"


def _positive(opts: Mapping[str, str], key: str) -> Optional[int]:
    raw = opts.get(key.lower())
    if raw is None:
        return None
    try:
        v = int(raw)
    except ValueError:
        v = 0
    if v <= 0:
        raise GregorSourceError(f"Invalid value '{raw}' for option '{key}', must be a positive integer")
    return v


def _json(raw: str, example: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise GregorSourceError(f"Expected e.g. {example}, got {raw}") from None


def parse_assign(raw: str) -> tuple[TopicPartition, ...]:
    """`{"topicA":[0,1]}` -> (("topicA", 0), ("topicA", 1)) (Spark's JsonUtils.partitions)."""
    obj = _json(raw, ASSIGN_EXAMPLE)
    if not isinstance(obj, dict) or not all(
            isinstance(ps, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in ps)
            for ps in obj.values()):
        raise GregorSourceError(f"Expected e.g. {ASSIGN_EXAMPLE}, got {raw}")
    out = tuple((t, p) for t, ps in obj.items() for p in ps)
    if not out:
        raise GregorSourceError(f"No topicpartitions to assign as specified value for option 'assign' is '{raw}'")
    return out


def parse_partition_offsets(raw: str, example: str = OFFSETS_EXAMPLE) -> dict[TopicPartition, int]:
    """`{"topicA":{"0":23,"1":-1}}` -> {("topicA", 0): 23, ("topicA", 1): -1} (Spark's JsonUtils.partitionOffsets)."""
    obj = _json(raw, example)
    out: dict[TopicPartition, int] = {}
    if not isinstance(obj, dict):
        raise GregorSourceError(f"Expected e.g. {example}, got {raw}")
    for topic, parts in obj.items():
        if not isinstance(parts, dict):
            raise GregorSourceError(f"Expected e.g. {example}, got {raw}")
        for p, off in parts.items():
            if not re.fullmatch(r"\d+", str(p)) or not isinstance(off, int) or isinstance(off, bool):
                raise GregorSourceError(f"Expected e.g. {example}, got {raw}")
            out[(topic, int(p))] = off
    return out


def _offset_spec(opts: Mapping[str, str], key: str, by_ts_key: str, ts_key: str, default: str) -> OffsetSpec:
    """Spark's precedence: global timestamp, then per-partition timestamps, then offsets."""
    if ts_key.lower() in opts:
        raw = opts[ts_key.lower()]
        if not re.fullmatch(r"\d+", raw.strip()):
            raise GregorSourceError(f"option '{ts_key}' must be milliseconds since the epoch, got '{raw}'")
        return OffsetSpec("timestamp", timestamp=int(raw))
    if by_ts_key.lower() in opts:
        return OffsetSpec("timestamps", parse_partition_offsets(opts[by_ts_key.lower()], TIMESTAMPS_EXAMPLE))
    given = opts.get(key.lower())
    if given is None:
        return OffsetSpec(default)
    word = given.strip().lower()
    if word in ("earliest", "latest"):
        return OffsetSpec(word)
    return OffsetSpec("offsets", parse_partition_offsets(given))


def default_bootstrap() -> str:
    """GREGOR_BOOTSTRAP, else the `bootstrap` of the local cluster's cluster.json (GREGOR_DATA_DIR or ./.gregor)."""
    env = os.environ.get("GREGOR_BOOTSTRAP")
    if env:
        return env
    path = os.path.join(os.environ.get("GREGOR_DATA_DIR") or DEFAULT_BOOTSTRAP_DATA_DIR, "cluster.json")
    try:
        with open(path) as f:
            return str(json.load(f)["bootstrap"])
    except (OSError, ValueError, KeyError):
        raise GregorSourceError(
            f"option 'bootstrap' (or 'kafka.bootstrap.servers') is not set and no local cluster was found at {path}: "
            "give host:port of any broker, or set GREGOR_BOOTSTRAP / GREGOR_DATA_DIR") from None


def bootstrap_of(opts: Mapping[str, str]) -> str:
    return opts.get("bootstrap") or opts.get("kafka.bootstrap.servers") or default_bootstrap()


def parse_source(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Every read option checked as Spark's KafkaSourceProvider checks them."""
    opts = lower(options)
    given = [k for k in STRATEGY_KEYS if k.lower() in opts]
    if not given:
        raise GregorSourceError("One of the following options must be specified for Gregor source: "
                                f"{', '.join(STRATEGY_KEYS)}. See the docs for more details.")
    if len(given) > 1:
        raise GregorSourceError("Only one of the following options can be specified for Gregor source: "
                                f"{', '.join(STRATEGY_KEYS)}. See the docs for more details.")
    strategy = given[0]
    raw = opts[strategy.lower()]
    kw: dict[str, Any] = {"strategy": strategy}
    if strategy == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise GregorSourceError(f"No topics to subscribe to as specified value for option 'subscribe' is '{raw}'")
        kw["topics"] = topics
    elif strategy == "subscribePattern":
        if not raw.strip():
            raise GregorSourceError(
                f"Pattern to subscribe is empty as specified value for option 'subscribePattern' is '{raw}'")
        try:
            re.compile(raw)
        except re.error as exc:
            raise GregorSourceError(f"option 'subscribePattern' is not a valid regular expression: {exc}") from None
        kw["pattern"] = raw.strip()
    else:
        kw["assign"] = parse_assign(raw)
    starting = _offset_spec(opts, "startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp",
                            "latest" if streaming else "earliest")
    ending = _offset_spec(opts, "endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp", "latest")
    if streaming and any(k in opts for k in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp")):
        raise GregorSourceError("Ending offset not valid in streaming queries")
    if not streaming:
        _check_batch_offsets(starting, ending)
    isolation = opts.get("isolation.level", opts.get("kafka.isolation.level", "read_uncommitted"))
    if isolation not in ("read_uncommitted", "read_committed"):
        raise GregorSourceError(f"option 'isolation.level' must be read_uncommitted or read_committed, got '{isolation}'")
    ts_strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if ts_strategy not in ("error", "latest"):
        raise GregorSourceError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, got '{ts_strategy}'")
    transport = opts.get("fetch.transport", "grpc")
    if transport not in ("grpc", "data"):
        raise GregorSourceError(f"option 'fetch.transport' must be grpc or data, got '{transport}'")
    return SourceOptions(
        **kw, starting=starting, ending=ending,
        max_offsets_per_trigger=_positive(opts, "maxOffsetsPerTrigger"),
        min_partitions=_positive(opts, "minPartitions"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        bootstrap=bootstrap_of(opts),
        isolation_read_committed=isolation == "read_committed",
        timestamp_strategy_latest=ts_strategy == "latest",
        fetch_transport=transport,
        fetch_timeout_ms=_positive(opts, "kafkaConsumer.pollTimeoutMs") or DEFAULT_FETCH_TIMEOUT_MS,
        security=security_options(options),
    )


def security_options(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The kafka.security.protocol / kafka.ssl.* options, prefix removed (keys as the client spells them)."""
    from gregor.common.tls import CLIENT_TLS_KEYS

    out = []
    for key, value in options.items():
        name = key[len("kafka."):] if key.lower().startswith("kafka.") else ""
        match = next((k for k in CLIENT_TLS_KEYS if k.lower() == name.lower()), None)
        if match:
            out.append((match, value))
    return tuple(sorted(out))


def _check_batch_offsets(starting: OffsetSpec, ending: OffsetSpec) -> None:
    """Spark's batch rules: a batch never starts at latest nor ends at earliest."""
    if starting.kind == "latest":
        raise GregorSourceError("starting offset can't be latest for batch queries on Gregor")
    if ending.kind == "earliest":
        raise GregorSourceError("ending offset can't be earliest for batch queries on Gregor")
    for tp, off in (starting.offsets.items() if starting.kind == "offsets" else ()):
        if off == LATEST:
            raise GregorSourceError(f"startingOffsets for {tp[0]}-{tp[1]} can't be latest for batch queries on Gregor")
    for tp, off in (ending.offsets.items() if ending.kind == "offsets" else ()):
        if off == EARLIEST:
            raise GregorSourceError(f"endingOffsets for {tp[0]}-{tp[1]} can't be earliest for batch queries on Gregor")


@dataclass(frozen=True)
class SinkOptions:
    topic: Optional[str]
    bootstrap: str
    producer: dict[str, str]  # kafka.* options passed to the producer (acks, linger.ms, compression.type, ...)


def parse_sink(options: Mapping[str, str]) -> SinkOptions:
    opts = lower(options)
    producer = {k[len("kafka."):]: v for k, v in options.items()
                if k.lower().startswith("kafka.") and k.lower() != "kafka.bootstrap.servers"}
    return SinkOptions(topic=opts.get("topic") or None, bootstrap=bootstrap_of(opts), producer=producer)
