"""mTLS on every hop of a real cluster (issue 23): `LocalCluster.up(tls=True)` as `gregor cluster up --tls`
starts it: etcd on https with client-certificate auth, controller, 2 brokers, a group coordinator and a
gateway, each with ssl.client.auth=required, the data ports and SSL:// Kafka listeners TLS-only.

Proven here with real processes: the SDK (gRPC and data-port fetches), the CLI, the gateway and a Kafka
client (confluent-kafka, security.protocol=SSL) produce and consume; replication and controller requests
work; a client without a certificate, with one from another CA, with an expired one, and one that reaches
a server under a name its certificate does not carry are refused at the handshake on every kind of port;
etcd refuses clients without a certificate; a broker with a foreign certificate cannot join; broker
certificates rotated by replacing files and restarting the brokers one at a time while a producer runs,
with no produce failing.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import signal
import ssl
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gregor.cli.local_cluster import ClusterError, LocalCluster, start_broker, stop_process
from gregor.client import AdminClient, Consumer, Producer
from gregor.common import certs, tls
from gregor.common.etcd import EtcdClient, EtcdError
from gregor.common.rpc import CHANNEL_OPTIONS
from gregor.common.tls import TlsConfig
from gregor.gateway.client import GatewayClient, record
from tests.helpers.cluster import AckedLoad, restart_broker, tear_down
from tests.helpers.wait import until

TOPIC = "secure"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("tls")), brokers=2, controllers=1, coordinators=1, gateways=1,
                        tls=True, lease_ttl_ms=4000,
                        coordinator_overrides={"offsets.topic.num.partitions": "2",
                                               "offsets.topic.replication.factor": "2"})
    try:
        async def create() -> None:
            async with AdminClient(c.client_config()) as admin:
                await admin.create_topic(TOPIC, 2, 2)
        asyncio.run(create())
        yield c
    finally:
        tear_down(c)


@pytest.fixture(scope="module")
def bad(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsConfig]:
    """Client settings that must be refused: no certificate, another CA's, an expired one."""
    assert cluster.tls is not None
    ours, other = Path(cluster.tls.certs_dir), tmp_path_factory.mktemp("other-ca")
    certs.create_ca(other, cn="someone-else")
    certs.issue(other, "client")
    expired = tmp_path_factory.mktemp("expired")
    shutil.copy(ours / "ca.crt", expired / "ca.crt")
    shutil.copy(ours / "ca.key", expired / "ca.key")
    certs.issue(expired, "client", days=1, not_before=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3))
    ca = str(ours / "ca.crt")

    def cfg(d: Optional[Path]) -> TlsConfig:
        keys = {"ssl.keystore.location": str(d / "client.crt"), "ssl.key.location": str(d / "client.key")} if d else {}
        return TlsConfig.from_properties({"security.protocol": "SSL", "ssl.truststore.location": ca, **keys})
    return {"no certificate": cfg(None), "another CA": cfg(other), "expired": cfg(expired)}


def good(cluster: LocalCluster) -> TlsConfig:
    assert cluster.tls is not None
    return cluster.tls.config()


def grpc_ports(cluster: LocalCluster) -> dict[str, str]:
    return {p.role: p.grpc for p in cluster.processes if p.role in ("broker", "controller", "coordinator", "gateway")}


