"""The `gregor` command against a real broker: the DESIGN.md contract (JSON shapes, exit codes, stderr)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

import pytest

SERVICES = os.path.join(os.path.dirname(__file__), "..", "..", "services")


def gregor(*args: str, input: str | None = None, bootstrap: str | None = None, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": os.path.abspath(SERVICES), **(env or {})}
    full_env.pop("GREGOR_BOOTSTRAP", None)
    if env and "GREGOR_BOOTSTRAP" in env:
        full_env["GREGOR_BOOTSTRAP"] = env["GREGOR_BOOTSTRAP"]
    cmd = [sys.executable, "-m", "gregor.cli.main"] + (["--bootstrap", bootstrap] if bootstrap else []) + list(args)
    return subprocess.run(cmd, input=input, capture_output=True, text=True, env=full_env, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def failed(proc: subprocess.CompletedProcess[str], fragment: str, code: int = 1) -> None:
    assert proc.returncode == code, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def json_lines(out: str) -> list[Any]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_topics_lifecycle_text_and_json(broker) -> None:
    b = broker.grpc
    assert ok(gregor("topics", "create", "orders", "--partitions", "3", "--replication-factor", "1",
                     "--config", "retention.ms=60000", bootstrap=b)) == "Created topic orders.\n"
    failed(gregor("topics", "create", "orders", "--partitions", "3", bootstrap=b), "TOPIC_ALREADY_EXISTS")
    ok(gregor("topics", "create", "orders", "--partitions", "3", "--if-not-exists", bootstrap=b))
    assert ok(gregor("topics", "list", bootstrap=b)).split() == ["orders"]
    assert json_lines(ok(gregor("--output", "json", "topics", "list", bootstrap=b))) == [["orders"]]

    lines = ok(gregor("topics", "describe", "orders", bootstrap=b)).splitlines()
    assert re.fullmatch(r"Topic: orders\tTopicId: [A-Za-z0-9_-]{22}\tPartitionCount: 3\tReplicationFactor: 1\t"
                        r"Configs: retention.ms=60000", lines[0]), lines[0]
    topic_id = lines[0].split("\t")[1].removeprefix("TopicId: ")
    assert topic_id != "AAAAAAAAAAAAAAAAAAAAAA" and not topic_id.startswith("-")  # a real id (KIP-516)
    assert lines[1:] == [f"\tTopic: orders\tPartition: {p}\tLeader: 0\tReplicas: 0\tIsr: 0\tLeaderEpoch: 0"
                         for p in range(3)]
    (desc,) = json_lines(ok(gregor("-o", "json", "topics", "describe", "orders", bootstrap=b)))
    assert desc[0]["topic"] == "orders" and desc[0]["partition_count"] == 3 and desc[0]["topic_id"] == topic_id
    assert desc[0]["configs"] == {"retention.ms": "60000"}
    assert desc[0]["partitions"][2] == {"partition": 2, "leader": 0, "leader_epoch": 0, "replicas": [0],
                                        "isr": [0], "offline_replicas": []}
    # A single healthy broker: every filter finds nothing.
    for flag in ("--under-replicated-partitions", "--under-min-isr-partitions", "--unavailable-partitions"):
        assert ok(gregor("topics", "describe", flag, bootstrap=b)) == ""

    ok(gregor("topics", "alter", "orders", "--partitions", "5", "--config", "retention.ms=1000", bootstrap=b))
    (desc,) = json_lines(ok(gregor("-o", "json", "topics", "describe", "orders", bootstrap=b)))
    assert desc[0]["partition_count"] == 5 and desc[0]["configs"]["retention.ms"] == "1000"
    failed(gregor("topics", "alter", "orders", "--partitions", "2", bootstrap=b), "INVALID_PARTITIONS")
    failed(gregor("topics", "alter", "orders", bootstrap=b), "nothing to alter", code=2)
    failed(gregor("topics", "create", "bad", "--config", "nope", bootstrap=b), "expected KEY=VALUE", code=2)
    failed(gregor("topics", "create", "bad", "--config", "no.such=1", bootstrap=b), "INVALID_CONFIG")

    assert ok(gregor("topics", "delete", "orders", bootstrap=b)) == "Deleted topic orders.\n"
    failed(gregor("topics", "describe", "orders", bootstrap=b), "UNKNOWN_TOPIC_OR_PARTITION")
    failed(gregor("topics", "delete", "orders", bootstrap=b), "UNKNOWN_TOPIC_OR_PARTITION")
    # Re-created under the same name: another topic, another id.
    ok(gregor("topics", "create", "orders", "--partitions", "1", bootstrap=b))
    (desc,) = json_lines(ok(gregor("-o", "json", "topics", "describe", "orders", bootstrap=b)))
    assert desc[0]["topic_id"] not in (topic_id, "AAAAAAAAAAAAAAAAAAAAAA")
    ok(gregor("topics", "delete", "orders", bootstrap=b))


def test_topics_create_and_delete_print_one_json_document(broker) -> None:
    b = broker.grpc
    create = ("-o", "json", "topics", "create", "js", "--partitions", "2", "--replication-factor", "1")
    assert json_lines(ok(gregor(*create, bootstrap=b))) == [{"topic": "js", "created": True}]
    assert json_lines(ok(gregor(*create, "--if-not-exists", bootstrap=b))) == [{"topic": "js", "created": False}]
    proc = gregor(*create, bootstrap=b)
    failed(proc, "TOPIC_ALREADY_EXISTS")
    assert proc.stdout == "", "a failure prints no JSON document"
    (desc,) = json_lines(ok(gregor("-o", "json", "topics", "describe", "js", bootstrap=b)))
    assert desc[0]["partition_count"] == 2

    delete = ("-o", "json", "topics", "delete", "js")
    assert json_lines(ok(gregor(*delete, bootstrap=b))) == [{"topic": "js", "deleted": True}]
    assert json_lines(ok(gregor(*delete, "--if-exists", bootstrap=b))) == [{"topic": "js", "deleted": False}]
    proc = gregor(*delete, bootstrap=b)
    failed(proc, "UNKNOWN_TOPIC_OR_PARTITION")
    assert proc.stdout == ""
    assert json_lines(ok(gregor("-o", "json", "topics", "list", bootstrap=b))) == [[]]


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_produce_then_consume_json_round_trip(broker, codec: str) -> None:
    b = broker.grpc
    ok(gregor("topics", "create", "events", "--partitions", "2", bootstrap=b))
    lines = [f"k{i % 4}:value {i} ünïcode" for i in range(40)]
    out = json_lines(ok(gregor("-o", "json", "produce", "events", "--key-separator", ":", "--compression-type", codec,
                               input="\n".join(lines) + "\n", bootstrap=b)))
    assert len(out) == 40
    assert all(set(o) == {"partition", "offset", "key", "value"} for o in out)
    assert [(o["key"], o["value"]) for o in out] == [tuple(line.split(":", 1)) for line in lines]

    consumed = json_lines(ok(gregor("-o", "json", "consume", "events", "--from-beginning", "--max-messages", "40",
                                    "--timeout-ms", "10000", bootstrap=b)))
    assert len(consumed) == 40
    assert all(set(c) == {"partition", "offset", "key", "value", "timestamp", "headers"} for c in consumed)
    produced = {(o["partition"], o["offset"]): (o["key"], o["value"]) for o in out}
    assert {(c["partition"], c["offset"]): (c["key"], c["value"]) for c in consumed} == produced
    for part in (0, 1):
        offsets = [c["offset"] for c in consumed if c["partition"] == part]
        assert offsets == sorted(offsets)

    # --partition/--offset and the text formatter properties.
    p0 = sorted(o["offset"] for o in out if o["partition"] == 0)
    text = ok(gregor("consume", "events", "--partition", "0", "--offset", str(p0[-2]), "--timeout-ms", "2000",
                     "--property", "print.key=true", "--property", "print.offset=true", bootstrap=b))
    expected = [f"Offset:{o}\t{produced[(0, o)][0]}\t{produced[(0, o)][1]}" for o in p0[-2:]]
    assert text.splitlines() == expected


def test_produce_reports_bad_lines_and_exits_1(broker) -> None:
    b = broker.grpc
    ok(gregor("topics", "create", "strict", bootstrap=b))
    proc = gregor("-o", "json", "produce", "strict", "--property", "parse.key=true", "--property",
                  "key.separator=|", input="a|1\nno separator\nb|2\n", bootstrap=b)
    assert proc.returncode == 1
    out = json_lines(proc.stdout)
    assert out[0] == {"partition": 0, "offset": 0, "key": "a", "value": "1"}
    assert set(out[1]) == {"error", "key", "value"} and "No key separator" in out[1]["error"]
    assert out[2] == {"partition": 0, "offset": 1, "key": "b", "value": "2"}
    # Text mode: nothing on stdout, the failure on stderr.
    proc = gregor("produce", "strict", "--key-separator", "|", input="x\n", bootstrap=b)
    failed(proc, "No key separator")
    # Without a key separator every line is a value; --acks and --partition are honoured.
    out = json_lines(ok(gregor("-o", "json", "produce", "strict", "--acks", "1", "--partition", "0",
                               input="plain\n", bootstrap=b)))
    assert out == [{"partition": 0, "offset": 2, "key": None, "value": "plain"}]


def test_bad_input_gives_a_message_and_nonzero_exit(broker, tmp_path) -> None:
    b = broker.grpc
    failed(gregor("produce", "missing", input="x\n", bootstrap=b), "UNKNOWN_TOPIC_OR_PARTITION")
    failed(gregor("consume", "missing", "--timeout-ms", "100", bootstrap=b), "UNKNOWN_TOPIC_OR_PARTITION")
    failed(gregor("consume", "x", "--group", "g", "--partition", "0", bootstrap=b), "cannot be combined", code=2)
    failed(gregor("consume", "x", "--offset", "5", bootstrap=b), "--offset N needs --partition P", code=2)
    failed(gregor("consume", "x", "--offset", "abc", "--partition", "0", bootstrap=b), "is not an offset", code=2)
    failed(gregor("produce", "x", "--producer-property", "linger.ms=soon", bootstrap=b), "linger.ms", code=2)
    failed(gregor("produce", "x", "--acks", "2", bootstrap=b), "Invalid value for '--acks'", code=2)
    failed(gregor("topics", "list", bootstrap="127.0.0.1:1"), "cannot reach the cluster")
    failed(gregor("topics", "list", env={"GREGOR_DATA_DIR": str(tmp_path / "none")}), "no broker to talk to")
    failed(gregor("nonsense"), "No such command", code=2)


def test_bootstrap_from_env_and_cluster_json(broker, tmp_path) -> None:
    ok(gregor("topics", "create", "viaenv", env={"GREGOR_BOOTSTRAP": broker.grpc}))
    data_dir = tmp_path / "local"
    data_dir.mkdir()
    (data_dir / "cluster.json").write_text(json.dumps({"bootstrap": broker.grpc, "processes": []}))
    assert "viaenv" in ok(gregor("--data-dir", str(data_dir), "topics", "list"))
    assert "viaenv" in ok(gregor("topics", "list", env={"GREGOR_DATA_DIR": str(data_dir)}))


def test_log_dump_reads_a_partition_directory_and_reports_corruption(broker, tmp_path) -> None:
    b = broker.grpc
    ok(gregor("topics", "create", "dumped", bootstrap=b))
    ok(gregor("produce", "dumped", "--compression-type", "gzip", input="one\ntwo\nthree\n", bootstrap=b))
    ok(gregor("produce", "dumped", "--key-separator", "=", input="k=four\n", bootstrap=b))
    pdir = os.path.join(broker.data_dir, "dumped-0")
    text = ok(gregor("log", "dump", pdir, "--print-data-log"))
    batch_lines = [line for line in text.splitlines() if line.startswith("baseOffset:")]
    assert len(batch_lines) == 2
    assert batch_lines[0].startswith("baseOffset: 0 lastOffset: 2 count: 3 ")
    assert "compresscodec: gzip" in batch_lines[0] and "isvalid: true" in batch_lines[0]
    assert batch_lines[1].startswith("baseOffset: 3 lastOffset: 3 count: 1 ")
    assert "| offset: 3 " in text and "key: k payload: four" in text
    batches = json_lines(ok(gregor("-o", "json", "log", "dump", pdir, "--print-data-log")))
    assert [x["baseOffset"] for x in batches] == [0, 3]
    assert [r["payload"] for r in batches[0]["records"]] == ["one", "two", "three"]
    assert all(x["isvalid"] for x in batches)

    # Flip a byte inside the first batch's records: reported as a bad CRC, the rest still dumped, exit 1.
    (seg,) = [f for f in os.listdir(pdir) if f.endswith(".log")]
    raw = bytearray(open(os.path.join(pdir, seg), "rb").read())
    raw[70] ^= 0xFF
    raw += b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x10\x00garbage"  # a torn batch at the tail
    broken = tmp_path / "00000000000000000000.log"
    broken.write_bytes(bytes(raw))
    proc = gregor("-o", "json", "log", "dump", str(broken))
    assert proc.returncode == 1 and "corrupt" in proc.stderr and "Traceback" not in proc.stderr
    items = json_lines(proc.stdout)
    assert items[0]["isvalid"] is False and items[1]["isvalid"] is True
    assert "runs past the end" in items[2]["corrupt"]
    failed(gregor("log", "dump", str(tmp_path / "nowhere")), "no such file or directory")


def test_perf_tools_print_kafkas_formats(broker) -> None:
    b = broker.grpc
    ok(gregor("topics", "create", "perf", "--partitions", "2", bootstrap=b))
    out = ok(gregor("perf", "produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
                    "--throughput", "-1", "--producer-props", "acks=1", "linger.ms=2", bootstrap=b))
    final = out.strip().splitlines()[-1]
    assert re.fullmatch(r"3000 records sent, \d+\.\d{6} records/sec \(\d+\.\d{2} MB/sec\), \d+\.\d{2} ms avg latency, "
                        r"\d+\.\d{2} ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ ms 99th, \d+ ms 99\.9th\.",
                        final), final
    (summary,) = json_lines(ok(gregor("-o", "json", "perf", "produce", "--topic", "perf", "--num-records", "500",
                                      "--record-size", "10", "--throughput", "1000", bootstrap=b)))
    assert summary["records"] == 500
    assert summary["records_per_sec"] <= 1100, "--throughput caps the rate"
    failed(gregor("perf", "produce", "--topic", "perf", "--num-records", "1", "--record-size", "1",
                  "--throughput", "-1", "--producer-props", "acks=7", bootstrap=b), "acks", code=2)

    out = ok(gregor("perf", "consume", "--topic", "perf", "--messages", "3500", "--timeout", "10000", bootstrap=b))
    header, row = out.strip().splitlines()
    assert header == ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                      "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
    ts = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}"
    assert re.fullmatch(rf"{ts}, {ts}, \d+\.\d{{4}}, \d+\.\d{{4}}, 3500, \d+\.\d{{4}}, \d+, \d+, \d+\.\d{{4}}, "
                        rf"\d+\.\d{{4}}", row), row
    assert row.split(", ")[2] == f"{(3000 * 100 + 500 * 10) / 1048576:.4f}"  # value bytes consumed
