"""`gregor perf produce|consume` flags of Kafka's perf tools, each checked by its effect on a real cluster.

One module cluster: etcd, a controller, a broker and a group coordinator (so --group joins a real
group). The tools run as users run them (`python -m gregor.cli.main` subprocesses); what they
wrote, committed or joined is read back with the SDK consumer and the group admin client.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gregor.cli.local_cluster import LocalCluster, start_gateway, stop_process
from gregor.client import Consumer, Producer
from gregor.client.accumulator import record_size
from gregor.client.group_admin import GroupAdmin
from tests.helpers.cluster import tear_down
from tests.integration.test_broker import create_topic
from tests.integration.test_cli import SERVICES, failed, gregor, json_lines, ok
from tests.integration.test_gateway_cli import KAFKA_SUMMARY

TS = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}"
F4 = r"-?\d+\.\d{4}"
SUMMARY_ROW = re.compile(rf"^({TS}), ({TS}), ({F4}), {F4}, (\d+), {F4}, (\d+), (-?\d+), {F4}, {F4}$")
DETAILED_ROW = re.compile(rf"^({TS}), 0, ({F4}), {F4}, (\d+), {F4}, (\d+), (-?\d+), {F4}, {F4}$")
DETAILED_HEADER = ("time, threadId, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
                   "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
TIMEOUT_WARNING = ("WARNING: Exiting before consuming the expected number of messages: timeout (2000 ms) exceeded. "
                   "You can use the --timeout option to increase the timeout.")
THREADS_WARNING = ("WARNING: option [threads] and [num-fetch-threads] have been deprecated and will be ignored "
                   "by the test")
METRIC_ROW = re.compile(r"^(\S+:\S+:\{[^}]*\}) *: (-?\d+\.\d{3})$")
JOIN_TIMEOUT = "30000"  # --timeout of runs that must join the group and consume everything


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster.up(str(tmp_path_factory.mktemp("perf")), brokers=1, controllers=1, coordinators=1,
                        coordinator_overrides={"group.initial.rebalance.delay.ms": "0",
                                               "offsets.topic.num.partitions": "4"})
    try:
        yield c
    finally:
        tear_down(c)


def broker(c: LocalCluster) -> str:
    return c.by_role("broker")[0].grpc


def env(c: LocalCluster) -> dict[str, str]:
    return {"GREGOR_DATA_DIR": c.data_dir}


def perf(c: LocalCluster, *args: str, timeout: float = 120) -> Any:
    return gregor("perf", *args, env=env(c), timeout=timeout)


async def produce(c: LocalCluster, topic: str, values: list[bytes], partitions: int = 1) -> None:
    async with Producer({"bootstrap.servers": broker(c), "linger.ms": 2}) as p:
        handles = [await p.send(topic, v, partition=i % partitions) for i, v in enumerate(values)]
        for h in handles:
            await h


async def consume_values(c: LocalCluster, topic: str, partitions: int, n: int) -> list[bytes]:
    """Every value of topic (n records expected), read from the beginning of each partition."""
    out: list[bytes] = []
    async with Consumer({"bootstrap.servers": broker(c), "fetch.max.wait.ms": 100}) as consumer:
        tps = [(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        for _ in range(200):
            out += [r.value or b"" for r in await consumer.poll(200)]
            if len(out) >= n:
                break
    assert len(out) == n, f"read {len(out)} of {n}"
    return out


async def committed(c: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    async with GroupAdmin({"bootstrap.servers": broker(c)}) as admin:
        return await admin.committed_offsets(group)


async def spawn_perf(c: LocalCluster, *args: str) -> asyncio.subprocess.Process:
    """`gregor perf ARGS` running in the background (stdout and stderr piped) while the test produces."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gregor.cli.main", "perf", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**{k: v for k, v in os.environ.items() if k != "GREGOR_BOOTSTRAP"},
                                             "PYTHONPATH": os.path.abspath(SERVICES), **env(c)})


def ms(ts: str) -> int:
    return int(datetime.strptime(ts, "%Y-%m-%d %H:%M:%S:%f").timestamp() * 1000)


