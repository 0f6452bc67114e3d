"""Kafka's own Java tools against Gregor's Kafka listener (issue 22, point 5).

Apache Kafka's jars (kafka_2.13, kafka-tools, kafka-clients; bench/kafka_dist.py, `make kafka-jars`, cached
in ~/.cache/gregor) run their real main classes against one local Gregor cluster shared by the module:
etcd, a controller, three brokers and a group coordinator, every broker with its Kafka listener. The tools:
kafka-topics (TopicCommand), the console producer and consumer, kafka-consumer-groups (ConsumerGroupCommand),
kafka-configs (ConfigCommand), VerifiableProducer / VerifiableConsumer (Kafka's system-test clients, whose
JSON lines say which records were acked and which were consumed), kafka-transactions (TransactionsCommand)
and TransactionalMessageCopier. Every test talks only to the Kafka listeners, so each fails without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import IO, Any

import pytest
from confluent_kafka.admin import AdminClient

from bench.kafka_dist import KafkaDist, ensure_kafka
from gregor.cli.local_cluster import LocalCluster
from tests.helpers.cluster import broker_metric_total, restart_broker, running_cluster, stop_process
from tests.helpers.wait import wait_for

WAIT_S = 90.0  # a JVM tool on the loaded 2-core machine: startup alone can take 10 s
TOOL_TIMEOUT_S = 120.0
GREGOR = [sys.executable, "-m", "gregor.cli.main"]
JVM_OPTS = ("-XX:TieredStopAtLevel=1",)  # short-lived tools: the C1 compiler only starts faster

TOPIC_COMMAND = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
CONFIG_COMMAND = "org.apache.kafka.tools.ConfigCommand"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"
MESSAGE_COPIER = "org.apache.kafka.tools.TransactionalMessageCopier"


# ---- fixtures: one Kafka distribution and one Gregor cluster for the module ---------------------------

@pytest.fixture(scope="module")
def kafka() -> KafkaDist:
    return ensure_kafka()  # the cache `make kafka-jars` fills; fetched from Maven Central if it is empty


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A 4 s lease: the controller moves a killed broker's leaderships within seconds.
    with running_cluster(str(tmp_path_factory.mktemp("kafka-java")), brokers=3, controllers=1, coordinators=1,
                         lease_ttl_ms=4000) as c:
        yield c


def bootstrap(c: LocalCluster) -> str:
    return ",".join(p.kafka for p in c.by_role("broker") if p.alive())


def run_tool(kafka: KafkaDist, main: str, *args: str, stdin: str | None = None,
             timeout: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kafka.command(main, *args, jvm_opts=JVM_OPTS), input=stdin, capture_output=True,
                          text=True, timeout=timeout, stdin=None if stdin is not None else subprocess.DEVNULL)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def gregor_cli(c: LocalCluster, *args: str) -> str:
    env = {**os.environ, "GREGOR_DATA_DIR": c.data_dir}
    proc = subprocess.run([*GREGOR, *args], capture_output=True, text=True, timeout=WAIT_S, env=env,
                          stdin=subprocess.DEVNULL)
    return ok(proc)


def new_topic(kafka: KafkaDist, c: LocalCluster, partitions: int, *extra: str) -> str:
    name = f"j-{uuid.uuid4().hex[:8]}"
    out = ok(run_tool(kafka, TOPIC_COMMAND, "--bootstrap-server", bootstrap(c), "--create", "--topic", name,
                      "--partitions", str(partitions), "--replication-factor", "3", *extra))
    assert f"Created topic {name}." in out
    # Metadata reaches every broker asynchronously, as in Kafka: wait until each listener has a leader for all.
    for address in bootstrap(c).split(","):
        admin = AdminClient({"bootstrap.servers": address})

        def ready() -> bool:
            t = admin.list_topics(name, timeout=10).topics.get(name)
            return t is not None and t.error is None and len(t.partitions) == partitions and \
                all(p.leader >= 0 for p in t.partitions.values())
        wait_for(ready, WAIT_S, f"{name} with leaders in {address}'s metadata")
    return name


def write_properties(tmp_path: Any, name: str, props: dict[str, str]) -> str:
    path = tmp_path / name
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return str(path)


class JsonTool:
    """A long-running Java tool whose stdout is JSON lines (the Verifiable* clients, the copier), read by a
    thread into `events` as they come."""

    def __init__(self, kafka: KafkaDist, main: str, *args: str) -> None:
        self.proc = subprocess.Popen(kafka.command(main, *args, jvm_opts=JVM_OPTS), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self, stream: IO[str] | None, is_json: bool) -> None:
        assert stream is not None
        for line in stream:
            if is_json and line.startswith("{"):
                self.events.append(json.loads(line))
            elif not is_json:
                self.stderr.append(line)

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("name") == name]

    def wait(self, timeout: float = TOOL_TIMEOUT_S) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return rc

    def stop(self) -> int:
        """SIGTERM: the Verifiable clients shut down cleanly (the consumer commits and leaves its group)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.wait(10)

    def why(self) -> str:
        return "".join(self.stderr[-40:])


