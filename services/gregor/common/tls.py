"""Transport security for every Gregor connection: Kafka's `security.protocol` / `ssl.*` keys turned into
gRPC server and channel credentials and `ssl.SSLContext`s for the asyncio sockets (data port, Kafka listener).

Keys (Kafka's names; PEM files only):

    security.protocol                    PLAINTEXT (default) or SSL
    ssl.truststore.location              PEM file of the CA certificate(s) peers are checked against
    ssl.truststore.type                  PEM (the only type; JKS/PKCS12 are refused with a clear error)
    ssl.keystore.location                PEM file with this process's certificate chain (and, Kafka's
                                         ssl.keystore.type=PEM form, its private key when no ssl.key.location)
    ssl.keystore.type                    PEM (as above)
    ssl.key.location                     PEM file of the private key (unencrypted) when it is a separate file
    ssl.client.auth                      servers: required | requested | none (Kafka's default: none)
    ssl.endpoint.identification.algorithm  https (default): the server's subjectAltNames must name the host
                                         connected to; empty turns the check off (asyncio sockets only: gRPC
                                         always checks, see docs/security.md)
    metrics.security.protocol            the Prometheus /metrics port's: SSL serves it over HTTPS with this
                                         process's certificate; default: security.protocol's value
    metrics.ssl.client.auth              none (default: any scraper that trusts the CA) | requested | required
                                         (the scraper's certificate is verified against ssl.truststore.location)

A process has one default (`configure(...)`, set by each role's `__main__` from its properties): the service
to service channels (controller -> brokers, fetchers -> leaders, coordinators -> brokers, etcd) use it.
Client objects (Producer, Consumer, Admin) carry their own (`from_client_config`), so one process can hold
clients of different clusters. Certificate files are read when a channel or server is made, so replaced
files take effect on the next connection (rotation: replace, then restart processes one at a time).

`peer_subject(context_or_transport)` gives the RFC 2253 subject of the peer's verified certificate from a
gRPC ServicerContext or an asyncio transport/StreamWriter (None without TLS or without a client
certificate); `gregor.common.principal` maps it to a principal.
Concurrency: pure functions and a module-level default set once at start-up; safe from any thread.
"""

from __future__ import annotations

import functools
import logging
import re
import ssl
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import grpc

from gregor.common.errors import InvalidConfigError  # type: ignore[attr-defined]

log = logging.getLogger(__name__)

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
CLIENT_AUTH = ("required", "requested", "none")

# Every key this module reads, with Kafka's defaults (client and server side).
TLS_DEFAULTS: dict[str, str] = {
    "security.protocol": PLAINTEXT,
    "ssl.truststore.location": "",
    "ssl.truststore.type": "PEM",
    "ssl.keystore.location": "",
    "ssl.keystore.type": "PEM",
    "ssl.key.location": "",
    "ssl.client.auth": "none",
    "ssl.endpoint.identification.algorithm": "https",
    "metrics.security.protocol": "",  # empty: follow security.protocol
    "metrics.ssl.client.auth": "none",
}
TLS_KEYS = frozenset(TLS_DEFAULTS)
# The /metrics port's keys (servers only).
METRICS_TLS_KEYS = frozenset({"metrics.security.protocol", "metrics.ssl.client.auth"})
# The keys a client (Producer, Consumer, Admin, CLI --command-config) takes: ssl.client.auth is a server's.
CLIENT_TLS_KEYS = TLS_KEYS - {"ssl.client.auth"} - METRICS_TLS_KEYS


class TlsConfigError(InvalidConfigError):  # type: ignore[misc,valid-type]
    """A security.protocol / ssl.* key is unknown-valued, or a certificate file is missing or unreadable."""


