"""The idempotent drain: ready batches merged into one wire batch, split back on MESSAGE_TOO_LARGE, retries in order."""

from __future__ import annotations

import gregor_native as native

from gregor.client.accumulator import RecordAccumulator
from gregor.common.records import iter_records


def make() -> RecordAccumulator:
    return RecordAccumulator(batch_size=300, linger_ms=0, buffer_memory=100_000, max_block_ms=200,
                             delivery_timeout_ms=60_000, retry_backoff_ms=0)


async def fill(acc: RecordAccumulator, n: int, ts0: int = 1000) -> list:  # type: ignore[type-arg]
    handles = []
    for i in range(n):
        v = f"v{i:03d}".encode() * 5
        h, _ = await acc.append("t", 0, None, v, [], ts0 + i, acc.record_size(None, v, []))
        handles.append(h)
    return handles


async def test_ready_batches_leave_as_one_batch_and_each_record_gets_its_offset() -> None:
    acc = make()
    handles = await fill(acc, 40)
    assert len(acc.batches[("t", 0)]) > 3
    buffered = acc.buffered_bytes
    (merged,) = acc.drain_merged(("t", 0), 1 << 20)
    assert merged.parts is not None and len(merged.parts) > 3 and merged.size_bytes == buffered
    merged.set_producer_state(9, 0, 0)
    data = merged.encode("none")
    (h,) = native.parse_batches(data, True)
    assert (h.records_count, h.producer_id, h.base_sequence) == (40, 9, 0)
    recs = list(iter_records(data))
    assert [r.value for r in recs] == [f"v{i:03d}".encode() * 5 for i in range(40)]
    assert [r.timestamp for r in recs] == [1000 + i for i in range(40)]  # every part's timestamps kept
    merged.complete(500)
    assert [h.result().offset for h in handles] == list(range(500, 540))
    acc.deallocate(merged)
    assert acc.buffered_bytes == 0


async def test_merge_respects_max_request_size_and_single_batches_take_the_plain_path() -> None:
    acc = make()
    await fill(acc, 40)
    first = acc.drain_merged(("t", 0), 700)
    assert len(first) == 1 and first[0].parts is not None and len(first[0].parts) == 2
    acc2 = make()
    await fill(acc2, 3)
    (single,) = acc2.drain_merged(("t", 0), 1 << 20)
    assert single.parts is None


async def test_split_gives_parts_their_share_of_the_sequences_and_retries_keep_order() -> None:
    acc = make()
    handles = await fill(acc, 40)
    (merged,) = acc.drain_merged(("t", 0), 1 << 20)
    merged.set_producer_state(9, 2, 100)
    parts = acc.split_merged(merged)
    for part in reversed(parts):  # failures in any order
        acc.reenqueue(part, 0.0)
    queued = list(acc.batches[("t", 0)])
    assert [b.base_sequence for b in queued] == sorted(b.base_sequence for b in queued)
    assert queued[0].base_sequence == 100
    for b in queued:
        (h,) = native.parse_batches(b.encode("none"), True)
        assert (h.producer_id, h.producer_epoch, h.base_sequence) == (9, 2, b.base_sequence)
    assert sum(b.size_bytes for b in queued) == acc.buffered_bytes
    offset = 0
    for b in queued:
        b.complete(offset)
        offset += len(b.records)
    assert [h.result().offset for h in handles] == list(range(40))
