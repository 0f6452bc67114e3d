"""A broker applying a LeaderAndIsr for thousands of partitions keeps serving and keeps its etcd session (issue 24).

etcd, one controller that creates a topic in one event (`--new-partitions-per-event` above the
topic's size, so each broker gets the whole creation as ONE LeaderAndIsr), and two brokers whose
registration lease is 2 s (`broker.session.timeout.ms=2000`). A topic of PARTITIONS partitions at
RF 2 is created. While it is being created, a probe asks each broker about the topic's first and
last partitions (gRPC ListOffsets, answered on the broker's event loop) over and over.

What must hold:
- each broker answered the probe WHILE it was applying that one LeaderAndIsr: one answer says a
  partition is hosted and a later answer says another one is not yet (partitions are only added
  during the creation, so between those two answers the broker held part of the request). A broker
  that applies the request in one go on its loop answers nothing in between;
- neither broker lost its registration: its broker epoch in etcd (the key's creation revision) is
  the one it had before the creation, and its log says nothing about a lost registration. Laying
  out thousands of logs takes many times the 2 s lease; a keepalive that waited for the loop lost it;
- at the end every partition takes a write (acks=all, so the follower replicated it too).
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gregor.broker.log_manager import PARTITION_METADATA, read_partition_metadata
from gregor.cli.local_cluster import LocalCluster, Process, start_broker, start_etcd, stop_process
from gregor.common import errors
from gregor.common.etcd import EtcdClient
from gregor.common.etcd_layout import BrokerIdsZNode
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch
from tests.helpers.cluster import start_controller_with, tear_down
from tests.helpers.wait import until

PARTITIONS = 1000  # at RF 2 on two brokers: every broker hosts all of them, one LeaderAndIsr each
# Eight partitions spread over the topic: the controller's order of a LeaderAndIsr's partitions is not the
# topic's, so two probed partitions could fall into the same 100-partition chunk and flip together.
PROBED = tuple(range(0, PARTITIONS, PARTITIONS // 8))
TOPIC = "wide"
LEASE_MS = 2000  # the brokers' registration lease: a fraction of the time laying out the logs takes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(str(tmp_path_factory.mktemp("leader-and-isr-apply")))
    try:
        etcd = start_etcd(c.data_dir)
        c.processes.append(etcd)
        # The controller's own lease at the default (10 s): this test is about the brokers' sessions.
        c.processes.append(start_controller_with(c.data_dir, 0, etcd.grpc, "--new-partitions-per-event",
                                                 str(PARTITIONS + 1), lease_ttl_ms=10000))
        for b in range(2):
            c.processes.append(start_broker(c.data_dir, b, overrides={"broker.session.timeout.ms": str(LEASE_MS)},
                                            etcd_endpoint=etcd.grpc))
        c.save()
        yield c
    finally:
        # The data is thrown away: no controlled shutdown of 2,000 replicas (half a minute on a loaded machine).
        for broker in c.by_role("broker"):
            stop_process(broker, signal.SIGKILL)
        tear_down(c)


async def broker_epochs(etcd: EtcdClient, brokers: list[Process]) -> dict[int, int]:
    out = {}
    for b in brokers:
        kv = await etcd.get(BrokerIdsZNode.key(etcd, b.id))
        out[b.id] = kv.create_revision if kv is not None else -1
    return out


class Probe:
    """ListOffsets for the topic's first and last partitions, alternately, until stopped; keeps (partition,
    hosted) per answer in the order answered."""

    def __init__(self, broker: Process) -> None:
        self.broker = broker
        self.answers: list[tuple[int, bool]] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with channel(self.broker.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            while not self.stop.is_set():
                # One round asks every probed partition at once: the broker answers them between the same two
                # chunks of its apply, so a round taken mid-apply has some hosted and some not.
                hosted = await asyncio.gather(*(self.hosted(stub, partition) for partition in PROBED))
                self.answers.extend(zip(PROBED, hosted))
                await asyncio.sleep(0)  # sample as often as the broker answers: a fast apply is still seen mid-way

    @staticmethod
    async def hosted(stub: broker_pb2_grpc.BrokerServiceStub, partition: int) -> bool:
        try:
            await stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic=TOPIC, partition=partition, timestamp_ms=-1),
                                   timeout=60)
            return True
        except grpc.aio.AioRpcError as exc:
            return errors.from_rpc_error(exc).code != errors.Code.UNKNOWN_TOPIC_OR_PARTITION

    def saw_partial_apply(self) -> bool:
        """A round whose answers say some probed partitions are hosted and others not yet."""
        n = len(PROBED)
        return any(len({h for _, h in self.answers[k:k + n]}) == 2 for k in range(0, len(self.answers), n))


async def write_every_partition(brokers: list[Process]) -> None:
    """One record to every partition through its leader (acks=all), again for any not yet written."""
    left = set(range(PARTITIONS))

    async def attempt() -> bool:
        async with channel(brokers[0].grpc) as ch:
            md = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=[TOPIC]),
                                                                     timeout=30)
        leaders = {p.partition: p.leader for p in md.topics[0].partitions}
        for b in brokers:
            mine = sorted(p for p in left if leaders.get(p) == b.id)
            if not mine:
                continue
            async with channel(b.grpc) as ch:
                resp = await broker_pb2_grpc.BrokerServiceStub(ch).ProducePartitions(
                    broker_pb2.ProducePartitionsRequest(acks=-1, timeout_ms=30000, partitions=[
                        broker_pb2.ProducePartitionData(topic=TOPIC, partition=p, records=make_batch([b"x"]))
                        for p in mine]), timeout=60)
            for p, r in zip(mine, resp.results):
                if not r.HasField("error") or not r.error.code:
                    left.discard(p)
        return not left

    await until(attempt, 120, f"a write to every partition ({len(left)} left)", interval_s=0.5)


async def test_a_broker_applying_a_huge_leader_and_isr_keeps_serving_and_its_session(cluster: LocalCluster) -> None:
    ctl = cluster.by_role("controller")[0]
    brokers = cluster.by_role("broker")
    async with EtcdClient(cluster.to_json()["etcd"], cluster="gregor") as etcd:
        async def both_registered() -> bool:
            async with channel(ctl.grpc) as ch:
                resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                    controller_pb2.DescribeClusterRequest(), timeout=5)
            return len(resp.brokers) == 2

        await until(both_registered, 30, "the controller sees both brokers")
        before = await broker_epochs(etcd, brokers)

        probes = [Probe(b) for b in brokers]
        probing = [asyncio.create_task(p.run()) for p in probes]
        started = time.monotonic()
        async with channel(ctl.grpc) as ch:
            resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
                topics=[controller_pb2.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=2)]),
                timeout=300)
        assert resp.results[0].error.code == 0, resp

        async def all_hosted() -> bool:
            return all(len(p.answers) >= len(PROBED) and all(h for _, h in p.answers[-len(PROBED):])
                       for p in probes)

        await until(all_hosted, 240, "both brokers host the first and last partitions")
        for p in probes:
            p.stop.set()
        await asyncio.gather(*probing)
        applied_s = time.monotonic() - started

        after = await broker_epochs(etcd, brokers)
        logs = {b.id: Path(b.log).read_text(errors="replace") for b in brokers}
        lost = {b: [line for line in text.splitlines() if "lost its registration" in line] for b, text in logs.items()}
        failures = [f"broker {p.broker.id} answered nothing while it applied the LeaderAndIsr ({len(p.answers)} "
                    f"answers: {p.answers[:4]} ... {p.answers[-4:]})" for p in probes if not p.saw_partial_apply()]
        if after != before or any(lost.values()):
            failures.append(f"a broker lost its registration while applying the creation ({applied_s:.0f} s): "
                            f"broker epochs before {before}, after {after}; {lost}")
        assert not failures, "\n".join(failures)

        await write_every_partition(brokers)
        print(f"creation applied on both brokers in {applied_s:.1f} s, every partition written "
              f"{time.monotonic() - started - applied_s:.1f} s later; probe answers {[len(p.answers) for p in probes]}")

        # partition.metadata is written off the loop, after the apply: every replica's file comes, with the id.
        async with channel(brokers[0].grpc) as ch:
            md = await broker_pb2_grpc.BrokerServiceStub(ch).Metadata(broker_pb2.MetadataRequest(topics=[TOPIC]),
                                                                     timeout=30)
        topic_id = md.topics[0].topic_id
        assert topic_id

        def ids_on_disk() -> bool:
            found = [read_partition_metadata(path) for b in brokers for path in glob.glob(os.path.join(b.data_dir, f"{TOPIC}-*"))
                     if os.path.exists(os.path.join(path, PARTITION_METADATA))]
            return len(found) == 2 * PARTITIONS and set(found) == {topic_id}

        await until(ids_on_disk, 120, "every replica's partition.metadata written with the topic id")
