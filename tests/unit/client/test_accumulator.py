"""RecordAccumulator: batching by batch.size, linger.ms readiness, buffer.memory backpressure, ordering on retry.

No network: the test plays the sender (drain, complete, deallocate).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gregor.client.accumulator import RecordAccumulator
from gregor.common import errors
from gregor.common.records import RECORD_OVERHEAD_BYTES, iter_records


def make(**kw: int) -> RecordAccumulator:
    args = dict(batch_size=1000, linger_ms=50, buffer_memory=10_000, max_block_ms=200, delivery_timeout_ms=60_000,
                retry_backoff_ms=100)
    args.update(kw)
    return RecordAccumulator(**args)  # type: ignore[arg-type]


async def append(acc: RecordAccumulator, value: bytes, partition: int = 0, topic: str = "t"):  # type: ignore[no-untyped-def]
    size = acc.record_size(None, value, [])
    return await acc.append(topic, partition, None, value, [], 1000, size)


async def test_records_fill_batches_up_to_batch_size() -> None:
    acc = make()
    size = 100 + RECORD_OVERHEAD_BYTES
    for _ in range(20):
        await append(acc, b"x" * 100)
    dq = acc.batches[("t", 0)]
    per_batch = 1000 // size
    assert [len(b.records) for b in dq] == [per_batch] * (20 // per_batch) + ([20 % per_batch] if 20 % per_batch else [])
    assert acc.buffered_bytes == 20 * size


async def test_linger_holds_a_partial_batch_until_it_expires() -> None:
    acc = make(linger_ms=50)
    await append(acc, b"a")
    now = time.monotonic()
    ready, delay = acc.ready(now, set())
    assert ready == [] and 0 < delay <= 0.05
    ready, _ = acc.ready(now + 0.06, set())
    assert ready == [("t", 0)]


async def test_full_batch_and_flush_are_ready_at_once() -> None:
    acc = make(linger_ms=10_000, batch_size=200)
    for _ in range(3):
        await append(acc, b"y" * 100)  # two batches: the first is complete
    assert acc.ready(time.monotonic(), set())[0] == [("t", 0)]
    acc2 = make(linger_ms=10_000)
    await append(acc2, b"z")
    assert acc2.ready(time.monotonic(), set())[0] == []
    acc2.flushes_in_progress += 1
    assert acc2.ready(time.monotonic(), set())[0] == [("t", 0)]
    # A muted partition (request in flight) is never ready.
    assert acc2.ready(time.monotonic(), {("t", 0)})[0] == []


async def test_handles_resolve_from_the_batch_base_offset() -> None:
    acc = make()
    handles = [(await append(acc, b"v%d" % i))[0] for i in range(3)]
    (batch,) = acc.drain(("t", 0), 1 << 20)
    assert [r.value for r in iter_records(batch.payload)] == [b"v0", b"v1", b"v2"]
    seen = []
    handles[1].add_done_callback(lambda md, exc: seen.append((md, exc)))
    acc.deallocate(batch)
    batch.complete(40)
    assert [(await h).offset for h in handles] == [40, 41, 42]
    assert seen[0][0].offset == 41 and seen[0][1] is None
    assert acc.buffered_bytes == 0


async def test_buffer_memory_blocks_append_until_space_is_freed() -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    acc = make(buffer_memory=size * 3, batch_size=size, max_block_ms=2000)
    for _ in range(3):
        await append(acc, b"x" * 100)
    blocked = asyncio.ensure_future(append(acc, b"x" * 100))
    await asyncio.sleep(0.05)
    assert not blocked.done(), "the fourth record must wait for buffer.memory"
    one = len(acc.batches[("t", 0)][0].encode("none"))
    (batch,) = acc.drain(("t", 0), one)  # max.request.size of one batch: one batch per request
    acc.deallocate(batch)  # the fake sender finished one batch
    handle, _ = await asyncio.wait_for(blocked, 1)
    assert acc.buffered_bytes == size * 3


async def test_buffer_memory_times_out_after_max_block_ms() -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    acc = make(buffer_memory=size, max_block_ms=100)
    await append(acc, b"x" * 100)
    start = time.monotonic()
    with pytest.raises(errors.GregorError, match="max blocking time"):
        await append(acc, b"x" * 100)
    assert 0.09 <= time.monotonic() - start < 1.0


async def test_record_larger_than_buffer_memory_fails_fast() -> None:
    acc = make(buffer_memory=100)
    with pytest.raises(errors.GregorError, match="MESSAGE_TOO_LARGE"):
        await append(acc, b"x" * 200)


async def test_drain_bundles_batches_up_to_max_request_size_and_retry_keeps_order() -> None:
    acc = make(batch_size=150)
    for i in range(6):
        await append(acc, b"%03d" % i + b"." * 100)
    dq = acc.batches[("t", 0)]
    assert len(dq) == 6
    one_size = len(dq[0].encode("none"))
    drained = acc.drain(("t", 0), one_size * 3 + 1)
    assert len(drained) == 3
    # A retriable failure puts them back at the head, in order, ahead of the undrained ones.
    for b in reversed(drained):
        acc.reenqueue(b, time.monotonic())
    assert [b.records[0][1][:3] for b in acc.batches[("t", 0)]] == [b"%03d" % i for i in range(6)]
    # The retried head waits for retry.backoff.ms.
    assert acc.ready(time.monotonic(), set())[0] == []
    assert acc.ready(time.monotonic() + 0.2, set())[0] == [("t", 0)]
    # Sealed (drained) batches take no more records; the open tail batch does.
    await append(acc, b"new")
    assert [len(b.records) for b in acc.batches[("t", 0)]] == [1, 1, 1, 1, 1, 2]


async def test_a_batch_encoded_but_left_behind_takes_no_more_records() -> None:
    """A drain with a budget encodes the open head to see whether it fits; when it does not, it stays
    queued, but sealed: records appended later go to a new batch, so the bytes sent later hold every
    record the batch counts (it once kept accepting records its cached bytes did not carry)."""
    acc = make(batch_size=10_000)
    for i in range(3):
        await append(acc, b"r%d" % i + b"." * 100)
    head = acc.batches[("t", 0)][0]
    assert acc.drain(("t", 0), 100_000, None, budget=50) == []  # does not fit what is left of the request
    await append(acc, b"late")
    taken = acc.drain(("t", 0), 100_000, 1)
    assert taken == [head] and len(head.records) == 3
    assert [r.value[:2] for r in iter_records(head.payload)] == [b"r0", b"r1", b"r2"]  # type: ignore[arg-type]
    assert [len(b.records) for b in acc.batches[("t", 0)]] == [1]  # the late record opened a new batch


async def test_expire_and_abort_fail_every_waiting_record() -> None:
    acc = make(delivery_timeout_ms=10)
    h, _ = await append(acc, b"a")
    expired = acc.expire(time.monotonic() + 1)
    assert len(expired) == 1
    acc2 = make()
    h2, _ = await append(acc2, b"b")
    acc2.abort_all(errors.GregorError("boom"))
    with pytest.raises(errors.GregorError, match="boom"):
        await h2
    assert acc2.buffered_bytes == 0


async def test_needs_new_batch_drives_sticky_partitioning() -> None:
    acc = make(batch_size=300)
    assert not acc.needs_new_batch(("t", 0), 50)  # brand-new partition
    await append(acc, b"x" * 100)
    assert not acc.needs_new_batch(("t", 0), 100)
    await append(acc, b"x" * 100)
    assert acc.needs_new_batch(("t", 0), 150)


async def test_try_append_never_blocks_and_leaves_nothing_behind_when_full() -> None:
    size = 100 + RECORD_OVERHEAD_BYTES
    acc = make(buffer_memory=size * 2, batch_size=size * 10)
    assert acc.try_append("t", 0, None, b"x" * 100, [], 1000, size) is not None
    h = acc.try_append("t", 0, None, b"y" * 100, [], 1001, size)
    assert h is not None and h.index == 1
    assert acc.try_append("t", 0, None, b"z" * 100, [], 1002, size) is None, "buffer.memory is full"
    assert [len(b.records) for b in acc.batches[("t", 0)]] == [2]
    assert acc.buffered_bytes == size * 2
    with pytest.raises(errors.GregorError, match="MESSAGE_TOO_LARGE"):
        acc.try_append("t", 0, None, b"x" * 1000, [], 1000, size * 3)


async def test_completion_gives_each_callback_its_own_offset_and_timestamp() -> None:
    acc = make()
    handles = [acc.try_append("t", 0, None, b"v", [], 1000 + i, 30) for i in range(3)]
    seen: list = []  # type: ignore[type-arg]
    for h in handles:
        assert h is not None
        h.add_done_callback(lambda md, exc: seen.append((md, exc)))
    (batch,) = acc.drain(("t", 0), 1 << 20)
    batch.complete(10)
    assert [(md.offset, md.timestamp, exc) for md, exc in seen] == [(10, 1000, None), (11, 1001, None),
                                                                   (12, 1002, None)]
    assert [(await h).offset for h in handles if h is not None] == [10, 11, 12]


async def test_batch_keeps_each_records_timestamp_in_any_order() -> None:
    acc = make()
    for ts in (2000, 1990, 2015, 2000):
        acc.try_append("t", 0, None, b"v", [], ts, 30)
    (batch,) = acc.drain(("t", 0), 1 << 20)
    assert [r.timestamp for r in iter_records(batch.payload)] == [2000, 1990, 2015, 2000]
    assert batch.max_timestamp == 2015


async def test_a_batch_the_encoder_rejects_fails_alone_and_drain_goes_on() -> None:
    acc = make(batch_size=1000)
    bad, _ = await acc.append("t", 0, None, "not bytes", [], 1000, 30)  # type: ignore[arg-type]
    good, _ = await acc.append("t", 1, None, b"fine", [], 1000, 30)
    assert acc.drain(("t", 0), 10_000) == []  # no exception out of drain
    assert bad.done() and isinstance(bad.exception(), errors.GregorError)
    assert bad.exception().code == errors.Code.INVALID_RECORD  # type: ignore[union-attr]
    assert acc.buffered_bytes == 30
    [batch] = acc.drain(("t", 1), 10_000)
    assert batch is good.batch


async def test_cancelling_one_waiter_never_cancels_the_batch() -> None:
    acc = make()
    h1, _ = await append(acc, b"a")
    h2, _ = await append(acc, b"b")
    assert h1.batch is h2.batch
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(h1, 0.01)
    task = asyncio.ensure_future(_wait(h2))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    assert not h1.batch.future.cancelled()
    h1.batch.complete(7)
    assert (await h2).offset == 8 and (await h1).offset == 7
    assert h1.exception() is None and h2.exception() is None


async def _wait(handle):  # type: ignore[no-untyped-def]
    return await handle


def test_one_record_size_estimate() -> None:
    from gregor.client import accumulator, producer

    assert RecordAccumulator.record_size is accumulator.record_size
    assert producer.record_size is accumulator.record_size
    assert accumulator.record_size(b"k", b"vv", [("h", b"123")]) == RECORD_OVERHEAD_BYTES + 3 + 1 + 3 + 4
