"""Kafka's transaction APIs (KIP-98, issue 22's second stage) relayed to Gregor's transaction coordinator.

The broker that was asked is every transactional id's Kafka-side coordinator (FindCoordinator key
type 1 answers with it, as for groups): it relays InitProducerId (with a transactional id),
AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit and DescribeTransactions over gRPC
to the coordinator process owning the id's `__transaction_state` partition (the same etcd view
`gregor`'s own producer uses, `broker/coordinator_lookup.py`), and ListTransactions to any of
them (one call lists every instance's ids). The coordinator's NOT_COORDINATOR /
COORDINATOR_LOAD_IN_PROGRESS / CONCURRENT_TRANSACTIONS reach the client as they are: Kafka's
clients retry them (after asking FindCoordinator again for the first).

Error codes as each request version knows them: PRODUCER_FENCED (90, KIP-588) is sent as
INVALID_PRODUCER_EPOCH (47) to the versions before it existed, which is what Kafka's brokers do.
DescribeProducers is answered from this broker's own partitions' producer state.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import grpc

from gregor.broker.coordinator_lookup import KEY_TYPE_TRANSACTION
from gregor.broker.txn_markers import describe_producers
from gregor.common import authz as az, errors
from gregor.common.coordinator_ownership import partition_for
from gregor.common.quotas import RELAYED_METADATA
from gregor.kafka import codec
from gregor.rpc.v1 import common_pb2, transaction_pb2 as tpb, transaction_pb2_grpc

if TYPE_CHECKING:
    from gregor.kafka.handlers import KafkaHandlers

Code = errors.Code
NONE = 0
INVALID_PRODUCER_EPOCH = 47
PRODUCER_FENCED = 90
OPERATION_NOT_ATTEMPTED = 55
UNSTABLE_OFFSET_COMMIT = 88
# The first version of each API that knows PRODUCER_FENCED (KIP-588); older ones get INVALID_PRODUCER_EPOCH.
FENCED_SINCE = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}
# Kafka's TransactionState names (ListTransactions' state_filters).
TXN_STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
                        "PrepareEpochFence", "Dead"})
OPEN_STATES = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})

TXN_SUPPORTED: dict[int, tuple[int, int]] = {
    24: (0, 3),   # AddPartitionsToTxn (v4+ is KIP-890's broker-to-coordinator batch: not served)
    25: (0, 3),   # AddOffsetsToTxn
    26: (0, 4),   # EndTxn (v5 is KIP-890 part 2)
    28: (0, 3),   # TxnOffsetCommit
    61: (0, 0),   # DescribeProducers
    65: (0, 0),   # DescribeTransactions
    66: (0, 1),   # ListTransactions
}
TXN_API_NAMES = {24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit",
                 61: "DescribeProducers", 65: "DescribeTransactions", 66: "ListTransactions"}


def _code(exc: BaseException) -> int:
    if isinstance(exc, errors.GregorError):
        return int(exc.code)
    if isinstance(exc, grpc.RpcError):
        return int(errors.from_rpc_error(exc).code)
    return int(Code.UNKNOWN_SERVER_ERROR)


def versioned(code: int, header: codec.RequestHeader) -> int:
    """PRODUCER_FENCED as the request's version knows it."""
    if code == PRODUCER_FENCED and header.api_version < FENCED_SINCE.get(header.api_key, 0):
        return INVALID_PRODUCER_EPOCH
    return code


