"""Which coordinator instance owns which __consumer_offsets partition (pure rules shared by the
coordinators, which claim partitions, and the brokers, which answer FindCoordinator).

A group lives in partition `partition_for(group id)` of __consumer_offsets (Kafka's rule).

Every live instance registers `coordinators/ids/<id>` bound to its lease. The
desired owner of partition p is the (p mod n)-th of the n live ids in sorted
order, so every instance computes the same map from the same etcd view. An
instance serves p only once it also holds the claim key
`coordinators/partitions/<p>` (bound to its lease, created only if absent), so
two instances never serve one partition at once while the live set changes:
the old owner deletes its claim when p moves away, and a dead owner's claim
expires with its lease — then the new owner claims p and loads it.
"""

from __future__ import annotations

from typing import Any

from gregor.common.etcd_layout import CoordinatorKey, CoordinatorsZNode

OFFSETS_TOPIC = "__consumer_offsets"
# Transactional ids live in __transaction_state partitions, claimed as `coordinators/txn-partitions/<p>`
# by the same instances under the same rule (coordinator/txn_coordinator.py).
TXN_TOPIC = "__transaction_state"
TXN_CLAIMS = CoordinatorsZNode.TXN_CLAIMS


def java_string_hash(s: str) -> int:
    """Java's String.hashCode (UTF-16 code units, 32-bit wrap-around), signed."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's partitionFor: Utils.abs(groupId.hashCode) % offsets.topic.num.partitions (abs(MIN_VALUE) = 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


def desired_owner(partition: int, live_ids: list[int]) -> int | None:
    """The instance that should own partition, or None when no instance is alive."""
    if not live_ids:
        return None
    ordered = sorted(live_ids)
    return ordered[partition % len(ordered)]


def desired_partitions(my_id: int, live_ids: list[int], num_partitions: int) -> set[int]:
    """Partitions my_id should own under the current live set."""
    return {p for p in range(num_partitions) if desired_owner(p, live_ids) == my_id}


def apply_coordinator_key(live: dict[int, dict[str, Any]], claims: dict[int, int], key: CoordinatorKey | None,
                          value: bytes | None, txn_claims: dict[int, int] | None = None) -> None:
    """Fold one `coordinators/{ids,partitions,txn-partitions}/<n>` key (parsed by
    CoordinatorsZNode.parse) into the etcd view (value None: deleted, e.g. its lease expired).
    Used by the coordinators and by brokers answering FindCoordinator.

    Raises ValueError on a malformed value; other keys (None) are ignored.
    """
    if key is None:
        return
    if key.kind == CoordinatorsZNode.IDS:
        if value is None:
            live.pop(key.n, None)
        else:
            live[key.n] = CoordinatorsZNode.decode_info(value)
        return
    target = claims if key.kind == CoordinatorsZNode.OFFSETS_CLAIMS else txn_claims
    if target is None:
        return
    if value is None:
        target.pop(key.n, None)
    else:
        target[key.n] = CoordinatorsZNode.decode_claim(value)