def acked(producer: JsonTool) -> dict[tuple[int, int], str]:
    """(partition, offset) -> value of every record VerifiableProducer reports acknowledged."""
    return {(e["partition"], e["offset"]): e["value"] for e in producer.named("producer_send_success")}


def consumed(consumers: list[JsonTool]) -> dict[tuple[int, int], str]:
    """(partition, offset) -> value of every record the --verbose VerifiableConsumers printed."""
    out: dict[tuple[int, int], str] = {}
    for c in consumers:
        for e in c.named("record_data"):
            out[(e["partition"], e["offset"])] = e["value"]
    return out


# ---- kafka-topics, console producer/consumer, kafka-consumer-groups, kafka-configs ---------------------

def test_kafka_topics_creates_lists_and_describes(kafka: KafkaDist, cluster: LocalCluster) -> None:
    name = new_topic(kafka, cluster, 3, "--config", "retention.ms=3600000", "--config", "min.insync.replicas=2")
    listed = ok(run_tool(kafka, TOPIC_COMMAND, "--bootstrap-server", bootstrap(cluster), "--list"))
    assert name in listed.split()
    described = ok(run_tool(kafka, TOPIC_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                            "--topic", name))
    head, *rows = [line.strip() for line in described.splitlines() if line.strip()]
    assert "PartitionCount: 3" in head and "ReplicationFactor: 3" in head, described
    assert "retention.ms=3600000" in head and "min.insync.replicas=2" in head, described
    assert sorted(r.split("Partition:")[1].split()[0] for r in rows) == ["0", "1", "2"]
    for row in rows:
        replicas = row.split("Replicas:")[1].split()[0].split(",")
        assert sorted(replicas) == ["0", "1", "2"] and row.split("Leader:")[1].split()[0] in replicas, row
    # the topic id kafka-topics shows is the one gregor shows (both print Kafka's URL-safe base64)
    topic_id = head.split("TopicId:")[1].split()[0]
    assert f"TopicId: {topic_id}" in gregor_cli(cluster, "topics", "describe", name)
    dup = run_tool(kafka, TOPIC_COMMAND, "--bootstrap-server", bootstrap(cluster), "--create", "--topic", name,
                   "--partitions", "1", "--replication-factor", "1")
    assert dup.returncode != 0 and "TopicExistsException" in dup.stdout + dup.stderr


