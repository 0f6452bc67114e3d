"""The replica fetch stream: a partition added while a poll is out cuts the poll short only when told to.

A cut poll cancels the stream, and the leader's fetch session (KIP-227) goes with it: the next request
re-lists every partition. For a session of thousands of partitions, which a large creation grows by a
LeaderAndIsr chunk at a time, the fetcher no longer passes the wake-up event (issue 24), and the stream
then waits for the leader's answer and stays open for the next, incremental, request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gregor.broker.replica_fetcher import _FetchStream


class _Call:
    """One ReplicaFetch stream: requests written, the answer released by the test."""

    def __init__(self) -> None:
        self.written: list[Any] = []
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.cancelled = False

    async def write(self, request: Any) -> None:
        self.written.append(request)

    async def read(self) -> Any:
        return await self.answer

    def cancel(self) -> None:
        self.cancelled = True
        if not self.answer.done():
            self.answer.cancel()

    def done(self) -> bool:
        return self.cancelled


class _Stub:
    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def ReplicaFetch(self) -> _Call:  # noqa: N802 (the gRPC method's name)
        self.calls.append(_Call())
        return self.calls[-1]


async def test_a_wake_cuts_the_poll_and_the_stream_only_when_passed() -> None:
    stub = _Stub()
    stream = _FetchStream(stub)  # type: ignore[arg-type]
    wake = asyncio.Event()

    # Interruptible (a small session): the wake returns None at once and the stream is gone.
    poll = asyncio.create_task(stream.exchange("first", wake))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    wake.set()
    stream.woken()  # as ReplicaFetcher.add does after setting the event
    assert await poll is None
    assert stub.calls[0].cancelled and stream.call is None

    # Not interruptible (a large session): the wake is ignored, the answer comes, the stream stays open.
    wake.clear()
    poll = asyncio.create_task(stream.exchange("second", None))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    wake.set()
    stream.woken()
    await asyncio.sleep(0.05)
    assert not poll.done(), "the poll was cut short"
    stub.calls[1].answer.set_result("answer")
    assert await poll == "answer"
    assert not stub.calls[1].cancelled and stream.call is stub.calls[1]
    assert len(stub.calls) == 2
