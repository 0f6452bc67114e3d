"""The `gregor` command end to end: cluster up, topics, produce, consume, log dump, cluster describe, down."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.helpers.wait import wait_for as until

GREGOR = [os.path.join(os.path.dirname(sys.executable), "gregor")]  # the installed entry point


def gregor(*args: str, data_dir: str, stdin: str | None = None, check: bool = True,
           bootstrap_env: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": data_dir}
    env.pop("GREGOR_BOOTSTRAP", None)
    if bootstrap_env is not None:
        env["GREGOR_BOOTSTRAP"] = bootstrap_env
    proc = subprocess.run([*GREGOR, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"gregor {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_cluster_up_produce_consume_down(tmp_path) -> None:
    data_dir = str(tmp_path / "gregor")
    up = gregor("cluster", "up", "--data-dir", data_dir, "--standalone", data_dir=data_dir)
    cluster = json.loads(up.stdout)
    try:
        with open(os.path.join(data_dir, "cluster.json")) as f:
            assert json.load(f) == cluster
        roles = sorted(p["role"] for p in cluster["processes"])
        assert roles == ["broker", "etcd"]
        for p in cluster["processes"]:
            assert {"role", "id", "pid", "grpc", "metrics", "log", "data_dir"} <= set(p)
            assert alive(p["pid"])
        assert cluster["bootstrap"] == next(p["grpc"] for p in cluster["processes"] if p["role"] == "broker")

        described = json.loads(gregor("--output", "json", "cluster", "describe", data_dir=data_dir).stdout)
        assert [b["id"] for b in described["brokers"]] == [0]

        gregor("topics", "create", "e2e", "--partitions", "2", "--replication-factor", "1", data_dir=data_dir)
        listed = gregor("--output", "json", "topics", "list", data_dir=data_dir).stdout
        assert "e2e" in listed

        lines = "".join(f"k{i}:value-{i}\n" for i in range(20))
        produced = gregor("--output", "json", "produce", "e2e", "--property", "parse.key=true",
                          "--property", "key.separator=:", data_dir=data_dir, stdin=lines).stdout.splitlines()
        acks = [json.loads(line) for line in produced]
        assert len(acks) == 20 and all("offset" in a and "error" not in a for a in acks)
        # Same key, same partition (murmur2 partitioner).
        by_key = {a["key"]: a["partition"] for a in acks}
        assert set(by_key.values()) <= {0, 1}

        consumed = gregor("consume", "e2e", "--from-beginning", "--max-messages", "20", "--timeout-ms", "10000",
                          "--output", "json", data_dir=data_dir).stdout.splitlines()  # option after the command
        records = [json.loads(line) for line in consumed]
        assert sorted(r["value"] for r in records) == sorted(f"value-{i}" for i in range(20))
        for r in records:
            assert by_key[r["key"]] == r["partition"]
        # Per-partition order is the produce order.
        for part in (0, 1):
            offsets = [r["offset"] for r in records if r["partition"] == part]
            assert offsets == sorted(offsets)

        dump = gregor("log", "dump", os.path.join(data_dir, "broker-0", "e2e-0"), data_dir=data_dir).stdout
        assert "baseOffset" in dump or "base_offset" in dump

        bad = gregor("topics", "create", "e2e", "--partitions", "1", "--replication-factor", "1",
                     data_dir=data_dir, check=False)
        assert bad.returncode != 0 and "already exists" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        gregor("cluster", "down", "--data-dir", data_dir, data_dir=data_dir, check=False)
    for p in cluster["processes"]:
        assert not alive(p["pid"])
    assert not os.path.exists(os.path.join(data_dir, "cluster.json"))


def test_cluster_commands_without_a_cluster_fail_cleanly(tmp_path) -> None:
    data_dir = str(tmp_path / "none")
    down = gregor("cluster", "down", "--data-dir", data_dir, data_dir=data_dir, check=False)
    assert down.returncode != 0 and "no cluster" in down.stderr and "Traceback" not in down.stderr


# -- `gregor cluster up` with its defaults: 3 brokers and 2 controllers in cluster mode -------------------------

LEASE_TTL_MS = 2000  # controller lease and broker.session.timeout.ms
# A SIGKILLed process is noticed when its lease expires (<= TTL), then an election or onBrokerFailure runs,
# then UpdateMetadata reaches the brokers; the margin covers a loaded 2-core machine.
FAILOVER_S = LEASE_TTL_MS / 1000 + 13


@pytest.fixture(scope="module")
def rf3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    """A cluster started by `gregor cluster up` with the default process counts; (data dir, cluster.json)."""
    data_dir = str(tmp_path_factory.mktemp("rf3") / "gregor")
    up = gregor("cluster", "up", "--data-dir", data_dir, "--lease-ttl-ms", str(LEASE_TTL_MS), data_dir=data_dir)
    cluster = json.loads(up.stdout)
    try:
        yield data_dir, cluster
    finally:
        gregor("cluster", "down", "--data-dir", data_dir, data_dir=data_dir, check=False)
        for p in cluster["processes"]:
            if alive(p["pid"]):
                os.kill(p["pid"], signal.SIGKILL)


def processes(cluster: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return sorted((p for p in cluster["processes"] if p["role"] == role), key=lambda p: p["id"])



def test_cluster_describe_shows_controller_and_brokers_and_follows_failover(rf3, tmp_path) -> None:
    data_dir, cluster = rf3
    # DESIGN.md's defaults: --brokers 3 --controllers 2 --coordinators 1 --gateways 1.
    roles = ("etcd", "controller", "broker", "coordinator", "gateway")
    assert [len(processes(cluster, r)) for r in roles] == [1, 2, 3, 1, 1]
    brokers = processes(cluster, "broker")
    expected = [{"id": b["id"], "epoch": b["extra"]["broker_epoch"], "grpc": b["grpc"]} for b in brokers]

    def described(**kw: Any) -> dict[str, Any]:
        doc = json.loads(gregor("--output", "json", "cluster", "describe", **kw).stdout)
        assert set(doc) == {"cluster_id", "controller_id", "controller_epoch", "brokers"}
        return doc

    # From cluster.json (GREGOR_DATA_DIR) ...
    doc = described(data_dir=data_dir)
    assert doc["cluster_id"] == "gregor"
    assert doc["controller_id"] in {c["id"] for c in processes(cluster, "controller")}
    assert doc["controller_epoch"] >= 1
    assert [{k: b[k] for k in ("id", "epoch", "grpc")} for b in doc["brokers"]] == expected
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", b["data"]) for b in doc["brokers"])
    # ... or from any one broker, by flag or environment, with no cluster.json around.
    nowhere = str(tmp_path / "no-cluster")
    assert described(data_dir=nowhere, bootstrap_env=brokers[2]["grpc"]) == doc
    assert json.loads(gregor("--bootstrap", brokers[1]["grpc"], "-o", "json", "cluster", "describe",
                             data_dir=nowhere).stdout) == doc
    assert json.loads(gregor("-o", "json", "cluster", "describe", "--data-dir", data_dir,
                             data_dir=nowhere).stdout) == doc  # the command's own --data-dir

    text = gregor("cluster", "describe", data_dir=data_dir).stdout.splitlines()
    assert text[0] == (f"ClusterId: gregor\tController: {doc['controller_id']}\t"
                       f"ControllerEpoch: {doc['controller_epoch']}")
    assert text[1:] == [f"Broker: {b['id']}\tEpoch: {b['epoch']}\tEndpoint: {b['grpc']}\tDataPort: {b['data']}"
                        for b in doc["brokers"]]

    bad = gregor("cluster", "describe", data_dir=nowhere, check=False)
    assert bad.returncode == 1 and "no broker to talk to" in bad.stderr and "Traceback" not in bad.stderr
    # --bootstrap wins over a cluster.json that would have worked.
    bad = gregor("--bootstrap", "127.0.0.1:1", "cluster", "describe", data_dir=data_dir, check=False)
    assert bad.returncode == 1 and "cannot reach the cluster" in bad.stderr and "Traceback" not in bad.stderr

    # SIGKILL the active controller: the standby wins the next election, one epoch later.
    active = next(c for c in processes(cluster, "controller") if c["id"] == doc["controller_id"])
    os.kill(active["pid"], signal.SIGKILL)

    def moved() -> dict[str, Any] | None:
        now = described(data_dir=data_dir)
        return now if now["controller_id"] not in (-1, active["id"]) else None

    after = until(moved, FAILOVER_S, "a standby controller takes over")
    assert after["controller_epoch"] == doc["controller_epoch"] + 1, (doc, after)
    assert after["brokers"] == doc["brokers"], "the brokers did not notice: same registrations, same epochs"
    text = gregor("cluster", "describe", data_dir=data_dir).stdout.splitlines()
    assert text[0] == (f"ClusterId: gregor\tController: {after['controller_id']}\t"
                       f"ControllerEpoch: {after['controller_epoch']}")


def test_under_min_isr_partitions_lists_partitions_whose_isr_fell_below_the_minimum(rf3) -> None:
    data_dir, cluster = rf3
    gregor("topics", "create", "strict", "--partitions", "2", "--replication-factor", "3",
           "--config", "min.insync.replicas=3", data_dir=data_dir)
    gregor("topics", "create", "lenient", "--partitions", "1", "--replication-factor", "3", data_dir=data_dir)

    def describe(*flags: str) -> list[dict[str, Any]]:
        return json.loads(gregor("-o", "json", "topics", "describe", *flags, data_dir=data_dir).stdout)

    until(lambda: all(len(p["isr"]) == 3 for t in describe() for p in t["partitions"]), 15, "full ISRs")
    assert describe("--under-min-isr-partitions") == []
    assert gregor("topics", "describe", "--under-min-isr-partitions", data_dir=data_dir).stdout == ""

    victim = processes(cluster, "broker")[2]
    os.kill(victim["pid"], signal.SIGKILL)

    def shrunk() -> list[dict[str, Any]]:
        # Until the controller declares the broker dead the metadata still lists it; the admin
        # client moves past it to a live broker, so every call must succeed.
        found = describe("--under-min-isr-partitions")
        return found if found and len(found[0]["partitions"]) == 2 else []

    (strict,) = until(shrunk, FAILOVER_S, "the controller takes the dead broker out of the ISRs")
    assert strict["topic"] == "strict" and strict["configs"] == {"min.insync.replicas": "3"}
    for p in strict["partitions"]:
        assert sorted(p["replicas"]) == [0, 1, 2] and sorted(p["isr"]) == [0, 1] and p["leader"] in (0, 1)
        assert p["offline_replicas"] == [2]
    # min.insync.replicas=1 (the default): under-replicated, but not under the minimum.
    assert "lenient" in [t["topic"] for t in describe("--under-replicated-partitions")]

    lines = gregor("topics", "describe", "--under-min-isr-partitions", data_dir=data_dir).stdout.splitlines()
    assert lines == [f"\tTopic: strict\tPartition: {p['partition']}\tLeader: {p['leader']}\t"
                     f"Replicas: {','.join(map(str, p['replicas']))}\tIsr: {','.join(map(str, p['isr']))}\t"
                     f"LeaderEpoch: {p['leader_epoch']}\tOffline: 2" for p in strict["partitions"]]
