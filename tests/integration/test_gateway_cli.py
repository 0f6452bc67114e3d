"""`gregor cluster up --gateways N`, `gregor perf produce --gateway/--via-gateway` and `gregor perf e2e`, as users run them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.integration.test_cli import failed, gregor, json_lines, ok

KAFKA_SUMMARY = re.compile(r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                           r"[\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.$")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = str(tmp_path_factory.mktemp("gwcli"))
    env = {"GREGOR_DATA_DIR": d}
    up = gregor("cluster", "up", "--brokers", "1", "--controllers", "0", "--gateways", "2",
                "--gateway-property", "compression.type=gzip", env=env, timeout=120)
    try:
        ok(up)
        ok(gregor("topics", "create", "perf", "--partitions", "2", "--replication-factor", "1", env=env))
        yield d
    finally:
        gregor("cluster", "down", env=env, timeout=120)


def test_cluster_up_lists_gateways(data_dir: str) -> None:
    with open(f"{data_dir}/cluster.json") as f:
        doc = json.load(f)
    gateways = [p for p in doc["processes"] if p["role"] == "gateway"]
    assert [p["id"] for p in gateways] == [0, 1]
    assert all(p["grpc"] and p["metrics"].endswith("/metrics") and p["pid"] > 0 for p in gateways)
    assert doc["gateways"] == ",".join(p["grpc"] for p in gateways)
    with open(f"/proc/{gateways[0]['pid']}/cmdline") as f:
        assert "compression.type=gzip" in f.read()


def test_cluster_up_rejects_bad_gateway_flags(tmp_path: object) -> None:
    env = {"GREGOR_DATA_DIR": str(tmp_path)}
    standalone = ("--brokers", "1", "--controllers", "0")
    failed(gregor("cluster", "up", *standalone, "--gateways", "-1", env=env), "--gateways", code=2)
    failed(gregor("cluster", "up", *standalone, "--gateways", "1", "--gateway-property", "nonsense", env=env),
           "KEY=VALUE", code=2)
    # A bad producer config stops that gateway at start; the launcher reports why and cleans up.
    proc = gregor("cluster", "up", *standalone, "--gateways", "1", "--gateway-property", "compression.type=brotli",
                  env=env, timeout=120)
    failed(proc, "compression.type")


def test_perf_produce_through_gateway_prints_kafka_summary(data_dir: str) -> None:
    env = {"GREGOR_DATA_DIR": data_dir}
    out = ok(gregor("perf", "produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
                    "--throughput", "-1", "--via-gateway", env=env, timeout=120))
    last = out.strip().splitlines()[-1]
    m = KAFKA_SUMMARY.match(last)
    assert m and m.group(1) == "3000", out
    with open(f"{data_dir}/cluster.json") as f:
        second = json.load(f)["gateways"].split(",")[1]
    summary = json_lines(ok(gregor("perf", "produce", "--topic", "perf", "--num-records", "500", "--record-size",
                                   "10", "--throughput", "2000", "--gateway", second, "--output", "json", env=env,
                                   timeout=120)))[-1]
    assert summary["records"] == 500 and summary["records_per_sec"] <= 2200
    failed(gregor("perf", "produce", "--topic", "no-such", "--num-records", "5", "--record-size", "10",
                  "--throughput", "-1", "--gateway", second, env=env, timeout=60), "UNKNOWN_TOPIC_OR_PARTITION")


def test_perf_e2e_prints_latency_percentiles(data_dir: str) -> None:
    env = {"GREGOR_DATA_DIR": data_dir}
    out = ok(gregor("perf", "e2e", "--topic", "perf", "--num-records", "200", "--record-size", "64",
                    "--producer-acks", "all", env=env, timeout=120))
    assert re.search(r"^Avg latency: \d+\.\d{4} ms$", out, re.M), out
    assert re.search(r"^Percentiles: 50th = \d+, 99th = \d+, 99\.9th = \d+$", out, re.M), out
    assert out.splitlines()[0].startswith("0\t")  # progress line every 1000 records, as EndToEndLatency
    doc = json_lines(ok(gregor("perf", "e2e", "--topic", "perf", "--num-messages", "20", "--message-size", "8",
                               "--output", "json", env=env, timeout=120)))[-1]
    assert doc["records"] == 20 and doc["p50_ms"] <= doc["p99_ms"] <= doc["p999_ms"]
    failed(gregor("perf", "e2e", "--topic", "perf", "--num-records", "0", "--record-size", "8", env=env), "positive",
           code=2)
