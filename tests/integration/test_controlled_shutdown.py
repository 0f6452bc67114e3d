"""Controlled shutdown against a crash, with real processes: etcd, one controller, three brokers, RF 3.

Broker 0 leads partitions 0 and 1 of a topic with min.insync.replicas=2 while two
producer tasks (acks=all, one record at a time per partition) keep writing to them.

1. SIGTERM broker 0 (controlled.shutdown.enable defaults to true): the controller
   moves both leaderships to other ISR members before the process exits; no record
   fails, every acknowledged record is in the new leaders' logs, and the longest
   stall of a producer (the unavailability window) is short.
2. Broker 0 is restarted, rejoins the ISRs and is made leader again with
   `gregor leader-election --election-type preferred --all-topic-partitions`; then it
   is SIGKILLed: the partitions wait for its registration lease to expire
   (broker.session.timeout.ms) before the controller elects new leaders.

The test prints both windows and checks the controlled one is far below the crash one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, start_broker, stop_process
from gregor.client.producer import Producer
from gregor.common.etcd import EtcdClient
from gregor.common.rpc import channel
from gregor.controller import metadata_store
from gregor.controller.state import TopicPartition
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import record_values
from tests.helpers.cluster import with_controller_flags
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

TOPIC = "payments"
SESSION_TIMEOUT_MS = 6000  # broker.session.timeout.ms: how long a crashed broker goes unnoticed
ASSIGNMENT = {0: [0, 1, 2], 1: [0, 2, 1], 2: [1, 2, 0]}  # broker 0 is the preferred leader of 0 and 1
LED_BY_0 = (0, 1)


def broker_overrides() -> dict[str, str]:
    return {"broker.session.timeout.ms": str(SESSION_TIMEOUT_MS)}


@pytest.fixture()
def cluster(tmp_path: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with with_controller_flags(str(tmp_path), 3, broker_overrides(), "--auto-leader-rebalance-enable", "false") as c:
        yield c


def node(c: LocalCluster, broker_id: int) -> Process:
    return [p for p in c.by_role("broker") if p.id == broker_id][-1]


async def create_topic(c: LocalCluster) -> None:
    async with channel(node(c, 1).grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(
                name=TOPIC, num_partitions=-1, replication_factor=-1, configs={"min.insync.replicas": "2"},
                assignments={p: controller_pb2.ReplicaList(broker_ids=r) for p, r in ASSIGNMENT.items()})]),
            timeout=30)
    assert resp.results[0].error.code == 0, resp


async def stored_state(c: LocalCluster, partition: int, topic: str = TOPIC) -> dict[str, object]:
    """The partition state the controller and leaders write to etcd."""
    async with EtcdClient(f"http://{c.by_role('etcd')[0].grpc}", cluster="gregor") as client:
        kv = await client.get(metadata_store.partition_state_key(client, TopicPartition(topic, partition)))
    assert kv is not None
    return dict(json.loads(kv.value))


async def in_sync_and_led_by(c: LocalCluster, leaders: dict[int, int]) -> bool:
    for partition, leader in leaders.items():
        state = await stored_state(c, partition)
        if state["leader"] != leader or sorted(state["isr"]) != [0, 1, 2]:  # type: ignore[call-overload]
            return False
    view = partitions(await metadata(node(c, 2), TOPIC))
    return all(view.get(p, (-1,))[0] == leader for p, leader in leaders.items())


@dataclass
class Load:
    """acks=all producers, one record in flight per partition: ack times show how long a partition stalled."""

    acked: dict[int, list[tuple[float, bytes]]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, bootstrap: str, partitions_: tuple[int, ...]) -> None:
        async with Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                             "retry.backoff.ms": 50, "delivery.timeout.ms": 60000,
                             "request.timeout.ms": 20000}) as producer:
            await asyncio.gather(*(self._one(producer, p) for p in partitions_))

    async def _one(self, producer: Producer, partition: int) -> None:
        seq = 0
        acked = self.acked.setdefault(partition, [])
        while not self.stop.is_set():
            value = f"{partition}-{seq}".encode()
            seq += 1
            try:
                await producer.send_and_wait(TOPIC, value, partition=partition)
            except Exception as exc:  # any failed record is a test failure, reported at the end
                self.failed.append(f"{value!r}: {exc}")
                continue
            acked.append((time.monotonic(), value))
            await asyncio.sleep(0.005)

    def window(self, since: float) -> float:
        """The longest time any partition went without an acknowledgement after `since` (seconds)."""
        return max(self.windows(since).values())

    def windows(self, since: float) -> dict[int, tuple[float, float]]:
        """Per partition: (longest gap between acknowledgements after `since`, when that gap began)."""
        out = {}
        for p, acks in self.acked.items():
            times = [since] + [t for t, _ in acks if t >= since]
            out[p] = max(((b - a, a - since) for a, b in zip(times, times[1:])), default=(0.0, 0.0))
        return out


async def log_values(p: Process, partition: int) -> set[bytes]:
    out: set[bytes] = set()
    offset = 0
    async with channel(p.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        while True:
            resp = await stub.Fetch(broker_pb2.FetchRequest(topic=TOPIC, partition=partition, fetch_offset=offset,
                                                            max_bytes=1 << 22, min_bytes=0, max_wait_ms=0), timeout=10)
            values = record_values(resp.records)
            if not values:
                return out
            out.update(values)
            offset += len(values)
            if offset >= resp.high_watermark:
                return out


async def leader_of(c: LocalCluster, partition: int) -> int:
    return int((await stored_state(c, partition))["leader"])  # type: ignore[call-overload]


async def measure(c: LocalCluster, victim: Process, sig: int) -> tuple[float, float, float]:
    """Signal the victim under load; (unavailability window, s until both leaderships moved, s until it exited)."""
    load = Load()
    bootstrap = ",".join(p.grpc for p in c.by_role("broker") if p.alive())
    producing = asyncio.ensure_future(load.run(bootstrap, LED_BY_0))
    await until(lambda: _true(all(len(load.acked.get(p, [])) >= 20 for p in LED_BY_0)), 30, "producers running")
    start = time.monotonic()
    os.kill(victim.pid, sig)
    moved_at = exited_at = None
    while moved_at is None or exited_at is None:
        now = time.monotonic() - start
        assert now < 30, "leadership did not move or the broker did not exit within 30 s"
        if exited_at is None and not victim.alive():
            exited_at = now
        if moved_at is None and all([await leader_of(c, p) not in (0, -1) for p in LED_BY_0]):
            moved_at = time.monotonic() - start  # after the reads: no earlier than it was seen
        await asyncio.sleep(0.01)
    await asyncio.sleep(2.0)
    load.stop.set()
    await asyncio.wait_for(producing, 60)
    assert not load.failed, load.failed[:5]
    # Every acknowledged record is on the new leaders (duplicates from retries allowed).
    for p in LED_BY_0:
        leader = node(c, await leader_of(c, p))
        missing = {v for _, v in load.acked[p]} - await log_values(leader, p)
        assert not missing, f"partition {p}: {len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"
    print(f"\n{signal.Signals(sig).name}: per partition (stall s, began s after the signal): {load.windows(start)}")
    return max(w for w, _ in load.windows(start).values()), moved_at, exited_at


async def _true(value: bool) -> bool:
    return value


def controller_metrics(c: LocalCluster) -> dict[str, float]:
    with urllib.request.urlopen(c.by_role("controller")[0].metrics, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in lines if line and not line.startswith("#"))}


def leader_election_cli(c: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gregor.cli.main", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "GREGOR_BOOTSTRAP": node(c, 1).grpc})


async def test_controlled_shutdown_moves_leadership_first_and_beats_a_crash(cluster: LocalCluster) -> None:
    await create_topic(cluster)
    await until(lambda: in_sync_and_led_by(cluster, {0: 0, 1: 0}), 30, "broker 0 leads 0 and 1 with full ISRs")

    term_window, term_moved, term_exited = await measure(cluster, node(cluster, 0), signal.SIGTERM)
    assert term_moved < term_exited, (term_moved, term_exited)
    log = open(node(cluster, 0).log).read()
    assert "controlled shutdown succeeded" in log
    metrics = controller_metrics(cluster)
    assert metrics['gregor_controller_state_rate_and_time_seconds_count{state="ControlledShutdown"}'] >= 1
    assert metrics['gregor_controller_controlled_shutdowns_total{result="done"}'] >= 1

    # Back again: rejoin the ISRs, then the preferred election hands leadership back to broker 0.
    cluster.processes.append(start_broker(cluster.data_dir, 0, overrides=broker_overrides(),
                                          etcd_endpoint=cluster.by_role("etcd")[0].grpc))
    cluster.save()

    async def rejoined() -> bool:
        # The controller learns ISR changes from the leaders' notifications; UpdateMetadata shows it has.
        view = partitions(await metadata(node(cluster, 2), TOPIC))
        return all(sorted(view.get(p, (0, 0, (), ()))[3]) == [0, 1, 2] for p in LED_BY_0)

    await until(rejoined, 60, "restarted broker 0 back in the ISRs (as the controller knows them)")
    out = leader_election_cli(cluster, "leader-election", "--election-type", "preferred", "--all-topic-partitions")
    assert out.returncode == 0, out.stderr
    assert "Successfully completed leader election (PREFERRED) for partitions payments-0, payments-1" in out.stdout
    await until(lambda: in_sync_and_led_by(cluster, {0: 0, 1: 0}), 30, "broker 0 leads again")

    kill_window, kill_moved, _ = await measure(cluster, node(cluster, 0), signal.SIGKILL)
    print(f"\nunavailability window (longest producer stall, acks=all): controlled shutdown "
          f"{term_window * 1000:.0f} ms (leadership moved {term_moved * 1000:.0f} ms after SIGTERM, process exited "
          f"{term_exited * 1000:.0f} ms after); SIGKILL {kill_window * 1000:.0f} ms "
          f"(leadership moved {kill_moved * 1000:.0f} ms after), broker.session.timeout.ms={SESSION_TIMEOUT_MS}")
    assert term_window * 2 < kill_window, (term_window, kill_window)
    stop_process(node(cluster, 0), signal.SIGKILL)
