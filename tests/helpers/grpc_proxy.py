"""A gRPC-level fault proxy in front of one broker, on its own thread and event loop.

Every unary BrokerService / AdminService call is forwarded as raw bytes to the
broker; Metadata answers are rewritten so that clients keep talking to the
proxy. Produce calls go through `ProducePolicy`: a request may be delayed
(reordering what reaches the broker), dropped before the broker sees it, or
forwarded and its answer dropped (the broker appended; the client sees
UNAVAILABLE, exactly a response lost on the way back). The producer's
ProduceStream is forwarded message by message under the same policy; on a
stream a lost request or answer is a broken connection (the stream fails with
UNAVAILABLE, so every request in flight on it fails), and a delay holds the
stream (its order is kept, as on a TCP connection).
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import grpc

from gregor.common.rpc import channel
from gregor.rpc.v1 import broker_pb2

# The producer sends ProducePartitions (many partitions per call); raw clients may send Produce.
PRODUCE = ("/gregor.rpc.v1.BrokerService/Produce", "/gregor.rpc.v1.BrokerService/ProducePartitions")
METADATA = "/gregor.rpc.v1.BrokerService/Metadata"
PRODUCE_STREAM = "/gregor.rpc.v1.BrokerService/ProduceStream"


@dataclass
class ProducePolicy:
    """What to do with Produce calls: drop answers / requests (counted) and delay requests randomly."""

    drop_responses: int = 0  # answers to swallow (the broker did append)
    drop_requests: int = 0  # requests to swallow (the broker never sees them)
    every: int = 3  # act on every n-th Produce call while drops remain
    max_delay_s: float = 0.0  # random delay before forwarding (reorders arrivals at the broker)
    seed: int = 1
    calls: int = 0
    responses_dropped: int = 0
    requests_dropped: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    rng: random.Random = field(default_factory=random.Random)


class GrpcFaultProxy:
    """Forwards unary calls to `target`; serves on 127.0.0.1:<port> (thread-owned event loop)."""

    def __init__(self, target: str, policy: Optional[ProducePolicy] = None) -> None:
        self.target = target
        self.policy = policy or ProducePolicy()
        self.policy.rng.seed(self.policy.seed)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: Optional[asyncio.Event] = None
        self._thread = threading.Thread(target=self._run, name="grpc-fault-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "GrpcFaultProxy":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        upstream = channel(self.target)
        proxy = self

        async def forward(method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            call = upstream.unary_unary(method, request_serializer=None, response_deserializer=None)
            timeout = context.time_remaining()
            try:
                return await call(request, timeout=timeout)
            except grpc.aio.AioRpcError as exc:
                await context.abort_with_status(_status(exc))
                raise

        async def handle(method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if method == METADATA:
                resp = broker_pb2.MetadataResponse.FromString(await forward(method, request, context))
                for b in resp.brokers:
                    b.host, b.grpc_port = "127.0.0.1", proxy.port
                return resp.SerializeToString()
            if method not in PRODUCE:
                return await forward(method, request, context)
            p = proxy.policy
            p.calls += 1
            p.concurrent += 1
            p.max_concurrent = max(p.max_concurrent, p.concurrent)
            try:
                if p.max_delay_s:
                    await asyncio.sleep(p.rng.uniform(0, p.max_delay_s))
                act = p.calls % p.every == 0
                if act and p.requests_dropped < p.drop_requests and p.rng.random() < 0.5:
                    p.requests_dropped += 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "proxy dropped the request")
                answer = await forward(method, request, context)
                if act and p.responses_dropped < p.drop_responses:
                    p.responses_dropped += 1
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "proxy dropped the response")
                return answer
            finally:
                p.concurrent -= 1

        async def produce_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            call = upstream.stream_stream(PRODUCE_STREAM, request_serializer=None, response_deserializer=None)()
            p = proxy.policy
            broken: list[str] = []
            state = {"outstanding": 0, "drop_answers": 0}

            def break_stream(why: str) -> None:
                broken.append(why)
                call.cancel()

            async def pump() -> None:
                try:
                    async for request in requests:
                        p.calls += 1
                        p.concurrent += 1
                        state["outstanding"] += 1
                        p.max_concurrent = max(p.max_concurrent, p.concurrent)
                        if p.max_delay_s:
                            await asyncio.sleep(p.rng.uniform(0, p.max_delay_s))
                        act = p.calls % p.every == 0
                        if act and p.requests_dropped < p.drop_requests and p.rng.random() < 0.5:
                            p.requests_dropped += 1
                            break_stream("proxy dropped a request")
                            return
                        await call.write(request)
                        if act and p.responses_dropped < p.drop_responses:
                            state["drop_answers"] += 1
                    await call.done_writing()
                except (grpc.RpcError, asyncio.InvalidStateError):
                    call.cancel()

            task = asyncio.ensure_future(pump())
            try:
                while True:
                    try:
                        response = await call.read()
                    except asyncio.CancelledError:
                        if not broken:
                            raise
                        break
                    except grpc.aio.AioRpcError as exc:
                        await context.abort_with_status(_status(exc))
                        return
                    if response is grpc.aio.EOF:
                        return
                    p.concurrent -= 1
                    state["outstanding"] -= 1
                    if state["drop_answers"]:
                        state["drop_answers"] -= 1
                        p.responses_dropped += 1
                        break_stream("proxy dropped the response")
                        break
                    yield response
                await context.abort(grpc.StatusCode.UNAVAILABLE, broken[0] if broken else "stream broken")
            finally:
                task.cancel()
                p.concurrent -= state["outstanding"]
                state["outstanding"] = 0

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> Any:
                method = details.method
                if method == PRODUCE_STREAM:
                    return grpc.stream_stream_rpc_method_handler(produce_stream, request_deserializer=None,
                                                                 response_serializer=None)

                async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    return await handle(method, request, context)

                return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=None,
                                                           response_serializer=None)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers((Handler(),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._ready.set()
        await self._stop.wait()
        await server.stop(0)
        await upstream.close()


def _status(exc: grpc.aio.AioRpcError) -> Any:
    """The upstream failure with its trailers (the ErrorDetail travels in grpc-status-details-bin)."""
    from grpc_status import rpc_status

    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    if status is not None:
        return rpc_status.to_status(status)

    class _Plain(grpc.Status):  # type: ignore[misc]
        code = exc.code()
        details = exc.details() or ""
        trailing_metadata = exc.trailing_metadata()

    return _Plain()
