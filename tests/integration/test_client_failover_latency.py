"""How fast the SDK clients follow a new partition leader after a SIGKILL (real processes; seeds 001, 002).

etcd, one controller, three brokers, one partition with replication factor 3.
Two acks=all SDK producers write all the time (one with retries=0 as in
AckedLoad, one with Kafka's default retries) and one SDK consumer reads the
partition. The leader is SIGKILLed; the test polls the survivors' Metadata to
see when the new leader becomes visible and measures, for each client, the
time from then to its first success on the new leader. Kafka's producer asks
for a metadata update as soon as a request fails, retries after
retry.backoff.ms and sends to the leader metadata names, so the wait should be
about retry.backoff.ms (100 ms) plus a round trip, never a fixed 1 s tick.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from gregor.cli.local_cluster import LocalCluster, Process, stop_process
from gregor.client import Consumer
from gregor.common.rpc import channel
from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc
from tests.helpers.cluster import AckedLoad, tear_down
from tests.integration.test_cluster_control import metadata, partitions
from tests.helpers.wait import until

TOPIC = "follow-leader"
# retry.backoff.ms (100) + a metadata round trip + a produce round trip, with room for 2 busy cores.
FOLLOW_WITHIN_S = 0.6


async def create_topic(p: Process) -> None:
    async with channel(p.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=3,
                                                  configs={"min.insync.replicas": "2"})]), timeout=30)
    assert resp.results[0].error.code == 0, resp


async def leader_of(p: Process) -> tuple[int, int, tuple[int, ...]]:
    """(leader, leader epoch, isr) of partition 0 as broker p's metadata says; (-1, -1, ()) if it cannot answer."""
    try:
        leader, epoch, _, isr = partitions(await metadata(p, TOPIC))[0]
    except Exception:
        return -1, -1, ()
    return leader, epoch, isr


@pytest.mark.parametrize("fetch_transport", ["grpc", "data"])
async def test_clients_follow_new_leader_within_retry_backoff(tmp_path: os.PathLike[str], fetch_transport: str) -> None:
    cluster = LocalCluster.up(str(tmp_path), brokers=3, controllers=1, lease_ttl_ms=2000,
                              broker_overrides={"broker.session.timeout.ms": "2000"})
    try:
        brokers = cluster.by_role("broker")
        await create_topic(brokers[0])

        async def full_isr() -> bool:
            views = [await leader_of(b) for b in brokers]
            return all(leader >= 0 and len(isr) == 3 for leader, _, isr in views)
        await until(full_isr, 30, "partition 0 led with a full ISR everywhere")

        no_retries = AckedLoad(cluster.bootstrap, TOPIC, 1, window=6)
        with_retries = AckedLoad(cluster.bootstrap, TOPIC, 1, window=6,
                                 props={"retries": 2147483647, "delivery.timeout.ms": 30000})
        received: dict[bytes, float] = {}
        stop = asyncio.Event()

        async def consume() -> None:
            async with Consumer({"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "latest",
                                 "enable.auto.commit": False, "fetch.transport": fetch_transport}) as c:
                c.assign([(TOPIC, 0)])
                while not stop.is_set():
                    for rec in await c.poll(timeout_ms=100):
                        assert rec.value is not None
                        received.setdefault(rec.value, time.monotonic())
        tasks = [asyncio.create_task(no_retries.run(stop)), asyncio.create_task(with_retries.run(stop)),
                 asyncio.create_task(consume())]

        async def flowing() -> bool:
            for t in tasks:
                if t.done():
                    t.result()
            return (len(no_retries.acked) >= 50 and len(with_retries.acked) >= 50
                    and any(v in received for v in with_retries.acked))
        await until(flowing, 30, "both producers and the consumer flow")

        old_leader, old_epoch, _ = await leader_of(brokers[0])
        victim = next(b for b in brokers if b.id == old_leader)
        survivors = [b for b in brokers if b is not victim]
        t_kill = time.monotonic()
        stop_process(victim, signal.SIGKILL)

        # The moment any survivor's Metadata names the new leader (polled every 10 ms).
        t_visible = 0.0
        while time.monotonic() - t_kill < 20:
            views = await asyncio.gather(*(leader_of(b) for b in survivors))
            if any(leader not in (-1, victim.id) and epoch > old_epoch for leader, epoch, _ in views):
                t_visible = time.monotonic()
                break
            await asyncio.sleep(0.01)
        assert t_visible, "no new leader within 20 s"

        # Answers the victim had already written before it died arrive within moments of the SIGKILL;
        # the election waits out broker.session.timeout.ms, so anything acknowledged later is the new leader's.
        assert t_visible - t_kill > 0.5, t_visible - t_kill
        t_old_answers = t_kill + 0.2

        def first_ack_after(load: AckedLoad) -> float:
            return min((t for t in load.ack_times.get(0, []) if t > t_old_answers), default=float("inf"))

        async def both_acked() -> bool:
            return first_ack_after(no_retries) < float("inf") and first_ack_after(with_retries) < float("inf")
        await until(both_acked, 20, "both producers are acknowledged by the new leader")
        await asyncio.sleep(1.5)
        stop.set()
        await asyncio.gather(*tasks)

        follow = {name: first_ack_after(load) - t_visible
                  for name, load in (("retries=0", no_retries), ("retries=MAX", with_retries))}
        # The consumer: from the new leader being visible to its first record read after the SIGKILL
        # (a retried batch may be a duplicate of one it read before, so match by time, not by value).
        after = [t for t in received.values() if t > t_old_answers]
        assert after, "the consumer reads from the new leader"
        follow["consumer"] = min(after) - t_visible
        print(f"\n[follow new leader, fetch.transport={fetch_transport}] "
              f"visible {t_visible - t_kill:.2f} s after SIGKILL; then "
              + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in follow.items())
              + f"; producer errors {dict(no_retries.errors)} / {dict(with_retries.errors)}")
        for name, wait in follow.items():
            assert wait < FOLLOW_WITHIN_S, (name, follow)
    finally:
        tear_down(cluster)

