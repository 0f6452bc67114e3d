"""The analytics jobs on a known workload: exact counts in their Parquet outputs, charts and report written."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from typing import Any

import pandas as pd

from tests.spark.conftest import create_topic, produce, run

T0 = 29_333_334 * 60_000  # a whole minute (ms), so the 1-minute windows are known


def _workload(bootstrap: str) -> None:
    run(create_topic(bootstrap, "jobs-a", 2))
    run(create_topic(bootstrap, "jobs-b", 1))
    # jobs-a: 30 records of 2 + 10 bytes; partition 1 gets every third (10), partition 0 the rest (20);
    # keys k0..k3 cycle (8, 8, 7, 7); records 0..19 in the first minute, 20..29 in the second.
    run(produce(bootstrap, "jobs-a", [{"key": f"k{i % 4}".encode(), "value": b"v" * 10, "partition": 0 if i % 3 else 1,
                                       "timestamp": T0 + (i // 20) * 60_000} for i in range(30)]))
    # jobs-b: 5 keyless records of 100 bytes in the first minute.
    run(produce(bootstrap, "jobs-b", [{"value": b"x" * 100, "timestamp": T0 + i} for i in range(5)]))


def test_traffic_job_exact_counts(spark: Any, gregor: Any, tmp_path: Any) -> None:
    from gregor_spark.jobs import traffic

    _workload(gregor.bootstrap)
    out = str(tmp_path / "traffic")
    traffic.run(spark, out, pattern="jobs-.*", window="1 minute")
    w0 = pd.Timestamp(datetime.datetime.fromtimestamp(T0 / 1000, datetime.timezone.utc).replace(tzinfo=None))
    w1 = w0 + pd.Timedelta(minutes=1)
    by_part = pd.read_parquet(os.path.join(out, "traffic_by_partition.parquet"))
    got = {(r.window_start, r.topic, r.partition): (r.records, r.bytes) for r in by_part.itertuples()}
    # first minute: i 0..19 -> partition 1 gets 0,3,..,18 (7), partition 0 the other 13
    assert got == {(w0, "jobs-a", 0): (13, 156), (w0, "jobs-a", 1): (7, 84), (w1, "jobs-a", 0): (7, 84),
                   (w1, "jobs-a", 1): (3, 36), (w0, "jobs-b", 0): (5, 500)}
    skew = pd.read_parquet(os.path.join(out, "partition_skew.parquet")).set_index("topic")
    assert (skew.loc["jobs-a", "max_records"], skew.loc["jobs-a", "min_records"]) == (20, 10)
    assert abs(skew.loc["jobs-a", "skew"] - 20 / 15) < 1e-9 and skew.loc["jobs-b", "skew"] == 1.0
    top = pd.read_parquet(os.path.join(out, "top_keys.parquet"))
    assert list(zip(top.topic, top.key, top.records)) == [("jobs-a", "k0", 8), ("jobs-a", "k1", 8), ("jobs-a", "k2", 7),
                                                          ("jobs-a", "k3", 7), ("jobs-b", "<null>", 5)]
    sizes = pd.read_parquet(os.path.join(out, "record_sizes.parquet"))
    assert list(zip(sizes.topic, sizes.size_le, sizes.records)) == [("jobs-a", 16, 30), ("jobs-b", 128, 5)]
    keys = pd.read_parquet(os.path.join(out, "traffic_by_key.parquet"))
    assert keys.records.sum() == 35 and len(keys) == 4 + 4 + 1  # k0..k3 in both minutes, <null> in one
    assert {"traffic_records.png", "traffic_partitions.png", "record_sizes.png", "top_keys.png"} <= set(os.listdir(out))


def test_lag_job_decodes_commits(spark: Any, gregor: Any, tmp_path: Any) -> None:
    from gregor.client import Consumer
    from gregor_spark.jobs import lag, report

    async def commit() -> None:
        async with Consumer({"bootstrap.servers": gregor.bootstrap, "group.id": "lag-g",
                             "enable.auto.commit": False}) as c:
            c.assign([("jobs-a", 0), ("jobs-a", 1)])
            await c.commit_sync({("jobs-a", 0): 12, ("jobs-a", 1): 4})
            await c.commit_sync({("jobs-a", 0): 20})
    run(commit())
    out = str(tmp_path / "out")
    result = lag.run(spark, os.path.join(out, "lag"))
    over = result["lag_over_time"]
    over = over[over.group == "lag-g"]
    assert list(zip(over.partition, over.committed_offset, over.log_end_offset, over.lag)) == [
        (0, 12, 20, 8), (0, 20, 20, 0), (1, 4, 10, 6)]
    cur = result["current_lag"]
    cur = cur[cur.group == "lag-g"]
    assert list(zip(cur.partition, cur.committed_offset, cur.lag)) == [(0, 20, 0), (1, 4, 6)]
    assert os.path.exists(os.path.join(out, "lag", "consumer_lag.png"))
    page = open(report.write(out)).read()
    assert "consumer_lag.png" in page and "current_lag" in page


def test_gregor_analytics_cli_runs_spark_submit(gregor: Any, tmp_path: Any) -> None:
    """`gregor analytics traffic` through spark-submit, connected by the CLI's --bootstrap, then `report`."""
    out = tmp_path / "cli"
    gregor_bin = os.path.join(os.path.dirname(sys.executable), "gregor")
    res = subprocess.run([gregor_bin, "--bootstrap", gregor.bootstrap, "analytics", "traffic", "--out", str(out),
                          "--master", "local[1]", "--topics", "jobs-b"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    skew = pd.read_parquet(out / "traffic" / "partition_skew.parquet")
    assert list(zip(skew.topic, skew.records)) == [("jobs-b", 5)]
    res = subprocess.run([gregor_bin, "analytics", "report", "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "<h3>partition_skew (1 rows)</h3>" in (out / "report.html").read_text()
    bad = subprocess.run([gregor_bin, "analytics", "nope"], capture_output=True, text=True)
    assert bad.returncode != 0 and "nope" in bad.stderr
