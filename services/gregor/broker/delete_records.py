"""DeleteRecords on the leader and its purgatory, as Kafka's ReplicaManager.deleteRecords / DelayedDeleteRecords.

The leader moves its own log start offset at once (`Log.maybe_increment_log_start_offset`, persisted in the
partition's `log-start-offset` file); its followers take the leader's log start offset from their next replica
fetch and report theirs in the one after (ReplicaFetchPartition.log_start_offset). The answer waits until the
partition's *low watermark* -- the smallest log start offset over the leader and every replica on a live broker
(Kafka's Partition.lowWatermarkIfLeader) -- has reached the asked offset, or the request's timeout passes:
then the partitions not there yet answer REQUEST_TIMED_OUT with the low watermark they had. A partition
whose leadership moves meanwhile answers NOT_LEADER_OR_FOLLOWER.

Concurrency: the broker's event loop (the purgatory's rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable

from gregor.broker.purgatory import DelayedOperation
from gregor.common import errors
from gregor.common.config import is_retained_by_deletion

if TYPE_CHECKING:
    from gregor.broker.partition import Partition
    from gregor.broker.replica_manager import ReplicaManager

Key = tuple[str, int]


def low_watermark(p: "Partition", live: "dict[int, int] | None") -> int:
    """The leader's log start offset, lowered to any replica's on a live broker (-1 for one not heard from at
    this leader epoch yet). live: broker id -> epoch (None: no metadata yet, every replica counts)."""
    low = p.log.log_start_offset
    for replica in p.replicas:
        if replica == p.local_broker_id or (live is not None and replica not in live):
            continue
        low = min(low, p.follower_log_start(replica))
    return low


def delete_on_leader(p: "Partition", offset: int) -> int:
    """Move the leader's log start offset to `offset` (-1: the high watermark); returns the offset the low
    watermark has to reach. OFFSET_OUT_OF_RANGE beyond the HW, POLICY_VIOLATION on a compact-only topic."""
    p.check_leader()
    where = {"topic": p.topic, "partition": p.partition}
    if not is_retained_by_deletion(p.configs):  # Kafka: only a log whose cleanup.policy has delete
        raise errors.error_for(errors.Code.POLICY_VIOLATION, f"Records of partition {p.topic}-{p.partition} can "
                               f"not be deleted due to the configured policy", **where)
    hw = p.high_watermark
    target = hw if offset == -1 else offset
    if target < 0 or target > hw:
        raise errors.error_for(errors.Code.OFFSET_OUT_OF_RANGE, f"cannot delete records of {p.topic}-{p.partition} "
                               f"before {offset}: not in [0, high watermark {hw}]", **where)
    p.log.maybe_increment_log_start_offset(target)
    return target


@dataclass
class PartitionStatus:
    target: int  # the offset the low watermark has to reach
    low_watermark: int
    code: int = int(errors.Code.REQUEST_TIMED_OUT)  # until reached (Kafka's DeleteRecordsPartitionStatus)
    pending: bool = True


class DelayedDeleteRecords(DelayedOperation[dict[Key, PartitionStatus]]):
    """Parked until every partition's low watermark reached its target (or the leadership moved), or the timeout."""

    def __init__(self, delay_ms: int, rm: "ReplicaManager", status: dict[Key, PartitionStatus]) -> None:
        super().__init__(delay_ms)
        self.rm = rm
        self.status = status

    def _check(self, key: Key, st: PartitionStatus, live: "dict[int, int] | None") -> None:
        p = self.rm.partitions.get(key)
        if p is None or not p.is_leader:
            st.code, st.pending, st.low_watermark = int(errors.Code.NOT_LEADER_OR_FOLLOWER), False, -1
            return
        low = low_watermark(p, live)
        st.low_watermark = max(st.low_watermark, low)
        if low >= st.target:
            st.code, st.pending = 0, False

    def try_complete_for(self, key: Hashable) -> bool:
        st = self.status.get(key)  # type: ignore[call-overload]
        if st is not None and st.pending:
            self._check(key, st, self.rm.live_broker_epochs())  # type: ignore[arg-type]
        return self.force_complete() if not any(s.pending for s in self.status.values()) else False

    def try_complete(self) -> bool:
        live = self.rm.live_broker_epochs()
        for key, st in self.status.items():
            if st.pending:
                self._check(key, st, live)
        return self.force_complete() if not any(s.pending for s in self.status.values()) else False

    def on_complete(self) -> dict[Key, PartitionStatus]:
        return self.status
