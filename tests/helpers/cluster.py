"""Test helpers that start REAL processes (brokers, etcd) through the same code as `gregor cluster up`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import os
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Iterator

from gregor.cli.local_cluster import (LocalCluster, Process, _process_dir, _spawn, _wait_ready, start_broker,
                                      start_etcd, stop_process)

__all__ = ["AckedLoad", "LocalCluster", "Process", "broker_process", "etcd_endpoints", "etcd_process",
           "replica_log_bytes", "replica_values", "restart_broker", "restart_coordinator",
           "bounce_coordinator", "running_cluster", "start_controller_with",
           "stop_process", "tear_down", "with_controller_flags"]


@contextlib.contextmanager
def broker_process(data_dir: str, broker_id: int = 0, overrides: dict[str, str] | None = None,
                   port: int = 0) -> Iterator[Process]:
    """A broker subprocess on loopback; killed (SIGKILL if SIGTERM is not enough) on exit."""
    proc = start_broker(str(data_dir), broker_id, overrides=overrides, port=port)
    try:
        yield proc
    finally:
        stop_process(proc, signal.SIGTERM)


@contextlib.contextmanager
def etcd_process(data_dir: str) -> Iterator[Process]:
    proc = start_etcd(str(data_dir))
    try:
        yield proc
    finally:
        stop_process(proc, signal.SIGTERM)


def tear_down(cluster: LocalCluster) -> None:
    """Stop a test cluster even if some of its processes are paused (SIGSTOP) or stuck."""
    for p in cluster.processes:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
    cluster.down()
    for p in cluster.processes:
        stop_process(p, signal.SIGKILL)


@contextlib.contextmanager
def running_cluster(data_dir: str, **kwargs: Any) -> Iterator[LocalCluster]:
    """LocalCluster.up(data_dir, **kwargs), torn down on exit even if processes are paused or were restarted."""
    cluster = LocalCluster.up(data_dir, **kwargs)
    try:
        yield cluster
    finally:
        tear_down(cluster)


def start_controller_with(data_dir: str, controller_id: int, etcd: str, *flags: str,
                          lease_ttl_ms: int = 2000) -> Process:
    """A controller process like local_cluster.start_controller, with extra command-line flags."""
    controller_dir, ready = _process_dir(data_dir, f"controller-{controller_id}")
    log_path = os.path.join(data_dir, "logs", f"controller-{controller_id}.log")
    cmd = [sys.executable, "-m", "gregor.controller", "--controller-id", str(controller_id), "--etcd",
           f"http://{etcd}", "--cluster", "gregor", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
           "--ready-file", ready, "--lease-ttl-ms", str(lease_ttl_ms), *flags]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    return Process("controller", controller_id, proc.pid, info["grpc"], info["metrics"], log_path, controller_dir)


@contextlib.contextmanager
def with_controller_flags(data_dir: str, brokers: int, broker_overrides: dict[str, str],
                          *flags: str) -> Iterator[LocalCluster]:
    """etcd, one controller started with extra command-line flags, and `brokers` brokers; torn down on exit."""
    cluster = LocalCluster(data_dir)
    try:
        etcd = start_etcd(cluster.data_dir)
        cluster.processes.append(etcd)
        cluster.processes.append(start_controller_with(cluster.data_dir, 0, etcd.grpc, *flags))
        for b in range(brokers):
            cluster.processes.append(start_broker(cluster.data_dir, b, overrides=broker_overrides,
                                                  etcd_endpoint=etcd.grpc))
        cluster.save()
        yield cluster
    finally:
        tear_down(cluster)


# -- replication tests under load (H3): restarts, a continuous acks=all producer, on-disk replica logs ----------

def etcd_endpoints(cluster: LocalCluster) -> str:
    """Every etcd member of the cluster as the services take them: host:port[,host:port...]."""
    return ",".join(p.grpc for p in cluster.by_role("etcd"))


def restart_broker(cluster: LocalCluster, victim: Process, overrides: dict[str, str] | None = None,
                   same_port: bool = False) -> Process:
    """Start a (killed) broker again with the same id and data dir; it replaces the old entry in cluster.
    same_port: on its old gRPC port, as a StatefulSet's pod keeps its address (a client that knows only the
    addresses it had may otherwise lose every broker in a rolling restart); else a free one."""
    from gregor.cli.local_cluster import start_broker

    if cluster.tls:  # a --tls cluster's broker comes back with its certificate and SSL:// listener
        overrides = {**cluster.role_props("broker"), "listeners": "SSL://127.0.0.1:0", **(overrides or {})}
    back = start_broker(victim.data_dir.rsplit("/", 1)[0], victim.id, overrides=overrides,
                        etcd_endpoint=cluster.etcd_endpoints,
                        port=int(victim.grpc.rsplit(":", 1)[1]) if same_port else 0)
    cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
    return back


def restart_coordinator(cluster: LocalCluster, victim: Process, lease_ttl_ms: int | None = None,
                        overrides: dict[str, str] | None = None) -> Process:
    """Start a (killed) group/transaction coordinator again with the same id, on the same port (clients
    configured with coordinator.bootstrap.servers keep their address); it replaces the old entry in cluster.
    Its shards come back once the dead process's etcd lease expires (lease_ttl_ms) and it reloads them."""
    from gregor.cli.local_cluster import start_coordinator

    port = int(victim.grpc.rsplit(":", 1)[1])
    back = start_coordinator(cluster.data_dir, victim.id, etcd_endpoints(cluster), lease_ttl_ms=lease_ttl_ms,
                             overrides=overrides, port=port)
    cluster.processes = [p for p in cluster.processes if p.pid != victim.pid] + [back]
    return back