def test_console_producer_and_consumer_commit_offsets_kafka_consumer_groups_describes(
        kafka: KafkaDist, cluster: LocalCluster) -> None:
    topic = new_topic(kafka, cluster, 2)
    lines = [f"key{i % 4}:value-{i}" for i in range(40)]
    ok(run_tool(kafka, CONSOLE_PRODUCER, "--bootstrap-server", bootstrap(cluster), "--topic", topic,
                "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
                "--command-property", "enable.idempotence=true", "--command-property", "acks=all",
                stdin="\n".join(lines) + "\n"))
    group = f"console-{topic}"
    out = ok(run_tool(kafka, CONSOLE_CONSUMER, "--bootstrap-server", bootstrap(cluster), "--topic", topic,
                      "--group", group, "--from-beginning", "--max-messages", "40", "--timeout-ms", "60000",
                      "--formatter-property", "print.key=true", "--formatter-property", "print.partition=true",
                      "--formatter-property", "print.offset=true"))
    rows = [line.split("\t") for line in out.splitlines() if line.startswith("Partition:")]
    got = [(int(p.split(":")[1]), int(o.split(":")[1]), k, v) for p, o, k, v in rows]
    assert sorted(f"{k}:{v}" for _, _, k, v in got) == sorted(lines)
    by_partition: dict[int, list[tuple[int, str, str]]] = {}
    for p, o, k, v in got:
        by_partition.setdefault(p, []).append((o, k, v))
    for p, recs in by_partition.items():  # one key, one partition; offsets dense, in the order produced
        assert [o for o, _, _ in recs] == list(range(len(recs)))
        assert len({k for _, k, _ in recs} & {f"key{i}" for i in range(4)}) == len({k for _, k, _ in recs})
        for key in {k for _, k, _ in recs}:
            values = [v for _, k, v in recs if k == key]
            assert values == [line.split(":")[1] for line in lines if line.startswith(key + ":")]
    # The console consumer committed on close: kafka-consumer-groups shows no lag, and so does gregor.
    described = ok(run_tool(kafka, GROUP_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                            "--group", group))
    table = {int(r[2]): (int(r[3]), int(r[4]), r[5]) for r in
             (line.split() for line in described.splitlines()) if len(r) >= 6 and r[0] == group and r[1] == topic}
    ends = {p: len(recs) for p, recs in by_partition.items()}
    assert table == {p: (ends.get(p, 0), ends.get(p, 0), "0") for p in (0, 1)}, described
    grpc_view = json.loads(gregor_cli(cluster, "groups", "describe", group, "--output", "json"))
    assert sorted((r["partition"], r["current_offset"]) for r in grpc_view["partitions"]) == \
        sorted((p, ends.get(p, 0)) for p in (0, 1) if ends.get(p, 0))
    listed = ok(run_tool(kafka, GROUP_COMMAND, "--bootstrap-server", bootstrap(cluster), "--list"))
    assert group in listed.split()


def request_versions(c: LocalCluster, api: str, version: int) -> float:
    """gregor_kafka_requests_total{api,version} summed over the brokers: which version a client sent."""
    return broker_metric_total(c, f'gregor_kafka_requests_total{{api="{api}",version="{version}"}}')


def test_kafka_consumer_groups_describes_several_groups_in_one_offset_fetch_v8(
        kafka: KafkaDist, cluster: LocalCluster) -> None:
    """KIP-709: Kafka's AdminClient asks for several groups' offsets in one OffsetFetch v8 when the broker
    advertises it (with 1-7 it sends one v7 per group). Two groups with different committed offsets, and a third
    the tool is not allowed to see would need ACLs: here a group with no offsets, which Kafka describes as empty."""
    from confluent_kafka import Consumer, TopicPartition

    topic = new_topic(kafka, cluster, 2)
    groups = {f"v8a-{topic}": {0: 3, 1: 7}, f"v8b-{topic}": {0: 11}}
    for group, offsets in groups.items():  # committed by a non-member (generation -1), as Kafka allows
        consumer = Consumer({"bootstrap.servers": bootstrap(cluster), "group.id": group,
                             "enable.auto.commit": False})
        try:
            consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
        finally:
            consumer.close()
    before = request_versions(cluster, "OffsetFetch", 8)
    described = ok(run_tool(kafka, GROUP_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                            *(a for g in groups for a in ("--group", g))))
    table = {(r[0], int(r[2])): int(r[3]) for r in (line.split() for line in described.splitlines())
             if len(r) >= 6 and r[0] in groups and r[1] == topic}
    assert table == {(g, p): o for g, offsets in groups.items() for p, o in offsets.items()}, described
    assert request_versions(cluster, "OffsetFetch", 8) > before  # the tool sent v8, not one v7 per group


def test_kafka_configs_describes_a_topics_overrides(kafka: KafkaDist, cluster: LocalCluster) -> None:
    topic = new_topic(kafka, cluster, 1, "--config", "retention.ms=7200000", "--config", "cleanup.policy=compact")
    out = ok(run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                      "--entity-type", "topics", "--entity-name", topic))
    assert f"Dynamic configs for topic {topic} are:" in out
    dynamic = {line.split("=")[0].strip() for line in out.splitlines() if "sensitive=" in line}
    assert dynamic == {"retention.ms", "cleanup.policy"}, out
    assert "retention.ms=7200000" in out and "cleanup.policy=compact" in out
    every = ok(run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe", "--all",
                        "--entity-type", "topics", "--entity-name", topic))
    assert "segment.bytes=1073741824" in every and "retention.ms=7200000" in every  # defaults listed too


