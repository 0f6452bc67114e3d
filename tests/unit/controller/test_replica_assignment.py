"""Replica assignment: Kafka's rack-unaware algorithm and partition additions (seed 003)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gregor.common import errors
from gregor.controller.replica_assignment import add_partitions_assignment, assign_replicas_to_brokers


def test_seed003_five_brokers_five_partitions_first_on_fourth_broker() -> None:
    # Partition 0 on the 4th broker, then the 5th, the 1st, the 2nd, ... (seed 003).
    got = assign_replicas_to_brokers(5, 1, [101, 102, 103, 104, 105], fixed_start_index=3)
    assert got == {0: [104], 1: [105], 2: [101], 3: [102], 4: [103]}


def test_matches_kafka_reference_assignment() -> None:
    # AdminUtils.assignReplicasToBrokers(brokers 0..4, 10, 3, fixedStartIndex = 0) in Kafka's AdminTest.
    assert assign_replicas_to_brokers(10, 3, range(5), fixed_start_index=0) == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
    }


def test_replication_factor_larger_than_brokers_is_rejected_with_kafkas_message() -> None:
    with pytest.raises(errors.GregorError) as info:
        assign_replicas_to_brokers(3, 4, [1, 2, 3])
    assert info.value.code == errors.Code.INVALID_REPLICATION_FACTOR
    assert info.value.message == "Replication factor: 4 larger than available brokers: 3."


@pytest.mark.parametrize("n_partitions,rf,code", [(0, 1, "INVALID_PARTITIONS"), (1, 0, "INVALID_REPLICATION_FACTOR")])
def test_non_positive_counts_are_rejected(n_partitions: int, rf: int, code: str) -> None:
    with pytest.raises(errors.GregorError) as info:
        assign_replicas_to_brokers(n_partitions, rf, [1, 2, 3])
    assert info.value.name == code


def test_random_start_comes_from_the_rng() -> None:
    a = assign_replicas_to_brokers(6, 2, [1, 2, 3], rng=random.Random(1))
    b = assign_replicas_to_brokers(6, 2, [1, 2, 3], rng=random.Random(1))
    assert a == b
    starts = {assign_replicas_to_brokers(1, 1, [1, 2, 3], rng=random.Random(s))[0][0] for s in range(40)}
    assert starts == {1, 2, 3}


@given(
    brokers=st.sets(st.integers(0, 50), min_size=1, max_size=8),
    n_partitions=st.integers(1, 30),
    data=st.data(),
)
def test_replicas_distinct_and_leaders_spread(brokers: set[int], n_partitions: int, data: st.DataObject) -> None:
    rf = data.draw(st.integers(1, len(brokers)))
    seed = data.draw(st.integers(0, 1000))
    got = assign_replicas_to_brokers(n_partitions, rf, sorted(brokers), rng=random.Random(seed))
    assert sorted(got) == list(range(n_partitions))
    for replicas in got.values():
        assert len(replicas) == rf and len(set(replicas)) == rf and set(replicas) <= brokers
    leaders = [r[0] for r in got.values()]
    counts = [leaders.count(b) for b in brokers]
    assert max(counts) - min(counts) <= 1  # First replicas go round-robin.


def test_add_partitions_continues_from_partition_zero_leader() -> None:
    existing = assign_replicas_to_brokers(3, 2, [1, 2, 3, 4], fixed_start_index=1)
    assert existing[0][0] == 2
    added = add_partitions_assignment(existing, 6, [1, 2, 3, 4], rng=random.Random(0))
    assert sorted(added) == [3, 4, 5]
    # Same start index as the original topic, continuing at partition 3.
    whole = assign_replicas_to_brokers(6, 2, [1, 2, 3, 4], fixed_start_index=1)
    assert added == {p: whole[p] for p in (3, 4, 5)}


def test_add_partitions_must_grow() -> None:
    with pytest.raises(errors.GregorError) as info:
        add_partitions_assignment({0: [1, 2], 1: [2, 1]}, 2, [1, 2])
    assert info.value.code == errors.Code.INVALID_PARTITIONS
    assert "can only be increased" in info.value.message
