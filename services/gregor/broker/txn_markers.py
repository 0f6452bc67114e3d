"""The broker's side of transactions: markers, the LSO, and what read_committed fetches get (seed 003, §6.8).

The transaction coordinator ends a transaction by sending WriteTxnMarkers to the
leader of every partition the transaction wrote to; the leader appends a
COMMIT or ABORT control batch for the producer (fenced by the coordinator epoch
and the producer epoch, checked against the partition's producer state before
anything is written) and waits for it to be replicated through the produce path's
own wake-up and acks=all wait (ReplicaManager.after_leader_append and
wait_for_replication). The producer state then knows the transaction is decided:
the LSO moves past it once the marker is below the high watermark, and an ABORT
goes into the segment's `.txnindex` so read_committed consumers can drop its records.
The LSO rule itself is ReplicationState.last_stable_offset; Partition feeds it the
producer state's first unstable offset.

Kept apart from Partition/ReplicaManager (which only call in here) so the
replica state machine can take it over unchanged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from prometheus_client import Counter, Gauge

from gregor.common import errors
from gregor.common.clock import now_ms
from gregor.common.control_records import encode_marker_batch

if TYPE_CHECKING:
    import gregor_native as native

    from gregor.broker.partition import Partition
    from gregor.broker.producer_state import CompletedTxn
    from gregor.broker.replication_state import Effect
    from gregor.broker.replica_manager import ReplicaManager

LSO_LAG = Gauge("gregor_broker_last_stable_offset_lag",
                "High watermark minus last stable offset: records held back from read_committed by open "
                "transactions (leader, updated when the LSO is read)", ["topic", "partition"])
MARKERS_WRITTEN = Counter("gregor_broker_txn_markers_total", "Transaction markers written as leader",
                          ["topic", "result"])
READ_UNCOMMITTED = 0  # Kafka's IsolationLevel ids (common.proto's IsolationLevel)
READ_COMMITTED = 1


def index_aborted(log: "native.Log", completed: Iterable["CompletedTxn"]) -> None:
    """Put the aborted transactions among `completed` into the marker segments' `.txnindex`."""
    for txn in completed:
        if txn.is_aborted:
            log.append_aborted_txn(txn.producer_id, txn.first_offset, txn.last_offset, txn.last_stable_offset)


@dataclass(frozen=True)
class MarkerRequest:
    """One partition's part of a WriteTxnMarkers request (Kafka's WritableTxnMarker, per partition)."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool


def append_marker(partition: "Partition", marker: MarkerRequest) -> "tuple[native.AppendInfo, list[Effect]]":
    """Validate and append one marker as leader; raises before writing anything if it is fenced.

    INVALID_PRODUCER_EPOCH for a producer epoch below the partition's, and
    TRANSACTION_COORDINATOR_FENCED for a coordinator epoch below the last marker's.
    """
    if marker.producer_id < 0 or marker.producer_epoch < 0:
        raise errors.error_for(errors.Code.INVALID_REQUEST,
                               f"marker needs a producer id and epoch, got {marker.producer_id}/"
                               f"{marker.producer_epoch}", topic=partition.topic, partition=partition.partition)
    partition.check_leader()
    psm = partition.producer_state_manager()
    psm.check_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch)
    batch = encode_marker_batch(marker.producer_id, marker.producer_epoch, marker.commit, marker.coordinator_epoch,
                                now_ms())
    info, effects = partition.append_records_to_leader(batch, -1, is_marker=True)
    return info, effects  # type: ignore[return-value]  # a marker is never an idempotent duplicate


def describe_producers(partition: "Partition") -> list[tuple[int, int, int, int, int, int]]:
    """(producer id, epoch, last sequence, last timestamp, coordinator epoch, open transaction's first offset or -1)
    of every producer the leader tracks (Kafka's DescribeProducers)."""
    partition.check_leader()
    psm = partition.producer_state_manager()
    return [(e.producer_id, e.producer_epoch, e.last_seq, e.last_timestamp, e.coordinator_epoch,
             e.current_txn_first_offset) for e in sorted(psm.producers.values(), key=lambda e: e.producer_id)]


def aborted_transactions(partition: "Partition", fetch_offset: int, upper_offset: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of aborted transactions a read_committed fetch of [fetch_offset, upper) spans."""
    if upper_offset <= fetch_offset:
        return []
    return partition.log.aborted_txns(fetch_offset, upper_offset)


async def write_marker(replicas: "ReplicaManager", topic: str, partition: int, marker: MarkerRequest,
                       timeout_ms: int) -> int:
    """WriteTxnMarkers for one partition: append as leader, then the produce path's wake-ups and acks=all wait
    (ReplicaManager.after_leader_append / wait_for_replication); the marker's offset."""
    p = replicas.get_partition(topic, partition)
    info, effects = append_marker(p, marker)
    replicas.after_leader_append(p, effects)
    waiting = replicas.wait_for_replication(p, info, timeout_ms)
    if isinstance(waiting, errors.GregorError):
        raise waiting
    if isinstance(waiting, asyncio.Future):
        await waiting
    MARKERS_WRITTEN.labels(topic=topic, result="commit" if marker.commit else "abort").inc()
    return info.last_offset
