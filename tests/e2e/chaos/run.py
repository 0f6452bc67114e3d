"""One chaos run: the namespaced cluster, the workload in a client namespace, the seeded faults, healing,
the final read, replica and controller histories, then the checker's verdict.

    python -m tests.e2e.chaos.run --seed 7 --duration 600 --out chaos-out [--counts full|ci|etcd=3,...]
                                  [--every-kind-once] [--kinds kill,...] [--tls]

--tls: mTLS everywhere (topology.py: a CA and per-node certificates, etcd over https with client-certificate
auth, every role with security.protocol=SSL and ssl.client.auth=required, the workload with client.crt via
--client-config). Before the workload starts it probes that TLS is really on (tls_probe) and records the
result in verdict.json's "tls" (plain-text and certificate-less connections refused, mTLS ones accepted).

Prints the seed and the schedule first; writes OUT/history.jsonl, OUT/verdict.json, OUT/summary.txt and
every process log under OUT/cluster/logs. Exit 0 valid, 1 an anomaly, 2 the run itself failed,
3 a missing capability. Everything it creates is removed on exit, Ctrl-C included
(`python -m tests.e2e.chaos.netns` removes what a SIGKILLed run left).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from gregor.chaos import checker
from tests.e2e.chaos.faults import KINDS, MISSING, Nemesis, describe, schedule
from gregor.chaos.history import OK, HistoryWriter
from tests.e2e.chaos.netns import Busy, CapabilityError, acquire_lock, cleanup, ns_name, require_capabilities
from tests.e2e.chaos.topology import CI, FULL, ChaosCluster, Counts
from gregor.chaos.workload import TOPIC, TXN_TOPIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def replica_digests(cluster: ChaosCluster, partitions: int, h: HistoryWriter) -> None:
    """Each replica of the workload's topics read through the native engine (a copy of its directory,
    so recovery on open changes nothing): its log end offset and the sha256 of every batch's bytes.
    broker-0's replicas may live in either of its log dirs."""
    from gregor_native import Log, LogConfig

    for b in cluster.by_role("broker"):
        for topic in (TOPIC, TXN_TOPIC):
            for p in range(partitions):
                dirs = [b.data_dir] + ([cluster.small_dir] if b.id == 0 and cluster.small_dir_mb else [])
                found = [os.path.join(d, f"{topic}-{p}") for d in dirs if os.path.isdir(os.path.join(d, f"{topic}-{p}"))]
                if not found:
                    continue
                src = found[0]
                t0 = time.time()
                with tempfile.TemporaryDirectory() as tmp:
                    copy = os.path.join(tmp, "log")
                    shutil.copytree(src, copy)
                    log = Log(copy, LogConfig())
                    digest = hashlib.sha256()
                    offset, end = log.log_start_offset, log.log_end_offset
                    while offset < end:
                        data = log.read(offset, 1 << 20)
                        if not data:
                            break
                        digest.update(data)
                        from gregor_native import parse_batches

                        offset = parse_batches(data, False)[-1].next_offset
                    h.record(process="final", op="replica", invoke=t0, complete=time.time(), outcome=OK, topic=topic,
                             partition=p, broker=b.id, log_start_offset=log.log_start_offset, log_end_offset=end,
                             digest=digest.hexdigest(), truncated_on_open=log.recovered_bytes_truncated)


