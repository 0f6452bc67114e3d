"""Kafka's default partitioner: murmur2 of the key for keyed records, a sticky partition for the rest."""

from __future__ import annotations

import random
from typing import Optional, Sequence

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
        candidates = [p for p in (available or range(num_partitions)) if p != previous] or [previous or 0]
        chosen = self._rng.choice(candidates)
        self._sticky[topic] = chosen
        return chosen
