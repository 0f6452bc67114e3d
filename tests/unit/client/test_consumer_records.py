"""The consumer's decode loop: fetched batches to ConsumerRecords (offsets, timestamps, skipping)."""

from __future__ import annotations

import gregor_native as native

from gregor.client.consumer import ConsumerRecord, _consumer_records
from gregor.common import records


def batch(base_offset: int, values: list[bytes], ts: int = 1000, attributes: int = 0, max_ts: int = -1) -> bytes:
    section = native.encode_records([(b"k%d" % i if i % 2 else None, v, [("h", v)] if i % 3 == 0 else [], i)
                                     for i, v in enumerate(values)])
    return native.build_batch(section, len(values), base_offset=base_offset, attributes=attributes,
                              base_timestamp=ts, max_timestamp=max_ts if max_ts >= 0 else ts + len(values) - 1)


def decode(topic: str, partition: int, data: bytes, min_offset: int) -> list[ConsumerRecord]:
    """_consumer_records over a fetched buffer, as the consumer calls it."""
    return _consumer_records(topic, partition, data, records.batch_headers(data), min_offset)


def test_records_carry_offsets_timestamps_keys_and_headers() -> None:
    data = batch(5, [b"a", b"b", b"c"]) + batch(8, [b"d"], ts=2000)
    recs = decode("t", 1, data, 0)
    assert all(type(r) is ConsumerRecord for r in recs)
    assert recs == [ConsumerRecord("t", 1, 5, 1000, None, b"a", [("h", b"a")]),
                    ConsumerRecord("t", 1, 6, 1001, b"k1", b"b", []),
                    ConsumerRecord("t", 1, 7, 1002, None, b"c", []),
                    ConsumerRecord("t", 1, 8, 2000, None, b"d", [("h", b"d")])]
    assert recs[1].key == b"k1" and recs[3].offset == 8


def test_records_below_the_fetch_offset_and_control_batches_are_skipped() -> None:
    control = batch(3, [b"\x00" * 6], attributes=records.CONTROL_FLAG)
    data = batch(0, [b"a", b"b", b"c"]) + control + batch(4, [b"d", b"e"])
    recs = decode("t", 0, data, 1)
    assert [r.offset for r in recs] == [1, 2, 4, 5]
    assert [r.offset for r in decode("t", 0, data, 5)] == [5]
    assert decode("t", 0, data, 6) == []


def test_log_append_time_gives_every_record_the_batch_time() -> None:
    data = batch(0, [b"a", b"b"], attributes=records.TIMESTAMP_TYPE_FLAG, max_ts=777)
    assert [r.timestamp for r in decode("t", 0, data, 0)] == [777, 777]
    assert [r.offset for r in decode("t", 0, data, 1)] == [1]


def test_compressed_batches_decode_like_iter_records() -> None:
    recs = [(None, b"value-%d" % i * 10, [], 1000 + i) for i in range(50)]
    data = records.build_batch(recs, compression="zstd")
    ours = decode("t", 0, data, 0)
    assert [(r.offset, r.timestamp, r.value) for r in ours] == [
        (r.offset, r.timestamp, r.value) for r in records.iter_records(data)]
