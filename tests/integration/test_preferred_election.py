"""Preferred-replica election with real processes: `gregor leader-election` and auto.leader.rebalance.enable.

etcd, one controller checking the leader imbalance every second
(`--leader-imbalance-check-interval-seconds 1`), three brokers; a topic of three
partitions with replication factor 3 whose preferred leaders are brokers 0, 1, 2.

- `gregor leader-election` answers like kafka-leader-election.sh: "Valid replica
  already elected" for a balanced partition, an error line and exit 1 for an
  unknown partition, per-partition JSON with `--output json`, partitions from
  `--path-to-json-file`, usage errors for bad option combinations.
- Broker 0 is SIGKILLed: partition 0 moves to broker 1, a preferred election for
  it fails with PREFERRED_LEADER_NOT_AVAILABLE; broker 0 restarts, rejoins the
  ISR, and the periodic AutoPreferredReplicaLeaderElection makes it leader again
  (PreferredReplicaImbalanceCount back to 0, the auto-election counter moves).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, stop_process
from gregor.common.rpc import channel
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import with_controller_flags
from tests.helpers.wait import until
from tests.integration.test_controlled_shutdown import controller_metrics, stored_state

TOPIC = "ledger"
SESSION_TIMEOUT_MS = 2000
ASSIGNMENT = {0: [0, 1, 2], 1: [1, 2, 0], 2: [2, 0, 1]}


def overrides() -> dict[str, str]:
    return {"broker.session.timeout.ms": str(SESSION_TIMEOUT_MS)}


@pytest.fixture()
def cluster(tmp_path: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with with_controller_flags(str(tmp_path), 3, overrides(),
                               "--leader-imbalance-check-interval-seconds", "1") as c:
        yield c


def node(c: LocalCluster, broker_id: int) -> Process:
    return [p for p in c.by_role("broker") if p.id == broker_id][-1]


def cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gregor.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "GREGOR_BOOTSTRAP": node(c, 2).grpc})


async def leaders(c: LocalCluster) -> dict[int, int]:
    return {p: int((await stored_state(c, p, TOPIC))["leader"]) for p in ASSIGNMENT}  # type: ignore[call-overload]


async def test_leader_election_cli_and_auto_rebalance(cluster: LocalCluster) -> None:
    async with channel(node(cluster, 1).grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(name=TOPIC, num_partitions=-1, replication_factor=-1, assignments={
                p: controller_pb2.ReplicaList(broker_ids=r) for p, r in ASSIGNMENT.items()})]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def balanced() -> bool:
        return await leaders(cluster) == {0: 0, 1: 1, 2: 2}

    await until(balanced, 30, "every partition led by its preferred replica")

    # -- the CLI on a balanced cluster ---------------------------------------------------
    out = cli(cluster, "leader-election", "--election-type", "preferred", "--topic", TOPIC, "--partition", "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"Valid replica already elected for partitions {TOPIC}-0"
    out = cli(cluster, "leader-election", "--election-type", "preferred", "--all-topic-partitions")
    assert out.returncode == 0 and out.stdout == "", (out.stdout, out.stderr)  # nothing needed, nothing listed
    out = cli(cluster, "leader-election", "--election-type", "preferred", "--topic", "nope", "--partition", "3")
    assert out.returncode == 1
    assert out.stdout.startswith("Error completing leader election (PREFERRED) for partition: nope-3: "
                                 "UNKNOWN_TOPIC_OR_PARTITION"), out.stdout
    assert "1 replica(s) could not be elected" in out.stderr
    election_file = os.path.join(cluster.data_dir, "election.json")
    with open(election_file, "w") as f:
        json.dump({"partitions": [{"topic": TOPIC, "partition": 1}, {"topic": TOPIC, "partition": 2}]}, f)
    out = cli(cluster, "--output", "json", "leader-election", "--election-type", "unclean",
              "--path-to-json-file", election_file)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"election_type": "UNCLEAN", "succeeded": [], "failed": [], "noop": [
        {"topic": TOPIC, "partition": 1, "leader": 1}, {"topic": TOPIC, "partition": 2, "leader": 2}]}
    with open(election_file, "w") as f:
        json.dump({"partitions": [{"topic": TOPIC, "partition": 1}, {"topic": TOPIC, "partition": 1}]}, f)
    out = cli(cluster, "leader-election", "--election-type", "preferred", "--path-to-json-file", election_file)
    assert out.returncode == 2 and "duplicate partitions: ledger-1" in out.stderr, out.stderr
    out = cli(cluster, "leader-election", "--election-type", "preferred", "--all-topic-partitions", "--topic", TOPIC)
    assert out.returncode == 2 and "One and only one of the following options is required" in out.stderr

    # -- broker 0 dies: partition 0 moves away; its preferred replica is not available ------
    stop_process(node(cluster, 0), signal.SIGKILL)

    async def moved() -> bool:
        return (await leaders(cluster))[0] not in (0, -1)

    await until(moved, 20, "partition 0 led by another broker after broker 0 died")
    out = cli(cluster, "--output", "json", "leader-election", "--election-type", "preferred", "--topic", TOPIC,
              "--partition", "0")
    assert out.returncode == 1
    [failed] = json.loads(out.stdout)["failed"]
    assert (failed["partition"], failed["error"]) == (0, "PREFERRED_LEADER_NOT_AVAILABLE"), failed
    assert controller_metrics(cluster)["gregor_controller_preferred_replica_imbalance"] >= 1

    # -- broker 0 returns: the auto rebalance gives partition 0 back to it -------------------
    cluster.processes.append(start_broker(cluster.data_dir, 0, overrides=overrides(),
                                          etcd_endpoint=cluster.by_role("etcd")[0].grpc))
    cluster.save()
    took = await until(balanced, 60, "auto leader rebalance moved partition 0 back to broker 0")
    metrics = controller_metrics(cluster)
    assert metrics['gregor_controller_preferred_replica_elections_total{trigger="auto"}'] >= 1
    assert metrics["gregor_controller_preferred_replica_imbalance"] == 0
    assert metrics['gregor_controller_state_rate_and_time_seconds_count{state="AutoLeaderBalance"}'] >= 1
    assert metrics['gregor_controller_state_rate_and_time_seconds_count{state="ManualLeaderBalance"}'] >= 4
    print(f"\nleadership back on the preferred replica {took:.1f} s after broker 0 restarted "
          f"(leader.imbalance.check.interval.seconds=1)")