def test_kafka_configs_alters_a_topics_configs(kafka: KafkaDist, cluster: LocalCluster) -> None:
    topic = new_topic(kafka, cluster, 1, "--config", "retention.ms=7200000")
    ok(run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), "--alter", "--entity-type", "topics",
                "--entity-name", topic, "--add-config", "retention.bytes=1048576,max.message.bytes=2000000",
                "--delete-config", "retention.ms"))
    out = ok(run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                      "--entity-type", "topics", "--entity-name", topic))
    assert "retention.bytes=1048576" in out and "max.message.bytes=2000000" in out and "retention.ms" not in out
    shown = gregor_cli(cluster, "topics", "describe", topic)
    assert "retention.bytes=1048576" in shown.replace(" ", "") or "1048576" in shown
    bad = run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), "--alter", "--entity-type",
                   "topics", "--entity-name", topic, "--add-config", "retention.ms=not-a-number")
    assert bad.returncode != 0 and "InvalidConfigurationException" in bad.stdout + bad.stderr


def test_kafka_configs_alters_and_describes_client_quotas(kafka: KafkaDist, cluster: LocalCluster) -> None:
    """kafka-configs --entity-type users|clients goes through AlterClientQuotas / DescribeClientQuotas (48/49) to
    the same etcd quota store `gregor configs` uses: each side reads what the other wrote."""
    user = f"u{uuid.uuid4().hex[:6]}"

    def configs(*args: str) -> str:
        return ok(run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), *args))

    configs("--alter", "--entity-type", "users", "--entity-name", user,
            "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2097152")
    configs("--alter", "--entity-type", "users", "--entity-name", user, "--entity-type", "clients",
            "--entity-name", "c1", "--add-config", "request_percentage=50")
    # the default client-id's quota is high: the module's other tests share the cluster
    configs("--alter", "--entity-type", "clients", "--entity-default", "--add-config", "producer_byte_rate=1073741824")
    out = configs("--describe", "--entity-type", "users", "--entity-name", user)
    assert f"Quota configs for user-principal '{user}' are" in out, out
    assert "producer_byte_rate=1048576.0" in out and "consumer_byte_rate=2097152.0" in out, out
    assert "request_percentage" not in out  # the (user, client) entity is another one
    both = configs("--describe", "--entity-type", "users", "--entity-name", user, "--entity-type", "clients",
                   "--entity-name", "c1")
    assert "request_percentage=50.0" in both, both
    default = configs("--describe", "--entity-type", "clients", "--entity-default")
    assert "the default client-id" in default and "producer_byte_rate=1.073741824E9" in default, default
    shown = json.loads(gregor_cli(cluster, "--output", "json", "configs", "--describe", "--entity-type", "users",
                                  "--entity-name", user))
    assert shown == [{"user": user, "client_id": None,
                      "configs": {"producer_byte_rate": "1048576", "consumer_byte_rate": "2097152"}}], shown
    gregor_cli(cluster, "configs", "--alter", "--entity-type", "users", "--entity-name", user,
               "--delete-config", "consumer_byte_rate")
    out = configs("--describe", "--entity-type", "users", "--entity-name", user)
    assert "producer_byte_rate=1048576.0" in out and "consumer_byte_rate" not in out, out
    configs("--alter", "--entity-type", "clients", "--entity-default", "--delete-config", "producer_byte_rate")
    assert "producer_byte_rate" not in configs("--describe", "--entity-type", "clients", "--entity-default")


