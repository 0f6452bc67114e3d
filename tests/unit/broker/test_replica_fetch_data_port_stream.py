"""The follower's fetch session on the leader's data port (replica_fetcher._DataPortStream), against a real
asyncio TCP server standing in for the leader's data port framing (data_port.py: a request frame's length has
its high bit set, the answer is one length-prefixed ReplicaFetchResponse).

The contract is _FetchStream's (test_replica_fetch_exchange.py): the answer is returned and the connection
kept (one session); a wake-up cuts the poll short by closing the connection (the leader's session ends, the
next request is a full one on a new connection); the timeout is REQUEST_TIMED_OUT; a refusal as a whole
raises its error; a lost leader is NETWORK_EXCEPTION."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gregor.broker import replica_fetcher
from gregor.broker.replica_fetcher import _DataPortStream
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2

FRAME = struct.Struct(">I")


@dataclass
class Leader:
    """A data port that records each connection's replica requests and answers as told."""

    port: int = 0
    requests: list[list[broker_pb2.ReplicaFetchRequest]] = field(default_factory=list)  # per connection
    answers: "asyncio.Queue[bytes | None]" = field(default_factory=asyncio.Queue)  # None: close the connection
    closed: list[asyncio.Event] = field(default_factory=list)  # set when the follower's side is gone

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        mine: list[broker_pb2.ReplicaFetchRequest] = []
        self.requests.append(mine)
        gone = asyncio.Event()
        self.closed.append(gone)
        try:
            while True:
                (size,) = FRAME.unpack(await reader.readexactly(4))
                assert size & 0x8000_0000, "a replica frame has the high bit set"
                mine.append(broker_pb2.ReplicaFetchRequest.FromString(await reader.readexactly(size & 0x7FFF_FFFF)))
                answer = await self.answers.get()
                if answer is None:
                    return
                writer.write(FRAME.pack(len(answer)) + answer)
        except (asyncio.IncompleteReadError, ConnectionError):
            gone.set()
        except asyncio.CancelledError:
            pass  # the test's loop ends with this handler still waiting
        finally:
            writer.close()


def response(hw: int) -> bytes:
    return broker_pb2.ReplicaFetchResponse(partitions=[broker_pb2.ReplicaFetchPartitionResponse(
        topic="t", partition=0, high_watermark=hw)]).SerializeToString()


def request(offset: int) -> broker_pb2.ReplicaFetchRequest:
    return broker_pb2.ReplicaFetchRequest(replica_id=2, min_bytes=1, max_wait_ms=500, partitions=[
        broker_pb2.ReplicaFetchPartition(topic="t", partition=0, fetch_offset=offset, max_bytes=1 << 20)])


@pytest.fixture
async def leader() -> AsyncIterator[Leader]:
    lead = Leader()
    server = await asyncio.start_server(lead.serve, "127.0.0.1", 0)
    lead.port = server.sockets[0].getsockname()[1]
    try:
        yield lead
    finally:
        server.close()


async def test_answers_come_back_on_one_connection(leader: Leader) -> None:
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    assert stream.fresh
    for offset in (0, 5):
        leader.answers.put_nowait(response(offset + 1))
        resp = await stream.exchange(request(offset), asyncio.Event())
        assert resp is not None and resp.partitions[0].high_watermark == offset + 1
        assert not stream.fresh  # the session goes on
    assert [[r.partitions[0].fetch_offset for r in conn] for conn in leader.requests] == [[0, 5]]
    stream.reset()


async def test_a_wake_up_cuts_the_poll_and_the_next_request_opens_a_new_session(leader: Leader) -> None:
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    wake = asyncio.Event()
    task = asyncio.ensure_future(stream.exchange(request(0), wake))
    await asyncio.wait_for(_until(lambda: bool(leader.requests and leader.requests[0])), 5)
    wake.set()
    stream.woken()
    assert await asyncio.wait_for(task, 5) is None
    assert stream.fresh
    leader.answers.put_nowait(response(99))  # the parked answer leaves at last, on a closed connection...
    await asyncio.wait_for(leader.closed[0].wait(), 5)  # ...and the leader sees the session end
    leader.answers.put_nowait(response(3))
    resp = await stream.exchange(request(0), asyncio.Event())
    assert resp is not None and len(leader.requests) == 2  # a second connection
    stream.reset()


async def test_a_wake_up_before_the_read_answers_none_at_once(leader: Leader) -> None:
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    wake = asyncio.Event()
    wake.set()
    assert await stream.exchange(request(0), wake) is None
    assert stream.fresh


async def test_a_request_refused_as_a_whole_raises_its_error(leader: Leader) -> None:
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    refused = errors.error_for(errors.Code.CLUSTER_AUTHORIZATION_FAILED, "no ClusterAction")
    leader.answers.put_nowait(broker_pb2.ReplicaFetchResponse(error=refused.to_detail()).SerializeToString())
    with pytest.raises(errors.GregorError) as info:
        await stream.exchange(request(0), None)
    assert info.value.code == errors.Code.CLUSTER_AUTHORIZATION_FAILED
    assert stream.fresh


async def test_a_leader_that_closes_the_connection_is_a_network_exception(leader: Leader) -> None:
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    leader.answers.put_nowait(None)
    with pytest.raises(errors.GregorError) as info:
        await stream.exchange(request(0), None)
    assert info.value.code == errors.Code.NETWORK_EXCEPTION
    assert stream.fresh


async def test_no_answer_within_the_timeout_is_request_timed_out(leader: Leader,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_fetcher, "FETCH_RPC_TIMEOUT_S", 0.2)
    stream = _DataPortStream(f"127.0.0.1:{leader.port}")
    with pytest.raises(errors.GregorError) as info:
        await stream.exchange(request(0), None)
    assert info.value.code == errors.Code.REQUEST_TIMED_OUT
    assert stream.fresh
    leader.answers.put_nowait(response(1))  # too late: the follower has closed the connection
    await asyncio.wait_for(leader.closed[0].wait(), 5)


async def test_a_refused_connection_is_a_network_exception() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    stream = _DataPortStream(f"127.0.0.1:{port}")
    with pytest.raises(errors.GregorError) as info:
        await stream.exchange(request(0), None)
    assert info.value.code == errors.Code.NETWORK_EXCEPTION
    assert stream.fresh


async def _until(cond: "object") -> None:
    while not cond():  # type: ignore[operator]
        await asyncio.sleep(0.01)
