"""The idempotent producer's sequence rules (ProducerSequences): numbering, in-flight limits, retries, epoch bumps."""

from __future__ import annotations

import time

import gregor_native as native

from gregor.client.accumulator import ProducerBatch
from gregor.client.producer_sequences import ProducerSequences
from gregor.common import errors

TP = ("t", 0)


def new_batch(n: int = 2) -> ProducerBatch:
    b = ProducerBatch("t", 0, time.monotonic(), 1000)
    b.records = [(None, f"v{i}".encode(), [], 0) for i in range(n)]
    b.encode("none")
    return b


def err(code: int) -> errors.GregorError:
    return errors.error_for(code, "test")


def sent(tm: ProducerSequences, *batches: ProducerBatch) -> None:
    tm.assign_sequences(TP, list(batches))


async def test_no_batch_leaves_before_a_producer_id() -> None:
    tm = ProducerSequences(5)
    assert tm.drainable(TP, new_batch()) == 0
    tm.set_producer_id_and_epoch(42, 0)
    assert tm.drainable(TP, new_batch()) == 5


async def test_sequences_are_stamped_into_the_header_with_a_valid_crc() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(42, 0)
    a, b = new_batch(3), new_batch(2)
    sent(tm, a, b)
    assert (a.base_sequence, b.base_sequence, tm.entry(TP).next_sequence) == (0, 3, 5)
    h = native.parse_batches(b.encode("none"), True)[0]  # verifies the CRC
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (42, 0, 3, 4)


async def test_at_most_five_unacknowledged_batches_per_partition() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    batches = [new_batch() for _ in range(5)]
    sent(tm, *batches[:3])
    assert tm.drainable(TP, new_batch()) == 2
    sent(tm, *batches[3:])
    assert tm.drainable(TP, new_batch()) == 0
    tm.request_done(TP)
    tm.on_success(batches[0])
    assert tm.drainable(TP, new_batch()) == 1 and tm.entry(TP).last_acked_sequence == 1


async def test_retry_goes_alone_in_sequence_order_with_nothing_on_the_wire() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    a, b = new_batch(), new_batch()
    sent(tm, a)
    sent(tm, b)
    tm.request_done(TP)  # a's answer: lost
    assert tm.can_retry(a, err(errors.Code.NETWORK_EXCEPTION))
    assert tm.drainable(TP, a) == 0  # b is still on the wire
    tm.request_done(TP)  # b: OUT_OF_ORDER (a missing) and not the next sequence: plain retry, no bump
    assert tm.can_retry(b, err(errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER))
    assert not tm.entry(TP).epoch_bump_required
    assert tm.drainable(TP, b) == 0  # not the first unacknowledged sequence
    assert tm.drainable(TP, a) == 1
    assert a.base_sequence == 0 and b.base_sequence == 2  # retries keep their sequences


async def test_out_of_order_for_the_next_sequence_bumps_epoch_and_renumbers() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    done, a, b = new_batch(), new_batch(), new_batch()
    sent(tm, done)
    tm.request_done(TP)
    tm.on_success(done)
    sent(tm, a, b)
    tm.request_done(TP)
    assert tm.can_retry(a, err(errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER))  # a is next: the broker lost state
    assert tm.can_retry(b, err(errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER))
    assert tm.entry(TP).epoch_bump_required
    assert tm.drainable(TP, a) == 1  # bump done on the way
    assert (tm.producer_epoch, a.producer_epoch, a.base_sequence, b.base_sequence) == (1, 1, 0, 2)
    h = native.parse_batches(a.encode("none"), True)[0]
    assert (h.producer_epoch, h.base_sequence) == (1, 0)


async def test_failed_batch_bumps_epoch_so_later_batches_do_not_wait_on_a_gap() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    a, b = new_batch(), new_batch()
    sent(tm, a, b)
    tm.request_done(TP)
    tm.on_failed(a)  # e.g. delivery.timeout.ms
    assert tm.drainable(TP, b) == 1
    assert (b.producer_epoch, b.base_sequence) == (1, 0)


async def test_other_partitions_move_to_a_bumped_epoch_only_when_settled() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    other = ("t", 1)
    x = ProducerBatch("t", 1, time.monotonic(), 1000)
    x.records = [(None, b"x", [], 0)]
    tm.assign_sequences(other, [x])
    tm.request_done(other)
    tm.can_retry(x, err(errors.Code.NETWORK_EXCEPTION))  # x unresolved on partition 1
    tm.producer_epoch = 5  # partition 0 bumped meanwhile
    assert tm.drainable(other, new_batch()) == 0  # no new sequences while x is unresolved
    assert tm.drainable(other, x) == 1 and x.producer_epoch == 0  # x retried under its own epoch
    tm.assign_sequences(other, [x])
    tm.request_done(other)
    tm.on_success(x)
    assert tm.drainable(other, new_batch()) == 5 and tm.entry(other).producer_epoch == 5


async def test_unknown_producer_id_for_the_first_batch_after_state_loss_bumps() -> None:
    tm = ProducerSequences(5)
    tm.set_producer_id_and_epoch(1, 0)
    acked, a = new_batch(), new_batch()
    sent(tm, acked)
    tm.request_done(TP)
    tm.on_success(acked)
    sent(tm, a)
    tm.request_done(TP)
    assert tm.can_retry(a, err(errors.Code.UNKNOWN_PRODUCER_ID))
    assert tm.drainable(TP, a) == 1 and (a.producer_epoch, a.base_sequence) == (1, 0)
    assert not tm.can_retry(a, err(errors.Code.INVALID_PRODUCER_EPOCH))
