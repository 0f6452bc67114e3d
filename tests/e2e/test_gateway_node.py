"""A second-language client end to end: examples/node (grpc-js + proto-loader) -> producer gateway -> broker.

The Node producer runs as a real `node` process against a local cluster started
by the launcher (`gregor cluster up --gateways 1`'s code); the records are read
back with the Python SDK consumer: same values, keys, headers and positions the
Node client printed, keyed records on Kafka's murmur2 partition.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gregor.cli.local_cluster import LocalCluster
from gregor.client.admin import AdminClient
from gregor.client.consumer import Consumer, ConsumerRecord
from gregor.client.partitioner import murmur2, to_positive
from tests.helpers.cluster import tear_down

NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"
PARTITIONS = 3


@pytest.fixture(scope="module")
def node_example() -> Path:
    """examples/node with its pinned dependencies installed (`make examples` does the same `npm ci`)."""
    assert shutil.which("node") and shutil.which("npm"), "node and npm are needed (see examples/node/README.md)"
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
    return NODE_DIR


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("node")), brokers=1, gateways=1)
    try:
        async def create() -> None:
            async with AdminClient({"bootstrap.servers": c.bootstrap}) as admin:
                await admin.create_topic("from-node", PARTITIONS, 1)
        asyncio.run(create())
        yield c
    finally:
        tear_down(c)


def run_node(node_dir: Path, *args: str, stdin: str = "") -> tuple[int, list[dict[str, object]], str]:
    proc = subprocess.run(["node", str(node_dir / "producer.js"), *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env={**os.environ})
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr


async def read_back(bootstrap: str, expected: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        tps = [("from-node", p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            out += await consumer.poll(500)
    return out


def test_node_producer_records_land_in_the_log(node_example: Path, cluster: LocalCluster) -> None:
    gateway = cluster.by_role("gateway")[0].grpc
    code, unary, err = run_node(node_example, "--gateway", gateway, "--topic", "from-node", "--count", "20",
                                "--key-prefix", "user-", "--prefix", "unary-")
    assert code == 0, err
    code, streamed, err = run_node(node_example, "--gateway", gateway, "--topic", "from-node", "--count", "30",
                                   "--mode", "stream", "--partition", "2", "--prefix", "stream-")
    assert code == 0, err
    code, batched, err = run_node(node_example, "--gateway", gateway, "--topic", "from-node", "--count", "25",
                                  "--mode", "stream-batch", "--batch-size", "10", "--key-prefix", "bk-",
                                  "--prefix", "batch-")
    assert code == 0, err
    code, piped, err = run_node(node_example, "--gateway", gateway, "--topic", "from-node", "--stdin",
                                stdin="k1:hello\nk2:world\nno separator\n")
    assert code == 0, err
    assert [r["correlation_id"] for r in unary] == list(range(20))
    assert [r["partition"] for r in unary] == [to_positive(murmur2(b"user-%d" % i)) % PARTITIONS for i in range(20)]
    assert {r["partition"] for r in streamed} == {2}
    stream_offsets = [r["offset"] for r in streamed]
    assert stream_offsets == sorted(stream_offsets)  # one partition: order kept

    # ProduceStreamBatch: 3 messages of up to 10 records, one result each, keyed by the default partitioner.
    assert [r["correlation_id"] for r in batched] == list(range(25))
    assert [r["partition"] for r in batched] == [to_positive(murmur2(b"bk-%d" % i)) % PARTITIONS for i in range(25)]

    records = asyncio.run(read_back(cluster.bootstrap, 78))
    at = {(r.partition, r.offset): r for r in records}
    assert len(records) == 78
    for i, r in enumerate(unary):
        rec = at[(int(r["partition"]), int(r["offset"]))]  # type: ignore[call-overload]
        assert (rec.key, rec.value, rec.headers) == (b"user-%d" % i, b"unary-%d" % i, [("client", b"node")])
    for i, r in enumerate(streamed):
        rec = at[(2, int(r["offset"]))]  # type: ignore[call-overload]
        assert (rec.key, rec.value) == (None, b"stream-%d" % i)
    for i, r in enumerate(batched):
        rec = at[(int(r["partition"]), int(r["offset"]))]  # type: ignore[call-overload]
        assert (rec.key, rec.value) == (b"bk-%d" % i, b"batch-%d" % i)
    got = [(at[(int(r["partition"]), int(r["offset"]))].key, at[(int(r["partition"]), int(r["offset"]))].value)  # type: ignore[call-overload]
           for r in piped]
    assert got == [(b"k1", b"hello"), (b"k2", b"world"), (None, b"no separator")]


def test_node_producer_gets_typed_errors_and_fails_over(node_example: Path, cluster: LocalCluster) -> None:
    gateway = cluster.by_role("gateway")[0].grpc
    code, out, _ = run_node(node_example, "--gateway", gateway, "--topic", "no-such-topic", "--count", "2")
    assert code == 1
    assert [r["error"]["code"] for r in out] == ["UNKNOWN_TOPIC_OR_PARTITION"] * 2  # type: ignore[index]
    # A dead first gateway (nothing listens there): UNAVAILABLE, then the live one answers.
    from gregor.cli.local_cluster import free_port

    dead = f"127.0.0.1:{free_port()}"
    code, out, err = run_node(node_example, "--gateway", f"{dead},{gateway}", "--topic", "from-node",
                              "--count", "1", "--prefix", "failover-")
    assert code == 0, err
    assert out[0]["offset"] >= 0  # type: ignore[operator]