def tls_probe(cluster: ChaosCluster) -> dict[str, Any]:
    """Per endpoint kind (the first broker's gRPC and data ports, a controller, a coordinator, a gateway,
    an etcd member): whether a plain-text client, a TLS client without a certificate and an mTLS client
    (client.crt) got through. With TLS on only the last may: {"broker": {"plaintext": False,
    "tls_no_cert": False, "mtls": True}, ...}."""
    import socket
    import ssl
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from gregor.common.tls import TlsConfig
    from tests.e2e.chaos.topology import BROKER_DATA

    assert cluster.security is not None
    full = cluster.client_tls()
    no_cert = TlsConfig.from_properties({k: v for k, v in cluster.client_properties().items()
                                         if k not in ("ssl.keystore.location", "ssl.key.location")})

    def grpc_ok(addr: str, creds: grpc.ChannelCredentials | None) -> bool:
        ch = grpc.secure_channel(addr, creds) if creds is not None else grpc.insecure_channel(addr)
        try:
            grpc.channel_ready_future(ch).result(timeout=4)
            return True
        except grpc.FutureTimeoutError:
            return False
        finally:
            ch.close()

    def socket_ok(addr: str, ctx: ssl.SSLContext | None) -> bool:
        """The data port (Gregor's own framing): a TLS handshake with ctx after which the server neither
        alerts nor closes (it waits for a request). Plain text is not probed here: a port that completes an
        mTLS handshake speaks TLS, so it does not speak plain text."""
        host, port = addr.rsplit(":", 1)
        assert ctx is not None
        try:
            with socket.create_connection((host, int(port)), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname=host) as tls_sock:
                    tls_sock.settimeout(1.5)  # TLS 1.3: a refused client certificate arrives as an alert now
                    try:
                        return tls_sock.recv(1) != b""
                    except socket.timeout:
                        return True  # accepted: the server waits for a request
        except (OSError, ssl.SSLError):
            return False

    def etcd_ok(addr: str, scheme: str, ctx: ssl.SSLContext | None) -> bool:
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if ctx is not None:
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        try:
            with urllib.request.build_opener(*handlers).open(f"{scheme}://{addr}/health", timeout=5) as r:
                return r.status == 200
        except (OSError, ValueError):
            return False

    checks: dict[tuple[str, str], Any] = {}
    for role in ("broker", "controller", "coordinator", "gateway"):
        addr = cluster.by_role(role)[0].addr
        checks[(role, "plaintext")] = lambda addr=addr: grpc_ok(addr, None)
        checks[(role, "tls_no_cert")] = lambda addr=addr: grpc_ok(addr, no_cert.channel_credentials())
        checks[(role, "mtls")] = lambda addr=addr: grpc_ok(addr, full.channel_credentials())
    data = f"{cluster.by_role('broker')[0].ip}:{BROKER_DATA}"
    checks[("broker_data", "tls_no_cert")] = lambda: socket_ok(data, no_cert.client_ssl_context())
    checks[("broker_data", "mtls")] = lambda: socket_ok(data, full.client_ssl_context())
    etcd = cluster.by_role("etcd")[0].addr
    checks[("etcd", "plaintext")] = lambda: etcd_ok(etcd, "http", None)
    checks[("etcd", "tls_no_cert")] = lambda: etcd_ok(etcd, "https", no_cert.client_ssl_context())
    checks[("etcd", "mtls")] = lambda: etcd_ok(etcd, "https", full.client_ssl_context())
    out: dict[str, Any] = {}
    with ThreadPoolExecutor(len(checks)) as pool:  # the refused ones each wait out a timeout
        futures = {key: pool.submit(fn) for key, fn in checks.items()}
        for (what, how), fut in futures.items():
            out.setdefault(what, {})[how] = fut.result()
    return out


