"""The producer gateway authorizes each caller (issue 23): `cluster up --tls --authorizer` with a gateway.

The gateway takes each caller's principal from its client certificate (ssl.principal.mapping.rules) and
checks Write on the topic (and on the TransactionalId of a transactional stream) against its own ACL cache
before producing anything; it produces as itself, a super user. Two client certificates: `billing`, allowed
on the prefix `billing-`, and `intruder`, with no ACL. Real processes: etcd, a controller, a broker, a
coordinator and a gateway, mTLS everywhere.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gregor.cli.local_cluster import LocalCluster, authorizer_properties
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer
from gregor.common import certs, errors, tls
from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from gregor.gateway.client import GatewayClient, record
from gregor.rpc.v1 import gateway_pb2, gateway_pb2_grpc
from tests.helpers.cluster import tear_down
from tests.helpers.wait import until

TOPIC = "billing-invoices"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("gw-acls")), brokers=1, controllers=1, coordinators=1,
                        gateways=1, tls=True, authorizer=authorizer_properties([]))
    assert c.tls is not None
    for name in ("billing", "intruder"):
        certs.issue(Path(c.tls.certs_dir), name)
    try:
        asyncio.run(setup(c))
        yield c
    finally:
        tear_down(c)


async def setup(c: LocalCluster) -> None:
    assert c.tls is not None
    billing = c.tls.principal("billing")
    async with AdminClient(c.client_config()) as admin:  # the CLI's certificate is a super user
        await admin.create_topic(TOPIC, 1, 1)
        await admin.create_acls(
            [AclBinding(billing, "*", ResourceType.TOPIC, "billing-", PatternType.PREFIXED, op, Permission.ALLOW)
             for op in (Operation.WRITE, Operation.DESCRIBE)]
            + [AclBinding(billing, "*", ResourceType.TRANSACTIONAL_ID, "billing-", PatternType.PREFIXED,
                          Operation.WRITE, Permission.ALLOW)])


def security(c: LocalCluster, name: str) -> tls.TlsConfig:
    assert c.tls is not None
    return tls.TlsConfig.from_properties(c.tls.props(name, server=False))


def gateway(c: LocalCluster) -> str:
    return c.by_role("gateway")[0].grpc


def gateway_samples(c: LocalCluster, name: str) -> list[Any]:
    import ssl

    assert c.tls is not None  # /metrics is HTTPS with the gateway's certificate in a --tls cluster
    ctx = ssl.create_default_context(cafile=c.tls.path("ca.crt"))
    with urllib.request.urlopen(c.by_role("gateway")[0].metrics, timeout=10, context=ctx) as resp:
        text = resp.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def write_denials(c: LocalCluster, resource_type: str) -> float:
    return sum(s.value for s in gateway_samples(c, "gregor_authorizer_denials_total")
               if s.labels["resource_type"] == resource_type and s.labels["operation"] == "Write")


async def read_all(c: LocalCluster) -> list[bytes]:
    """Every value of the topic, read as the super user (until two empty polls in a row)."""
    async with Consumer({**c.client_config(), "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"}) as consumer:
        consumer.assign([(TOPIC, 0)])
        got: list[bytes] = []
        empty = 0
        while empty < 3:
            batch = await consumer.poll(timeout_ms=500)
            got += [r.value for r in batch if r.value is not None]
            empty = 0 if batch else empty + 1
        return got


def audits(c: LocalCluster, principal: str) -> list[dict[str, Any]]:
    with open(c.by_role("gateway")[0].log) as f:
        lines = [json.loads(line.split("gregor.audit: ", 1)[1]) for line in f if "gregor.audit: " in line]
    return [a for a in lines if a["principal"] == principal]


async def test_the_gateway_authorizes_each_caller_by_its_certificate(cluster: LocalCluster) -> None:
    assert cluster.tls is not None
    intruder = cluster.tls.principal("intruder")
    denials_before = write_denials(cluster, "Topic")
    async with GatewayClient(gateway(cluster), security=security(cluster, "billing")) as gw:
        results = await gw.produce(TOPIC, [record(b"billing-%d" % i) for i in range(3)], partition=0)
    assert [r.error.code for r in results] == [0, 0, 0]

    async with GatewayClient(gateway(cluster), security=security(cluster, "intruder")) as gw:
        with pytest.raises(errors.GregorError) as info:  # unary Produce: the whole call is refused
            await gw.produce(TOPIC, [record(b"intruder-unary")], partition=0)
        assert info.value.code == errors.Code.TOPIC_AUTHORIZATION_FAILED
        stub = gw.stub()

        async def stream() -> Any:
            for i in range(2):
                yield gateway_pb2.GatewayRecord(topic=TOPIC, record=record(b"intruder-%d" % i), partition=0,
                                                correlation_id=i)

        answers = [r async for r in stub.ProduceStream(stream(), timeout=30)]
        batch = gateway_pb2.GatewayRecordBatch(records=[gateway_pb2.GatewayRecord(
            topic=TOPIC, record=record(b"intruder-batch"), partition=0, correlation_id=7)])

        async def batches() -> Any:
            yield batch

        batched = [r async for b in stub.ProduceStreamBatch(batches(), timeout=30) for r in b.results]
    assert sorted(a.correlation_id for a in answers) == [0, 1]
    assert {a.error.code for a in answers} == {errors.Code.TOPIC_AUTHORIZATION_FAILED}
    assert [(r.correlation_id, r.error.code) for r in batched] == [(7, errors.Code.TOPIC_AUTHORIZATION_FAILED)]

    assert await read_all(cluster) == [b"billing-%d" % i for i in range(3)]  # nothing of the intruder's
    assert write_denials(cluster, "Topic") >= denials_before + 4
    denied = [a for a in audits(cluster, intruder) if a["decision"] == "Denied"]
    assert denied and all(a["resource_name"] == TOPIC and a["operation"] == "Write" for a in denied)



async def txn_stream(c: LocalCluster, name: str, transactional_id: str) -> list[tuple[int, int]]:
    """init, begin, one record, commit on a TransactionalProduceStream as certificate `name`:
    (correlation_id, error code) of each answer."""
    async def requests() -> Any:
        yield gateway_pb2.GatewayTxnRequest(init=gateway_pb2.GatewayTxnInit(transactional_id=transactional_id,
                                                                             correlation_id=1))
        yield gateway_pb2.GatewayTxnRequest(begin=gateway_pb2.GatewayTxnControl(correlation_id=2))
        yield gateway_pb2.GatewayTxnRequest(record=gateway_pb2.GatewayRecord(
            topic=TOPIC, record=record(f"{name}-txn".encode()), partition=0, correlation_id=3))
        yield gateway_pb2.GatewayTxnRequest(commit=gateway_pb2.GatewayTxnControl(correlation_id=4))

    async with tls.channel(gateway(c), None, security(c, name)) as ch:
        stub = gateway_pb2_grpc.ProducerGatewayServiceStub(ch)
        return [(r.correlation_id, r.error.code) async for r in stub.TransactionalProduceStream(requests(),
                                                                                               timeout=60)]


async def test_a_transactional_stream_needs_write_on_its_transactional_id(cluster: LocalCluster) -> None:
    denied_before = write_denials(cluster, "TransactionalId")
    intruder = await txn_stream(cluster, "intruder", "billing-tx")
    assert intruder[0] == (1, errors.Code.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    assert all(code != 0 for _, code in intruder)  # the record went nowhere
    assert write_denials(cluster, "TransactionalId") > denied_before
    assert await txn_stream(cluster, "billing", "billing-tx") == [(1, 0), (2, 0), (3, 0), (4, 0)]
    values = await read_all(cluster)
    assert b"billing-txn" in values and b"intruder-txn" not in values


async def test_the_callers_producer_byte_rate_applies_at_the_gateway(cluster: LocalCluster) -> None:
    """users/<caller> producer_byte_rate: the gateway throttles the caller under its certificate's principal."""
    assert cluster.tls is not None
    user = cluster.tls.principal("billing").split(":", 1)[1]
    async with AdminClient(cluster.client_config()) as admin:
        await admin.alter_client_quotas(user, None, {"producer_byte_rate": "20000"}, [])
    try:
        async with GatewayClient(gateway(cluster), security=security(cluster, "billing")) as gw:
            async def throttled() -> bool:
                for _ in range(5):
                    await gw.produce(TOPIC, [record(b"q" * 4000) for _ in range(4)], partition=0)
                return any(s.value > 0 for s in gateway_samples(cluster, "gregor_client_quota_throttled_requests_total")
                           if s.labels["type"] == "Produce" and s.labels["user"] == user)
            await until(throttled, 60, "the gateway throttling billing under its user quota")
    finally:
        async with AdminClient(cluster.client_config()) as admin:
            await admin.alter_client_quotas(user, None, {}, ["producer_byte_rate"])
