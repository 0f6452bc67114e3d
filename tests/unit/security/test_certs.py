"""`gregor certs create` and the certificates it makes, proven by real mTLS handshakes through gRPC:
a good pair connects; no client certificate, another CA's certificate, an expired one and a server
certificate for another host are each refused at the handshake."""

from __future__ import annotations

import datetime as dt
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Optional

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gregor.cli.main import cli
from gregor.common import certs
from gregor.common.principal import parse_rules, principal_for


def read(p: Path) -> bytes:
    return p.read_bytes()


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    result = CliRunner().invoke(cli, ["certs", "create", "--out", str(tmp_path), "--service", "broker",
                                      "--client", "billing", "--org", "Gregor"])
    assert result.exit_code == 0, result.output
    return tmp_path


def serve(pki: Path, name: str = "broker") -> Iterator[int]:
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    creds = grpc.ssl_server_credentials([(read(pki / f"{name}.key"), read(pki / f"{name}.crt"))],
                                        root_certificates=read(pki / "ca.crt"), require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


@pytest.fixture
def broker_port(pki: Path) -> Iterator[int]:
    yield from serve(pki)


def check(port: int, ca: bytes, key: Optional[bytes], cert: Optional[bytes]) -> grpc.StatusCode:
    creds = grpc.ssl_channel_credentials(ca, key, cert)
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_files_subjects_and_key_modes(pki: Path) -> None:
    for name in ("ca", "broker", "billing"):
        assert (pki / f"{name}.crt").exists()
        assert stat.S_IMODE(os.stat(pki / f"{name}.key").st_mode) == 0o600
    subject = certs.subject_of(read(pki / "billing.crt"))
    assert subject == "CN=billing,O=Gregor"
    assert principal_for(subject, parse_rules("RULE:^CN=([^,]*),.*$/$1/")) == "User:billing"


def test_a_signed_client_gets_through(pki: Path, broker_port: int) -> None:
    assert check(broker_port, read(pki / "ca.crt"), read(pki / "billing.key"), read(pki / "billing.crt")) \
        == grpc.StatusCode.OK


def test_a_client_without_a_certificate_is_refused(pki: Path, broker_port: int) -> None:
    assert check(broker_port, read(pki / "ca.crt"), None, None) == grpc.StatusCode.UNAVAILABLE


def test_a_certificate_from_another_ca_is_refused(pki: Path, broker_port: int, tmp_path_factory:
                                                  pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("other-ca")
    certs.create_ca(other, cn="intruder-ca")
    certs.issue(other, "billing")
    assert check(broker_port, read(pki / "ca.crt"), read(other / "billing.key"), read(other / "billing.crt")) \
        == grpc.StatusCode.UNAVAILABLE


def test_an_expired_certificate_is_refused(pki: Path, broker_port: int) -> None:
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=30)
    certs.issue(pki, "stale", not_before=past, days=1)
    assert check(broker_port, read(pki / "ca.crt"), read(pki / "stale.key"), read(pki / "stale.crt")) \
        == grpc.StatusCode.UNAVAILABLE


def test_a_server_certificate_for_another_host_is_refused(pki: Path) -> None:
    certs.issue(pki, "elsewhere", hosts=["elsewhere.example"])
    for port in serve(pki, "elsewhere"):
        assert check(port, read(pki / "ca.crt"), read(pki / "billing.key"), read(pki / "billing.crt")) \
            == grpc.StatusCode.UNAVAILABLE


def test_keep_ca_signs_new_certificates_with_the_same_ca(pki: Path, broker_port: int) -> None:
    result = CliRunner().invoke(cli, ["certs", "create", "--out", str(pki), "--keep-ca", "--service", "broker2",
                                      "--client", "billing"])
    assert result.exit_code == 0, result.output
    assert check(broker_port, read(pki / "ca.crt"), read(pki / "billing.key"), read(pki / "billing.crt")) \
        == grpc.StatusCode.OK


def test_bad_names_and_a_missing_ca_are_cli_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["certs", "create", "--out", str(tmp_path), "--client", "../x"])
    assert r.exit_code == 2 and "not a usable certificate name" in r.output
    r = CliRunner().invoke(cli, ["certs", "create", "--out", str(tmp_path / "empty"), "--keep-ca"])
    assert r.exit_code == 1 and "no ca.crt" in r.output
