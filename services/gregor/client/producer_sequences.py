"""The idempotent producer's sequence bookkeeping: the sequence half of Kafka's TransactionManager (seed 003).

The producer gets a producer id (InitProducerId) and numbers the records of
each partition: a batch's baseSequence is the partition's next sequence when
the batch is first drained, and stays with the batch through every retry, so
the leader can drop a resent duplicate and refuse a gap. At most
`max.in.flight.requests.per.connection` (<= 5, the batches the broker
remembers per producer) batches of a partition are unacknowledged at a time.
A retried batch goes out alone, in sequence order, once nothing else of its
partition is on the wire. When a partition's sequences can no longer line up
with the broker's (a batch failed for good, OUT_OF_ORDER_SEQUENCE_NUMBER or
UNKNOWN_PRODUCER_ID for the next expected batch), the producer bumps its
epoch and renumbers that partition's unacknowledged batches from 0, as Kafka
3.x does for an idempotent producer (KIP-360).
Concurrency: event-loop owned (the producer's sender); no locks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gregor.common import errors

if TYPE_CHECKING:
    from gregor.client.accumulator import ProducerBatch, TopicPartition

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_FOR_IDEMPOTENCE = 5  # the broker keeps the last 5 batches of every producer per partition
MAX_PRODUCER_EPOCH = 32767  # a short; past it the producer asks for a new producer id
NO_PRODUCER_ID = -1
NO_LAST_ACKED_SEQUENCE = -1

# The broker's answers that say the partition's sequences need attention.
SEQUENCE_CODES = frozenset({errors.Code.OUT_OF_ORDER_SEQUENCE_NUMBER, errors.Code.UNKNOWN_PRODUCER_ID})


@dataclass
class PartitionSequences:
    """Kafka's TxnPartitionEntry: one partition's producer id/epoch, sequences and unacknowledged batches."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    next_sequence: int = 0
    last_acked_sequence: int = NO_LAST_ACKED_SEQUENCE
    # Batches with a sequence that are neither acknowledged nor failed (on the wire or queued for retry).
    in_flight: list["ProducerBatch"] = field(default_factory=list)
    requests_on_wire: int = 0
    epoch_bump_required: bool = False

    def first_in_flight_sequence(self) -> int:
        return min((b.base_sequence for b in self.in_flight), default=-1)


