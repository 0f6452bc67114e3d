"""The transactional producer's client side: Kafka's TransactionManager states and coordinator calls (seed 003).

    async with Producer({"bootstrap.servers": b, "transactional.id": "orders-enricher-0"}) as p:
        await p.init_transactions()          # fences older instances, finishes their open transaction
        await p.begin_transaction()
        await p.send("out", b"v")
        await p.send_offsets_to_transaction({("in", 0): 42}, "enricher")
        await p.commit_transaction()         # or abort_transaction()

States as Kafka's client: UNINITIALIZED -> READY (init_transactions) -> IN_TRANSACTION
(begin_transaction) -> COMMITTING / ABORTING -> READY; a failed send moves to
ABORTABLE_ERROR, which only abort_transaction() leaves; PRODUCER_FENCED (a newer
instance, or the coordinator aborted our timed-out transaction with the epoch
bumped) is FATAL: every later call raises it and the producer must be closed.

Before its first batch to a partition, the sender waits while the partition is
added to the transaction (AddPartitionsToTxn, all partitions pending at once).
Coordinator calls follow FindCoordinator(key_type TRANSACTION) and are retried
on the retriable answers (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
CONCURRENT_TRANSACTIONS while the previous transaction's markers land).
Concurrency: event-loop owned, like the producer.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Optional, Protocol

import grpc

from gregor.client.metadata import call_error
from gregor.client.throttles import Throttles
from gregor.common import errors
from gregor.rpc.v1 import common_pb2, coordinator_pb2, transaction_pb2 as pb, transaction_pb2_grpc

if TYPE_CHECKING:
    from gregor.client.metadata import ClusterMetadata
    from gregor.client.producer_sequences import ProducerSequences

log = logging.getLogger(__name__)
Code = errors.Code
TopicPartition = tuple[str, int]
KEY_TYPE_TRANSACTION = 1
FATAL_CODES = frozenset({Code.PRODUCER_FENCED, Code.INVALID_PRODUCER_EPOCH, Code.INVALID_PRODUCER_ID_MAPPING,
                         Code.TRANSACTION_COORDINATOR_FENCED})


class TxnClientState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING = "COMMITTING_TRANSACTION"
    ABORTING = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


class TransactionAbortableError(errors.InvalidTxnStateError):  # type: ignore[name-defined,misc]
    """A send of this transaction failed: only abort_transaction() can follow (Kafka's abortable error)."""


S = TxnClientState


class TxnSender(Protocol):
    """All a TransactionManager uses of its producer (the Producer implements it): the cluster metadata, the
    idempotence bookkeeping, waking the sender, failing queued records, and flush."""

    metadata: "ClusterMetadata"

    def sequences(self) -> "ProducerSequences": ...

    def wakeup(self) -> None: ...

    def fail_queued(self, tps: set[TopicPartition], exc: BaseException) -> None: ...

    async def flush(self, timeout: Optional[float] = None) -> None: ...


class TransactionManager:
    """One transactional producer's transaction bookkeeping and its calls to the transaction coordinator."""

    def __init__(self, producer: TxnSender, cfg: Mapping[str, Any]) -> None:
        self.producer = producer
        self.transactional_id: str = cfg["transactional.id"]
        self.timeout_ms = int(cfg["transaction.timeout.ms"])
        self.request_timeout_s = int(cfg["request.timeout.ms"]) / 1000
        self.max_block_s = int(cfg["max.block.ms"]) / 1000
        self.backoff_s = int(cfg["retry.backoff.ms"]) / 1000
        self.state = S.UNINITIALIZED
        self.error: Optional[BaseException] = None
        self.added: set[TopicPartition] = set()
        self.pending: set[TopicPartition] = set()
        self.offsets_added = False
        self._adding: Optional[asyncio.Task[None]] = None
        self._coordinator: Optional[str] = None
        self.throttles = Throttles()  # coordinators that answered with throttle_time_ms (KIP-219)

    # ------------------------------------------------------------ state checks
    def _raise_if_failed(self) -> None:
        if self.state is S.FATAL_ERROR and self.error is not None:
            raise self.error

    def _require(self, *states: TxnClientState, action: str) -> None:
        self._raise_if_failed()
        if self.state not in states:
            raise errors.error_for(Code.INVALID_TXN_STATE,
                                   f"TransactionalId {self.transactional_id}: Invalid transition attempted from state "
                                   f"{self.state.value} ({action})")

    def check_send(self) -> None:
        """send() is allowed only inside a transaction (and not after a failed send)."""
        if self.state is S.ABORTABLE_ERROR and self.error is not None:
            raise TransactionAbortableError(f"cannot send: the transaction must be aborted after an earlier failure: "
                                            f"{self.error}") from self.error
        self._require(S.IN_TRANSACTION, action="send outside a transaction: call begin_transaction() first")

    def on_send_failed(self, exc: BaseException) -> None:
        """A batch of the transaction failed for good: the transaction can only be aborted (or is fenced)."""
        code = getattr(exc, "code", None)
        if code in FATAL_CODES:
            self._fatal(errors.error_for(Code.PRODUCER_FENCED, f"producer fenced while sending: {exc}"))
        elif self.state in (S.IN_TRANSACTION, S.COMMITTING):
            self.state, self.error = S.ABORTABLE_ERROR, exc

    def _fatal(self, exc: errors.GregorError) -> None:
        self.state, self.error = S.FATAL_ERROR, exc

    # ------------------------------------------------------------ the sender's gate
    def ready_to_send(self, tp: TopicPartition) -> bool:
        """True once tp is part of the transaction; otherwise start adding it and keep its batches queued."""
        if tp in self.added:
            return True
        self.pending.add(tp)
        if self._adding is None or self._adding.done():
            self._adding = asyncio.ensure_future(self._add_pending())
        return False

    async def _add_pending(self) -> None:
        while self.pending:
            batch = set(self.pending)
            req = pb.AddPartitionsToTxnRequest(producer=self._producer(), partitions=[
                common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(batch)])
            try:
                await self._call("AddPartitionsToTxn", req)
            except errors.GregorError as exc:
                self.pending -= batch
                self._fail_queued(batch, exc)
                return
            self.added |= batch
            self.pending -= batch
            self.producer.wakeup()

    def _fail_queued(self, tps: set[TopicPartition], exc: errors.GregorError) -> None:
        if exc.code in FATAL_CODES:
            self._fatal(exc)
        elif self.state in (S.IN_TRANSACTION, S.COMMITTING):
            self.state, self.error = S.ABORTABLE_ERROR, exc
        self.producer.fail_queued(tps, exc)

    # ------------------------------------------------------------ coordinator calls
    def _producer(self) -> pb.TxnProducer:
        txn = self.producer.sequences()
        return pb.TxnProducer(transactional_id=self.transactional_id, producer_id=txn.producer_id,
                              producer_epoch=txn.producer_epoch)

    async def _find_coordinator(self) -> str:
        md = self.producer.metadata
        from gregor.rpc.v1 import broker_pb2_grpc

        resp = await broker_pb2_grpc.BrokerServiceStub(md.channel(md.any_address())).FindCoordinator(
            coordinator_pb2.FindCoordinatorRequest(group_id=self.transactional_id, key_type=KEY_TYPE_TRANSACTION),
            timeout=self.request_timeout_s)
        return f"{resp.host}:{resp.port}"

    async def _call(self, method: str, request: Any) -> Any:
        """One coordinator RPC, retried on retriable answers within max.block.ms; fatal answers stick."""
        deadline = time.monotonic() + self.max_block_s
        while True:
            try:
                if self._coordinator is None:
                    self._coordinator = await self._find_coordinator()
                stub = transaction_pb2_grpc.TransactionCoordinatorServiceStub(
                    self.producer.metadata.channel(self._coordinator))
                rpc: Callable[..., Awaitable[Any]] = getattr(stub, method)
                coordinator = self._coordinator
                await self.throttles.wait(coordinator)  # KIP-219: a throttled coordinator gets nothing before its time
                resp = await rpc(request, timeout=self.request_timeout_s)
                self.throttles.record(coordinator, resp.throttle_time_ms)
                return resp
            except (grpc.RpcError, asyncio.TimeoutError, errors.GregorError) as exc:
                err = call_error(exc)
                if err.code in FATAL_CODES:
                    self._fatal(err)
                    raise err from None
                if not err.retriable or time.monotonic() > deadline:
                    raise err from None
                if err.code in (Code.NOT_COORDINATOR, Code.COORDINATOR_NOT_AVAILABLE, Code.NETWORK_EXCEPTION):
                    self._coordinator = None
                await asyncio.sleep(self.backoff_s)

    # ------------------------------------------------------------ the API (Producer delegates here)
    async def init_transactions(self) -> None:
        self._require(S.UNINITIALIZED, S.READY, action="init_transactions")
        resp = await self._call("InitProducerId", pb.TxnInitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms))
        self.producer.sequences().reset_producer(resp.producer_id, resp.producer_epoch)
        self.state = S.READY

    def begin_transaction(self) -> None:
        self._require(S.READY, action="begin_transaction")
        self.added, self.pending, self.offsets_added, self.error = set(), set(), False, None
        self.state = S.IN_TRANSACTION

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group_metadata: Any) -> None:
        self._require(S.IN_TRANSACTION, action="send_offsets_to_transaction")
        group_id = group_metadata if isinstance(group_metadata, str) else getattr(group_metadata, "group_id", "")
        generation = -1 if isinstance(group_metadata, str) else int(getattr(group_metadata, "generation_id", -1))
        member = "" if isinstance(group_metadata, str) else str(getattr(group_metadata, "member_id", ""))
        instance = "" if isinstance(group_metadata, str) else str(getattr(group_metadata, "group_instance_id", None)
                                                                  or "")
        try:
            await self._call("AddOffsetsToTxn", pb.AddOffsetsToTxnRequest(producer=self._producer(),
                                                                          group_id=group_id))
            self.offsets_added = True
            await self._call("TxnOffsetCommit", pb.TxnOffsetCommitRequest(
                producer=self._producer(), group_id=group_id, generation_id=generation, member_id=member,
                group_instance_id=instance,
                offsets=[pb.TxnOffset(topic=t, partition=p, offset=o) for (t, p), o in sorted(offsets.items())]))
        except errors.GregorError as exc:
            # KIP-447: ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID say the consumer is no longer
            # the group's member (Kafka's CommitFailedException / FencedInstanceIdException): abortable, as any
            # other failure here; the transaction can only be aborted.
            if self.state is S.IN_TRANSACTION:
                self.state, self.error = S.ABORTABLE_ERROR, exc
            raise

    async def _settle(self) -> None:
        """Flush what is buffered, including partitions still being added."""
        await self.producer.flush()
        while self._adding is not None and not self._adding.done():
            await asyncio.shield(self._adding)
            await self.producer.flush()

    async def commit_transaction(self) -> None:
        if self.state is S.COMMITTING:  # Kafka: a commit that timed out (EndTxn unanswered) is retried as is
            await self._end(True)
            return
        if self.state is S.ABORTING:
            raise errors.error_for(Code.INVALID_TXN_STATE, f"TransactionalId {self.transactional_id}: the previous "
                                   f"abort_transaction() did not complete and must be retried")
        if self.state is S.ABORTABLE_ERROR and self.error is not None:
            raise TransactionAbortableError(f"cannot commit: an earlier operation of the transaction failed: "
                                            f"{self.error}") from self.error
        self._require(S.IN_TRANSACTION, action="commit_transaction without begin_transaction")
        self.state = S.COMMITTING
        await self._settle()
        if self.state is not S.COMMITTING:  # a send failed while flushing
            self._raise_if_failed()
            assert self.error is not None
            raise TransactionAbortableError(f"cannot commit: a send of the transaction failed: {self.error}"
                                            ) from self.error
        await self._end(True)

    async def abort_transaction(self) -> None:
        if self.state is S.ABORTING:  # a retried abort whose EndTxn did not answer
            await self._end(False)
            return
        if self.state is S.COMMITTING:
            raise errors.error_for(Code.INVALID_TXN_STATE, f"TransactionalId {self.transactional_id}: the previous "
                                   f"commit_transaction() did not complete and must be retried")
        self._require(S.IN_TRANSACTION, S.ABORTABLE_ERROR, action="abort_transaction")
        failed = self.state is S.ABORTABLE_ERROR
        self.state = S.ABORTING
        await self._settle()
        self._raise_if_failed()
        await self._end(False)
        if failed:
            # Kafka (KIP-360): after an abortable error the epoch is bumped, so partitions whose sequences a failed
            # batch left unknown start again from 0.
            self.state = S.READY
            await self.init_transactions()

    async def _end(self, commit: bool) -> None:
        if self.added or self.offsets_added:
            await self._call("EndTxn", pb.EndTxnRequest(producer=self._producer(), committed=commit))
        self.state = S.READY
        self.added, self.pending, self.offsets_added = set(), set(), False
