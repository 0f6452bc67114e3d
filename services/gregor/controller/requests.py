"""Control requests (LeaderAndIsr, StopReplica, UpdateMetadata) and the per-event batch that collects them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from gregor.controller.state import ControllerContext, LeaderAndIsr, TopicPartition


@dataclass(frozen=True)
class PartitionStateInfo:
    """What a broker is told about one partition: its leadership and replica assignment."""

    topic_partition: TopicPartition
    leader_and_isr: LeaderAndIsr
    replicas: tuple[int, ...]
    is_new: bool = False


@dataclass(frozen=True)
class LeaderAndIsrRequest:
    """Makes the receiving broker leader or follower for each listed partition.

    Every control request carries the controller's id and epoch, and the epoch
    of the broker it is addressed to, so brokers can drop requests from an
    older controller or meant for an earlier incarnation of themselves.
    """

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: tuple[PartitionStateInfo, ...]
    live_leaders: tuple[int, ...]


@dataclass(frozen=True)
class StopReplicaRequest:
    """Stops the listed replicas on the receiving broker; `delete_partition` also removes their logs."""

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: tuple[tuple[TopicPartition, bool], ...]


@dataclass(frozen=True)
class UpdateMetadataRequest:
    """Refreshes the receiving broker's metadata cache: live brokers and partition states."""

    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: tuple[PartitionStateInfo, ...]
    live_brokers: tuple[int, ...]


ControlRequest = LeaderAndIsrRequest | StopReplicaRequest | UpdateMetadataRequest


@dataclass(frozen=True)
class PartitionStateWrite:
    """A conditional write of a partition's state to etcd.

    `expected_partition_epoch` is None for a create (the key must not exist);
    otherwise the stored state must still carry that partition epoch. The new
    state carries `expected + 1` (or the initial epoch for a create).
    """

    topic_partition: TopicPartition
    expected_partition_epoch: int | None
    new_state: LeaderAndIsr