# ---------------------------------------------------------------- perf produce
async def test_payload_file_records_are_exactly_the_files_payloads(cluster: LocalCluster, tmp_path: Any) -> None:
    await create_topic(broker(cluster), "payloads", 2)
    path = tmp_path / "payloads.txt"
    path.write_text("alpha\n\nbravo charlie\ndelta\n")  # Kafka's Scanner: "alpha", "", "bravo charlie", "delta"
    out = ok(perf(cluster, "produce", "--topic", "payloads", "--num-records", "200", "--payload-file", str(path),
                  "--throughput", "-1")).splitlines()
    assert out[:2] == [f"Reading payloads from: {path}", "Number of messages read: 4"]
    m = KAFKA_SUMMARY.match(out[-1])
    assert m and m.group(1) == "200", out
    values = await consume_values(cluster, "payloads", 2, 200)
    assert set(values) == {b"alpha", b"", b"bravo charlie", b"delta"}
    # --payload-delimiter is a regular expression, as Kafka's Scanner takes it.
    await create_topic(broker(cluster), "payloads2", 1)
    comma = tmp_path / "comma.txt"
    comma.write_text("x|yy||zzz")
    (summary,) = json_lines(ok(perf(cluster, "produce", "--topic", "payloads2", "--num-records", "50",
                                    "--payload-file", str(comma), "--payload-delimiter", r"\|", "--throughput",
                                    "-1", "--output", "json")))
    assert summary["records"] == 50
    assert set(await consume_values(cluster, "payloads2", 1, 50)) == {b"x", b"yy", b"", b"zzz"}


async def test_payload_file_through_a_gateway(cluster: LocalCluster, tmp_path: Any) -> None:
    await create_topic(broker(cluster), "gwpay", 1)
    gw = start_gateway(cluster.data_dir, 7, broker(cluster))
    try:
        path = tmp_path / "p.txt"
        path.write_text("one\ntwo\nthree\n")
        out = ok(perf(cluster, "produce", "--topic", "gwpay", "--num-records", "60", "--payload-file", str(path),
                      "--throughput", "-1", "--gateway", gw.grpc, "--print-metrics"))
        m = KAFKA_SUMMARY.match(out.splitlines()[-1])
        assert m and m.group(1) == "60", out
    finally:
        stop_process(gw)
    assert set(await consume_values(cluster, "gwpay", 1, 60)) == {b"one", b"two", b"three"}


def test_payload_options_are_checked_like_kafkas(cluster: LocalCluster, tmp_path: Any) -> None:
    base = ("produce", "--topic", "payloads", "--num-records", "5", "--throughput", "-1")
    either = "either --record-size or --payload-file must be specified but not both."
    failed(perf(cluster, *base), either, code=2)
    (tmp_path / "one.txt").write_text("a\n")
    failed(perf(cluster, *base, "--record-size", "10", "--payload-file", str(tmp_path / "one.txt")), either, code=2)
    (tmp_path / "empty.txt").write_text("")
    for missing in (tmp_path / "empty.txt", tmp_path / "nope.txt"):
        failed(perf(cluster, *base, "--payload-file", str(missing)), "File does not exist or empty file provided.",
               code=2)


async def test_producer_config_file_under_producer_props_and_print_metrics(cluster: LocalCluster,
                                                                           tmp_path: Any) -> None:
    await create_topic(broker(cluster), "pm", 1)
    cfg = tmp_path / "producer.properties"
    cfg.write_text("# Kafka's producer.properties\nclient.id=from-file\nacks=1\nlinger.ms=2\n")
    base = ("produce", "--topic", "pm", "--num-records", "300", "--record-size", "100", "--throughput", "-1",
            "--producer.config", str(cfg), "--print-metrics")
    out = ok(perf(cluster, *base)).splitlines()
    summary = next(i for i, line in enumerate(out) if KAFKA_SUMMARY.match(line))
    assert out[summary + 1] == "" and re.fullmatch(r"Metric Name +Value", out[summary + 2]), out
    rows = out[summary + 3:]
    metrics = {}
    for line in rows:
        m = METRIC_ROW.match(line)
        assert m, line
        metrics[m.group(1)] = float(m.group(2))
    assert len({line.index(" : ") for line in rows}) == 1, "names padded to one width, as ToolsUtils does"
    assert list(metrics) == sorted(metrics)
    client = "{client-id=from-file}"
    assert metrics[f"producer-metrics:record-send-total:{client}"] == 300
    assert metrics[f"producer-metrics:record-error-total:{client}"] == 0
    assert metrics[f"producer-metrics:record-size-max:{client}"] == record_size(None, b"x" * 100, ())
    assert metrics[f"producer-metrics:buffer-total-bytes:{client}"] == 33554432
    assert metrics["producer-topic-metrics:byte-total:{client-id=from-file, topic=pm}"] == \
        300 * record_size(None, b"x" * 100, ())
    # --producer-props take precedence over the file; without client.id anywhere, Kafka's default.
    out = ok(perf(cluster, *base, "--producer-props", "client.id=from-props"))
    assert "producer-metrics:record-send-total:{client-id=from-props}" in out and "from-file" not in out
    out = ok(perf(cluster, "produce", "--topic", "pm", "--num-records", "10", "--record-size", "10",
                  "--throughput", "-1", "--print-metrics"))
    assert "{client-id=perf-producer-client}" in out
    assert len(await consume_values(cluster, "pm", 1, 610)) == 610
    bad = tmp_path / "bad.properties"
    bad.write_text("linger.ms=soon\n")
    failed(perf(cluster, "produce", "--topic", "pm", "--num-records", "1", "--record-size", "1", "--throughput",
                "-1", "--producer.config", str(bad)), "linger.ms", code=2)


