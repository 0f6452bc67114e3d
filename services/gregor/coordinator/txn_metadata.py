"""Kafka's TransactionMetadata: one transactional id's state and the rules that move it (seed 003, §6.8).

Pure: every decision takes the metadata, the request and the time, and returns
the metadata to write to `__transaction_state` (or raises a typed error); the
TransactionCoordinator does the I/O (the write, the markers). States and their
allowed predecessors are Kafka's TransactionState.validPreviousStates:

    Empty ──AddPartitions──► Ongoing ──EndTxn(commit)──► PrepareCommit ──markers──► CompleteCommit
      ▲                        │ └─────EndTxn(abort) / timeout──► PrepareAbort ──markers──► CompleteAbort
      └──InitProducerId────────┴─(new instance: PrepareEpochFence, abort with the bumped epoch)

Record layout: the key is Kafka's TransactionLogKey (version i16 = 0, transactional id
as an i16-length string); the value is versioned JSON (this value also carries the
pending transactional consumer offsets, which Kafka keeps in __consumer_offsets).
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from gregor.common import errors

Code = errors.Code
MAX_PRODUCER_EPOCH = 32767  # a short; the next bump takes a new producer id (Kafka's producerIdAndEpoch rule)
NO_PRODUCER_ID = -1
KEY_VERSION = 0
VALUE_VERSION = 1
TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"


S = TxnState
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
}
IDLE = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PREPARING = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id (immutable: each transition is a new value, written before it is used)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = S.EMPTY
    partitions: frozenset[TopicPartition] = frozenset()
    # group id -> (topic, partition) -> (offset, metadata): committed only if the transaction commits.
    pending_offsets: dict[str, dict[TopicPartition, tuple[int, str]]] = field(default_factory=dict)
    groups: frozenset[str] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1

    def to(self, state: TxnState, now_ms: int, **changes: Any) -> "TxnMetadata":
        """The metadata in `state` (Kafka's prepareTransitionTo); an illegal move is a bug, not input."""
        if self.state not in VALID_PREVIOUS[state]:
            raise errors.error_for(Code.INVALID_TXN_STATE, f"transaction {self.transactional_id} cannot move from "
                                                           f"{self.state.value} to {state.value}")
        return replace(self, state=state, last_update_ms=now_ms, **changes)

    def check_producer(self, producer_id: int, producer_epoch: int) -> None:
        """Kafka's fencing of a transactional call: the id's current producer id and epoch only."""
        if producer_id != self.producer_id:
            raise errors.error_for(Code.PRODUCER_FENCED if producer_id >= 0 else Code.INVALID_REQUEST,
                                   f"producer id {producer_id} is not the current one of transactional id "
                                   f"{self.transactional_id} ({self.producer_id})")
        if producer_epoch != self.producer_epoch:
            raise errors.error_for(Code.PRODUCER_FENCED,
                                   f"There is a newer producer with the same transactionalId "
                                   f"{self.transactional_id} which fences the current one: epoch "
                                   f"{producer_epoch} is not {self.producer_epoch}")

    def is_expired(self, now_ms: int) -> bool:
        return self.state is S.ONGOING and now_ms - self.txn_start_ms > self.timeout_ms


# ---------------------------------------------------------------------------- decisions
def init_producer_id(md: Optional[TxnMetadata], transactional_id: str, timeout_ms: int, now_ms: int,
                     new_producer_id: Callable[[], int]) -> TxnMetadata:
    """InitProducerId on an idle (or new) id: the epoch bumped, a new producer id on first use or overflow.

    The caller has already finished any ongoing or preparing transaction (fence_and_abort / markers).
    """
    if md is None:
        return TxnMetadata(transactional_id, new_producer_id(), 0, timeout_ms, S.EMPTY, last_update_ms=now_ms)
    if md.state not in IDLE:
        raise errors.error_for(Code.CONCURRENT_TRANSACTIONS,
                               f"transaction {transactional_id} is {md.state.value}: retry once it completes")
    if md.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
        pid, epoch = new_producer_id(), 0
    else:
        pid, epoch = md.producer_id, md.producer_epoch + 1
    return md.to(S.EMPTY, now_ms, producer_id=pid, producer_epoch=epoch, timeout_ms=timeout_ms,
                 partitions=frozenset(), groups=frozenset(), pending_offsets={}, txn_start_ms=-1)


def fence_and_abort(md: TxnMetadata, now_ms: int) -> TxnMetadata:
    """A new instance (InitProducerId) or the timeout ends an ongoing transaction: PrepareAbort with the epoch
    bumped, so the markers (and the broker's producer state) fence the old instance's late writes."""
    fenced = md.to(S.PREPARE_EPOCH_FENCE, now_ms)
    epoch = min(md.producer_epoch + 1, MAX_PRODUCER_EPOCH - 1)
    return fenced.to(S.PREPARE_ABORT, now_ms, producer_epoch=epoch)


def add_partitions(md: TxnMetadata, producer_id: int, producer_epoch: int, partitions: set[TopicPartition],
                   now_ms: int) -> Optional[TxnMetadata]:
    """AddPartitionsToTxn; None when nothing changes (every partition already in the transaction)."""
    md.check_producer(producer_id, producer_epoch)
    if md.state in PREPARING:
        raise errors.error_for(Code.CONCURRENT_TRANSACTIONS,
                               f"transaction {md.transactional_id} is {md.state.value}: retry once it completes")
    if md.state is S.ONGOING:
        if partitions <= md.partitions:
            return None
        return md.to(S.ONGOING, now_ms, partitions=md.partitions | partitions)
    if md.state not in IDLE:
        raise errors.error_for(Code.INVALID_TXN_STATE, f"transaction {md.transactional_id} is {md.state.value}")
    return md.to(S.ONGOING, now_ms, partitions=frozenset(partitions), groups=frozenset(), pending_offsets={},
                 txn_start_ms=now_ms)


def add_offsets(md: TxnMetadata, producer_id: int, producer_epoch: int, group_id: str, now_ms: int,
                offsets_partition: TopicPartition) -> Optional[TxnMetadata]:
    """AddOffsetsToTxn: the group joins the transaction (and so does its __consumer_offsets partition)."""
    base = add_partitions(md, producer_id, producer_epoch, {offsets_partition}, now_ms) or md
    if group_id in base.groups:
        return None if base is md else base
    return base.to(S.ONGOING, now_ms, groups=base.groups | {group_id})


def txn_offset_commit(md: TxnMetadata, producer_id: int, producer_epoch: int, group_id: str,
                      offsets: dict[TopicPartition, tuple[int, str]], now_ms: int) -> TxnMetadata:
    """TxnOffsetCommit: offsets kept with the transaction until it commits."""
    md.check_producer(producer_id, producer_epoch)
    if md.state is not S.ONGOING or group_id not in md.groups:
        raise errors.error_for(Code.INVALID_TXN_STATE,
                               f"TxnOffsetCommit for group {group_id} needs AddOffsetsToTxn in an ongoing transaction "
                               f"(transaction {md.transactional_id} is {md.state.value})")
    pending = {g: dict(v) for g, v in md.pending_offsets.items()}
    pending.setdefault(group_id, {}).update(offsets)
    return md.to(S.ONGOING, now_ms, pending_offsets=pending)


def end_txn(md: TxnMetadata, producer_id: int, producer_epoch: int, commit: bool,
            now_ms: int) -> Optional[TxnMetadata]:
    """EndTxn: PrepareCommit / PrepareAbort; None for a retry of an EndTxn already decided the same way."""
    md.check_producer(producer_id, producer_epoch)
    target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
    if md.state is S.ONGOING:
        return md.to(target, now_ms)
    done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
    if md.state in (target, done):
        return None  # a retry: the decision stands (markers finish in the background)
    if md.state in PREPARING:
        raise errors.error_for(Code.CONCURRENT_TRANSACTIONS, f"transaction {md.transactional_id} is "
                                                             f"{md.state.value}")
    verb = "commit" if commit else "abort"
    raise errors.error_for(Code.INVALID_TXN_STATE,
                           f"TransactionalId {md.transactional_id}: cannot {verb} in state {md.state.value} "
                           f"(no ongoing transaction)")


def complete(md: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every marker is written: CompleteCommit / CompleteAbort, and the transaction's sets are emptied."""
    target = S.COMPLETE_COMMIT if md.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
    return md.to(target, now_ms, partitions=frozenset(), groups=frozenset(), pending_offsets={})


# ---------------------------------------------------------------------------- __transaction_state records
_KEY_HEAD = struct.Struct(">hh")


def encode_key(transactional_id: str) -> bytes:
    raw = transactional_id.encode()
    return _KEY_HEAD.pack(KEY_VERSION, len(raw)) + raw


def decode_key(data: bytes) -> str:
    version, n = _KEY_HEAD.unpack_from(data, 0)
    if version != KEY_VERSION or len(data) != _KEY_HEAD.size + n:
        raise ValueError(f"not a transaction log key (version {version})")
    return data[_KEY_HEAD.size:].decode()


def encode_value(md: TxnMetadata) -> bytes:
    return json.dumps({
        "v": VALUE_VERSION, "pid": md.producer_id, "epoch": md.producer_epoch, "timeout_ms": md.timeout_ms,
        "state": md.state.value, "partitions": sorted([t, p] for t, p in md.partitions),
        "groups": sorted(md.groups),
        "offsets": {g: [[t, p, o, m] for (t, p), (o, m) in sorted(v.items())] for g, v in md.pending_offsets.items()},
        "start_ms": md.txn_start_ms, "update_ms": md.last_update_ms}, separators=(",", ":")).encode()


def decode_value(transactional_id: str, data: bytes) -> TxnMetadata:
    d = json.loads(data)
    if d.get("v") != VALUE_VERSION:
        raise ValueError(f"transaction log value of unknown version {d.get('v')}")
    return TxnMetadata(
        transactional_id, int(d["pid"]), int(d["epoch"]), int(d["timeout_ms"]), TxnState(d["state"]),
        frozenset((t, int(p)) for t, p in d["partitions"]), {
            g: {(t, int(p)): (int(o), str(m)) for t, p, o, m in v} for g, v in d["offsets"].items()},
        frozenset(d["groups"]), int(d["start_ms"]), int(d["update_ms"]))
