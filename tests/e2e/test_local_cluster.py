"""The `gregor` command end to end: cluster up, topics, produce, consume, log dump, cluster down."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GREGOR = [os.path.join(os.path.dirname(sys.executable), "gregor")]  # the installed entry point


def gregor(*args: str, data_dir: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GREGOR_DATA_DIR": data_dir}
    env.pop("GREGOR_BOOTSTRAP", None)
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
    up = gregor("cluster", "up", "--data-dir", data_dir, "--brokers", "1", data_dir=data_dir)
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