def test_kafka_configs_alters_and_describes_dynamic_broker_configs(kafka: KafkaDist, cluster: LocalCluster) -> None:
    """kafka-configs --entity-type brokers (KIP-226): a per-broker value and a cluster-wide default (--entity-default)
    through IncrementalAlterConfigs, described with Kafka's sources and synonyms (the per-broker value over the
    default over Kafka's default), --all listing the read-only configs too; a read-only key is refused and nothing
    is written; `gregor configs` reads the same store and refuses an unknown key with a clear message."""
    def configs(*args: str) -> subprocess.CompletedProcess[str]:
        return run_tool(kafka, CONFIG_COMMAND, "--bootstrap-server", bootstrap(cluster), *args)

    try:
        ok(configs("--alter", "--entity-type", "brokers", "--entity-name", "0", "--add-config",
                   "log.retention.ms=7200000"))
        ok(configs("--alter", "--entity-type", "brokers", "--entity-default", "--add-config",
                   "log.retention.ms=172800000,log.cleaner.delete.retention.ms=3600000"))
        zero = ok(configs("--describe", "--entity-type", "brokers", "--entity-name", "0"))
        assert "Dynamic configs for broker 0 are:" in zero, zero
        assert ("log.retention.ms=7200000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.ms=7200000, "
                "DYNAMIC_DEFAULT_BROKER_CONFIG:log.retention.ms=172800000, DEFAULT_CONFIG:log.retention.ms=604800000}"
                ) in zero, zero
        assert "log.cleaner.delete.retention.ms" not in zero  # the default's, not broker 0's own
        default = ok(configs("--describe", "--entity-type", "brokers", "--entity-default"))
        assert "Default configs for brokers in the cluster are:" in default, default
        assert "log.retention.ms=172800000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:" \
               "log.retention.ms=172800000}" in default, default
        assert "log.cleaner.delete.retention.ms=3600000" in default, default
        every = ok(configs("--describe", "--all", "--entity-type", "brokers", "--entity-name", "1"))
        assert "All configs for broker 1 are:" in every, every
        assert "log.retention.ms=172800000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:" in every, every
        assert "broker.id=1 sensitive=false" in every and "log.segment.bytes=1073741824" in every, every

        refused = configs("--alter", "--entity-type", "brokers", "--entity-name", "1", "--add-config",
                          "num.partitions=5,log.segment.bytes=2000000")
        assert refused.returncode != 0, refused.stdout
        assert "Cannot update these configs dynamically: Set(num.partitions)" in refused.stdout + refused.stderr
        one = json.loads(gregor_cli(cluster, "--output", "json", "configs", "--describe", "--entity-type", "brokers",
                                    "--entity-name", "1"))
        assert one == [], one  # nothing written

        mine = json.loads(gregor_cli(cluster, "--output", "json", "configs", "--describe", "--entity-type", "brokers",
                                     "--entity-name", "0"))
        assert [(e["name"], e["value"], e["source"]) for e in mine] == [
            ("log.retention.ms", "7200000", "DYNAMIC_BROKER_CONFIG")], mine
        text = gregor_cli(cluster, "configs", "--describe", "--entity-type", "brokers", "--entity-default")
        assert "Default configs for brokers in the cluster are:" in text and "log.retention.ms=172800000" in text
        every_broker = gregor_cli(cluster, "configs", "--describe", "--entity-type", "brokers")  # Kafka's form
        assert [line for line in every_broker.splitlines() if line.endswith(" are:")] == [
            "Dynamic configs for broker 0 are:", "Dynamic configs for broker 1 are:",
            "Dynamic configs for broker 2 are:", "Default configs for brokers in the cluster are:"], every_broker
        env = {**os.environ, "GREGOR_DATA_DIR": cluster.data_dir}
        bad = subprocess.run([*GREGOR, "configs", "--alter", "--entity-type", "brokers", "--entity-default",
                              "--add-config", "log.retention.fortnights=1"], capture_output=True, text=True,
                             timeout=WAIT_S, env=env, stdin=subprocess.DEVNULL)
        assert bad.returncode != 0 and "Unknown broker config name: log.retention.fortnights" in bad.stderr, bad
        assert "fortnights" not in gregor_cli(cluster, "configs", "--describe", "--entity-type", "brokers",
                                              "--entity-default")
    finally:
        gregor_cli(cluster, "configs", "--alter", "--entity-type", "brokers", "--entity-name", "0",
                   "--delete-config", "log.retention.ms")
        gregor_cli(cluster, "configs", "--alter", "--entity-type", "brokers", "--entity-default",
                   "--delete-config", "log.retention.ms,log.cleaner.delete.retention.ms")


# ---- VerifiableProducer / VerifiableConsumer ----------------------------------------------------------

