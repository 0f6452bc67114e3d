"""A broker applying a LeaderAndIsr for thousands of partitions keeps serving and keeps its etcd session (issue 24).

etcd, one controller that creates a topic in one event (`--new-partitions-per-event` above the
topic's size, so each broker gets the whole creation as ONE LeaderAndIsr), and two brokers whose
registration lease is 2 s (`broker.session.timeout.ms=2000`). A topic of PARTITIONS partitions at
RF 2 is created. While it is being created, a probe asks each broker about eight of the topic's
partitions (gRPC ListOffsets, answered on the broker's event loop) over and over.

What must hold:
- each broker kept answering the probe WHILE it was applying that one LeaderAndIsr: between the broker's
  "Handling LeaderAndIsr request for 1000 partitions" and "Finished LeaderAndIsr request" lines (Kafka's
  two lines, wall-clock stamped by the broker's log) no stretch longer than MAX_SILENCE_S went without a
  probe answer. A broker that applies the request in one go on its loop answers nothing in that window.
  (Earlier forms asked for a call sent and answered inside the window, or a round half hosted: an apply of
  0.3-0.45 s on a quiet machine left no room for either, and they failed with the broker serving.);
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
from datetime import datetime
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
# The longest the probe may go unanswered during the apply: a broker silent for its session timeout looks dead
# to a client with that timeout. A broker applying the whole request in one go on its loop is silent for all
# of it (3-11 s in loaded CI runs); an apply shorter than this bound proves nothing either way and passes.
MAX_SILENCE_S = LEASE_MS / 1000


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
    """ListOffsets for each of the PROBED partitions, concurrently and over and over until stopped; keeps
    (partition, hosted, sent, answered) per answer, timed by the wall clock the broker's log is stamped with."""

    def __init__(self, broker: Process) -> None:
        self.broker = broker
        self.answers: list[tuple[int, bool, float, float]] = []
        self.stop = asyncio.Event()

    async def run(self) -> None:
        async with channel(self.broker.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)

            async def keep_asking(partition: int) -> None:
                # Each partition asks again as soon as it is answered: a call answered mid-apply is followed by
                # one sent mid-apply (rounds waiting for their slowest answer straddled the whole apply).
                while not self.stop.is_set():
                    self.answers.append(await self.ask(stub, partition))

            await asyncio.gather(*(keep_asking(partition) for partition in PROBED))

    @staticmethod
    async def ask(stub: broker_pb2_grpc.BrokerServiceStub, partition: int) -> tuple[int, bool, float, float]:
        sent = time.time()
        try:
            await stub.ListOffsets(broker_pb2.ListOffsetsRequest(topic=TOPIC, partition=partition, timestamp_ms=-1),
                                   timeout=60)
            hosted = True
        except grpc.aio.AioRpcError as exc:
            hosted = errors.from_rpc_error(exc).code != errors.Code.UNKNOWN_TOPIC_OR_PARTITION
        return partition, hosted, sent, time.time()

    def hosted_now(self) -> bool:
        last = {a[0]: a[1] for a in self.answers}
        return len(last) == len(PROBED) and all(last.values())


def apply_window(log_text: str) -> tuple[float, float] | None:
    """Wall-clock start and end of the broker's LeaderAndIsr for the whole topic, from its log's lines."""
    began = None
    for line in log_text.splitlines():
        stamp = line[:23]
        if began is None and f"Handling LeaderAndIsr request for {PARTITIONS} partitions" in line:
            began = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        elif began is not None and f"Finished LeaderAndIsr request in" in line and f"for {PARTITIONS} partitions" in line:
            return began, datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


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

        async def applied() -> bool:
            # The probed partitions can all be hosted before the last chunk: the Finished line is waited for too.
            return all(p.hosted_now() and apply_window(Path(p.broker.log).read_text(errors="replace")) is not None
                       for p in probes)

        await until(applied, 240, "both brokers host the probed partitions and logged the end of their apply")
        for p in probes:
            p.stop.set()
        await asyncio.gather(*probing)
        applied_s = time.monotonic() - started

        after = await broker_epochs(etcd, brokers)
        logs = {b.id: Path(b.log).read_text(errors="replace") for b in brokers}
        lost = {b: [line for line in text.splitlines() if "lost its registration" in line] for b, text in logs.items()}
        failures = []
        for p in probes:
            window = apply_window(logs[p.broker.id])
            if window is None:
                failures.append(f"broker {p.broker.id} logged no Handling/Finished LeaderAndIsr for {PARTITIONS} "
                                f"partitions")
                continue
            answered = sorted(a[3] for a in p.answers if window[0] <= a[3] <= window[1])
            silence = max(b - a for a, b in zip([window[0], *answered], [*answered, window[1]]))
            print(f"broker {p.broker.id}: apply {window[1] - window[0]:.2f} s, {len(answered)} of {len(p.answers)} "
                  f"probe answers within it, longest silence {silence:.2f} s")
            if silence > MAX_SILENCE_S:
                failures.append(f"broker {p.broker.id} answered nothing for {silence:.2f} s while it applied the "
                                f"LeaderAndIsr ({window[1] - window[0]:.2f} s; {len(answered)} of {len(p.answers)} "
                                f"answers within it)")
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
