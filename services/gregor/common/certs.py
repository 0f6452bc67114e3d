"""Local certificates for mTLS: a CA and the certificates it signs, made with the `cryptography` library.

`gregor certs create` writes, into one directory, `ca.crt` / `ca.key` and for each name `NAME.crt` /
`NAME.key` (PEM; keys unencrypted, mode 0600). Every leaf certificate is good for both TLS server and
client authentication (a broker is a server to clients and a client to other brokers), carries its
host names and addresses as subjectAltNames (hostname verification is on everywhere) and the subject
`CN=NAME` (plus `O=` if given), which `ssl.principal.mapping.rules` turns into the principal
`User:CN=NAME,...` (DEFAULT) or a short name. Keys are ECDSA P-256: fast handshakes, small files.
Concurrency: none (synchronous file writes; run once before the processes start).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DAYS = 365
DEFAULT_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    cert_path: Path
    key_path: Path
    subject: str  # RFC 2253 form, most specific first


def _name(cn: str, org: Optional[str]) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _validity(days: int, not_before: Optional[dt.datetime]) -> tuple[dt.datetime, dt.datetime]:
    start = not_before or dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    return start, start + dt.timedelta(days=days)


def create_ca(out: Path, cn: str = "gregor-ca", org: Optional[str] = None, days: int = 10 * DEFAULT_DAYS,
              prefix: str = "ca") -> Issued:
    """A self-signed CA: out/ca.crt and out/ca.key (an existing CA is replaced)."""
    out.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(cn, org)
    start, end = _validity(days, None)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = out / f"{prefix}.crt", out / f"{prefix}.key"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return Issued(cert_path, key_path, name.rfc4514_string())


def _sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def issue(out: Path, name: str, hosts: Iterable[str] = DEFAULT_HOSTS, org: Optional[str] = None,
          days: int = DEFAULT_DAYS, not_before: Optional[dt.datetime] = None, ca_prefix: str = "ca") -> Issued:
    """out/NAME.crt and out/NAME.key signed by out/ca.crt: CN=NAME, the hosts as SANs, server+client auth.

    not_before/days set the validity window (a window in the past makes an expired certificate)."""
    ca_cert = x509.load_pem_x509_certificate((out / f"{ca_prefix}.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((out / f"{ca_prefix}.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(name, org)
    start, end = _validity(days, not_before)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                            key_encipherment=True, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=False, crl_sign=False, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    sans = _sans(hosts)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = out / f"{name}.crt", out / f"{name}.key"
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return Issued(cert_path, key_path, subject.rfc4514_string())


def subject_of(pem: bytes) -> str:
    """The RFC 2253 subject of a PEM or DER certificate (what ssl.principal.mapping.rules maps)."""
    cert = (x509.load_pem_x509_certificate(pem) if pem.lstrip().startswith(b"-----")
            else x509.load_der_x509_certificate(pem))
    return cert.subject.rfc4514_string()
