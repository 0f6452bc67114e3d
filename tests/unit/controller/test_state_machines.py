"""Partition and replica state machines: legal transitions, writes and control requests they produce."""

from __future__ import annotations

import pytest

from gregor.controller import partition_state_machine as psm
from gregor.controller import replica_state_machine as rsm
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
from gregor.controller.topics import on_new_partition_creation, process_partition_modifications, process_topic_change

TP = TopicPartition("t", 0)


def _ctx(live: dict[int, int] | None = None) -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs=live or {1: 101, 2: 102, 3: 103}, epoch=5)
    ctx.all_topics.add("t")
    ctx.update_partition_replica_assignment(TP, (1, 2, 3))
    return ctx


def test_new_partition_creation_initializes_leader_and_isr_and_requests() -> None:
    ctx, actions = _ctx({1: 101, 3: 103}), ControllerActions()
    on_new_partition_creation(ctx, [TP], actions)
    assert ctx.partition_state(TP) is PartitionState.ONLINE
    [write] = actions.writes
    assert write.expected_partition_epoch is None
    assert write.new_state == LeaderAndIsr(1, 0, (1, 3), controller_epoch=5, partition_epoch=0,
                                           leader_broker_epoch=101)
    assert ctx.partition_leadership_info[TP] == write.new_state
    requests = actions.batch.build(ctx, controller_id=7)
    lair = [r for r in requests[1] if isinstance(r, LeaderAndIsrRequest)][0]
    assert (lair.controller_id, lair.controller_epoch, lair.broker_epoch) == (7, 5, 101)
    assert lair.partition_states[0].is_new and lair.partition_states[0].replicas == (1, 2, 3)
    assert any(isinstance(r, UpdateMetadataRequest) for r in requests[3])
    assert 2 not in requests  # Broker 2 is not live.
    assert all(ctx.replica_state(PartitionReplica(TP, r)) is ReplicaState.ONLINE for r in (1, 2, 3))


def test_new_partition_without_live_replicas_stays_new() -> None:
    ctx, actions = _ctx({9: 1}), ControllerActions()
    on_new_partition_creation(ctx, [TP], actions)
    assert ctx.partition_state(TP) is PartitionState.NEW and TP in actions.failed and not actions.writes


def test_illegal_partition_transition_raises_and_changes_nothing() -> None:
    ctx = _ctx()
    with pytest.raises(psm.IllegalPartitionStateTransition, match="NonExistentPartition to OnlinePartition"):
        psm.handle_state_changes(ctx, [TP], PartitionState.ONLINE, ControllerActions())
    ctx.put_partition_state(TP, PartitionState.ONLINE)
    with pytest.raises(psm.IllegalPartitionStateTransition, match="reachable only from: OfflinePartition"):
        psm.handle_state_changes(ctx, [TP], PartitionState.NON_EXISTENT, ControllerActions())
    assert ctx.partition_state(TP) is PartitionState.ONLINE


def test_partition_transition_table_matches_kafka() -> None:
    P = PartitionState
    legal = {(src, dst) for dst, srcs in psm.VALID_PREVIOUS_STATES.items() for src in srcs}
    assert legal == {
        (P.NON_EXISTENT, P.NEW), (P.NEW, P.ONLINE), (P.ONLINE, P.ONLINE), (P.OFFLINE, P.ONLINE),
        (P.NEW, P.OFFLINE), (P.ONLINE, P.OFFLINE), (P.OFFLINE, P.OFFLINE), (P.OFFLINE, P.NON_EXISTENT),
    }


def test_replica_transition_table_matches_kafka() -> None:
    R = ReplicaState
    assert rsm.VALID_PREVIOUS_STATES[R.DELETION_STARTED] == {R.OFFLINE}
    assert rsm.VALID_PREVIOUS_STATES[R.NON_EXISTENT] == {R.DELETION_SUCCESSFUL}
    assert rsm.VALID_PREVIOUS_STATES[R.ONLINE] == {R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}
    with pytest.raises(rsm.IllegalReplicaStateTransition, match="NonExistentReplica to OnlineReplica"):
        rsm.handle_state_changes(_ctx(), [PartitionReplica(TP, 1)], R.ONLINE, ControllerActions())


