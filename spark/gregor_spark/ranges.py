"""Offset ranges: planning (Spark's KafkaOffsetReader + KafkaOffsetRangeCalculator), data-loss rules,
rate limiting (maxOffsetsPerTrigger) and reading one range into Arrow batches.

Planning runs on the driver and fixes every range before any task starts, capped
at the high watermark (LSO under read_committed), so a re-run reads the same records.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from gregor.common import errors, uuid
from gregor_spark import arrow
from gregor_spark.cluster import GregorCluster
from gregor_spark.options import OffsetSpec, SourceOptions, TopicPartition

log = logging.getLogger("gregor_spark")

DATA_LOSS_HINT_FAIL = ('Some data may have been lost because they are not available in Gregor any more; either the '
                       'data was aged out by Gregor or the topic may have been deleted before all the data in the '
                       "topic was processed. If you don't want your streaming query to fail on such cases, set the "
                       'source option "failOnDataLoss" to "false".')
DATA_LOSS_HINT_WARN = ('Some data may have been lost because they are not available in Gregor any more; either the '
                       'data was aged out by Gregor or the topic may have been deleted before all the data in the '
                       'topic was processed. If you want your streaming query to fail on such cases, set the source '
                       'option "failOnDataLoss" to "true".')


class DataLossError(RuntimeError):
    """failOnDataLoss=true and records that were asked for are gone (OFFSET_OUT_OF_RANGE)."""


class TopicIdChangedError(RuntimeError):
    """A topic the query read was deleted and re-created under the same name (KIP-516 topic ids): its
    offsets are not the new topic's, so the query fails instead of reading the new topic as the old."""


