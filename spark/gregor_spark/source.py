"""`GregorDataSource`: Spark's Kafka source and sink, over Gregor, with Spark 4's Python Data Source API.

    from gregor_spark import GregorDataSource
    spark.dataSource.register(GregorDataSource)
    spark.read.format("gregor").option("subscribe", "orders").load()

Batch reads plan one task per topic-partition range (ranges.py); streaming reads
keep Spark's JSON offsets `{"topic":{"partition":offset}}` in the checkpoint, with the topic ids
(KIP-516) they belong to under the key `@topicIds` (`{"topic": "<id>"}`; "@" is never in a topic
name): a topic deleted and re-created under its name mid-stream fails the query
(TopicIdChangedError) instead of being read at the old topic's offsets;
writes go through the idempotent producer (writer.py).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from gregor.common import uuid
from gregor_spark import arrow, ranges
from gregor_spark.cluster import GregorCluster
from gregor_spark.options import SourceOptions, TopicPartition, parse_source

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python streaming sources
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older Spark: latestOffset() caps itself (see GregorStreamReader)
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Spark < 4.2 never calls prepareForTriggerAvailableNow."""

# Spark's Kafka offsets JSON {"topic": {"partition": offset}}, plus {"@topicIds": {"topic": "<id>"}}.
Offsets = dict[str, dict[str, Any]]
TOPIC_IDS_KEY = "@topicIds"


def to_json(offsets: dict[TopicPartition, int], topic_ids: Optional[Mapping[str, bytes]] = None) -> Offsets:
    out: Offsets = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    ids = {t: uuid.to_string(i) for t, i in sorted((topic_ids or {}).items()) if t in out and i}
    if ids:
        out[TOPIC_IDS_KEY] = ids
    return out


def from_json(offsets: Offsets) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() if not t.startswith("@") for p, o in parts.items()}


def topic_ids_of(offsets: Optional[Offsets]) -> dict[str, bytes]:
    """The topic ids recorded with offsets ({} for offsets checkpointed before topic ids)."""
    return {t: uuid.from_string(str(i)) for t, i in ((offsets or {}).get(TOPIC_IDS_KEY) or {}).items()}


def check_topic_ids(recorded: Mapping[str, bytes], current: Mapping[str, bytes]) -> None:
    """Fail the query when a topic it read was deleted and re-created under the same name (another id):
    its checkpointed offsets belong to the deleted topic (KIP-516)."""
    for topic, old in sorted(recorded.items()):
        new = current.get(topic)
        if new and old and new != old:
            raise ranges.TopicIdChangedError(
                f"INCONSISTENT_TOPIC_ID: topic '{topic}' was deleted and re-created since the query's offsets "
                f"were recorded (topic id {uuid.to_string(old)}, now {uuid.to_string(new)}); its checkpointed "
                "offsets belong to the deleted topic. Start the query with a new checkpoint location to read "
                "the new topic.")


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
        ids = self.cluster.topic_ids()
        starts = ranges.resolve(self.cluster, self.opts.starting, tps, default="latest",
                                ts_latest=self.opts.timestamp_strategy_latest, option="startingOffsets")
        return to_json(starts, ids)

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(self, start: Optional[Offsets] = None, limit: Any = None) -> Offsets:
        """Every partition's high watermark now (new partitions included, from earliest), capped by the limit."""
        ids = self.cluster.topic_ids()
        check_topic_ids(topic_ids_of(start), ids)
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
        return to_json(end, {**ids, **topic_ids_of(start)})

    def reportLatestOffset(self) -> Optional[Offsets]:
        tps = self.cluster.partitions(self.opts, allow_missing=True)
        return to_json(self.cluster.latest(tps), self.cluster.topic_ids())

    # -- planning and reading
    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begin, until = from_json(start), from_json(end)
        ids = {**topic_ids_of(end), **topic_ids_of(start)}
        check_topic_ids(topic_ids_of(start), topic_ids_of(end))
        new = [tp for tp in until if tp not in begin]
        begin.update(self.cluster.earliest(new))  # Spark: partitions added since the last batch start at earliest
        out = []
        for tp, e in sorted(until.items()):
            s = begin[tp]
            if e < s:
                ranges.report_data_loss(self.opts.fail_on_data_loss,
                                        f"Partition {tp[0]}-{tp[1]}'s offset was changed from {s} to {e}")
                continue
            out.append(ranges.partition_of(self.opts, tp, s, e, ids.get(tp[0], b"")))
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
