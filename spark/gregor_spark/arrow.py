"""Spark's Kafka-source schema, and pyarrow RecordBatches built from the native module's column buffers.

`gregor_native.decode_columns` turns whole fetched batches (compressed or not)
into Arrow-layout buffers in one Rust pass; this module only wraps those
buffers with `pyarrow.Array.from_buffers` (no copy, no per-record Python).
The topic and partition columns are constant per input partition. Under
read_committed the batches of aborted transactions are dropped whole before
decoding (txn_filter walks the batch headers), so Rust only sees kept batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
from gregor.client.txn_filter import committed_batches
from gregor.common.records import batch_headers
from gregor_native import _native as native

# Spark's Kafka source schema (KafkaRecordToRowConverter.kafkaSchema), column for column.
SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
# Spark's TimestampType is microseconds since the epoch in the session time zone (UTC in Arrow).
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


def ddl(include_headers: bool) -> str:
    return SCHEMA_DDL + (", " + HEADERS_DDL if include_headers else "")


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
              pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
              pa.field("timestamp", TIMESTAMP_TYPE), pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def _binary(col: tuple[bytes, bytes, bytes, int], n: int, typ: pa.DataType = pa.binary()) -> pa.Array:
    validity, offsets, data, nulls = col
    return pa.Array.from_buffers(typ, n, [pa.py_buffer(validity) if nulls else None, pa.py_buffer(offsets),
                                          pa.py_buffer(data)], null_count=nulls)


def _fixed(buf: bytes, n: int, typ: pa.DataType) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(buf)], null_count=0)


def record_batch(cols: dict[str, Any], topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
    """One RecordBatch of Spark's schema from decode_columns' output."""
    n = int(cols["rows"])
    arrays = [_binary(cols["key"], n), _binary(cols["value"], n), pa.repeat(pa.scalar(topic, pa.string()), n),
              pa.repeat(pa.scalar(partition, pa.int32()), n), _fixed(cols["offset"], n, pa.int64()),
              _fixed(cols["timestamp"], n, TIMESTAMP_TYPE), _fixed(cols["timestamp_type"], n, pa.int32())]
    if include_headers:
        hk, hv = cols["header_key"], cols["header_value"]
        entries = len(hk[1]) // 4 - 1
        struct = pa.StructArray.from_arrays([_binary(hk, entries, pa.string()), _binary(hv, entries)],
                                            fields=list(HEADER_TYPE.value_type))
        arrays.append(pa.ListArray.from_buffers(HEADER_TYPE, n, [None, pa.py_buffer(cols["header_offsets"])],
                                                null_count=0, children=[struct]))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def decode(data: bytes, start: int, end: int, include_headers: bool,
           aborted: Sequence[tuple[int, int]] = ()) -> dict[str, Any]:
    """Columns of the records in [start, end) of fetched whole batches (CRC checked, decompressed in Rust).

    `aborted` is a read_committed fetch's (producer id, first offset) list: those transactions' batches
    are cut out by byte range and the rest decoded in one native pass; next_offset still moves past the
    dropped batches (as decode_columns moves past control batches), so the reader never refetches them.
    """
    if not aborted:
        return native.decode_columns(data, min_offset=start, max_offset=end, headers=include_headers)
    headers = batch_headers(data)  # CRCs checked here, once
    view = memoryview(data)
    kept = b"".join(view[pos:pos + h.size_bytes] for pos, h in committed_batches(headers, aborted))
    cols = native.decode_columns(kept, min_offset=start, max_offset=end, headers=include_headers, verify_crc=False)
    cols["next_offset"] = max([start] + [min(h.base_offset + h.last_offset_delta + 1, end)
                                         for h in headers if h.base_offset < end])
    return cols
