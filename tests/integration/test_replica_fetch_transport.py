"""Followers fetch over the leader's data port (replica.fetch.transport=data, the default) or over the gRPC
ReplicaFetch stream (=grpc), with real processes: either way acks=all completes and the replicas match; the
leader counts the fetches under the transport they came by (gregor_requests_total{service="DataPort" or
"BrokerService", api="ReplicaFetch"}). A replica frame that is not a ReplicaFetchRequest, or one the leader
refuses as a whole, gets a response with its error and the connection is closed, while consumers' fetches on
the same port go on being served."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2
from tests.helpers.cluster import broker_metric_total, tear_down
from tests.helpers.wait import until

DATA = 'gregor_requests_total{api="ReplicaFetch",code="NONE",service="DataPort"}'
GRPC = 'gregor_requests_total{api="ReplicaFetch",code="NONE",service="BrokerService"}'


def _cluster(tmp: str, transport: str | None) -> LocalCluster:
    overrides = {"replica.fetch.transport": transport} if transport else None
    return LocalCluster.up(tmp, brokers=2, controllers=1, lease_ttl_ms=2000, broker_overrides=overrides)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = _cluster(str(tmp_path_factory.mktemp("replica-data")), None)
    try:
        yield c
    finally:
        tear_down(c)


async def produce_and_read_back(cluster: LocalCluster, topic: str) -> None:
    """An RF 2 topic with min.insync.replicas=2: every acks=all send needs the follower's fetch; then both
    replicas are read back through a consumer once the ISR is full."""
    config = {"bootstrap.servers": cluster.bootstrap}
    async with AdminClient(config) as admin:
        await admin.create_topic(topic, 2, 2, {"min.insync.replicas": "2"})

        async def full_isr() -> bool:
            try:
                described = await admin.describe_topics([topic])
            except errors.GregorError as err:  # the brokers' metadata has yet to name it
                if err.code != errors.Code.UNKNOWN_TOPIC_OR_PARTITION:
                    raise
                return False
            return all(len(p.isr) == 2 for p in described[topic].partitions)
        await until(full_isr, 30, "both replicas in sync")
    async with Producer({**config, "acks": "all"}) as producer:
        for i in range(40):
            await (await producer.send(topic, b"v%d" % i, partition=i % 2))
    async with Consumer({**config, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([(topic, 0), (topic, 1)])
        got: list[bytes] = []
        for _ in range(100):
            got += [r.value for r in await consumer.poll(timeout_ms=200) if r.value is not None]
            if len(got) >= 40:
                break
    assert sorted(got) == sorted(b"v%d" % i for i in range(40))


async def test_followers_fetch_over_the_data_port_by_default(cluster: LocalCluster) -> None:
    before = broker_metric_total(cluster, DATA)
    await produce_and_read_back(cluster, "over-data")
    assert broker_metric_total(cluster, DATA) > before + 20  # at least one follower fetch per acks=all send
    assert broker_metric_total(cluster, GRPC) == 0


async def test_followers_fetch_over_grpc_with_the_grpc_transport(tmp_path_factory: pytest.TempPathFactory) -> None:
    c = _cluster(str(tmp_path_factory.mktemp("replica-grpc")), "grpc")
    try:
        await produce_and_read_back(c, "over-grpc")
        assert broker_metric_total(c, GRPC) > 20
        assert broker_metric_total(c, DATA) == 0
    finally:
        tear_down(c)


def _exchange(address: str, frame: bytes) -> tuple[broker_pb2.ReplicaFetchResponse, bool]:
    """Send one raw frame to a data port; the response frame, and whether the leader closed the connection."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(frame)
        f = s.makefile("rb")
        (size,) = struct.unpack(">I", f.read(4))
        resp = broker_pb2.ReplicaFetchResponse.FromString(f.read(size))
        return resp, f.read(1) == b""


def _replica_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body) | 0x8000_0000) + body


@pytest.mark.parametrize("body, why", [
    (b"\xff" * 12, "not a ReplicaFetchRequest"),
    (broker_pb2.ReplicaFetchRequest(replica_id=-1, max_wait_ms=0).SerializeToString(), "invalid replica fetch"),
], ids=["garbage", "replica_id=-1"])
async def test_a_bad_replica_frame_gets_its_error_and_the_connection_closes(cluster: LocalCluster, body: bytes,
                                                                           why: str) -> None:
    data = cluster.by_role("broker")[0].data
    resp, closed = _exchange(data, _replica_frame(body))
    assert resp.error.code == errors.Code.INVALID_REQUEST and why in resp.error.message, resp
    assert closed and not resp.partitions
    # The port still serves consumers (and followers, whose fetches go on: the ISR stays full).
    async with Consumer({"bootstrap.servers": cluster.bootstrap, "fetch.transport": "data",
                         "auto.offset.reset": "earliest"}) as consumer:
        await produce_and_read_back(cluster, f"after-bad-frame-{len(body)}")
        consumer.assign([(f"after-bad-frame-{len(body)}", 0)])
        records = []
        for _ in range(50):
            records += await consumer.poll(timeout_ms=200)
            if len(records) >= 20:
                break
        assert len(records) == 20


def test_an_oversized_replica_frame_is_refused_without_reading_it(cluster: LocalCluster) -> None:
    """No follower sends a frame that large: it is garbage, answered as any malformed frame (a
    DataFetchResponseHeader with INVALID_REQUEST, tests/integration/test_bad_input.py) and the connection closed."""
    host, port = cluster.by_role("broker")[0].data.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">I", 0x8000_0000 | 0x7FFF_FFFF))
        f = s.makefile("rb")
        (size,) = struct.unpack(">I", f.read(4))
        header = broker_pb2.DataFetchResponseHeader.FromString(f.read(size))
        assert header.error.code == errors.Code.INVALID_REQUEST and "replica fetch" in header.error.message
        assert f.read(1) == b""
