"""ControllerState names and values, LeaderAndIsr helpers, ControllerContext queries."""

from __future__ import annotations

from gregor.controller.state import (
    ControllerContext,
    ControllerState,
    LeaderAndIsr,
    PartitionReplica,
    PartitionState,
    TopicPartition,
)


def test_controller_state_values_and_metric_names_follow_kafka() -> None:
    assert [s.value for s in ControllerState] == list(range(18))
    assert ControllerState.TOPIC_CHANGE.kafka_name == "TopicChange"
    assert ControllerState.TOPIC_CHANGE.rate_and_time_metric_name == "TopicChangeRateAndTimeMs"
    assert ControllerState.ISR_CHANGE.rate_and_time_metric_name == "IsrChangeRateAndTimeMs"
    assert ControllerState.BROKER_CHANGE.rate_and_time_metric_name == "LeaderElectionRateAndTimeMs"
    assert ControllerState.ALTER_PARTITION_REASSIGNMENT.rate_and_time_metric_name == "PartitionReassignmentRateAndTimeMs"
    assert ControllerState.IDLE.rate_and_time_metric_name is None
    assert ControllerState.UPDATE_METADATA_RESPONSE_RECEIVED.rate_and_time_metric_name is None
    assert ControllerState.UPDATE_FEATURES.value == 17


def test_leader_and_isr_helpers() -> None:
    lai = LeaderAndIsr(1, 4, [1, 2, 3], controller_epoch=2, partition_epoch=9)  # type: ignore[arg-type]
    assert lai.isr == (1, 2, 3)  # Lists are frozen into tuples.
    assert lai.new_leader_and_isr(2, [2, 3]) == LeaderAndIsr(2, 5, (2, 3), 2, 9)
    assert lai.new_leader(3) == LeaderAndIsr(3, 5, (1, 2, 3), 2, 9)
    assert lai.new_epoch() == LeaderAndIsr(1, 5, (1, 2, 3), 2, 9)
    assert lai.with_isr([1]).leader_epoch == 4
    assert not LeaderAndIsr(-1).has_leader and lai.has_leader


def _ctx() -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs={1: 10, 2: 11, 3: 12})
    ctx.all_topics.update({"a", "b"})
    ctx.update_partition_replica_assignment(TopicPartition("a", 0), (1, 2))
    ctx.update_partition_replica_assignment(TopicPartition("a", 1), (2, 3))
    ctx.update_partition_replica_assignment(TopicPartition("b", 0), (3, 1))
    return ctx


def test_queries_over_assignments() -> None:
    ctx = _ctx()
    assert ctx.partitions_on_broker(1) == {TopicPartition("a", 0), TopicPartition("b", 0)}
    assert ctx.partitions_for_topic("a") == {TopicPartition("a", 0), TopicPartition("a", 1)}
    assert ctx.replicas_on_brokers([3]) == {
        PartitionReplica(TopicPartition("a", 1), 3), PartitionReplica(TopicPartition("b", 0), 3)
    }
    assert ctx.partition_replica_assignment(TopicPartition("zz", 0)) == ()


def test_replica_online_respects_shutting_down_and_offline_dirs() -> None:
    ctx = _ctx()
    tp = TopicPartition("a", 0)
    assert ctx.is_replica_online(1, tp)
    ctx.shutting_down_broker_ids.add(1)
    assert not ctx.is_replica_online(1, tp)
    assert ctx.is_replica_online(1, tp, include_shutting_down=True)
    assert ctx.live_broker_ids == {2, 3} and ctx.live_or_shutting_down_broker_ids == {1, 2, 3}
    ctx.replicas_on_offline_dirs[2] = {tp}
    assert not ctx.is_replica_online(2, tp) and ctx.is_replica_online(2, TopicPartition("a", 1))
    assert not ctx.is_replica_online(9, tp)


def test_offline_partition_count_follows_transitions() -> None:
    ctx = _ctx()
    tp = TopicPartition("a", 0)
    ctx.put_partition_state(tp, PartitionState.NEW)
    ctx.put_partition_state(tp, PartitionState.OFFLINE)
    ctx.put_partition_state(tp, PartitionState.OFFLINE)
    assert ctx.offline_partition_count == 1
    ctx.put_partition_state(tp, PartitionState.ONLINE)
    assert ctx.offline_partition_count == 0
    ctx.topics_with_deletion_started.add("a")
    ctx.put_partition_state(tp, PartitionState.OFFLINE)
    assert ctx.offline_partition_count == 0  # Topics being deleted do not count.


def test_offline_leader_and_remove_topic() -> None:
    ctx = _ctx()
    ctx.put_partition_leadership_info(TopicPartition("a", 0), LeaderAndIsr(1, 0, (1, 2)))
    ctx.put_partition_leadership_info(TopicPartition("b", 0), LeaderAndIsr(3, 0, (3, 1)))
    ctx.remove_live_brokers([3])
    assert ctx.partitions_with_offline_leader() == {TopicPartition("b", 0)}
    ctx.put_partition_state(TopicPartition("b", 0), PartitionState.OFFLINE)
    ctx.remove_topic("b")
    assert ctx.offline_partition_count == 0 and "b" not in ctx.all_topics
    assert ctx.partitions_with_leaders() == {TopicPartition("a", 0)}
