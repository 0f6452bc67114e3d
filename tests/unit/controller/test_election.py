"""Leader election algorithms, resulting ISRs, and the leader-imbalance check."""

from __future__ import annotations

from gregor.controller.election import (
    ControlledShutdownElection,
    OfflineElection,
    PreferredElection,
    ReassignElection,
    controlled_shutdown_partition_leader_election,
    elect_leader,
    leader_imbalance_ratios,
    offline_partition_leader_election,
    partitions_for_auto_leader_rebalance,
    preferred_replica_partition_leader_election,
    reassign_partition_leader_election,
)
from gregor.controller.state import ControllerContext, LeaderAndIsr, TopicPartition

TP = TopicPartition("t", 0)


def test_offline_election_picks_first_live_isr_replica_in_assignment_order() -> None:
    assert offline_partition_leader_election([3, 1, 2], isr=[1, 2], live_replicas={1, 2, 3}, unclean_enabled=False) == (1, False)
    assert offline_partition_leader_election([3, 1, 2], isr=[1, 2], live_replicas={2, 3}, unclean_enabled=False) == (2, False)


def test_offline_election_unclean_only_when_enabled() -> None:
    assert offline_partition_leader_election([1, 2, 3], isr=[1], live_replicas={3, 2}, unclean_enabled=False) == (None, False)
    assert offline_partition_leader_election([1, 2, 3], isr=[1], live_replicas={3, 2}, unclean_enabled=True) == (2, True)
    assert offline_partition_leader_election([1, 2], isr=[1], live_replicas=set(), unclean_enabled=True) == (None, False)


def test_preferred_reassign_and_controlled_shutdown_algorithms() -> None:
    assert preferred_replica_partition_leader_election([2, 1], [1, 2], {1, 2}) == 2
    assert preferred_replica_partition_leader_election([2, 1], [1], {1, 2}) is None
    assert reassign_partition_leader_election([4, 5], [5, 1], {4, 5}) == 5
    assert controlled_shutdown_partition_leader_election([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}) == 2
    assert controlled_shutdown_partition_leader_election([1, 2], [1, 2], {1, 2}, {1, 2}) is None


def _ctx(live: dict[int, int], assignment: tuple[int, ...], lai: LeaderAndIsr) -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs=dict(live), epoch=3)
    ctx.all_topics.add(TP.topic)
    ctx.update_partition_replica_assignment(TP, assignment)
    ctx.put_partition_leadership_info(TP, lai)
    return ctx


def test_offline_election_result_keeps_online_isr_and_bumps_epoch() -> None:
    ctx = _ctx({2: 1, 3: 1}, (1, 2, 3), LeaderAndIsr(1, 4, (1, 2, 3)))
    result = elect_leader(ctx, TP, ctx.partition_leadership_info[TP], OfflineElection())
    assert result.new_leader_and_isr == LeaderAndIsr(2, 5, (2, 3))
    assert result.live_replicas == (2, 3) and not result.is_unclean


def test_unclean_result_isr_is_the_new_leader_alone() -> None:
    ctx = _ctx({3: 1}, (1, 2, 3), LeaderAndIsr(1, 4, (1,)))
    assert elect_leader(ctx, TP, ctx.partition_leadership_info[TP], OfflineElection()).new_leader_and_isr is None
    result = elect_leader(ctx, TP, ctx.partition_leadership_info[TP], OfflineElection(unclean_topics=frozenset({"t"})))
    assert result.new_leader_and_isr == LeaderAndIsr(3, 5, (3,)) and result.is_unclean


def test_controlled_shutdown_result_drops_shutting_down_brokers_from_isr() -> None:
    ctx = _ctx({1: 1, 2: 1, 3: 1}, (1, 2, 3), LeaderAndIsr(1, 0, (1, 2, 3)))
    ctx.shutting_down_broker_ids.add(1)
    result = elect_leader(ctx, TP, ctx.partition_leadership_info[TP], ControlledShutdownElection())
    assert result.new_leader_and_isr == LeaderAndIsr(2, 1, (2, 3))
    assert result.live_replicas == (1, 2, 3)  # Shutting-down brokers still hear about it.


def test_preferred_and_reassign_keep_isr() -> None:
    ctx = _ctx({1: 1, 2: 1, 3: 1}, (1, 2, 3), LeaderAndIsr(2, 7, (2, 1)))
    preferred = elect_leader(ctx, TP, ctx.partition_leadership_info[TP], PreferredElection())
    assert preferred.new_leader_and_isr == LeaderAndIsr(1, 8, (2, 1))
    reassign = elect_leader(ctx, TP, ctx.partition_leadership_info[TP], ReassignElection({TP: (3, 1)}))
    assert reassign.new_leader_and_isr == LeaderAndIsr(1, 8, (2, 1))


def test_imbalance_ratio_and_auto_rebalance_threshold() -> None:
    ctx = ControllerContext(live_broker_epochs={1: 1, 2: 1})
    ctx.all_topics.add("t")
    for p in range(10):
        tp = TopicPartition("t", p)
        ctx.update_partition_replica_assignment(tp, (1, 2))
        ctx.put_partition_leadership_info(tp, LeaderAndIsr(2 if p == 0 else 1, 0, (1, 2)))
    assert leader_imbalance_ratios(ctx) == {1: 0.1}
    assert partitions_for_auto_leader_rebalance(ctx) == set()  # 10% is not above 10%.
    ctx.put_partition_leadership_info(TopicPartition("t", 1), LeaderAndIsr(2, 0, (2,)))
    assert leader_imbalance_ratios(ctx) == {1: 0.2}
    # Partition 1's preferred replica is out of the ISR, so only partition 0 moves.
    assert partitions_for_auto_leader_rebalance(ctx) == {TopicPartition("t", 0)}
    assert partitions_for_auto_leader_rebalance(ctx, imbalance_percentage=20) == set()
