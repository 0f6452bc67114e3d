"""Kafka's default partitioner: murmur2 bit-exact with the Java client, sticky partitioning for null keys."""

from __future__ import annotations

import random

import pytest

from gregor.client.partitioner import DefaultPartitioner, murmur2, partition_for_key, to_positive

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


def test_ignore_keys_makes_keyed_records_sticky() -> None:
    p = DefaultPartitioner(ignore_keys=True, rng=random.Random(3))
    assert len({p.partition("t", f"k{i}".encode(), 12) for i in range(50)}) == 1
