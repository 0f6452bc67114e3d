"""Batch and streaming writes: Spark's Kafka sink columns (value; optional key, headers, topic, partition)
produced through Gregor's idempotent producer (acks=all, enable.idempotence=true: a retried batch is
never duplicated by the broker).

Each task owns one producer; a failed record fails the task with the broker's
error name (e.g. `MESSAGE_TOO_LARGE`), so Spark reports it. As with Spark's Kafka
sink, a retried task or a restarted micro-batch may write a record again
(at-least-once across task attempts); idempotence removes only retry duplicates.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType

from gregor.client import Producer
from gregor.common.errors import GregorError
from gregor_spark.options import SinkOptions, parse_sink

try:  # Spark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter  # type: ignore

IN_FLIGHT = 10000  # sends awaited together: bounds memory while the accumulator batches them


class GregorWriteError(RuntimeError):
    """A record was not written; the message starts with the broker's error name."""


@dataclass
class WriteCommit(WriterCommitMessage):
    records: int


def check_schema(schema: StructType, sink: SinkOptions) -> None:
    """Spark's KafkaWriter.validateQuery, worded as Spark words it."""
    types = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in types:
        raise ValueError("Required attribute 'value' not found")
    for col in ("key", "value"):
        if col in types and not isinstance(types[col], (StringType, BinaryType)):
            raise ValueError(f"{col} attribute type must be a string or binary")
    if sink.topic is None:
        if "topic" not in types:
            raise ValueError("topic option required when no 'topic' attribute is present. "
                             "Use the topic option for setting a topic.")
        if not isinstance(types["topic"], StringType):
            raise ValueError("topic attribute type must be a string")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise ValueError("partition attribute type must be an int")


def _bytes(v: Any) -> Optional[bytes]:
    return v.encode() if isinstance(v, str) else v


async def _produce(producer: Producer, sink: SinkOptions, batch: pa.RecordBatch) -> int:
    cols = {name.lower(): batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    n = batch.num_rows
    none = [None] * n
    values, keys = cols["value"], cols.get("key", none)
    topics = [sink.topic] * n if sink.topic else cols["topic"]
    parts, headers = cols.get("partition", none), cols.get("headers", none)
    pending = []
    for i in range(n):
        if topics[i] is None:
            raise GregorWriteError("Null topic present in the data. Use the topic option for setting a topic.")
        # The SDK takes (str, bytes) headers; a null header value is sent empty.
        hs = [(str(h["key"]), _bytes(h["value"]) or b"") for h in headers[i]] if headers[i] else None
        pending.append(await producer.send(topics[i], _bytes(values[i]), _bytes(keys[i]), headers=hs,
                                           partition=parts[i]))
        if len(pending) >= IN_FLIGHT:
            await _settle(pending)
    await _settle(pending)
    return n


async def _settle(pending: list[Any]) -> None:
    try:
        for fut in pending:
            await fut
    except GregorError as err:
        raise GregorWriteError(f"{err.name}: {err.message}") from None
    finally:
        pending.clear()


def write_batches(options: Mapping[str, str], batches: Iterator[pa.RecordBatch]) -> int:
    """Produce every row of the batches; raises GregorWriteError naming the broker's error."""
    sink = parse_sink(options)
    cfg = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, **sink.producer,
           "bootstrap.servers": sink.bootstrap}
    loop = asyncio.new_event_loop()
    try:
        producer = Producer(cfg)
        loop.run_until_complete(producer.start())
        total = 0
        try:
            for batch in batches:
                total += loop.run_until_complete(_produce(producer, sink, batch))
            loop.run_until_complete(producer.flush())
        except GregorError as err:
            raise GregorWriteError(f"{err.name}: {err.message}") from None
        finally:
            loop.run_until_complete(producer.close(5))
        return total
    finally:
        loop.close()


class _ProducingWriter:
    """What the batch and the streaming writer share: checked options, then every batch produced."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = dict(options)
        check_schema(schema, parse_sink(self.options))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommit:
        return WriteCommit(write_batches(self.options, iterator))


class GregorBatchWriter(_ProducingWriter, DataSourceArrowWriter):
    pass


class GregorStreamWriter(_ProducingWriter, DataSourceStreamArrowWriter):
    def commit(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        """Records are acknowledged (acks=all) before a task reports success: nothing left to do."""

    def abort(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        """Records already acknowledged stay in the log (as with Spark's Kafka sink)."""
