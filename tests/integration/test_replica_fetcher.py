"""A quiet partition must not pace a busy one that shares its replica fetcher (seed 004), with real processes.

Both partitions of the topic are led by broker A and followed by broker B, so
B fetches them through one ReplicaFetcher. Partition 1 gets no writes: its
follower long poll always runs the full replica.fetch.wait.max.ms (500 ms).
acks=all on partition 0 completes once B's *next* fetch reports the new LEO;
if fetches went in rounds, that next fetch would wait for partition 1's poll
and every acks=all would take ~500 ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch
from tests.helpers.cluster import tear_down
from tests.integration.test_cluster_control import broker, metadata, partitions
from tests.helpers.wait import until

TOPIC = "shared-fetcher"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("fetcher")), brokers=2, controllers=1, lease_ttl_ms=2000)
    try:
        yield c
    finally:
        tear_down(c)


async def test_acks_all_latency_is_not_paced_by_a_quiet_partition(cluster: LocalCluster) -> None:
    a, b = cluster.by_role("broker")
    async with channel(a.grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(
                name=TOPIC, num_partitions=-1, replication_factor=-1, configs={"min.insync.replicas": "2"},
                assignments={p: controller_pb2.ReplicaList(broker_ids=[a.id, b.id]) for p in (0, 1)})]),
            timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def ready() -> bool:
        v = partitions(await metadata(b, TOPIC))
        return len(v) == 2 and all(leader == a.id and len(isr) == 2 for leader, _, _, isr in v.values())
    await until(ready, 20, "A leads both partitions with B in the ISR")
    leader = broker(cluster, a.id)
    latencies = []
    async with channel(leader.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        for i in range(30):
            started = time.monotonic()
            r = await stub.Produce(broker_pb2.ProduceRequest(
                topic=TOPIC, partition=0, records=make_batch([f"v{i}".encode()]), acks=-1, timeout_ms=5000),
                timeout=10)
            latencies.append(time.monotonic() - started)
            assert r.base_offset == i
    median = statistics.median(latencies[5:])
    print(f"\nacks=all (RF 2) median latency beside a quiet partition: {median * 1000:.1f} ms")
    # One fetch round trip on loopback, not the quiet partition's 500 ms poll.
    assert median < 0.25, latencies
