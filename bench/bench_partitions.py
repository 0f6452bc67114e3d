"""The partitions curve, Gregor and Apache Kafka side by side in the same run (issue 24, point 1).

`make bench-scaling` runs it after bench_scaling.py; `make bench-scaling QUICK=1` runs only this
quick form (100 and 1,000 partitions, one round). Full form: 100, 1,000, 5,000 and 10,000
partitions, --repeat rounds (3), medians and spread.

Topologies: Gregor as `gregor cluster up --brokers 3 --controllers 2` (etcd, two controllers,
three brokers, with their Kafka listeners); Apache Kafka (bench/kafka_dist.py, KRaft) with three
brokers and three dedicated controllers (a single KRaft controller cannot fail over, so the
failover cell needs a quorum of three; its two standbys cost Kafka idle CPU and RSS, reported per
process so they can be told apart). Every cell uses a fresh cluster; the systems alternate
(round r starts with Gregor when r is even) and the partition counts go up within a round.

Both sides are driven by the SAME client, confluent-kafka (librdkafka) against each system's
Kafka bootstrap (Gregor: cluster.json's kafka_bootstrap). One topic of P partitions, RF 3,
min.insync.replicas=2. Per cell:

- create s: AdminClient.create_topics until its future returns;
- leaders s: from the same start until Metadata shows every partition with a leader;
- write all s: one record to every partition (acks=all), until every delivery report is in;
- idle cores / RSS: CPU seconds per server process over --idle-s seconds (no client traffic), and
  each process's RSS at the end (etcd and controllers counted on Gregor's side);
- produce MB/s: --records records of 1 KiB spread round-robin over every partition, acks=all;
- controller failover s: SIGKILL of the active controller (Gregor: DescribeCluster's controller id;
  Kafka: MetadataQuorumCommand's LeaderId) until a CreateTopics of a 1-partition topic succeeds
  (the new controller answers admin writes) and, separately, until one record reached every
  partition of the big topic again (acks=all);
- broker restart s: SIGTERM of one broker (clean shutdown), relaunch, until Metadata shows it back
  in the ISR of every partition it hosts (time from the SIGTERM); then the same with SIGKILL of
  another broker ("unclean restart ISR s": log recovery included).

Each cell also records the machine's load average (sampled every 5 s: min, median, max) and when
each step started, since the machine may be shared.

Writes bench/results/partitions[_quick].json and .md (--name another name); with --chart
docs/partitions.png. --merge a.json b.json [--chart] runs nothing and draws the table and the chart of
the cells of several runs together (e.g. the QUICK points and a --partitions 5000 10000 run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.common import RESULTS_DIR, write_results  # noqa: E402
from bench.curves_report import chart_path  # noqa: E402
from bench.kafka_dist import KafkaCluster, KafkaDist, ensure_kafka, proc_cpu_seconds, proc_status_kib  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FULL_PARTITIONS = (100, 1_000, 5_000, 10_000)
QUICK_PARTITIONS = (100, 1_000)
RF = 3
MIN_ISR = "2"
RECORD_BYTES = 1024
STEP_TIMEOUT_S = 600.0  # any one measured step; a cell that exceeds it is reported as broken there
QUORUM_COMMAND = "org.apache.kafka.tools.MetadataQuorumCommand"

METRICS = [  # (key, unit, better)
    ("create s", "s", "lower"),
    ("leaders s", "s", "lower"),
    ("write all s", "s", "lower"),
    ("idle cores", "cores", "lower"),
    ("RSS total MiB", "MiB", "lower"),
    ("RSS max broker MiB", "MiB", "lower"),
    ("produce MB/s", "MB/s", "higher"),
    ("failover admin s", "s", "lower"),
    ("failover write all s", "s", "lower"),
    ("restart ISR s", "s", "lower"),
    ("unclean restart ISR s", "s", "lower"),
]


# KEEP_FILES_UNTIL_THE_END: a cell's files are deleted with the run's temporary directory, not when the cell ends.
# On a file system without a journal (this machine's root ext4) the inode allocator skips every inode freed in
# the last dirty_expire interval (30 s), scanning past each one for every new file: the next cell's brokers,
# laying out thousands of new partition directories, paid for the previous cell's deletion (a 5,000-partition
# Gregor cell's brokers used 0.8 to 7.7 s of system time each depending on what had been deleted before; issue 24).


class StepFailed(RuntimeError):
    """A measured step did not complete: the cell stops there and says which step and why."""


def poll(cond: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    start = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise StepFailed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


# ---------------------------------------------------------------- librdkafka helpers (both systems)
def admin_client(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 60000})


# Kafka's KRaft controller writes one user operation as one atomic batch of at most 10,000 metadata
# records (ReplicationControlManager.MAX_RECORDS_PER_USER_OP, hard-coded in 4.4): a CreateTopics of
# one 10,000-partition topic is 10,000 PartitionRecords plus its TopicRecord and ConfigRecord, so it is
# refused ("Unable to perform excessively large batch operation", POLICY_VIOLATION). What a Kafka user
# does then is what this does: create the topic with fewer partitions and add the rest with
# CreatePartitions, each request under the limit. Gregor takes any count in one request.
KAFKA_MAX_RECORDS_PER_USER_OP = 10_000
CHUNK_PARTITIONS = 9_000  # partitions per request when a single request is refused


def create_topic(bootstrap: str, name: str, partitions: int, rf: int, timeout_s: float,
                 requests: Optional[list[str]] = None) -> float:
    """CreateTopics of `name`; if the one request is refused as too large, the topic is created with
    CHUNK_PARTITIONS and grown by CreatePartitions. `requests` gets what was sent (for the results)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin = admin_client(bootstrap)
    log = requests if requests is not None else []
    start = time.monotonic()

    def create(count: int) -> None:
        futures = admin.create_topics([NewTopic(name, count, rf, config={"min.insync.replicas": MIN_ISR})],
                                      request_timeout=timeout_s, operation_timeout=timeout_s)
        futures[name].result(timeout=timeout_s)
        log.append(f"CreateTopics {count}")

    try:
        create(partitions)
    except KafkaException as exc:
        if partitions <= CHUNK_PARTITIONS or "xcessively large" not in str(exc):
            raise
        log.append(f"CreateTopics {partitions} refused: {exc}")
        create(CHUNK_PARTITIONS)
        total = CHUNK_PARTITIONS
        while total < partitions:
            total = min(partitions, total + CHUNK_PARTITIONS)
            futures = admin.create_partitions([NewPartitions(name, total)], request_timeout=timeout_s,
                                              operation_timeout=timeout_s)
            futures[name].result(timeout=timeout_s)
            log.append(f"CreatePartitions to {total}")
    return time.monotonic() - start


