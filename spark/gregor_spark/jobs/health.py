"""Cluster health from metrics, from two sources:

- the `__gregor_metrics` topic (brokers with metrics.topic.enable=true; docs/metrics.md, JSON schema 1),
  read through the gregor source and decoded by Spark SQL (from_json + explode, in the JVM):
  under-replicated partitions, partitions and leaders per broker over time, ISR shrinks/expands per interval;
- the Prometheus HTTP API (query_range), which also scrapes the controllers: ControllerState rate and
  time per state, event queue size, leader elections by kind, ISR shrink/expand rates, under-replicated
  partitions. The series (small) are loaded into Spark and summarised there.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import urllib.request
from typing import Any, Optional

from gregor_spark.jobs.common import chart, parser, reader, save, session

METRICS_TOPIC = "__gregor_metrics"
PROMETHEUS_STEP_S = 5  # query_range resolution: the local cluster scrapes every 5 s
PROMETHEUS_TIMEOUT_S = 30  # one HTTP query

# name -> PromQL; every series is (name, labels, time, value).
PROMQL = {
    "controller_state_rate": "sum by (state) (rate(gregor_controller_state_rate_and_time_seconds_count[1m]))",
    "controller_state_time": "sum by (state) (rate(gregor_controller_state_rate_and_time_seconds_sum[1m]))",
    "event_queue_size": "max(gregor_controller_event_queue_size)",
    "leader_elections": "sum by (kind) (increase(gregor_controller_leader_elections_total[1m]))",
    "isr_shrinks": "sum(increase(gregor_broker_isr_shrinks_total[1m]))",
    "isr_expands": "sum(increase(gregor_broker_isr_expands_total[1m]))",
    "under_replicated": "sum(gregor_broker_under_replicated_partitions)",
}
# Samples kept from the metrics topic (gauges as they are; counters turned into per-interval increases).
TOPIC_GAUGES = ("gregor_broker_under_replicated_partitions", "gregor_broker_partitions", "gregor_broker_leader_partitions")
TOPIC_COUNTERS = ("gregor_broker_isr_shrinks_total", "gregor_broker_isr_expands_total")

SAMPLES_SCHEMA = ("struct<schema:int, timestamp_ms:long, role:string, id:int, "
                  "samples:array<struct<name:string, type:string, labels:map<string,string>, value:string>>>")


def metrics_topic(spark: Any, bootstrap: Optional[str]) -> Any:
    """One row per (time, role, id, name, labels, value) of the schema-1 sample batches."""
    from pyspark.sql import functions as F

    raw = reader(spark, bootstrap).option("subscribe", METRICS_TOPIC).load()
    doc = raw.select(F.from_json(F.col("value").cast("string"), SAMPLES_SCHEMA).alias("d")).where("d.schema = 1")
    return doc.select(F.timestamp_millis("d.timestamp_ms").alias("time"), F.col("d.role").alias("role"),
                      F.col("d.id").alias("id"), F.explode("d.samples").alias("s")) \
        .select("time", "role", "id", F.col("s.name").alias("name"),
                F.to_json("s.labels").alias("labels"), F.col("s.value").cast("double").alias("value"))


def topic_tables(samples: Any) -> dict[str, Any]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    gauges = samples.where(F.col("name").isin(*TOPIC_GAUGES)) \
        .groupBy("time", "role", "id", "name").agg(F.sum("value").alias("value"))
    series = Window.partitionBy("role", "id", "name").orderBy("time")
    counters = samples.where(F.col("name").isin(*TOPIC_COUNTERS)) \
        .groupBy("time", "role", "id", "name").agg(F.sum("value").alias("total")) \
        .withColumn("increase", F.greatest(F.col("total") - F.lag("total").over(series), F.lit(0.0))) \
        .where("increase is not null")
    return {"topic_gauges": gauges, "topic_counters": counters}


def prometheus_url(explicit: Optional[str]) -> Optional[str]:
    """--prometheus, else the "prometheus" of the local cluster's cluster.json (`cluster up --prometheus`)."""
    if explicit:
        return explicit.rstrip("/")
    path = os.path.join(os.environ.get("GREGOR_DATA_DIR") or "./.gregor", "cluster.json")
    try:
        with open(path) as f:
            url = json.load(f).get("prometheus", "")
    except (OSError, ValueError):
        return None
    return url.split(",")[0].rstrip("/") or None


