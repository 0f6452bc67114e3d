"""Topic traffic: records and bytes per topic, partition and key over time windows, partition skew,
top keys and the record-size distribution (bytes = key + value, as Kafka's record size counts them)."""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from gregor_spark.jobs.common import chart, parser, reader, save, session

TOP_KEYS = 10  # keys listed per topic in the top-keys table and chart
ORDER = {"traffic_by_partition": ["window_start", "topic", "partition"], "traffic_by_key": ["window_start", "topic", "key"],
         "partition_skew": ["topic"], "top_keys": ["topic", "rank"], "record_sizes": ["topic", "size_le"]}


def run(spark: Any, out: str, *, bootstrap: Optional[str] = None, pattern: str = "[^_].*",
        window: str = "1 minute") -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    os.makedirs(out, exist_ok=True)
    df = reader(spark, bootstrap).option("subscribePattern", pattern).load() \
        .withColumn("bytes", F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))) \
        .withColumn("key_s", F.coalesce(F.col("key").cast("string"), F.lit("<null>"))).cache()
    w = F.window("timestamp", window)
    tables = {
        "traffic_by_partition": df.groupBy(w.alias("w"), "topic", "partition")
        .agg(F.count("*").alias("records"), F.sum("bytes").alias("bytes"))
        .select(F.col("w.start").alias("window_start"), "topic", "partition", "records", "bytes"),
        "traffic_by_key": df.groupBy(w.alias("w"), "topic", "key_s")
        .agg(F.count("*").alias("records"), F.sum("bytes").alias("bytes"))
        .select(F.col("w.start").alias("window_start"), "topic", F.col("key_s").alias("key"), "records", "bytes"),
    }
    per_part = df.groupBy("topic", "partition").agg(F.count("*").alias("records"), F.sum("bytes").alias("bytes"))
    tables["partition_skew"] = per_part.groupBy("topic").agg(
        F.count("*").alias("partitions"), F.sum("records").alias("records"), F.max("records").alias("max_records"),
        F.min("records").alias("min_records"), (F.max("records") / F.avg("records")).alias("skew"))
    by_key = df.groupBy("topic", "key_s").agg(F.count("*").alias("records"), F.sum("bytes").alias("bytes"))
    rank = F.row_number().over(Window.partitionBy("topic").orderBy(F.desc("records"), "key_s"))
    tables["top_keys"] = by_key.withColumn("rank", rank).where(F.col("rank") <= TOP_KEYS) \
        .select("topic", "rank", F.col("key_s").alias("key"), "records", "bytes")
    # Power-of-two buckets: a record of n bytes lands in the smallest 2^k >= n (0 for empty records).
    bucket = F.when(F.col("bytes") == 0, F.lit(0)).otherwise(F.pow(F.lit(2), F.ceil(F.log2("bytes")))).cast("long")
    tables["record_sizes"] = df.groupBy("topic", bucket.alias("size_le")).agg(F.count("*").alias("records"))
    frames = {name: save(t, out, name, ORDER[name]) for name, t in tables.items()}
    df.unpersist()
    frames["charts"] = _charts(out, frames)
    return frames


def _charts(out: str, f: dict[str, Any]) -> list[str]:
    charts = []
    tp = f["traffic_by_partition"]
    if len(tp):
        per_topic = tp.groupby(["window_start", "topic"])["records"].sum().unstack(fill_value=0)
        charts.append(chart(out, "traffic_records", lambda ax: per_topic.plot(ax=ax, marker="o"),
                            "records per window, per topic"))
        parts = tp.groupby(["topic", "partition"])["records"].sum()
        charts.append(chart(out, "traffic_partitions", lambda ax: parts.plot.bar(ax=ax),
                            "records per topic-partition (skew)"))
    sizes = f["record_sizes"]
    if len(sizes):
        hist = sizes.pivot_table(index="size_le", columns="topic", values="records", fill_value=0)
        charts.append(chart(out, "record_sizes", lambda ax: hist.plot.bar(ax=ax), "record size (<= bytes)"))
    top = f["top_keys"]
    if len(top):
        labels = top["topic"] + ":" + top["key"]
        charts.append(chart(out, "top_keys", lambda ax: ax.barh(labels[::-1], top["records"][::-1]),
                            f"top {TOP_KEYS} keys per topic (records)"))
    return charts


def main(argv: Optional[list[str]] = None) -> None:
    p = parser("Topic traffic: records/bytes per topic, partition and key over windows; skew; top keys; sizes")
    p.add_argument("--topics", default="[^_].*", help="regular expression of topics (subscribePattern)")
    p.add_argument("--window", default="1 minute", help="window duration, Spark's syntax (e.g. '10 seconds')")
    a = p.parse_args(argv)
    spark = session("gregor-topic-traffic", a.master)
    result = run(spark, os.path.join(a.out, "traffic"), bootstrap=a.bootstrap, pattern=a.topics, window=a.window)
    print(result["partition_skew"].to_string(index=False), file=sys.stdout)
    spark.stop()


if __name__ == "__main__":
    main()
