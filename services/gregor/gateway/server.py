"""gRPC servicer of the producer gateway: proto <-> ProducerGateway, per-record results, deadlines."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import AsyncIterator, Optional

import grpc

from gregor.common import errors
from gregor.common.rpc import rpc_method, rpc_stream
from gregor.gateway.callers import GatewayCallers, record_and_wait
from gregor.gateway.gateway import METRICS, InRecord, ProducerGateway, Result
from gregor.gateway.txn_session import TxnSession
from gregor.rpc.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "ProducerGatewayService"
# Answer a unary Produce this long before its deadline, so the client gets per-record
# REQUEST_TIMED_OUT results instead of a bare DEADLINE_EXCEEDED.
DEADLINE_MARGIN_S = 0.05
# ProduceStream reads no further while this many records are unanswered (flow control back to
# a client that does not read its results); accepted records are bounded by buffer.memory anyway.
MAX_UNANSWERED = 10000


def in_record(topic: str, rec: common_pb2.Record, partition: Optional[int]) -> InRecord:
    headers = rec.headers
    return InRecord(topic,
                    rec.key if rec.HasField("key") else None,
                    rec.value if rec.HasField("value") else None,
                    [(h.key, h.value) for h in headers] if headers else (),
                    partition,
                    rec.timestamp_ms or None)


def result_proto(correlation_id: int, result: Result) -> gateway_pb2.GatewayRecordResult:
    partition, offset, timestamp, err = result
    return gateway_pb2.GatewayRecordResult(correlation_id=correlation_id, partition=partition, offset=offset,
                                           timestamp_ms=timestamp,
                                           error=err.to_detail() if err is not None else None)


def _reader_failed(reader: "asyncio.Future[None]") -> errors.GregorError:
    """The client's side of a stream failed (its reader task died): the stream ends with NETWORK_EXCEPTION."""
    return errors.error_for(errors.Code.NETWORK_EXCEPTION, f"reading the stream failed: {reader.exception()}")


