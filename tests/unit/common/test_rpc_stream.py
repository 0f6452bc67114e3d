"""rpc_stream, the streaming RPCs' wrapper, over a real gRPC server on localhost: each stream is timed and
counted by its result, a GregorError ends it with its typed status, and a bug ends it as
UNKNOWN_SERVER_ERROR while the server keeps serving."""

from __future__ import annotations

from typing import Any, AsyncIterator

import grpc
import pytest
from prometheus_client import REGISTRY

from gregor.common import errors, rpc
from tests.helpers.wait import until

SERVICE = "ProbeService"


class Probe:
    """Echoes each request; b"typed" raises a GregorError, b"bug" a plain exception (after one answer each)."""

    @rpc.rpc_stream(SERVICE)
    async def Echo(self, request_iterator: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in request_iterator:
            yield request
            if request == b"typed":
                raise errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "moved", topic="t", partition=0)
            if request == b"bug":
                raise KeyError("a bug")


def ended(code: str) -> float:
    return REGISTRY.get_sample_value("gregor_streams_total", {"service": SERVICE, "api": "Echo", "code": code}) or 0.0


def timed() -> float:
    return REGISTRY.get_sample_value("gregor_stream_duration_seconds_count", {"service": SERVICE, "api": "Echo"}) or 0.0


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = grpc.aio.server()
    probe = Probe()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.stream_stream_rpc_method_handler(probe.Echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield ch
    finally:
        await ch.close()
        await server.stop(0)


async def exchange(ch: grpc.aio.Channel, messages: list[bytes]) -> tuple[list[bytes], errors.GregorError | None]:
    call = ch.stream_stream(f"/{SERVICE}/Echo")(iter(messages), timeout=20)
    got: list[bytes] = []
    try:
        async for answer in call:
            got.append(answer)
    except grpc.aio.AioRpcError as exc:
        return got, errors.from_rpc_error(exc)
    return got, None


async def test_a_stream_is_timed_and_counted_when_it_ends(channel: grpc.aio.Channel) -> None:
    before_ok, before_timed = ended("NONE"), timed()
    assert await exchange(channel, [b"a", b"b"]) == ([b"a", b"b"], None)
    await until(lambda: ended("NONE") == before_ok + 1, 10, "the stream counted as NONE")
    assert timed() == before_timed + 1


async def test_a_gregor_error_ends_the_stream_with_its_typed_status(channel: grpc.aio.Channel) -> None:
    before = ended("NOT_LEADER_OR_FOLLOWER")
    got, err = await exchange(channel, [b"typed", b"never answered"])
    assert got == [b"typed"]
    assert err is not None and err.code == errors.Code.NOT_LEADER_OR_FOLLOWER and err.topic == "t"
    await until(lambda: ended("NOT_LEADER_OR_FOLLOWER") == before + 1, 10, "the stream counted by its error")


async def test_a_bug_ends_the_stream_as_unknown_server_error_and_the_server_keeps_serving(
        channel: grpc.aio.Channel) -> None:
    before = ended("UNKNOWN_SERVER_ERROR")
    got, err = await exchange(channel, [b"bug"])
    assert got == [b"bug"]
    assert err is not None and err.code == errors.Code.UNKNOWN_SERVER_ERROR and "KeyError" in str(err)
    await until(lambda: ended("UNKNOWN_SERVER_ERROR") == before + 1, 10, "the stream counted as a server error")
    assert await exchange(channel, [b"after"]) == ([b"after"], None)
