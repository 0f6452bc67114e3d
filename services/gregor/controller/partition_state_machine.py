"""Kafka's partition state machine as pure transitions over ControllerContext that return writes and requests."""

from __future__ import annotations

from collections.abc import Iterable

from gregor.controller.election import (ElectionStrategy, OfflineElection, PreferredElection, elect_leader,
                                       election_kind)
from gregor.controller.requests import ControllerActions, Recompute
from gregor.controller.state import ControllerContext, LeaderAndIsr, PartitionState, TopicPartition

__all__ = [
    "PartitionState",
    "VALID_PREVIOUS_STATES",
    "IllegalPartitionStateTransition",
    "handle_state_changes",
    "trigger_online_partition_state_change",
    "initialize_partition_states",
]

P = PartitionState

# Target state -> the states a partition may move from (Kafka's validPreviousStates).
VALID_PREVIOUS_STATES: dict[PartitionState, frozenset[PartitionState]] = {
    P.NEW: frozenset({P.NON_EXISTENT}),
    P.ONLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.OFFLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.NON_EXISTENT: frozenset({P.OFFLINE}),
}


class IllegalPartitionStateTransition(ValueError):
    """A transition the partition state machine does not allow."""

    def __init__(self, tp: TopicPartition, current: PartitionState, target: PartitionState) -> None:
        allowed = ", ".join(sorted(s.value for s in VALID_PREVIOUS_STATES[target]))
        super().__init__(
            f"Partition {tp} cannot move from {current.value} to {target.value}; "
            f"{target.value} is reachable only from: {allowed}"
        )
        self.topic_partition, self.current, self.target = tp, current, target


def handle_state_changes(
    ctx: ControllerContext,
    partitions: Iterable[TopicPartition],
    target: PartitionState,
    actions: ControllerActions,
    strategy: ElectionStrategy | None = None,
) -> dict[TopicPartition, LeaderAndIsr | None]:
    """Move partitions to `target`, appending etcd writes and control requests to `actions`.

    Every transition is checked before any state changes, so an illegal one
    raises IllegalPartitionStateTransition and leaves the context untouched.

    Args:
        ctx: the controller context, updated in place.
        partitions: the partitions to move.
        target: the state to move them to.
        actions: collects writes, requests and failures.
        strategy: election strategy when `target` is OnlinePartition for
            partitions that already have a leader record (default: offline
            election without unclean).

    Returns:
        For OnlinePartition, per partition the new leader and ISR or None if no
        leader could be chosen (the reason is in `actions.failed`); else {}.
    """
    parts = sorted(set(partitions))
    for tp in parts:
        current = ctx.partition_state(tp)
        if current not in VALID_PREVIOUS_STATES[target]:
            raise IllegalPartitionStateTransition(tp, current, target)
    if target is P.ONLINE:
        return _to_online(ctx, parts, actions, strategy or OfflineElection())
    for tp in parts:
        ctx.put_partition_state(tp, target)
        if target is P.NON_EXISTENT:
            ctx.partition_leadership_info.pop(tp, None)
    return {}


def _to_online(
    ctx: ControllerContext,
    parts: list[TopicPartition],
    actions: ControllerActions,
    strategy: ElectionStrategy,
) -> dict[TopicPartition, LeaderAndIsr | None]:
    results: dict[TopicPartition, LeaderAndIsr | None] = {}
    for tp in parts:
        if ctx.partition_state(tp) is P.NEW:
            results[tp] = _initialize_leader_and_isr(ctx, tp, actions)
        else:
            results[tp] = _elect_leader(ctx, tp, actions, strategy)
        if results[tp] is not None:
            ctx.put_partition_state(tp, P.ONLINE)
    return results


def _initialize_leader_and_isr(
    ctx: ControllerContext, tp: TopicPartition, actions: ControllerActions
) -> LeaderAndIsr | None:
    """A new partition's first state: the first live replica leads, all live replicas are the ISR."""
    live = [r for r in ctx.partition_replica_assignment(tp) if ctx.is_replica_online(r, tp)]
    if not live:
        actions.failed[tp] = f"Failed to initialize partition {tp}: no assigned replica is alive"
        return None
    stored = actions.write(ctx, tp, LeaderAndIsr(leader=live[0], isr=tuple(live)), create=True)
    actions.batch.add_leader_and_isr(ctx, stored.isr, tp, stored, is_new=True)
    return stored


def _elect_leader(
    ctx: ControllerContext, tp: TopicPartition, actions: ControllerActions, strategy: ElectionStrategy
) -> LeaderAndIsr | None:
    current = ctx.partition_leadership_info.get(tp)
    if current is None:
        actions.failed[tp] = f"Failed to elect leader for partition {tp}: no leader and ISR recorded"
        return None
    if current.controller_epoch > ctx.epoch:
        # A newer controller wrote this state: we have been replaced (ControllerMovedException).
        actions.failed[tp] = (
            f"Leader and ISR of {tp} was written by controller epoch {current.controller_epoch}, "
            f"newer than ours ({ctx.epoch})"
        )
        return None
    result = elect_leader(ctx, tp, current, strategy)
    if result.new_leader_and_isr is None:
        actions.failed[tp] = f"Failed to elect leader for partition {tp} under strategy {type(strategy).__name__}"
        return None
    if result.is_unclean:
        actions.unclean_elections += 1
    kind = election_kind(strategy, result.is_unclean)
    actions.elections[kind] = actions.elections.get(kind, 0) + 1
    stored = actions.write(ctx, tp, result.new_leader_and_isr, recompute=_reelect(ctx, tp, strategy))
    actions.batch.add_leader_and_isr(ctx, result.live_replicas, tp, stored)
    return stored


def _reelect(ctx: ControllerContext, tp: TopicPartition, strategy: ElectionStrategy) -> Recompute:
    """The election re-run on a state read back after a lost compare (updateLeaderAndIsr's retry).

    A preferred election whose preferred replica already leads needs no write; an
    election that finds no leader in the fresh ISR fails.
    """

    def recompute(current: LeaderAndIsr) -> LeaderAndIsr | None:
        assignment = ctx.partition_replica_assignment(tp)
        if isinstance(strategy, PreferredElection) and assignment and current.leader == assignment[0]:
            return current
        return elect_leader(ctx, tp, current, strategy).new_leader_and_isr

    return recompute


def trigger_online_partition_state_change(
    ctx: ControllerContext, actions: ControllerActions, strategy: OfflineElection | None = None
) -> dict[TopicPartition, LeaderAndIsr | None]:
    """Try to bring every New or Offline partition online (topics queued for deletion excepted)."""
    candidates = [
        tp for tp in ctx.partitions_in_states(P.NEW, P.OFFLINE) if not ctx.is_topic_queued_up_for_deletion(tp.topic)
    ]
    return handle_state_changes(ctx, candidates, P.ONLINE, actions, strategy or OfflineElection())


def initialize_partition_states(ctx: ControllerContext) -> None:
    """On controller failover: Online if the recorded leader is online, Offline if not, New if no record."""
    for tp in sorted(ctx.all_partitions()):
        lai = ctx.partition_leadership_info.get(tp)
        if lai is None:
            ctx.put_partition_state(tp, P.NEW)
        elif ctx.is_replica_online(lai.leader, tp):
            ctx.put_partition_state(tp, P.ONLINE)
        else:
            ctx.put_partition_state(tp, P.OFFLINE)
