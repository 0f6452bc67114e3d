"""The producer's ProduceStream to one broker: Kafka's pipelined connection over one gRPC stream.

Requests are written in the order `send` is called (a writer task drains a FIFO),
so the broker appends an idempotent producer's batches of a partition in sequence
order even with 5 in flight; concurrent unary calls could be started by the
server in any order and come back OUT_OF_ORDER_SEQUENCE_NUMBER. Answers carry the
request's correlation id and may come back in any order. When the stream fails
(the broker died, a request timed out), every request on it fails with that error
and the next `send` opens a new stream, as Kafka's NetworkClient fails the
in-flight requests of a connection it closes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional

import grpc

from gregor.client.produce_request import PRODUCE_STREAM_METHOD, finish
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2

Response = broker_pb2.ProducePartitionsResponse


def open_produce_stream(channel: grpc.aio.Channel) -> Callable[[], Any]:
    """What opens a ProduceStream call on channel: requests go as bytes (produce_request.py builds
    them), answers are parsed as ProducePartitionsResponse. The stream carries client.id once, as
    the channel's every call does (ClusterMetadata.channel: the broker's client quotas key on it)."""
    open_call: Callable[[], Any] = channel.stream_stream(PRODUCE_STREAM_METHOD, request_serializer=None,
                                                         response_deserializer=Response.FromString)
    return open_call


class ProduceStream:
    """One open ProduceStream (re-opened on the next send after a failure). Concurrency: one event loop."""

    def __init__(self, open_call: Callable[[], Any]) -> None:
        self._open_call = open_call
        self._call: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._next_id = 0

    def send(self, pieces: list[bytes]) -> "asyncio.Future[Response]":
        """Queue a request, the pieces of ProduceRequestEncoder (written after every earlier one; its
        correlation_id is added here); the future gets its answer or the stream's error."""
        if self._call is None:
            self._open()
        self._next_id += 1
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        self._queue.put_nowait(finish(pieces, self._next_id))
        return future

    def fail(self, err: errors.GregorError) -> None:
        """Close the stream and fail every request on it (written or queued) with err."""
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self._queue = asyncio.Queue()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(err)
                future.exception()  # retrieved: a sender that went away is not an "unhandled" error

    def close(self) -> None:
        self.fail(errors.error_for(errors.Code.NETWORK_EXCEPTION, "the producer closed its produce stream"))

    def _open(self) -> None:
        self._call = call = self._open_call()
        self._tasks = [asyncio.ensure_future(self._write(call, self._queue)), asyncio.ensure_future(self._read(call))]

    async def _write(self, call: Any, queue: "asyncio.Queue[bytes]") -> None:
        try:
            while True:
                await call.write(await queue.get())
        except asyncio.CancelledError:
            if _task_cancelled():
                raise
            self._failed(call, None)  # the call was cancelled under us (its channel closed): not this task
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            self._failed(call, exc)

    async def _read(self, call: Any) -> None:
        try:
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    self._failed(call, None)
                    return
                future = self._pending.pop(response.correlation_id, None)
                if future is not None and not future.done():
                    future.set_result(response)
        except asyncio.CancelledError:
            if _task_cancelled():
                raise
            self._failed(call, None)  # grpc.aio reports a call cancelled by its channel as CancelledError
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            self._failed(call, exc)

    def _failed(self, call: Any, exc: Optional[BaseException]) -> None:
        """The stream ended: whatever its status (UNAVAILABLE, or INTERNAL / CANCELLED from a broker that
        is stopping), that is a lost connection, retriable, never a verdict on the requests: the
        broker answers those in responses."""
        if call is not self._call:  # already failed and replaced
            return
        why = "the broker closed the produce stream"
        if isinstance(exc, grpc.aio.AioRpcError):
            why = f"the produce stream failed: {exc.code().name}: {exc.details()}"
        elif exc is not None:
            why = f"the produce stream failed: {type(exc).__name__}: {exc}"
        self.fail(errors.error_for(errors.Code.NETWORK_EXCEPTION, why))


def _task_cancelled() -> bool:
    """Whether the running task itself is being cancelled (fail(), close()), not just its gRPC call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class ProduceStreams:
    """A producer's streams, one per broker at its current address (Kafka's connections by node)."""

    def __init__(self, opener: Callable[[str], Callable[[], Any]]) -> None:
        self._opener = opener  # address -> what opens a ProduceStream call there (open_produce_stream)
        self._by_leader: dict[int, tuple[str, ProduceStream]] = {}

    def send(self, leader: int, address: str, pieces: list[bytes]) -> "asyncio.Future[Response]":
        """Queue a request on the leader's stream; a broker that moved to a new address (restarted on
        another port or pod IP) gets a new stream, and the one to the old address fails as a closed
        connection (its requests retry) instead of being kept for good."""
        held = self._by_leader.get(leader)
        if held is None or held[0] != address:
            if held is not None:
                held[1].fail(errors.error_for(errors.Code.NETWORK_EXCEPTION, f"broker {leader} moved to {address}"))
            held = self._by_leader[leader] = (address, ProduceStream(self._opener(address)))
        return held[1].send(pieces)

    def fail(self, leader: int, err: errors.GregorError) -> None:
        """Fail the leader's stream and every request on it (a timed-out request closes its connection)."""
        held = self._by_leader.pop(leader, None)
        if held is not None:
            held[1].fail(err)

    def close(self) -> None:
        for _, stream in self._by_leader.values():
            stream.close()
        self._by_leader.clear()

    def __len__(self) -> int:
        return len(self._by_leader)