def controller_history(cluster: ChaosCluster, h: HistoryWriter) -> int:
    """Every change of `controller` and `controller_epoch` in etcd's history (watched from revision 1), one
    `controller` op per revision: the epoch and holder after that revision."""
    from gregor.common.etcd import EtcdClient

    async def collect() -> list[Any]:
        events: list[Any] = []
        async with EtcdClient(cluster.etcd_endpoints, security=cluster.client_tls()) as etcd:
            prefix = etcd.key("controller")
            it = etcd.watch(prefix, start_revision=1, prefix=True).__aiter__()
            while True:
                try:
                    events.append(await asyncio.wait_for(it.__anext__(), 3))
                except (asyncio.TimeoutError, StopAsyncIteration):
                    break
            await it.aclose()  # type: ignore[attr-defined]
            return [(etcd.relative(e.key), e) for e in events]

    events = asyncio.run(collect())
    epoch: int | None = None
    holder: int | None = None
    version = 0
    by_rev: dict[int, list[Any]] = {}
    for name, e in events:
        by_rev.setdefault(e.mod_revision, []).append((name, e))
    n = 0
    for rev in sorted(by_rev):
        changed = False
        for name, e in by_rev[rev]:
            if name == "controller_epoch" and e.type == "put":
                epoch = int(e.value)
                changed = True
            elif name == "controller":
                if e.type == "put":
                    holder = int(json.loads(e.value)["controller_id"])
                    version = e.version
                else:
                    holder, version = None, 0
                changed = True
        if changed:
            h.record(process="etcd", op="controller", invoke=0.0, complete=0.0, outcome=OK, revision=rev,
                     epoch=epoch, controller=holder, version=version or None)
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A Jepsen-style chaos run of Gregor across network namespaces.")
    ap.add_argument("--seed", type=int, default=None, help="schedule seed (default: random, printed)")
    ap.add_argument("--duration", type=float, default=180, help="seconds of workload under faults")
    ap.add_argument("--out", default="chaos-out")
    ap.add_argument("--counts", default="ci", help="full (the issue's 3/2/3/2/2), ci, or role=n,...")
    ap.add_argument("--every-kind-once", action="store_true", help="each fault kind once (the CI schedule)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--kinds", default="", help="only these fault kinds (comma-separated; default all)")
    ap.add_argument("--tls", action="store_true", help="mTLS everywhere (etcd, every role, the workload)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    counts = FULL if a.counts == "full" else CI if a.counts == "ci" else Counts.parse(a.counts)
    kinds = tuple(k for k in a.kinds.split(",") if k) or KINDS
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    faults = schedule(seed, a.duration, a.every_kind_once, kinds)
    print(f"chaos seed {seed} (re-run: make chaos SEED={seed} DURATION={a.duration:g}{' TLS=1' if a.tls else ''})",
          flush=True)
    print(f"topology {counts}", flush=True)
    print("schedule: " + json.dumps(describe(faults)), flush=True)
    if MISSING:
        print(f"fault kinds not implemented: {MISSING}", flush=True)
    try:
        features = require_capabilities()
    except CapabilityError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 3
    try:
        acquire_lock()  # before anything is created: a second run must not take the first one's namespaces down
    except Busy as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 4
    if not features["netem"]:
        print("note: this kernel has no sch_netem (CONFIG_NET_SCH_NETEM): network-degrade runs netem in user "
              "space (tests/e2e/chaos/netem_user.py, NFQUEUE)", flush=True)

    out = os.path.abspath(a.out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    cluster = ChaosCluster(os.path.join(out, "cluster"), counts, tls=a.tls)
    rf = min(3, counts.brokers)
    cluster.coordinator_overrides = {
        "offsets.topic.replication.factor": str(rf), "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(rf), "transaction.state.log.num.partitions": "4",
        "transaction.state.log.min.isr": str(min(2, rf)),
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
        "transaction.max.timeout.ms": "60000", "group.initial.rebalance.delay.ms": "0"}
    atexit.register(_cleanup_unless_busy)
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    # A handler is not enough: a signal mask is inherited through fork and exec, and a run started with SIGINT
    # blocked (by a parent thread, a CI harness) would leave Ctrl-C pending until the end of the run.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, old)
    workload: subprocess.Popen[bytes] | None = None
    started = time.monotonic()
    try:
        cluster.up()
        print(f"cluster up in {time.monotonic() - started:.1f} s: {cluster.bootstrap}"
              f"{' (mTLS)' if a.tls else ''}", flush=True)
        client_args: list[str] = []
        probe: dict[str, Any] | None = None
        if a.tls:
            probe = tls_probe(cluster)
            print("tls probe: " + json.dumps(probe), flush=True)
            client_config = os.path.join(out, "client.properties")
            with open(client_config, "w") as cf:
                cf.writelines(f"{k}={v}\n" for k, v in cluster.client_properties().items())
            client_args = ["--client-config", client_config]
        hist_workload = os.path.join(out, "workload.jsonl")
        healed = os.path.join(out, "healed")
        wlog = os.path.join(out, "workload.log")
        with open(wlog, "ab") as wl:
            workload = subprocess.Popen(
                ["ip", "netns", "exec", ns_name(cluster.clients[0]), sys.executable, "-m", "gregor.cli.main", "chaos", "workload",
                 "--bootstrap", cluster.bootstrap, "--gateway", cluster.gateways, "--seconds", str(a.duration),
                 "--history", hist_workload, "--healed-file", healed, "--partitions", str(a.partitions),
                 "--replication-factor", str(rf), "--seed", str(seed), *client_args],
                stdout=wl, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
        deadline = time.monotonic() + 180
        while "WORKLOAD STARTED" not in open(wlog, errors="replace").read():
            if workload.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"workload did not start; see {wlog}")
            time.sleep(0.2)
        t_start = time.monotonic()
        nemesis_hist = HistoryWriter(os.path.join(out, "nemesis.jsonl"))
        nemesis = Nemesis(cluster, nemesis_hist, features["netem"])
        for f in faults:
            time.sleep(max(0.0, t_start + f.at - time.monotonic()))
            nemesis.apply(f)
        time.sleep(max(0.0, t_start + a.duration - time.monotonic()))
        nemesis.heal_everything()
        nemesis_hist.record(process="nemesis", op="nemesis", invoke=time.time(), complete=time.time(), outcome=OK,
                            fault="heal-everything", phase="stop", targets=None, partitions=None)
        open(healed, "w").close()
        print("healed; waiting for the final read", flush=True)
        rc = workload.wait(timeout=600)
        if rc != 0:
            raise RuntimeError(f"workload exited with {rc}; see {wlog}")
        # The writers stop first: a gateway's or coordinator's transaction left open without records (begun,
        # partitions added, nothing appended) holds no LSO back, so the final read does not wait for it, and
        # its timeout abort writes markers later; a broker stopped before such a marker would differ from the
        # others for a reason that is the harness's, not replication's. Then followers catch up.
        for role in ("gateway", "coordinator"):
            for p in cluster.by_role(role):
                cluster.kill(p.name, signal.SIGTERM)
        time.sleep(5)
        for b in cluster.by_role("broker"):
            cluster.kill(b.name, signal.SIGTERM)
        replica_digests(cluster, a.partitions, nemesis_hist)
        n = controller_history(cluster, nemesis_hist)
        print(f"{n} controller changes in etcd's history", flush=True)
        nemesis_hist.close()
        history = os.path.join(out, "history.jsonl")
        with open(history, "w") as hf:
            for part in (hist_workload, os.path.join(out, "nemesis.jsonl")):
                with open(part) as pf:
                    shutil.copyfileobj(pf, hf)
        ops = checker.load_history(history)
        verdict = checker.check(ops)
        fired = set(verdict["stats"]["faults"]) - {"heal-everything"}
        verdict["fault_kinds_fired"] = sorted(fired)
        verdict["fault_kinds_missing"] = MISSING
        verdict["seed"] = seed
        verdict["tls"] = probe
        verdict["wall_s"] = round(time.monotonic() - started, 1)
        with open(os.path.join(out, "verdict.json"), "w") as vf:
            json.dump(verdict, vf, indent=2, default=str)
        text = checker.summary(verdict) + f"\nseed {seed}; fault kinds fired: {', '.join(sorted(fired))}"
        with open(os.path.join(out, "summary.txt"), "w") as sf:
            sf.write(text + "\n")
        print(text, flush=True)
        return 0 if verdict["valid"] else 1
    except KeyboardInterrupt:
        print("chaos: interrupted; cleaning up", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the run failed (not the system under test): say why
        print(f"chaos: run failed: {exc!r}", file=sys.stderr)
        return 2
    finally:
        if workload is not None and workload.poll() is None:
            workload.kill()
            workload.wait()
        try:
            cluster.down()
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            leftovers = cleanup()
            if leftovers:
                print(f"removed leftovers: {leftovers}", file=sys.stderr)



def _cleanup_unless_busy() -> None:
    """At exit: what this run left, unless another run took the lock after ours was released (its own then)."""
    try:
        cleanup()
    except Busy:
        pass


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["KINDS", "main"]
