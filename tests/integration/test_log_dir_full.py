"""Issue 21's disk-full fault, proven with real brokers: a log dir on a small tmpfs filled to ENOSPC.

1. One broker has a normal log dir and the small one, a topic in each (new logs go to the dir with the
fewest partitions, the first dir on a tie). Once the tmpfs is full, a produce to the partition there is
answered KAFKA_STORAGE_ERROR naming the dir and ENOSPC (on gRPC and on the Kafka listener), not left to
time out; the other dir keeps taking writes; gregor_log_dir_offline says which dir is offline; every
acknowledged record reads back at its offset with no gap; and once the filler is removed the same
partition takes writes again and the gauge clears. The SDK, which retries the retriable error until
delivery.timeout.ms as Kafka's producer does, names it in its timeout.
2. The native engine's failed multi-batch append leaves what fit past the log end it tracks; the broker cuts
it at once and reopens the log before the dir takes writes again (byte-clean on disk).
3. A follower whose replica is in the filled dir goes offline once, stops fetching for it (no retry loop),
leaves the ISR, and rejoins it byte-identical once space returns.
4. A leader whose replica is in the filled dir notifies the controller (log_dir_event_notification): the
controller learns from its LeaderAndIsr answer (KAFKA_STORAGE_ERROR) that the replica is offline and elects
another ISR member, so acks=all produce goes on with nothing acknowledged lost, Metadata lists the replica as
offline; once space returns the broker notifies again and the replica rejoins the ISR as a follower.
5. The same with the controller frozen while the dir fills: the next controller's failover learns of the offline
replica from the broker's LeaderAndIsr answer (the pending notification is deleted, as Kafka's failover does).
Needs root (mount), as CI runs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from confluent_kafka import KafkaError, Producer as KafkaProducer

from gregor.client.producer import Producer
from gregor.cli.local_cluster import Process, _process_dir, _spawn, _wait_ready, stop_process
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from tests.helpers.batches import make_batch, record_values, split_batches
from tests.helpers.wait import until
from tests.integration.test_broker import create_topic

SMALL_MB = 8
# Long enough that a produce the broker left hanging fails as DEADLINE_EXCEEDED instead of an answer.
REQUEST_TIMEOUT_S = 30.0
VALUE = b"v" * 1000
# Sends a full dir may still take (the tmpfs pages its files already hold) before it answers an error.
MAX_SENDS_AFTER_FULL = 400


def fill(path: str) -> int:
    """Write zeros to path until ENOSPC; returns the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 4096):
            while True:
                try:
                    written += f.write(b"\0" * size)
                except OSError:
                    break
    return written


def metric_value(proc: Process, name: str, labels: str = "") -> float | None:
    with urllib.request.urlopen(proc.metrics, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + (labels or " ")):
                return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def small_dir(tmp_path) -> Iterator[str]:
    d = str(tmp_path / "small")
    os.makedirs(d)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_MB}m", "gregor-test", d],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"mounting a tmpfs needs root (CI runs as root): {res.stderr.strip()}"
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], capture_output=True)


def spawn_broker(data: str, broker_id: int, log_dirs: list[str], etcd: str | None = None,
                 overrides: dict[str, str] | None = None) -> Process:
    """A broker process like local_cluster.start_broker, with several log dirs; its Process's data_dir is the
    first of them (where its first replica goes)."""
    broker_dir, ready = _process_dir(data, f"broker-{broker_id}")
    log_path = os.path.join(data, "logs", f"broker-{broker_id}.log")
    cmd = [sys.executable, "-m", "gregor.broker", "--broker-id", str(broker_id), "--log-dirs",
           ",".join(d if d else broker_dir for d in log_dirs), "--host", "127.0.0.1", "--port", "0",
           "--data-port", "0", "--metrics-port", "0", "--ready-file", ready]
    if etcd:
        cmd += ["--etcd", etcd, "--cluster", "gregor"]
    for k, v in {"listeners": "PLAINTEXT://127.0.0.1:0", **(overrides or {})}.items():
        cmd += ["--override", f"{k}={v}"]
    proc = _spawn(cmd, log_path)
    info = _wait_ready(proc, ready, log_path)
    return Process("broker", broker_id, proc.pid, info["grpc"], info["metrics"], log_path, log_dirs[0] or broker_dir,
                   data=info["data"], kafka=info.get("kafka", ""))