def topic_partitions(bootstrap: str, topic: str) -> dict[int, Any]:
    """The topic's partitions in Metadata; {} while the cluster does not answer (polled again)."""
    from confluent_kafka import KafkaException

    admin = admin_client(bootstrap)
    try:
        md = admin.list_topics(topic=topic, timeout=30)
    except KafkaException:
        return {}
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return {}
    return dict(t.partitions)


def all_led(bootstrap: str, topic: str, n: int) -> bool:
    parts = topic_partitions(bootstrap, topic)
    return len(parts) == n and all(p.leader >= 0 for p in parts.values())


def out_of_some_isr(bootstrap: str, topic: str, n: int, broker_id: int) -> bool:
    parts = topic_partitions(bootstrap, topic)
    return len(parts) == n and any(broker_id not in p.isrs for p in parts.values() if broker_id in p.replicas)


def restart_until_back(side: Any, bootstrap: str, topic: str, n: int, broker_id: int, sig: int,
                       detail: dict[str, Any], name: str) -> float:
    """Stop (sig) and relaunch a broker; seconds from the signal until Metadata shows it in every ISR it
    belongs to, after first seeing it out of at least one (up to 120 s). Without that first wait a SIGKILL
    measured nothing on Kafka: its metadata keeps a killed broker in every ISR until the controller
    fences it, so "back in every ISR" held 2 s after the kill."""
    start = time.monotonic()
    detail[name] = side.restart_broker(broker_id, sig)
    try:
        poll(lambda: out_of_some_isr(bootstrap, topic, n, broker_id), 120, f"broker {broker_id} out of an ISR", 0.2)
        detail[name]["left an ISR s"] = round(time.monotonic() - start, 2)
    except StepFailed:
        detail[name]["left an ISR s"] = None  # never seen out (a restart faster than the ISR shrink)
    poll(lambda: back_in_every_isr(bootstrap, topic, n, broker_id), STEP_TIMEOUT_S,
         f"broker {broker_id} back in every ISR", 0.2)
    return time.monotonic() - start