async def grpc_health(address: str, security: TlsConfig, name_override: str = "") -> grpc.StatusCode:
    options = CHANNEL_OPTIONS + ([("grpc.ssl_target_name_override", name_override)] if name_override else [])
    async with tls.channel(address, options, security) as ch:
        try:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def socket_exchange(address: str, security: TlsConfig, request: bytes, server_name: str = "127.0.0.1") -> bytes:
    """Open a TLS connection, send `request`, return the first bytes answered (b"" if the server hung up)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=security.client_ssl_context(),
                                                   server_hostname=server_name)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(4), 5)
    finally:
        writer.close()


DATA_PORT_BAD_FRAME = struct.pack(">I", 0)  # a zero-length frame: the data port answers an INVALID_REQUEST header
KAFKA_API_VERSIONS = (lambda body: struct.pack(">i", len(body)) + body)(struct.pack(">hhih", 18, 0, 7, -1))


async def socket_refused(address: str, security: TlsConfig, request: bytes, server_name: str = "127.0.0.1") -> bool:
    try:
        return await socket_exchange(address, security, request, server_name) == b""
    except (ssl.SSLError, ConnectionError, OSError):
        return True


# -- the good path ------------------------------------------------------------------------------------------

def test_cluster_json_and_client_properties(cluster: LocalCluster) -> None:
    info = json.load(open(cluster.path))
    assert info["etcd"].startswith("https://")
    assert info["tls"]["client"]["security.protocol"] == "SSL"
    props = open(info["tls"]["client_config"]).read()
    assert "security.protocol=SSL" in props and "ssl.keystore.location=" in props
    assert all(p.kafka for p in cluster.by_role("broker"))


@pytest.mark.parametrize("transport", ["grpc", "data"])
async def test_sdk_produces_and_consumes_over_tls(cluster: LocalCluster, transport: str) -> None:
    values = [f"{transport}-{i}".encode() for i in range(50)]
    async with Producer({**cluster.client_config(), "acks": "all"}) as p:
        for v in values:
            await p.send(TOPIC, v, partition=0)
        await p.flush()
    async with Consumer({**cluster.client_config(), "fetch.transport": transport,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False}) as c:
        c.assign([(TOPIC, 0)])
        c.seek_to_beginning((TOPIC, 0))
        got: list[bytes] = []
        for _ in range(100):
            got += [r.value for r in await c.poll(timeout_ms=200) if r.value and r.value.startswith(transport.encode())]
            if len(got) >= len(values):
                break
    assert got == values


async def wait_full_isr(cluster: LocalCluster, topics: list[str], timeout_s: float = 60.0) -> None:
    async with AdminClient(cluster.client_config()) as admin:
        async def full_isr() -> bool:
            info = await admin.describe_topics(topics)
            return all(sorted(p.isr) == [0, 1] for t in topics for p in info[t].partitions)
        await until(full_isr, timeout_s, "every ISR full")


async def test_replication_and_controller_requests_work_over_tls(cluster: LocalCluster) -> None:
    """The topic was created through the controller (CreateTopics, LeaderAndIsr to both brokers) and both
    replicas of each partition are in sync: the followers fetched over TLS."""
    await wait_full_isr(cluster, [TOPIC])
    async with AdminClient(cluster.client_config()) as admin:
        desc = await admin.describe_cluster()
        assert len(desc.brokers) == 2 and desc.controller_id >= 0


def cli(cluster: LocalCluster, *args: str, stdin: str = "", env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gregor.cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_cli_produces_and_consumes_with_the_clusters_settings(cluster: LocalCluster) -> None:
    out = cli(cluster, "--data-dir", cluster.data_dir, "produce", TOPIC, "--partition", "1", stdin="c1\nc2\nc3\n")
    assert out.returncode == 0, out.stderr
    # --bootstrap names the brokers, --command-config the client properties `cluster up --tls` wrote.
    out = cli(cluster, "--bootstrap", cluster.bootstrap, "--command-config", cluster.client_properties_path,
              "consume", TOPIC, "--partition", "1", "--from-beginning", "--max-messages", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:3] == ["c1", "c2", "c3"]
    # Without the settings the same brokers do not talk to the CLI.
    out = cli(cluster, "--bootstrap", cluster.bootstrap, "topics", "list")
    assert out.returncode != 0 and "UNAVAILABLE" in out.stderr


async def test_a_user_quota_applies_to_the_certificates_principal(cluster: LocalCluster) -> None:
    """Client quotas key on the TLS principal's user (Kafka's `users/<user>` entity), not ANONYMOUS."""
    assert cluster.tls is not None
    user = cluster.tls.principal("client").split(":", 1)[1]  # the certificate's subject (DEFAULT rules)
    async with AdminClient(cluster.client_config()) as admin:
        await admin.create_topic("quota-tls", 1, 1)  # its own topic: the other tests read theirs from the start
        await admin.alter_client_quotas(user, None, {"producer_byte_rate": "20000"}, [])
    try:
        async with Producer({**cluster.client_config(), "acks": "1", "client.id": "tls-quota",
                             "linger.ms": 0}) as p:
            async def throttled() -> bool:
                for _ in range(20):
                    await p.send("quota-tls", b"q" * 4000, partition=0)
                await p.flush()
                return p.metrics()["produce-throttle-time-max"] > 0
            await until(throttled, 30, "the producer throttled under its user's quota")
    finally:
        async with AdminClient(cluster.client_config()) as admin:
            await admin.alter_client_quotas(user, None, {}, ["producer_byte_rate"])


async def test_a_user_request_quota_applies_on_the_coordinator_to_the_certificates_principal(
        cluster: LocalCluster) -> None:
    """The group coordinator meters request_percentage for the TLS principal's user as the brokers do: a
    `users/<user>` request quota of 1 % (an entity ANONYMOUS would not match) throttles the SDK's GroupAdmin
    flooding the coordinator with OffsetFetch calls, and the SDK records the throttle_time_ms handed out."""
    from gregor.client.group_admin import GroupAdmin

    assert cluster.tls is not None
    user = cluster.tls.principal("client").split(":", 1)[1]
    async with AdminClient(cluster.client_config()) as admin:
        await admin.alter_client_quotas(user, None, {"request_percentage": "1"}, [])
    try:
        async with GroupAdmin({**cluster.client_config(), "client.id": "tls-req-quota"}) as groups:
            wanted = [(f"t-{i % 20}", i) for i in range(200)]  # each call some handler time on the coordinator

            async def throttled() -> bool:
                await asyncio.gather(*(groups.committed_offsets("tls-quota-group", wanted) for _ in range(20)))
                return groups.throttles.throttle_time_ms_max > 0

            await until(throttled, 60, "the coordinator throttling the certificate's user", interval_s=0)
    finally:
        async with AdminClient(cluster.client_config()) as admin:
            await admin.alter_client_quotas(user, None, {}, ["request_percentage"])


async def test_gateway_produces_over_tls(cluster: LocalCluster) -> None:
    async with GatewayClient(cluster.by_role("gateway")[0].grpc, security=good(cluster)) as gw:
        results = await gw.produce(TOPIC, [record(b"gw-%d" % i) for i in range(5)], partition=1)
    assert [r.error.code for r in results] == [0] * 5 and all(r.offset >= 0 for r in results)
    async with Consumer({**cluster.client_config(), "auto.offset.reset": "earliest"}) as c:
        c.assign([(TOPIC, 1)])
        c.seek_to_beginning((TOPIC, 1))
        got: list[bytes] = []
        for _ in range(100):
            got += [r.value for r in await c.poll(timeout_ms=200) if r.value and r.value.startswith(b"gw-")]
            if len(got) >= 5:
                break
    assert got == [b"gw-%d" % i for i in range(5)]
    async with GatewayClient(cluster.by_role("gateway")[0].grpc) as plain:  # plain text: refused
        with pytest.raises(Exception, match="UNAVAILABLE"):
            await plain.produce(TOPIC, [record(b"never")], partition=1, attempts=1, timeout=5)


def test_a_kafka_client_over_ssl(cluster: LocalCluster) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer as KafkaConsumer, Producer as KafkaProducer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    assert cluster.tls is not None
    kafka_bootstrap = ",".join(p.kafka for p in cluster.by_role("broker"))
    conf = {"bootstrap.servers": kafka_bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": cluster.tls.path("ca.crt"), "ssl.certificate.location": cluster.tls.path("client.crt"),
            "ssl.key.location": cluster.tls.path("client.key")}
    p = KafkaProducer({**conf, "acks": "all"})
    for i in range(10):
        p.produce(TOPIC, value=b"kafka-%d" % i, partition=0)
    assert p.flush(30) == 0
    # assign, not subscribe: the TLS path is what is under test, not group joins (test_kafka_protocol has those).
    c = KafkaConsumer({**conf, "group.id": "tls-kafka", "enable.auto.commit": False})
    c.assign([KafkaTopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
    got: list[bytes] = []
    try:
        for _ in range(120):
            msg = c.poll(0.5)
            assert msg is None or not msg.error(), msg.error()
            if msg is not None and msg.value() and msg.value().startswith(b"kafka-"):
                got.append(msg.value())
            if len(got) >= 10:
                break
    finally:
        c.close()
    assert got == [b"kafka-%d" % i for i in range(10)]


# -- refused at the handshake -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["no certificate", "another CA", "expired"])
async def test_bad_client_certificates_are_refused_on_every_grpc_port(cluster: LocalCluster, bad: dict[str, TlsConfig],
                                                                      kind: str) -> None:
    ports = grpc_ports(cluster)
    assert set(ports) == {"broker", "controller", "coordinator", "gateway"}
    for role, address in ports.items():
        assert await grpc_health(address, good(cluster)) == grpc.StatusCode.OK, role
        assert await grpc_health(address, bad[kind]) == grpc.StatusCode.UNAVAILABLE, (role, kind)
    assert await grpc_health(ports["broker"], TlsConfig()) == grpc.StatusCode.UNAVAILABLE  # plain text


@pytest.mark.parametrize("kind", ["no certificate", "another CA", "expired"])
async def test_bad_client_certificates_are_refused_on_the_data_port_and_kafka_listener(
        cluster: LocalCluster, bad: dict[str, TlsConfig], kind: str) -> None:
    broker = cluster.by_role("broker")[0]
    for address, request in ((broker.data, DATA_PORT_BAD_FRAME), (broker.kafka, KAFKA_API_VERSIONS)):
        assert len(await socket_exchange(address, good(cluster), request)) == 4, address  # the control
        assert await socket_refused(address, bad[kind], request), (address, kind)


async def test_a_server_name_missing_from_the_certificate_is_refused(cluster: LocalCluster) -> None:
    """Hostname (SAN) verification is on: the certificates name localhost and 127.0.0.1 only."""
    broker = cluster.by_role("broker")[0]
    assert await grpc_health(broker.grpc, good(cluster), name_override="broker.elsewhere.example") \
        == grpc.StatusCode.UNAVAILABLE
    for address, request in ((broker.data, DATA_PORT_BAD_FRAME), (broker.kafka, KAFKA_API_VERSIONS)):
        with pytest.raises(ssl.SSLCertVerificationError):
            await socket_exchange(address, good(cluster), request, server_name="broker.elsewhere.example")
    off = TlsConfig.from_properties({**good(cluster).to_properties(), "ssl.endpoint.identification.algorithm": ""})
    assert len(await socket_exchange(broker.data, off, DATA_PORT_BAD_FRAME, "broker.elsewhere.example")) == 4


async def test_etcd_refuses_clients_without_a_valid_certificate(cluster: LocalCluster,
                                                                bad: dict[str, TlsConfig]) -> None:
    endpoints = cluster.etcd_endpoints
    async with EtcdClient(endpoints, security=good(cluster), request_timeout_s=3) as etcd:
        assert await etcd.get(etcd.key("brokers", "ids", 0)) is not None
    for kind in ("no certificate", "another CA"):
        etcd = EtcdClient(endpoints, security=bad[kind], request_timeout_s=3)
        try:
            with pytest.raises(EtcdError):
                await etcd.get(etcd.key("brokers", "ids", 0))
        finally:
            await etcd.close()
    plain = EtcdClient(endpoints.replace("https://", "http://"), request_timeout_s=3)
    try:
        with pytest.raises(EtcdError):
            await plain.get(plain.key("brokers", "ids", 0))
    finally:
        await plain.close()


def test_a_broker_with_a_foreign_certificate_cannot_join(cluster: LocalCluster,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    assert cluster.tls is not None
    other = tmp_path_factory.mktemp("foreign")
    certs.create_ca(other, cn="intruder-ca")
    certs.issue(other, "broker")
    props = {"security.protocol": "SSL", "ssl.truststore.location": cluster.tls.path("ca.crt"),
             "ssl.keystore.location": str(other / "broker.crt"), "ssl.key.location": str(other / "broker.key"),
             "ssl.client.auth": "required", "listeners": "SSL://127.0.0.1:0"}
    with pytest.raises(ClusterError):  # etcd refuses its certificate: it never registers
        proc = start_broker(str(tmp_path_factory.mktemp("intruder")), 7, overrides=props,
                            etcd_endpoint=cluster.etcd_endpoints)
        stop_process(proc)  # pragma: no cover - only if it wrongly joined


async def test_a_foreign_certificate_cannot_fetch_from_a_leader(cluster: LocalCluster,
                                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """A follower's fetch (Fetch with a replica id) from a broker with a foreign certificate is refused at the
    handshake; the same call with the cluster's broker certificate is served."""
    from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

    assert cluster.tls is not None
    other = tmp_path_factory.mktemp("foreign-fetch")
    certs.create_ca(other)
    certs.issue(other, "broker")
    foreign = TlsConfig.from_properties({"security.protocol": "SSL", "ssl.truststore.location": cluster.tls.path("ca.crt"),
                                         "ssl.keystore.location": str(other / "broker.crt"),
                                         "ssl.key.location": str(other / "broker.key")})
    for security, refused in ((foreign, True), (cluster.tls.config("broker"), False)):
        async with tls.channel(cluster.by_role("broker")[0].grpc, CHANNEL_OPTIONS, security) as ch:
            try:
                await broker_pb2_grpc.BrokerServiceStub(ch).Fetch(
                    broker_pb2.FetchRequest(replica_id=1, max_wait_ms=0), timeout=5)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
        assert (code == grpc.StatusCode.UNAVAILABLE) == refused, code


