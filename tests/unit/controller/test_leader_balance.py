"""Controlled shutdown, ElectLeaders (preferred / unclean) and the auto leader rebalance, as pure decisions."""

from __future__ import annotations

import pytest

from gregor.common import errors
from gregor.controller.leader_balance import (ElectionType, check_and_trigger_auto_leader_rebalance,
                                              do_controlled_shutdown, partitions_still_led,
                                              process_replica_leader_election)
from gregor.controller.membership import on_broker_failure, on_broker_startup, on_controller_failover
from gregor.controller.requests import ControllerActions, LeaderAndIsrRequest, StopReplicaRequest
from gregor.controller.state import (NO_LEADER, ControllerContext, LeaderAndIsr, PartitionReplica, PartitionState,
                                     ReplicaState, TopicPartition)

LIVE = {1: 101, 2: 102, 3: 103}


def cluster(states: dict[TopicPartition, tuple[tuple[int, ...], LeaderAndIsr]],
            live: dict[int, int] | None = None) -> ControllerContext:
    """A failed-over context: assignments and leadership as given, states initialized."""
    ctx = ControllerContext(live_broker_epochs=dict(LIVE if live is None else live), epoch=3)
    for tp, (replicas, lai) in states.items():
        ctx.all_topics.add(tp.topic)
        ctx.update_partition_replica_assignment(tp, replicas)
        ctx.put_partition_leadership_info(tp, lai)
    on_controller_failover(ctx, ControllerActions())
    return ctx


def tp(n: int, topic: str = "t") -> TopicPartition:
    return TopicPartition(topic, n)


def requests_for(actions: ControllerActions, ctx: ControllerContext, broker: int) -> list[object]:
    return actions.batch.build(ctx, controller_id=0).get(broker, [])


# -- controlled shutdown -----------------------------------------------------------


def test_controlled_shutdown_moves_leadership_to_first_live_isr_replica_and_leaves_followed_isrs() -> None:
    ctx = cluster({
        tp(0): ((1, 2, 3), LeaderAndIsr(1, 4, (1, 2, 3), 3, 7)),  # led by 1
        tp(1): ((2, 1, 3), LeaderAndIsr(2, 2, (2, 1, 3), 3, 2)),  # followed by 1
        tp(2): ((1,), LeaderAndIsr(1, 0, (1,), 3, 0)),  # not replicated: left alone
    })
    actions = ControllerActions()
    remaining = do_controlled_shutdown(ctx, 1, 101, actions)
    assert remaining == set()
    assert ctx.shutting_down_broker_ids == {1} and 1 not in ctx.live_broker_ids
    assert ctx.partition_leadership_info[tp(0)] == LeaderAndIsr(2, 5, (2, 3), 3, 8, leader_broker_epoch=102)
    assert ctx.partition_leadership_info[tp(1)] == LeaderAndIsr(2, 3, (2, 3), 3, 3, leader_broker_epoch=102)
    assert ctx.partition_leadership_info[tp(2)].leader == 1
    assert [(w.topic_partition, w.expected_partition_epoch) for w in actions.writes] == [(tp(0), 7), (tp(1), 2)]
    # The old leader becomes a follower of the partition it led (Kafka's LeaderAndIsr to the live or
    # shutting-down replicas); the partition it followed stops on it.
    to_1 = requests_for(actions, ctx, 1)
    lair_1 = next(r for r in to_1 if isinstance(r, LeaderAndIsrRequest))
    assert [(p.topic_partition, p.leader_and_isr.leader) for p in lair_1.partition_states] == [(tp(0), 2)]
    stop = next(r for r in to_1 if isinstance(r, StopReplicaRequest))
    assert stop.partitions == ((tp(1), False),)
    assert ctx.replica_state(PartitionReplica(tp(1), 1)) is ReplicaState.OFFLINE
    lair_2 = next(r for r in requests_for(actions, ctx, 2) if isinstance(r, LeaderAndIsrRequest))
    assert {p.topic_partition for p in lair_2.partition_states} == {tp(0), tp(1)}


