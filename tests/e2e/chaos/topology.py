"""Gregor's processes, each in its own network namespace (netns.py), started with the same flags as
`gregor cluster up` (gregor.cli.local_cluster) but bound to and advertising their namespace address.

Roles and fixed ports (every node has its own address, so ports never clash): etcd 2379/2380,
controller 9090, broker 9092 (data plane 9093), coordinator 9094, gateway 9095. Clients run in
namespaces of their own (`client-<n>`). Every process can be SIGKILLed, paused and restarted with
the same command line; a broker can be restarted with a torn log tail.

With tls=True (`run.py --tls`) everything speaks mTLS, as `gregor cluster up --tls` does: a CA and one
certificate per node (CN = the node's name, its namespace address as the subjectAltName) in DATA/certs, etcd
serving https with client-certificate auth to clients and peers, every Gregor role with the
security.protocol=SSL / ssl.* keys and ssl.client.auth=required, and `client.crt` for the workload and the
orchestrator's own etcd reads (client_properties()).
"""

from __future__ import annotations

import email.utils
import glob
import json
import os
import random
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from gregor.cli.local_cluster import CLIENT_CERT, ClusterTls, etcd_binary
from tests.e2e.chaos.netns import SMALL_FS_MARK, Network, ns_name

READY_TIMEOUT_S = 90.0  # twelve cold Python processes on two shared cores
LEASE_TTL_MS = 3000
ETCD_CLIENT, ETCD_PEER, CONTROLLER, BROKER, BROKER_DATA, COORDINATOR, GATEWAY = (
    2379, 2380, 9090, 9092, 9093, 9094, 9095)


@dataclass(frozen=True)
class Counts:
    etcd: int = 3
    controllers: int = 2
    brokers: int = 3
    coordinators: int = 2
    gateways: int = 2
    clients: int = 1

    @classmethod
    def parse(cls, text: str) -> "Counts":
        """`etcd=3,controllers=2,brokers=3,coordinators=2,gateways=2` (missing keys keep the default)."""
        kw = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            k, _, v = part.partition("=")
            if k not in cls.__dataclass_fields__:
                raise ValueError(f"unknown role {k!r} in counts {text!r}")
            kw[k] = int(v)
        return cls(**kw)


FULL = Counts()  # the issue's topology
# The CI form: two cores shared with other work cannot start and run twelve Python processes quickly;
# one coordinator and one gateway fewer keep every role (and every failover) while saving two.
CI = Counts(etcd=3, controllers=2, brokers=3, coordinators=1, gateways=1)


@dataclass
class Proc:
    """One Gregor (or etcd) process: its node, command line and the running Popen (None while down)."""

    name: str
    role: str
    id: int
    node: str
    ip: str
    port: int
    cmd: list[str]
    log: str
    data_dir: str
    ready: str = ""
    popen: subprocess.Popen[bytes] | None = None
    paused: bool = False
    env: dict[str, str] = field(default_factory=dict)  # extra environment of the running instance

    @property
    def addr(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=1) as r:
            return bool(json.load(r).get("health") == "true")
    except (OSError, ValueError):
        return False