def bounce_coordinator(cluster: LocalCluster, lease_ttl_ms: int | None = None,
                       overrides: dict[str, str] | None = None, which: int = 0) -> Process:
    """SIGKILL one group/transaction coordinator (the which-th by id) and start it again (restart_coordinator)."""
    victim = sorted(cluster.by_role("coordinator"), key=lambda p: p.id)[which]
    stop_process(victim, signal.SIGKILL)
    return restart_coordinator(cluster, victim, lease_ttl_ms=lease_ttl_ms, overrides=overrides)


def replica_log_bytes(broker: Process, topic: str, partition: int) -> list[tuple[str, bytes]]:
    """The segment files of one partition replica on disk: (file name, bytes), in offset order."""
    out = []
    for path in sorted(glob.glob(os.path.join(broker.data_dir, f"{topic}-{partition}", "*.log"))):
        with open(path, "rb") as f:
            out.append((os.path.basename(path), f.read()))
    return out


def replica_values(broker: Process, topic: str, partition: int) -> list[bytes]:
    """Every record value of one partition replica, in offset order, read from its segment files."""
    from tests.helpers.batches import record_values

    return [v for _, data in replica_log_bytes(broker, topic, partition) for v in record_values(data)]


@dataclass
class AckedLoad:
    """A continuous acks=all producer (the gregor SDK) with unique values; it records what was acknowledged.

    Concurrency: one asyncio task (`run`) keeps `window` sends outstanding on the
    test's loop. retries=0, so every value travels in exactly one produce request:
    an acknowledged value must then be in the log exactly once (no idempotence
    needed). A failed send is counted by error name and the slot backs off.
    """

    bootstrap: str
    topic: str
    partitions: int
    window: int = 30  # sends outstanding, spread evenly over the partitions
    props: dict[str, Any] = field(default_factory=dict)
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (partition, offset)
    ack_times: dict[int, list[float]] = field(default_factory=dict)  # partition -> monotonic ack times
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    error_times: list[tuple[float, int, str]] = field(default_factory=list)  # (monotonic, partition, error)
    sent: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        from gregor.client import Producer
        from gregor.common.errors import GregorError

        config = {"bootstrap.servers": self.bootstrap, "acks": "all", "retries": 0, "linger.ms": 2,
                  "request.timeout.ms": 5000, "delivery.timeout.ms": 10000, "max.block.ms": 5000,
                  **self.props}
        producer = Producer(config)
        await producer.start()
        try:
            async def slot(k: int) -> None:
                # Each slot sticks to one partition, so a stalled partition cannot starve the others.
                partition = k % self.partitions
                while not stop.is_set():
                    i = self.sent
                    self.sent += 1
                    value = f"v{i:08d}".encode()
                    try:
                        md = await (await producer.send(self.topic, value, partition=partition))
                    except GregorError as err:
                        self.errors[type(err).__name__] += 1
                        self.error_times.append((time.monotonic(), partition, type(err).__name__))
                        await asyncio.sleep(0.05)
                        continue
                    self.acked[value] = (md.partition, md.offset)
                    self.ack_times.setdefault(md.partition, []).append(time.monotonic())

            await asyncio.gather(*(slot(k) for k in range(self.window)))
        finally:
            await producer.close(5)

    def acked_in(self, partition: int) -> dict[bytes, int]:
        return {v: o for v, (p, o) in self.acked.items() if p == partition}

    def max_stall_s(self, partition: int | None = None, after: float = 0.0, before: float = float("inf")) -> float:
        """The longest gap between consecutive acknowledgements in [after, before) (one partition or all)."""
        times = sorted(t for p, ts in self.ack_times.items() if partition in (None, p) for t in ts
                       if after <= t < before)
        return max((b - a for a, b in zip(times, times[1:])), default=0.0)

    async def check_consumed(self, bootstrap: str, timeout_s: float = 60.0) -> dict[int, int]:
        """Consume every partition from the beginning up to its HW (the SDK consumer, from the leaders).

        Every acknowledged value is there exactly once, at its acknowledged offset, in
        per-partition offset order; returns records consumed per partition.
        """
        from gregor.client import Consumer

        async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False}) as c:
            tps = [(self.topic, p) for p in range(self.partitions)]
            c.assign(tps)
            c.seek_to_beginning(*tps)
            ends = await c.end_offsets(tps)
            got: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(self.partitions)}
            deadline = time.monotonic() + timeout_s
            while any(len(got[tp[1]]) < ends[tp] for tp in tps):
                assert time.monotonic() < deadline, {p: (len(v), ends[(self.topic, p)]) for p, v in got.items()}
                for rec in await c.poll(timeout_ms=500):
                    got[rec.partition].append((rec.offset, rec.value))
        for p, records in got.items():
            offsets = [o for o, _ in records]
            assert offsets == list(range(len(records))), f"p{p}: offsets not contiguous from 0"
            by_offset = dict(records)
            counts = collections.Counter(v for _, v in records)
            for v, o in self.acked_in(p).items():
                assert counts[v] == 1 and by_offset.get(o) == v, f"p{p}: acked {v!r}@{o} consumed {counts[v]} times"
        return {p: len(v) for p, v in got.items()}

    def check_replicas(self, brokers: list[Process]) -> dict[int, int]:
        """Every acknowledged value sits exactly once, at its acknowledged offset, in every given replica.

        `brokers` maps onto each partition's ISR by the caller; returns acked counts per partition.
        Raises AssertionError naming the partition, broker and value otherwise.
        """
        counts = {}
        for partition in range(self.partitions):
            acked = self.acked_in(partition)
            counts[partition] = len(acked)
            for b in brokers:
                values = replica_values(b, self.topic, partition)
                seen = collections.Counter(values)
                missing = [v for v in acked if seen[v] == 0]
                assert not missing, f"p{partition} broker {b.id}: {len(missing)} acked values lost, e.g. {missing[:3]}"
                dups = [v for v in acked if seen[v] > 1]
                assert not dups, f"p{partition} broker {b.id}: acked values twice, e.g. {dups[:3]}"
                moved = [(v, o) for v, o in acked.items() if o >= len(values) or values[o] != v]
                assert not moved, f"p{partition} broker {b.id}: acked values not at their offsets, e.g. {moved[:3]}"
        return counts


