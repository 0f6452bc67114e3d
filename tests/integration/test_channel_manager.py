"""ControllerChannelManager against real grpc.aio brokers on port 0 (seed 001's RequestSendThread).

A small BrokerControlService servicer stands in for a broker's control endpoint:
it records what arrives, can hold its answers (a slow or paused broker), fail the
first calls with UNAVAILABLE, or refuse a request with a typed error. The tests
check what the controller relies on: per-broker queue size and queue time
metrics with real values, resends with doubling backoff that keep the order,
no resend of an answer that will not change, and a removed broker's queue dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc
import pytest
from prometheus_client import CollectorRegistry

from gregor.cli.local_cluster import free_port
from gregor.common import errors
from gregor.common.rpc import make_server, rpc_method
from gregor.controller import channel_manager
from gregor.controller.channel_manager import ControllerChannelManager
from gregor.controller.requests import (ControlRequest, LeaderAndIsrRequest, PartitionStateInfo, StopReplicaRequest,
                                        UpdateMetadataRequest)
from gregor.controller.state import LeaderAndIsr, TopicPartition
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.helpers.wait import until

CONTROLLER_ID, CONTROLLER_EPOCH, BROKER_EPOCH = 9, 3, 11
DELIVERY_TIMEOUT_S = 10.0  # a handful of local RPCs plus at most a few backoffs (<= 2 s each)
PAUSE_S = 0.5  # how long the paused broker holds its first answer


@dataclass
class FakeBroker(broker_pb2_grpc.BrokerControlServiceServicer):
    """A broker's control endpoint that records every attempt (api, tag, monotonic time) and what it answered.

    Concurrency: the servicer runs on the test's event loop; `gate` holds answers
    while cleared, `fail_first` makes the first N attempts fail with UNAVAILABLE,
    `refuse` maps a tag to the typed error it is answered with.
    """

    fail_first: int = 0
    refuse: dict[int, errors.GregorError] = field(default_factory=dict)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    attempts: list[tuple[str, int, float]] = field(default_factory=list)
    delivered: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.gate.set()

    async def _handle(self, api: str, tag: int, context: grpc.aio.ServicerContext) -> None:
        self.attempts.append((api, tag, time.monotonic()))
        if len(self.attempts) <= self.fail_first:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "broker not ready yet")
        if tag in self.refuse:
            raise self.refuse[tag]
        await self.gate.wait()
        self.delivered.append((api, tag))

    @rpc_method("BrokerControlService")
    async def LeaderAndIsr(self, request: broker_pb2.LeaderAndIsrRequest,
                           context: grpc.aio.ServicerContext) -> broker_pb2.LeaderAndIsrResponse:
        await self._handle("LeaderAndIsr", request.partition_states[0].partition, context)
        return broker_pb2.LeaderAndIsrResponse()

    @rpc_method("BrokerControlService")
    async def StopReplica(self, request: broker_pb2.StopReplicaRequest,
                          context: grpc.aio.ServicerContext) -> broker_pb2.StopReplicaResponse:
        await self._handle("StopReplica", request.partitions[0].partition, context)
        return broker_pb2.StopReplicaResponse()

    @rpc_method("BrokerControlService")
    async def UpdateMetadata(self, request: broker_pb2.UpdateMetadataRequest,
                             context: grpc.aio.ServicerContext) -> broker_pb2.UpdateMetadataResponse:
        await self._handle("UpdateMetadata", request.partition_states[0].partition, context)
        return broker_pb2.UpdateMetadataResponse()

    def attempts_of(self, tag: int) -> list[float]:
        return [t for _, g, t in self.attempts if g == tag]


async def serve(fake: FakeBroker, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = make_server()
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    broker_pb2_grpc.add_BrokerControlServiceServicer_to_server(fake, server)
    await server.start()
    return server, bound


def endpoint(broker_id: int, port: int) -> common_pb2.BrokerEndpoint:
    return common_pb2.BrokerEndpoint(broker_id=broker_id, host="127.0.0.1", grpc_port=port, broker_epoch=BROKER_EPOCH)


def _state(tag: int) -> tuple[PartitionStateInfo, ...]:
    return (PartitionStateInfo(TopicPartition("t", tag), LeaderAndIsr(1, controller_epoch=CONTROLLER_EPOCH), (1,)),)


def leader_and_isr(tag: int) -> LeaderAndIsrRequest:
    return LeaderAndIsrRequest(CONTROLLER_ID, CONTROLLER_EPOCH, BROKER_EPOCH, _state(tag), (1,))


def stop_replica(tag: int) -> StopReplicaRequest:
    return StopReplicaRequest(CONTROLLER_ID, CONTROLLER_EPOCH, BROKER_EPOCH, ((TopicPartition("t", tag), False),))


def update_metadata(tag: int) -> UpdateMetadataRequest:
    return UpdateMetadataRequest(CONTROLLER_ID, CONTROLLER_EPOCH, BROKER_EPOCH, _state(tag), (1,))



@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def manager(registry: CollectorRegistry) -> AsyncIterator[ControllerChannelManager]:
    m = ControllerChannelManager(CONTROLLER_ID, registry=registry)
    try:
        yield m
    finally:
        m.shutdown()
        await asyncio.sleep(0)  # let the senders see their cancellation before the servers stop


def sample(registry: CollectorRegistry, name: str, broker_id: int, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"broker_id": str(broker_id), **labels})


async def test_queue_size_and_queue_time_per_broker_while_a_broker_is_paused(
        manager: ControllerChannelManager, registry: CollectorRegistry) -> None:
    paused, healthy = FakeBroker(), FakeBroker()
    paused.gate.clear()
    servers = [await serve(paused), await serve(healthy)]
    try:
        manager.add_broker(endpoint(1, servers[0][1]))
        manager.add_broker(endpoint(2, servers[1][1]))
        requests: list[ControlRequest] = [update_metadata(i) for i in range(5)]
        enqueued_s = time.monotonic()
        manager.send({1: requests, 2: requests}, {})

        # Broker 1 holds the first request: it is in flight, the other four wait in its queue.
        await until(lambda: len(paused.attempts) == 1, DELIVERY_TIMEOUT_S, "the paused broker receives the first request")
        await until(lambda: len(healthy.delivered) == 5, DELIVERY_TIMEOUT_S, "the healthy broker gets all five")
        assert manager.queue_size(1) == 4 and manager.queue_size(2) == 0
        assert sample(registry, "gregor_controller_channel_queue_size", 1) == 4
        assert sample(registry, "gregor_controller_channel_queue_size", 2) == 0
        assert sample(registry, "gregor_controller_channel_queue_time_seconds_count", 1) == 1
        assert sample(registry, "gregor_controller_channel_queue_time_seconds_count", 2) == 5

        await asyncio.sleep(max(0.0, enqueued_s + PAUSE_S - time.monotonic()))
        assert paused.delivered == [] and manager.queue_size(1) == 4, "nothing overtakes the held request"
        paused.gate.set()
        await until(lambda: len(paused.delivered) == 5, DELIVERY_TIMEOUT_S, "the resumed broker gets the rest")
        assert paused.delivered == [("UpdateMetadata", i) for i in range(5)]
        assert sample(registry, "gregor_controller_channel_queue_size", 1) == 0

        # Queue time is enqueue -> send start: the four that waited behind the paused answer waited >= PAUSE_S,
        # the first one (sent at once) well under the 0.25 s bucket; broker 2 never made anyone wait.
        name = "gregor_controller_channel_queue_time_seconds"
        assert sample(registry, f"{name}_count", 1) == 5
        assert (sample(registry, f"{name}_sum", 1) or 0.0) >= 4 * PAUSE_S
        assert sample(registry, f"{name}_bucket", 1, le="0.25") == 1
        assert sample(registry, f"{name}_bucket", 1, le="0.5") == 1
        assert sample(registry, f"{name}_bucket", 2, le="0.25") == 5
    finally:
        for server, _ in servers:
            await server.stop(None)


async def test_unavailable_broker_is_retried_with_doubling_backoff_and_order_is_kept(
        manager: ControllerChannelManager, registry: CollectorRegistry) -> None:
    failures = 3
    fake = FakeBroker(fail_first=failures)
    server, port = await serve(fake)
    try:
        manager.add_broker(endpoint(1, port))
        manager.send({1: [leader_and_isr(0), stop_replica(1), update_metadata(2)]}, {})
        await until(lambda: len(fake.delivered) == 3, DELIVERY_TIMEOUT_S, "all three delivered after the failures")
        assert fake.delivered == [("LeaderAndIsr", 0), ("StopReplica", 1), ("UpdateMetadata", 2)]
        # The first request was resent until answered; the next ones waited behind it and went once each.
        assert [tag for _, tag, _ in fake.attempts] == [0] * (failures + 1) + [1, 2]
        tries = fake.attempts_of(0)
        gaps = [b - a for a, b in zip(tries, tries[1:])]
        expected = [channel_manager.RETRY_BACKOFF_S * 2 ** k for k in range(failures)]  # 0.1, 0.2, 0.4 s
        assert all(g >= e for g, e in zip(gaps, expected)), (gaps, expected)
        assert gaps[-1] < expected[-1] + 2.0, f"backoff far longer than configured: {gaps}"
        assert sample(registry, "gregor_controller_channel_send_errors_total", 1, api="LeaderAndIsr") == failures
        assert sample(registry, "gregor_controller_channel_send_errors_total", 1, api="StopReplica") is None
    finally:
        await server.stop(None)


async def test_requests_queued_while_a_broker_is_down_arrive_once_it_listens(
        manager: ControllerChannelManager) -> None:
    port = free_port()
    manager.add_broker(endpoint(1, port))  # nothing listens there yet: every send fails with UNAVAILABLE
    manager.send({1: [update_metadata(0), leader_and_isr(1)]}, {})
    await asyncio.sleep(0.5)  # several failed sends and backoffs
    fake = FakeBroker()
    server, bound = await serve(fake, port)
    assert bound == port
    try:
        # Backoff is capped at RETRY_BACKOFF_MAX_S, gRPC's reconnect backoff at 1 s (CHANNEL_OPTIONS).
        await until(lambda: len(fake.delivered) == 2, channel_manager.RETRY_BACKOFF_MAX_S + 5, "delivered once the broker listens")
        assert fake.delivered == [("UpdateMetadata", 0), ("LeaderAndIsr", 1)]
    finally:
        await server.stop(None)


# Answers that a resend cannot change: a newer controller or broker incarnation, a malformed request, a bug.
@pytest.mark.parametrize("code", [errors.Code.STALE_CONTROLLER_EPOCH, errors.Code.STALE_BROKER_EPOCH,
                                  errors.Code.INVALID_REQUEST, errors.Code.UNKNOWN_SERVER_ERROR],
                         ids=errors.code_name)
async def test_final_errors_are_not_retried(manager: ControllerChannelManager, registry: CollectorRegistry,
                                            code: int) -> None:
    fake = FakeBroker(refuse={0: errors.error_for(code, "refused by the test broker")})
    server, port = await serve(fake)
    try:
        manager.add_broker(endpoint(1, port))
        manager.send({1: [leader_and_isr(0), leader_and_isr(1)]}, {})
        await until(lambda: fake.delivered == [("LeaderAndIsr", 1)], DELIVERY_TIMEOUT_S, "the next request goes through")
        assert len(fake.attempts_of(0)) == 1, "a final answer is not resent"
        await asyncio.sleep(3 * channel_manager.RETRY_BACKOFF_S)  # a resend would have happened by now
        assert len(fake.attempts_of(0)) == 1
        assert sample(registry, "gregor_controller_channel_send_errors_total", 1, api="LeaderAndIsr") == 1
    finally:
        await server.stop(None)


async def test_removed_broker_drops_its_queue_and_its_metrics(manager: ControllerChannelManager,
                                                              registry: CollectorRegistry) -> None:
    fake = FakeBroker()
    fake.gate.clear()
    server, port = await serve(fake)
    try:
        manager.add_broker(endpoint(1, port))
        manager.send({1: [update_metadata(i) for i in range(3)]}, {})
        await until(lambda: len(fake.attempts) == 1, DELIVERY_TIMEOUT_S, "the first request is in flight")
        assert sample(registry, "gregor_controller_channel_queue_size", 1) == 2
        manager.remove_broker(1)
        assert manager.broker_ids == set() and manager.queue_size(1) == 0
        assert sample(registry, "gregor_controller_channel_queue_size", 1) is None
        fake.gate.set()
        await asyncio.sleep(3 * channel_manager.RETRY_BACKOFF_S)
        # The request already in flight may still be answered; the two queued behind it are never sent.
        assert [tag for _, tag, _ in fake.attempts] == [0], "a removed broker's queue is dropped"
        assert fake.delivered in ([], [("UpdateMetadata", 0)])
    finally:
        await server.stop(None)
