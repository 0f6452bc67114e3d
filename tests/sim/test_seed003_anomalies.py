"""Seed 003's two HW-only anomalies, scripted in the simulator: they happen with HW truncation, not with leader epochs."""

from __future__ import annotations

import pytest

from tests.sim.cluster import InvariantViolation, SimConfig, Simulation


def _cluster(truncation: str, invariants: frozenset[str] | None = None) -> Simulation:
    cfg = SimConfig(
        n_brokers=3, drop_probability=0.0, produce_probability=0.0, stale_metadata_probability=0.0,
        truncation=truncation, invariants=invariants,
    )
    return Simulation(seed=3, cfg=cfg)


def _lose_hw_update_then_fail_leader(sim: Simulation) -> tuple[int, int]:
    """Leader L acks two records; follower F has them but never hears HW=2; G dies; then L dies.

    Returns (L, F). F becomes the new leader once L's lease expires.
    """
    sim.run_until(lambda s: s.store.state is not None and len(s.brokers[s.store.state.leader].heard_from) == 2)
    assert sim.store.state is not None
    leader = sim.store.state.leader
    follower, other = [b for b in sim.assignment if b != leader][:2]
    sim.produce()
    sim.produce()
    sim.run_until(lambda s: s.brokers[leader].hw == 2)
    sim.cut(leader, follower)  # The fetch response that would carry HW=2 to F is lost.
    assert sim.brokers[follower].leo == 2 and sim.brokers[follower].hw < 2, "scenario precondition (seed=3)"
    assert sorted(sim.acked) == [0, 1]
    sim.kill(other)
    epoch_before = sim.brokers[follower].leader_epoch
    sim.run_until(lambda s: s.brokers[follower].leader_epoch > epoch_before)  # ISR shrink bumps the epoch.
    sim.kill(leader)
    return leader, follower


def test_hw_truncation_loses_acknowledged_records() -> None:
    sim = _cluster("hw")
    with pytest.raises(InvariantViolation, match="no_acked_record_lost"):
        _, follower = _lose_hw_update_then_fail_leader(sim)
        sim.run_until(lambda s: s.brokers[follower].role == "leader", max_steps=200)
        sim.step()


def test_leader_epoch_truncation_keeps_acknowledged_records() -> None:
    sim = _cluster("epoch")
    _, follower = _lose_hw_update_then_fail_leader(sim)
    sim.run_until(lambda s: s.brokers[follower].role == "leader", max_steps=200)
    sim.run(20)
    assert [v for _, v in sim.brokers[follower].log[:2]] == [sim.acked[0], sim.acked[1]]


def _diverge(sim: Simulation) -> None:
    leader, follower = _lose_hw_update_then_fail_leader(sim)
    sim.run_until(lambda s: s.brokers[follower].role == "leader", max_steps=200)
    sim.run_until(lambda s: (s.produce(), s.brokers[follower].leo >= 2)[1], max_steps=50)
    sim.heal()
    sim.restart(leader)
    sim.run_until(lambda s: leader in s.store.state.isr and s.brokers[leader].hw >= 2, max_steps=400)
    sim.run(10)


def test_hw_truncation_lets_replicas_diverge_below_hw() -> None:
    sim = _cluster("hw", invariants=frozenset({"replicas_agree_below_hw"}))
    with pytest.raises(InvariantViolation, match="replicas_agree_below_hw"):
        _diverge(sim)


def test_leader_epoch_truncation_keeps_replicas_identical() -> None:
    sim = _cluster("epoch")
    _diverge(sim)
    logs = {b.id: b.log[: b.hw] for b in sim.brokers.values() if b.alive}
    shortest = min(len(v) for v in logs.values())
    assert len({tuple(v[:shortest]) for v in logs.values()}) == 1
