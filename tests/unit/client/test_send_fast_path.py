"""Producer.send's sticky fast path (RecordAccumulator.try_append_sticky) keeps the slow path's semantics.

No network: the producer gets its topic metadata and accumulator directly and never starts its
sender; the test plays the sender (drain, complete, fail).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gregor.client.accumulator import FutureRecordMetadata, ProducerBatch, RecordAccumulator
from gregor.client.metadata import PartitionInfo, TopicInfo
from gregor.client.producer import Producer
from gregor.common import errors
from gregor.common.records import RECORD_OVERHEAD_BYTES

VALUE = b"v" * 100
RECORD = RECORD_OVERHEAD_BYTES + len(VALUE)  # the batch.size estimate of one VALUE record


def topic_info(partitions: int) -> TopicInfo:
    return TopicInfo("t", [PartitionInfo("t", p, 1, 0, (1,), (1,)) for p in range(partitions)])


def offline_producer(partitions: int = 4, **config: Any) -> Producer:
    """A producer that knows topic t and never sends: its accumulator is there, its sender is not."""
    p = Producer({"bootstrap.servers": "127.0.0.1:9", "acks": "1", "linger.ms": 60_000, **config})
    p.metadata.topics["t"] = topic_info(partitions)
    cfg = p.config
    p._acc = RecordAccumulator(batch_size=cfg["batch.size"], linger_ms=cfg["linger.ms"],
                               buffer_memory=cfg["buffer.memory"], max_block_ms=cfg["max.block.ms"],
                               delivery_timeout_ms=cfg["delivery.timeout.ms"],
                               retry_backoff_ms=cfg["retry.backoff.ms"])
    return p


def queued(p: Producer) -> list[ProducerBatch]:
    assert p._acc is not None
    return [b for dq in p._acc.batches.values() for b in dq]


async def test_records_fill_the_sticky_batch_then_move_to_a_new_partition_with_right_offsets() -> None:
    p = offline_producer(batch_size=5 * RECORD)
    handles: list[FutureRecordMetadata] = [await p.send("t", VALUE) for _ in range(12)]
    batches = [h.batch for h in handles]
    # 5, 5 and 2 records, in send order; each full batch sends the next records to another partition (KIP-480)
    firsts = list(dict.fromkeys(batches))
    assert [len(b.records) for b in firsts] == [5, 5, 2]
    assert batches == [firsts[0]] * 5 + [firsts[1]] * 5 + [firsts[2]] * 2
    assert [h.index for h in handles] == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert firsts[0].partition != firsts[1].partition != firsts[2].partition
    for base, batch in zip((100, 200, 300), firsts):
        batch.complete(base)
    for i, h in enumerate(handles):
        md = await h
        assert (md.partition, md.offset) == (h.batch.partition, (100, 200, 300)[i // 5] + i % 5)
        assert h.result() == md


async def test_a_batch_opened_behind_the_sticky_one_takes_the_later_records() -> None:
    """A record that does not fit opens a new batch in the sticky partition: records after it go there
    (or on to another partition), never into the older batch, which still has room (they would
    overtake the record that opened the new one)."""
    p = offline_producer(batch_size=4 * RECORD)
    first = [await p.send("t", VALUE) for _ in range(2)]
    older = first[0].batch
    sticky = older.partition
    big = await p.send("t", b"x" * (5 * RECORD // 2 - RECORD_OVERHEAD_BYTES), partition=sticky)
    assert big.batch is not older  # 2 + 2.5 records > 4: a new batch
    after = await p.send("t", VALUE)  # 2.5 + 1 <= 4: the new batch has room
    assert after.batch is big.batch and len(older.records) == 2
    fuller = await p.send("t", b"x" * (2 * RECORD - RECORD_OVERHEAD_BYTES), partition=sticky)
    assert fuller.batch is not big.batch  # 3.5 + 2 > 4: another batch, holding 2 of 4
    last = await p.send("t", VALUE)
    assert last.batch is fuller.batch and len(older.records) == 2 and len(big.batch.records) == 2


async def test_a_keyed_record_filling_the_sticky_batch_leaves_later_records_in_order() -> None:
    p = offline_producer(batch_size=2 * RECORD)
    first = await p.send("t", VALUE)
    second = await p.send("t", VALUE, partition=first.batch.partition)  # fills it through the slow path
    assert second.batch is first.batch
    third = await p.send("t", VALUE)
    assert third.batch is not first.batch and len(first.batch.records) == 2


@pytest.mark.parametrize("how", ["drained", "aborted"])
async def test_a_sticky_batch_that_left_takes_no_more_records(how: str) -> None:
    p = offline_producer(batch_size=10 * RECORD)
    first = await p.send("t", VALUE)
    assert p._acc is not None
    if how == "drained":
        assert p._acc.drain(("t", first.batch.partition), 1 << 20) == [first.batch]
    else:
        p._acc.abort_undrained(errors.GregorError("no producer id"))
        with pytest.raises(errors.GregorError, match="no producer id"):
            await first
    second = await p.send("t", VALUE)
    assert second.batch is not first.batch and len(first.batch.records) == 1 and not second.done()


async def test_buffer_memory_still_blocks_the_fast_path() -> None:
    p = offline_producer(batch_size=10 * RECORD, **{"buffer.memory": 3 * RECORD, "max.block.ms": 50})
    handles = [await p.send("t", VALUE) for _ in range(3)]
    assert len({h.batch for h in handles}) == 1
    with pytest.raises(errors.GregorError, match="buffer.memory"):
        await p.send("t", VALUE)
    assert len(handles[0].batch.records) == 3


async def test_new_metadata_sends_the_next_record_through_the_partitioner() -> None:
    """The topic shrank (deleted and created again with 2 partitions): the sticky partition 2 or 3 it was
    filling is gone, so the next record must not go into that partition's open batch."""
    p = offline_producer(partitions=4, batch_size=2 * RECORD)
    for _ in range(200):
        h = await p.send("t", VALUE)
        if h.batch.partition >= 2 and len(h.batch.records) == 1:
            break
    else:
        pytest.fail("the sticky partitioner never chose partition 2 or 3")
    p.metadata.topics["t"] = topic_info(2)
    after = await p.send("t", VALUE)
    assert after.batch.partition < 2 and len(h.batch.records) == 1


