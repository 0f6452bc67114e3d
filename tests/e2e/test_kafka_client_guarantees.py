"""Issue 22 point 5 for the non-Java clients: kafka-python (PyPI), kcat (Debian) and confluent-kafka (librdkafka)
through group consumption with rebalances across several members, committed offsets, transactions with
read_committed, and a partition leader SIGKILLed mid-stream under an idempotent acks=all producer.

Real processes only: etcd, a controller, brokers with their Kafka listeners, a group/transaction coordinator,
the clients from the venv and /usr/bin/kcat. Two clusters: one shared by the tests that kill nothing (2
brokers), one for the leader kills (3 brokers, RF 3, min.insync.replicas=2, a 4 s lease so the controller
moves a dead broker's leaderships within seconds). Every test talks only to the Kafka listeners.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import IO, Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from gregor.cli.local_cluster import LocalCluster
from tests.helpers.cluster import restart_broker, running_cluster, stop_process
from tests.helpers.kafka_admin import create_topic_everywhere
from tests.helpers.wait import wait_for

GREGOR = [sys.executable, "-m", "gregor.cli.main"]
WAIT_S = 60.0
KILL_AFTER = 300  # records acknowledged before the leader is killed
STREAM = 1500  # records the producers send in a leader-kill test


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("kclients")), brokers=2, controllers=1,
                         coordinators=1) as c:
        yield c


@pytest.fixture(scope="module")
def kill_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with running_cluster(str(tmp_path_factory.mktemp("kclients-kill")), brokers=3, controllers=1,
                         coordinators=1, lease_ttl_ms=4000) as c:
        yield c


def bootstrap(c: LocalCluster) -> str:
    """The live brokers' Kafka listeners (a killed one is left out)."""
    return ",".join(p.kafka for p in c.by_role("broker") if p.alive())


def gregor(c: LocalCluster, *args: str) -> str:
    env = {**os.environ, "GREGOR_DATA_DIR": c.data_dir}
    proc = subprocess.run([*GREGOR, *args], capture_output=True, text=True, timeout=WAIT_S, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def committed_by_gregor(c: LocalCluster, group: str) -> dict[int, int]:
    """partition -> committed offset of `group`, as `gregor groups describe` (gRPC) shows them."""
    rows = json.loads(gregor(c, "groups", "describe", group, "--output", "json"))["partitions"]
    return {r["partition"]: r["current_offset"] for r in rows
            if r["current_offset"] is not None and r["current_offset"] >= 0}


def create_topic(c: LocalCluster, partitions: int, rf: int, config: dict[str, str] | None = None) -> str:
    return create_topic_everywhere(bootstrap(c), f"kc-{uuid.uuid4().hex[:8]}", partitions, rf, config, WAIT_S)


def produce_plain(c: LocalCluster, topic: str, values_by_partition: dict[int, list[str]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap(c), "enable.idempotence": True, "acks": "all"})
    for part, values in values_by_partition.items():
        for v in values:
            p.produce(topic, value=v, partition=part)
    assert p.flush(WAIT_S) == 0


def write_transactions(c: LocalCluster, topic: str, partitions: int) -> tuple[list[str], list[str]]:
    """librdkafka: a committed transaction, an aborted one, a committed one (in each partition the aborted
    records lie between the committed ones, so a reader that let them through is caught by what it reads before
    the second committed transaction). Returns (committed values, aborted values)."""
    p = Producer({"bootstrap.servers": bootstrap(c), "transactional.id": f"tx-{topic}",
                  "transaction.timeout.ms": 60000})
    p.init_transactions(WAIT_S)
    committed: list[str] = []
    aborted: list[str] = []
    for name, commit in (("c1", True), ("ab", False), ("c2", True)):
        p.begin_transaction()
        for i in range(2 * partitions):
            value = f"{name}-{i}"
            p.produce(topic, value=value, partition=i % partitions)
            (committed if commit else aborted).append(value)
        if commit:
            p.commit_transaction(WAIT_S)
        else:
            assert p.flush(WAIT_S) == 0  # in the log (visible read_uncommitted) before the abort
            p.abort_transaction(WAIT_S)
    return committed, aborted


def leader_of(c: LocalCluster, topic: str, partition: int = 0) -> Any:
    md = AdminClient({"bootstrap.servers": bootstrap(c)}).list_topics(topic, timeout=10)
    leader = md.topics[topic].partitions[partition].leader
    return next(p for p in c.by_role("broker") if p.id == leader)


# ---- kafka-python: a rebalancing group of three, committed offsets ----------------------------------------

class KafkaPythonMember:
    """One kafka-python KafkaConsumer of a group, polled by its own thread (KafkaConsumer is not thread-safe;
    kafka-python rejoins a rebalancing group inside poll). After each batch it commits synchronously; a commit
    refused because the group rebalanced meanwhile is retried by whoever owns the partition next."""

    def __init__(self, c: LocalCluster, topic: str, group: str) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer  # type: ignore[import-untyped]

        self.assignments: list[set[int]] = []
        self.records: list[tuple[int, int, str]] = []
        self.commit_failures = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        member = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            def on_partitions_assigned(self, assigned: Any) -> None:
                member.assignments.append({tp.partition for tp in assigned})

        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap(c).split(","), group_id=group,
                                      auto_offset_reset="earliest", enable_auto_commit=False,
                                      session_timeout_ms=10000, heartbeat_interval_ms=500)
        self.consumer.subscribe([topic], listener=Listener())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kafka.errors import CommitFailedError, RebalanceInProgressError  # type: ignore[import-untyped]

        try:
            while not self._stop.is_set():
                batch = self.consumer.poll(timeout_ms=200)
                for records in batch.values():
                    self.records.extend((r.partition, r.offset, r.value.decode()) for r in records)
                if batch:
                    try:
                        self.consumer.commit()
                    except (CommitFailedError, RebalanceInProgressError):
                        self.commit_failures += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
        finally:
            self.consumer.close()

    def current(self) -> set[int]:
        return self.assignments[-1] if self.assignments else set()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(WAIT_S)


