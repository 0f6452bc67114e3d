"""partitioner.class with real processes: the SDK producer, `gregor produce` and the producer gateway
(`gregor cluster up --gateway-property`) put every record where the configured partitioner says.

ValueDigitPartitioner below is the custom class: loaded by import path in this process, in the
`gregor produce` subprocess and in the gateway process. Values carry no key, so the built-in
partitioner would stick to one partition per batch; spreading them over the partitions by the
value's leading digit proves the custom partitioner decided each record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, Optional, Sequence

import pytest

from gregor.client import Consumer, Producer
from gregor.client.partitioner import InvalidPartitionError
from gregor.gateway.client import GatewayClient, record
from tests.integration.test_broker import create_topic
from tests.integration.test_cli import SERVICES, failed, gregor, json_lines, ok

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Subprocesses (the CLI, and the gateway it starts) import this module by the same path.
ENV_PATH = {"PYTHONPATH": f"{os.path.abspath(SERVICES)}{os.pathsep}{ROOT}"}
PARTITIONS = 3
RR = "org.apache.kafka.clients.producer.RoundRobinPartitioner"
STANDALONE = ("--brokers", "1", "--controllers", "0")


class ValueDigitPartitioner:
    """Record value b"<d>:..." goes to partition d % num_partitions; remembers configure() and close()."""

    instances: list["ValueDigitPartitioner"] = []

    def __init__(self) -> None:
        self.configs: Optional[dict[str, Any]] = None
        self.closed = False
        ValueDigitPartitioner.instances.append(self)

    def configure(self, configs: dict[str, Any]) -> None:
        self.configs = configs

    def partition(self, topic: str, key: Optional[bytes], value: Optional[bytes], num_partitions: int,
                  available_partitions: Sequence[int]) -> int:
        return int((value or b"0").split(b":", 1)[0]) % num_partitions

    def close(self) -> None:
        self.closed = True


class OutOfRangePartitioner:
    """Returns a partition the topic does not have for values starting with "x", else partition 0."""

    def partition(self, topic: str, key: Optional[bytes], value: Optional[bytes], num_partitions: int,
                  available_partitions: Sequence[int]) -> int:
        return num_partitions if (value or b"").startswith(b"x") else 0


PATH = f"{__name__}.ValueDigitPartitioner"


def expected(value: bytes) -> int:
    return int(value.split(b":", 1)[0]) % PARTITIONS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A standalone broker and one gateway whose producer runs ValueDigitPartitioner (--gateway-property)."""
    d = str(tmp_path_factory.mktemp("partitioner"))
    env = {"GREGOR_DATA_DIR": d, **ENV_PATH}
    up = gregor("cluster", "up", *STANDALONE, "--gateways", "1", "--gateway-property", f"partitioner.class={PATH}",
                "--gateway-property", "linger.ms=50", env=env, timeout=120)
    try:
        ok(up)
        with open(os.path.join(d, "cluster.json")) as f:
            doc = json.load(f)
        (broker,) = [p["grpc"] for p in doc["processes"] if p["role"] == "broker"]
        yield {"env": env, "bootstrap": broker, "gateways": doc["gateways"]}
    finally:
        gregor("cluster", "down", env=env, timeout=120)


