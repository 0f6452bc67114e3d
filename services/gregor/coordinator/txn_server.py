"""gRPC servicer of the transaction coordinator: proto <-> domain, nothing else."""

from __future__ import annotations

from typing import TypeAlias

import grpc

from gregor.common import errors
from gregor.common.rpc import channel, rpc_method
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
        coordinator_id=owner, partition=c.partition_of(md.transactional_id))


class TransactionCoordinatorServicer(transaction_pb2_grpc.TransactionCoordinatorServiceServicer):
    """TransactionCoordinatorService over one TransactionCoordinator."""

    def __init__(self, coordinator: TransactionCoordinator) -> None:
        self.c = coordinator

    @rpc_method("TransactionCoordinatorService")
    async def InitProducerId(self, request: pb.TxnInitProducerIdRequest, context: Ctx) -> pb.TxnInitProducerIdResponse:
        pid, epoch = await self.c.init_producer_id(request.transactional_id, request.transaction_timeout_ms)
        return pb.TxnInitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    @rpc_method("TransactionCoordinatorService")
    async def AddPartitionsToTxn(self, request: pb.AddPartitionsToTxnRequest,
                                 context: Ctx) -> pb.AddPartitionsToTxnResponse:
        p = request.producer
        if not request.partitions:
            raise errors.error_for(errors.Code.INVALID_REQUEST, "AddPartitionsToTxn names no partition")
        await self.c.add_partitions(p.transactional_id, p.producer_id, p.producer_epoch,
                                    {(tp.topic, tp.partition) for tp in request.partitions})
        return pb.AddPartitionsToTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def AddOffsetsToTxn(self, request: pb.AddOffsetsToTxnRequest, context: Ctx) -> pb.AddOffsetsToTxnResponse:
        p = request.producer
        await self.c.add_offsets(p.transactional_id, p.producer_id, p.producer_epoch, request.group_id)
        return pb.AddOffsetsToTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def TxnOffsetCommit(self, request: pb.TxnOffsetCommitRequest, context: Ctx) -> pb.TxnOffsetCommitResponse:
        p = request.producer
        if any(o.offset < 0 for o in request.offsets):
            raise errors.error_for(errors.Code.INVALID_REQUEST, "a committed offset must not be negative")
        await self.c.txn_offset_commit(p.transactional_id, p.producer_id, p.producer_epoch, request.group_id,
                                       {(o.topic, o.partition): (o.offset, o.metadata) for o in request.offsets},
                                       request.generation_id, request.member_id, request.group_instance_id)
        return pb.TxnOffsetCommitResponse()

    @rpc_method("TransactionCoordinatorService")
    async def EndTxn(self, request: pb.EndTxnRequest, context: Ctx) -> pb.EndTxnResponse:
        p = request.producer
        await self.c.end_txn(p.transactional_id, p.producer_id, p.producer_epoch, request.committed)
        return pb.EndTxnResponse()

    @rpc_method("TransactionCoordinatorService")
    async def DescribeTransactions(self, request: pb.DescribeTransactionsRequest,
                                   context: Ctx) -> pb.DescribeTransactionsResponse:
        out = []
        for tid in request.transactional_ids:
            try:
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
                            request, timeout=10, metadata=((LIST_SCOPE_HEADER, "local"),))
                    except grpc.RpcError as exc:
                        err = errors.from_rpc_error(exc)
                        raise errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE,
                                               f"coordinator {cid} did not list its transactions: {err.message}")
                out.extend(resp.transactions)
        out.sort(key=lambda d: d.transactional_id)
        return pb.ListTransactionsResponse(transactions=out)
