"""`gregor transactions`: list, describe, find-hanging and abort, like kafka-transactions.sh (KIP-664).

    gregor transactions list
    gregor transactions describe --transactional-id orders-0
    gregor transactions find-hanging --broker-id 0 [--max-transaction-timeout 15]
    gregor transactions abort --topic orders --partition 0 --start-offset 42
    gregor transactions abort --topic orders --partition 0 --producer-id 7 --producer-epoch 1 --coordinator-epoch 3

Columns and flags are kafka-transactions.sh's. `abort` writes an ABORT marker
straight to the partition leader (WriteTxnMarkers), as Kafka's
Admin.abortTransaction does for a hanging transaction its coordinator forgot.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import click
import grpc

from gregor.cli.common import emit_json, obj, print_table, run
from gregor.client.config import client_id_for
from gregor.client.metadata import ClusterMetadata, call_error
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2, coordinator_pb2
from gregor.rpc.v1 import transaction_pb2 as pb, transaction_pb2_grpc

KEY_TYPE_TRANSACTION = 1
DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN = 15  # kafka-transactions.sh find-hanging --max-transaction-timeout (minutes)


def _metadata(ctx: click.Context) -> ClusterMetadata:
    # An admin client's calls, named as Kafka's kafka-transactions.sh names them (adminclient-N).
    return ClusterMetadata([a.strip() for a in obj(ctx).bootstrap().split(",") if a.strip()],
                           client_id=client_id_for({}, "adminclient"))


async def _call(coro: Any) -> Any:
    try:
        return await coro
    except (grpc.RpcError, TimeoutError) as exc:
        raise call_error(exc) from None


async def _coordinator(md: ClusterMetadata, tid: str) -> transaction_pb2_grpc.TransactionCoordinatorServiceStub:
    found = await _call(broker_pb2_grpc.BrokerServiceStub(md.channel(md.any_address())).FindCoordinator(
        coordinator_pb2.FindCoordinatorRequest(group_id=tid, key_type=KEY_TYPE_TRANSACTION), timeout=10))
    return transaction_pb2_grpc.TransactionCoordinatorServiceStub(md.channel(f"{found.host}:{found.port}"))


@click.group()
def transactions() -> None:
    """Transactions: list, describe, find-hanging, abort (kafka-transactions.sh)."""


@transactions.command("list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """Every transactional id the coordinators know: TransactionalId Coordinator ProducerId TransactionState."""
    async def go() -> list[pb.TransactionDescription]:
        md = _metadata(ctx)
        try:
            stub = await _coordinator(md, "-")  # any live coordinator fans the listing out to the others
            return list((await _call(stub.ListTransactions(pb.ListTransactionsRequest(), timeout=15))).transactions)
        finally:
            await md.close()

    rows = run(go())
    if obj(ctx).json:
        emit_json([{"transactional_id": d.transactional_id, "coordinator": d.coordinator_id,
                    "producer_id": d.producer_id, "state": d.state} for d in rows])
        return
    print_table([[d.transactional_id, d.coordinator_id, d.producer_id, d.state] for d in rows],
           ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"])


@transactions.command("describe")
@click.option("--transactional-id", required=True, help="the transactional.id to describe")
@click.pass_context
def describe(ctx: click.Context, transactional_id: str) -> None:
    """One transactional id's coordinator, producer, state, timeout, start time and partitions."""
    async def go() -> pb.TransactionDescription:
        md = _metadata(ctx)
        try:
            stub = await _coordinator(md, transactional_id)
            resp = await _call(stub.DescribeTransactions(
                pb.DescribeTransactionsRequest(transactional_ids=[transactional_id]), timeout=15))
        finally:
            await md.close()
        d = resp.transactions[0]
        if d.error.code:
            raise errors.from_detail(d.error)
        return d

    d = run(go())
    now = int(time.time() * 1000)
    start = d.transaction_start_time_ms
    duration = now - start if start >= 0 else None
    parts = ",".join(f"{tp.topic}-{tp.partition}" for tp in d.topic_partitions)
    if obj(ctx).json:
        emit_json({"coordinator_id": d.coordinator_id, "transactional_id": d.transactional_id,
                   "producer_id": d.producer_id, "producer_epoch": d.producer_epoch, "state": d.state,
                   "transaction_timeout_ms": d.transaction_timeout_ms, "current_transaction_start_time_ms": start,
                   "transaction_duration_ms": duration, "topic_partitions": parts})
        return
    print_table([[d.coordinator_id, d.transactional_id, d.producer_id, d.producer_epoch, d.state,
             d.transaction_timeout_ms, start if start >= 0 else None, duration, parts or None]],
           ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
            "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"])