def test_controlled_shutdown_skips_shutting_down_brokers_and_reports_what_cannot_move() -> None:
    ctx = cluster({
        tp(0): ((1, 2, 3), LeaderAndIsr(1, 0, (1, 2, 3), 3, 0)),
        tp(1): ((1, 3), LeaderAndIsr(1, 0, (1,), 3, 0)),  # 3 is out of the ISR: cannot take over
    })
    ctx.shutting_down_broker_ids.add(2)
    actions = ControllerActions()
    remaining = do_controlled_shutdown(ctx, 1, 101, actions)
    assert ctx.partition_leadership_info[tp(0)].leader == 3  # 2 is shutting down too
    assert remaining == {tp(1)} and "ControlledShutdownElection" in actions.failed[tp(1)]
    # Asking again is harmless and gives the same answer.
    assert do_controlled_shutdown(ctx, 1, 101, ControllerActions()) == {tp(1)}


def test_controlled_shutdown_does_not_report_partitions_no_other_live_broker_hosts() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(1, 0, (1,), 3, 0))}, live={1: 101})
    assert do_controlled_shutdown(ctx, 1, 101, ControllerActions()) == set()
    assert partitions_still_led(ctx, 1) == set()


def test_controlled_shutdown_rejects_stale_epochs_and_unknown_brokers() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(1, 0, (1, 2), 3, 0))})
    with pytest.raises(errors.GregorError) as stale:
        do_controlled_shutdown(ctx, 1, 100, ControllerActions())
    assert stale.value.code == errors.Code.STALE_BROKER_EPOCH and not ctx.shutting_down_broker_ids
    with pytest.raises(errors.GregorError) as unknown:
        do_controlled_shutdown(ctx, 9, -1, ControllerActions())
    assert unknown.value.code == errors.Code.BROKER_NOT_AVAILABLE
    assert do_controlled_shutdown(ctx, 1, -1, ControllerActions()) == set()  # -1: epoch not checked


def test_shut_down_broker_deregisters_then_returns_and_is_live_again() -> None:
    ctx = cluster({tp(0): ((1, 2, 3), LeaderAndIsr(1, 0, (1, 2, 3), 3, 0))})
    do_controlled_shutdown(ctx, 1, 101, ControllerActions())
    ctx.remove_live_brokers([1])
    on_broker_failure(ctx, [1], ControllerActions())
    assert not ctx.shutting_down_broker_ids
    ctx.add_live_brokers({1: 201})
    on_broker_startup(ctx, [1], ControllerActions())
    assert 1 in ctx.live_broker_ids and ctx.partition_leadership_info[tp(0)].leader == 2


# -- ElectLeaders --------------------------------------------------------------------


def test_preferred_election_results_per_partition() -> None:
    ctx = cluster({
        tp(0): ((1, 2, 3), LeaderAndIsr(2, 5, (1, 2, 3), 3, 9)),  # preferred 1 in ISR: elected
        tp(1): ((1, 2, 3), LeaderAndIsr(1, 0, (1, 2, 3), 3, 0)),  # already preferred
        tp(2): ((1, 2, 3), LeaderAndIsr(2, 1, (2, 3), 3, 1)),  # preferred out of the ISR
        tp(0, "doomed"): ((2, 1), LeaderAndIsr(1, 0, (1, 2), 3, 0)),
    })
    ctx.topics_to_be_deleted.add("doomed")
    actions = ControllerActions()
    out = process_replica_leader_election(
        ctx, [tp(0), tp(1), tp(2), tp(7), tp(0, "doomed")], ElectionType.PREFERRED, actions)
    assert out[tp(0)].error is None and out[tp(0)].leader == 1
    assert ctx.partition_leadership_info[tp(0)] == LeaderAndIsr(1, 6, (1, 2, 3), 3, 10, leader_broker_epoch=101)
    codes = {p: o.error.code for p, o in out.items() if o.error is not None}
    assert codes == {tp(1): errors.Code.ELECTION_NOT_NEEDED, tp(2): errors.Code.PREFERRED_LEADER_NOT_AVAILABLE,
                     tp(7): errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
                     tp(0, "doomed"): errors.Code.INVALID_TOPIC_EXCEPTION}
    assert out[tp(2)].leader == 2 and [w.topic_partition for w in actions.writes] == [tp(0)]


def test_preferred_election_over_all_partitions_leaves_out_those_not_needing_one() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(2, 0, (1, 2), 3, 0)),
                   tp(1): ((1, 2), LeaderAndIsr(1, 0, (1, 2), 3, 0))})
    out = process_replica_leader_election(ctx, None, ElectionType.PREFERRED, ControllerActions())
    assert list(out) == [tp(0)] and out[tp(0)].leader == 1