def test_kafka_python_group_of_three_rebalances_and_commits_what_it_consumed(cluster: LocalCluster) -> None:
    from kafka import KafkaProducer  # type: ignore[import-untyped]

    topic = create_topic(cluster, partitions=6, rf=2)
    group = f"kp-{topic}"
    prod = KafkaProducer(bootstrap_servers=bootstrap(cluster).split(","), acks="all", enable_idempotence=True)

    def produce(round_: int) -> None:
        for p in range(6):
            for i in range(5):
                prod.send(topic, value=f"r{round_}-p{p}-{i}".encode(), partition=p)
        prod.flush(WAIT_S)

    members: list[KafkaPythonMember] = []
    try:
        for n in range(3):
            produce(n)  # records flow into every generation of the group
            members.append(KafkaPythonMember(cluster, topic, group))

            def settled() -> bool:
                current = [m.current() for m in members]
                return all(current) and sorted(p for s in current for p in s) == list(range(6)) and \
                    len({(p, o) for m in members for p, o, _ in m.records}) == 30 * (n + 1)
            wait_for(settled, WAIT_S, f"{n + 1} members sharing the 6 partitions, every record so far consumed")
            assert not any(m.error for m in members), [m.error for m in members]
        final = [m.current() for m in members]
        # The final assignments partition the topic, two partitions each (the range assignor over 6 and 3).
        assert sorted(p for s in final for p in s) == list(range(6)) and [len(s) for s in final] == [2, 2, 2]
        # The first member started alone with all six and shrank as the others joined.
        first = members[0].assignments
        assert first[0] == set(range(6)) and len(first[-1]) == 2 and len(first) >= 3, first
        produced = {f"r{r}-p{p}-{i}" for r in range(3) for p in range(6) for i in range(5)}
        consumed = {(p, o): v for m in members for p, o, v in m.records}
        assert set(consumed.values()) == produced
        ends = {p: 1 + max(o for q, o in consumed if q == p) for p in range(6)}
        assert ends == {p: 15 for p in range(6)}
        # Each member committed what it consumed: Gregor's gRPC view of the group shows the log ends.
        wait_for(lambda: committed_by_gregor(cluster, group) == ends, WAIT_S,
                 f"the committed offsets {ends} in `gregor groups describe`")
    finally:
        for m in members:
            m.stop()
        prod.close()
    assert committed_by_gregor(cluster, group) == ends  # and still after every member left the group


# ---- kafka-python: transactions read back read_committed / read_uncommitted --------------------------------

