"""gregor.common.tls: Kafka's security.protocol / ssl.* keys, and peer_subject over real TLS handshakes
(a grpc.aio server and an asyncio socket server on loopback, with certificates from gregor.common.certs)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any, Optional

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gregor.common import certs, tls
from gregor.common.rpc import CHANNEL_OPTIONS
from gregor.common.tls import TlsConfig, TlsConfigError


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    certs.create_ca(tmp_path)
    for name in ("broker", "billing"):
        certs.issue(tmp_path, name, org="Gregor")
    return tmp_path


def server_cfg(pki: Path, client_auth: str = "required") -> TlsConfig:
    return TlsConfig.from_properties({"security.protocol": "SSL", "ssl.truststore.location": str(pki / "ca.crt"),
                                      "ssl.keystore.location": str(pki / "broker.crt"),
                                      "ssl.key.location": str(pki / "broker.key"), "ssl.client.auth": client_auth})


def client_cfg(pki: Path, name: Optional[str] = "billing", **extra: str) -> TlsConfig:
    props = {"security.protocol": "SSL", "ssl.truststore.location": str(pki / "ca.crt"), **extra}
    if name:
        props.update({"ssl.keystore.location": str(pki / f"{name}.crt"), "ssl.key.location": str(pki / f"{name}.key")})
    return TlsConfig.from_properties(props)


# -- configuration ------------------------------------------------------------------------------------------

def test_defaults_are_plaintext_and_split_keeps_other_keys() -> None:
    cfg, rest = tls.split_properties({"log.retention.ms": "1", "security.protocol": "PLAINTEXT"})
    assert cfg == TlsConfig() and not cfg.enabled and rest == {"log.retention.ms": "1"}


@pytest.mark.parametrize("props, needle", [
    ({"security.protocol": "SASL_SSL"}, "security.protocol"),
    ({"security.protocol": "SSL"}, "ssl.truststore.location"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "x", "ssl.keystore.type": "JKS"}, "PEM"),
    ({"ssl.client.auth": "sometimes"}, "ssl.client.auth"),
    ({"ssl.endpoint.identification.algorithm": "dns"}, "ssl.endpoint.identification.algorithm"),
    ({"ssl.key.location": "k.pem"}, "ssl.keystore.location"),
])
def test_bad_values_are_typed_errors_naming_the_key(props: dict[str, str], needle: str) -> None:
    with pytest.raises(TlsConfigError, match=needle):
        TlsConfig.from_properties(props)


def test_missing_files_are_typed_errors(pki: Path) -> None:
    cfg = client_cfg(pki, None, **{"ssl.keystore.location": str(pki / "nope.crt")})
    with pytest.raises(TlsConfigError, match="nope.crt"):
        cfg.channel_credentials()


def test_kafka_pem_keystore_form_key_and_chain_in_one_file(pki: Path) -> None:
    combined = pki / "billing.pem"
    combined.write_bytes((pki / "billing.key").read_bytes() + (pki / "billing.crt").read_bytes())
    cfg = client_cfg(pki, None, **{"ssl.keystore.location": str(combined), "ssl.keystore.type": "PEM"})
    pair = cfg.key_pair()
    assert pair is not None
    key, chain = pair
    assert b"PRIVATE KEY" in key and b"CERTIFICATE" not in key
    assert b"CERTIFICATE" in chain and b"PRIVATE KEY" not in chain
    cfg.client_ssl_context()  # loads


def test_client_config_round_trip() -> None:
    assert tls.from_client_config({"security.protocol": "PLAINTEXT", "ssl.truststore.location": ""}) is None
    cfg = tls.from_client_config({"security.protocol": "SSL", "ssl.truststore.location": "/ca.crt"})
    assert cfg is not None and cfg.enabled and cfg.to_properties() == {
        "security.protocol": "SSL", "ssl.truststore.location": "/ca.crt"}


# -- gRPC: credentials and the peer's subject ---------------------------------------------------------------

class Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.subjects: list[Optional[str]] = []

    async def Check(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.subjects.append(tls.peer_subject(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def grpc_check(server_tls: TlsConfig, client_tls: TlsConfig) -> tuple[grpc.StatusCode, list[Optional[str]]]:
    server = grpc.aio.server()
    servicer = Health()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = tls.add_port(server, "127.0.0.1:0", server_tls)
    await server.start()
    try:
        async with tls.channel(f"127.0.0.1:{port}", CHANNEL_OPTIONS, client_tls) as ch:
            try:
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), servicer.subjects
        return grpc.StatusCode.OK, servicer.subjects
    finally:
        await server.stop(0)


async def test_grpc_mtls_gives_the_client_subject(pki: Path) -> None:
    assert await grpc_check(server_cfg(pki), client_cfg(pki)) == (grpc.StatusCode.OK, ["CN=billing,O=Gregor"])


async def test_grpc_plaintext_has_no_subject() -> None:
    assert await grpc_check(TlsConfig(), TlsConfig()) == (grpc.StatusCode.OK, [None])


async def test_grpc_client_auth_none_serves_clients_without_certificates(pki: Path) -> None:
    assert await grpc_check(server_cfg(pki, "none"), client_cfg(pki, None)) == (grpc.StatusCode.OK, [None])


@pytest.mark.parametrize("client_auth", ["required", "requested"])
async def test_grpc_refuses_a_client_without_a_certificate(pki: Path, client_auth: str) -> None:
    code, subjects = await grpc_check(server_cfg(pki, client_auth), client_cfg(pki, None))
    assert code == grpc.StatusCode.UNAVAILABLE and subjects == []


async def test_grpc_refuses_a_plaintext_client_on_a_tls_port(pki: Path) -> None:
    code, subjects = await grpc_check(server_cfg(pki), TlsConfig())
    assert code == grpc.StatusCode.UNAVAILABLE and subjects == []


# -- asyncio sockets ------------------------------------------------------------------------------------------

async def socket_subject(server_tls: TlsConfig, client_tls: TlsConfig, host: str = "127.0.0.1") -> Optional[str]:
    seen: asyncio.Future[Optional[str]] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not seen.done():
            seen.set_result(tls.peer_subject(writer))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls.server_ssl(server_tls))
    port = server.sockets[0].getsockname()[1]
    try:
        ctx = tls.client_ssl(client_tls)
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host if ctx else None)
        assert await reader.read() == b"ok"
        writer.close()
        return await asyncio.wait_for(seen, 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_socket_mtls_gives_the_client_subject(pki: Path) -> None:
    assert await socket_subject(server_cfg(pki), client_cfg(pki)) == "CN=billing,O=Gregor"


async def test_socket_requested_without_a_certificate_is_anonymous(pki: Path) -> None:
    assert await socket_subject(server_cfg(pki, "requested"), client_cfg(pki, None)) is None


async def test_socket_plaintext_has_no_subject() -> None:
    assert await socket_subject(TlsConfig(), TlsConfig()) is None


async def test_socket_checks_the_server_name_unless_identification_is_off(pki: Path) -> None:
    certs.issue(pki, "broker", hosts=["elsewhere.example"], org="Gregor")  # a SAN that is not 127.0.0.1
    import ssl

    with pytest.raises(ssl.SSLCertVerificationError):
        await socket_subject(server_cfg(pki), client_cfg(pki))
    off = client_cfg(pki, **{"ssl.endpoint.identification.algorithm": ""})
    assert await socket_subject(server_cfg(pki), off) == "CN=billing,O=Gregor"


async def test_socket_refuses_an_expired_client_certificate(pki: Path) -> None:
    """TLS 1.3: the server checks the client's certificate after the client thinks the handshake is done,
    so the refusal shows as an alert or a closed stream on the first read; the server never serves it."""
    certs.issue(pki, "old", org="Gregor", days=1,
                not_before=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3))
    with pytest.raises((AssertionError, ConnectionError, OSError)):
        await socket_subject(server_cfg(pki), client_cfg(pki, "old"))


def test_peer_subject_rejects_other_objects() -> None:
    with pytest.raises(TypeError):
        tls.peer_subject(object())


def test_metrics_follow_security_protocol_unless_set() -> None:
    ssl_props = {"security.protocol": "SSL", "ssl.truststore.location": "/ca.crt",
                 "ssl.keystore.location": "/svc.crt", "ssl.key.location": "/svc.key"}
    on = TlsConfig.from_properties(ssl_props)
    assert on.metrics_tls and on.metrics_scheme == "https"
    assert on.metrics_server_args()["certfile"] == "/svc.crt" and on.metrics_server_args()["keyfile"] == "/svc.key"
    assert "client_cafile" not in on.metrics_server_args()  # metrics.ssl.client.auth=none: any trusting scraper
    required = TlsConfig.from_properties({**ssl_props, "metrics.ssl.client.auth": "required"}).metrics_server_args()
    assert required["client_cafile"] == "/ca.crt" and required["client_auth_required"] is True
    off = TlsConfig.from_properties({**ssl_props, "metrics.security.protocol": "PLAINTEXT"})
    assert not off.metrics_tls and off.metrics_server_args() == {}
    assert not TlsConfig().metrics_tls and TlsConfig().metrics_scheme == "http"
    assert "metrics.security.protocol" not in tls.CLIENT_TLS_KEYS  # a server's key, as ssl.client.auth
    assert TlsConfig.from_properties(on.to_properties()) == on


@pytest.mark.parametrize("props, needle", [
    ({"metrics.security.protocol": "HTTPS"}, "metrics.security.protocol"),
    ({"metrics.ssl.client.auth": "maybe"}, "metrics.ssl.client.auth"),
    ({"metrics.security.protocol": "SSL"}, "ssl.keystore.location"),
])
def test_bad_metrics_keys_are_typed_errors(props: dict[str, str], needle: str) -> None:
    with pytest.raises(TlsConfigError, match=needle.replace(".", r"\.")):
        TlsConfig.from_properties(props).metrics_server_args()
