"""Kafka's replica state machine as pure transitions over ControllerContext that return writes and requests."""

from __future__ import annotations

from collections.abc import Iterable

from gregor.controller.requests import ControllerActions
from gregor.controller.state import NO_LEADER, ControllerContext, LeaderAndIsr, PartitionReplica, ReplicaState

__all__ = [
    "ReplicaState",
    "VALID_PREVIOUS_STATES",
    "IllegalReplicaStateTransition",
    "handle_state_changes",
    "initialize_replica_states",
]

R = ReplicaState

# Target state -> the states a replica may move from (Kafka's validPreviousStates).
VALID_PREVIOUS_STATES: dict[ReplicaState, frozenset[ReplicaState]] = {
    R.NEW: frozenset({R.NON_EXISTENT}),
    R.ONLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.OFFLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.DELETION_STARTED: frozenset({R.OFFLINE}),
    R.DELETION_SUCCESSFUL: frozenset({R.DELETION_STARTED}),
    R.DELETION_INELIGIBLE: frozenset({R.OFFLINE, R.DELETION_STARTED}),
    R.NON_EXISTENT: frozenset({R.DELETION_SUCCESSFUL}),
}


class IllegalReplicaStateTransition(ValueError):
    """A transition the replica state machine does not allow."""

    def __init__(self, replica: PartitionReplica, current: ReplicaState, target: ReplicaState) -> None:
        allowed = ", ".join(sorted(s.value for s in VALID_PREVIOUS_STATES[target]))
        super().__init__(
            f"Replica {replica.replica} of partition {replica.topic_partition} cannot move from "
            f"{current.value} to {target.value}; {target.value} is reachable only from: {allowed}"
        )
        self.replica, self.current, self.target = replica, current, target


def handle_state_changes(
    ctx: ControllerContext,
    replicas: Iterable[PartitionReplica],
    target: ReplicaState,
    actions: ControllerActions,
) -> None:
    """Move replicas to `target`, appending etcd writes and control requests to `actions`.

    Every transition is checked first; an illegal one raises
    IllegalReplicaStateTransition and leaves the context untouched.
    """
    reps = sorted(set(replicas))
    for replica in reps:
        current = ctx.replica_state(replica)
        if current not in VALID_PREVIOUS_STATES[target]:
            raise IllegalReplicaStateTransition(replica, current, target)
    handler = {
        R.NEW: _to_new,
        R.ONLINE: _to_online,
        R.OFFLINE: _to_offline,
        R.DELETION_STARTED: _to_deletion_started,
        R.NON_EXISTENT: _to_non_existent,
    }.get(target)
    if handler is None:  # DeletionSuccessful / DeletionIneligible only record the state.
        for replica in reps:
            ctx.put_replica_state(replica, target)
        return
    for replica in reps:
        handler(ctx, replica, actions)


def _to_new(ctx: ControllerContext, replica: PartitionReplica, actions: ControllerActions) -> None:
    tp, broker_id = replica
    lai = ctx.partition_leadership_info.get(tp)
    if lai is not None and lai.leader == broker_id:
        actions.failed[tp] = (
            f"Replica {broker_id} for partition {tp} cannot be moved to NewReplica state "
            "as it is being requested to become leader"
        )
        return
    if lai is not None:
        actions.batch.add_leader_and_isr(ctx, [broker_id], tp, lai, is_new=True)
    ctx.put_replica_state(replica, R.NEW)


def _to_online(ctx: ControllerContext, replica: PartitionReplica, actions: ControllerActions) -> None:
    tp, broker_id = replica
    if ctx.replica_state(replica) is R.NEW:
        assignment = ctx.partition_replica_assignment(tp)
        if broker_id not in assignment:
            ctx.update_partition_replica_assignment(tp, (*assignment, broker_id))
    else:
        lai = ctx.partition_leadership_info.get(tp)
        if lai is not None:
            actions.batch.add_leader_and_isr(ctx, [broker_id], tp, lai)
    ctx.put_replica_state(replica, R.ONLINE)


def _to_offline(ctx: ControllerContext, replica: PartitionReplica, actions: ControllerActions) -> None:
    """Stop the replica and take it out of the ISR; it leaves leadership if it led (removeReplicasFromIsr)."""
    tp, broker_id = replica
    actions.batch.add_stop_replica([broker_id], tp, delete_partition=False)
    lai = ctx.partition_leadership_info.get(tp)
    if lai is None:
        actions.batch.add_update_metadata(ctx.live_or_shutting_down_broker_ids, [tp])
        ctx.put_replica_state(replica, R.OFFLINE)
        return
    if lai.controller_epoch > ctx.epoch:
        actions.failed[tp] = f"Leader and ISR of {tp} was written by a newer controller epoch"
        return
    if broker_id in lai.isr:
        lai = actions.write(ctx, tp, _remove_replica_from_isr(lai, broker_id),
                            recompute=lambda current: _remove_replica_from_isr(current, broker_id))
    if not ctx.is_topic_queued_up_for_deletion(tp.topic):
        recipients = [r for r in ctx.partition_replica_assignment(tp) if r != broker_id]
        actions.batch.add_leader_and_isr(ctx, recipients, tp, lai)
    ctx.put_replica_state(replica, R.OFFLINE)


def _remove_replica_from_isr(lai: LeaderAndIsr, broker_id: int) -> LeaderAndIsr:
    """Kafka's removeReplicasFromIsr for one replica: it leaves the ISR and, if it led, leadership.

    The last ISR member stays: it is the only clean candidate when it returns.
    Returns `lai` itself when the replica is already out (nothing to write).
    """
    if broker_id not in lai.isr and lai.leader != broker_id:
        return lai
    new_leader = NO_LEADER if lai.leader == broker_id else lai.leader
    new_isr = lai.isr if len(lai.isr) == 1 else tuple(r for r in lai.isr if r != broker_id)
    return lai.new_leader_and_isr(new_leader, new_isr)


def _to_deletion_started(ctx: ControllerContext, replica: PartitionReplica, actions: ControllerActions) -> None:
    ctx.put_replica_state(replica, R.DELETION_STARTED)
    actions.batch.add_stop_replica([replica.replica], replica.topic_partition, delete_partition=True)


def _to_non_existent(ctx: ControllerContext, replica: PartitionReplica, actions: ControllerActions) -> None:
    tp, broker_id = replica
    assignment = ctx.partition_replica_assignment(tp)
    ctx.update_partition_replica_assignment(tp, tuple(r for r in assignment if r != broker_id))
    ctx.remove_replica_state(replica)


def initialize_replica_states(ctx: ControllerContext) -> None:
    """On controller failover: Online if the replica's broker is live, else ReplicaDeletionIneligible."""
    for replica in ctx.replicas_for_partitions(sorted(ctx.all_partitions())):
        if ctx.is_replica_online(replica.replica, replica.topic_partition):
            ctx.put_replica_state(replica, R.ONLINE)
        else:
            # Kafka marks replicas on dead brokers ineligible so topic deletion waits for them.
            ctx.put_replica_state(replica, R.DELETION_INELIGIBLE)