async def _producers(md: ClusterMetadata, topic: str, partition: int) -> list[broker_pb2.ProducerStateDescription]:
    await md.wait_for_topic(topic, 10000)
    leader = md.leader_for(topic, partition)
    resp = await _call(md.broker_stub(leader).DescribeProducers(
        broker_pb2.DescribeProducersRequest(topic=topic, partition=partition), timeout=10))
    return list(resp.producers)


@transactions.command("find-hanging")
@click.option("--broker-id", type=int, help="check every partition this broker leads")
@click.option("--topic", help="check this topic's partitions")
@click.option("--partition", type=int, help="only this partition of --topic")
@click.option("--max-transaction-timeout", type=int, default=DEFAULT_MAX_TRANSACTION_TIMEOUT_MIN, show_default=True,
              help="minutes: transactions open longer than this are hanging (transaction.max.timeout.ms)")
@click.pass_context
def find_hanging(ctx: click.Context, broker_id: Optional[int], topic: Optional[str], partition: Optional[int],
                 max_transaction_timeout: int) -> None:
    """Open transactions older than --max-transaction-timeout on the chosen partitions."""
    if (broker_id is None) == (topic is None):
        raise click.UsageError("give exactly one of --broker-id or --topic")
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")

    async def go() -> list[list[Any]]:
        md = _metadata(ctx)
        try:
            await md.refresh()
            if topic is not None:
                infos = await md.wait_for_topic(topic, 10000)
                tps = [(topic, p.partition) for p in infos if partition is None or p.partition == partition]
            else:
                tps = [(t, p.partition) for t in sorted(md.topics) for p in md.partitions_for(t)
                       if p.leader == broker_id]
            now, limit = int(time.time() * 1000), max_transaction_timeout * 60000
            rows = []
            for t, p in tps:
                for s in await _producers(md, t, p):
                    if s.current_txn_start_offset >= 0 and now - s.last_timestamp > limit:
                        rows.append([t, p, s.producer_id, s.producer_epoch, s.coordinator_epoch,
                                     s.current_txn_start_offset, s.last_timestamp, (now - s.last_timestamp) // 60000])
            return rows
        finally:
            await md.close()

    rows = run(go())
    header = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
              "LastTimestamp", "Duration(min)"]
    if obj(ctx).json:
        emit_json([dict(zip(header, r)) for r in rows])
    else:
        print_table(rows, header)


@transactions.command("abort")
@click.option("--topic", required=True)
@click.option("--partition", type=int, required=True)
@click.option("--start-offset", type=int, help="the open transaction's first offset (the producer is looked up)")
@click.option("--producer-id", type=int)
@click.option("--producer-epoch", type=int)
@click.option("--coordinator-epoch", type=int)
@click.pass_context
def abort(ctx: click.Context, topic: str, partition: int, start_offset: Optional[int], producer_id: Optional[int],
          producer_epoch: Optional[int], coordinator_epoch: Optional[int]) -> None:
    """Write an ABORT marker for a hanging transaction on one partition."""
    by_producer = (producer_id, producer_epoch, coordinator_epoch)
    if (start_offset is None) == any(v is None for v in by_producer) or (
            start_offset is None and not all(v is not None for v in by_producer)):
        raise click.UsageError("give --start-offset, or all of --producer-id, --producer-epoch, --coordinator-epoch")

    async def go() -> int:
        md = _metadata(ctx)
        try:
            pid, epoch, cepoch = by_producer
            if start_offset is not None:
                match = [s for s in await _producers(md, topic, partition)
                         if s.current_txn_start_offset == start_offset]
                if not match:
                    raise errors.error_for(errors.Code.INVALID_REQUEST,
                                           f"no open transaction starts at offset {start_offset} of "
                                           f"{topic}-{partition}", topic=topic, partition=partition)
                pid, epoch, cepoch = match[0].producer_id, match[0].producer_epoch, match[0].coordinator_epoch
            await md.wait_for_topic(topic, 10000)
            resp = await _call(md.broker_stub(md.leader_for(topic, partition)).WriteTxnMarkers(
                broker_pb2.WriteTxnMarkersRequest(timeout_ms=10000, markers=[broker_pb2.WriteTxnMarker(
                    producer_id=pid, producer_epoch=epoch, committed=False, coordinator_epoch=max(cepoch or 0, 0),
                    partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)])]), timeout=15))
        finally:
            await md.close()
        r = resp.results[0]
        if r.error.code:
            raise errors.from_detail(r.error)
        return int(r.offset)

    offset = run(go())
    click.echo(f"Wrote an ABORT marker at offset {offset} of {topic}-{partition}.")