class TxnApis:
    """The transaction APIs of one Kafka listener (KafkaHandlers registers them in its table)."""

    def __init__(self, handlers: "KafkaHandlers") -> None:
        self.h = handlers

    def table(self) -> dict[int, Any]:
        return {24: self.add_partitions_to_txn, 25: self.add_offsets_to_txn, 26: self.end_txn,
                28: self.txn_offset_commit, 61: self.describe_producers, 65: self.describe_transactions,
                66: self.list_transactions}

    # ---- relay ---------------------------------------------------------------------------------

    def _stub(self, addr: str) -> transaction_pb2_grpc.TransactionCoordinatorServiceStub:
        return transaction_pb2_grpc.TransactionCoordinatorServiceStub(self.h.channel_to(addr))

    async def _owner(self, transactional_id: str) -> str:
        lookup = self.h.broker.coordinator_lookup
        if lookup is None:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, "no transaction coordinators (standalone broker)")
        _, host, port, _ = await lookup.find(transactional_id, KEY_TYPE_TRANSACTION)
        return f"{host}:{port}"

    def _caller(self) -> tuple[tuple[str, str], ...]:
        """The Kafka client's principal for the coordinator's ACL checks (with the authorizer on), and the mark
        of a relayed call: the listener metered the request already (its request quota)."""
        return (*(az.forwarded_metadata(self.h.broker.authz, az.connection_caller()) or ()), RELAYED_METADATA)

    async def call(self, transactional_id: str, method: str, request: Any, timeout_s: float = 30.0) -> Any:
        """One TransactionCoordinatorService call to the owner of transactional_id; a GregorError on failure."""
        stub = self._stub(await self._owner(transactional_id))
        try:
            return await getattr(stub, method)(request, timeout=timeout_s, metadata=self._caller())
        except grpc.RpcError as exc:
            raise errors.from_rpc_error(exc) from None

    async def find_coordinator_code(self, key: str) -> tuple[int, str | None]:
        """FindCoordinator(TRANSACTION): this broker answers, if a coordinator could serve the id at all."""
        if not key:
            return int(Code.INVALID_REQUEST), "transactional id must not be empty"
        try:
            await self._owner(key)
        except errors.GregorError as err:
            return int(err.code), err.message
        return NONE, None

    # ---- InitProducerId with a transactional id --------------------------------------------------

    async def init_producer_id(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        tid = str(req.transactional_id)
        timeout_ms = codec.to_ms(req.transaction_timeout)
        pid, epoch = int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1))

        def answer(code: int, producer_id: int = -1, producer_epoch: int = -1) -> Any:
            return codec.build(mod.InitProducerIdResponse, error_code=versioned(code, header),
                               producer_id=producer_id, producer_epoch=producer_epoch)

        try:
            if pid >= 0:
                # KIP-360 (v3+): a producer bumping its own epoch must still be the id's current one; a
                # fenced instance must not fence its successor in turn.
                resp = await self.call(tid, "DescribeTransactions",
                                       tpb.DescribeTransactionsRequest(transactional_ids=[tid]))
                d = resp.transactions[0]
                if d.HasField("error") and d.error.code:
                    raise errors.error_for(d.error.code, d.error.message)
                if (d.producer_id, d.producer_epoch) != (pid, epoch):
                    return answer(PRODUCER_FENCED)
            got = await self.call(tid, "InitProducerId", tpb.TxnInitProducerIdRequest(
                transactional_id=tid, transaction_timeout_ms=timeout_ms))
        except errors.GregorError as err:
            return answer(int(err.code))
        return answer(NONE, got.producer_id, got.producer_epoch)

    # ---- the transaction -------------------------------------------------------------------------

    def _producer(self, tid: Any, pid: Any, epoch: Any) -> tpb.TxnProducer:
        return tpb.TxnProducer(transactional_id=str(tid), producer_id=int(pid), producer_epoch=int(epoch))

    async def add_partitions_to_txn(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """All of the request's partitions or none: unknown partitions get UNKNOWN_TOPIC_OR_PARTITION and the
        others OPERATION_NOT_ATTEMPTED (as Kafka answers); a coordinator error goes to every partition."""
        asked = [(str(t.name), int(p)) for t in req.v3_and_below_topics for p in t.partitions]
        known = self._known_partitions({t for t, _ in asked})
        missing = {tp for tp in asked if tp not in known}
        codes: dict[tuple[str, int], int] = {}
        if missing:
            codes = {tp: int(Code.UNKNOWN_TOPIC_OR_PARTITION) if tp in missing else OPERATION_NOT_ATTEMPTED
                     for tp in asked}
        else:
            try:
                await self.call(str(req.v3_and_below_transactional_id), "AddPartitionsToTxn",
                                tpb.AddPartitionsToTxnRequest(
                                    producer=self._producer(req.v3_and_below_transactional_id,
                                                            req.v3_and_below_producer_id,
                                                            req.v3_and_below_producer_epoch),
                                    partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in asked]))
            except errors.GregorError as err:
                codes = {tp: versioned(int(err.code), header) for tp in asked}
        by_topic: dict[str, list[Any]] = {}
        for t, p in asked:
            by_topic.setdefault(t, []).append(codec.build(mod.AddPartitionsToTxnPartitionResult, partition_index=p,
                                                          partition_error_code=codes.get((t, p), NONE)))
        return codec.build(mod.AddPartitionsToTxnResponse, results_by_topic_v3_and_below=[
            codec.build(mod.AddPartitionsToTxnTopicResult, name=t, results_by_partition=ps)
            for t, ps in by_topic.items()])

    def _known_partitions(self, topics: set[str]) -> set[tuple[str, int]]:
        md = self.h.broker.metadata_response(sorted(topics))
        return {(t.name, pm.partition) for t in md.topics if not t.error for pm in t.partitions}

    async def add_offsets_to_txn(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        try:
            await self.call(str(req.transactional_id), "AddOffsetsToTxn", tpb.AddOffsetsToTxnRequest(
                producer=self._producer(req.transactional_id, req.producer_id, req.producer_epoch),
                group_id=str(req.group_id)))
        except errors.GregorError as err:
            return codec.build(mod.AddOffsetsToTxnResponse, error_code=versioned(int(err.code), header))
        return codec.build(mod.AddOffsetsToTxnResponse, error_code=NONE)

    async def end_txn(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        try:
            await self.call(str(req.transactional_id), "EndTxn", tpb.EndTxnRequest(
                producer=self._producer(req.transactional_id, req.producer_id, req.producer_epoch),
                committed=bool(req.committed)))
        except errors.GregorError as err:
            return codec.build(mod.EndTxnResponse, error_code=versioned(int(err.code), header))
        return codec.build(mod.EndTxnResponse, error_code=NONE)

    async def txn_offset_commit(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """Sent by Kafka's clients to the group's coordinator (this broker): relayed to the transactional id's
        coordinator, which keeps the offsets with the transaction until it commits. The group's generation,
        member id and group.instance.id (v3, KIP-447) go along, so the coordinator fences a zombie member; committed_leader_epoch has no place in the gRPC request."""
        grpc_req = tpb.TxnOffsetCommitRequest(
            producer=self._producer(req.transactional_id, req.producer_id, req.producer_epoch),
            group_id=str(req.group_id), generation_id=int(getattr(req, "generation_id", -1)),
            member_id=str(getattr(req, "member_id", "") or ""),
            group_instance_id=str(getattr(req, "group_instance_id", None) or ""),
            offsets=[tpb.TxnOffset(topic=str(t.name), partition=int(p.partition_index),
                                   offset=int(p.committed_offset), metadata=p.committed_metadata or "")
                     for t in req.topics for p in t.partitions])
        code = NONE
        try:
            await self.call(str(req.transactional_id), "TxnOffsetCommit", grpc_req)
        except errors.GregorError as err:
            code = versioned(int(err.code), header)
        return codec.build(mod.TxnOffsetCommitResponse, topics=[
            codec.build(mod.TxnOffsetCommitResponseTopic, name=t.name, partitions=[
                codec.build(mod.TxnOffsetCommitResponsePartition, partition_index=p.partition_index, error_code=code)
                for p in t.partitions]) for t in req.topics])

    # ---- admin -----------------------------------------------------------------------------------

    async def describe_transactions(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        async def one(tid: str) -> Any:
            try:
                resp = await self.call(tid, "DescribeTransactions",
                                       tpb.DescribeTransactionsRequest(transactional_ids=[tid]))
                d = resp.transactions[0]
            except (errors.GregorError, IndexError) as err:
                return codec.build(mod.TransactionState, error_code=_code(err), transactional_id=tid,
                                   transaction_state="", transaction_timeout=0, transaction_start_time=-1,
                                   producer_id=-1, producer_epoch=-1, topics=[])
            if d.HasField("error") and d.error.code:
                return codec.build(mod.TransactionState, error_code=int(d.error.code), transactional_id=tid,
                                   transaction_state="", transaction_timeout=0, transaction_start_time=-1,
                                   producer_id=-1, producer_epoch=-1, topics=[])
            by_topic: dict[str, list[int]] = {}
            for tp in d.topic_partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            return codec.build(mod.TransactionState, error_code=NONE, transactional_id=tid,
                               transaction_state=d.state, transaction_timeout=d.transaction_timeout_ms,
                               transaction_start_time=d.transaction_start_time_ms, producer_id=d.producer_id,
                               producer_epoch=d.producer_epoch,
                               topics=[codec.build(mod.TopicData, topic=t, partitions=ps) for t, ps in by_topic.items()])

        states = await asyncio.gather(*(one(str(t)) for t in req.transactional_ids))
        return codec.build(mod.DescribeTransactionsResponse, transaction_states=list(states))

    async def all_transactions(self) -> list[Any]:
        """Every coordinator instance's transactions (TransactionDescription protos)."""
        lookup = self.h.broker.coordinator_lookup
        if lookup is None or not lookup.live:
            raise errors.error_for(Code.COORDINATOR_NOT_AVAILABLE, "no transaction coordinator is live")
        last: errors.GregorError | None = None
        for info in list(lookup.live.values()):  # any instance lists them all; the next one if it fails
            try:
                resp = await self._stub(f"{info['host']}:{info['port']}").ListTransactions(
                    tpb.ListTransactionsRequest(), timeout=15, metadata=self._caller())
                return list(resp.transactions)
            except grpc.RpcError as exc:
                last = errors.from_rpc_error(exc)
        assert last is not None
        raise last

    async def mine(self, transactional_ids: list[str]) -> set[str]:
        """The ids this broker lists. Kafka's admin clients send ListTransactions to every broker and concatenate
        the answers (each Kafka broker lists the ids of the __transaction_state partitions it leads); here any
        broker reaches every id, so each lists a disjoint slice: the ids that hash (Kafka's partitionFor) onto
        its place among the brokers with a Kafka listener. The union over all brokers is every id, once."""
        me = self.h.broker.config.broker_id
        ids = sorted(await self.h.kafka_brokers())
        if me not in ids:
            return set(transactional_ids)
        return {t for t in transactional_ids if ids[partition_for(t, len(ids))] == me}

    async def list_transactions(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        wanted = [str(s) for s in req.state_filters]
        pids = {int(p) for p in req.producer_id_filters}
        min_age_ms = int(getattr(req, "duration_filter", -1))
        try:
            txns = await self.all_transactions()
        except errors.GregorError as err:
            return codec.build(mod.ListTransactionsResponse, error_code=int(err.code), unknown_state_filters=[],
                               transaction_states=[])
        now = int(time.time() * 1000)
        mine = await self.mine([d.transactional_id for d in txns])
        txns = [d for d in txns if d.transactional_id in mine]
        out = [codec.build(mod.TransactionState, transactional_id=d.transactional_id, producer_id=d.producer_id,
                           transaction_state=d.state)
               for d in txns
               if (not wanted or d.state in wanted) and (not pids or d.producer_id in pids)
               and (min_age_ms < 0 or (d.transaction_start_time_ms >= 0
                                       and now - d.transaction_start_time_ms >= min_age_ms))]
        return codec.build(mod.ListTransactionsResponse, error_code=NONE,
                           unknown_state_filters=[s for s in wanted if s not in TXN_STATES], transaction_states=out)

    async def describe_producers(self, header: codec.RequestHeader, req: Any, mod: Any) -> Any:
        """The active producers of this broker's leader partitions (NOT_LEADER_OR_FOLLOWER elsewhere)."""
        rm = self.h.broker.replica_manager
        topics = []
        for t in req.topics:
            parts = []
            for i in t.partition_indexes:
                try:
                    rows = describe_producers(rm.get_partition(str(t.name), int(i)))
                    parts.append(codec.build(mod.PartitionResponse, partition_index=i, error_code=NONE,
                                             error_message=None, active_producers=[
                                                 codec.build(mod.ProducerState, producer_id=pid, producer_epoch=ep,
                                                             last_sequence=seq, last_timestamp=ts,
                                                             coordinator_epoch=ce, current_txn_start_offset=start)
                                                 for pid, ep, seq, ts, ce, start in rows]))
                except errors.GregorError as err:
                    parts.append(codec.build(mod.PartitionResponse, partition_index=i, error_code=int(err.code),
                                             error_message=err.message, active_producers=[]))
            topics.append(codec.build(mod.TopicResponse, name=t.name, partitions=parts))
        return codec.build(mod.DescribeProducersResponse, topics=topics)

    # ---- OffsetFetch require_stable --------------------------------------------------------------

    async def unstable_offsets_of(self, group_ids: set[str]) -> set[tuple[str, tuple[str, int]]]:
        """(group, partition) for the groups' partitions with transactional offsets not yet committed or aborted
        (TxnOffsetCommit in a transaction still open): OffsetFetch with require_stable answers
        UNSTABLE_OFFSET_COMMIT for them. One ListTransactions round however many groups are asked (v8)."""
        return {(g.group_id, (tp.topic, tp.partition)) for d in await self.all_transactions()
                if d.state in OPEN_STATES for g in d.pending_offsets if g.group_id in group_ids
                for tp in g.partitions}