def test_verifiable_producer_and_a_rebalancing_group_of_verifiable_consumers(
        kafka: KafkaDist, cluster: LocalCluster, tmp_path: Any) -> None:
    topic = new_topic(kafka, cluster, 6)
    group = f"verifiable-{topic}"
    producer_config = write_properties(tmp_path, "producer.properties", {
        "enable.idempotence": "true", "retries": "2147483647", "max.in.flight.requests.per.connection": "5"})
    consumer_args = ["--bootstrap-server", bootstrap(cluster), "--topic", topic, "--group-id", group, "--verbose",
                     "--session-timeout", "10000", "--reset-policy", "earliest"]
    # The producer runs at a bounded rate while the consumers join one after another: each join rebalances
    # the group while records flow.
    producer = JsonTool(kafka, VERIFIABLE_PRODUCER, "--bootstrap-server", bootstrap(cluster), "--topic", topic,
                        "--max-messages", "3000", "--throughput", "300", "--repeating-keys", "60", "--acks", "-1",
                        "--command-config", producer_config)
    consumers: list[JsonTool] = []
    try:
        for n in range(3):
            consumers.append(JsonTool(kafka, VERIFIABLE_CONSUMER, *consumer_args))
            wait_for(lambda: consumers[-1].named("partitions_assigned") and
                     any(p for p in consumers[-1].named("partitions_assigned")[-1]["partitions"]) and
                     consumed(consumers), WAIT_S, f"consumer {n} assigned partitions and records consumed")
        assert producer.wait() == 0, producer.why()
        sent = acked(producer)
        assert producer.named("tool_data")[-1]["acked"] == 3000 == len(sent)
        assert {p for p, _ in sent} == set(range(6))
        wait_for(lambda: sent.keys() <= consumed(consumers).keys(), WAIT_S, "every acked record consumed")
        # the three members' assignments before any of them leaves (each leave rebalances the others)
        final = [{(p["topic"], p["partition"]) for p in c.named("partitions_assigned")[-1]["partitions"]}
                 for c in consumers]
    finally:
        for c in consumers:
            c.stop()
        producer.stop()
    got = consumed(consumers)
    assert all(got[k] == v for k, v in sent.items())  # the same value at the same offset
    # Idempotence: the values acked are exactly 0..2999, each once, at one offset each.
    assert sorted(int(v) for v in sent.values()) == list(range(3000))
    # Rebalances: the first consumer started with all six partitions and ended with fewer; at the end the
    # three consumers' assignments partition the topic.
    first = consumers[0].named("partitions_assigned")
    assert len(first[0]["partitions"]) == 6 and len(first[-1]["partitions"]) < 6
    assert all(c.named("partitions_revoked") for c in consumers[:2])
    assert sorted(x for s in final for x in s) == [(topic, p) for p in range(6)]
    # Committed offsets: every commit the consumers report succeeded, and the group's committed offsets are
    # the log end offsets (they committed what they consumed before leaving).
    commits = [e for c in consumers for e in c.named("offsets_committed")]
    assert commits and all(e["success"] for e in commits), [e for e in commits if not e["success"]][:3]
    ends = {p: max(o for (q, o) in sent if q == p) + 1 for p in range(6)}
    described = ok(run_tool(kafka, GROUP_COMMAND, "--bootstrap-server", bootstrap(cluster), "--describe",
                            "--group", group))
    table = {int(r[2]): int(r[3]) for r in (line.split() for line in described.splitlines())
             if len(r) >= 6 and r[0] == group and r[1] == topic}
    assert table == ends, described


# ---- transactions (second stage) ---------------------------------------------------------------------

def _copy_transactionally(kafka: KafkaDist, cluster: LocalCluster, tmp_path: Any, count: int,
                          txn_id: str) -> tuple[str, str, list[str]]:
    """VerifiableProducer writes `count` records to a one-partition input topic; TransactionalMessageCopier
    copies them to an output topic in transactions (offsets committed in the same transactions)."""
    source, sink = new_topic(kafka, cluster, 1), new_topic(kafka, cluster, 1)
    producer_config = write_properties(tmp_path, f"{txn_id}.properties", {
        "enable.idempotence": "true", "retries": "2147483647"})
    producer = JsonTool(kafka, VERIFIABLE_PRODUCER, "--bootstrap-server", bootstrap(cluster), "--topic", source,
                        "--max-messages", str(count), "--acks", "-1", "--command-config", producer_config)
    assert producer.wait() == 0, producer.why()
    values = [e["value"] for e in producer.named("producer_send_success")]
    copier = JsonTool(kafka, MESSAGE_COPIER, "--broker-list", bootstrap(cluster), "--input-topic", source,
                      "--input-partition", "0", "--output-topic", sink, "--transactional-id", txn_id,
                      "--consumer-group", f"copier-{txn_id}", "--transaction-size", "50",
                      "--max-messages", str(count), "--use-group-metadata")
    try:
        assert copier.wait() == 0, copier.why()
    finally:
        copier.stop()
    progress = [e for e in copier.events if "remaining" in e]
    assert progress and progress[-1]["remaining"] == 0, copier.events[-3:]
    return source, sink, values