def back_in_every_isr(bootstrap: str, topic: str, n: int, broker_id: int) -> bool:
    parts = topic_partitions(bootstrap, topic)
    return len(parts) == n and all(broker_id in p.isrs for p in parts.values() if broker_id in p.replicas)


def patient_timeouts(budget_s: float) -> dict[str, int]:
    """librdkafka timeouts as long as the step may take. librdkafka sends one ProduceRequest per partition,
    and a Kafka broker serves one request at a time per connection (it mutes the channel until the response
    is sent), so with acks=all 1,000s of partitions queue ~1,000s of requests behind each other per broker;
    at the default request.timeout.ms (30 s) and socket.timeout.ms (60 s, which bounds a request in
    flight) the tail of that queue timed out, was sent again and queued again, and Kafka's 5,000-partition "write all" never finished in 600 s. Waiting instead measures the
    queue once."""
    ms = int(max(30.0, min(budget_s, 900.0)) * 1000)  # request.timeout.ms allows at most 900,000
    return {"message.timeout.ms": ms, "request.timeout.ms": ms, "socket.timeout.ms": min(ms, 300_000)}  # its max


def write_every_partition(bootstrap: str, topic: str, n: int, timeout_s: float) -> float:
    """One record per partition, acks=all; failed deliveries are sent again until all are in."""
    from confluent_kafka import Producer

    start = time.monotonic()
    pending = set(range(n))
    while pending:
        if time.monotonic() - start > timeout_s:
            raise StepFailed(f"write to every partition: {len(pending)} of {n} not written within {timeout_s:.0f} s")
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                             **patient_timeouts(timeout_s - (time.monotonic() - start)),
                             "queue.buffering.max.messages": max(100_000, 2 * n)})
        done: set[int] = set()

        def report(err: Any, msg: Any) -> None:
            if err is None:
                done.add(msg.partition())

        for p in sorted(pending):
            producer.produce(topic, b"x" * 100, partition=p, on_delivery=report)
        producer.flush(timeout_s)
        pending -= done
        if pending:
            time.sleep(0.2)
    return time.monotonic() - start