class ProducerSequences:
    """Producer id, epoch and per-partition sequences of an idempotent producer (event-loop owned)."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = min(max_in_flight, MAX_IN_FLIGHT_FOR_IDEMPOTENCE)
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = -1
        self.partitions: dict["TopicPartition", PartitionSequences] = {}
        self.transactional = False  # a transactional.id producer: batches carry the transactional attribute

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    def set_producer_id_and_epoch(self, producer_id: int, producer_epoch: int) -> None:
        log.info("idempotent producer got producer id %d, epoch %d", producer_id, producer_epoch)
        self.producer_id, self.producer_epoch = producer_id, producer_epoch

    def reset_producer(self, producer_id: int, producer_epoch: int) -> None:
        """A transactional producer's id and epoch from init_transactions(): every partition starts at sequence 0."""
        self.set_producer_id_and_epoch(producer_id, producer_epoch)
        self.partitions = {}

    def entry(self, tp: "TopicPartition") -> PartitionSequences:
        e = self.partitions.get(tp)
        if e is None:
            e = self.partitions[tp] = PartitionSequences(self.producer_id, self.producer_epoch)
        return e

    def _is_stale(self, e: PartitionSequences) -> bool:
        return (e.producer_id, e.producer_epoch) != (self.producer_id, self.producer_epoch)

    # ------------------------------------------------------------ draining
    def drainable(self, tp: "TopicPartition", head: "ProducerBatch") -> int:
        """How many head batches of tp may go out now (0: wait); a retried head goes alone.

        First settles a pending epoch bump or a stale epoch once nothing of tp is on the wire.
        """
        if not self.has_producer_id:
            return 0
        e = self.entry(tp)
        if e.requests_on_wire == 0:
            if e.epoch_bump_required:
                self._bump_epoch_and_renumber(tp, e)
            elif self._is_stale(e) and not e.in_flight:
                self._start_sequences_at_beginning(e)  # Kafka's maybeUpdateProducerIdAndEpoch
        if not self.has_producer_id or e.epoch_bump_required:
            return 0
        if head.has_sequence:
            # A retry: only the first unacknowledged batch, and only with nothing else on the wire,
            # so retries reach the leader in sequence order.
            return 1 if e.requests_on_wire == 0 and head.base_sequence == e.first_in_flight_sequence() else 0
        if self._is_stale(e):
            return 0  # batches of the old epoch are still unresolved: no new sequences meanwhile
        return max(0, self.max_in_flight - len(e.in_flight))

    def assign_sequences(self, tp: "TopicPartition", batches: list["ProducerBatch"]) -> None:
        """Give the new batches of a request their sequences (and producer id/epoch); note the request."""
        e = self.entry(tp)
        for b in batches:
            if not b.has_sequence:
                b.transactional = self.transactional
                b.set_producer_state(e.producer_id, e.producer_epoch, e.next_sequence)
                e.next_sequence = _wrap(e.next_sequence + len(b.records))
                e.in_flight.append(b)
        e.requests_on_wire += 1

    # ------------------------------------------------------------ answers
    def request_done(self, tp: "TopicPartition") -> None:
        self.entry(tp).requests_on_wire -= 1

    def on_success(self, batch: "ProducerBatch") -> None:
        e = self.entry(batch.tp)
        self._remove(e, batch)
        if (batch.producer_id, batch.producer_epoch) == (e.producer_id, e.producer_epoch):
            e.last_acked_sequence = max(e.last_acked_sequence, batch.last_sequence)

    def is_next_sequence(self, batch: "ProducerBatch") -> bool:
        e = self.entry(batch.tp)
        return batch.base_sequence == e.last_acked_sequence + 1

    def can_retry(self, batch: "ProducerBatch", err: errors.GregorError) -> bool:
        """Kafka 3.x's TransactionManager.canRetry for an idempotent producer (may request an epoch bump).

        OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID for a batch that is not the
        next expected one means an earlier batch is still unresolved: retry as it is.
        For the next expected batch the broker's sequence really differs from ours:
        bump the epoch, renumber the partition from 0, and retry.
        """
        if err.code in SEQUENCE_CODES:
            if not self.is_next_sequence(batch):
                return True
            log.warning("%s-%d: %s for the next expected batch (sequence %d, producer %d epoch %d); "
                        "bumping the epoch", batch.topic, batch.partition, err.name, batch.base_sequence,
                        batch.producer_id, batch.producer_epoch)
            self.request_epoch_bump(batch.tp)
            return True
        return err.retriable

    def on_failed(self, batch: "ProducerBatch") -> None:
        """A batch failed for good: its sequence will never be acknowledged, so the partition renumbers."""
        e = self.entry(batch.tp)
        if batch.has_sequence and (batch.producer_id, batch.producer_epoch) == (e.producer_id, e.producer_epoch):
            self.request_epoch_bump(batch.tp)
        self._remove(e, batch)

    def replace_with_parts(self, merged: "ProducerBatch", parts: list["ProducerBatch"]) -> None:
        """A merged batch was split (MESSAGE_TOO_LARGE): its parts are unacknowledged instead."""
        e = self.entry(merged.tp)
        self._remove(e, merged)
        e.in_flight.extend(parts)

    def request_epoch_bump(self, tp: "TopicPartition") -> None:
        if self.transactional:
            return  # only the transaction coordinator bumps a transactional producer's epoch (the send failed:
            # the transaction is abortable, and abort_transaction() + a new transaction start sequences anew)
        self.entry(tp).epoch_bump_required = True

    # ------------------------------------------------------------ epoch bumps
    def _bump_epoch_and_renumber(self, tp: "TopicPartition", e: PartitionSequences) -> None:
        if not self._is_stale(e):  # another partition may have bumped the epoch already
            if self.producer_epoch >= MAX_PRODUCER_EPOCH:
                log.info("producer epoch exhausted: asking for a new producer id")
                self.producer_id, self.producer_epoch = NO_PRODUCER_ID, -1
                return
            self.producer_epoch += 1
            log.info("idempotent producer %d bumped its epoch to %d for %s-%d",
                     self.producer_id, self.producer_epoch, *tp)
        self._start_sequences_at_beginning(e)

    def _start_sequences_at_beginning(self, e: PartitionSequences) -> None:
        """Kafka's startSequencesAtBeginning: unacknowledged batches renumbered from 0 under the current epoch."""
        seq = 0
        e.in_flight.sort(key=lambda b: b.base_sequence)
        for b in e.in_flight:
            b.set_producer_state(self.producer_id, self.producer_epoch, seq)
            seq = _wrap(seq + len(b.records))
        e.producer_id, e.producer_epoch = self.producer_id, self.producer_epoch
        e.next_sequence = seq
        e.last_acked_sequence = NO_LAST_ACKED_SEQUENCE
        e.epoch_bump_required = False

    @staticmethod
    def _remove(e: PartitionSequences, batch: "ProducerBatch") -> None:
        try:
            e.in_flight.remove(batch)
        except ValueError:
            pass


def _wrap(sequence: int) -> int:
    """Sequences wrap from 2147483647 to 0, as the broker's incrementSequence."""
    return sequence - 2147483648 if sequence > 2147483647 else sequence
