"""Multi-partition produce in and out of the domain: the unary ProducePartitions and the ProduceStream.

Both hand the partitions to ReplicaManager.start_produce_partitions, which appends
them synchronously; they differ in how answers go back. The stream is Kafka's
connection: requests append strictly in the order they arrived, because each is
appended before the next is read, and each is answered (with its correlation id)
as soon as its acks are in, so an acks=all request never holds up the appends
behind it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping

from gregor.broker.replica_manager import collect_produce, produce_pending
from gregor.common import errors
from gregor.common.authz import with_denials
from gregor.common.rpc import RequestRecorder
from gregor.rpc.v1 import broker_pb2

if TYPE_CHECKING:
    from gregor.broker.quota_manager import StreamQuota
    from gregor.broker.replica_manager import ProduceResult, ReplicaManager

log = logging.getLogger(__name__)

STREAM_API = "ProduceStream"  # the api label of the stream's per-request metrics


def produce_result_fields(r: "ProduceResult", acks: int) -> dict[str, Any]:
    """A partition's answer fields (ProduceResponse and ProducePartitionResult share them): with acks=0
    Kafka sends no response, and the producer gets offset -1."""
    if acks == 0:
        return {"base_offset": -1, "last_offset": -1, "log_append_time_ms": -1,
                "log_start_offset": r.log_start_offset}
    return {"base_offset": r.base_offset, "last_offset": r.last_offset, "log_append_time_ms": -1,
            "log_start_offset": r.log_start_offset, "duplicate": r.duplicate}


def produce_partitions_response(request: broker_pb2.ProducePartitionsRequest,
                                results: list[Any]) -> broker_pb2.ProducePartitionsResponse:
    """One result per partition, in request order: its offsets, or its ErrorDetail."""
    out = broker_pb2.ProducePartitionsResponse(correlation_id=request.correlation_id)
    add, acks = out.results.add, request.acks
    for d, r in zip(request.partitions, results):
        if isinstance(r, errors.GregorError):
            add(topic=d.topic, partition=d.partition, error=r.to_detail())
        else:
            add(topic=d.topic, partition=d.partition, **produce_result_fields(r, acks))
    return out


class ProduceStreamHandler:
    """One ProduceStream: a reader task appends each request as it arrives; answers leave through a queue."""

    def __init__(self, replicas: "ReplicaManager", open_streams: "set[ProduceStreamHandler]",
                 quota: "StreamQuota | None" = None,
                 authorize: "Callable[[broker_pb2.ProducePartitionsRequest], Mapping[str, errors.GregorError]] | None"
                 = None) -> None:
        self.replicas = replicas
        # Client quotas: a throttled request's answer carries throttle_time_ms and the stream (Kafka's
        # channel) reads nothing more until the throttle time has passed (broker/quota_manager.py).
        self._quota = quota
        self._authorize = authorize  # the authorizer's denials per topic (None: the authorizer is off)
        self._out: asyncio.Queue[broker_pb2.ProducePartitionsResponse | None] = asyncio.Queue()
        self._waiting: set[asyncio.Task[None]] = set()
        self._requests = RequestRecorder("BrokerService", STREAM_API)
        self._open_streams = open_streams  # the broker's open streams, closed when it stops
        self._reader: asyncio.Task[None] | None = None
        self._closing = False

    async def serve(self, request_iterator: Any) -> AsyncIterator[broker_pb2.ProducePartitionsResponse]:
        self._reader = asyncio.ensure_future(self._read(request_iterator))
        self._open_streams.add(self)
        try:
            while True:
                response = await self._out.get()
                if response is None:
                    return
                yield response
        finally:
            self._open_streams.discard(self)
            self._reader.cancel()
            for task in list(self._waiting):
                task.cancel()

    def close(self) -> None:
        """The broker is stopping: read no more requests, answer the ones in hand, then end the stream
        with OK, as Kafka closes its connections; the producer takes the end as a lost connection and
        retries elsewhere. Without this the server's stop waited its whole grace period for the stream
        and then cancelled it (2 s per broker stop, and a logged CancelledError)."""
        self._closing = True
        if self._reader is not None:
            self._reader.cancel()

    async def _read(self, request_iterator: Any) -> None:
        try:
            try:
                quota = self._quota
                async for request in request_iterator:
                    self._handle(request, time.perf_counter())
                    if quota is not None and quota.quotas.enabled:
                        await quota.channel.wait()  # the channel stays muted for the throttle time
            except asyncio.CancelledError:
                if not self._closing:
                    raise
            if self._waiting:  # the producer closed its side, or the broker stops: answer what is waiting
                await asyncio.gather(*list(self._waiting), return_exceptions=True)
        finally:
            self._out.put_nowait(None)

    def _handle(self, request: broker_pb2.ProducePartitionsRequest, start: float) -> None:
        throttle_ms = 0
        try:
            parts = [(d.topic, d.partition, d.records) for d in request.partitions]
            if self._authorize is None:
                results = self.replicas.start_produce_partitions(parts, request.acks, request.timeout_ms)
            else:
                results = with_denials(parts, self._authorize(request), lambda ps: self.replicas.start_produce_partitions(
                    ps, request.acks, request.timeout_ms))
            if self._quota is not None and self._quota.quotas.enabled:
                throttle_ms = self._throttle(request, start)
        except errors.GregorError as err:
            self._reject(request, err, start)
            return
        except Exception as exc:  # a bug answers this request; the stream and the appends before it stay
            log.exception("ProduceStream request failed")
            self._reject(request, errors.GregorError(f"{type(exc).__name__}: {exc}"), start)
            return
        if not produce_pending(results):
            response = produce_partitions_response(request, results)
            response.throttle_time_ms = throttle_ms
            self._answer(response, start, "NONE")
            return
        task = asyncio.ensure_future(self._finish(request, results, start, throttle_ms))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    def _throttle(self, request: broker_pb2.ProducePartitionsRequest, start: float) -> int:
        """Record the request's bytes and append time against the client's quotas; the longer throttle."""
        assert self._quota is not None
        produce = self._quota.record_produce(sum(len(d.records) for d in request.partitions))
        return max(produce, self._quota.record_request_time(time.perf_counter() - start))

    async def _finish(self, request: broker_pb2.ProducePartitionsRequest, results: list[Any], start: float,
                      throttle_ms: int = 0) -> None:
        response = produce_partitions_response(request, await collect_produce(results))
        response.throttle_time_ms = throttle_ms
        self._answer(response, start, "NONE")

    def _reject(self, request: broker_pb2.ProducePartitionsRequest, err: errors.GregorError, start: float) -> None:
        self._answer(broker_pb2.ProducePartitionsResponse(correlation_id=request.correlation_id,
                                                          error=err.to_detail()), start, err.name)

    def _answer(self, response: broker_pb2.ProducePartitionsResponse, start: float, code: str) -> None:
        self._out.put_nowait(response)
        self._requests.record(start, code)