@dataclass(frozen=True)
class TlsConfig:
    """One process's (or one client's) transport security settings."""

    protocol: str = PLAINTEXT
    truststore: str = ""  # ssl.truststore.location
    keystore: str = ""  # ssl.keystore.location
    key: str = ""  # ssl.key.location ("" : the key is in the keystore file)
    client_auth: str = "none"  # ssl.client.auth
    endpoint_identification: str = "https"  # ssl.endpoint.identification.algorithm
    metrics_protocol: str = ""  # metrics.security.protocol ("": as security.protocol)
    metrics_client_auth: str = "none"  # metrics.ssl.client.auth

    @property
    def enabled(self) -> bool:
        return self.protocol == SSL

    @property
    def metrics_tls(self) -> bool:
        """Whether /metrics is served over HTTPS."""
        return (self.metrics_protocol or self.protocol) == SSL

    @property
    def metrics_scheme(self) -> str:
        return "https" if self.metrics_tls else "http"

    def metrics_server_args(self) -> dict[str, Any]:
        """prometheus_client.start_http_server's TLS arguments for /metrics (empty: plain HTTP)."""
        if not self.metrics_tls:
            return {}
        if not self.keystore:
            raise TlsConfigError("metrics.security.protocol=SSL needs ssl.keystore.location (the certificate "
                                 "/metrics is served with)")
        args: dict[str, Any] = {"certfile": self.keystore, "keyfile": self.key or None,
                                "tls_min_version": ssl.TLSVersion.TLSv1_2}
        if self.metrics_client_auth != "none":
            args["client_cafile"] = self.truststore
            args["client_auth_required"] = self.metrics_client_auth == "required"
        return args

    @classmethod
    def from_properties(cls, props: Mapping[str, Any]) -> "TlsConfig":
        """The TLS keys of `props` (others ignored); bad values raise TlsConfigError naming the key."""
        raw = {k: str(props.get(k, d) if props.get(k) is not None else d) for k, d in TLS_DEFAULTS.items()}
        protocol = raw["security.protocol"].strip().upper()
        if protocol not in (PLAINTEXT, SSL):
            raise TlsConfigError(f"Invalid value {raw['security.protocol']!r} for configuration security.protocol: "
                                 f"PLAINTEXT or SSL (SASL is not supported)")
        for key in ("ssl.truststore.type", "ssl.keystore.type"):
            if raw[key].strip().upper() != "PEM":
                raise TlsConfigError(f"Invalid value {raw[key]!r} for configuration {key}: only PEM files are "
                                     f"supported (convert a JKS/PKCS12 store with openssl or keytool)")
        client_auth = raw["ssl.client.auth"].strip().lower()
        if client_auth not in CLIENT_AUTH:
            raise TlsConfigError(f"Invalid value {raw['ssl.client.auth']!r} for configuration ssl.client.auth: "
                                 f"one of {list(CLIENT_AUTH)}")
        algorithm = raw["ssl.endpoint.identification.algorithm"].strip().lower()
        if algorithm not in ("https", ""):
            raise TlsConfigError(f"Invalid value {algorithm!r} for configuration "
                                 f"ssl.endpoint.identification.algorithm: https or empty")
        metrics_protocol = raw["metrics.security.protocol"].strip().upper()
        if metrics_protocol not in ("", PLAINTEXT, SSL):
            raise TlsConfigError(f"Invalid value {raw['metrics.security.protocol']!r} for configuration "
                                 f"metrics.security.protocol: PLAINTEXT or SSL")
        metrics_client_auth = raw["metrics.ssl.client.auth"].strip().lower()
        if metrics_client_auth not in CLIENT_AUTH:
            raise TlsConfigError(f"Invalid value {raw['metrics.ssl.client.auth']!r} for configuration "
                                 f"metrics.ssl.client.auth: one of {list(CLIENT_AUTH)}")
        cfg = cls(protocol, raw["ssl.truststore.location"].strip(), raw["ssl.keystore.location"].strip(),
                  raw["ssl.key.location"].strip(), client_auth, algorithm, metrics_protocol, metrics_client_auth)
        if cfg.metrics_tls and not cfg.truststore and metrics_client_auth != "none":
            raise TlsConfigError("metrics.ssl.client.auth needs ssl.truststore.location (the CA scrapers are "
                                 "checked against)")
        if cfg.enabled and not cfg.truststore:
            raise TlsConfigError("security.protocol=SSL needs ssl.truststore.location (the CA's PEM file)")
        if cfg.key and not cfg.keystore:
            raise TlsConfigError("ssl.key.location is set but ssl.keystore.location (the certificate) is not")
        return cfg

    def to_properties(self) -> dict[str, str]:
        """The keys that give this config back (only those that differ from the defaults)."""
        out = {"security.protocol": self.protocol, "ssl.truststore.location": self.truststore,
               "ssl.keystore.location": self.keystore, "ssl.key.location": self.key,
               "ssl.client.auth": self.client_auth,
               "ssl.endpoint.identification.algorithm": self.endpoint_identification,
               "metrics.security.protocol": self.metrics_protocol,
               "metrics.ssl.client.auth": self.metrics_client_auth}
        return {k: v for k, v in out.items() if v != TLS_DEFAULTS[k]}

    # -- files --------------------------------------------------------------------------------------------

    def _read(self, path: str, what: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise TlsConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None

    def ca_pem(self) -> bytes:
        return self._read(self.truststore, "ssl.truststore.location")

    def key_pair(self) -> Optional[tuple[bytes, bytes]]:
        """(private key, certificate chain) PEM, or None without a keystore."""
        if not self.keystore:
            return None
        chain = self._read(self.keystore, "ssl.keystore.location")
        key = self._read(self.key, "ssl.key.location") if self.key else chain
        if b"PRIVATE KEY-----" not in key:
            where = "ssl.key.location" if self.key else "ssl.keystore.location (no ssl.key.location given)"
            raise TlsConfigError(f"no PEM private key in {where}")
        if not self.key:  # Kafka's PEM keystore: key and chain in one file
            key = b"".join(_pem_blocks(chain, rb"[A-Z ]*PRIVATE KEY"))
            chain = b"".join(_pem_blocks(chain, rb"CERTIFICATE"))
        return key, chain

    # -- gRPC -----------------------------------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        pair = self.key_pair()
        if pair is None:
            raise TlsConfigError("security.protocol=SSL on a server needs ssl.keystore.location (its certificate)")
        # gRPC offers "require and verify" or "do not ask": Kafka's `requested` (ask, verify if given) is
        # served as `required` on gRPC ports, the stricter of the two (docs/security.md).
        require = self.client_auth in ("required", "requested")
        return grpc.ssl_server_credentials([pair], root_certificates=self.ca_pem(), require_client_auth=require)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        pair = self.key_pair()
        key, chain = pair if pair is not None else (None, None)
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem(), private_key=key,
                                            certificate_chain=chain)

    # -- asyncio sockets ------------------------------------------------------------------------------------

    def server_ssl_context(self) -> ssl.SSLContext:
        """For asyncio.start_server: this process's certificate, peers verified per ssl.client.auth."""
        if not self.keystore:
            raise TlsConfigError("security.protocol=SSL on a server needs ssl.keystore.location (its certificate)")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.truststore)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(ctx)
        ctx.verify_mode = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL,
                           "none": ssl.CERT_NONE}[self.client_auth]
        return ctx

    def client_ssl_context(self) -> ssl.SSLContext:
        """For asyncio.open_connection: the server verified against the truststore (and its SANs unless
        ssl.endpoint.identification.algorithm is empty); this process's certificate presented if it has one."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.truststore)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load ssl.truststore.location {self.truststore}: {exc}") from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.endpoint_identification == "https"
        if self.keystore:
            self._load_chain(ctx)
        return ctx

    def _load_chain(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(self.keystore, self.key or None)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"cannot load ssl.keystore.location {self.keystore}"
                                 f"{' / ssl.key.location ' + self.key if self.key else ''}: {exc}") from None


def _pem_blocks(data: bytes, kind: bytes) -> list[bytes]:
    """The PEM blocks of `data` whose label matches the regex `kind`, each ending with a newline."""
    pattern = rb"-----BEGIN (" + kind + rb")-----.*?-----END \1-----"
    return [m.group(0) + b"\n" for m in re.finditer(pattern, data, re.S)]


def split_properties(props: Mapping[str, str]) -> tuple[TlsConfig, dict[str, str]]:
    """A role's properties as (its TLS config, the other keys) so each role's own key check stays as it is."""
    return TlsConfig.from_properties(props), {k: v for k, v in props.items() if k not in TLS_KEYS}


def from_client_config(cfg: Mapping[str, Any]) -> Optional[TlsConfig]:
    """A client's TLS config from its (validated) config; None when it sets none of the keys (the process
    default applies then)."""
    if not any(cfg.get(k) not in (None, TLS_DEFAULTS[k]) for k in CLIENT_TLS_KEYS):
        return None
    return TlsConfig.from_properties({k: cfg[k] for k in CLIENT_TLS_KEYS if cfg.get(k) is not None})


# -- the process default ------------------------------------------------------------------------------------

_default = TlsConfig()


def configure(config: TlsConfig) -> None:
    """Set the process's TLS config (each role's __main__, the CLI's --command-config)."""
    global _default
    _default = config
    if config.enabled and config.endpoint_identification == "":
        log.warning("ssl.endpoint.identification.algorithm is empty: hostname checks are off on the data port "
                    "and Kafka connections; gRPC channels still check the server's subjectAltNames")