async def move_etcd_leader(members: list[Process], to: Process) -> None:
    """Make `to` the raft leader of an etcd cluster (Maintenance.MoveLeader, sent to the current leader)."""
    import grpc
    from aetcd import rpc

    async with grpc.aio.insecure_channel(to.grpc) as ch:
        status = await rpc.MaintenanceStub(ch).Status(rpc.StatusRequest(), timeout=5)
    target_id, leader_id = status.header.member_id, status.leader
    if target_id == leader_id:
        return
    for m in members:
        async with grpc.aio.insecure_channel(m.grpc) as ch:
            s = await rpc.MaintenanceStub(ch).Status(rpc.StatusRequest(), timeout=5)
            if s.header.member_id == leader_id:
                await rpc.MaintenanceStub(ch).MoveLeader(rpc.MoveLeaderRequest(targetID=target_id), timeout=10)
                return
    raise AssertionError(f"etcd leader {leader_id:x} not among the members")


def broker_metric_total(cluster: LocalCluster, sample: str) -> float:
    """The sum over the brokers' /metrics of the samples whose line starts with `sample` (a name with its labels,
    e.g. 'gregor_kafka_requests_total{api="Produce"}')."""
    total = 0.0
    for p in cluster.by_role("broker"):
        with urllib.request.urlopen(p.metrics, timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(sample):
                    total += float(line.split()[-1])
    return total


async def admin_write_succeeds(broker: Process, name: str) -> bool:
    """A CreateTopics of `name` (1 partition, RF 1) through broker succeeded: the controller answers admin writes
    (False on any RPC failure or error code, for polling with until)."""
    import grpc

    from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

    try:
        async with grpc.aio.insecure_channel(broker.grpc) as ch:
            resp = await controller_pb2_grpc.AdminServiceStub(ch).CreateTopics(controller_pb2.CreateTopicsRequest(
                topics=[controller_pb2.CreatableTopic(name=name, num_partitions=1, replication_factor=1)]),
                timeout=5)
    except grpc.aio.AioRpcError:
        return False
    return bool(resp.results[0].error.code == 0)


def kill_all(procs: "list[Process]") -> None:
    """SIGKILL every process, resuming any SIGSTOPped one first (a test's finally)."""
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
        stop_process(p, signal.SIGKILL)