def report_data_loss(fail: bool, message: str) -> None:
    """Spark's reportDataLoss: raise, or warn and go on."""
    if fail:
        raise DataLossError(f"OFFSET_OUT_OF_RANGE: {message}. {DATA_LOSS_HINT_FAIL}")
    log.warning("%s. %s", message, DATA_LOSS_HINT_WARN)


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark task: records [start, end) of one topic-partition, and how to reach the cluster."""

    topic: str
    partition: int
    start: int
    end: int
    bootstrap: str
    transport: str = "grpc"
    read_committed: bool = False
    include_headers: bool = False
    fail_on_data_loss: bool = True
    # The topic id (KIP-516) the offsets were planned on; every fetch carries it, so a topic deleted
    # and re-created meanwhile fails the task (UNKNOWN_TOPIC_ID) instead of reading the new one.
    topic_id: bytes = b""
    # kafka.security.protocol / kafka.ssl.* options (without the prefix): TLS to the brokers.
    security: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        return self.end - self.start


def resolve(cluster: GregorCluster, spec: OffsetSpec, tps: list[TopicPartition], *, default: str,
            ts_latest: bool, option: str) -> dict[TopicPartition, int]:
    """Offsets of a starting/ending spec for each partition; earliest/latest asked of the leaders."""
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        kind, value = spec.resolve(tp, default)
        if kind == "offset":
            out[tp] = value
        elif kind == "earliest" or kind == "latest":
            out[tp] = cluster.list_offset(tp, value)[0]
        else:
            found = cluster.offset_for_time(tp, value)
            if found is None:
                if not ts_latest and option.startswith("starting"):
                    raise ValueError(f"No offset matched from request of topic-partition {tp[0]}-{tp[1]} and "
                                     f"timestamp {value} (option '{option}'); set "
                                     "'startingOffsetsByTimestampStrategy' to 'latest' to start at the end instead")
                found = cluster.list_offset(tp, -1)[0]
            out[tp] = found
    return out


def checked_start(tp: TopicPartition, start: int, earliest: int, latest: int, fail: bool) -> int:
    """A start below the log start offset or above the high watermark is data loss (Spark's rule)."""
    if start < earliest:
        report_data_loss(fail, f"Cannot fetch offset {start} (TopicPartition: {tp[0]}-{tp[1]}): the log starts at "
                               f"{earliest}; starting from {earliest} instead")
        return earliest
    if start > latest:
        report_data_loss(fail, f"Cannot fetch offset {start} (TopicPartition: {tp[0]}-{tp[1]}): it is beyond the "
                               f"high watermark {latest}")
        return latest
    return start


def split(ranges: list[RangePartition], min_partitions: Optional[int]) -> list[RangePartition]:
    """Spark's KafkaOffsetRangeCalculator: with minPartitions above the range count, big ranges are cut
    into parts in proportion to their size (each part at least one offset)."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out: list[RangePartition] = []
    for r in ranges:
        parts = max(1, min(r.size, math.floor(r.size / total * min_partitions + 0.5)))
        bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [RangePartition(**{**r.__dict__, "start": a, "end": b}) for a, b in zip(bounds, bounds[1:])]
    return out


def rate_limit(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
               limit: int) -> dict[TopicPartition, int]:
    """Spark's KafkaMicroBatchStream.rateLimit: at most `limit` offsets, shared in proportion to each
    partition's backlog (a share below one offset is rounded up so small partitions move)."""
    sizes = {tp: max(0, e - start.get(tp, e)) for tp, e in end.items()}
    total = sum(sizes.values())
    if total <= limit:
        return dict(end)
    out = {}
    for tp, e in end.items():
        begin = start.get(tp, e)
        prorate = limit * sizes[tp] / total
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(begin + step, e)
    return out


def read_range(r: RangePartition, cluster: Optional[GregorCluster] = None) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one range: fetch whole batches, decode them in Rust, wrap the buffers."""
    own = cluster is None
    c = cluster or GregorCluster(r.bootstrap, transport=r.transport, read_committed=r.read_committed,
                                  security=dict(r.security))
    tp = (r.topic, r.partition)
    try:
        pos = r.start
        while pos < r.end:
            try:
                res = c.fetch(tp, pos, r.topic_id)
            except errors.UnknownTopicIdError as err:  # type: ignore[attr-defined]
                raise TopicIdChangedError(
                    f"UNKNOWN_TOPIC_ID: topic '{r.topic}' was deleted and re-created while offsets "
                    f"[{r.start}, {r.end}) of partition {r.partition} were being read (planned on topic id "
                    f"{uuid.to_string(r.topic_id)}): {err}") from err
            except errors.OffsetOutOfRangeError:  # type: ignore[attr-defined]
                earliest = c.list_offset(tp, -2)[0]
                if pos >= earliest:
                    report_data_loss(r.fail_on_data_loss, f"Cannot fetch offset {pos} (TopicPartition: "
                                     f"{r.topic}-{r.partition}): the log ends before it")
                    return
                report_data_loss(r.fail_on_data_loss, f"Cannot fetch offset {pos} (TopicPartition: "
                                 f"{r.topic}-{r.partition}): the log starts at {earliest}; skipping to it")
                pos = earliest
                continue
            cols = (arrow.decode(res.records, pos, r.end, r.include_headers, res.aborted_transactions)
                    if res.records else None)
            if cols is None or cols["next_offset"] <= pos:
                # Nothing at or after pos below the high watermark: the log lost records we planned for
                # (truncated after an unclean election, or compacted away at the tail).
                report_data_loss(r.fail_on_data_loss, f"Cannot fetch records in [{pos}, {r.end}) (TopicPartition: "
                                 f"{r.topic}-{r.partition}): the high watermark is {res.high_watermark}")
                return
            if cols["rows"]:
                yield arrow.record_batch(cols, r.topic, r.partition, r.include_headers)
            pos = cols["next_offset"]
    finally:
        if own:
            c.close()


def plan(cluster: GregorCluster, opts: SourceOptions) -> list[RangePartition]:
    """The batch query's ranges: starting/ending offsets per partition, checked, capped at the HW."""
    tps = cluster.partitions(opts)
    ids = cluster.topic_ids()
    earliest = cluster.earliest(tps)
    latest = cluster.latest(tps)
    starts = resolve(cluster, opts.starting, tps, default="earliest", ts_latest=opts.timestamp_strategy_latest,
                     option="startingOffsets")
    ends = resolve(cluster, opts.ending, tps, default="latest", ts_latest=True, option="endingOffsets")
    out = []
    for tp in tps:
        start = checked_start(tp, starts[tp], earliest[tp], latest[tp], opts.fail_on_data_loss)
        end = min(ends[tp], latest[tp])
        if end < start:
            raise ValueError(f"Starting offset for {tp[0]}-{tp[1]} ({start}) is after its ending offset ({end}): "
                             "check options 'startingOffsets' and 'endingOffsets'")
        out.append(partition_of(opts, tp, start, end, ids.get(tp[0], b"")))
    return split(out, opts.min_partitions)


def partition_of(opts: SourceOptions, tp: TopicPartition, start: int, end: int,
                 topic_id: bytes = b"") -> RangePartition:
    return RangePartition(tp[0], tp[1], start, end, opts.bootstrap, opts.fetch_transport,
                          opts.isolation_read_committed, opts.include_headers, opts.fail_on_data_loss, topic_id,
                          opts.security)
