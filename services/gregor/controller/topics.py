"""Topic changes: which topics appeared or vanished, and onNewPartitionCreation (seed 001)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gregor.controller import partition_state_machine as psm
from gregor.controller import replica_state_machine as rsm
from gregor.controller.election import OfflineElection
from gregor.controller.requests import ControllerActions
from gregor.controller.state import ControllerContext, PartitionState, ReplicaState, TopicPartition


def compute_topic_changes(known: Iterable[str], current: Iterable[str]) -> tuple[set[str], set[str]]:
    """(new topics, deleted topics) between the context's topics and those read from etcd."""
    known_set, current_set = set(known), set(current)
    return current_set - known_set, known_set - current_set


def on_new_partition_creation(
    ctx: ControllerContext, partitions: Iterable[TopicPartition], actions: ControllerActions
) -> None:
    """New partitions go New -> Online with their replicas New -> Online; the first live replica leads."""
    parts = sorted(set(partitions))
    psm.handle_state_changes(ctx, parts, PartitionState.NEW, actions)
    rsm.handle_state_changes(ctx, ctx.replicas_for_partitions(parts), ReplicaState.NEW, actions)
    psm.handle_state_changes(ctx, parts, PartitionState.ONLINE, actions, OfflineElection())
    rsm.handle_state_changes(ctx, ctx.replicas_for_partitions(parts), ReplicaState.ONLINE, actions)


def process_topic_change(
    ctx: ControllerContext,
    assignments: Mapping[str, Mapping[int, Sequence[int]]],
    actions: ControllerActions,
) -> tuple[set[str], set[str]]:
    """The TopicChange event against the topics and assignments read from etcd.

    Adds new topics and their assignments, forgets deleted ones, and creates
    the new partitions. Returns (new topics, deleted topics).
    """
    new, deleted = compute_topic_changes(ctx.all_topics, assignments)
    for topic in deleted:
        ctx.remove_topic(topic)
    created: list[TopicPartition] = []
    for topic in sorted(new):
        ctx.all_topics.add(topic)
        for partition, replicas in sorted(assignments[topic].items()):
            tp = TopicPartition(topic, partition)
            ctx.update_partition_replica_assignment(tp, replicas)
            created.append(tp)
    if created:
        on_new_partition_creation(ctx, created, actions)
    return new, deleted


def process_partition_modifications(
    ctx: ControllerContext, topic: str, assignment: Mapping[int, Sequence[int]], actions: ControllerActions
) -> list[TopicPartition]:
    """The PartitionModifications event: create partitions added to an existing topic; returns them."""
    added = [
        TopicPartition(topic, p) for p in sorted(assignment) if p not in ctx.partition_assignments.get(topic, {})
    ]
    for tp in added:
        ctx.update_partition_replica_assignment(tp, assignment[tp.partition])
    if added:
        on_new_partition_creation(ctx, added, actions)
    return added


def on_topic_deletion(ctx: ControllerContext, topics: Iterable[str], actions: ControllerActions) -> set[str]:
    """Delete topics at once (a compressed TopicDeletionManager); returns the topics deleted.

    Every replica goes Offline -> ReplicaDeletionStarted (StopReplica with delete)
    -> ReplicaDeletionSuccessful -> NonExistent without waiting for the brokers'
    answers, the partitions Offline -> NonExistent, and the topic leaves the
    context. Partition-state writes for the deleted topics are dropped: the
    driver deletes their keys instead. Every live broker gets UpdateMetadata.
    """
    doomed = {t for t in topics if t in ctx.all_topics}
    if not doomed:
        return doomed
    ctx.topics_to_be_deleted |= doomed
    ctx.topics_with_deletion_started |= doomed
    partitions = sorted(tp for t in doomed for tp in ctx.partitions_for_topic(t))
    replicas = ctx.replicas_for_partitions(partitions)
    rsm.handle_state_changes(ctx, replicas, ReplicaState.OFFLINE, actions)
    rsm.handle_state_changes(ctx, replicas, ReplicaState.DELETION_STARTED, actions)
    rsm.handle_state_changes(ctx, replicas, ReplicaState.DELETION_SUCCESSFUL, actions)
    psm.handle_state_changes(ctx, partitions, PartitionState.OFFLINE, actions)
    psm.handle_state_changes(ctx, partitions, PartitionState.NON_EXISTENT, actions)
    rsm.handle_state_changes(ctx, replicas, ReplicaState.NON_EXISTENT, actions)
    actions.writes = [w for w in actions.writes if w.topic_partition.topic not in doomed]
    actions.batch.discard_partitions(partitions)
    actions.batch.add_update_metadata(ctx.live_or_shutting_down_broker_ids, [])
    for topic in doomed:
        ctx.remove_topic(topic)
        ctx.topics_to_be_deleted.discard(topic)
        ctx.topics_with_deletion_started.discard(topic)
        ctx.topics_ineligible_for_deletion.discard(topic)
    return doomed