@dataclass
class ChaosCluster:
    """The namespaced cluster of one run. Single owner: the orchestrator thread (the nemesis runs there)."""

    data_dir: str
    counts: Counts
    net: Network = field(default_factory=Network)
    procs: dict[str, Proc] = field(default_factory=dict)
    clients: list[str] = field(default_factory=list)
    coordinator_overrides: dict[str, str] = field(default_factory=dict)
    broker_overrides: dict[str, str] = field(default_factory=dict)
    # broker-0 gets a second log dir on a tmpfs this small (the disk-full fault fills it); 0: none.
    small_dir_mb: int = 48
    tls: bool = False  # mTLS everywhere (the module docstring)
    security: ClusterTls | None = None  # the certificates, made by up() when tls

    # --- lifecycle -----------------------------------------------------------------------------------------

    def up(self) -> None:
        os.makedirs(os.path.join(self.data_dir, "logs"), exist_ok=True)
        self.net.up()
        if self.small_dir_mb:
            self._mount_small_dir()
        c = self.counts
        for role, n in (("etcd", c.etcd), ("controller", c.controllers), ("broker", c.brokers),
                        ("coordinator", c.coordinators), ("gateway", c.gateways), ("client", c.clients)):
            for i in range(n):
                self.net.add(f"{role}-{i}")
        for i in range(c.clients):
            self.clients.append(f"client-{i}")
        if self.tls:
            self._make_certs()
        etcd = [self._etcd_proc(i) for i in range(c.etcd)]
        for p in etcd:
            self._spawn(p)
        for p in etcd:
            self._wait_etcd(p)
        for i in range(c.controllers):
            self._start_new(self._controller_proc(i))
        for i in range(c.brokers):
            self._start_new(self._broker_proc(i))
        for i in range(c.coordinators):
            self._start_new(self._coordinator_proc(i))
        for i in range(c.gateways):
            self._start_new(self._gateway_proc(i))
        self.save()

    def _make_certs(self) -> None:
        """DATA/certs: ca.crt, NODE.crt/.key for every node (its namespace address as SAN) and client.crt."""
        from pathlib import Path

        from gregor.common import certs

        out = Path(self.data_dir, "certs")
        out.mkdir(parents=True, exist_ok=True)
        certs.create_ca(out, cn="gregor-chaos-ca")
        for name, node in self.net.nodes.items():
            certs.issue(out, name, hosts=[node.ip])
        certs.issue(out, CLIENT_CERT, hosts=[n.ip for n in self.net.nodes.values() if n.name.startswith("client-")])
        self.security = ClusterTls(str(out.resolve()))

    def client_properties(self) -> dict[str, str]:
        """The client settings of this cluster (security.protocol and ssl.* with client.crt; empty without TLS)."""
        return self.security.client_props() if self.security else {}

    def client_tls(self) -> Any:
        """The orchestrator's TlsConfig for etcd (client.crt), or None without TLS."""
        return self.security.config() if self.security else None

    def etcdctl_flags(self) -> list[str]:
        """etcdctl's TLS flags (the client certificate), empty without TLS."""
        if self.security is None:
            return []
        s = self.security
        return [f"--cacert={s.path('ca.crt')}", f"--cert={s.path(CLIENT_CERT + '.crt')}",
                f"--key={s.path(CLIENT_CERT + '.key')}"]

    def _props(self, name: str) -> dict[str, str]:
        """The security.protocol / ssl.* keys of process `name` (its node's certificate; empty without TLS)."""
        return self.security.props(name) if self.security else {}

    def down(self) -> None:
        order = {"gateway": 0, "coordinator": 1, "broker": 2, "controller": 3, "etcd": 4}
        for p in sorted(self.procs.values(), key=lambda p: order.get(p.role, 9)):
            self.kill(p.name, signal.SIGKILL)
        self.net.down()  # also unmounts the small log dir

    @property
    def small_dir(self) -> str:
        """broker-0's second log dir, a tmpfs of small_dir_mb (SMALL_FS_MARK in its path for cleanup)."""
        return os.path.join(self.data_dir, f"broker-0-{SMALL_FS_MARK}")

    def _mount_small_dir(self) -> None:
        os.makedirs(self.small_dir, exist_ok=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.small_dir_mb}m", "gregor-chaos",
                              self.small_dir], capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"cannot mount a {self.small_dir_mb} MiB tmpfs for the disk-full fault: "
                               f"{res.stderr.strip()}")

    def save(self) -> None:
        with open(os.path.join(self.data_dir, "topology.json"), "w") as f:
            json.dump({"bootstrap": self.bootstrap, "etcd": self.etcd_endpoints, "gateways": self.gateways,
                       "tls": {"certs": self.security.certs_dir, "client": self.client_properties()}
                       if self.security else None,
                       "nodes": {n: node.ip for n, node in self.net.nodes.items()},
                       "processes": {p.name: {"role": p.role, "addr": p.addr, "pid": p.pid, "log": p.log}
                                     for p in self.procs.values()}}, f, indent=2)

    # --- addresses -----------------------------------------------------------------------------------------

    def by_role(self, role: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == role]

    @property
    def bootstrap(self) -> str:
        return ",".join(p.addr for p in self.by_role("broker"))

    @property
    def etcd_endpoints(self) -> str:
        return ",".join(f"{self.scheme}://{p.addr}" for p in self.by_role("etcd"))

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def gateways(self) -> str:
        return ",".join(p.addr for p in self.by_role("gateway"))

    # --- process control -----------------------------------------------------------------------------------

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.popen is None:
            return
        if p.alive():
            try:
                if p.paused:
                    os.kill(p.popen.pid, signal.SIGCONT)
                os.kill(p.popen.pid, sig)
            except ProcessLookupError:
                pass
            try:
                p.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(p.popen.pid, signal.SIGKILL)
                p.popen.wait()
        if "LD_PRELOAD" in p.env:
            # libfaketime's shared memory outlives a process killed without its exit handlers.
            for leftover in (f"/dev/shm/faketime_shm_{p.popen.pid}", f"/dev/shm/sem.faketime_sem_{p.popen.pid}"):
                if os.path.exists(leftover):
                    os.remove(leftover)
        p.popen = None
        p.paused = False

    def pause(self, name: str) -> None:
        p = self.procs[name]
        if p.alive():
            os.kill(p.popen.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            p.paused = True

    def resume(self, name: str) -> None:
        p = self.procs[name]
        if p.alive() and p.paused:
            os.kill(p.popen.pid, signal.SIGCONT)  # type: ignore[union-attr]
        p.paused = False

    def restart(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start (again) with the same command line; SIGKILL first if it still runs (after a SIGTERM sent
        by the caller, kill() waits for the controlled shutdown to finish)."""
        p = self.procs[name]
        self.kill(name, signal.SIGKILL)
        p.env = dict(env or {})
        if p.role == "etcd":
            self._spawn(p)
            self._wait_etcd(p)
        else:
            self._spawn(p)
            self._wait_ready(p)
        self.save()

    def faketime_file(self, name: str) -> str:
        """The libfaketime offset file of process name (clock-skew)."""
        return os.path.join(self.data_dir, f"faketime-{name}.rc")

    def metrics_url(self, name: str) -> str:
        """Process name's /metrics URL, from the ready file its current instance wrote."""
        with open(self.procs[name].ready) as f:
            return str(json.load(f)["metrics"])

    def http_date(self, url: str) -> int | None:
        """The Date header (whole seconds since the epoch) of a GET of url, by the process's own clock; None
        when it does not answer."""
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if url.startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=self.client_tls().client_ssl_context()))
        try:
            with urllib.request.build_opener(*handlers).open(url, timeout=2) as r:
                r.read()
                date = r.headers.get("Date")
        except OSError:
            return None
        if not date:
            return None
        return int(email.utils.parsedate_to_datetime(date).timestamp())

    def tear_log_tail(self, name: str, rng: random.Random) -> str:
        """With the broker down: cut 1..64 bytes off the end of one partition's newest segment (a write the
        crash interrupted). Returns what it did, for the history."""
        p = self.procs[name]
        assert p.role == "broker" and not p.alive(), "tear the tail of a stopped broker only"
        segments = sorted(path for path in glob.glob(os.path.join(p.data_dir, "*-*", "*.log"))
                          if os.path.getsize(path) > 0 and not os.path.basename(os.path.dirname(path)).startswith("__"))
        if not segments:
            return "no segment to tear"
        # The newest segment of one partition directory, chosen by the seeded generator.
        by_dir: dict[str, str] = {}
        for s in segments:
            by_dir[os.path.dirname(s)] = max(by_dir.get(os.path.dirname(s), s), s)
        path = by_dir[rng.choice(sorted(by_dir))]
        size = os.path.getsize(path)
        cut = min(size, rng.randint(1, 64))
        os.truncate(path, size - cut)
        return f"{os.path.relpath(path, p.data_dir)}: {size} -> {size - cut} bytes"

    # --- internals -----------------------------------------------------------------------------------------

    def _spawn(self, p: Proc) -> None:
        if p.ready and os.path.exists(p.ready):
            os.remove(p.ready)
        with open(p.log, "ab") as out:
            p.popen = subprocess.Popen(["ip", "netns", "exec", ns_name(p.node), *p.cmd], stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, **p.env})
        p.paused = False

    def _start_new(self, p: Proc) -> None:
        self.procs[p.name] = p
        self._spawn(p)
        self._wait_ready(p)

    def _wait_ready(self, p: Proc) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if os.path.exists(p.ready):
                try:
                    with open(p.ready) as f:
                        return dict(json.load(f))
                except ValueError:
                    pass  # written but not yet complete
            if p.popen is not None and p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}: {_tail(p.log)}")
            time.sleep(0.1)
        raise RuntimeError(f"{p.name} not ready within {READY_TIMEOUT_S:.0f} s; see {p.log}")

    def _wait_etcd(self, p: Proc) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        ctx = self.client_tls().client_ssl_context() if self.tls else None
        while not _http_ok(f"{self.scheme}://{p.addr}/health", ctx):
            if p.popen is not None and p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}: {_tail(p.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{p.name} not healthy within {READY_TIMEOUT_S:.0f} s; see {p.log}")
            time.sleep(0.2)

    def _dirs(self, name: str) -> tuple[str, str, str]:
        d = os.path.join(self.data_dir, name)
        os.makedirs(d, exist_ok=True)
        return d, os.path.join(d, "ready.json"), os.path.join(self.data_dir, "logs", f"{name}.log")

    def _etcd_proc(self, i: int) -> Proc:
        name = f"etcd-{i}"
        ip = self.net.nodes[name].ip
        d, _, log = self._dirs(name)
        sc = self.scheme
        initial = ",".join(f"gregor-etcd-{j}={sc}://{self.net.nodes[f'etcd-{j}'].ip}:{ETCD_PEER}"
                           for j in range(self.counts.etcd))
        cmd = [etcd_binary(), "--name", f"gregor-etcd-{i}", "--data-dir", os.path.join(d, "data"),
               "--listen-client-urls", f"{sc}://{ip}:{ETCD_CLIENT}", "--advertise-client-urls", f"{sc}://{ip}:{ETCD_CLIENT}",
               "--listen-peer-urls", f"{sc}://{ip}:{ETCD_PEER}", "--initial-advertise-peer-urls", f"{sc}://{ip}:{ETCD_PEER}",
               "--initial-cluster", initial, "--initial-cluster-state", "new",
               "--initial-cluster-token", f"gregor-chaos-{os.getpid()}", "--log-level", "warn"]
        if self.security is not None:  # https with client-certificate auth to clients and peers (cluster up --tls)
            s = self.security
            cmd += ["--cert-file", s.path(f"{name}.crt"), "--key-file", s.path(f"{name}.key"), "--client-cert-auth",
                    "--trusted-ca-file", s.path("ca.crt"), "--peer-cert-file", s.path(f"{name}.crt"),
                    "--peer-key-file", s.path(f"{name}.key"), "--peer-client-cert-auth",
                    "--peer-trusted-ca-file", s.path("ca.crt")]
        p = Proc(name, "etcd", i, name, ip, ETCD_CLIENT, cmd, log, d)
        self.procs[name] = p
        return p

    def _gregor(self, role: str, i: int, port: int, module: str, args: list[str]) -> Proc:
        name = f"{role}-{i}"
        ip = self.net.nodes[name].ip
        d, ready, log = self._dirs(name)
        cmd = [sys.executable, "-m", module, "--host", ip, "--port", str(port), "--metrics-port", "0",
               "--ready-file", ready, *args]
        return Proc(name, role, i, name, ip, port, cmd, log, d, ready)

    def _controller_proc(self, i: int) -> Proc:
        return self._gregor("controller", i, CONTROLLER, "gregor.controller",
                            ["--controller-id", str(i), "--etcd", self.etcd_endpoints, "--cluster", "gregor",
                             "--lease-ttl-ms", str(LEASE_TTL_MS),
                             *_flags("--override", self._props(f"controller-{i}"))])

    def _broker_proc(self, i: int) -> Proc:
        d = os.path.join(self.data_dir, f"broker-{i}")
        if i == 0 and self.small_dir_mb:
            d += "," + self.small_dir
        overrides = {"broker.session.timeout.ms": str(LEASE_TTL_MS), **self._props(f"broker-{i}"),
                     **self.broker_overrides}
        args = ["--broker-id", str(i), "--log-dirs", d, "--data-port", str(BROKER_DATA), "--etcd",
                self.etcd_endpoints, "--cluster", "gregor"]
        for k, v in overrides.items():
            args += ["--override", f"{k}={v}"]
        return self._gregor("broker", i, BROKER, "gregor.broker", args)

    def _coordinator_proc(self, i: int) -> Proc:
        args = ["--coordinator-id", str(i), "--etcd", self.etcd_endpoints, "--cluster", "gregor",
                "--lease-ttl-ms", str(LEASE_TTL_MS)]
        for k, v in {**self._props(f"coordinator-{i}"), **self.coordinator_overrides}.items():
            args += ["--override", f"{k}={v}"]
        return self._gregor("coordinator", i, COORDINATOR, "gregor.coordinator", args)

    def _gateway_proc(self, i: int) -> Proc:
        return self._gregor("gateway", i, GATEWAY, "gregor.gateway",
                            ["--gateway-id", str(i), "--bootstrap", self.bootstrap,
                             "--producer-property", "enable.idempotence=true", "--producer-property", "acks=all",
                             *_flags("--producer-property", self._props(f"gateway-{i}"))])


def _flags(flag: str, props: dict[str, str]) -> list[str]:
    return [x for k, v in props.items() for x in (flag, f"{k}={v}")]


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"