@dataclass
class ControlRequestBatch:
    """Requests accumulated while one controller event runs (Kafka's ControllerBrokerRequestBatch).

    Concurrency: owned by the controller's event task, like the context it reads.
    """

    leader_and_isr: dict[int, dict[TopicPartition, PartitionStateInfo]] = field(default_factory=dict)
    stop_replica: dict[int, dict[TopicPartition, bool]] = field(default_factory=dict)
    update_metadata_brokers: set[int] = field(default_factory=set)
    update_metadata_partitions: set[TopicPartition] = field(default_factory=set)

    def is_empty(self) -> bool:
        return not (
            any(self.leader_and_isr.values()) or any(self.stop_replica.values()) or self.update_metadata_brokers
        )

    def add_leader_and_isr(
        self,
        ctx: ControllerContext,
        broker_ids: Iterable[int],
        tp: TopicPartition,
        leader_and_isr: LeaderAndIsr,
        is_new: bool = False,
    ) -> None:
        """LeaderAndIsr to the given brokers, and UpdateMetadata for tp to every live broker."""
        info = PartitionStateInfo(tp, leader_and_isr, ctx.partition_replica_assignment(tp), is_new)
        for broker_id in broker_ids:
            if broker_id < 0:
                continue
            # A later LeaderAndIsr restarts a replica an earlier plain StopReplica in this batch stopped.
            stops = self.stop_replica.get(broker_id, {})
            if stops.get(tp) is False:
                del stops[tp]
            previous = self.leader_and_isr.setdefault(broker_id, {}).get(tp)
            # A partition that is new for this broker stays new within the batch.
            self.leader_and_isr[broker_id][tp] = PartitionStateInfo(
                tp, leader_and_isr, info.replicas, is_new or bool(previous and previous.is_new)
            )
        self.add_update_metadata(ctx.live_or_shutting_down_broker_ids, [tp])

    def add_stop_replica(self, broker_ids: Iterable[int], tp: TopicPartition, delete_partition: bool) -> None:
        for broker_id in broker_ids:
            # A later StopReplica supersedes an earlier LeaderAndIsr for the same replica.
            self.leader_and_isr.get(broker_id, {}).pop(tp, None)
            per_broker = self.stop_replica.setdefault(broker_id, {})
            # Deletion wins over a plain stop for the same partition.
            per_broker[tp] = per_broker.get(tp, False) or delete_partition

    def add_update_metadata(self, broker_ids: Iterable[int], partitions: Iterable[TopicPartition]) -> None:
        """UpdateMetadata to the given brokers; with no partitions it still carries the live broker list."""
        self.update_metadata_brokers.update(b for b in broker_ids if b >= 0)
        self.update_metadata_partitions.update(partitions)

    def discard_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop everything about partitions whose etcd write failed; the driver retries them."""
        gone = set(partitions)
        for per_broker in self.leader_and_isr.values():
            for tp in gone:
                per_broker.pop(tp, None)
        self.leader_and_isr = {b: p for b, p in self.leader_and_isr.items() if p}
        self.update_metadata_partitions -= gone

    def build(self, ctx: ControllerContext, controller_id: int) -> dict[int, list[ControlRequest]]:
        """The requests to send, per broker, in Kafka's order: LeaderAndIsr, UpdateMetadata, StopReplica."""
        out: dict[int, list[ControlRequest]] = {}
        live_leaders = tuple(sorted(ctx.live_or_shutting_down_broker_ids))
        for broker_id, parts in sorted(self.leader_and_isr.items()):
            if not parts:
                continue
            out.setdefault(broker_id, []).append(
                LeaderAndIsrRequest(
                    controller_id, ctx.epoch, ctx.broker_epoch(broker_id),
                    tuple(parts[tp] for tp in sorted(parts)), live_leaders,
                )
            )
        metadata = tuple(
            PartitionStateInfo(tp, ctx.partition_leadership_info[tp], ctx.partition_replica_assignment(tp))
            for tp in sorted(self.update_metadata_partitions)
            if tp in ctx.partition_leadership_info
        )
        for broker_id in sorted(self.update_metadata_brokers):
            out.setdefault(broker_id, []).append(
                UpdateMetadataRequest(controller_id, ctx.epoch, ctx.broker_epoch(broker_id), metadata, live_leaders)
            )
        for broker_id, stops in sorted(self.stop_replica.items()):
            if not stops:
                continue
            out.setdefault(broker_id, []).append(
                StopReplicaRequest(controller_id, ctx.epoch, ctx.broker_epoch(broker_id), tuple(sorted(stops.items())))
            )
        return out


@dataclass
class ControllerActions:
    """Everything one controller event decided: ordered etcd writes, control requests, failures.

    The pure state machines update the context as if every write succeeds; the
    driver performs `writes` in order and, if one fails its compare, reloads
    those partitions from etcd, calls `batch.discard_partitions` and re-runs
    the transition (Kafka retries `updateLeaderAndIsr` the same way).

    Concurrency: owned by the controller's event task.
    """

    batch: ControlRequestBatch = field(default_factory=ControlRequestBatch)
    writes: list[PartitionStateWrite] = field(default_factory=list)
    failed: dict[TopicPartition, str] = field(default_factory=dict)
    topics_to_resume_deletion: set[str] = field(default_factory=set)
    unclean_elections: int = 0

    def write(self, ctx: ControllerContext, tp: TopicPartition, new_state: LeaderAndIsr, create: bool = False) -> LeaderAndIsr:
        """Record a conditional write of tp's state and apply it to the context; returns the stored state."""
        if create:
            stored = new_state.with_controller_epoch(ctx.epoch)
            self.writes.append(PartitionStateWrite(tp, None, stored))
        else:
            expected = new_state.partition_epoch
            stored = new_state.with_controller_epoch(ctx.epoch).with_partition_epoch(expected + 1)
            self.writes.append(PartitionStateWrite(tp, expected, stored))
        ctx.put_partition_leadership_info(tp, stored)
        self.failed.pop(tp, None)
        return stored
