"""`GregorDataSource`: Spark's Kafka source and sink, over Gregor, with Spark 4's Python Data Source API.

    from gregor_spark import GregorDataSource
    spark.dataSource.register(GregorDataSource)
    spark.read.format("gregor").option("subscribe", "orders").load()

Batch reads plan one task per topic-partition range (ranges.py); streaming reads
keep Spark's JSON offsets `{"topic":{"partition":offset}}` in the checkpoint;
writes go through the idempotent producer (writer.py).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from gregor_spark import arrow, ranges
from gregor_spark.cluster import GregorCluster
from gregor_spark.options import SourceOptions, TopicPartition, parse_source

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python streaming sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older Spark: latestOffset() caps itself (see GregorStreamReader)
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Spark < 4.2 never calls prepareForTriggerAvailableNow."""

Offsets = dict[str, dict[str, int]]  # Spark's Kafka offsets JSON: {"topic": {"partition": offset}}


def to_json(offsets: dict[TopicPartition, int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def from_json(offsets: Offsets) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class GregorDataSource(DataSource):
    """Format `gregor`: Spark's Kafka source schema and options over a Gregor cluster."""

    @classmethod
    def name(cls) -> str:
        return "gregor"

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return arrow.ddl(include)

    def reader(self, schema: StructType) -> "GregorBatchReader":
        return GregorBatchReader(parse_source(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> "GregorStreamReader":
        return GregorStreamReader(parse_source(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from gregor_spark.writer import GregorBatchWriter

        return GregorBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from gregor_spark.writer import GregorStreamWriter

        return GregorStreamWriter(self.options, schema)


class _ClusterOwner:
    """A lazily opened cluster connection that is never pickled (readers travel to executors)."""

    opts: SourceOptions
    _cluster: Optional[GregorCluster] = None

    @property
    def cluster(self) -> GregorCluster:
        if self._cluster is None:
            self._cluster = GregorCluster.of(self.opts)
        return self._cluster

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_cluster"}

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


class GregorBatchReader(_ClusterOwner, DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        try:
            return ranges.plan(self.cluster, self.opts)
        finally:
            self.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no range to read Spark still runs one task, handing it a bare InputPartition.
        return ranges.read_range(partition) if isinstance(partition, ranges.RangePartition) else iter(())


class GregorStreamReader(_ClusterOwner, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over per-partition offsets (Spark's KafkaMicroBatchStream).

    Spark >= 4.2 passes a ReadLimit to latestOffset (getDefaultReadLimit gives
    ReadMaxRows(maxOffsetsPerTrigger)); with ReadAllAvailable every available
    record is planned. Trigger.AvailableNow fixes the high watermarks at its start
    (prepareForTriggerAvailableNow) and never plans past them, so the query ends.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: Optional[dict[TopicPartition, int]] = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.cluster.latest(self.cluster.partitions(self.opts, allow_missing=True))

    # -- offsets
    def initialOffset(self) -> Offsets:
        tps = self.cluster.partitions(self.opts)
        starts = ranges.resolve(self.cluster, self.opts.starting, tps, default="latest",
                                ts_latest=self.opts.timestamp_strategy_latest, option="startingOffsets")
        return to_json(starts)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: Optional[Offsets] = None, limit: Any = None) -> Offsets:
        """Every partition's high watermark now (new partitions included, from earliest), capped by the limit."""
        tps = self.cluster.partitions(self.opts, allow_missing=True)
        latest = self.cluster.latest(tps)
        begin = from_json(start) if start else {}
        new = [tp for tp in tps if tp not in begin]
        begin.update(self.cluster.earliest(new))
        if self._target is not None:  # AvailableNow: nothing past the offsets fixed at its start
            latest = {tp: max(begin[tp], min(o, self._target.get(tp, begin[tp]))) for tp, o in latest.items()}
        cap = None
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        elif limit is None and self.opts.max_offsets_per_trigger:  # Spark < 4.2: no ReadLimit passed
            cap = self.opts.max_offsets_per_trigger
        end = ranges.rate_limit(begin, latest, cap) if cap else latest
        return to_json(end)

    def reportLatestOffset(self) -> Optional[Offsets]:
        tps = self.cluster.partitions(self.opts, allow_missing=True)
        return to_json(self.cluster.latest(tps))

    # -- planning and reading
    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begin, until = from_json(start), from_json(end)
        new = [tp for tp in until if tp not in begin]
        begin.update(self.cluster.earliest(new))  # Spark: partitions added since the last batch start at earliest
        out = []
        for tp, e in sorted(until.items()):
            s = begin[tp]
            if e < s:
                ranges.report_data_loss(self.opts.fail_on_data_loss,
                                        f"Partition {tp[0]}-{tp[1]}'s offset was changed from {s} to {e}")
                continue
            out.append(ranges.partition_of(self.opts, tp, s, e))
        for tp in begin:
            if tp not in until:
                ranges.report_data_loss(self.opts.fail_on_data_loss, f"{tp[0]}-{tp[1]} is gone")
        return ranges.split(out, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # With no range to read Spark still runs one task, handing it a bare InputPartition.
        return ranges.read_range(partition) if isinstance(partition, ranges.RangePartition) else iter(())

    def commit(self, end: Offsets) -> None:
        """Nothing to release: Spark's checkpoint holds the offsets, as with Spark's Kafka source
        (which commits nothing to Kafka's group offsets either)."""

    def stop(self) -> None:
        self.close()


__all__ = ["GregorDataSource", "GregorBatchReader", "GregorStreamReader"]
