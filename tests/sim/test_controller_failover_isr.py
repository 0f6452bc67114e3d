"""Controller failover takes brokers that died while no controller was active out of the ISR.

Found under load (tests/integration/test_failover_under_load.py). Kafka's
ReplicaStateMachine.startup() runs on every controller failover:

    handleStateChanges(onlineReplicas, OnlineReplica)
    handleStateChanges(offlineReplicas, OfflineReplica)   // removes them from the ISR

so a broker that died while no controller was active leaves every ISR as soon as
the new controller starts, and acks=all on partitions it followed resumes at once.
Before the fix `membership.on_controller_failover` only marked those replicas
ReplicaDeletionIneligible: the ISR kept the dead broker until each leader's own
isr-expiration dropped it (replica.lag.time.max.ms + up to half of it), the 4-6 s
acks=all stall measured on the followed partitions.
"""

from __future__ import annotations

from gregor.controller.membership import on_controller_failover
from gregor.controller.requests import ControllerActions, LeaderAndIsrRequest, StopReplicaRequest
from gregor.controller.state import ControllerContext, LeaderAndIsr, PartitionReplica, ReplicaState, TopicPartition
from tests.sim.cluster import Simulation

TP = TopicPartition("t", 0)


def controller_context(lai: LeaderAndIsr, live: dict[int, int]) -> ControllerContext:
    ctx = ControllerContext(live_broker_epochs=live, epoch=7)
    ctx.all_topics.add("t")
    ctx.update_partition_replica_assignment(TP, (1, 2, 3))
    ctx.put_partition_leadership_info(TP, lai)
    return ctx


def test_failover_removes_dead_followers_from_isr() -> None:
    # Leader 2 is alive; follower 1 died while no controller was active.
    ctx = controller_context(LeaderAndIsr(2, 4, (1, 2, 3), controller_epoch=6, partition_epoch=9), {2: 20, 3: 30})
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr, lai.leader_epoch, lai.partition_epoch, lai.controller_epoch) == (2, (2, 3), 5, 10, 7)
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.OFFLINE
    # One guarded write, compared against the partition epoch loaded from etcd.
    assert [(w.expected_partition_epoch, w.new_state.isr) for w in actions.writes] == [(9, (2, 3))]
    built = actions.batch.build(ctx, 0)
    for broker in (2, 3):
        lair = next(r for r in built[broker] if isinstance(r, LeaderAndIsrRequest))
        assert lair.partition_states[0].leader_and_isr.isr == (2, 3)
    # The dead broker gets nothing that matters (no sender), but a StopReplica is queued as in Kafka.
    assert any(isinstance(r, StopReplicaRequest) for r in built.get(1, []))


def test_failover_with_dead_leader_elects_from_the_shrunk_isr() -> None:
    ctx = controller_context(LeaderAndIsr(1, 4, (1, 3), controller_epoch=6, partition_epoch=9), {2: 20, 3: 30})
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    lai = ctx.partition_leadership_info[TP]
    assert (lai.leader, lai.isr) == (3, (3,))
    # OfflineReplica writes leader -1 first, the election then re-bases on that write (as Kafka does).
    assert [w.expected_partition_epoch for w in actions.writes] == [9, 10]
    assert lai.leader_epoch == 6 and lai.partition_epoch == 11


def test_failover_keeps_the_last_isr_member_when_it_is_dead() -> None:
    # The only ISR member died: unclean election off, the partition stays offline with it as the ISR.
    ctx = controller_context(LeaderAndIsr(1, 4, (1,), controller_epoch=6, partition_epoch=9), {2: 20, 3: 30})
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    lai = ctx.partition_leadership_info[TP]
    assert lai.leader == -1 and lai.isr == (1,)
    assert TP in actions.failed


def test_failover_leaves_topics_queued_for_deletion_to_the_deletion() -> None:
    ctx = controller_context(LeaderAndIsr(2, 4, (1, 2, 3), controller_epoch=6, partition_epoch=9), {2: 20, 3: 30})
    ctx.topics_to_be_deleted.add("t")
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    assert actions.writes == []
    assert ctx.replica_state(PartitionReplica(TP, 1)) is ReplicaState.DELETION_INELIGIBLE


def test_sim_broker_dying_between_controllers_leaves_the_isr_at_failover() -> None:
    """End to end in the simulator: no controller is active while follower F dies and its session expires."""
    sim = Simulation(5)
    sim.run_until(lambda s: s.store.state is not None and len(s.store.state.isr) == 3)
    sim.run(20)
    for c in sim.controllers:
        c.active = False
    state = sim.store.state
    assert state is not None
    follower = next(r for r in state.isr if r != state.leader)
    sim.kill(follower)
    sim.run_until(lambda s: follower not in s.store.live_registrations(s.clock.now_ms))
    # No controller ran, and the dead follower's lag has not reached replica.lag.time.max.ms yet.
    if sim.store.state is not None and follower not in sim.store.state.isr:
        raise AssertionError(f"precondition: the leader shrank the ISR already (seed={sim.seed})")
    sim.controller_failover()
    after = sim.store.state
    assert after is not None and follower not in after.isr and after.leader not in (-1, follower), after