def query_range(url: str, promql: str, start: float, end: float) -> list[tuple[str, float, float]]:
    """(labels JSON, unix time, value) of every point of a range query; raises on an API error."""
    q = urllib.parse.urlencode({"query": promql, "start": start, "end": end, "step": PROMETHEUS_STEP_S})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{q}", timeout=PROMETHEUS_TIMEOUT_S) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus query {promql!r} failed: {body.get('error')}")
    return [(json.dumps(s["metric"], sort_keys=True), float(t), float(v))
            for s in body["data"]["result"] for t, v in s["values"]]


def prometheus_table(spark: Any, url: str, minutes: float) -> Any:
    end = time.time()
    rows = [(name, labels, t, v) for name, promql in PROMQL.items()
            for labels, t, v in query_range(url, promql, end - minutes * 60, end)]
    from pyspark.sql import functions as F

    df = spark.createDataFrame(rows, "series string, labels string, t double, value double")
    return df.withColumn("time", F.timestamp_seconds("t")).drop("t")


def run(spark: Any, out: str, *, bootstrap: Optional[str] = None, prometheus: Optional[str] = None,
        minutes: float = 30.0) -> dict[str, Any]:
    from pyspark.sql import functions as F

    os.makedirs(out, exist_ok=True)
    frames: dict[str, Any] = {}
    from gregor_spark.cluster import GregorCluster
    from gregor_spark.options import bootstrap_of

    c = GregorCluster(bootstrap_of({"bootstrap": bootstrap} if bootstrap else {}))
    try:
        has_topic = METRICS_TOPIC in c.all_topics()
    finally:
        c.close()
    if has_topic:
        tables = topic_tables(metrics_topic(spark, bootstrap))
        frames["topic_gauges"] = save(tables["topic_gauges"], out, "topic_gauges", ["name", "role", "id", "time"])
        frames["topic_counters"] = save(tables["topic_counters"].drop("total"), out, "topic_counters",
                                        ["name", "role", "id", "time"])
    url = prometheus_url(prometheus)
    if url:
        prom = prometheus_table(spark, url, minutes).cache()
        frames["prometheus_series"] = save(prom, out, "prometheus_series", ["series", "labels", "time"])
        frames["prometheus_summary"] = save(
            prom.groupBy("series", "labels").agg(F.count("*").alias("points"), F.max("value").alias("max"),
                                                 F.avg("value").alias("mean"), F.max_by("value", "time").alias("last")),
            out, "prometheus_summary", ["series", "labels"])
        prom.unpersist()
    frames["charts"] = _charts(out, frames)
    return frames


def _charts(out: str, f: dict[str, Any]) -> list[str]:
    charts = []
    s = f.get("prometheus_series")
    if s is not None and len(s):
        for name, title in (("controller_state_rate", "ControllerState rate (events/s) by state"),
                            ("event_queue_size", "controller event queue size"),
                            ("under_replicated", "under-replicated partitions"),
                            ("leader_elections", "leader elections per minute by kind")):
            part = s[s.series == name]
            if len(part):
                wide = part.pivot_table(index="time", columns="labels", values="value")
                charts.append(chart(out, f"prom_{name}", lambda ax, w=wide: w.plot(ax=ax, legend=len(w.columns) > 1),
                                    title))
        isr = s[s.series.isin(["isr_shrinks", "isr_expands"])]
        if len(isr):
            wide = isr.pivot_table(index="time", columns="series", values="value")
            charts.append(chart(out, "prom_isr", lambda ax: wide.plot(ax=ax), "ISR shrinks / expands per minute"))
    g = f.get("topic_gauges")
    if g is not None and len(g):
        urp = g[g.name == "gregor_broker_under_replicated_partitions"]
        if len(urp):
            wide = urp.pivot_table(index="time", columns="id", values="value")
            charts.append(chart(out, "topic_under_replicated", lambda ax: wide.plot(ax=ax, drawstyle="steps-post"),
                                "under-replicated partitions per broker (__gregor_metrics)"))
    return charts


def main(argv: Optional[list[str]] = None) -> None:
    p = parser("Cluster health from Prometheus and the __gregor_metrics topic")
    p.add_argument("--prometheus", default=None, help="Prometheus base URL (default: the local cluster's)")
    p.add_argument("--minutes", type=float, default=30.0, help="how far back to query Prometheus")
    a = p.parse_args(argv)
    spark = session("gregor-cluster-health", a.master)
    result = run(spark, os.path.join(a.out, "health"), bootstrap=a.bootstrap, prometheus=a.prometheus,
                 minutes=a.minutes)
    if "prometheus_summary" in result:
        print(result["prometheus_summary"].to_string(index=False))
    spark.stop()


if __name__ == "__main__":
    main()