# ---------------------------------------------------------------- perf consume
async def test_group_joins_the_coordinator_commits_and_times_the_join(cluster: LocalCluster) -> None:
    topic = "grp"
    await create_topic(broker(cluster), topic, 2)
    await produce(cluster, topic, [f"g{i}".encode() for i in range(400)], partitions=2)
    out = ok(perf(cluster, "consume", "--topic", topic, "--messages", "400", "--group", "perf-g",
                  "--timeout", JOIN_TIMEOUT)).splitlines()
    m = SUMMARY_ROW.match(out[-1])
    assert m, out
    start, end, _, n, rebalance_ms, fetch_ms = m.groups()
    assert int(n) == 400
    assert int(rebalance_ms) > 0, "rebalance.time.ms is the JoinGroup/SyncGroup round trip of a real join"
    assert int(fetch_ms) == ms(end) - ms(start) - int(rebalance_ms)  # Kafka: fetch = end - start - rebalance
    # The group is the coordinator's, with the offsets the tool committed when it closed.
    assert await committed(cluster, "perf-g") == {(topic, 0): 200, (topic, 1): 200}
    async with GroupAdmin({"bootstrap.servers": broker(cluster)}) as admin:
        before = {g.group_id for g in await admin.list_groups()}
        assert (await admin.describe_group("perf-g")).state == "Empty"  # it left on close
    # Without --group: Kafka's perf-consumer-<random>, a real group as well.
    ok(perf(cluster, "consume", "--topic", topic, "--messages", "400", "--timeout", JOIN_TIMEOUT))
    async with GroupAdmin({"bootstrap.servers": broker(cluster)}) as admin:
        new = {g.group_id for g in await admin.list_groups()} - before
    assert len(new) == 1 and re.fullmatch(r"perf-consumer-\d{1,5}", next(iter(new))), new
    assert await committed(cluster, next(iter(new))) == {(topic, 0): 200, (topic, 1): 200}


async def test_from_latest_consumes_nothing_that_was_there_before(cluster: LocalCluster) -> None:
    topic, old = "latest", 50
    await create_topic(broker(cluster), topic, 1)
    await produce(cluster, topic, [f"old{i}".encode() for i in range(old)])
    proc = await spawn_perf(cluster, "consume", "--topic", topic, "--messages", "10", "--group", "latest-g",
                            "--from-latest", "--timeout", JOIN_TIMEOUT)
    sent = 0
    async with Producer({"bootstrap.servers": broker(cluster), "linger.ms": 0}) as p:
        # New records keep arriving until the tool has its 10 (it joins and finds the log end meanwhile).
        while proc.returncode is None and sent < 2000:
            await p.send_and_wait(topic, f"new{sent}".encode())
            sent += 1
            try:
                await asyncio.wait_for(proc.wait(), 0.05)
            except asyncio.TimeoutError:
                pass
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode()
    row = SUMMARY_ROW.match(stdout.decode().splitlines()[-1])
    assert row and int(row.group(4)) == 10, stdout.decode()
    # The committed position is 10 past where the tool started: at or after the log end it found,
    # so none of the old records was read.
    ((_, position),) = (await committed(cluster, "latest-g")).items()
    assert position - 10 >= old, f"read records below the log end at start: committed {position}"
    # The same command without --from-latest starts at the earliest offset.
    ok(perf(cluster, "consume", "--topic", topic, "--messages", "10", "--group", "earliest-g",
            "--timeout", JOIN_TIMEOUT))
    assert await committed(cluster, "earliest-g") == {(topic, 0): 10}


