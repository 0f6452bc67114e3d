"""min.insync.replicas against a real ISR shrink (seeds 000, 003): etcd, a controller, three brokers.

RF 3, min.insync.replicas 2. Both followers are SIGSTOPped: the leader's
isr-expiration drops them within replica.lag.time.max.ms (+ one expiration
period). An acks=all request parked in DelayedProduce while that happens is
answered NOT_ENOUGH_REPLICAS_AFTER_APPEND (its batch is in the log, but the ISR
that has it is below the minimum); later acks=all requests are refused at once
with NOT_ENOUGH_REPLICAS (the ErrorDetail carries the code), acks=1 still
succeeds. SIGCONT: the followers catch up, rejoin, and acks=all succeeds again.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, Process
from gregor.client import Producer
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch
from tests.helpers.cluster import tear_down
from tests.integration.test_cluster_control import broker, metadata, partitions
from tests.helpers.wait import until

REPLICA_LAG_TIME_MAX_MS = 2000
# Stopped followers keep their registration (no controller-driven shrink) for the whole test.
BROKER_SESSION_TIMEOUT_MS = 20000
SHRINK_WITHIN_S = REPLICA_LAG_TIME_MAX_MS / 1000 * 1.5 + 2  # lag + one isr-expiration period + slack
TOPIC = "min-isr"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("minisr")), brokers=3, controllers=1, lease_ttl_ms=2000,
                        broker_overrides={"replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS),
                                          "broker.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS)})
    try:
        yield c
    finally:
        tear_down(c)


def gauge(p: Process, name: str) -> float:
    with urllib.request.urlopen(p.metrics, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def produce(p: Process, value: bytes, acks: int, timeout_ms: int = 10000) -> broker_pb2.ProduceResponse:
    async with channel(p.grpc) as ch:
        return await broker_pb2_grpc.BrokerServiceStub(ch).Produce(broker_pb2.ProduceRequest(
            topic=TOPIC, partition=0, records=make_batch([value]), acks=acks, timeout_ms=timeout_ms),
            timeout=timeout_ms / 1000 + 5)


async def produce_error(p: Process, value: bytes, acks: int, timeout_ms: int = 10000) -> errors.GregorError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await produce(p, value, acks, timeout_ms)
    return errors.from_rpc_error(info.value)


async def test_acks_all_refused_below_min_isr_and_accepted_after_rejoin(cluster: LocalCluster) -> None:
    brokers = cluster.by_role("broker")
    async with channel(brokers[0].grpc) as ch:
        resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=TOPIC, num_partitions=1, replication_factor=3,
                                                  configs={"min.insync.replicas": "2"})]), timeout=30)
    assert resp.results[0].error.code == 0, resp

    async def ready() -> bool:
        v = partitions(await metadata(brokers[0], TOPIC))
        return bool(v) and v[0][0] >= 0 and len(v[0][3]) == 3
    await until(ready, 20, "a leader with a full ISR")
    leader_id = partitions(await metadata(brokers[0], TOPIC))[0][0]
    leader = broker(cluster, leader_id)
    followers = [b for b in brokers if b.id != leader_id]
    assert (await produce(leader, b"before", -1)).base_offset == 0

    stopped_at = time.monotonic()
    for f in followers:
        os.kill(f.pid, signal.SIGSTOP)
    try:
        # Parked in DelayedProduce: the stopped followers never fetch it. When the leader
        # shrinks the ISR to itself the HW passes the batch, but the ISR is below the minimum.
        err = await produce_error(leader, b"parked", -1, timeout_ms=15000)
        shrunk_after = time.monotonic() - stopped_at
        assert err.code == errors.Code.NOT_ENOUGH_REPLICAS_AFTER_APPEND, err
        assert err.topic == TOPIC and err.partition == 0
        assert shrunk_after <= SHRINK_WITHIN_S + 1, shrunk_after
        assert gauge(leader, "gregor_broker_under_min_isr_partitions") == 1.0

        # Now refused before the append, with the code in the ErrorDetail.
        err = await produce_error(leader, b"refused", -1)
        assert err.code == errors.Code.NOT_ENOUGH_REPLICAS and err.retriable, err
        assert "min.insync.replicas 2" in str(err)
        # The SDK producer reports the typed error (retries=0 so it does not wait it out).
        async with Producer({"bootstrap.servers": leader.grpc, "acks": "all", "retries": 0}) as p:
            with pytest.raises(errors.GregorError) as info:
                await (await p.send(TOPIC, b"sdk-refused", partition=0))
            assert info.value.code == errors.Code.NOT_ENOUGH_REPLICAS
        # acks=1 does not look at the ISR.
        r = await produce(leader, b"acks-1", 1)
        assert r.base_offset == 2  # "parked" took offset 1; nothing refused was appended
    finally:
        for f in followers:
            os.kill(f.pid, signal.SIGCONT)

    resumed = time.monotonic()

    async def accepted() -> bool:
        try:
            await produce(leader, b"after", -1, timeout_ms=5000)
            return True
        except grpc.aio.AioRpcError as exc:
            code = errors.from_rpc_error(exc).code
            assert code in (errors.Code.NOT_ENOUGH_REPLICAS, errors.Code.REQUEST_TIMED_OUT), code
            return False
    await until(accepted, 20, "acks=all accepted once a follower rejoined")
    rejoin_s = time.monotonic() - resumed

    async def full() -> bool:
        return gauge(leader, "gregor_broker_under_replicated_partitions") == 0.0
    await until(full, 20, "both followers back in the ISR")
    assert gauge(leader, "gregor_broker_under_min_isr_partitions") == 0.0
    print(f"\nISR shrink below min.insync.replicas after SIGSTOP: {shrunk_after:.2f} s; "
          f"acks=all accepted {rejoin_s:.2f} s after SIGCONT")
    # The ISR change reaches every broker's metadata through the controller too.

    async def propagated() -> bool:
        views = [partitions(await metadata(b, TOPIC)) for b in brokers]
        return all(len(v[0][3]) == 3 for v in views)
    await until(propagated, 20, "every broker's metadata shows the full ISR")
