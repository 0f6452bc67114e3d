"""The follower's ReplicaFetch exchange awaits the leader's answer directly (issue 24: no read task, waker
task and asyncio.wait per fetch); a wake-up (a partition added while the poll is out) or the timeout cuts
the read short by cancelling the call, and a cancellation of the fetcher itself still propagates.

The stub stands in for grpc.aio's stream-stream call with its documented behaviour: a read pending when the
call is cancelled locally raises asyncio.CancelledError."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gregor.broker import replica_fetcher
from gregor.broker.replica_fetcher import _FetchStream
from gregor.common import errors


class FakeCall:
    def __init__(self) -> None:
        self.written: list[Any] = []
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def write(self, request: Any) -> None:
        self.written.append(request)

    async def read(self) -> Any:
        return await self.answer

    def cancel(self) -> bool:
        self.cancelled = True
        if not self.answer.done():
            self.answer.cancel()  # grpc.aio: a read pending on a locally cancelled call raises CancelledError
        return True

    def done(self) -> bool:
        return self.cancelled


class FakeStub:
    def __init__(self) -> None:
        self.calls: list[FakeCall] = []

    def ReplicaFetch(self) -> FakeCall:  # noqa: N802 (gRPC's method name)
        self.calls.append(FakeCall())
        return self.calls[-1]


@pytest.fixture
def stub() -> FakeStub:
    return FakeStub()


@pytest.fixture
def stream(stub: FakeStub) -> _FetchStream:
    return _FetchStream(stub)  # type: ignore[arg-type]


async def exchanging(stream: _FetchStream, request: str, wake: asyncio.Event | None) -> "asyncio.Task[Any]":
    """stream.exchange(request, wake) as a task that has written its request and waits for the answer."""
    task = asyncio.ensure_future(stream.exchange(request, wake))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    return task


async def test_the_answer_is_returned_and_the_stream_kept(stub: FakeStub, stream: _FetchStream) -> None:
    wake = asyncio.Event()
    task = await exchanging(stream, "req-1", wake)
    stub.calls[0].answer.set_result("resp-1")
    assert await task == "resp-1"
    stub.calls[0].answer = asyncio.get_running_loop().create_future()
    task = await exchanging(stream, "req-2", wake)
    stub.calls[0].answer.set_result("resp-2")
    assert await task == "resp-2"
    assert len(stub.calls) == 1 and stub.calls[0].written == ["req-1", "req-2"]


async def test_a_wake_up_cuts_the_poll_and_resets_the_stream(stub: FakeStub, stream: _FetchStream) -> None:
    wake = asyncio.Event()
    task = await exchanging(stream, "req", wake)
    stream.woken()  # the event is not set: nothing happens
    assert not stub.calls[0].cancelled
    wake.set()
    stream.woken()
    assert await asyncio.wait_for(task, 5) is None
    assert stub.calls[0].cancelled and stream.call is None


async def test_a_wake_up_before_the_read_answers_none_at_once(stub: FakeStub, stream: _FetchStream) -> None:
    wake = asyncio.Event()
    wake.set()
    assert await stream.exchange("req", wake) is None  # type: ignore[arg-type]
    assert stub.calls[0].cancelled


async def test_no_answer_within_the_timeout_is_request_timed_out(monkeypatch: pytest.MonkeyPatch, stub: FakeStub,
                                                                 stream: _FetchStream) -> None:
    monkeypatch.setattr(replica_fetcher, "FETCH_RPC_TIMEOUT_S", 0.01)
    with pytest.raises(errors.GregorError) as exc:
        await stream.exchange("req", asyncio.Event())  # type: ignore[arg-type]
    assert exc.value.code == errors.Code.REQUEST_TIMED_OUT and stub.calls[0].cancelled


async def test_cancelling_the_fetcher_still_cancels_it(stream: _FetchStream) -> None:
    task = await exchanging(stream, "req", asyncio.Event())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# A large session (issue 24): a partition added while the poll is out cuts the poll short only when the fetcher
# passes the wake-up event; for a session of thousands of partitions, which a large creation grows a LeaderAndIsr
# chunk at a time, it passes None, and the stream waits for the answer and stays open for the next, incremental,
# request (a cut stream takes the leader's fetch session with it: the next request re-lists every partition).
async def test_a_wake_cuts_the_poll_and_the_stream_only_when_passed(stub: FakeStub, stream: _FetchStream) -> None:
    wake = asyncio.Event()

    # Interruptible (a small session): the wake returns None at once and the stream is gone.
    poll = await exchanging(stream, "first", wake)
    wake.set()
    stream.woken()  # as ReplicaFetcher.add does after setting the event
    assert await poll is None
    assert stub.calls[0].cancelled and stream.call is None

    # Not interruptible (a large session): the wake is ignored, the answer comes, the stream stays open.
    wake.clear()
    poll = await exchanging(stream, "second", None)
    wake.set()
    stream.woken()
    await asyncio.sleep(0.05)
    assert not poll.done(), "the poll was cut short"
    stub.calls[1].answer.set_result("answer")
    assert await poll == "answer"
    assert not stub.calls[1].cancelled and stream.call is stub.calls[1]
    assert len(stub.calls) == 2
