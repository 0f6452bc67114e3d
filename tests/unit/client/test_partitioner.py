"""Partitioners: murmur2 bit-exact with the Java client, sticky null keys, round-robin, and partitioner.class."""

from __future__ import annotations

import random
from collections import Counter
from typing import Sequence

import pytest

from gregor.client.config import ConfigError, producer_config
from gregor.client.partitioner import (
    DefaultPartitioner, InvalidPartitionError, RoundRobinPartitioner, UniformStickyPartitioner, checked_partition,
    murmur2, partition_for_key, resolve_partitioner_class, to_positive,
)
from gregor.client.producer import Producer
from gregor.common import errors

# Kafka's UtilsTest.testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data,expected", KAFKA_VECTORS.items())
def test_murmur2_matches_kafka_test_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_to_positive_clears_the_sign_bit_not_abs() -> None:
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(1 << 31)) == 0  # Integer.MIN_VALUE -> 0, where abs() would overflow
    assert partition_for_key(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50


def test_keyed_records_always_land_on_the_same_partition() -> None:
    p = DefaultPartitioner()
    for key in (b"a", b"order-17", b"\x00\xff"):
        assert {p.partition("t", key, 12) for _ in range(20)} == {partition_for_key(key, 12)}


def test_null_keys_stick_until_the_batch_is_full_then_move() -> None:
    p = DefaultPartitioner(rng=random.Random(7))
    first = p.partition("t", None, 6)
    assert {p.partition("t", None, 6) for _ in range(100)} == {first}
    p.on_batch_full("t", first, 6)
    second = p.partition("t", None, 6)
    assert second != first
    assert {p.partition("t", None, 6) for _ in range(100)} == {second}
    # A report about a partition we no longer stick to changes nothing.
    p.on_batch_full("t", first, 6)
    assert p.partition("t", None, 6) == second


def test_sticky_choice_prefers_available_partitions() -> None:
    p = DefaultPartitioner(rng=random.Random(1))
    assert p.partition("t", None, 8, available=[5]) == 5
    p.on_batch_full("t", 5, 8, available=[3, 5])
    assert p.partition("t", None, 8, available=[3, 5]) == 3


def test_moving_on_picks_uniformly_among_the_other_partitions() -> None:
    p = DefaultPartitioner(rng=random.Random(11))
    for available, previous in (([], 2), ([], 5), ([1, 4, 6, 7], 4), ([1, 4, 6, 7], 7), ([1, 4, 6, 7], 3)):
        others = [q for q in (available or range(8)) if q != previous]
        seen: dict[int, int] = {}
        for _ in range(6000):
            p._sticky["t"] = previous
            p.on_batch_full("t", previous, 8, available)
            chosen = p.partition("t", None, 8, available)
            seen[chosen] = seen.get(chosen, 0) + 1
        assert sorted(seen) == others, (available, previous)
        expected = 6000 / len(others)  # 750 to 1500 draws each: 20% is over 5 standard deviations
        assert all(abs(n - expected) < expected * 0.2 for n in seen.values()), (available, previous, seen)
    # The only partition there is stays chosen.
    p._sticky["t"] = 0
    p.on_batch_full("t", 0, 1)
    assert p.partition("t", None, 1) == 0


def test_ignore_keys_makes_keyed_records_sticky() -> None:
    p = DefaultPartitioner(ignore_keys=True, rng=random.Random(3))
    assert len({p.partition("t", f"k{i}".encode(), 12) for i in range(50)}) == 1


# ---------------------------------------------------------------- partitioner.class (custom partitioners)
class EvenOddPartitioner:
    """A test partitioner: even-length values to partition 0, odd-length to 1; remembers configure/close."""

    def __init__(self) -> None:
        self.configs: dict[str, object] | None = None
        self.closed = False

    def configure(self, configs: dict[str, object]) -> None:
        self.configs = configs

    def partition(self, topic: str, key: bytes | None, value: bytes | None, num_partitions: int,
                  available_partitions: Sequence[int]) -> int:
        return len(value or b"") % 2

    def close(self) -> None:
        self.closed = True


class NotAPartitioner:
    def choose(self) -> int:
        return 0


RR = "org.apache.kafka.clients.producer.RoundRobinPartitioner"


def test_round_robin_cycles_over_available_partitions_per_topic() -> None:
    p = RoundRobinPartitioner()
    assert [p.partition("a", None, None, 4, [0, 1, 2, 3]) for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    # Each topic has its own counter; keys and values do not matter.
    assert [p.partition("b", b"k", b"v", 3, [0, 1, 2]) for _ in range(4)] == [0, 1, 2, 0]
    # Only partitions with a leader are used (Kafka's availablePartitionsForTopic).
    assert [p.partition("a", None, None, 4, [1, 3]) for _ in range(4)] == [1, 3, 1, 3]
    # None available: count over all partitions rather than fail.
    assert [p.partition("c", None, None, 3, []) for _ in range(4)] == [0, 1, 2, 0]


def test_round_robin_distributes_evenly() -> None:
    p = RoundRobinPartitioner()
    counts = Counter(p.partition("t", None, None, 6, range(6)) for _ in range(6000))
    assert counts == {i: 1000 for i in range(6)}


def test_round_robin_counter_wraps_like_javas_atomic_integer() -> None:
    p = RoundRobinPartitioner()
    p._counters["t"] = 0x7FFFFFFF  # Integer.MAX_VALUE: the next getAndIncrement returns MIN_VALUE
    assert p.partition("t", None, None, 5, range(5)) == 0x7FFFFFFF % 5
    assert p.partition("t", None, None, 5, range(5)) == 0  # toPositive(MIN_VALUE) == 0, never negative
    assert p.partition("t", None, None, 5, range(5)) == 1


@pytest.mark.parametrize("name,cls", [
    (RR, RoundRobinPartitioner),
    ("org.apache.kafka.clients.producer.internals.DefaultPartitioner", DefaultPartitioner),
    ("org.apache.kafka.clients.producer.UniformStickyPartitioner", UniformStickyPartitioner),
    ("gregor.client.partitioner.RoundRobinPartitioner", RoundRobinPartitioner),
    ("gregor.client.partitioner:RoundRobinPartitioner", RoundRobinPartitioner),
    (f"  {__name__}.EvenOddPartitioner ", EvenOddPartitioner),
    (f"{__name__}:EvenOddPartitioner", EvenOddPartitioner),
])
def test_partitioner_class_accepts_kafka_names_and_import_paths(name: str, cls: type) -> None:
    assert producer_config({"partitioner.class": name})["partitioner.class"] is cls


def test_partitioner_class_accepts_classes_and_instances_and_defaults_to_none() -> None:
    assert producer_config()["partitioner.class"] is None
    assert producer_config({"partitioner.class": ""})["partitioner.class"] is None
    assert producer_config(partitioner_class=EvenOddPartitioner)["partitioner.class"] is EvenOddPartitioner
    instance = EvenOddPartitioner()
    assert producer_config({"partitioner.class": instance})["partitioner.class"] is instance
    # A validated config validates again unchanged (the gateway builds its Producer from one).
    cfg = producer_config({"partitioner.class": RR})
    assert producer_config(cfg)["partitioner.class"] is RoundRobinPartitioner


@pytest.mark.parametrize("value,message", [
    ("com.example.NoSuchPartitioner",
     "Invalid value com.example.NoSuchPartitioner for configuration partitioner.class: "
     "Class com.example.NoSuchPartitioner could not be found."),
    ("gregor.client.partitioner:NoSuch",
     "Invalid value gregor.client.partitioner:NoSuch for configuration partitioner.class: "
     "Class gregor.client.partitioner:NoSuch could not be found."),
    ("RoundRobinPartitioner",  # a bare name is not an import path
     "Invalid value RoundRobinPartitioner for configuration partitioner.class: "
     "Class RoundRobinPartitioner could not be found."),
    (f"{__name__}.NotAPartitioner",
     f"Invalid value {__name__}.NotAPartitioner for configuration partitioner.class: NotAPartitioner is not an "
     "instance of gregor.client.partitioner.Partitioner"),
    ("json:loads", "loads is not an instance of gregor.client.partitioner.Partitioner"),
])
def test_unloadable_or_non_partitioner_classes_fail_in_kafkas_words(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({"partitioner.class": value})
    assert message in info.value.message
    assert info.value.code == errors.Code.INVALID_CONFIG


def test_a_module_that_fails_to_import_is_reported_not_hidden(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "broken_partitioner_mod.py").write_text("import no_such_dependency_xyz\nclass P: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="Class broken_partitioner_mod.P could not be loaded: "
                                          "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"):
        producer_config({"partitioner.class": "broken_partitioner_mod.P"})
    with pytest.raises(ConfigError, match="Expected a Class instance or class name"):
        resolve_and_wrap(None)


def resolve_and_wrap(value: object) -> object:
    from gregor.client.partitioner import PartitionerClassError

    try:
        return resolve_partitioner_class(value)
    except PartitionerClassError as exc:
        raise ConfigError(str(exc)) from None


async def test_producer_instantiates_configures_uses_and_closes_a_custom_partitioner() -> None:
    p = Producer({"bootstrap.servers": "127.0.0.1:9", "partitioner.class": f"{__name__}.EvenOddPartitioner",
                  "linger.ms": 7})
    part = p.partitioner
    assert isinstance(part, EvenOddPartitioner)
    assert part.configs is not None and part.configs["linger.ms"] == 7  # Kafka's Configurable.configure
    assert not part.closed
    await p.close()
    assert part.closed  # close() on producer close


async def test_producer_uses_a_given_instance_and_keeps_the_builtin_for_kafkas_default_names() -> None:
    mine = EvenOddPartitioner()
    p = Producer({"bootstrap.servers": "127.0.0.1:9", "partitioner.class": mine})
    assert p.partitioner is mine and mine.configs is None  # an instance is used as given
    await p.close()
    assert mine.closed
    sticky = Producer({"bootstrap.servers": "127.0.0.1:9",
                       "partitioner.class": "org.apache.kafka.clients.producer.UniformStickyPartitioner"})
    assert isinstance(sticky.partitioner, DefaultPartitioner) and sticky.partitioner.ignore_keys
    await sticky.close()


def test_a_class_that_cannot_be_instantiated_is_a_config_error() -> None:
    class NeedsArgs:
        def __init__(self, x: int) -> None: ...

        def partition(self, *a: object) -> int:
            return 0

    with pytest.raises(ConfigError, match="for configuration partitioner.class: Could not instantiate class"):
        Producer({"bootstrap.servers": "127.0.0.1:9", "partitioner.class": NeedsArgs})


@pytest.mark.parametrize("returned", [-1, 3, 99, None, "1", 1.0, True])
def test_a_partition_outside_the_topic_is_a_clear_error(returned: object) -> None:
    class Bad:
        def partition(self, *a: object) -> object:
            return returned

    with pytest.raises(InvalidPartitionError, match=r"must be in \[0, 3\)|must be an int in \[0, 3\)") as info:
        checked_partition(Bad(), "t", None, b"v", 3, [0, 1, 2])
    assert info.value.code == errors.Code.INVALID_REQUEST and not info.value.retriable
    assert isinstance(info.value, ValueError)
    assert checked_partition(EvenOddPartitioner(), "t", None, b"vv", 3, [0, 1, 2]) == 0