def produce_spread(bootstrap: str, topic: str, n: int, records: int) -> float:
    """MB/s of `records` 1 KiB values, round-robin over all n partitions, acks=all, librdkafka defaults."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "queue.buffering.max.messages": 1_000_000,
                         **patient_timeouts(STEP_TIMEOUT_S)})
    value = os.urandom(RECORD_BYTES)
    failed = [0]

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failed[0] += 1

    start = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, partition=i % n, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(300)
    elapsed = time.monotonic() - start
    if left or failed[0]:
        raise StepFailed(f"produce: {left} undelivered, {failed[0]} failed of {records}")
    return records * RECORD_BYTES / elapsed / 1e6


def idle(pids: dict[str, int], seconds: float) -> tuple[float, dict[str, float], dict[str, float]]:
    """(total cores, cores per process, RSS MiB per process) over `seconds` with no client traffic."""
    before = {name: proc_cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    cores = {name: (proc_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}
    rss = {name: proc_status_kib(pid, "VmRSS") / 1024 for name, pid in pids.items()}
    return sum(cores.values()), cores, rss


CLEAN_STOP_TIMEOUT_S = 300.0  # a clean shutdown of a broker with 1,000s of replicas may take minutes


def signal_and_wait(pid: int, sig: int, alive: Callable[[], bool]) -> dict[str, Any]:
    """Signal a broker and wait until it exited; SIGKILL only after CLEAN_STOP_TIMEOUT_S (the clusters' own
    stop helpers SIGKILL after 15 s (Gregor) or 30 s (Kafka), which would turn a slow clean restart into an
    unclean one). Returns how long it took and whether it had to be killed."""
    start = time.monotonic()
    os.kill(pid, sig)
    forced = False
    while alive():
        if time.monotonic() - start > CLEAN_STOP_TIMEOUT_S and not forced:
            os.kill(pid, signal.SIGKILL)
            forced = True
        time.sleep(0.05)
    return {"stop s": round(time.monotonic() - start, 2), "forced": forced}


# ---------------------------------------------------------------- the two systems
class GregorCell:
    name = "gregor"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.cluster: Any = None

    def start(self) -> None:
        from gregor.cli.local_cluster import LocalCluster

        self.cluster = LocalCluster.up(str(self.base / f"gregor-{time.monotonic_ns()}"), brokers=3, controllers=2)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.down()
            self.cluster = None  # its files go with the run's temporary directory: see KEEP_FILES_UNTIL_THE_END

    @property
    def bootstrap(self) -> str:
        return str(self.cluster.to_json()["kafka_bootstrap"])

    def keep_logs(self, dest: Path) -> None:
        """The servers' logs of a broken cell, under bench/results/logs/ (gitignored)."""
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(Path(self.cluster.data_dir) / "logs", dest)

    def server_pids(self) -> dict[str, int]:
        return {f"{p.role}-{p.id}": p.pid for p in self.cluster.processes if p.alive()}

    def active_controller(self) -> Any:
        import asyncio

        from gregor.common.rpc import channel
        from gregor.rpc.v1 import controller_pb2, controller_pb2_grpc

        async def ask() -> int:
            async with channel(next(p for p in self.cluster.by_role("controller") if p.alive()).grpc) as ch:
                resp = await controller_pb2_grpc.AdminServiceStub(ch).DescribeCluster(
                    controller_pb2.DescribeClusterRequest(), timeout=10)
            return int(resp.controller_id)

        cid = asyncio.run(ask())
        return next(p for p in self.cluster.by_role("controller") if p.id == cid)

    def kill_active_controller(self) -> None:
        os.kill(self.active_controller().pid, signal.SIGKILL)

    def broker_ids(self) -> list[int]:
        return [p.id for p in self.cluster.by_role("broker")]

    def restart_broker(self, broker_id: int, sig: int = signal.SIGTERM) -> dict[str, Any]:
        from gregor.cli.local_cluster import start_broker

        old = next(p for p in self.cluster.by_role("broker") if p.id == broker_id)
        stopped = signal_and_wait(old.pid, sig, old.alive)
        etcd = ",".join(p.grpc for p in self.cluster.by_role("etcd"))
        port = int(old.kafka.rsplit(":", 1)[1])  # the same Kafka listener port: clients know it
        new = start_broker(self.cluster.data_dir, broker_id, overrides={"listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                           etcd_endpoint=etcd)
        self.cluster.processes[self.cluster.processes.index(old)] = new
        self.cluster.save()
        return stopped


class KafkaCell:
    name = "kafka"

    def __init__(self, dist: KafkaDist, base: Path) -> None:
        self.dist, self.base = dist, base
        self.cluster: Optional[KafkaCluster] = None

    def start(self) -> None:
        self.cluster = KafkaCluster(self.dist, self.base / f"kafka-{time.monotonic_ns()}", brokers=3, controllers=3,
                                    controller_heap="512m")
        self.cluster.start()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None  # its files go with the run's temporary directory: see KEEP_FILES_UNTIL_THE_END

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap

    def keep_logs(self, dest: Path) -> None:
        assert self.cluster is not None
        shutil.rmtree(dest, ignore_errors=True)
        for node in self.cluster.nodes:
            if (node.directory / "logs").is_dir():
                shutil.copytree(node.directory / "logs", dest / f"{node.roles}-{node.node_id}")

    def server_pids(self) -> dict[str, int]:
        assert self.cluster is not None
        return {f"{n.roles}-{n.node_id}": n.proc.pid for n in self.cluster.nodes
                if n.proc is not None and n.proc.poll() is None}

    def kill_active_controller(self) -> None:
        assert self.cluster is not None
        out = self.dist.run(QUORUM_COMMAND, "--bootstrap-server", self.bootstrap, "describe", "--status").stdout
        found = re.search(r"LeaderId:\s+(\d+)", out)
        if found is None:
            raise StepFailed(f"no LeaderId in MetadataQuorumCommand's output:\n{out[-1000:]}")
        leader = int(found.group(1))
        node = next(n for n in self.cluster.nodes if n.node_id == leader)
        self.cluster.stop_node(node, signal.SIGKILL)

    def broker_ids(self) -> list[int]:
        assert self.cluster is not None
        return [n.node_id for n in self.cluster.nodes if "broker" in n.roles]

    def restart_broker(self, broker_id: int, sig: int = signal.SIGTERM) -> dict[str, Any]:
        assert self.cluster is not None
        node = next(n for n in self.cluster.nodes if n.node_id == broker_id)
        proc = node.proc
        assert proc is not None
        stopped = signal_and_wait(proc.pid, sig, lambda: proc.poll() is None)
        self.cluster.start_node(node)
        return stopped


# ---------------------------------------------------------------- one cell
def run_cell(side: Any, partitions: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one system at one partition count on a fresh cluster; `broken` names the step
    that failed (the values before it are kept)."""
    values: dict[str, float] = {}
    detail: dict[str, Any] = {}
    out: dict[str, Any] = {"system": side.name, "partitions": partitions, "values": values, "detail": detail}
    topic = f"p{partitions}"
    step = "start"
    loads: list[float] = []
    stop_sampling = threading.Event()

    def sample_load() -> None:  # the machine is shared: the load average over the whole cell, every 5 s
        while True:
            loads.append(os.getloadavg()[0])
            if stop_sampling.wait(5.0):
                return

    threading.Thread(target=sample_load, name="load-sampler", daemon=True).start()
    cell_start = time.monotonic()
    marks: dict[str, float] = {}
    detail["step start s"] = marks

    def begin(name: str) -> str:
        marks[name] = round(time.monotonic() - cell_start, 1)
        print(f"  {time.strftime('%H:%M:%S')} {side.name} {partitions}: {name} (load {os.getloadavg()[0]:.1f})",
              flush=True)
        return name

    side.start()
    try:
        bootstrap = side.bootstrap
        step = begin("create")
        start = time.monotonic()
        requests: list[str] = []
        detail["create requests"] = requests
        values["create s"] = create_topic(bootstrap, topic, partitions, RF, STEP_TIMEOUT_S, requests)
        step = begin("leaders")
        poll(lambda: all_led(bootstrap, topic, partitions), STEP_TIMEOUT_S, "every partition led", 0.2)
        values["leaders s"] = time.monotonic() - start
        no_writes = getattr(args, "no_writes", False)
        if not no_writes:
            step = begin("write all")
            values["write all s"] = write_every_partition(bootstrap, topic, partitions, STEP_TIMEOUT_S)
        if getattr(args, "failover_only", False):
            step = begin("controller failover")
            run_failover(side, topic, partitions, values, detail)
            return out
        step = begin("idle")
        profilers = profile_idle(side, partitions, args.idle_s) if getattr(args, "profile_idle", False) else []
        cores, per_cores, rss = idle(side.server_pids(), args.idle_s)
        for proc in profilers:
            proc.wait(60)
        values["idle cores"] = cores
        values["RSS total MiB"] = sum(rss.values())
        values["RSS max broker MiB"] = max(v for k, v in rss.items() if k.startswith("broker"))
        detail["idle cores per process"] = per_cores
        detail["RSS MiB per process"] = rss
        if no_writes:  # the server-side cells first: the controller failover's admin clock, then the restarts
            step = begin("controller failover")
            run_failover(side, topic, partitions, values, detail, writes=False)
        else:
            step = begin("produce")
            values["produce MB/s"] = produce_spread(bootstrap, topic, partitions, args.records)
        step = begin("restart broker")
        values["restart ISR s"] = restart_until_back(side, bootstrap, topic, partitions, side.broker_ids()[1],
                                                     signal.SIGTERM, detail, "clean restart stop")
        step = begin("unclean restart broker")
        values["unclean restart ISR s"] = restart_until_back(side, bootstrap, topic, partitions, side.broker_ids()[2],
                                                             signal.SIGKILL, detail, "unclean restart stop")
        if not no_writes:
            step = begin("controller failover")
            run_failover(side, topic, partitions, values, detail)
    except Exception as exc:
        out["broken"] = f"{step}: {exc}"[:2000]
        print(f"  {side.name} {partitions}: broken at {step}: {str(exc)[:300]}", flush=True)
        side.keep_logs(RESULTS_DIR / "logs" / f"partitions-{side.name}-{partitions}")
    finally:
        begin("stop")
        if getattr(args, "keep_logs", False) and "broken" not in out:
            side.keep_logs(RESULTS_DIR / "logs" / f"partitions-{side.name}-{partitions}")
        side.stop()
        stop_sampling.set()
        out["load"] = {"min": min(loads), "median": statistics.median(loads), "max": max(loads),
                       "samples": len(loads)}
        out["wall s"] = time.monotonic() - cell_start
        for k, v in values.items():
            print(f"  {side.name:<6} {partitions:>6}p  {k:<22} {v:10.2f}  (load {os.getloadavg()[0]:.1f})", flush=True)
    return out


def profile_idle(side: Any, partitions: int, seconds: float) -> list[Any]:
    """py-spy record (raw, 20 Hz, --nonblocking) of every Gregor server over the idle window, into
    bench/results/logs/partitions-gregor-<P>/pyspy-<process>.txt: what idle CPU is spent on."""
    import subprocess

    if side.name != "gregor":
        return []
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    dest = RESULTS_DIR / "logs" / f"partitions-gregor-{partitions}-pyspy"
    dest.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, pid in side.server_pids().items():
        if name.startswith("etcd"):
            continue
        procs.append(subprocess.Popen([spy, "record", "--nonblocking", "-r", "20", "-d", str(int(seconds)), "-f", "raw",
                                       "-p", str(pid), "-o", str(dest / f"{name}.txt")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def run_failover(side: Any, topic: str, partitions: int, values: dict[str, float], detail: dict[str, Any],
                 writes: bool = True) -> None:
    """The controller failover cell: SIGKILL the active controller; "failover admin s" until a CreateTopics
    succeeds, "failover write all s" until one record reached every partition of the big topic again."""
    bootstrap = side.bootstrap
    start = time.monotonic()
    side.kill_active_controller()
    killed = time.monotonic()
    detail["failover kill s"] = killed - start  # finding the active controller (Kafka: a JVM tool)

    def admin_write() -> bool:
        try:
            create_topic(bootstrap, f"after-failover-{time.monotonic_ns()}", 1, RF, 30)
            return True
        except Exception:
            return False

    # The two clocks run together from the kill: admin writes in a thread, the data path here.
    admin_s: list[float] = []
    admin_error: list[str] = []

    def admin_loop() -> None:
        try:
            poll(admin_write, STEP_TIMEOUT_S, "CreateTopics after the controller's SIGKILL")
            admin_s.append(time.monotonic() - killed)
        except StepFailed as exc:
            admin_error.append(str(exc))

    thread = threading.Thread(target=admin_loop, name="failover-admin", daemon=True)
    thread.start()
    if writes:
        write_every_partition(bootstrap, topic, partitions, STEP_TIMEOUT_S)
        values["failover write all s"] = time.monotonic() - killed
    thread.join(STEP_TIMEOUT_S + 60)
    if not admin_s:
        raise StepFailed(admin_error[0] if admin_error else "the admin probe did not finish")
    values["failover admin s"] = admin_s[0]


# ---------------------------------------------------------------- report
def medians(cells: list[dict[str, Any]], system: str, partitions: int, key: str) -> tuple[float, float, float]:
    vs = [c["values"][key] for c in cells if c["system"] == system and c["partitions"] == partitions
          and key in c["values"]]
    if not vs:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(vs), min(vs), max(vs)


def table(cells: list[dict[str, Any]], counts: tuple[int, ...]) -> str:
    lines = ["| partitions | metric | Gregor | Kafka | Gregor/Kafka |", "|---:|---|---:|---:|---:|"]
    for p in counts:
        for key, _unit, better in METRICS:
            g, gmin, gmax = medians(cells, "gregor", p, key)
            k, kmin, kmax = medians(cells, "kafka", p, key)
            if g != g and k != k:
                continue

            def fmt(v: float, lo: float, hi: float) -> str:
                if v != v:
                    return "—"
                return f"{v:.2f}" + (f" ({lo:.2f}–{hi:.2f})" if hi > lo else "")

            ratio = f"{g / k:.2f}x" if g == g and k == k and k > 0 else "—"
            lines.append(f"| {p:,} | {key} ({better} is better) | {fmt(g, gmin, gmax)} | {fmt(k, kmin, kmax)} | "
                         f"{ratio} |")
    broken = [f"- {c['system']} at {c['partitions']:,} partitions broke at {c['broken']}" for c in cells
              if c.get("broken")]
    return "\n".join(lines + ([""] + broken if broken else [])) + "\n"


def chart(cells: list[dict[str, Any]], counts: tuple[int, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Only the metrics the cells measured (a --no-writes run has no write, produce or failover-write cells).
    keys = [m for m in METRICS if m[0] not in ("RSS max broker MiB",)
            and any(m[0] in c.get("values", {}) for c in cells)]
    cols = 3
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.2 * rows))
    for ax, (key, unit, better) in zip(axes.flat, keys):
        for system, style in (("gregor", "o-"), ("kafka", "s--")):
            xs = [p for p in counts if medians(cells, system, p, key)[0] == medians(cells, system, p, key)[0]]
            ys = [medians(cells, system, p, key)[0] for p in xs]
            if xs:
                ax.plot(xs, ys, style, label=system)
        ax.set_xscale("log")
        ax.set_title(f"{key} ({better} is better)", fontsize=9)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_xticks(list(counts))
        ax.set_xticklabels([f"{c:,}" for c in counts], fontsize=8)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    fig.suptitle("Partitions at RF 3 on 3 brokers: Gregor vs Apache Kafka (same machine, same librdkafka client)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def save(name: str, params: dict[str, Any], cells: list[dict[str, Any]], counts: tuple[int, ...]) -> str:
    """bench/results/<name>.json and .md; returns the table."""
    write_results(name, params, cells)
    md = table(cells, counts)
    (RESULTS_DIR / f"{name}.md").write_text(md)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 and 1,000 partitions, one round")
    ap.add_argument("--partitions", type=int, nargs="*", help="partition counts (default: by --quick)")
    ap.add_argument("--repeat", type=int, help="rounds (default 3, quick 1)")
    ap.add_argument("--records", type=int, help="records of the produce cell (default 50,000, quick 10,000)")
    ap.add_argument("--idle-s", type=float, help="idle window (default 10 s)", default=10.0)
    ap.add_argument("--systems", nargs="*", default=["gregor", "kafka"], choices=["gregor", "kafka"])
    ap.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT_S,
                    help="seconds any one step may take before the cell is reported broken there (default 600)")
    ap.add_argument("--chart", action="store_true", help="draw docs/partitions.png")
    ap.add_argument("--name", help="results file name under bench/results/ (default partitions[_quick][_partial])")
    ap.add_argument("--failover-only", action="store_true",
                    help="per cell only create, leaders, write all and the controller failover (no idle, produce or "
                         "broker restart); results go to a _partial file")
    ap.add_argument("--no-writes", action="store_true",
                    help="no client writes (no write all, produce or failover write-all clock): create, leaders, idle, "
                         "the controller failover's admin clock, clean and unclean restart; for a system whose "
                         "one-record-per-partition writes do not finish at that count (Kafka 4.4 at 10,000 here)")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep every cell's server logs under bench/results/logs/ (broken cells always keep them)")
    ap.add_argument("--profile-idle", action="store_true",
                    help="py-spy record every Gregor server process over the idle window (raw stacks under "
                         "bench/results/logs/partitions-gregor-<P>-pyspy/); its sampling costs the servers a little")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="run nothing: the table (bench/results/<--name or partitions>.md) and, with --chart, the "
                         "PNG of the cells in these result files together (e.g. a QUICK run and a 5,000/10,000 run)")
    args = ap.parse_args()
    if args.merge:
        merged: list[dict[str, Any]] = []
        for f in args.merge:
            merged += json.loads(Path(f).read_text())["results"]
        all_counts = tuple(sorted({int(c["partitions"]) for c in merged}))
        md = table(merged, all_counts)
        (RESULTS_DIR / f"{args.name or 'partitions'}.md").write_text(md)
        print(md)
        if args.chart:
            path = chart_path(ROOT, RESULTS_DIR, args.name or "partitions", "partitions")
            chart(merged, all_counts, path)
            print(f"chart: {path}")
        return
    globals()["STEP_TIMEOUT_S"] = args.step_timeout
    counts = tuple(args.partitions or (QUICK_PARTITIONS if args.quick else FULL_PARTITIONS))
    repeat = args.repeat or (1 if args.quick else 3)
    args.records = args.records or (10_000 if args.quick else 50_000)
    dist = ensure_kafka() if "kafka" in args.systems else None
    cells: list[dict[str, Any]] = []
    name = "partitions_quick" if args.quick else "partitions"
    if args.partitions or args.systems != ["gregor", "kafka"] or args.failover_only or args.no_writes:
        name += "_partial"  # a chosen subset does not overwrite the standard result files
    name = args.name or name
    params = {"partitions": list(counts), "rounds": repeat, "records": args.records, "idle_s": args.idle_s, "rf": RF,
              "min.insync.replicas": MIN_ISR, "client": "confluent-kafka (librdkafka) on both"}
    with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
        base = Path(tmp)
        for r in range(repeat):
            for p in counts:
                sides: list[Any] = []
                if "gregor" in args.systems:
                    sides.append(GregorCell(base))
                if dist is not None:
                    sides.append(KafkaCell(dist, base))
                if r % 2:
                    sides.reverse()
                for side in sides:
                    print(f"round {r + 1}/{repeat}: {side.name} at {p:,} partitions", flush=True)
                    cell = run_cell(side, p, args)
                    cell["round"] = r
                    cells.append(cell)
                    save(name, params, cells, counts)  # after every cell: a run stopped midway keeps its cells
    print(save(name, params, cells, counts))
    if args.chart:
        path = chart_path(ROOT, RESULTS_DIR, name, "partitions")
        chart(cells, counts, path)
        print(f"chart: {path}")


if __name__ == "__main__":
    main()