async def consume_all(bootstrap: str, topic: str, n: int) -> dict[bytes, int]:
    """value -> partition of every record of topic (n of them), read back from the broker."""
    got: dict[bytes, int] = {}
    async with Consumer({"bootstrap.servers": bootstrap, "fetch.max.wait.ms": 100}) as c:
        tps = [(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        for _ in range(100):
            for rec in await c.poll(200):
                assert rec.value is not None and rec.value not in got
                got[rec.value] = rec.partition
            if len(got) >= n:
                break
    assert len(got) == n, f"read back {len(got)} of {n} records"
    return got


async def test_sdk_producer_puts_every_record_where_the_custom_partitioner_says(cluster: dict[str, Any]) -> None:
    b, topic = cluster["bootstrap"], "sdk"
    await create_topic(b, topic, PARTITIONS)
    values = [f"{i % 7}:{i}".encode() for i in range(60)]
    ValueDigitPartitioner.instances.clear()
    producer = Producer({"bootstrap.servers": b, "partitioner.class": PATH, "linger.ms": 20})
    (part,) = ValueDigitPartitioner.instances
    assert part.configs is not None and part.configs["linger.ms"] == 20
    async with producer:
        handles = [await producer.send(topic, v) for v in values]
        acked = {v: (await h).partition for v, h in zip(values, handles)}
        # An explicit partition still wins over the partitioner.
        assert (await producer.send_and_wait(topic, b"0:pinned", partition=2)).partition == 2
    assert part.closed
    assert acked == {v: expected(v) for v in values}
    landed = await consume_all(b, topic, len(values) + 1)
    assert landed == {**acked, b"0:pinned": 2}
    assert set(landed.values()) == {0, 1, 2}


async def test_a_partition_outside_the_topic_fails_that_send_only(cluster: dict[str, Any]) -> None:
    b, topic = cluster["bootstrap"], "bad"
    await create_topic(b, topic, PARTITIONS)
    async with Producer({"bootstrap.servers": b, "partitioner.class": OutOfRangePartitioner}) as producer:
        with pytest.raises(InvalidPartitionError, match=r"invalid partition number: 3\. Topic 'bad' has 3 "
                                                        r"partitions: it must be in \[0, 3\)"):
            await producer.send(topic, b"x1")
        md = await producer.send_and_wait(topic, b"fine")  # the producer carries on
    assert (md.partition, md.offset) == (0, 0)
    assert await consume_all(b, topic, 1) == {b"fine": 0}


def test_cli_produce_takes_partitioner_class_as_a_producer_property(cluster: dict[str, Any]) -> None:
    env, topic = cluster["env"], "cli"
    ok(gregor("topics", "create", topic, "--partitions", str(PARTITIONS), env=env))
    lines = "".join(f"{i % 5}:{i}\n" for i in range(20))
    out = json_lines(ok(gregor("-o", "json", "produce", topic, "--producer-property", f"partitioner.class={PATH}",
                               input=lines, env=env)))
    assert [(r["value"], r["partition"]) for r in out] == [
        (f"{i % 5}:{i}", expected(f"{i % 5}:{i}".encode())) for i in range(20)]
    # Kafka's class name of the round-robin partitioner: one record per partition in turn.
    out = json_lines(ok(gregor("-o", "json", "produce", topic, "--producer-property", f"partitioner.class={RR}",
                               input="".join(f"r{i}\n" for i in range(9)), env=env)))
    assert [r["partition"] for r in out] == [0, 1, 2] * 3
    failed(gregor("produce", topic, "--producer-property", "partitioner.class=com.example.Nope", input="a\n",
                  env=env), "Invalid value com.example.Nope for configuration partitioner.class: "
                            "Class com.example.Nope could not be found.", code=2)


async def test_gateway_property_partitioner_class_reaches_the_gateways_producer(cluster: dict[str, Any]) -> None:
    b, topic = cluster["bootstrap"], "gw"
    await create_topic(b, topic, PARTITIONS)
    values = [f"{i % 4}:{i}".encode() for i in range(40)]
    async with GatewayClient(cluster["gateways"]) as gw:
        results = await gw.produce(topic, [record(v) for v in values])
    assert [r.error.code for r in results] == [0] * len(values)
    assert [r.partition for r in results] == [expected(v) for v in values]
    assert await consume_all(b, topic, len(values)) == {v: expected(v) for v in values}


def test_cluster_up_reports_an_unloadable_gateway_partitioner(tmp_path: Any) -> None:
    env = {"GREGOR_DATA_DIR": str(tmp_path)}
    proc = gregor("cluster", "up", *STANDALONE, "--gateways", "1", "--gateway-property",
                  "partitioner.class=com.example.Nope", env=env, timeout=120)
    failed(proc, "Class com.example.Nope could not be found.")