@pytest.fixture
def broker(tmp_path, small_dir: str) -> Iterator[Process]:
    """A standalone broker with log.dirs = <normal dir>,<the tmpfs> ("" is its own data dir)."""
    p = spawn_broker(str(tmp_path / "data"), 0, ["", small_dir])
    try:
        yield p
    finally:
        stop_process(p, signal.SIGTERM)


async def produce(stub: broker_pb2_grpc.BrokerServiceStub, topic: str, value: bytes) -> int:
    """The base offset of one acks=1 record; raises the broker's error as a GregorError."""
    try:
        resp = await stub.Produce(broker_pb2.ProduceRequest(topic=topic, partition=0, records=make_batch([value]),
                                                            acks=1, timeout_ms=5000), timeout=REQUEST_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        raise errors.from_rpc_error(exc) from exc
    return int(resp.base_offset)


async def read_all(stub: broker_pb2_grpc.BrokerServiceStub, topic: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of the partition, from 0 to its high watermark."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        resp = await stub.Fetch(broker_pb2.FetchRequest(topic=topic, partition=0, fetch_offset=offset,
                                                        max_bytes=1 << 20), timeout=REQUEST_TIMEOUT_S)
        if not resp.records:
            assert offset == resp.high_watermark, (offset, resp.high_watermark)
            return out
        for h, raw in split_batches(resp.records):
            values = record_values(raw)
            out += [(h.base_offset + i, v) for i, v in enumerate(values)]
            offset = h.base_offset + h.records_count