class ProducerGatewayServicer(gateway_pb2_grpc.ProducerGatewayServiceServicer):
    """ProducerGatewayService: one result per record, in order for Produce, by correlation_id for ProduceStream."""

    def __init__(self, gateway: ProducerGateway, callers: Optional[GatewayCallers] = None) -> None:
        self.gateway = gateway
        # Per-caller authorization and produce quotas (callers.py); nothing checked without them.
        self.callers = callers if callers is not None else GatewayCallers()

    def _denied(self, err: errors.GregorError) -> Result:
        METRICS.error(err)
        return (-1, -1, -1, err)

    @rpc_method(SERVICE)
    async def Produce(self, request: gateway_pb2.GatewayProduceRequest,
                      context: grpc.aio.ServicerContext) -> gateway_pb2.GatewayProduceResponse:
        gw = self.gateway
        self.callers.require_topic(self.callers.caller(context), request.topic, "GatewayProduce")
        quota = await self.callers.unary_quota(context)
        partition = request.partition if request.HasField("partition") else None
        records = [in_record(request.topic, r, partition) for r in request.records]
        # Whole-request admission: if buffer.memory cannot take every record now, nothing is
        # buffered and the RPC fails RESOURCE_EXHAUSTED, so retrying it cannot duplicate anything.
        total = sum(gw.size_of(r) for r in records)
        throttle = gw.throttled(total)
        if throttle is not None:
            throttle.topic = request.topic
            raise throttle
        remaining = context.time_remaining()
        if remaining is not None and remaining <= DEADLINE_MARGIN_S:  # too late to be answered: buffer nothing
            raise errors.RequestTimedOutError(  # type: ignore[attr-defined]
                f"the call's deadline leaves {remaining * 1000:.0f} ms; nothing was produced", topic=request.topic)
        timeout = None if remaining is None else remaining - DEADLINE_MARGIN_S
        if quota is not None:
            quota.record_produce(total)  # over the caller's producer_byte_rate: its next call waits
        results = await gw.send_all(records, timeout, size_bytes=total)
        out = [result_proto(i, r) for i, r in enumerate(results)]
        return gateway_pb2.GatewayProduceResponse(results=out)

    @rpc_stream(SERVICE)
    async def ProduceStream(self, request_iterator: AsyncIterator[gateway_pb2.GatewayRecord],
                            context: grpc.aio.ServicerContext) -> AsyncIterator[gateway_pb2.GatewayRecordResult]:
        """Records in, results out as they complete; a bad record gets an error result, the stream goes on.

        A full buffer.memory answers each record it cannot take with THROTTLING_QUOTA_EXCEEDED
        (per-record results, not flow control), so a client learns at once and may retry
        those records later or on another gateway.
        """
        gw = self.gateway
        caller = self.callers.caller(context)
        quota = self.callers.stream_quota(context)
        queue: asyncio.Queue[Optional[gateway_pb2.GatewayRecordResult]] = asyncio.Queue()
        window = asyncio.Semaphore(MAX_UNANSWERED)
        outstanding = 0

        def on_done(correlation_id: int, result: Result) -> None:
            queue.put_nowait(result_proto(correlation_id, result))

        async def read() -> None:
            nonlocal outstanding
            try:
                async for msg in request_iterator:
                    await window.acquire()
                    outstanding += 1
                    denied = self.callers.topic_denial(caller, msg.topic, "GatewayProduceStream")
                    if denied is not None:
                        on_done(msg.correlation_id, self._denied(denied))
                        continue
                    partition = msg.partition if msg.HasField("partition") else None
                    await gw.send(in_record(msg.topic, msg.record, partition),
                                  functools.partial(on_done, msg.correlation_id))
                    await record_and_wait(quota, msg.ByteSize())
            finally:
                queue.put_nowait(None)  # no more records

        reader = asyncio.ensure_future(read())
        try:
            reading = True
            while reading or outstanding:
                item = await queue.get()
                if item is None:
                    reading = False
                    if reader.done() and not reader.cancelled() and reader.exception() is not None:
                        log.info("ProduceStream reader stopped: %s", reader.exception())
                        raise _reader_failed(reader)
                    continue
                outstanding -= 1
                window.release()
                yield item
        finally:
            reader.cancel()

    @rpc_stream(SERVICE)
    async def TransactionalProduceStream(self, request_iterator: AsyncIterator[gateway_pb2.GatewayTxnRequest],
                                         context: grpc.aio.ServicerContext
                                         ) -> AsyncIterator[gateway_pb2.GatewayRecordResult]:
        """init / begin / record / commit / abort in, one result each out (txn_session.py does the work)."""
        session = TxnSession(self.gateway.config)
        callers = self.callers
        caller = callers.caller(context)
        quota = callers.stream_quota(context)
        transactional_id = ""
        queue: asyncio.Queue[Optional[gateway_pb2.GatewayRecordResult]] = asyncio.Queue()

        def answer(correlation_id: int, result: Result) -> None:
            queue.put_nowait(result_proto(correlation_id, result))

        async def read() -> None:
            nonlocal transactional_id
            try:
                async for msg in request_iterator:
                    op = msg.WhichOneof("op")
                    cid = msg.record.correlation_id if op == "record" else getattr(msg, op).correlation_id
                    try:
                        if op == "record":
                            r = msg.record
                            callers.require_transactional_id(caller, transactional_id, "GatewayTxnProduce")
                            callers.require_topic(caller, r.topic, "GatewayTxnProduce")
                            await record_and_wait(quota, r.ByteSize())
                            await session.send(in_record(r.topic, r.record, r.partition if r.HasField("partition")
                                                         else None), functools.partial(answer, cid))
                        elif op == "init":
                            callers.require_transactional_id(caller, msg.init.transactional_id, "GatewayInitTxn")
                            transactional_id = msg.init.transactional_id
                            answer(cid, await session.init(msg.init.transactional_id,
                                                           msg.init.transaction_timeout_ms))
                        else:
                            answer(cid, await getattr(session, op)())
                    except errors.GregorError as err:
                        answer(cid, (-1, -1, -1, err))
                    except Exception as exc:  # a bug answers this call with a typed error; the stream goes on
                        log.exception("TransactionalProduceStream %s failed", op)
                        answer(cid, (-1, -1, -1, errors.error_for(errors.Code.UNKNOWN_SERVER_ERROR,
                                                                  f"{op} failed: {type(exc).__name__}: {exc}")))
                # The client half-closed: as Kafka's close(), complete or fail every send still pending, so
                # each one's answer goes out before the stream ends.
                await session.close()
            finally:
                queue.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await session.close()

    @rpc_stream(SERVICE)
    async def ProduceStreamBatch(self, request_iterator: AsyncIterator[gateway_pb2.GatewayRecordBatch],
                                 context: grpc.aio.ServicerContext,
                                 ) -> AsyncIterator[gateway_pb2.GatewayRecordResultBatch]:
        """ProduceStream with many records per message each way (seed 003: a client batches to amortise
        per-request cost; here the per-message cost of gRPC streaming in Python, ~70-170 µs).

        Results are coalesced: each response message carries every result that completed since
        the previous one was written (typically a whole produce batch's records, as its future's
        callbacks run together), so a slow reader gets fewer, larger messages. Per-record errors
        and the buffer.memory answer are the same as ProduceStream's; the gateway stops reading
        while MAX_UNANSWERED records are unanswered (a batch may take it past that once).
        """
        gw = self.gateway
        caller = self.callers.caller(context)
        quota = self.callers.stream_quota(context)
        done: list[gateway_pb2.GatewayRecordResult] = []
        wake = asyncio.Event()
        room = asyncio.Event()
        room.set()
        outstanding = 0
        reading = True

        def on_done(cids: list[int], results: list[tuple[int, Result]]) -> None:
            done.extend([result_proto(cids[i], r) for i, r in results])
            wake.set()

        async def read() -> None:
            nonlocal outstanding, reading
            try:
                async for batch in request_iterator:
                    while outstanding >= MAX_UNANSWERED:
                        room.clear()
                        await room.wait()
                    msgs = batch.records
                    if not msgs:
                        continue
                    outstanding += len(msgs)
                    if caller is not None:  # the authorizer: records of topics the caller may not Write fail
                        denied = {t: e for t in {m.topic for m in msgs}
                                  if (e := self.callers.topic_denial(caller, t, "GatewayProduceStreamBatch"))}
                        if denied:
                            on_done([m.correlation_id for m in msgs if m.topic in denied],
                                    [(i, self._denied(denied[m.topic]))
                                     for i, m in enumerate(m for m in msgs if m.topic in denied)])
                            msgs = [m for m in msgs if m.topic not in denied]
                            if not msgs:
                                continue
                    records = [in_record(m.topic, m.record, m.partition if m.HasField("partition") else None)
                               for m in msgs]
                    await gw.send_many(records, functools.partial(on_done, [m.correlation_id for m in msgs]),
                                      size_bytes=batch.ByteSize())
                    await record_and_wait(quota, batch.ByteSize())
            finally:
                reading = False
                wake.set()

        reader = asyncio.ensure_future(read())
        try:
            while reading or outstanding:
                await wake.wait()
                wake.clear()
                if done:
                    out = done[:]
                    done.clear()
                    outstanding -= len(out)
                    if outstanding < MAX_UNANSWERED:
                        room.set()
                    yield gateway_pb2.GatewayRecordResultBatch(results=out)
                if reader.done() and not reader.cancelled() and reader.exception() is not None:
                    log.info("ProduceStreamBatch reader stopped: %s", reader.exception())
                    raise _reader_failed(reader)
        finally:
            reader.cancel()