def test_transactional_message_copier_copies_exactly_once_read_committed(
        kafka: KafkaDist, cluster: LocalCluster, tmp_path: Any) -> None:
    _, sink, values = _copy_transactionally(kafka, cluster, tmp_path, 500, f"copier-{uuid.uuid4().hex[:6]}")
    out = ok(run_tool(kafka, CONSOLE_CONSUMER, "--bootstrap-server", bootstrap(cluster), "--topic", sink,
                      "--from-beginning", "--max-messages", str(len(values)), "--timeout-ms", "60000",
                      "--isolation-level", "read_committed"))
    assert out.split() == values  # every record once, in order, only committed ones


def test_kafka_transactions_lists_and_describes(kafka: KafkaDist, cluster: LocalCluster, tmp_path: Any) -> None:
    txn_id = f"txn-{uuid.uuid4().hex[:6]}"
    _, sink, _ = _copy_transactionally(kafka, cluster, tmp_path, 100, txn_id)
    listed = ok(run_tool(kafka, TRANSACTIONS_COMMAND, "--bootstrap-server", bootstrap(cluster), "list"))
    assert txn_id in listed.split(), listed
    described = ok(run_tool(kafka, TRANSACTIONS_COMMAND, "--bootstrap-server", bootstrap(cluster), "describe",
                            "--transactional-id", txn_id))
    assert txn_id in described and ("CompleteCommit" in described or "Empty" in described), described
    producers = ok(run_tool(kafka, TRANSACTIONS_COMMAND, "--bootstrap-server", bootstrap(cluster),
                            "describe-producers", "--topic", sink, "--partition", "0"))
    assert "ProducerId" in producers and len(producers.strip().splitlines()) >= 2, producers


# ---- a leader killed under VerifiableProducer (acks=all) loses no acknowledged record --------------------
# Last in the module: it kills a broker (and starts it again for any test after it).

def test_leader_killed_mid_stream_loses_no_acknowledged_record(
        kafka: KafkaDist, cluster: LocalCluster, tmp_path: Any) -> None:
    topic = new_topic(kafka, cluster, 2, "--config", "min.insync.replicas=2")
    producer_config = write_properties(tmp_path, "producer.properties", {
        "enable.idempotence": "true", "retries": "2147483647", "max.in.flight.requests.per.connection": "5",
        "delivery.timeout.ms": "120000", "request.timeout.ms": "10000"})
    producer = JsonTool(kafka, VERIFIABLE_PRODUCER, "--bootstrap-server", bootstrap(cluster), "--topic", topic,
                        "--max-messages", "3000", "--throughput", "250", "--repeating-keys", "20", "--acks", "-1",
                        "--command-config", producer_config)
    try:
        wait_for(lambda: len(producer.named("producer_send_success")) >= 500, WAIT_S, "500 records acked")
        md = AdminClient({"bootstrap.servers": bootstrap(cluster)}).list_topics(topic, timeout=10)
        leader = md.topics[topic].partitions[0].leader
        victim = next(p for p in cluster.by_role("broker") if p.id == leader)
        stop_process(victim, 9)  # SIGKILL the leader of partition 0 mid-stream
        killed_at = len(producer.named("producer_send_success"))
        assert producer.wait(180) == 0, producer.why()
    finally:
        producer.stop()
    restart_broker(cluster, victim)
    sent = acked(producer)
    errors = producer.named("producer_send_error")
    assert producer.named("tool_data")[-1]["acked"] == len(sent) and killed_at < len(sent)
    assert len(sent) + len(errors) == 3000 and len(sent) >= 2900, errors[:3]  # retried through the failover
    consumer = JsonTool(kafka, VERIFIABLE_CONSUMER, "--bootstrap-server", bootstrap(cluster), "--topic", topic,
                        "--group-id", f"check-{topic}", "--verbose", "--reset-policy", "earliest")
    try:
        wait_for(lambda: sent.keys() <= consumed([consumer]).keys(), WAIT_S,
                 "every acknowledged record consumed after the failover")
    finally:
        consumer.stop()
    got = consumed([consumer])
    missing = {k: v for k, v in sent.items() if got.get(k) != v}
    assert not missing, f"{len(missing)} acknowledged records lost or changed, e.g. {list(missing.items())[:5]}"
    values = [int(v) for v in got.values()]
    assert len(values) == len(set(values)), "a record was written twice (idempotence broken by the failover)"