def default() -> TlsConfig:
    return _default


def effective(config: Optional[TlsConfig]) -> TlsConfig:
    return _default if config is None else config


# -- wiring helpers -------------------------------------------------------------------------------------------

def add_port(server: grpc.aio.Server, address: str, config: Optional[TlsConfig] = None) -> int:
    """Bind a gRPC server port, with TLS when security.protocol=SSL (the plain-text port is then not opened)."""
    cfg = effective(config)
    if cfg.enabled:
        return server.add_secure_port(address, cfg.server_credentials())
    return server.add_insecure_port(address)


def channel(target: str, options: Any, config: Optional[TlsConfig] = None) -> grpc.aio.Channel:
    """A grpc.aio channel to host:port, TLS per `config` (or the process default)."""
    cfg = effective(config)
    if cfg.enabled:
        return grpc.aio.secure_channel(target, cfg.channel_credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


def server_ssl(config: Optional[TlsConfig] = None) -> Optional[ssl.SSLContext]:
    cfg = effective(config)
    return cfg.server_ssl_context() if cfg.enabled else None


def client_ssl(config: Optional[TlsConfig] = None) -> Optional[ssl.SSLContext]:
    cfg = effective(config)
    return cfg.client_ssl_context() if cfg.enabled else None


# -- the peer's identity --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1024)
def _subject(cert: bytes) -> str:
    from gregor.common.certs import subject_of

    return subject_of(cert)


def peer_subject(context_or_transport: Any) -> Optional[str]:
    """The RFC 2253 subject (`CN=billing,O=Example`) of the peer's verified TLS certificate, or None.

    Takes a grpc(.aio) ServicerContext (its auth_context) or an asyncio transport / StreamWriter (its
    ssl_object). None on a plain-text connection or when the client sent no certificate; the authorizer
    then uses User:ANONYMOUS. Parsed certificates are cached, so calling it per request is cheap.
    """
    auth_context = getattr(context_or_transport, "auth_context", None)
    if callable(auth_context):
        props = auth_context() or {}
        pems = props.get("x509_pem_cert")
        return _subject(bytes(pems[0])) if pems else None
    get_extra = getattr(context_or_transport, "get_extra_info", None)
    if callable(get_extra):
        ssl_object = get_extra("ssl_object")
        if ssl_object is None:
            return None
        der = ssl_object.getpeercert(binary_form=True)
        return _subject(der) if der else None
    raise TypeError(f"peer_subject takes a grpc ServicerContext or an asyncio transport, "
                    f"not {type(context_or_transport).__name__}")
