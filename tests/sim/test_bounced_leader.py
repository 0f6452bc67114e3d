"""A leader that restarts while the controller fails over gets a new leader epoch, not its old one.

Found by `make sim`: the leader crashes and loses an unflushed, uncommitted tail,
registers again (a new broker epoch) while the controller fails over. The new
controller only reads the current registration, so before the fix it told the
restarted broker to lead again at the *same* leader epoch; the followers holding
the lost tail under that epoch had no reason to truncate it, and the logs
diverged (an acknowledged record at an offset where a follower kept another).
Kafka closes this with the leader's broker epoch in the partition state
(KIP-903/966): the partition state now records the registration each leader
epoch was given to, and a controller that finds the leader registered under
another one handles it as processBrokerChange handles a bounced broker.
"""

from __future__ import annotations

from gregor.controller import partition_state_machine as psm
from gregor.controller import replica_state_machine as rsm
from gregor.controller.membership import bounced_leaders, on_controller_failover, process_broker_change
from gregor.controller.requests import ControllerActions, LeaderAndIsrRequest
from gregor.controller.state import (
    UNKNOWN_BROKER_EPOCH,
    ControllerContext,
    LeaderAndIsr,
    PartitionReplica,
    ReplicaState,
)
from tests.sim.cluster import Simulation, SimConfig
from tests.sim.test_controller_failover_isr import TP, controller_context
from tests.sim.test_replication_sim import run_schedule

BOUNCE_DURING_FAILOVER = [(77, "restart_torn", 1, 0), (77, "controller_failover", 0, 0)]


def _running(lai: LeaderAndIsr, live: dict[int, int]) -> ControllerContext:
    """An active controller's context with the replica and partition states of the given brokers."""
    ctx = controller_context(lai, live)
    rsm.initialize_replica_states(ctx)
    psm.initialize_partition_states(ctx)
    return ctx


def test_sim_leader_bounced_during_controller_failover_leads_no_more_at_its_epoch() -> None:
    """The schedule make sim found (seed=0, 3 brokers, min.insync.replicas=1, no random drops)."""
    cfg = SimConfig(n_brokers=3, min_insync_replicas=1, drop_probability=0.0,
                    control_drop_probability=0.0, control_duplicate_probability=0.0)
    sim = Simulation(0, cfg)
    # Precondition of the scenario: broker 2 leads at epoch 0 when it is bounced.
    sim.run(76)
    state = sim.store.state
    assert state is not None and (state.leader, state.leader_epoch) == (2, 0), state
    assert state.leader_broker_epoch == sim.brokers[2].broker_epoch
    sim = Simulation(0, cfg)
    # Raises InvariantViolation (no_acked_record_lost / eventually_consistent) without the fix.
    run_schedule(sim, BOUNCE_DURING_FAILOVER)
    final = sim.store.state
    assert final is not None and final.leader_epoch > 0, final
    assert sim.leader_by_epoch[0] == 2 and all(b.log == sim.brokers[final.leader].log for b in sim.brokers.values())


def test_failover_elects_again_when_the_leader_registered_anew() -> None:
    # Leader 2 was elected at broker epoch 20 and is registered at 25 now.
    ctx = controller_context(LeaderAndIsr(2, 4, (2, 1, 3), controller_epoch=6, partition_epoch=9, leader_broker_epoch=20),
                   {1: 10, 2: 25, 3: 30})
    actions = ControllerActions()
    assert on_controller_failover(ctx, actions) == {2}
    lai = ctx.partition_leadership_info[TP]
    # Out of the ISR and leadership (OfflineReplica), a clean election among the others.
    assert lai.leader == 1 and lai.leader_epoch > 4 and 2 not in lai.isr
    assert lai.leader_broker_epoch == 10 and ctx.live_broker_epochs == {1: 10, 2: 25, 3: 30}
    assert ctx.replica_state(PartitionReplica(TP, 2)) is ReplicaState.ONLINE
    built = actions.batch.build(ctx, 0)
    to_2 = [r for r in built[2] if isinstance(r, LeaderAndIsrRequest)]
    # The restarted broker is addressed at its new registration and follows at the new epoch.
    assert to_2 and to_2[-1].broker_epoch == 25
    assert to_2[-1].partition_states[0].leader_and_isr.leader_epoch == lai.leader_epoch


def test_failover_with_the_bounced_leader_as_only_isr_member_bumps_its_epoch() -> None:
    ctx = controller_context(LeaderAndIsr(2, 4, (2,), controller_epoch=6, partition_epoch=9, leader_broker_epoch=20),
                   {1: 10, 2: 25, 3: 30})
    actions = ControllerActions()
    on_controller_failover(ctx, actions)
    lai = ctx.partition_leadership_info[TP]
    # The last ISR member is the only clean candidate: it leads again, under a new leader epoch.
    assert (lai.leader, lai.isr, lai.leader_broker_epoch) == (2, (2,), 25) and lai.leader_epoch >= 5
    assert [w.new_state.leader for w in actions.writes] == [-1, 2]


def test_unknown_or_matching_leader_broker_epoch_is_no_bounce() -> None:
    for recorded in (UNKNOWN_BROKER_EPOCH, 20):  # a state from before the field; the same registration
        ctx = controller_context(LeaderAndIsr(2, 4, (2, 1, 3), 6, 9, leader_broker_epoch=recorded), {1: 10, 2: 20, 3: 30})
        actions = ControllerActions()
        assert on_controller_failover(ctx, actions) == set()
        assert actions.writes == [] and ctx.partition_leadership_info[TP].leader_epoch == 4


def test_broker_change_catches_a_leader_recorded_under_another_registration() -> None:
    # An older controller elected 2 at broker epoch 20 though 2 had registered at 25 (it missed the bounce).
    ctx = _running(LeaderAndIsr(2, 4, (2, 1, 3), 7, 9, leader_broker_epoch=20), {1: 10, 2: 25, 3: 30})
    assert bounced_leaders(ctx, ctx.live_broker_epochs) == {2}
    actions = ControllerActions()
    changes = process_broker_change(ctx, {1: 10, 2: 25, 3: 30}, actions)
    assert changes.bounced == (2,)
    lai = ctx.partition_leadership_info[TP]
    assert lai.leader == 1 and lai.leader_epoch > 4


def test_elections_record_the_leaders_registration_and_isr_changes_keep_it() -> None:
    ctx = _running(LeaderAndIsr(1, 4, (1, 2, 3), 6, 9, leader_broker_epoch=10), {1: 10, 2: 20, 3: 30})
    actions = ControllerActions()
    process_broker_change(ctx, {2: 20, 3: 30}, actions)  # broker 1 is gone: 2 leads
    assert [(w.new_state.leader, w.new_state.leader_broker_epoch) for w in actions.writes] == [(2, 20)]
    assert ctx.partition_leadership_info[TP].with_isr((2,)).leader_broker_epoch == 20
    # A write re-run after a lost compare (a leader's ISR change meanwhile) stamps its new epoch too.
    write = actions.writes[0]
    assert write.recompute is not None
    current = LeaderAndIsr(1, 4, (1, 2), 6, 10, leader_broker_epoch=10)
    rerun, stored = write.rerun(current, 7)
    assert rerun is not None and stored is not None and (stored.leader, stored.leader_broker_epoch) == (2, 20)
