"""The simulation runs the production follower-fetch and controller-write paths, not copies of them.

Counts over a few fixed schedules: followers sent full and incremental session requests through
FollowerFetchState, leaders answered them through ReplicaFetchSession (which left answers without news
empty), and controller writes lost compares and were re-run by perform_partition_state_writes, with every
invariant holding.
"""

from __future__ import annotations

from gregor.broker.fetcher_state import FollowerFetchState
from gregor.broker.replica_fetch_server import ReplicaFetchSession
from tests.sim.cluster import SimConfig, Simulation
from tests.sim.test_replication_sim import run_schedule

SCHEDULE = [(20, "kill", 0, 0), (60, "cut", 1, 2), (90, "restart", 0, 0), (120, "heal", 0, 0),
            (150, "controller_failover", 0, 0), (200, "partition_leader", 1, 0), (240, "heal", 0, 0)]


def test_followers_speak_the_session_protocol_and_controller_writes_are_re_run() -> None:
    totals = {"full": 0, "incremental": 0, "no_news": 0, "retries": 0, "injected": 0}
    for seed in range(6):
        sim = Simulation(seed, SimConfig(controller_write_conflict_probability=0.5))
        run_schedule(sim, SCHEDULE)
        assert any(isinstance(b.fetcher, FollowerFetchState) for b in sim.brokers.values())
        assert all(isinstance(s, ReplicaFetchSession) for b in sim.brokers.values() for s in b.sessions.values())
        for kind in ("full", "incremental", "no_news"):
            totals[kind] += sim.fetches[kind]
        totals["retries"] += sim.write_retries
        totals["injected"] += sim.injected_conflicts
    assert totals["incremental"] > 0 and totals["full"] > 0, totals  # sessions stay open between refreshes
    assert totals["no_news"] > 0, totals  # the leader's session answered only partitions with news
    assert totals["retries"] > 0 and totals["injected"] > 0, totals
