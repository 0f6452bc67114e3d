"""gRPC servicer of the transaction coordinator: proto <-> domain, nothing else."""

from __future__ import annotations

from typing import TypeAlias

import grpc

from gregor.common import authz as az, errors
from gregor.common.acl import Operation, ResourceType
from gregor.common.quotas import RELAYED_METADATA
from gregor.common.rpc import RequestQuota, channel, rpc_method
from gregor.coordinator.server import LIST_SCOPE_HEADER
from gregor.coordinator.txn_coordinator import TransactionCoordinator
from gregor.coordinator.txn_metadata import TxnMetadata
from gregor.rpc.v1 import common_pb2, transaction_pb2 as pb, transaction_pb2_grpc

Ctx: TypeAlias = grpc.aio.ServicerContext


def description(c: TransactionCoordinator, md: TxnMetadata) -> pb.TransactionDescription:
    owner = c.claims.get(c.partition_of(md.transactional_id), -1)
    return pb.TransactionDescription(
        transactional_id=md.transactional_id, state=md.state.value, producer_id=md.producer_id,
        producer_epoch=md.producer_epoch, transaction_timeout_ms=md.timeout_ms,
        transaction_start_time_ms=md.txn_start_ms,
        topic_partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(md.partitions)],
        coordinator_id=owner, partition=c.partition_of(md.transactional_id), group_ids=sorted(md.groups),
        pending_offsets=[pb.PendingGroupOffsets(group_id=g, partitions=[
            common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(offsets)])
            for g, offsets in sorted(md.pending_offsets.items())])


class TransactionCoordinatorServicer(transaction_pb2_grpc.TransactionCoordinatorServiceServicer):
    """TransactionCoordinatorService over one TransactionCoordinator."""

    def __init__(self, coordinator: TransactionCoordinator, authz: az.Authz | None = None,
                 request_quota: RequestQuota | None = None) -> None:
        self.c = coordinator
        self.authz = authz or az.Authz()
        self.request_quota = request_quota  # request_percentage: rpc_method meters every call (quotas.py)

    def _require(self, context: Ctx, api: str, txn_id: str, groups: tuple[str, ...] = (),
                 topics: tuple[str, ...] = (), topic_op: Operation = Operation.WRITE) -> None:
        """Kafka's transaction checks: Write on the transactional id, Read on the group of offsets sent, and
        Write (AddPartitionsToTxn) or Read (TxnOffsetCommit) on each topic."""
        if not self.authz.enabled:
            return
        caller = self.authz.caller_of(context)
        self.authz.require(caller, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id, api)
        for g in groups:
            self.authz.require(caller, Operation.READ, ResourceType.GROUP, g, api)
        for t in dict.fromkeys(topics):
            self.authz.require(caller, topic_op, ResourceType.TOPIC, t, api, topic=t)

    @rpc_method("TransactionCoordinatorService")
    async def InitProducerId(self, request: pb.TxnInitProducerIdRequest, context: Ctx) -> pb.TxnInitProducerIdResponse:
        self._require(context, "InitProducerId", request.transactional_id)
        pid, epoch = await self.c.init_producer_id(request.transactional_id, request.transaction_timeout_ms)
        return pb.TxnInitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    @rpc_method("TransactionCoordinatorService")
    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest,
                                 context: Ctx) -> pb.AddPartitionsToTxnResponse:
        p = request.producer
        if not request.partitions:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "AddPartitionsToTxn names no partition")
        self._require(context, "AddPartitionsToTxn", p.transactional_id,
                      topics=tuple(tp.topic for tp in request.partitions))
        await self.c.add_partitions(p.transactional_id, p.producer_id, p.producer_epoch,
                                    {(tp.topic, tp.partition) for tp in request.partitions})
        return pb.AddPartitionsToTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest, context: Ctx) -> pb.AddOffsetsToTxnResponse:
        p = request.producer
        self._require(context, "AddOffsetsToTxn", p.transactional_id, groups=(request.group_id,))
        await self.c.add_offsets(p.transactional_id, p.producer_id, p.producer_epoch, request.group_id)
        return pb.AddOffsetsToTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest, context: Ctx) -> pb.TxnOffsetCommitResponse:
        p = request.producer
        if any(o.offset < 0 for o in request.offsets):
            raise errors.error_for(errors.Code.INVALID_REQUEST, "a committed offset must not be negative")
        self._require(context, "TxnOffsetCommit", p.transactional_id, groups=(request.group_id,),
                      topics=tuple(o.topic for o in request.offsets), topic_op=Operation.READ)
        await self.c.txn_offset_commit(p.transactional_id, p.producer_id, p.producer_epoch, request.group_id,
                                       {(o.topic, o.partition): (o.offset, o.metadata) for o in request.offsets},
                                       request.generation_id, request.member_id, request.group_instance_id)
        return pb.TxnOffsetCommitResponse()

    @rpc_method("TransactionCoordinatorService")
    async def EndTxn(self, request: pb.EndTxnRequest, context: Ctx) -> pb.EndTxnResponse:
        p = request.producer
        self._require(context, "EndTxn", p.transactional_id)
        await self.c.end_txn(p.transactional_id, p.producer_id, p.producer_epoch, request.committed)
        return pb.EndTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def DescribeTransactions(self, request: pb.DescribeTransactionsRequest,
                                   context: Ctx) -> pb.DescribeTransactionsResponse:
        out = []
        for tid in request.transactional_ids:
            try:
                if self.authz.enabled:
                    self.authz.require(self.authz.caller_of(context), Operation.DESCRIBE,
                                       ResourceType.TRANSACTIONAL_ID, tid, "DescribeTransactions")
                out.append(description(self.c, self.c.describe(tid)))
            except errors.GregorError as err:
                out.append(pb.TransactionDescription(transactional_id=tid, error=err.to_detail()))
        return pb.DescribeTransactionsResponse(transactions=out)

    @rpc_method("TransactionCoordinatorService")
    async def ListTransactions(self, request: pb.ListTransactionsRequest,
                               context: Ctx) -> pb.ListTransactionsResponse:
        """This instance's ids; without the local-scope header, every live instance's (one call lists all)."""
        mds = sorted((md for md in self.c.txns.values() if self.c.partition_of(md.transactional_id) in self.c.owned),
                     key=lambda md: md.transactional_id)
        out = [description(self.c, md) for md in mds]
        if dict(context.invocation_metadata() or ()).get(LIST_SCOPE_HEADER) != "local":
            for cid, info in sorted(self.c.gc.live.items()):
                if cid == self.c.gc.id:
                    continue
                async with channel(f"{info['host']}:{info['port']}") as ch:
                    try:
                        resp = await transaction_pb2_grpc.TransactionCoordinatorServiceStub(ch).ListTransactions(
                            request, timeout=10, metadata=((LIST_SCOPE_HEADER, "local"), RELAYED_METADATA))
                    except grpc.RpcError as exc:
                        err = errors.from_rpc_error(exc)
                        raise errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE,
                                               f"coordinator {cid} did not list its transactions: {err.message}")
                out.extend(resp.transactions)
        out.sort(key=lambda d: d.transactional_id)
        if self.authz.enabled:  # Kafka: the ids the caller may Describe
            caller = self.authz.caller_of(context)
            out = [d for d in out if self.authz.check(caller, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                                      d.transactional_id, "ListTransactions", audit=False)]
        return pb.ListTransactionsResponse(transactions=out)
