"""Rack-unaware replica assignment for new topics and added partitions (Kafka's AdminUtils, seed 003)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gregor.common import errors


def _replica_index(first_replica_index: int, second_replica_shift: int, replica_index: int, n_brokers: int) -> int:
    """Index of a follower: shifted 1..n-1 places after the first replica, so it never lands on it."""
    shift = 1 + (second_replica_shift + replica_index) % (n_brokers - 1)
    return (first_replica_index + shift) % n_brokers


def assign_replicas_to_brokers(
    n_partitions: int,
    replication_factor: int,
    broker_ids: Sequence[int],
    fixed_start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Spread partitions' replicas over brokers as assignReplicasToBrokersRackUnaware does.

    Seed 003's rules: the replication factor may not exceed the broker count;
    partition 0's first replica sits at a random broker index; each later
    partition's first replica moves one broker on; the other replicas follow
    the first at a random shift (nextReplicaShift), which grows by one every
    time the partition id wraps around the broker list.

    Args:
        n_partitions: how many partitions to assign.
        replication_factor: replicas per partition.
        broker_ids: candidate brokers (sorted before use, as Kafka does).
        fixed_start_index: start index and initial shift; random when negative.
        start_partition_id: id of the first partition to assign (0 when negative).
        rng: randomness for the start index and shift.

    Returns:
        partition id -> replica list, preferred leader first.

    Raises:
        InvalidPartitionsError: n_partitions <= 0.
        InvalidReplicationFactorError: replication_factor <= 0 or larger than the broker count.
    """
    if n_partitions <= 0:
        raise errors.error_for(errors.Code.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise errors.error_for(
            errors.Code.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0."
        )
    brokers = sorted(set(broker_ids))
    if replication_factor > len(brokers):
        raise errors.error_for(
            errors.Code.INVALID_REPLICATION_FACTOR,
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.",
        )
    rng = rng or random.Random()
    n = len(brokers)
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    next_replica_shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(n)
    current_partition_id = max(0, start_partition_id)
    assignment: dict[int, list[int]] = {}
    for _ in range(n_partitions):
        if current_partition_id > 0 and current_partition_id % n == 0:
            next_replica_shift += 1
        first = (current_partition_id + start_index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            replicas.append(brokers[_replica_index(first, next_replica_shift, j, n)])
        assignment[current_partition_id] = replicas
        current_partition_id += 1
    return assignment


def add_partitions_assignment(
    existing: Mapping[int, Sequence[int]],
    new_partition_count: int,
    broker_ids: Sequence[int],
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Assignment for partitions added to an existing topic (Kafka's createNewPartitionsAssignment).

    The replication factor is partition 0's; the start index is the position of
    the first broker whose id is >= partition 0's leader, so new partitions
    continue the existing round-robin instead of restarting it.

    Returns:
        Only the new partitions: id -> replica list.

    Raises:
        InvalidPartitionsError: the count does not grow, or partition 0 is unknown.
    """
    if 0 not in existing or not existing[0]:
        raise errors.error_for(
            errors.Code.INVALID_PARTITIONS, "The topic has no replica assignment for partition 0."
        )
    to_add = new_partition_count - len(existing)
    if to_add <= 0:
        raise errors.error_for(
            errors.Code.INVALID_PARTITIONS,
            "The number of partitions for a topic can only be increased. "
            f"Topic currently has {len(existing)} partitions, {new_partition_count} would not be an increase.",
        )
    brokers = sorted(set(broker_ids))
    leader0 = existing[0][0]
    start_index = next((i for i, b in enumerate(brokers) if b >= leader0), 0)
    return assign_replicas_to_brokers(
        to_add, len(existing[0]), brokers, fixed_start_index=start_index,
        start_partition_id=len(existing), rng=rng,
    )
