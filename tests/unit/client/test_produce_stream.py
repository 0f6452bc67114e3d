"""The producer's ProduceStream bookkeeping with a fake gRPC call (pure: no network)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from gregor.client.produce_stream import ProduceStream, ProduceStreams
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2


class FakeCall:
    """A bidi call: writes are recorded; read() returns what answer() queued, or raises what break_() set."""

    def __init__(self) -> None:
        self.written: list[int] = []
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = False

    async def write(self, request: bytes) -> None:
        self.written.append(broker_pb2.ProducePartitionsRequest.FromString(request).correlation_id)

    async def read(self) -> Any:
        item = await self.answers.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class FakeStub:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def ProduceStream(self) -> FakeCall:  # noqa: N802 (the gRPC method name)
        self.calls.append(FakeCall())
        return self.calls[-1]


async def test_answers_match_by_correlation_id_in_any_order() -> None:
    stub = FakeStub()
    stream = ProduceStream(stub.ProduceStream)
    first, second = stream.send([]), stream.send([])
    await asyncio.sleep(0)
    call = stub.calls[0]
    assert call.written == [1, 2]  # written in send order
    await call.answers.put(broker_pb2.ProducePartitionsResponse(correlation_id=2))
    await call.answers.put(broker_pb2.ProducePartitionsResponse(correlation_id=1))
    assert (await asyncio.wait_for(second, 1)).correlation_id == 2
    assert (await asyncio.wait_for(first, 1)).correlation_id == 1
    stream.close()


async def test_a_call_cancelled_under_the_stream_fails_its_requests_instead_of_losing_them() -> None:
    """grpc.aio reports a call whose channel went away as CancelledError in read(); the requests on it
    must fail (and be retried), not wait for request.timeout.ms."""
    stub = FakeStub()
    stream = ProduceStream(stub.ProduceStream)
    pending = stream.send([])
    await asyncio.sleep(0)
    await stub.calls[0].answers.put(asyncio.CancelledError())
    with pytest.raises(errors.GregorError) as info:
        await asyncio.wait_for(pending, 1)
    assert info.value.code == errors.Code.NETWORK_EXCEPTION
    again = stream.send([])  # the next send opens a new stream
    await asyncio.sleep(0)
    assert len(stub.calls) == 2 and stub.calls[1].written == [2]
    stream.close()
    with pytest.raises(errors.GregorError):
        await again


async def test_a_stream_ending_with_internal_is_a_retriable_lost_connection() -> None:
    """A broker that stops cancels its stream handlers, which clients see as INTERNAL; that must be a
    retriable NETWORK_EXCEPTION (it was UNKNOWN_SERVER_ERROR, which failed records for good)."""
    stub = FakeStub()
    stream = ProduceStream(stub.ProduceStream)
    pending = stream.send([])
    await asyncio.sleep(0)
    await stub.calls[0].answers.put(grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(),
                                                         grpc.aio.Metadata(), "Internal error from Core"))
    with pytest.raises(errors.GregorError) as info:
        await asyncio.wait_for(pending, 1)
    assert info.value.code == errors.Code.NETWORK_EXCEPTION and info.value.retriable
    assert "INTERNAL" in info.value.message
    stream.close()


async def test_a_broker_at_a_new_address_gets_a_new_stream_and_the_old_one_fails_retriably() -> None:
    stubs: dict[str, FakeStub] = {}

    def opener(address: str) -> Any:
        return stubs.setdefault(address, FakeStub()).ProduceStream

    streams = ProduceStreams(opener)
    old = [streams.send(1, "10.0.0.1:9092", []) for _ in range(2)]
    await asyncio.sleep(0)
    assert len(stubs["10.0.0.1:9092"].calls) == 1  # same address: the same stream
    new = streams.send(1, "10.0.0.7:9092", [])  # the broker restarted elsewhere
    for future in old:
        with pytest.raises(errors.GregorError) as info:
            await future
        assert info.value.code == errors.Code.NETWORK_EXCEPTION and info.value.retriable
    await asyncio.sleep(0)
    assert stubs["10.0.0.1:9092"].calls[0].cancelled and len(stubs["10.0.0.7:9092"].calls) == 1
    assert len(streams) == 1 and not new.done()
    streams.close()
    assert len(streams) == 0 and new.done() and new.exception().code == errors.Code.NETWORK_EXCEPTION


async def test_a_failed_stream_logs_no_unretrieved_future_for_a_request_nobody_awaits() -> None:
    """A request whose sender went away (cancelled, e.g. a coordinator's write abandoned on shard unload) gets
    the stream's error when the stream fails: collecting its future must not log asyncio's "Future exception
    was never retrieved" (seen in coordinator logs); a sender still awaiting gets the error raised."""
    import gc
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:
        stub = FakeStub()
        stream = ProduceStream(stub.ProduceStream)
        abandoned, awaited = stream.send([]), stream.send([])
        await asyncio.sleep(0)
        stream.close()
        with pytest.raises(errors.GregorError):
            await awaited
        assert abandoned.done()
        del abandoned
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert not [c for c in seen if "never retrieved" in str(c.get("message", ""))], seen