def test_offline_partition_is_reelected_from_isr() -> None:
    ctx = _ctx()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 3, (1, 2), controller_epoch=4, partition_epoch=8))
    ctx.put_partition_state(TP, PartitionState.OFFLINE)
    ctx.remove_live_brokers([1])
    actions = ControllerActions()
    results = psm.trigger_online_partition_state_change(ctx, actions)
    assert results[TP] == LeaderAndIsr(2, 4, (2,), controller_epoch=5, partition_epoch=9,
                                         leader_broker_epoch=102)
    assert actions.writes[0].expected_partition_epoch == 8
    assert ctx.partition_state(TP) is PartitionState.ONLINE and ctx.offline_partition_count == 0
    assert set(actions.batch.leader_and_isr) == {2, 3}  # Live replicas are told.


def test_election_fails_when_a_newer_controller_wrote_the_state() -> None:
    ctx = _ctx()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 3, (1, 2), controller_epoch=6))
    ctx.put_partition_state(TP, PartitionState.OFFLINE)
    actions = ControllerActions()
    assert psm.trigger_online_partition_state_change(ctx, actions) == {TP: None}
    assert "newer than ours" in actions.failed[TP] and not actions.writes


def test_unclean_election_counted() -> None:
    ctx = _ctx({3: 103})
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 3, (1,)))
    ctx.put_partition_state(TP, PartitionState.OFFLINE)
    actions = ControllerActions()
    assert psm.trigger_online_partition_state_change(ctx, actions)[TP] is None
    results = psm.trigger_online_partition_state_change(ctx, actions, psm.OfflineElection(allow_unclean=True))
    elected = results[TP]
    assert elected is not None and elected.leader == 3 and elected.isr == (3,) and actions.unclean_elections == 1


def test_offline_replica_leaves_isr_and_leadership_but_last_isr_member_stays() -> None:
    ctx = _ctx()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 3, (1, 2), partition_epoch=4))
    for r in (1, 2, 3):
        ctx.put_replica_state(PartitionReplica(TP, r), ReplicaState.ONLINE)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 1)], ReplicaState.OFFLINE, actions)
    assert ctx.partition_leadership_info[TP] == LeaderAndIsr(NO_LEADER, 4, (2,), controller_epoch=5, partition_epoch=5)
    assert actions.batch.stop_replica == {1: {TP: False}} and set(actions.batch.leader_and_isr) == {2, 3}
    rsm.handle_state_changes(ctx, [PartitionReplica(TP, 2)], ReplicaState.OFFLINE, actions)
    assert ctx.partition_leadership_info[TP].isr == (2,)


def test_replica_deletion_path() -> None:
    ctx = _ctx()
    replica = PartitionReplica(TP, 3)
    ctx.put_replica_state(replica, ReplicaState.OFFLINE)
    actions = ControllerActions()
    rsm.handle_state_changes(ctx, [replica], ReplicaState.DELETION_STARTED, actions)
    assert actions.batch.stop_replica == {3: {TP: True}}
    rsm.handle_state_changes(ctx, [replica], ReplicaState.DELETION_SUCCESSFUL, actions)
    rsm.handle_state_changes(ctx, [replica], ReplicaState.NON_EXISTENT, actions)
    assert ctx.partition_replica_assignment(TP) == (1, 2) and replica not in ctx.replica_states


def test_batch_later_leader_and_isr_supersedes_plain_stop_and_discard() -> None:
    ctx = _ctx()
    ctx.put_partition_leadership_info(TP, LeaderAndIsr(1, 0, (1, 2, 3)))
    actions = ControllerActions()
    actions.batch.add_stop_replica([2], TP, delete_partition=False)
    actions.batch.add_leader_and_isr(ctx, [2], TP, ctx.partition_leadership_info[TP])
    built = actions.batch.build(ctx, 1)
    assert not any(isinstance(r, StopReplicaRequest) for r in built[2])
    actions.batch.discard_partitions([TP])
    assert not any(isinstance(r, LeaderAndIsrRequest) for rs in actions.batch.build(ctx, 1).values() for r in rs)


def test_topic_change_and_partition_modifications() -> None:
    ctx = ControllerContext(live_broker_epochs={1: 1, 2: 2}, epoch=1)
    actions = ControllerActions()
    new, deleted = process_topic_change(ctx, {"x": {0: (1, 2)}}, actions)
    assert (new, deleted) == ({"x"}, set())
    assert ctx.partition_state(TopicPartition("x", 0)) is PartitionState.ONLINE
    added = process_partition_modifications(ctx, "x", {0: (1, 2), 1: (2, 1)}, actions)
    assert added == [TopicPartition("x", 1)] and ctx.partition_leadership_info[added[0]].leader == 2
    assert process_topic_change(ctx, {}, actions) == (set(), {"x"}) and not ctx.all_partitions()