# -- rotation -----------------------------------------------------------------------------------------------

def served_certificate(address: str, security: TlsConfig) -> bytes:
    host, port = address.rsplit(":", 1)
    ctx = security.client_ssl_context()
    import socket

    with socket.create_connection((host, int(port)), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname=host) as s:
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return der


def certificate_der(cluster: LocalCluster, name: str) -> bytes:
    """The DER of the certificate file `name`.crt of the cluster (what its process serves once restarted)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    assert cluster.tls is not None
    return x509.load_pem_x509_certificate(Path(cluster.tls.path(f"{name}.crt")).read_bytes()).public_bytes(Encoding.DER)


def retrying_load(cluster: LocalCluster) -> AckedLoad:
    """An acks=all producer over TLS that retries through restarts (a send may only fail after 60 s)."""
    return AckedLoad(cluster.bootstrap, TOPIC, 2, window=8,
                     props={**cluster.client_config(), "retries": 2147483647, "delivery.timeout.ms": 60000,
                            "request.timeout.ms": 5000})


async def test_rotating_broker_certificates_with_rolling_restarts_fails_no_produce(cluster: LocalCluster) -> None:
    """New broker certificates (same CA) replace the files; each broker is restarted in turn (controlled
    shutdown) while an acks=all producer with retries runs: no send fails, every acked record is there,
    and each broker serves its new certificate afterwards."""
    assert cluster.tls is not None
    before = served_certificate(cluster.by_role("broker")[0].data, good(cluster))
    certs.issue(Path(cluster.tls.certs_dir), "broker")  # replaces broker.crt / broker.key
    new_der = certificate_der(cluster, "broker")
    assert new_der != before
    load = retrying_load(cluster)
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    try:
        await wait_full_isr(cluster, [TOPIC, "__consumer_offsets"])
        await until(lambda: len(load.acked) > 50, 30, "the producer under way")
        for broker in list(cluster.by_role("broker")):
            sent = len(load.acked)
            await asyncio.to_thread(stop_process, broker, signal.SIGTERM)
            # On its old address, as a StatefulSet's pod: the load's producer knows the brokers only by the
            # addresses it has seen, and with both on new ports it could lose all of them (it did, under load).
            back = await asyncio.to_thread(restart_broker, cluster, broker, None, True)
            assert served_certificate(back.data, good(cluster)) == new_der
            await until(lambda: len(load.acked) > sent + 50, 60, "acks after the restart")
            cluster.save()
            # A rolling restart's rule: the next broker goes only once nothing is under-replicated (the
            # restarted one fetched its way back into every ISR, over TLS with its new certificate).
            await wait_full_isr(cluster, [TOPIC, "__consumer_offsets"])
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await task
    assert not load.errors, load.errors
    assert len(load.acked) > 100
    await check_consumed(load, cluster)


async def test_rotating_the_other_roles_certificates_one_restart_each_fails_no_produce(cluster: LocalCluster) -> None:
    """The controller's, the coordinator's and the gateway's certificates (same CA) replace their files, and each
    process is restarted in turn (SIGTERM) while an acks=all producer runs through the brokers: no send fails,
    every acked record is there; each restarted process serves its new certificate and works: the controller
    creates a topic, the coordinator takes a group's offset commit, the gateway a produce. Then the client's own
    certificate: a client started with the new one is served."""
    assert cluster.tls is not None
    from gregor.cli.local_cluster import start_controller, start_coordinator, start_gateway

    load = retrying_load(cluster)
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    try:
        await wait_full_isr(cluster, [TOPIC, "__consumer_offsets"])
        await until(lambda: len(load.acked) > 50, 30, "the producer under way")

        old = served_certificate(cluster.by_role("controller")[0].grpc, good(cluster))
        certs.issue(Path(cluster.tls.certs_dir), "controller")
        assert certificate_der(cluster, "controller") != old
        victim = cluster.by_role("controller")[0]
        await asyncio.to_thread(stop_process, victim, signal.SIGTERM)
        back = await asyncio.to_thread(start_controller, cluster.data_dir, victim.id, cluster.etcd_endpoints,
                                       lease_ttl_ms=4000, overrides=cluster.role_props("controller"))
        cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
        cluster.save()
        assert served_certificate(back.grpc, good(cluster)) == certificate_der(cluster, "controller")

        async def created() -> bool:
            try:
                async with AdminClient(cluster.client_config()) as admin:
                    await admin.create_topic("rotated-controller", 1, 2)
                return True
            except Exception:  # noqa: BLE001 - the new controller is still taking over: ask again
                return False
        await until(created, 60, "a topic created by the restarted controller")

        old = served_certificate(cluster.by_role("coordinator")[0].grpc, good(cluster))
        certs.issue(Path(cluster.tls.certs_dir), "coordinator")
        assert certificate_der(cluster, "coordinator") != old
        victim = cluster.by_role("coordinator")[0]
        await asyncio.to_thread(stop_process, victim, signal.SIGTERM)
        back = await asyncio.to_thread(
            start_coordinator, cluster.data_dir, victim.id, cluster.etcd_endpoints, lease_ttl_ms=4000,
            port=int(victim.grpc.rsplit(":", 1)[1]),
            overrides={**cluster.role_props("coordinator"), "offsets.topic.num.partitions": "2",
                       "offsets.topic.replication.factor": "2"})
        cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
        cluster.save()
        assert served_certificate(back.grpc, good(cluster)) == certificate_der(cluster, "coordinator")
        async with Consumer({**cluster.client_config(), "group.id": "rotated-coordinator",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest"}) as c:
            c.assign([(TOPIC, 0)])
            await c.commit_sync({(TOPIC, 0): 1})
            assert (await c.committed([(TOPIC, 0)]))[(TOPIC, 0)] == 1

        old = served_certificate(cluster.by_role("gateway")[0].grpc, good(cluster))
        certs.issue(Path(cluster.tls.certs_dir), "gateway")
        assert certificate_der(cluster, "gateway") != old
        victim = cluster.by_role("gateway")[0]
        await asyncio.to_thread(stop_process, victim, signal.SIGTERM)
        back = await asyncio.to_thread(start_gateway, cluster.data_dir, victim.id, cluster.bootstrap,
                                       props=cluster.role_props("gateway"))
        cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
        cluster.save()
        assert served_certificate(back.grpc, good(cluster)) == certificate_der(cluster, "gateway")
        async with GatewayClient(back.grpc, security=good(cluster)) as gw:
            results = await gw.produce(TOPIC, [record(b"rotated-gw")], partition=0)
        assert [r.error.code for r in results] == [0]

        certs.issue(Path(cluster.tls.certs_dir), "client")  # a client restarted with its new certificate
        async with GatewayClient(back.grpc, security=good(cluster)) as gw:
            assert [r.error.code for r in await gw.produce(TOPIC, [record(b"client-cert")], partition=0)] == [0]
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await task
    assert not load.errors, load.errors
    assert len(load.acked) > 100
    await check_consumed(load, cluster)


async def check_consumed(load: AckedLoad, cluster: LocalCluster) -> None:
    """Every acknowledged value is in the log exactly once, at its offset (read back over TLS)."""
    async with Consumer({**cluster.client_config(), "auto.offset.reset": "earliest",
                         "enable.auto.commit": False}) as c:
        tps = [(TOPIC, p) for p in range(2)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        got: dict[tuple[str, int], dict[int, bytes]] = {tp: {} for tp in tps}
        for _ in range(600):
            if all(len(got[tp]) >= ends[tp] for tp in tps):
                break
            for rec in await c.poll(timeout_ms=200):
                got[(rec.topic, rec.partition)][rec.offset] = rec.value
    for value, (partition, offset) in load.acked.items():
        assert got[(TOPIC, partition)].get(offset) == value, (value, partition, offset)


@pytest.mark.parametrize("transport", ["grpc", "data"])
def test_the_spark_source_reads_with_kafka_ssl_options(cluster: LocalCluster, transport: str) -> None:
    """The Spark source's read path (options -> planned ranges -> Arrow batches), without a JVM: Spark's
    kafka.security.protocol / kafka.ssl.* options reach every connection it opens."""
    from gregor_spark.cluster import GregorCluster
    from gregor_spark.options import parse_source
    from gregor_spark.ranges import plan, read_range

    def plan_batch(o: Any) -> list[Any]:
        c = GregorCluster.of(o)
        try:
            return plan(c, o)
        finally:
            c.close()

    async def fill() -> None:
        async with Producer(cluster.client_config()) as p:
            for i in range(20):
                await p.send(TOPIC, b"spark-%d" % i, partition=i % 2)
            await p.flush()
    asyncio.run(fill())
    options = {"subscribe": TOPIC, "bootstrap": cluster.bootstrap, "fetch.transport": transport,
               **{f"kafka.{k}": v for k, v in cluster.client_config().items() if k != "bootstrap.servers"}}
    opts = parse_source(options, streaming=False)
    assert dict(opts.security)["security.protocol"] == "SSL"
    ranges = plan_batch(opts)
    rows = sum(b.num_rows for r in ranges for b in read_range(r))
    assert rows == sum(r.size for r in ranges) >= 20
    if transport == "grpc":  # without the options the brokers refuse the source (after its request timeout)
        plain = parse_source({k: v for k, v in options.items() if not k.startswith("kafka.")}, streaming=False)
        with pytest.raises(Exception, match="UNAVAILABLE|NETWORK_EXCEPTION"):
            plan_batch(plain)


def test_a_three_member_etcd_speaks_tls_to_its_peers(tmp_path: Path) -> None:
    """`--tls --etcd-members 3`: the members find each other over https (peer client-certificate auth) and
    the services keep working through them."""
    c = LocalCluster.up(str(tmp_path / "etcd3"), brokers=1, controllers=1, etcd_members=3, tls=True)
    try:
        assert len(c.by_role("etcd")) == 3
        log = open(c.by_role("etcd")[0].log).read()
        assert "http://" not in " ".join(a for a in open(f"/proc/{c.by_role('etcd')[0].pid}/cmdline").read().split("\0")
                                        if "urls" in a or a.startswith("gregor-etcd")), log[-500:]

        async def check() -> None:
            async with EtcdClient(c.etcd_endpoints, security=good(c), request_timeout_s=3) as etcd:
                for i in range(3):  # every member answers over TLS
                    one_member = EtcdClient(f"https://{c.by_role('etcd')[i].grpc}", security=good(c))
                    try:
                        assert await one_member.get(etcd.key("brokers", "ids", 0)) is not None
                    finally:
                        await one_member.close()
            async with AdminClient(c.client_config()) as admin:
                await admin.create_topic("three", 1, 1)
        asyncio.run(check())
    finally:
        tear_down(c)
