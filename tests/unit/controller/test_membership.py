"""Broker membership: new/dead/bounced detection and the startup/failure callbacks."""

from __future__ import annotations

from gregor.controller.membership import compute_broker_changes, on_controller_failover, process_broker_change
from gregor.controller.requests import ControllerActions, LeaderAndIsrRequest, StopReplicaRequest
from gregor.controller.state import (
    NO_LEADER,
    ControllerContext,
    LeaderAndIsr,
    PartitionReplica,
    PartitionState,
    ReplicaState,
    TopicPartition,
)
from gregor.controller.topics import on_new_partition_creation

TP = TopicPartition("t", 0)


def test_new_dead_and_bounced_brokers() -> None:
    changes = compute_broker_changes({1: 10, 2: 20, 3: 30}, {2: 20, 3: 31, 4: 40})
    assert (changes.new, changes.dead, changes.bounced) == ((4,), (1,), (3,))
    assert compute_broker_changes({1: 10}, {1: 10}).is_empty()
    # An older epoch is not a restart (Kafka compares with >).
    assert compute_broker_changes({1: 10}, {1: 9}).bounced == ()


def _running_cluster() -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs={1: 10, 2: 20, 3: 30}, epoch=2)
    ctx.all_topics.add("t")
    ctx.update_partition_replica_assignment(TP, (1, 2, 3))
    on_new_partition_creation(ctx, [TP], ControllerActions())
    return ctx


def test_leader_failure_elects_from_isr_and_stops_dead_replica() -> None:
    ctx = _running_cluster()
    actions = ControllerActions()
    changes = process_broker_change(ctx, {2: 20, 3: 30}, actions)
    assert changes.dead == (1,)
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr, lai.leader_epoch) == (2, (2, 3), 1)
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.OFFLINE
    assert ctx.partition_state(TP) is PartitionState.ONLINE
    built = actions.batch.build(ctx, 0)
    assert 1 not in ctx.live_broker_epochs and {2, 3} <= set(built)


def test_failure_of_only_isr_member_leaves_partition_offline() -> None:
    ctx = _running_cluster()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 0, (1,), 2, 0))
    actions = ControllerActions()
    process_broker_change(ctx, {2: 20, 3: 30}, actions)
    assert ctx.partition_state(TP) is PartitionState.OFFLINE and ctx.offline_partition_count == 1
    assert ctx.partition_leadership_info[TP].leader == NO_LEADER
    assert ctx.partition_leadership_info[TP].isr == (1,)
    # It comes back: it is the only clean candidate, and leads again.
    actions = ControllerActions()
    process_broker_change(ctx, {1: 11, 2: 20, 3: 30}, actions)
    assert ctx.partition_leadership_info[TP].leader == 1 and ctx.offline_partition_count == 0


def test_bounced_broker_goes_through_failure_then_startup() -> None:
    ctx = _running_cluster()
    actions = ControllerActions()
    changes = process_broker_change(ctx, {1: 11, 2: 20, 3: 30}, actions)
    assert changes.bounced == (1,) and ctx.live_broker_epochs[1] == 11
    assert ctx.partition_leadership_info[TP].leader == 2  # Leadership moved while it was "dead".
    built = actions.batch.build(ctx, 0)
    to_1 = built[1]
    # The startup LeaderAndIsr supersedes the failure's StopReplica, and targets the new epoch.
    assert not any(isinstance(r, StopReplicaRequest) for r in to_1)
    lair = next(r for r in to_1 if isinstance(r, LeaderAndIsrRequest))
    assert lair.broker_epoch == 11 and lair.partition_states[0].leader_and_isr.leader == 2
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.ONLINE


def test_controller_failover_initializes_states_and_informs_everyone() -> None:
    ctx = ControllerContext(live_broker_epochs={2: 20, 3: 30}, epoch=7)
    ctx.all_topics.add("t")
    ctx.update_partition_replica_assignment(TP, (1, 2, 3))
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 4, (1, 3), controller_epoch=6, partition_epoch=9))
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    # ReplicaStateMachine.startup: the dead broker's replica goes OfflineReplica (leader -1, out of the
    # ISR: one write), then the partition state machine elects 3 from the shrunk ISR (a second write).
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.OFFLINE
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr, lai.leader_epoch, lai.controller_epoch, lai.partition_epoch) == (3, (3,), 6, 7, 11)
    assert actions.batch.update_metadata_brokers == {2, 3}