def test_preferred_election_refuses_a_dead_or_shutting_down_preferred_replica() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(2, 0, (1, 2), 3, 0))})
    ctx.shutting_down_broker_ids.add(1)
    out = process_replica_leader_election(ctx, [tp(0)], ElectionType.PREFERRED, ControllerActions())
    assert out[tp(0)].error is not None and out[tp(0)].error.code == errors.Code.PREFERRED_LEADER_NOT_AVAILABLE


def test_unclean_election_elects_a_live_out_of_sync_replica_only_for_leaderless_partitions() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(1, 3, (1,), 3, 4)),
                   tp(1): ((2, 3), LeaderAndIsr(2, 0, (2, 3), 3, 0))}, live={1: 101, 2: 102, 3: 103})
    ctx.remove_live_brokers([1])
    on_broker_failure(ctx, [1], ControllerActions())
    assert ctx.partition_leadership_info[tp(0)].leader == NO_LEADER
    assert ctx.partition_state(tp(0)) is PartitionState.OFFLINE and ctx.offline_partition_count == 1
    actions = ControllerActions()
    out = process_replica_leader_election(ctx, [tp(0), tp(1)], ElectionType.UNCLEAN, actions)
    assert out[tp(0)].error is None and out[tp(0)].leader == 2 and actions.unclean_elections == 1
    assert ctx.partition_leadership_info[tp(0)].isr == (2,) and ctx.offline_partition_count == 0
    assert out[tp(1)].error is not None and out[tp(1)].error.code == errors.Code.ELECTION_NOT_NEEDED


def test_unclean_election_without_live_replicas_fails() -> None:
    ctx = cluster({tp(0): ((1, 2), LeaderAndIsr(1, 3, (1,), 3, 4))}, live={1: 101})
    ctx.remove_live_brokers([1])
    on_broker_failure(ctx, [1], ControllerActions())
    out = process_replica_leader_election(ctx, [tp(0)], ElectionType.UNCLEAN, ControllerActions())
    assert out[tp(0)].error is not None and out[tp(0)].error.code == errors.Code.ELIGIBLE_LEADERS_NOT_AVAILABLE


# -- auto leader rebalance ---------------------------------------------------------------


def test_auto_rebalance_moves_leadership_back_for_brokers_over_the_threshold() -> None:
    # Broker 1 is preferred for 4 partitions and leads 3: imbalance 25% > 10%.
    states = {tp(i): ((1, 2, 3), LeaderAndIsr(1, 0, (1, 2, 3), 3, 0)) for i in range(3)}
    states[tp(3)] = ((1, 2, 3), LeaderAndIsr(2, 1, (1, 2, 3), 3, 1))
    # Broker 2 is preferred for 1 partition whose preferred replica is out of the ISR: skipped.
    states[tp(4)] = ((2, 3), LeaderAndIsr(3, 1, (3,), 3, 1))
    ctx = cluster(states)
    actions = ControllerActions()
    out = check_and_trigger_auto_leader_rebalance(ctx, actions, imbalance_percentage=10)
    assert set(out) == {tp(3)} and out[tp(3)].leader == 1
    assert ctx.partition_leadership_info[tp(3)].leader == 1
    assert ctx.partition_leadership_info[tp(4)].leader == 3


def test_auto_rebalance_respects_the_threshold_and_skips_deleted_and_shutting_down() -> None:
    states = {tp(i): ((1, 2), LeaderAndIsr(1, 0, (1, 2), 3, 0)) for i in range(9)}
    states[tp(9)] = ((1, 2), LeaderAndIsr(2, 1, (1, 2), 3, 1))  # 1 of 10 not led: exactly 10%
    ctx = cluster(states)
    assert check_and_trigger_auto_leader_rebalance(ctx, ControllerActions(), 10) == {}
    assert set(check_and_trigger_auto_leader_rebalance(cluster(states), ControllerActions(), 5)) == {tp(9)}
    ctx = cluster(states)
    ctx.shutting_down_broker_ids.add(1)
    assert check_and_trigger_auto_leader_rebalance(ctx, ControllerActions(), 5) == {}
    ctx = cluster({tp(0, "doomed"): ((1, 2), LeaderAndIsr(2, 1, (1, 2), 3, 1))})
    ctx.topics_to_be_deleted.add("doomed")
    assert check_and_trigger_auto_leader_rebalance(ctx, ControllerActions(), 0) == {}
