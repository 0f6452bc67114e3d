"""Broker membership: new/dead/bounced brokers and the pure parts of onBrokerStartup / onBrokerFailure (seed 001)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gregor.controller import partition_state_machine as psm
from gregor.controller import replica_state_machine as rsm
from gregor.controller.election import OfflineElection
from gregor.controller.requests import ControllerActions
from gregor.controller.state import (UNKNOWN_BROKER_EPOCH, ControllerContext, PartitionReplica, PartitionState,
                                     ReplicaState, TopicPartition)


@dataclass(frozen=True)
class BrokerChanges:
    """Sorted broker ids that appeared, disappeared, or re-registered with a newer epoch."""

    new: tuple[int, ...]
    dead: tuple[int, ...]
    bounced: tuple[int, ...]

    def is_empty(self) -> bool:
        return not (self.new or self.dead or self.bounced)


def compute_broker_changes(previous: Mapping[int, int], current: Mapping[int, int]) -> BrokerChanges:
    """Compare registrations {broker id: broker epoch} as processBrokerChange does.

    A broker is bounced when its id is in both maps with a larger epoch now:
    it restarted (new etcd lease, new creation revision) between two looks.
    """
    new = sorted(set(current) - set(previous))
    dead = sorted(set(previous) - set(current))
    bounced = sorted(b for b in set(current) & set(previous) if current[b] > previous[b])
    return BrokerChanges(tuple(new), tuple(dead), tuple(bounced))


def bounced_leaders(ctx: ControllerContext, current: Mapping[int, int]) -> set[int]:
    """Registered brokers that lead a partition under another registration than the one elected.

    A partition state records the leader's broker epoch when its leader epoch
    began (`requests.stamp_leader_broker_epoch`). A controller that did not see
    the leader restart (it failed over meanwhile, or the bounce fell between its
    looks) finds the leader registered under a newer epoch: that incarnation may
    have lost an unflushed tail appended under this leader epoch, so telling it
    to lead on at the same epoch would leave followers holding that tail
    without a reason to truncate it. Such brokers are bounced. An unknown
    recorded epoch (a state from before the field) is no evidence either way.
    """
    return {
        lai.leader
        for lai in ctx.partition_leadership_info.values()
        if lai.leader_broker_epoch != UNKNOWN_BROKER_EPOCH
        and lai.leader in current
        and current[lai.leader] != lai.leader_broker_epoch
    }


def on_bounced_brokers(
    ctx: ControllerContext,
    bounced: Iterable[int],
    current: Mapping[int, int],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> None:
    """processBrokerChange's bounced branch: onBrokerFailure, then onBrokerStartup at the new epochs.

    Their partitions lose them as leader and ISR member, are elected again
    (a new leader epoch) and their replicas come back as followers or leaders.
    """
    bounced = sorted(set(bounced))
    ctx.remove_live_brokers(bounced)
    on_broker_failure(ctx, bounced, actions, election)
    ctx.add_live_brokers({b: current[b] for b in bounced})
    on_broker_startup(ctx, bounced, actions, election)


def on_replicas_become_offline(
    ctx: ControllerContext,
    replicas: Iterable[PartitionReplica],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> None:
    """Offline partitions lose their leader, new leaders are elected, the replicas go Offline."""
    offline = set(replicas)
    for_deletion = {r for r in offline if ctx.is_topic_queued_up_for_deletion(r.topic_partition.topic)}
    not_for_deletion = offline - for_deletion
    psm.handle_state_changes(ctx, ctx.partitions_with_offline_leader(), PartitionState.OFFLINE, actions)
    online_results = psm.trigger_online_partition_state_change(ctx, actions, election)
    rsm.handle_state_changes(ctx, not_for_deletion, ReplicaState.OFFLINE, actions)
    if for_deletion:
        rsm.handle_state_changes(
            ctx,
            [r for r in for_deletion if ctx.replica_state(r) in rsm.VALID_PREVIOUS_STATES[ReplicaState.DELETION_INELIGIBLE]],
            ReplicaState.DELETION_INELIGIBLE,
            actions,
        )
        ctx.topics_ineligible_for_deletion.update(r.topic_partition.topic for r in for_deletion)
    # Nothing changed leader or ISR: tell everyone about the dead brokers anyway.
    if not not_for_deletion and all(v is None for v in online_results.values()):
        actions.batch.add_update_metadata(ctx.live_or_shutting_down_broker_ids, [])


def on_broker_failure(
    ctx: ControllerContext,
    dead_brokers: Iterable[int],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> None:
    """Forget per-broker bookkeeping and take every replica on the dead brokers offline.

    The caller has already removed the brokers from `live_broker_epochs`.
    """
    dead = sorted(set(dead_brokers))
    for broker_id in dead:
        ctx.replicas_on_offline_dirs.pop(broker_id, None)
        ctx.shutting_down_broker_ids.discard(broker_id)
    on_replicas_become_offline(ctx, ctx.replicas_on_brokers(dead), actions, election)


def on_broker_startup(
    ctx: ControllerContext,
    new_brokers: Iterable[int],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> None:
    """Tell everyone about the new brokers, bring their replicas online, elect where possible.

    The caller has already added the brokers to `live_broker_epochs`.
    """
    new = sorted(set(new_brokers))
    for broker_id in new:
        ctx.replicas_on_offline_dirs.pop(broker_id, None)
    existing = ctx.live_or_shutting_down_broker_ids - set(new)
    actions.batch.add_update_metadata(existing, [])
    actions.batch.add_update_metadata(new, ctx.partitions_with_leaders())
    replicas = ctx.replicas_on_brokers(new)
    rsm.handle_state_changes(ctx, replicas, ReplicaState.ONLINE, actions)
    psm.trigger_online_partition_state_change(ctx, actions, election)
    actions.topics_to_resume_deletion.update(
        r.topic_partition.topic for r in replicas if ctx.is_topic_queued_up_for_deletion(r.topic_partition.topic)
    )


def on_broker_log_dir_failure(ctx: ControllerContext, broker_ids: Iterable[int], actions: ControllerActions) -> None:
    """Kafka's onBrokerLogDirFailure, for a log dir event notification (a dir offline, or Gregor's dir back):
    LeaderAndIsr for every replica of the live brokers named (they move to OnlineReplica). Each broker answers
    KAFKA_STORAGE_ERROR for the replicas in an offline dir; `on_leader_and_isr_response` acts on the answers."""
    live = sorted(set(broker_ids) & ctx.live_or_shutting_down_broker_ids)
    valid = rsm.VALID_PREVIOUS_STATES[ReplicaState.ONLINE]
    replicas = [r for r in ctx.replicas_on_brokers(live)
                if not ctx.is_topic_queued_up_for_deletion(r.topic_partition.topic) and ctx.replica_state(r) in valid]
    rsm.handle_state_changes(ctx, replicas, ReplicaState.ONLINE, actions)


def on_leader_and_isr_response(
    ctx: ControllerContext,
    broker_id: int,
    partitions: Iterable[TopicPartition],
    storage_errors: Iterable[TopicPartition],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> tuple[set[TopicPartition], set[TopicPartition]]:
    """Kafka's LeaderAndIsrResponseReceived: a live broker answered LeaderAndIsr for `partitions`, with
    KAFKA_STORAGE_ERROR for `storage_errors` (replicas in an offline log dir).

    The broker's offline-dir replicas become the errored ones plus those it had that this answer did not cover.
    Newly offline replicas go OfflineReplica (onReplicasBecomeOffline: a partition they led elects a new leader
    from the rest of its ISR, the others drop them from the ISR). Replicas answered without error that were
    offline are back (Gregor's dirs come back without a restart): they already got LeaderAndIsr as followers,
    so they catch up and the leader takes them back into the ISR; a partition left without a leader while they
    were away is elected again. Returns (newly offline, back online).
    """
    previous = ctx.replicas_on_offline_dirs.get(broker_id, set())
    offline = set(storage_errors)
    online = set(partitions) - offline
    current = (previous - online) | offline
    if current:
        ctx.replicas_on_offline_dirs[broker_id] = current
    else:
        ctx.replicas_on_offline_dirs.pop(broker_id, None)
    newly_offline = offline - previous
    back_online = previous & online
    valid = rsm.VALID_PREVIOUS_STATES[ReplicaState.OFFLINE]
    replicas = [PartitionReplica(tp, broker_id) for tp in sorted(newly_offline)
                if broker_id in ctx.partition_replica_assignment(tp)
                and ctx.replica_state(PartitionReplica(tp, broker_id)) in valid]
    if replicas:
        on_replicas_become_offline(ctx, replicas, actions, election)
    if back_online:
        psm.trigger_online_partition_state_change(ctx, actions, election)
        actions.batch.add_update_metadata(ctx.live_or_shutting_down_broker_ids,
                                          [tp for tp in back_online if tp in ctx.partition_leadership_info])
    return newly_offline, back_online


def process_broker_change(
    ctx: ControllerContext,
    current: Mapping[int, int],
    actions: ControllerActions,
    election: OfflineElection | None = None,
) -> BrokerChanges:
    """The BrokerChange event against registrations read from etcd (steps 3 and 7-9 of processBrokerChange).

    Returns the changes so the driver can add and remove channel-manager senders.
    """
    changes = compute_broker_changes(ctx.live_broker_epochs, current)
    if changes.new:
        ctx.add_live_brokers({b: current[b] for b in changes.new})
        on_broker_startup(ctx, changes.new, actions, election)
    # Leaders recorded under another registration than the one seen now bounced too (even a broker
    # just seen as new: a partition it still leads under its old registration must not stay at that epoch).
    stale = bounced_leaders(ctx, current) - set(changes.bounced)
    if stale:
        changes = BrokerChanges(changes.new, changes.dead, tuple(sorted({*changes.bounced, *stale})))
    if changes.bounced:
        on_bounced_brokers(ctx, changes.bounced, current, actions, election)
    if changes.dead:
        ctx.remove_live_brokers(changes.dead)
        on_broker_failure(ctx, changes.dead, actions, election)
    return changes


def on_controller_failover(
    ctx: ControllerContext, actions: ControllerActions, election: OfflineElection | None = None
) -> set[int]:
    """The pure part of onControllerFailover, once the driver has loaded the context from etcd.

    Tells every live broker the full metadata, then runs Kafka's
    ReplicaStateMachine.startup: replicas on live brokers go OnlineReplica
    (LeaderAndIsr to them), replicas on brokers that are not registered go
    OfflineReplica, which takes them out of the ISR (the last member stays) and
    out of leadership through the guarded partition-state write. A broker that
    died while no controller was active thus leaves every ISR at once instead
    of holding acks=all until each leader's isr-expiration drops it. Then
    PartitionStateMachine.startup: partitions whose leader is not live (now
    `leader: -1`) are Offline and get elected with the new ISR, new ones are
    initialized.

    A leader registered under another broker epoch than the one its partition
    state records restarted while no controller watched (`bounced_leaders`):
    it is handled as processBrokerChange handles a bounced broker, out then in
    again, so its partitions get a new leader epoch. Returns those brokers.
    """
    current = dict(ctx.live_broker_epochs)
    bounced = bounced_leaders(ctx, current)
    ctx.remove_live_brokers(bounced)
    live = ctx.live_or_shutting_down_broker_ids
    actions.batch.add_update_metadata(live, ctx.partitions_with_leaders())
    rsm.initialize_replica_states(ctx)
    online = sorted(r for r, s in ctx.replica_states.items() if s is ReplicaState.ONLINE)
    # Replicas of topics queued for deletion stay ReplicaDeletionIneligible (the deletion takes them).
    offline = sorted(
        r for r, s in ctx.replica_states.items()
        if s is not ReplicaState.ONLINE and not ctx.is_topic_queued_up_for_deletion(r.topic_partition.topic)
    )
    rsm.handle_state_changes(ctx, online, ReplicaState.ONLINE, actions)
    rsm.handle_state_changes(ctx, offline, ReplicaState.OFFLINE, actions)
    psm.initialize_partition_states(ctx)
    psm.trigger_online_partition_state_change(ctx, actions, election)
    if bounced:
        ctx.add_live_brokers({b: current[b] for b in bounced})
        on_broker_startup(ctx, bounced, actions, election)
    return bounced
