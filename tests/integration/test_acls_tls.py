"""`gregor cluster up --tls --authorizer` end to end (issue 23): principals come from client certificates.

The CLI's certificate (`client`) and the services' are super users; a second client certificate,
`billing`, gets ACLs on the prefix `billing-` only, and is refused elsewhere with Kafka's codes over
gRPC and over the Kafka listener (SSL://, confluent-kafka), its denials audited under its certificate's
principal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from gregor.cli.local_cluster import LocalCluster, authorizer_properties
from gregor.client.admin import AdminClient
from gregor.client.producer import Producer
from gregor.common import certs, errors, tls
from gregor.common.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from gregor.common.rpc import CHANNEL_OPTIONS
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc
from tests.helpers.cluster import tear_down

WAIT_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("acls-tls")), brokers=1, controllers=1, tls=True,
                        authorizer=authorizer_properties([]))
    assert c.tls is not None
    certs.issue(Path(c.tls.certs_dir), "billing")
    certs.issue(Path(c.tls.certs_dir), "intruder")
    try:
        yield c
    finally:
        tear_down(c)


def props(c: LocalCluster, name: str) -> dict[str, str]:
    assert c.tls is not None
    return c.tls.props(name, server=False)


async def billing_topics(cluster: LocalCluster) -> None:
    """The topics billing-invoices and payroll, and billing's Write and Describe on the prefix billing-: each
    test that uses them makes sure of them (creating what is missing, ACLs being idempotent as in Kafka), so
    any one of them runs alone or in any order."""
    assert cluster.tls is not None
    billing = cluster.tls.principal("billing")
    async with AdminClient({"bootstrap.servers": cluster.bootstrap, **props(cluster, "client")}) as admin:
        for name in ("billing-invoices", "payroll"):  # the CLI's certificate is a super user
            try:
                await admin.create_topic(name, 1, 1)
            except errors.GregorError as err:
                if err.code != errors.Code.TOPIC_ALREADY_EXISTS:
                    raise
        await admin.create_acls([AclBinding(billing, "*", ResourceType.TOPIC, "billing-", PatternType.PREFIXED, op,
                                            Permission.ALLOW) for op in (Operation.WRITE, Operation.DESCRIBE)])


async def test_certificate_principals_are_authorized_by_their_acls(cluster: LocalCluster) -> None:
    assert cluster.tls is not None
    billing = cluster.tls.principal("billing")
    assert billing.startswith("User:CN=billing")
    await billing_topics(cluster)
    async with Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": "false",
                         **props(cluster, "billing")}) as producer:
        await (await producer.send("billing-invoices", b"ok", partition=0))
        with pytest.raises(errors.GregorError) as info:
            await (await producer.send("payroll", b"not-yours", partition=0))
    assert info.value.code == errors.Code.TOPIC_AUTHORIZATION_FAILED

    config = tls.TlsConfig.from_properties(props(cluster, "billing"))
    async with tls.channel(cluster.bootstrap, CHANNEL_OPTIONS, config) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        listed = {t.name for t in (await stub.Metadata(broker_pb2.MetadataRequest(), timeout=10)).topics}
        assert "billing-invoices" in listed and "payroll" not in listed
        with pytest.raises(grpc.RpcError) as denied:  # Write on the cluster's topics is not Read
            await stub.Fetch(broker_pb2.FetchRequest(topic="billing-invoices", partition=0, max_bytes=1 << 20),
                             timeout=10)
        assert errors.from_rpc_error(denied.value).code == errors.Code.TOPIC_AUTHORIZATION_FAILED

    broker = cluster.by_role("broker")[0]
    with open(broker.log) as f:
        audits = [json.loads(line.split("gregor.audit: ", 1)[1]) for line in f if "gregor.audit: " in line]
    # The producer asked Metadata for payroll first: Describe denied (the topic is hidden from it).
    assert any(a["principal"] == billing and a["resource_name"] == "payroll" and a["decision"] == "Denied"
               for a in audits), audits


def test_the_ssl_kafka_listener_uses_the_certificate_principal(cluster: LocalCluster) -> None:
    from confluent_kafka import KafkaError, Producer as KafkaProducer

    assert cluster.tls is not None
    asyncio.run(billing_topics(cluster))
    reports: dict[str, Any] = {}
    producer = KafkaProducer({
        "bootstrap.servers": str(cluster.to_json()["kafka_bootstrap"]), "security.protocol": "SSL",
        "ssl.ca.location": cluster.tls.path("ca.crt"), "ssl.certificate.location": cluster.tls.path("billing.crt"),
        "ssl.key.location": cluster.tls.path("billing.key"), "message.timeout.ms": 20000})
    for topic in ("billing-invoices", "payroll"):
        producer.produce(topic, b"via-kafka", partition=0,
                         on_delivery=lambda err, msg, topic=topic: reports.__setitem__(topic, err))
    assert producer.flush(30) == 0
    assert reports["billing-invoices"] is None
    assert reports["payroll"] is not None and reports["payroll"].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def broker_metric(cluster: LocalCluster, name: str, **labels: str) -> float:
    import ssl
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    assert cluster.tls is not None  # /metrics is HTTPS with the broker's certificate in a --tls cluster
    ctx = ssl.create_default_context(cafile=cluster.tls.path("ca.crt"))
    with urllib.request.urlopen(cluster.by_role("broker")[0].metrics, timeout=10, context=ctx) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_the_data_port_authorizes_each_fetch_by_the_connections_certificate(cluster: LocalCluster) -> None:
    """With the authorizer on, the data port is open under TLS: each fetch needs Read on its topic for the
    principal of the connection's certificate. billing (Read) gets the records through the data port;
    intruder (Describe only, so it finds the partition) gets TOPIC_AUTHORIZATION_FAILED and no record."""
    from gregor.client.consumer import Consumer

    assert cluster.tls is not None
    topic = "billing-data"
    billing, intruder = cluster.tls.principal("billing"), cluster.tls.principal("intruder")
    assert cluster.by_role("broker")[0].data  # the broker opened its data port with the authorizer on
    async with AdminClient({"bootstrap.servers": cluster.bootstrap, **props(cluster, "client")}) as admin:
        await admin.create_topic(topic, 1, 1)
        await admin.create_acls([
            AclBinding(billing, "*", ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.READ, Permission.ALLOW),
            AclBinding(intruder, "*", ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.DESCRIBE,
                       Permission.ALLOW)])
    async with Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": "false",
                         **props(cluster, "client")}) as producer:
        for i in range(3):
            await (await producer.send(topic, b"data-%d" % i, partition=0))
    tls_bytes = broker_metric(cluster, "gregor_broker_data_port_tls_bytes_total")
    denials = broker_metric(cluster, "gregor_authorizer_denials_total", resource_type="Topic", operation="Read")

    async def consume(name: str) -> list[bytes]:
        async with Consumer({"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "earliest",
                             "fetch.transport": "data", **props(cluster, name)}) as consumer:
            consumer.assign([(topic, 0)])
            got: list[bytes] = []
            for _ in range(100):
                got += [r.value for r in await consumer.poll(timeout_ms=200) if r.value is not None]
                if len(got) >= 3:
                    break
            return got

    assert await consume("billing") == [b"data-%d" % i for i in range(3)]
    assert broker_metric(cluster, "gregor_broker_data_port_tls_bytes_total") > tls_bytes  # over the data port
    with pytest.raises(errors.GregorError) as info:
        await consume("intruder")
    assert info.value.code == errors.Code.TOPIC_AUTHORIZATION_FAILED
    assert broker_metric(cluster, "gregor_authorizer_denials_total", resource_type="Topic",
                         operation="Read") > denials
    broker = cluster.by_role("broker")[0]
    with open(broker.log) as f:
        audits = [json.loads(line.split("gregor.audit: ", 1)[1]) for line in f if "gregor.audit: " in line]
    assert any(a["principal"] == intruder and a["api"] == "DataPortFetch" and a["decision"] == "Denied"
               for a in audits)


def test_the_data_port_refuses_a_follower_fetch_without_cluster_action(cluster: LocalCluster) -> None:
    """A follower's fetch session on the data port (a replica frame, replica.fetch.transport=data) needs
    ClusterAction on the Cluster, as the gRPC ReplicaFetch: intruder's certificate gets a response with
    CLUSTER_AUTHORIZATION_FAILED and the connection closed, audited as ReplicaFetch; the brokers' certificate
    (a super user) is answered."""
    import socket
    import struct

    assert cluster.tls is not None
    broker = cluster.by_role("broker")[0]
    host, port = broker.data.rsplit(":", 1)
    body = broker_pb2.ReplicaFetchRequest(replica_id=broker.id + 100, min_bytes=1, max_wait_ms=0).SerializeToString()

    def exchange(name: str, refused: bool) -> tuple[broker_pb2.ReplicaFetchResponse, bool]:
        ctx = cluster.tls.config(name).client_ssl_context()  # type: ignore[union-attr]
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as s:
            s.sendall(struct.pack(">I", len(body) | 0x8000_0000) + body)
            f = s.makefile("rb")
            (size,) = struct.unpack(">I", f.read(4))
            resp = broker_pb2.ReplicaFetchResponse.FromString(f.read(size))
            return resp, refused and f.read(1) == b""  # a served session stays open

    resp, closed = exchange("intruder", True)
    assert resp.error.code == errors.Code.CLUSTER_AUTHORIZATION_FAILED and closed, resp
    resp, _ = exchange("broker", False)
    assert not resp.HasField("error"), resp  # no partitions named: an empty answer
    intruder = cluster.tls.principal("intruder")
    with open(broker.log) as f:
        audits = [json.loads(line.split("gregor.audit: ", 1)[1]) for line in f if "gregor.audit: " in line]
    assert any(a["principal"] == intruder and a["api"] == "ReplicaFetch" and a["decision"] == "Denied"
               for a in audits)