async def test_a_full_log_dir_fails_its_partitions_cleanly_and_recovers(broker: Process, small_dir: str) -> None:
    await create_topic(broker.grpc, "on-disk")  # fewest partitions, first on a tie: the normal dir
    await create_topic(broker.grpc, "on-tmpfs")
    assert sorted(os.listdir(small_dir)) == [".lock", "on-tmpfs-0"], os.listdir(small_dir)  # .lock: the broker's
    small = os.path.normpath(small_dir)
    async with channel(broker.grpc) as ch:
        stub = broker_pb2_grpc.BrokerServiceStub(ch)
        acked: dict[int, bytes] = {}
        for i in range(20):
            value = b"before-%d-" % i + VALUE
            acked[await produce(stub, "on-tmpfs", value)] = value
        assert metric_value(broker, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 0.0

        filler = os.path.join(small_dir, "filler")
        assert fill(filler) > 0
        storage_error: errors.GregorError | None = None
        for i in range(MAX_SENDS_AFTER_FULL):
            value = b"full-%d-" % i + VALUE
            try:
                acked[await produce(stub, "on-tmpfs", value)] = value
            except errors.GregorError as err:
                storage_error = err
                break
        assert storage_error is not None, f"{MAX_SENDS_AFTER_FULL} sends into a full dir all succeeded"
        assert storage_error.code == errors.Code.KAFKA_STORAGE_ERROR, storage_error
        assert small in str(storage_error) and "ENOSPC" in str(storage_error), storage_error
        # The dir is offline now: refused up front, the same way, however often asked.
        for _ in range(3):
            with pytest.raises(errors.GregorError) as again:
                await produce(stub, "on-tmpfs", b"refused")
            assert again.value.code == errors.Code.KAFKA_STORAGE_ERROR and small in str(again.value)
        # The other dir keeps serving.
        other = [await produce(stub, "on-disk", b"other-%d" % i) for i in range(50)]
        assert other == list(range(50))
        assert metric_value(broker, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 1.0
        assert metric_value(broker, "gregor_broker_offline_log_directories") == 1.0
        # Reads of the offline dir's data keep working, and nothing acknowledged is missing or moved.
        read = await read_all(stub, "on-tmpfs")
        assert [o for o, _ in read] == list(range(len(read)))
        assert {o: v for o, v in read if o in acked} == acked

        # The Kafka listener answers the same (librdkafka with retries off reports the broker's error).
        assert broker.kafka, "the Kafka listener is on"
        kp = KafkaProducer({"bootstrap.servers": broker.kafka, "message.send.max.retries": 0,
                            "enable.idempotence": False, "acks": 1, "message.timeout.ms": 30000})
        reports: list[KafkaError | None] = []
        kp.produce("on-tmpfs", b"via-kafka", partition=0, on_delivery=lambda err, _msg: reports.append(err))
        kp.produce("on-disk", b"via-kafka", partition=0, on_delivery=lambda err, _msg: reports.append(err))
        assert kp.flush(REQUEST_TIMEOUT_S) == 0
        by_code = sorted((e.code() if e is not None else 0) for e in reports)
        assert by_code == [0, KafkaError.KAFKA_STORAGE_ERROR], reports

        # The SDK retries the retriable KAFKA_STORAGE_ERROR until delivery.timeout.ms, as Kafka's producer does;
        # the timeout's message says what the attempts failed with.
        async with Producer({"bootstrap.servers": broker.grpc, "linger.ms": 0, "request.timeout.ms": 1000,
                             "delivery.timeout.ms": 1500}) as sdk:
            with pytest.raises(errors.GregorError) as expired:
                await sdk.send_and_wait("on-tmpfs", b"via-sdk", partition=0)
        assert expired.value.code == errors.Code.REQUEST_TIMED_OUT, expired.value
        assert "KAFKA_STORAGE_ERROR" in str(expired.value) and "ENOSPC" in str(expired.value), expired.value

        os.remove(filler)

        async def takes_writes() -> bool:
            try:
                acked[await produce(stub, "on-tmpfs", b"after-" + VALUE)] = b"after-" + VALUE
                return True
            except errors.GregorError as err:
                assert err.code == errors.Code.KAFKA_STORAGE_ERROR, err
                return False

        await until(takes_writes, 30, "the partition takes writes again once space returns")
        assert metric_value(broker, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 0.0
        assert metric_value(broker, "gregor_broker_offline_log_directories") == 0.0
        for i in range(20):
            value = b"again-%d-" % i + VALUE
            acked[await produce(stub, "on-tmpfs", value)] = value
        read = await read_all(stub, "on-tmpfs")
        assert [o for o, _ in read] == list(range(len(read)))
        assert {o: v for o, v in read if o in acked} == acked
        assert max(acked) == len(read) - 1
    log_text = open(broker.log).read()
    assert log_text.count(f"log dir {small} is offline") == 1, log_text[-3000:]
    assert log_text.count(f"log dir {small} is online again") == 1, log_text[-3000:]


@contextlib.contextmanager
def leader_on_tiny_tmpfs(tmp_path: Any, overrides: dict[str, str]) -> Iterator[tuple[Any, Any, str]]:
    """(log manager, standalone leader of t-0 with the topic overrides, dir) on a fresh 1 MiB tmpfs."""
    from gregor.broker.log_manager import LogManager
    from gregor.broker.replica_manager import ReplicaManager
    from gregor.common.config import BrokerConfig

    d = str(tmp_path / "tiny")
    os.makedirs(d)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "gregor-test", d], capture_output=True, text=True)
    assert res.returncode == 0, f"mounting a tmpfs needs root (CI runs as root): {res.stderr.strip()}"
    manager = LogManager(BrokerConfig(log_dirs=d))
    try:
        p = ReplicaManager(manager.config, manager).create_partition("t", 0, overrides)
        p.make_standalone_leader()
        yield manager, p, d
    finally:
        manager.close()
        subprocess.run(["umount", "-l", d], capture_output=True)


@pytest.mark.parametrize("batches", [20, 600])
async def test_a_failed_append_leaves_no_torn_batch_on_disk(tmp_path, batches: int) -> None:
    """The engine's pwritev of a multi-batch append into a full file system writes what fits past the log end
    it tracks (whole batches with their offsets among it); a crash's recovery would take those back although
    their produce failed. The engine cuts the file back to the tracked end at once (native Segment::append for
    20 batches, the streamed leader append for 600, over its 512 KiB threshold), and the broker reopens the log
    (full recovery, cut back to its end) before the dir takes writes again: the log is exactly what was
    acknowledged."""
    with leader_on_tiny_tmpfs(tmp_path, {}) as (manager, p, d):
        p.append_records_to_leader(make_batch([b"acked"]), 1)
        acked_size = p.log.segments()[-1].size_bytes
        filler = os.path.join(d, "filler")
        fill(filler)
        many = b"".join(make_batch([b"%03d" % i + VALUE]) for i in range(batches))
        with pytest.raises(errors.GregorError) as failed:
            p.append_records_to_leader(many, 1)
        assert failed.value.code == errors.Code.KAFKA_STORAGE_ERROR and "ENOSPC" in str(failed.value)
        seg = p.log.segments()[-1]
        assert (p.log.log_end_offset, seg.size_bytes) == (1, acked_size)
        assert os.path.getsize(seg.log_path) == acked_size  # nothing past the tracked end: a crash recovers this
        with pytest.raises(errors.GregorError):  # offline: refused before any write
            p.append_records_to_leader(make_batch([b"refused"]), 1)
        assert not await manager.try_recover_dir(os.path.normpath(d))  # still full
        os.remove(filler)
        assert await manager.try_recover_dir(os.path.normpath(d))
        assert p.log is manager.logs[("t", 0)]  # the Partition serves the reopened log
        info, _ = p.append_records_to_leader(make_batch([b"after"]), 1)
        assert info.first_offset == 1
        assert record_values(bytes(p.read_slice(0, 1 << 20, True).read())) == [b"acked", b"after"]


async def test_a_failed_append_that_would_span_a_roll_leaves_none_of_its_batches(tmp_path) -> None:
    """An append that fits a segment but not what is left of the active one goes whole into a new segment
    (Kafka's maybeRoll), in one write. Split at the roll, as the engine used to, its first share landed in
    the active segment while the second share's write hit ENOSPC: the produce failed, yet those records
    stayed counted and readable (and a retry appended them again)."""
    with leader_on_tiny_tmpfs(tmp_path, {"segment.bytes": str(16 * 1024)}) as (manager, p, d):
        for i in range(10):  # ~10.6 KB of the 16 KiB segment
            p.append_records_to_leader(make_batch([b"acked-%d-" % i + VALUE]), 1)
        filler = os.path.join(d, "filler")
        fill(filler)
        os.truncate(filler, os.path.getsize(filler) - 8192)  # two free pages: less than the append needs
        twelve = b"".join(make_batch([b"%03d" % i + VALUE]) for i in range(12))  # ~12.7 KB
        assert len(twelve) < 16 * 1024 < p.log.segments()[-1].size_bytes + len(twelve)
        with pytest.raises(errors.GregorError) as failed:
            p.append_records_to_leader(twelve, 1)
        assert failed.value.code == errors.Code.KAFKA_STORAGE_ERROR and "ENOSPC" in str(failed.value)
        assert p.log.log_end_offset == 10  # none of the twelve
        os.remove(filler)
        assert await manager.try_recover_dir(os.path.normpath(d))
        info, _ = p.append_records_to_leader(make_batch([b"after"]), 1)
        assert info.first_offset == 10
        values = record_values(b"".join(bytes(p.read_slice(s.base_offset, 1 << 20, True).read())
                                        for s in p.log.segments()))
        assert values == [b"acked-%d-" % i + VALUE for i in range(10)] + [b"after"]


async def test_a_follower_whose_log_dir_fills_leaves_the_isr_quietly_and_catches_up(tmp_path, small_dir: str) -> None:
    """Broker 1 follows partition 0 (led by broker 0) from a replica on the tmpfs. Once the tmpfs is full, its
    append fails, the dir goes offline, it stops fetching for that replica (no retry loop: its storage-error count
    stays at the few writes that failed) and the leader shrinks it out of the ISR, while acks=all produce goes on;
    once space returns it truncates, catches up byte-identical and rejoins the ISR."""
    from tests.helpers.cluster import replica_log_bytes, running_cluster
    from tests.integration.test_cluster_control import metadata, partitions

    data = str(tmp_path / "cluster")
    lag = {"replica.lag.time.max.ms": "2000"}
    with running_cluster(data, brokers=1, controllers=1, broker_overrides=lag) as c:
        leader = c.by_role("broker")[0]
        follower = spawn_broker(data, 1, [small_dir, ""], etcd=c.etcd_endpoints, overrides=lag)
        c.processes.append(follower)
        small = os.path.normpath(small_dir)

        def under_replicated() -> float | None:
            """The leader's own view of the ISR (the metadata cache learns ISR changes seconds later)."""
            return metric_value(leader, "gregor_broker_under_replicated_partitions")

        async with channel(leader.grpc) as ch:
            admin = controller_pb2_grpc.AdminServiceStub(ch)

            async def created() -> bool:
                resp = await admin.CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
                    controller_pb2.CreatableTopic(name="r", num_partitions=-1, replication_factor=-1,
                                                  configs={"min.insync.replicas": "1"},
                                                  assignments={0: controller_pb2.ReplicaList(broker_ids=[0, 1])})]),
                    timeout=30)
                code = resp.results[0].error.code
                assert code in (0, errors.Code.INVALID_REPLICA_ASSIGNMENT, errors.Code.TOPIC_ALREADY_EXISTS), resp
                return code != errors.Code.INVALID_REPLICA_ASSIGNMENT  # until broker 1 is registered

            await until(created, 30, "topic r created on brokers 0 and 1")
            await until(lambda: os.path.isdir(os.path.join(small_dir, "r-0")), 30, "broker 1's replica on the tmpfs")
            stub = broker_pb2_grpc.BrokerServiceStub(ch)

            async def produce_all(value: bytes) -> int:
                resp = await stub.Produce(broker_pb2.ProduceRequest(
                    topic="r", partition=0, records=make_batch([value]), acks=-1, timeout_ms=20000),
                    timeout=REQUEST_TIMEOUT_S)
                return int(resp.base_offset)

            async def in_sync() -> bool:
                return sorted(partitions(await metadata(leader, "r")).get(0, (-1, -1, (), ()))[3]) == [0, 1] \
                    and under_replicated() == 0.0

            await until(in_sync, 30, "both replicas in the ISR")
            for i in range(10):
                await produce_all(b"before-%d-" % i + VALUE)
            fill(os.path.join(small_dir, "filler"))
            for i in range(30):  # acks=all goes on: past the follower's slack, then without it (ISR shrink)
                await produce_all(b"full-%d-" % i + VALUE)

            def offline() -> bool:
                return metric_value(follower, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 1.0

            await until(offline, 30, "broker 1's tmpfs dir offline")
            await until(lambda: under_replicated() == 1.0, 30, "broker 1 out of the ISR")
            errors_so_far = metric_value(follower, "gregor_log_dir_storage_errors_total", f'{{dir="{small}"}}')
            assert errors_so_far is not None and errors_so_far <= 5, errors_so_far  # no retry loop
            for i in range(20):
                await produce_all(b"shrunk-%d" % i)

            os.remove(os.path.join(small_dir, "filler"))
            await until(lambda: under_replicated() == 0.0, 60, "broker 1 back in the ISR")
            assert metric_value(follower, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 0.0
            await until(lambda: replica_log_bytes(follower, "r", 0) == replica_log_bytes(leader, "r", 0), 30,
                        "the replicas byte-identical")
    text = open(follower.log).read()
    assert text.count(f"log dir {small} is offline") == 1, text[-3000:]
    assert text.count(f"log dir {small} is online again") == 1, text[-3000:]
    assert "replication from leader 0 failed" not in text, text[-3000:]


async def partition_0(broker: Process, topic: str) -> broker_pb2.PartitionMetadata | None:
    """Partition 0 of topic in broker's Metadata answer (None while unknown)."""
    from tests.integration.test_cluster_control import metadata

    t = (await metadata(broker, topic)).topics[0]
    return None if t.error or not t.partitions else t.partitions[0]


async def create_led_by_2(admin: controller_pb2_grpc.AdminServiceStub, b0: Process, small_dir: str, topic: str) -> None:
    """An RF 3 topic whose partition 0 is led by broker 2 (preferred) from its replica on the tmpfs, all in sync."""

    async def created() -> bool:
        resp = await admin.CreateTopics(controller_pb2.CreateTopicsRequest(topics=[
            controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1,
                                          configs={"min.insync.replicas": "2"},
                                          assignments={0: controller_pb2.ReplicaList(broker_ids=[2, 0, 1])})]),
            timeout=30)
        code = resp.results[0].error.code
        assert code in (0, errors.Code.INVALID_REPLICA_ASSIGNMENT, errors.Code.TOPIC_ALREADY_EXISTS), resp
        return code != errors.Code.INVALID_REPLICA_ASSIGNMENT  # until broker 2 is registered

    await until(created, 30, f"topic {topic} created on brokers 2, 0 and 1")
    await until(lambda: os.path.isdir(os.path.join(small_dir, f"{topic}-0")), 30, "broker 2's replica on the tmpfs")

    async def led_by_2_in_sync() -> bool:
        p = await partition_0(b0, topic)
        return p is not None and p.leader == 2 and sorted(p.isr) == [0, 1, 2]

    await until(led_by_2_in_sync, 30, "broker 2 leads with all three in the ISR")


async def test_a_leader_whose_log_dir_fills_loses_leadership_and_rejoins_as_follower(tmp_path, small_dir: str) -> None:
    """Broker 2 leads partition 0 of an RF 3 topic from a replica on the tmpfs. Once the tmpfs is full its append
    fails, the dir goes offline and the broker writes a log dir event notification; the controller sends it
    LeaderAndIsr, reads KAFKA_STORAGE_ERROR for the replica and moves it to OfflineReplica: another ISR member
    leads, the SDK's acks=all sends all succeed and every acknowledged record is on the new leader at its offset,
    and Metadata (`gregor topics describe`) shows broker 2 offline. Once space returns, broker 2 notifies again,
    follows, catches up byte-identical and is back in the ISR. (Before the controller handled log dir events, the
    leader stayed and every send failed KAFKA_STORAGE_ERROR until its delivery timeout.)"""
    from tests.helpers.cluster import replica_log_bytes, running_cluster
    from tests.integration.test_cli import gregor, ok

    data = str(tmp_path / "cluster")
    lag = {"replica.lag.time.max.ms": "2000"}
    with running_cluster(data, brokers=2, controllers=1, broker_overrides=lag) as c:
        b0, b1 = c.by_role("broker")
        moved = spawn_broker(data, 2, [small_dir, ""], etcd=c.etcd_endpoints, overrides=lag)
        c.processes.append(moved)
        small = os.path.normpath(small_dir)
        async with channel(b0.grpc) as ch:
            await create_led_by_2(controller_pb2_grpc.AdminServiceStub(ch), b0, small_dir, "m")
            acked: dict[int, bytes] = {}
            async with Producer({"bootstrap.servers": b0.grpc, "acks": "all", "linger.ms": 0,
                                 "request.timeout.ms": 5000, "delivery.timeout.ms": 30000}) as sdk:
                for i in range(10):
                    value = b"before-%d-" % i + VALUE
                    acked[(await sdk.send_and_wait("m", value, partition=0)).offset] = value
                filler = os.path.join(small_dir, "filler")
                assert fill(filler) > 0
                # Every send succeeds: the one that hits the full dir is retried on the new leader. Sends go on until
                # the dir is offline (the tmpfs pages the segment already holds take a few more), then 20 more.
                offline_at = None
                for i in range(MAX_SENDS_AFTER_FULL):
                    value = b"full-%d-" % i + VALUE
                    acked[(await sdk.send_and_wait("m", value, partition=0)).offset] = value
                    if offline_at is None and i % 5 == 4 and metric_value(
                            moved, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 1.0:
                        offline_at = i
                    if offline_at is not None and i >= offline_at + 20:
                        break
                assert offline_at is not None, f"{MAX_SENDS_AFTER_FULL} sends never took broker 2's tmpfs dir offline"

            async def moved_off_2() -> bool:  # UpdateMetadata reaches broker 0 just after the new leader's request
                q = await partition_0(b0, "m")
                return q is not None and q.leader in (0, 1) and 2 not in q.isr and list(q.offline_replicas) == [2]

            await until(moved_off_2, 10, "broker 0's metadata: another leader, broker 2 out of the ISR and offline")
            p = await partition_0(b0, "m")
            assert p is not None
            assert metric_value(moved, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 1.0
            described = ok(gregor("topics", "describe", "m", bootstrap=b0.grpc))
            assert "Offline: 2" in described, described
            new_leader = b0 if p.leader == 0 else b1
            async with channel(new_leader.grpc) as lch:
                read = await read_all(broker_pb2_grpc.BrokerServiceStub(lch), "m")
            assert [o for o, _ in read] == list(range(len(read)))
            assert {o: v for o, v in read if o in acked} == acked  # nothing acknowledged is lost or moved
            assert max(acked) == len(read) - 1

            os.remove(filler)

            async def back_in_sync() -> bool:
                q = await partition_0(b0, "m")
                return q is not None and sorted(q.isr) == [0, 1, 2] and not q.offline_replicas

            await until(back_in_sync, 60, "broker 2's replica back in the ISR")
            await until(lambda: replica_log_bytes(moved, "m", 0) == replica_log_bytes(new_leader, "m", 0), 30,
                        "the returned replica byte-identical with the leader's")
            assert "Offline:" not in ok(gregor("topics", "describe", "m", bootstrap=b0.grpc))
    text = open(moved.log).read()
    assert text.count(f"log dir {small} is offline") == 1, text[-3000:]
    assert text.count(f"log dir {small} is online again") == 1, text[-3000:]


async def test_a_controller_taking_over_learns_of_an_offline_log_dir(tmp_path, small_dir: str) -> None:
    """The only controller is frozen (SIGSTOP) while broker 2's tmpfs fills: the log dir event notification waits in
    etcd and broker 2 keeps leading, answering KAFKA_STORAGE_ERROR. A new controller takes over once the frozen
    one's lease expires: its failover deletes the pending notification (as Kafka's does) and learns from broker 2's
    answer to the failover LeaderAndIsr that the replica is offline, so leadership moves and acks=all produce goes
    on; once space returns, the new controller's watch brings the replica back into the ISR."""
    from tests.helpers.cluster import running_cluster, start_controller_with

    data = str(tmp_path / "cluster")
    lag = {"replica.lag.time.max.ms": "2000"}
    with running_cluster(data, brokers=2, controllers=1, broker_overrides=lag) as c:
        b0, _ = c.by_role("broker")
        (frozen,) = c.by_role("controller")
        moved = spawn_broker(data, 2, [small_dir, ""], etcd=c.etcd_endpoints, overrides=lag)
        c.processes.append(moved)
        small = os.path.normpath(small_dir)
        async with channel(b0.grpc) as ch:
            await create_led_by_2(controller_pb2_grpc.AdminServiceStub(ch), b0, small_dir, "f")
        async with channel(moved.grpc) as ch:
            stub = broker_pb2_grpc.BrokerServiceStub(ch)
            os.kill(frozen.pid, signal.SIGSTOP)
            filler = os.path.join(small_dir, "filler")
            assert fill(filler) > 0
            for i in range(MAX_SENDS_AFTER_FULL):
                try:
                    await produce(stub, "f", b"full-%d-" % i + VALUE)
                except errors.GregorError as err:
                    assert err.code == errors.Code.KAFKA_STORAGE_ERROR, err
                    break
            else:
                raise AssertionError(f"{MAX_SENDS_AFTER_FULL} sends into a full dir all succeeded")
        await until(lambda: "log dir event notification written" in open(moved.log).read(), 10,
                    "broker 2's log dir event notification written")
        p = await partition_0(b0, "f")
        assert p is not None and p.leader == 2, p  # nobody handled it: the frozen controller's term
        os.kill(frozen.pid, signal.SIGKILL)
        successor = start_controller_with(data, 1, c.by_role("etcd")[0].grpc)
        c.processes.append(successor)

        async def moved_off_2() -> bool:
            q = await partition_0(b0, "f")
            return q is not None and q.leader in (0, 1) and 2 not in q.isr and list(q.offline_replicas) == [2]

        await until(moved_off_2, 30, "the new controller moves leadership off broker 2's offline replica")
        async with Producer({"bootstrap.servers": b0.grpc, "acks": "all", "linger.ms": 0,
                             "request.timeout.ms": 5000, "delivery.timeout.ms": 30000}) as sdk:
            for i in range(5):
                await sdk.send_and_wait("f", b"after-failover-%d" % i, partition=0)
        os.remove(filler)

        async def back_in_sync() -> bool:
            q = await partition_0(b0, "f")
            return q is not None and sorted(q.isr) == [0, 1, 2] and not q.offline_replicas

        await until(back_in_sync, 60, "broker 2's replica back in the ISR")
        assert metric_value(moved, "gregor_log_dir_offline", f'{{dir="{small}"}}') == 0.0
    text = open(successor.log).read()
    assert "replicas in an offline log dir: 1 newly offline ['f-0']" in text, text[-3000:]
