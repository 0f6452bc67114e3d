"""The broker's side of controlled shutdown: retries, backoff and giving up (Kafka's KafkaServer.controlledShutdown).

A real in-process gRPC ControllerService answers; etcd is not needed, since the
membership's controller lookup is replaced by that server's channel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from gregor.broker.cluster_membership import ClusterMembership
from gregor.common import errors
from gregor.common.etcd import EtcdClient
from gregor.rpc.v1 import common_pb2, controller_pb2, controller_pb2_grpc


class ScriptedController(controller_pb2_grpc.ControllerServiceServicer):
    """Answers ControlledShutdown from a script: a list of remaining-partition lists or error codes."""

    def __init__(self, script: list[list[str] | int]) -> None:
        self.script = script
        self.requests: list[tuple[int, int]] = []

    async def ControlledShutdown(self, request: controller_pb2.ControlledShutdownRequest,
                                 context: grpc.aio.ServicerContext) -> controller_pb2.ControlledShutdownResponse:
        self.requests.append((request.broker_id, request.broker_epoch))
        step = self.script.pop(0) if self.script else []
        if isinstance(step, int):
            return controller_pb2.ControlledShutdownResponse(error=errors.error_for(step, "scripted").to_detail())
        return controller_pb2.ControlledShutdownResponse(remaining_partitions=[
            common_pb2.TopicPartition(topic=s.rsplit("-", 1)[0], partition=int(s.rsplit("-", 1)[1])) for s in step])


@pytest.fixture
async def controller_channel() -> AsyncIterator[tuple[ScriptedController, grpc.aio.Channel]]:
    servicer = ScriptedController([])
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield servicer, ch
    await server.stop(None)


def membership(ch: grpc.aio.Channel | None) -> ClusterMembership:
    m = ClusterMembership(EtcdClient("http://127.0.0.1:1", cluster="c"), 7, {}, 10_000)
    m.broker_epoch = 42

    async def lookup() -> tuple[int, grpc.aio.Channel]:
        if ch is None:
            raise errors.error_for(errors.Code.NOT_CONTROLLER, "no active controller")
        return 1, ch

    m.controller_channel = lookup  # type: ignore[method-assign]
    return m


async def test_retries_while_partitions_remain_then_succeeds(controller_channel) -> None:  # type: ignore[no-untyped-def]
    servicer, ch = controller_channel
    servicer.script = [["t-0", "t-1"], errors.Code.NOT_CONTROLLER, []]
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    assert await membership(ch).controlled_shutdown(3, 5000, sleep=sleep) is True
    assert servicer.requests == [(7, 42)] * 3 and sleeps == [5.0, 5.0]


async def test_gives_up_after_max_retries_without_a_last_sleep(controller_channel) -> None:  # type: ignore[no-untyped-def]
    servicer, ch = controller_channel
    servicer.script = [["t-0"]] * 5
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    assert await membership(ch).controlled_shutdown(3, 100, sleep=sleep) is False
    assert len(servicer.requests) == 3 and sleeps == [0.1, 0.1]


async def test_no_controller_counts_as_a_failed_attempt() -> None:
    sleeps: list[float] = []

    async def sleep(s: float) -> None:
        sleeps.append(s)

    assert await membership(None).controlled_shutdown(2, 250, sleep=sleep) is False
    assert sleeps == [0.25]