async def test_show_detailed_stats_prints_a_line_per_reporting_interval(cluster: LocalCluster) -> None:
    topic, n = "det", 60
    await create_topic(broker(cluster), topic, 1)
    proc = await spawn_perf(cluster, "consume", "--topic", topic, "--messages", str(n), "--group", "det-g",
                            "--show-detailed-stats", "--reporting-interval", "100", "--timeout", JOIN_TIMEOUT)
    async with Producer({"bootstrap.servers": broker(cluster), "linger.ms": 0}) as p:
        for i in range(n):  # records trickle in over ~1.5 s: several reporting intervals
            await p.send_and_wait(topic, b"d" * 100)
            await asyncio.sleep(0.025)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, stderr.decode()
    out = stdout.decode().splitlines()
    assert out[0] == DETAILED_HEADER
    rows = [DETAILED_ROW.match(line) for line in out[1:]]
    assert all(rows), out  # only interval lines: Kafka prints no summary row with --show-detailed-stats
    assert len(rows) >= 3, out
    times = [ms(r.group(1)) for r in rows if r]
    counts = [int(r.group(3)) for r in rows if r]
    assert counts == sorted(counts) and counts[-1] <= n
    for r, t0, t1 in zip(rows[1:], times, times[1:]):
        assert r is not None
        assert t1 - t0 >= 100, "one line per --reporting-interval at most"
        assert int(r.group(5)) == t1 - t0 - int(r.group(4))  # fetch.time.ms = interval - join time in it
    failed(perf(cluster, "consume", "--topic", topic, "--messages", "1", "--reporting-interval", "0"),
           "Reporting interval must be greater than 0.", code=2)


async def test_print_metrics_consumer_config_threads_and_timeout(cluster: LocalCluster, tmp_path: Any) -> None:
    topic = "cm"
    await create_topic(broker(cluster), topic, 2)
    await produce(cluster, topic, [b"m" * 50] * 400, partitions=2)
    cfg = tmp_path / "consumer.properties"
    cfg.write_text("client.id=cfg-client\nmax.poll.records=100\n")
    out = ok(perf(cluster, "consume", "--topic", topic, "--messages", "600", "--group", "cm-g", "--timeout", "2000",
                  "--threads", "4", "--consumer.config", str(cfg), "--print-metrics")).splitlines()
    assert out[0] == THREADS_WARNING  # accepted, deprecated in Kafka, ignored
    assert out[1].startswith("start.time, end.time")
    assert out[2] == TIMEOUT_WARNING  # only 400 of 600 arrived within --timeout of the last record
    m = SUMMARY_ROW.match(out[3])
    assert m and int(m.group(4)) == 400, out
    assert out[4] == "" and re.fullmatch(r"Metric Name +Value", out[5])
    metrics = {}
    for line in out[6:]:
        row = METRIC_ROW.match(line)
        assert row, line
        metrics[row.group(1)] = float(row.group(2))
    client = "{client-id=cfg-client}"  # from --consumer.config
    assert metrics[f"consumer-fetch-manager-metrics:records-consumed-total:{client}"] == 400
    assert metrics["consumer-fetch-manager-metrics:bytes-consumed-total:{client-id=cfg-client, topic=cm}"] == 400 * 50
    assert metrics[f"consumer-fetch-manager-metrics:records-lag-max:{client}"] >= 0
    assert metrics[f"consumer-coordinator-metrics:assigned-partitions:{client}"] == 2
    assert metrics[f"consumer-coordinator-metrics:rebalance-total:{client}"] == 1
    assert metrics[f"consumer-coordinator-metrics:rebalance-latency-max:{client}"] == \
        int(m.group(5))  # the one join is rebalance.time.ms
    (doc,) = json_lines(ok(perf(cluster, "consume", "--topic", topic, "--messages", "400", "--group", "cm-json",
                                "--timeout", JOIN_TIMEOUT, "--print-metrics", "--output", "json")))
    assert doc["messages"] == 400 and doc["group"] == "cm-json"
    assert doc["metrics"]["consumer-fetch-manager-metrics:records-consumed-total:{client-id=perf-consumer-client}"] \
        == 400
    bad = tmp_path / "bad.properties"
    bad.write_text("no.such.key=1\n")
    failed(perf(cluster, "consume", "--topic", topic, "--messages", "1", "--consumer.config", str(bad)),
           "no.such.key", code=2)

