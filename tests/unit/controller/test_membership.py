"""Broker membership: new/dead/bounced detection and the startup/failure callbacks."""

from __future__ import annotations

from gregor.controller.membership import (compute_broker_changes, on_broker_log_dir_failure, on_controller_failover,
                                         on_leader_and_isr_response, process_broker_change)
from gregor.controller.requests import ControllerActions, LeaderAndIsrRequest, StopReplicaRequest, UpdateMetadataRequest
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


def test_log_dir_event_sends_leader_and_isr_for_every_replica_of_the_broker() -> None:
    """onBrokerLogDirFailure: the broker named gets LeaderAndIsr for all its replicas (their answers decide)."""
    ctx = _running_cluster()
    other = TopicPartition("t", 1)
    ctx.update_partition_replica_assignment(other, (2, 3))
    on_new_partition_creation(ctx, [other], ControllerActions())
    actions = ControllerActions()
    on_broker_log_dir_failure(ctx, [2, 9], actions)  # 9 is not live: ignored
    built = actions.batch.build(ctx, 0)
    assert set(built) >= {2} and 9 not in built
    lair = next(r for r in built[2] if isinstance(r, LeaderAndIsrRequest))
    assert {s.topic_partition for s in lair.partition_states} == {TP, other}
    assert not actions.writes  # nothing changes until the broker answers


def test_storage_error_answer_moves_leadership_off_the_replica_and_lists_it_offline() -> None:
    ctx = _running_cluster()
    assert ctx.partition_leadership_info[TP].leader == 1
    actions = ControllerActions()
    offline, back = on_leader_and_isr_response(ctx, 1, [TP], [TP], actions)
    assert (offline, back) == ({TP}, set())
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr, lai.leader_epoch) == (2, (2, 3), 1)
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.OFFLINE
    assert not ctx.is_replica_online(1, TP) and ctx.offline_dir_replicas(TP) == (1,)
    built = actions.batch.build(ctx, 0)
    assert any(isinstance(r, StopReplicaRequest) for r in built[1])
    lair = next(r for r in built[2] if isinstance(r, LeaderAndIsrRequest))
    assert lair.partition_states[0].leader_and_isr.leader == 2
    um = next(r for r in built[3] if isinstance(r, UpdateMetadataRequest))
    assert um.partition_states[0].offline_replicas == (1,)
    # The same answer again (the dir is still offline) changes nothing.
    again = ControllerActions()
    assert on_leader_and_isr_response(ctx, 1, [TP], [TP], again) == (set(), set())
    assert not again.writes


def test_a_follower_in_an_offline_dir_leaves_the_isr_and_comes_back() -> None:
    ctx = _running_cluster()
    actions = ControllerActions()
    on_leader_and_isr_response(ctx, 3, [TP], [TP], actions)
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr) == (1, (1, 2))
    # The dir is back: the log dir event's LeaderAndIsr is answered without error.
    actions = ControllerActions()
    on_broker_log_dir_failure(ctx, [3], actions)
    offline, back = on_leader_and_isr_response(ctx, 3, [TP], [], actions)
    assert (offline, back) == (set(), {TP})
    assert ctx.is_replica_online(3, TP) and ctx.offline_dir_replicas(TP) == () and 3 not in ctx.replicas_on_offline_dirs
    assert ctx.replica_state(PartitionReplica(TP, 3)) is ReplicaState.ONLINE
    built = actions.batch.build(ctx, 0)
    lair = next(r for r in built[3] if isinstance(r, LeaderAndIsrRequest))
    assert lair.partition_states[0].leader_and_isr.leader == 1  # it follows; the leader takes it back into the ISR
    um = next(r for r in built[1] if isinstance(r, UpdateMetadataRequest))
    assert um.partition_states[0].offline_replicas == ()


def test_the_only_isr_member_in_an_offline_dir_leads_again_when_it_is_back() -> None:
    ctx = _running_cluster()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 0, (1,), 2, 0))
    actions = ControllerActions()
    on_leader_and_isr_response(ctx, 1, [TP], [TP], actions)
    assert ctx.partition_leadership_info[TP].leader == NO_LEADER and ctx.partition_state(TP) is PartitionState.OFFLINE
    actions = ControllerActions()
    on_leader_and_isr_response(ctx, 1, [TP], [], actions)
    assert ctx.partition_leadership_info[TP].leader == 1 and ctx.partition_state(TP) is PartitionState.ONLINE


def test_a_bounced_broker_forgets_its_offline_dir_replicas() -> None:
    ctx = _running_cluster()
    on_leader_and_isr_response(ctx, 3, [TP], [TP], ControllerActions())
    process_broker_change(ctx, {1: 10, 2: 20, 3: 31}, ControllerActions())
    assert 3 not in ctx.replicas_on_offline_dirs and ctx.is_replica_online(3, TP)


def test_a_deleted_topic_leaves_no_offline_dir_replica_behind() -> None:
    """A topic created again under the same name must not find its replica offline from the old topic's answer."""
    ctx = _running_cluster()
    on_leader_and_isr_response(ctx, 3, [TP], [TP], ControllerActions())
    ctx.remove_topic("t")
    assert 3 not in ctx.replicas_on_offline_dirs and ctx.is_replica_online(3, TP)
