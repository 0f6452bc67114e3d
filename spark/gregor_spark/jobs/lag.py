"""Consumer lag over time: every offset commit decoded from __consumer_offsets (read through the gregor
source) against the partition's log end offset at the commit's time, plus the current lag.

The records are decoded by Spark SQL expressions (in the JVM, no Python per record), following Kafka's
GroupMetadataManager layout that Gregor's coordinator writes (coordinator/offsets_log.py):
    OffsetCommitKey   v0/1: version:int16 group:string topic:string partition:int32
    OffsetCommitValue v3:   version:int16 offset:int64 leader_epoch:int32 metadata:string commit_timestamp:int64
Kafka strings are an int16 length then UTF-8 bytes. Group-metadata records (key version 2) and
tombstones (null value) are skipped.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from gregor_spark.jobs.common import chart, parser, reader, save, session

OFFSETS_TOPIC = "__consumer_offsets"


def _u(col: str, pos: str, n: int) -> str:
    """SQL: the big-endian unsigned integer of n bytes at 1-based position pos of a binary column."""
    return f"cast(conv(hex(substring({col}, {pos}, {n})), 16, 10) as bigint)"


def decode_commits(raw: Any) -> Any:
    """(group, topic, partition, committed_offset, commit_time) of the offset-commit records."""
    from pyspark.sql import functions as F

    glen = _u("key", "3", 2)
    tlen = _u("key", f"5 + {glen}", 2)
    mlen = _u("value", "15", 2)
    return (raw.where("value is not null")
            .where(f"{_u('key', '1', 2)} in (0, 1) and {_u('value', '1', 2)} = 3")
            .select(F.expr(f"cast(substring(key, 5, {glen}) as string)").alias("group"),
                    F.expr(f"cast(substring(key, 7 + {glen}, {tlen}) as string)").alias("topic"),
                    F.expr(f"cast({_u('key', f'7 + {glen} + {tlen}', 4)} as int)").alias("partition"),
                    F.expr(_u("value", "3", 8)).alias("committed_offset"),
                    F.expr(f"timestamp_millis({_u('value', f'17 + {mlen}', 8)})").alias("commit_time")))


def run(spark: Any, out: str, *, bootstrap: Optional[str] = None) -> dict[str, Any]:
    from pyspark.sql import functions as F

    os.makedirs(out, exist_ok=True)
    commits = decode_commits(reader(spark, bootstrap).option("subscribe", OFFSETS_TOPIC).load()).cache()
    topics = sorted({r.topic for r in commits.select("topic").distinct().collect()})
    tables: dict[str, Any] = {}
    if topics:
        data = reader(spark, bootstrap).option("subscribe", ",".join(topics)).load() \
            .select("topic", "partition", "offset", "timestamp")
        # Log end offset at a commit's time: one past the last record appended (timestamp) by then.
        c, d = commits.alias("c"), data.alias("d")
        joined = c.join(d, (F.col("c.topic") == F.col("d.topic")) & (F.col("c.partition") == F.col("d.partition"))
                        & (F.col("d.timestamp") <= F.col("c.commit_time")), "left")
        lag = joined.groupBy("c.group", "c.topic", "c.partition", "c.committed_offset", "c.commit_time") \
            .agg((F.coalesce(F.max("d.offset"), F.lit(-1)) + 1).alias("log_end_offset")) \
            .withColumn("lag", F.greatest(F.col("log_end_offset") - F.col("committed_offset"), F.lit(0)))
        tables["lag_over_time"] = lag
        ends = data.groupBy("topic", "partition").agg((F.max("offset") + 1).alias("log_end_offset"))
        latest = commits.groupBy("group", "topic", "partition").agg(
            F.max_by("committed_offset", "commit_time").alias("committed_offset"),
            F.max("commit_time").alias("last_commit"))
        tables["current_lag"] = latest.join(ends, ["topic", "partition"], "left") \
            .withColumn("lag", F.coalesce("log_end_offset", F.lit(0)) - F.col("committed_offset")) \
            .select("group", "topic", "partition", "committed_offset", "log_end_offset", "lag", "last_commit")
    order = {"lag_over_time": ["group", "topic", "partition", "commit_time"],
             "current_lag": ["group", "topic", "partition"]}
    frames = {name: save(t, out, name, order[name]) for name, t in tables.items()}
    frames["commits"] = commits.count()
    commits.unpersist()
    frames["charts"] = _charts(out, frames)
    return frames


def _charts(out: str, f: dict[str, Any]) -> list[str]:
    lag = f.get("lag_over_time")
    if lag is None or not len(lag):
        return []
    per_group = lag.groupby(["commit_time", "group"])["lag"].sum().unstack().ffill().fillna(0)
    return [chart(out, "consumer_lag", lambda ax: per_group.plot(ax=ax, drawstyle="steps-post"),
                  "consumer lag (records) at each commit, per group")]


def main(argv: Optional[list[str]] = None) -> None:
    a = parser("Consumer lag over time from __consumer_offsets against log end offsets").parse_args(argv)
    spark = session("gregor-consumer-lag", a.master)
    result = run(spark, os.path.join(a.out, "lag"), bootstrap=a.bootstrap)
    if "current_lag" in result:
        print(result["current_lag"].to_string(index=False))
    spark.stop()


if __name__ == "__main__":
    main()
