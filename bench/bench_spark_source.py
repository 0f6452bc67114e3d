"""Records per second from a topic into a Spark DataFrame: the `gregor` source against its baselines.

Same run, same machine, same SparkSession (local[2]):
  1. gregor source        spark.read.format("gregor") on a Gregor topic: count() and sum(length(value))
  2. Python consumer      the SDK Consumer reading the same Gregor topic: count and sum of value lengths
  3. Spark's Kafka source spark.read.format("kafka") (spark-sql-kafka-0-10 for this Spark version, with
                          its kafka-clients, from Maven Central) on Apache Kafka (bench/kafka_dist.py, KRaft)
                          holding the same number of 1 KiB records in the same partition count.
Ratios printed: gregor / python consumer, gregor / Spark's Kafka source (target >= 1.0), per query and
partition count; each figure is the best of --rounds runs after one warm-up (JVM, Python workers).

    .venv/bin/python bench/bench_spark_source.py [--records 200000] [--partitions 3 12] [--rounds 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR  # noqa: E402
from kafka_dist import KafkaCluster, ensure_kafka, spark_kafka_jars  # noqa: E402

RECORD_SIZE = 1024


def best(rounds: int, fn: Callable[[], tuple[int, int]]) -> tuple[float, tuple[int, int]]:
    fn()  # warm-up
    times, result = [], (0, 0)
    for _ in range(rounds):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def python_consumer(bootstrap: str, topic: str, partitions: int, n: int) -> tuple[int, int]:
    from gregor.client import Consumer

    async def go() -> tuple[int, int]:
        count = size = 0
        async with Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                             "max.partition.fetch.bytes": 4 << 20, "max.poll.records": 100000}) as c:
            c.assign([(topic, p) for p in range(partitions)])
            c.seek_to_beginning()
            while count < n:
                for r in await c.poll(timeout_ms=1000):
                    count += 1
                    size += len(r.value or b"")
        return count, size
    return asyncio.run(go())


def gregor_produce(bootstrap: str, topic: str, n: int) -> None:
    gregor = os.path.join(os.path.dirname(sys.executable), "gregor")
    subprocess.run([gregor, "--bootstrap", bootstrap, "perf", "produce", "--topic", topic, "--num-records", str(n),
                    "--record-size", str(RECORD_SIZE), "--throughput", "-1", "--producer-props", "acks=1",
                    "linger.ms=5"], check=True, stdout=subprocess.DEVNULL)


def kafka_produce(dist: Any, bootstrap: str, topic: str, n: int) -> None:
    from kafka_dist import PRODUCER_PERF

    res = dist.run(PRODUCER_PERF, "--topic", topic, "--num-records", str(n), "--record-size", str(RECORD_SIZE),
                   "--throughput", "-1", "--producer-props", f"bootstrap.servers={bootstrap}", "acks=1",
                   "linger.ms=5", timeout=600)
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, nargs="+", default=[3, 12])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="50,000 records, 1 round")
    a = ap.parse_args()
    if a.quick:
        a.records, a.rounds = 50_000, 1
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import pyspark
    from pyspark.sql import SparkSession

    from gregor.cli.local_cluster import LocalCluster
    from gregor_spark import GregorDataSource

    jars = spark_kafka_jars(pyspark.__version__)
    dist = ensure_kafka()
    base = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    gcluster = LocalCluster.up(str(base / "gregor"), brokers=1)
    kcluster = KafkaCluster(dist, base / "kafka", brokers=1).start()
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-source")
             .config("spark.jars", ",".join(jars)).config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(GregorDataSource)
    rows = []
    try:
        for parts in a.partitions:
            topic = f"bench-{parts}"
            from gregor.client import SyncAdminClient

            with SyncAdminClient({"bootstrap.servers": gcluster.bootstrap}) as admin:
                admin.create_topic(topic, parts, 1)
            gregor_produce(gcluster.bootstrap, topic, a.records)
            kcluster.create_topic(topic, parts, 1)
            kafka_produce(dist, kcluster.bootstrap, topic, a.records)
            g = spark.read.format("gregor").option("bootstrap", gcluster.bootstrap).option("subscribe", topic).load()
            k = spark.read.format("kafka").option("kafka.bootstrap.servers", kcluster.bootstrap) \
                .option("subscribe", topic).load()
            queries: dict[str, Callable[[Any], tuple[int, int]]] = {
                "count": lambda df: (df.count(), 0),
                "sum_len": lambda df: tuple(df.selectExpr("count(*)", "sum(length(value))").first()),  # type: ignore
            }
            for qname, q in queries.items():
                tg, rg = best(a.rounds, lambda: q(g))
                tk, rk = best(a.rounds, lambda: q(k))
                assert rg[0] == rk[0] == a.records, (rg, rk)
                row = {"partitions": parts, "query": qname, "records": a.records,
                       "gregor_rps": a.records / tg, "kafka_source_rps": a.records / tk}
                if qname == "sum_len":
                    tp, rp = best(a.rounds, lambda: python_consumer(gcluster.bootstrap, topic, parts, a.records))
                    assert rp == rg == (a.records, a.records * RECORD_SIZE), (rp, rg)
                    row["python_consumer_rps"] = a.records / tp
                rows.append(row)
                print(f"{parts:>3} partitions {qname:8s} gregor {row['gregor_rps']:>10,.0f} rec/s   "
                      f"spark-kafka {row['kafka_source_rps']:>10,.0f} rec/s   ratio {tk / tg:5.2f}"
                      + (f"   python consumer {row['python_consumer_rps']:>9,.0f} rec/s   ratio "
                         f"{row['gregor_rps'] / row['python_consumer_rps']:5.2f}" if "python_consumer_rps" in row
                         else ""), flush=True)
    finally:
        spark.stop()
        kcluster.stop()
        gcluster.down()
        shutil.rmtree(base, ignore_errors=True)
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / "spark_source.json"
    out.write_text(json.dumps({"spark": pyspark.__version__, "kafka": dist.version, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
