"""Partitioners: Kafka's default (murmur2 of the key, sticky for null keys), round-robin, and `partitioner.class`."""

from __future__ import annotations

import importlib
import random
from typing import Any, Mapping, Optional, Protocol, Sequence, runtime_checkable

from gregor.common import errors

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (signed 32-bit result), bit for bit, so keys land where Java puts them."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's Utils.toPositive: clear the sign bit (not abs, so MIN_VALUE maps to 0)."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions


class DefaultPartitioner:
    """Keyed records: murmur2 % partitions. Null keys: stick to one partition until its batch fills.

    The sticky partition (KIP-480) fills whole batches instead of spraying tiny
    ones over every partition; it moves on when the producer reports that the
    batch it was filling is full. Event-loop owned.
    """

    def __init__(self, ignore_keys: bool = False, rng: Optional[random.Random] = None) -> None:
        self.ignore_keys = ignore_keys
        self._sticky: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(self, topic: str, key: Optional[bytes], num_partitions: int,
                  available: Sequence[int] = ()) -> int:
        if key is not None and not self.ignore_keys:
            return partition_for_key(key, num_partitions)
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._choose(topic, num_partitions, available, previous=None)
        return current

    def on_batch_full(self, topic: str, partition: int, num_partitions: int, available: Sequence[int] = ()) -> None:
        """The batch of the sticky partition is full: pick a different partition for the next records."""
        if self._sticky.get(topic) == partition:
            self._choose(topic, num_partitions, available, previous=partition)

    def _choose(self, topic: str, num_partitions: int, available: Sequence[int], previous: Optional[int]) -> int:
        """A uniformly random partition of `available` (all when empty) other than `previous`, if there is one."""
        pool = available or range(num_partitions)
        count = len(pool)
        # Draw among the count - 1 others without building their list (once per batch): the previous
        # partition's slot, if drawn, stands for the last one.
        others = count - 1 if previous is not None and previous in pool else count
        if others <= 0:
            chosen = previous or 0
        else:
            chosen = pool[int(self._rng.random() * others)]
            if chosen == previous:
                chosen = pool[-1]
        self._sticky[topic] = chosen
        return chosen


class UniformStickyPartitioner(DefaultPartitioner):
    """Kafka's (deprecated) UniformStickyPartitioner: sticky partitioning for every record, keys ignored."""

    def __init__(self, rng: Optional[random.Random] = None) -> None:
        super().__init__(ignore_keys=True, rng=rng)


# ---------------------------------------------------------------- custom partitioners (partitioner.class)
@runtime_checkable
class Partitioner(Protocol):
    """Kafka's org.apache.kafka.clients.producer.Partitioner, for `partitioner.class`.

    partition() picks the partition of every record sent without an explicit one
    (no sticky logic around it, as in Kafka 3.3+); it must return an int in
    [0, num_partitions). available_partitions are the partitions that have a
    leader now. Optional methods, called when present: configure(configs) with the
    producer's config once the producer has instantiated the class itself (Kafka's
    Configurable), and close() when the producer closes.
    """

    def partition(self, topic: str, key: Optional[bytes], value: Optional[bytes], num_partitions: int,
                  available_partitions: Sequence[int]) -> int: ...


class RoundRobinPartitioner:
    """Kafka's RoundRobinPartitioner: a per-topic counter, taken modulo the partitions that have a leader.

    Keys are ignored. Like Kafka's, the counter is a 32-bit int that wraps; when no
    partition has a leader it counts over all of them. Event-loop owned.
    """

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def partition(self, topic: str, key: Optional[bytes], value: Optional[bytes], num_partitions: int,
                  available_partitions: Sequence[int] = ()) -> int:
        next_value = self._counters.get(topic, 0)
        self._counters[topic] = (next_value + 1) & _MASK  # AtomicInteger.getAndIncrement wraps at 2^31
        if next_value & 0x80000000:
            next_value -= 1 << 32
        if available_partitions:
            return available_partitions[to_positive(next_value) % len(available_partitions)]
        return to_positive(next_value) % num_partitions

    def close(self) -> None:
        self._counters.clear()


# Kafka's class names of its built-in partitioners, so a Java producer's properties carry over.
KAFKA_PARTITIONERS: dict[str, type] = {
    "org.apache.kafka.clients.producer.RoundRobinPartitioner": RoundRobinPartitioner,
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": DefaultPartitioner,
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": UniformStickyPartitioner,
}