def kafka_python_read(c: LocalCluster, topic: str, partitions: int, isolation: str, want: int) -> list[str]:
    """kafka-python reads the topic from the beginning until it has `want` records (or WAIT_S passes)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    cons = KafkaConsumer(bootstrap_servers=bootstrap(c).split(","), enable_auto_commit=False,
                         isolation_level=isolation)
    got: list[str] = []
    try:
        cons.assign([KTP(topic, p) for p in range(partitions)])
        cons.seek_to_beginning()

        def enough() -> bool:
            for records in cons.poll(timeout_ms=200).values():
                got.extend(r.value.decode() for r in records)
            return len(got) >= want
        wait_for(enough, WAIT_S, f"{want} records read {isolation}", interval_s=0.0)
        for _ in range(3):  # anything more that was there would come now
            for records in cons.poll(timeout_ms=200).values():
                got.extend(r.value.decode() for r in records)
    finally:
        cons.close()
    return got


def test_kafka_python_transactions_read_committed_sees_only_the_committed(cluster: LocalCluster) -> None:
    from kafka import KafkaProducer

    topic = create_topic(cluster, partitions=2, rf=2)
    prod = KafkaProducer(bootstrap_servers=bootstrap(cluster).split(","), transactional_id=f"kp-tx-{topic}")
    committed: list[str] = []
    aborted: list[str] = []
    try:
        prod.init_transactions()
        for name, commit in (("c1", True), ("ab", False), ("c2", True)):
            prod.begin_transaction()
            for i in range(4):
                value = f"{name}-{i}"
                prod.send(topic, value=value.encode(), partition=i % 2)
                (committed if commit else aborted).append(value)
            if commit:
                prod.commit_transaction()
            else:
                prod.flush()  # in the log before the abort
                prod.abort_transaction()
    finally:
        prod.close()
    # In each partition the aborted records lie between the two committed transactions: a read_committed
    # reader that let them through would have them among the records it reads before c2's.
    got = kafka_python_read(cluster, topic, 2, "read_committed", len(committed))
    assert sorted(got) == sorted(committed), got
    got = kafka_python_read(cluster, topic, 2, "read_uncommitted", len(committed) + len(aborted))
    assert sorted(got) == sorted(committed + aborted), got
    # ...and librdkafka's read_committed consumer reads kafka-python's transactions the same way.
    cons = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": f"check-{topic}",
                     "isolation.level": "read_committed", "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, p, 0) for p in range(2)])
    seen: list[str] = []
    try:
        def all_committed() -> bool:
            m = cons.poll(0.2)
            if m is not None and m.error() is None:
                seen.append(bytes(m.value() or b"").decode())
            return len(seen) >= len(committed)
        wait_for(all_committed, WAIT_S, "librdkafka reads the committed records", interval_s=0.0)
    finally:
        cons.close()
    assert sorted(seen) == sorted(committed), seen


# ---- kcat: a balanced group of two, committed offsets; read_committed --------------------------------------

def kcat() -> str:
    path = shutil.which("kcat")
    assert path, "kcat from Debian (apt-get install kcat; .ci/run installs it)"
    return path


class KcatMember:
    """`kcat -G group topic`: a balanced consumer (librdkafka's KafkaConsumer, auto commit on by default).
    stdout (-u: unbuffered, a pipe would hold the lines) is partition:offset:value lines; its rebalances come on stderr ("% Group ... rebalanced ...")."""

    def __init__(self, c: LocalCluster, group: str, topic: str) -> None:
        self.proc = subprocess.Popen(
            [kcat(), "-u", "-b", bootstrap(c), "-G", group, "-X", "auto.offset.reset=earliest",
             "-X", "auto.commit.interval.ms=500", "-f", "%p:%o:%s\n", topic],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.records: list[tuple[int, int, str]] = []
        self.assignments: list[set[int]] = []
        self.stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream: IO[str] | None, out: bool) -> None:
        assert stream is not None
        for line in stream:
            if out:
                p, o, v = line.rstrip("\n").split(":", 2)
                self.records.append((int(p), int(o), v))
                continue
            self.stderr.append(line)
            if "rebalanced" in line and "assigned:" in line:
                self.assignments.append({int(x) for x in re.findall(r"\[(\d+)\]", line.split("assigned:")[1])})
            elif "rebalanced" in line and "revoked:" in line:
                self.assignments.append(set())

    def current(self) -> set[int]:
        return self.assignments[-1] if self.assignments else set()

    def stop(self) -> int:
        """SIGTERM: kcat closes its consumer (a final commit, LeaveGroup) and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(10)
        for t in self._threads:
            t.join(10)
        return rc


def test_kcat_balanced_group_of_two_rebalances_and_commits(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=4, rf=2)
    group = f"kcat-{topic}"
    produce_plain(cluster, topic, {p: [f"a-p{p}-{i}" for i in range(10)] for p in range(4)})
    a = KcatMember(cluster, group, topic)
    members = [a]
    try:
        wait_for(lambda: a.current() == set(range(4)) and len(a.records) == 40, WAIT_S,
                 "the first kcat alone with the four partitions, every record consumed")
        b = KcatMember(cluster, group, topic)
        members.append(b)
        wait_for(lambda: a.current() and b.current() and sorted(a.current() | b.current()) == [0, 1, 2, 3] and
                 not a.current() & b.current(), WAIT_S, "the two kcats share the four partitions")
        produce_plain(cluster, topic, {p: [f"b-p{p}-{i}" for i in range(10)] for p in range(4)})
        wait_for(lambda: len({(p, o) for m in members for p, o, _ in m.records}) == 80, WAIT_S,
                 "every record consumed by the group")
        by_member = [{p for p, _, v in m.records if v.startswith("b-")} for m in members]
        final = [a.current(), b.current()]  # before either leaves (its LeaveGroup rebalances the other)
        assert by_member == final and [len(s) for s in final] == [2, 2], (by_member, a.assignments)
        # librdkafka's auto commit (enable.auto.commit, every 500 ms here) reaches Gregor's group coordinator.
        wait_for(lambda: committed_by_gregor(cluster, group) == {p: 20 for p in range(4)}, WAIT_S,
                 "kcat's auto-committed offsets (20 per partition) in `gregor groups describe`")
    finally:
        codes = [m.stop() for m in members]
    assert codes == [0, 0], [m.stderr[-5:] for m in members]
    values = sorted(v for m in members for _, _, v in m.records)
    assert values == sorted(f"{r}-p{p}-{i}" for r in "ab" for p in range(4) for i in range(10))
    assert a.assignments[0] == set(range(4))  # alone first, then shrunk to two (final, above)
    assert committed_by_gregor(cluster, group) == {p: 20 for p in range(4)}


def kcat_read(c: LocalCluster, topic: str, *extra: str) -> list[str]:
    out = subprocess.run([kcat(), "-b", bootstrap(c), "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%s\n",
                          *extra], capture_output=True, text=True, timeout=WAIT_S, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_kcat_read_committed_skips_an_aborted_transaction(cluster: LocalCluster) -> None:
    topic = create_topic(cluster, partitions=1, rf=2)
    committed, aborted = write_transactions(cluster, topic, 1)
    # kcat -e stops at the partition's end, the LSO for read_committed: the last marker may still be on its way
    # to the partition when EndTxn has answered, so read again until the last committed value is there.
    got = wait_for(lambda: (lambda v: v if committed[-1] in v else None)(
        kcat_read(cluster, topic, "-X", "isolation.level=read_committed")), WAIT_S, "kcat reads c2")
    assert got == committed, got  # the aborted records lay between c1 and c2: they would show here
    assert kcat_read(cluster, topic) == committed  # librdkafka's default isolation.level is read_committed
    assert kcat_read(cluster, topic, "-X", "isolation.level=read_uncommitted") == \
        committed[:2] + aborted + committed[2:]  # log order: c1, the aborted ones, c2


# ---- a leader SIGKILLed mid-stream under an idempotent acks=all producer ------------------------------------
# Their own cluster (3 brokers); the killed broker is started again after each test.

def kill_leader_when(c: LocalCluster, topic: str, acked: Any) -> Any:
    """Wait for KILL_AFTER acknowledgements, then SIGKILL the leader of partition 0; the killed process."""
    wait_for(lambda: acked() >= KILL_AFTER, WAIT_S, f"{KILL_AFTER} records acknowledged")
    victim = leader_of(c, topic)
    stop_process(victim, signal.SIGKILL)
    return victim


def check_read_back(sent: dict[tuple[int, int], str], got: list[tuple[int, int, str]]) -> None:
    """Every acknowledged value read back once, at the offset it was acknowledged at; no value twice."""
    at = {(p, o): v for p, o, v in got}
    missing = {k: v for k, v in sent.items() if at.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged records lost or moved, e.g. {list(missing.items())[:5]}"
    twice = [v for v, n in Counter(v for _, _, v in got).items() if n > 1]
    assert not twice, f"written twice (idempotence broken by the failover): {twice[:5]}"


def test_kafka_python_leader_killed_mid_stream_loses_no_acknowledged_record(kill_cluster: LocalCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    c = kill_cluster
    topic = create_topic(c, partitions=2, rf=3, config={"min.insync.replicas": "2"})
    prod = KafkaProducer(bootstrap_servers=bootstrap(c).split(","), acks="all", enable_idempotence=True,
                         max_in_flight_requests_per_connection=5, request_timeout_ms=10000,
                         delivery_timeout_ms=120000, linger_ms=2)
    sent: dict[tuple[int, int], str] = {}
    failed: list[BaseException] = []
    lock = threading.Lock()

    def send_all() -> None:
        for i in range(STREAM):
            value = str(i)

            def ok(md: Any, value: str = value) -> None:
                with lock:
                    sent[(md.partition, md.offset)] = value

            prod.send(topic, value=value.encode(), partition=i % 2).add_callback(ok).add_errback(failed.append)
            time.sleep(0.004)  # a steady stream, still flowing when the leader dies

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    victim = None
    try:
        victim = kill_leader_when(c, topic, lambda: len(sent))
        killed_at = len(sent)
        sender.join(180)
        prod.flush(180)
        assert leader_of(c, topic).id != victim.id  # the records after the kill went to a new leader
    finally:
        prod.close(10)
        if victim is not None:
            restart_broker(c, victim)
    assert not failed, failed[:3]
    assert len(sent) == STREAM and killed_at < STREAM
    cons = KafkaConsumer(bootstrap_servers=bootstrap(c).split(","), enable_auto_commit=False)
    got: list[tuple[int, int, str]] = []
    try:
        cons.assign([KTP(topic, p) for p in range(2)])
        cons.seek_to_beginning()

        def read() -> bool:
            for records in cons.poll(timeout_ms=200).values():
                got.extend((r.partition, r.offset, r.value.decode()) for r in records)
            return len(got) >= STREAM
        wait_for(read, WAIT_S, "every acknowledged record read back", interval_s=0.0)
        ends = cons.end_offsets([KTP(topic, p) for p in range(2)])
    finally:
        cons.close()
    assert sum(ends.values()) == len(got) == STREAM, (ends, len(got))
    check_read_back(sent, got)


def test_librdkafka_leader_killed_mid_stream_loses_no_acknowledged_record(kill_cluster: LocalCluster) -> None:
    c = kill_cluster
    topic = create_topic(c, partitions=2, rf=3, config={"min.insync.replicas": "2"})
    prod = Producer({"bootstrap.servers": bootstrap(c), "enable.idempotence": True, "acks": "all",
                     "linger.ms": 2, "message.timeout.ms": 120000, "request.timeout.ms": 10000})
    sent: dict[tuple[int, int], str] = {}
    failed: list[Any] = []

    def done(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            sent[(msg.partition(), msg.offset())] = msg.value().decode()

    victim = None
    try:
        for i in range(STREAM):
            prod.produce(topic, value=str(i), partition=i % 2, on_delivery=done)
            prod.poll(0.004)  # delivery reports, and a steady stream still flowing when the leader dies
            if victim is None and len(sent) >= KILL_AFTER:
                victim = kill_leader_when(c, topic, lambda: len(sent))
                killed_at = len(sent)
        assert prod.flush(180) == 0
        assert victim is not None and leader_of(c, topic).id != victim.id  # a new leader took the rest
    finally:
        if victim is not None:
            restart_broker(c, victim)
    assert victim is not None and not failed, failed[:3]
    assert len(sent) == STREAM and killed_at < STREAM
    cons = Consumer({"bootstrap.servers": bootstrap(c), "group.id": f"check-{topic}", "enable.auto.commit": False,
                     "enable.partition.eof": True})
    cons.assign([TopicPartition(topic, p, 0) for p in range(2)])
    got: list[tuple[int, int, str]] = []
    at_end: set[int] = set()
    try:
        def read() -> bool:
            m = cons.poll(0.2)
            if m is not None:
                err, part, offset = m.error(), int(m.partition() or 0), int(m.offset() or 0)
                if err is None:
                    got.append((part, offset, bytes(m.value() or b"").decode()))
                else:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    at_end.add(part)
            return len(got) >= STREAM and at_end == {0, 1}
        wait_for(read, WAIT_S, "every acknowledged record read back to the partitions' ends", interval_s=0.0)
    finally:
        cons.close()
    assert len(got) == STREAM
    check_read_back(sent, got)