async def test_callbacks_of_fast_path_records_get_their_own_metadata() -> None:
    p = offline_producer(batch_size=10 * RECORD)
    got: list[tuple[int, int]] = []
    handles = [await p.send("t", VALUE, callback=lambda md, exc: got.append((md.offset, md.timestamp)),
                            timestamp_ms=1_000 + i) for i in range(3)]
    handles[0].batch.complete(40)
    assert got == [(40, 1_000), (41, 1_001), (42, 1_002)]
    await asyncio.sleep(0)


async def test_a_completed_batch_lets_go_of_its_callbacks() -> None:
    """A callback that refers to its own handle must not keep the batch alive in a cycle after it ran
    (the sender frees batches by reference counting, not by waiting for the cyclic GC)."""
    import gc

    p = offline_producer(batch_size=10 * RECORD)
    ok = await p.send("t", VALUE)
    ok.add_done_callback(lambda md, exc, h=ok: None)  # type: ignore[misc]
    failed = await p.send("t", VALUE, partition=(ok.batch.partition + 1) % 4)
    failed.add_done_callback(lambda md, exc, h=failed: None)  # type: ignore[misc]
    assert p._acc is not None
    ok.batch.complete(7)
    failed.batch.fail(errors.GregorError("gone"))
    assert ok.batch.callbacks == [] and failed.batch.callbacks == []
    p._acc.batches.clear()
    p._acc.sticky_batches.clear()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the next collection finds unreachable stays in gc.garbage
    try:
        del ok, failed
        gc.collect()
        assert not [o for o in gc.garbage if isinstance(o, ProducerBatch)]  # freed by reference counting
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