class PartitionerClassError(ValueError):
    """partitioner.class names nothing loadable, or something that is not a partitioner (config.py makes it a
    ConfigError)."""


def resolve_partitioner_class(value: Any) -> Any:
    """The class (or instance) a `partitioner.class` value names; raises PartitionerClassError in Kafka's words.

    Accepts a class or an instance with a partition() method, one of Kafka's class
    names (KAFKA_PARTITIONERS), or an import path `package.module.ClassName` or
    `package.module:ClassName`.
    """
    if isinstance(value, str):
        name = value.strip()
        found = KAFKA_PARTITIONERS.get(name)
        if found is None:
            found = _import_class(name)
            if found is None:
                raise PartitionerClassError(f"Class {name} could not be found.")
        value = found
    elif value is None:
        raise PartitionerClassError("Expected a Class instance or class name.")
    if not callable(getattr(value, "partition", None)):
        shown = (value.__qualname__ if isinstance(value, type) else
                 getattr(value, "__qualname__", None) or f"a {type(value).__qualname__} instance")
        raise PartitionerClassError(
            f"{shown} is not an instance of {__name__}.Partitioner: it needs a method "
            "partition(topic, key, value, num_partitions, available_partitions) -> int")
    return value


def _import_class(path: str) -> Any:
    """`pkg.mod:Attr` or `pkg.mod.Attr` (the longest importable module prefix), or None."""
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        candidates = [(module_name, attr_path)]
    else:
        parts = path.split(".")
        candidates = [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]
    for module_name, attr_path in candidates:
        if not module_name or not attr_path or not all(p.isidentifier() for p in attr_path.split(".")):
            continue
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue  # no such module: try a shorter prefix
            raise PartitionerClassError(  # the module exists but one of its own imports fails
                f"Class {path} could not be loaded: {type(exc).__name__}: {exc}") from None
        except Exception as exc:
            raise PartitionerClassError(f"Class {path} could not be loaded: {type(exc).__name__}: {exc}") from None
        for attr in attr_path.split("."):
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    return None


def new_partitioner(spec: Any, config: Mapping[str, Any], ignore_keys: bool = False) -> Any:
    """The partitioner a producer uses: `spec` is a resolved partitioner.class (None: Kafka's built-in logic).

    A class is instantiated without arguments and, if it has configure(), configured
    with the producer's config (Kafka's getConfiguredInstance); an instance is used as given.
    """
    if spec is None or spec is DefaultPartitioner:
        return DefaultPartitioner(ignore_keys=ignore_keys)
    if not isinstance(spec, type):
        return spec
    try:
        instance = spec()
    except Exception as exc:
        raise PartitionerClassError(f"Could not instantiate class {spec.__qualname__}: "
                                    f"{type(exc).__name__}: {exc}") from exc
    configure = getattr(instance, "configure", None)
    if callable(configure):
        try:
            configure(dict(config))
        except Exception as exc:
            raise PartitionerClassError(f"{spec.__qualname__}.configure() failed: {type(exc).__name__}: {exc}") \
                from exc
    return instance


def is_builtin(partitioner: Any) -> bool:
    """True for the built-in sticky partitioner (the producer runs KIP-480 around it)."""
    return isinstance(partitioner, DefaultPartitioner)


class InvalidPartitionError(errors.InvalidRequestError, ValueError):  # type: ignore[name-defined,misc]
    """A custom partitioner returned something that is not a partition of the topic (INVALID_REQUEST)."""


def checked_partition(partitioner: Any, topic: str, key: Optional[bytes], value: Optional[bytes],
                      num_partitions: int, available: Sequence[int]) -> int:
    """A custom partitioner's choice for one record, or InvalidPartitionError when it is out of [0, n)."""
    chosen = partitioner.partition(topic, key, value, num_partitions, available)
    if isinstance(chosen, bool) or not isinstance(chosen, int):
        err = InvalidPartitionError(
            f"The partitioner {type(partitioner).__qualname__} returned {chosen!r} for topic {topic!r}: "
            f"a partition number must be an int in [0, {num_partitions})")
    elif not 0 <= chosen < num_partitions:
        err = InvalidPartitionError(
            f"The partitioner {type(partitioner).__qualname__} generated an invalid partition number: {chosen}. "
            f"Topic {topic!r} has {num_partitions} partitions: it must be in [0, {num_partitions})")
        err.partition = chosen
    else:
        return chosen
    err.topic = topic
    raise err
