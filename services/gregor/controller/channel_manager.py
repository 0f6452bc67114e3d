"""The controller's ControllerChannelManager (seed 001): one request queue and one sender task per live broker.

The event task enqueues LeaderAndIsr / UpdateMetadata / StopReplica requests, already
converted to protos, and never waits for them; each broker's RequestSender sends its
queue in order, one request at a time, retrying with backoff until the broker
answers or the broker is removed (it died, bounced, or the controller resigned).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from gregor.common import errors
from gregor.common.metrics import LATENCY_BUCKETS_S
from gregor.common.rpc import channel
from gregor.controller.requests import (ControlRequest, LeaderAndIsrRequest, PartitionStateInfo, StopReplicaRequest,
                                        UpdateMetadataRequest)
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

RETRY_BACKOFF_S = 0.1  # Kafka's RequestSendThread backoff() pause before a resend
RETRY_BACKOFF_MAX_S = 2.0  # doubling stops here, so a returning broker is reached within 2 s
REQUEST_TIMEOUT_S = 30.0  # controller.socket.timeout.ms: one control request's deadline
# Answers that will not change on a resend: the request is dropped.
_FINAL_CODES = frozenset({errors.Code.STALE_CONTROLLER_EPOCH, errors.Code.STALE_BROKER_EPOCH,
                          errors.Code.INVALID_REQUEST, errors.Code.UNKNOWN_SERVER_ERROR})


# Channel-closing tasks, referenced until done so they are not garbage-collected mid-way.
_CLOSING: set[asyncio.Task[None]] = set()


class ChannelMetrics:
    """Per-broker queue size and queue time (Kafka's QueueSize and RequestRateAndQueueTimeMs)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.queue_size = Gauge("gregor_controller_channel_queue_size",
                                "Control requests waiting to be sent to a broker.", ["broker_id"], registry=registry)
        self.queue_time = Histogram("gregor_controller_channel_queue_time_seconds",
                                    "Time control requests waited before their send began.", ["broker_id"],
                                    buckets=LATENCY_BUCKETS_S, registry=registry)
        self.send_errors = Counter("gregor_controller_channel_send_errors_total",
                                   "Failed sends of control requests (each retry counts).", ["broker_id", "api"],
                                   registry=registry)


# Told of every LeaderAndIsr a broker answered: (broker id, request, response). Runs on the loop, outside the
# event task: it may only enqueue an event (the controller's LeaderAndIsrResponseReceived).
LeaderAndIsrResponseHandler = Callable[[int, broker_pb2.LeaderAndIsrRequest, broker_pb2.LeaderAndIsrResponse], None]


@dataclass(frozen=True)
class _QueueItem:
    api: str
    request: Message
    enqueue_time_s: float


class RequestSender:
    """Sends one broker's control requests in order (Kafka's RequestSendThread).

    Concurrency: one asyncio task drains the queue and owns the gRPC channel; the
    controller's event task only enqueues. `close()` cancels the task and drops
    whatever is still queued.
    """

    def __init__(self, broker_id: int, address: str, metrics: ChannelMetrics,
                 on_leader_and_isr_response: LeaderAndIsrResponseHandler | None = None) -> None:
        self.broker_id = broker_id
        self._on_leader_and_isr_response = on_leader_and_isr_response
        self.address = address
        self._metrics = metrics
        self._label = str(broker_id)
        self._queue: asyncio.Queue[_QueueItem] = asyncio.Queue()
        self._channel = channel(address)
        self._stub = broker_pb2_grpc.BrokerControlServiceStub(self._channel)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"controller-sender-{broker_id}")
        self._task.add_done_callback(self._on_task_done)

    def enqueue(self, api: str, request: Message) -> None:
        self._queue.put_nowait(_QueueItem(api, request, time.monotonic()))
        self._metrics.queue_size.labels(broker_id=self._label).set(self._queue.qsize())

    def queue_size(self) -> int:
        return self._queue.qsize()

    def close(self) -> None:
        """Cancel the sender task; the channel closes in the background once the task is gone."""
        self._task.cancel()
        closing = asyncio.get_running_loop().create_task(self._close_channel(), name=f"close-sender-{self.broker_id}")
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)
        for metric in (self._metrics.queue_size, self._metrics.queue_time):
            try:
                metric.remove(self._label)
            except KeyError:
                pass

    async def _close_channel(self) -> None:
        await asyncio.gather(self._task, return_exceptions=True)
        await self._channel.close()

    async def _run(self) -> None:
        while True:
            item = await self._queue.get()
            self._metrics.queue_size.labels(broker_id=self._label).set(self._queue.qsize())
            self._metrics.queue_time.labels(broker_id=self._label).observe(time.monotonic() - item.enqueue_time_s)
            await self._send_until_answered(item)

    async def _send_until_answered(self, item: _QueueItem) -> None:
        backoff_s = RETRY_BACKOFF_S
        while True:
            try:
                response = await getattr(self._stub, item.api)(item.request, timeout=REQUEST_TIMEOUT_S)
            except grpc.RpcError as exc:
                self._metrics.send_errors.labels(broker_id=self._label, api=item.api).inc()
                err = errors.from_rpc_error(exc)
                if err.code in _FINAL_CODES:
                    log.warning("broker %d refused %s: %s; dropping it", self.broker_id, item.api, err)
                    return
                log.info("sending %s to broker %d at %s failed (%s); retrying in %.1f s", item.api, self.broker_id,
                         self.address, err, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)
                continue
            storage_errors = []
            for pe in getattr(response, "partition_errors", ()):
                if pe.error == errors.Code.KAFKA_STORAGE_ERROR:  # an offline log dir: one line, not one each
                    storage_errors.append(f"{pe.topic}-{pe.partition}")
                elif pe.error == errors.Code.STALE_CONTROLLER_EPOCH:
                    # The broker already holds this leader epoch (a resend on failover or broker change):
                    # it ignores the partition, as Kafka's brokers do; nothing to act on.
                    log.debug("broker %d: %s for %s-%d already applied", self.broker_id, item.api, pe.topic,
                              pe.partition)
                elif pe.error:
                    log.warning("broker %d: %s for %s-%d: %s", self.broker_id, item.api, pe.topic, pe.partition,
                                errors.code_name(pe.error))
            if storage_errors:
                log.info("broker %d: %s answered KAFKA_STORAGE_ERROR (offline log dir) for %d partitions: %s",
                         self.broker_id, item.api, len(storage_errors), ", ".join(storage_errors[:10])
                         + (" ..." if len(storage_errors) > 10 else ""))
            if item.api == "LeaderAndIsr" and self._on_leader_and_isr_response is not None:
                try:
                    self._on_leader_and_isr_response(self.broker_id, item.request, response)
                except Exception:  # the sender goes on whatever the controller's handler does
                    log.exception("handling broker %d's LeaderAndIsr answer failed", self.broker_id)
            return

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("sender to broker %d died; its queued requests are lost", self.broker_id,
                      exc_info=task.exception())


class ControllerChannelManager:
    """A RequestSender per live broker, added and removed on membership changes.

    Concurrency: every method runs on the controller's event task (it owns
    `endpoints` and the sender map); the senders run on their own tasks.
    """

    def __init__(self, controller_id: int, registry: CollectorRegistry = REGISTRY) -> None:
        self.controller_id = controller_id
        self.metrics = ChannelMetrics(registry)
        self.endpoints: dict[int, common_pb2.BrokerEndpoint] = {}
        self._senders: dict[int, RequestSender] = {}
        self._topic_ids: dict[str, bytes] = {}
        self._state_pbs: dict[PartitionStateInfo, broker_pb2.LeaderAndIsrPartitionState] = {}
        # The controller's LeaderAndIsrResponseReceived (set by the controller; None: answers are only logged).
        self.on_leader_and_isr_response: LeaderAndIsrResponseHandler | None = None

    @property
    def broker_ids(self) -> set[int]:
        return set(self._senders)

    def add_broker(self, endpoint: common_pb2.BrokerEndpoint) -> None:
        """Start a sender for a broker (Kafka's addBroker); a known id keeps its sender."""
        self.endpoints[endpoint.broker_id] = endpoint
        if endpoint.broker_id not in self._senders:
            address = f"{endpoint.host}:{endpoint.grpc_port}"
            self._senders[endpoint.broker_id] = RequestSender(endpoint.broker_id, address, self.metrics,
                                                              self._leader_and_isr_answered)

    def _leader_and_isr_answered(self, broker_id: int, request: broker_pb2.LeaderAndIsrRequest,
                                 response: broker_pb2.LeaderAndIsrResponse) -> None:
        if self.on_leader_and_isr_response is not None:
            self.on_leader_and_isr_response(broker_id, request, response)

    def remove_broker(self, broker_id: int) -> None:
        """Stop a broker's sender and drop its queue (Kafka's removeBroker)."""
        self.endpoints.pop(broker_id, None)
        sender = self._senders.pop(broker_id, None)
        if sender is not None:
            sender.close()

    def shutdown(self) -> None:
        for broker_id in list(self._senders):
            self.remove_broker(broker_id)
        self.endpoints.clear()

    def queue_size(self, broker_id: int) -> int:
        sender = self._senders.get(broker_id)
        return sender.queue_size() if sender is not None else 0

    def send(self, requests: Mapping[int, Iterable[ControlRequest]], topic_configs: Mapping[str, Mapping[str, str]],
             deleted_topics: Iterable[str] = (), topic_ids: Mapping[str, bytes] | None = None) -> None:
        """Enqueue each broker's requests in order; brokers without a sender are skipped (Kafka does too).

        Every partition state carries its topic's id (KIP-516) from `topic_ids`.
        """
        deleted = sorted(deleted_topics)
        self._topic_ids = dict(topic_ids or {})
        # One proto per distinct partition state in this send: a failover's UpdateMetadata carries every
        # partition to every broker and its LeaderAndIsr each replica, the same states again (at 10,000
        # partitions on 3 brokers, 60,000 protos built one by one on the event task became 10,000).
        self._state_pbs = {}
        try:
            for broker_id, reqs in requests.items():
                sender = self._senders.get(broker_id)
                if sender is None:
                    log.debug("no sender for broker %d; dropping %d requests", broker_id, len(list(reqs)))
                    continue
                for req in reqs:
                    for api, message in self._to_proto(req, topic_configs, deleted):
                        sender.enqueue(api, message)
        finally:
            self._state_pbs = {}

    def _state_pb(self, info: PartitionStateInfo) -> broker_pb2.LeaderAndIsrPartitionState:
        pb = self._state_pbs.get(info)
        if pb is None:
            pb = self._state_pbs[info] = partition_state_pb(info, self._topic_ids)
        return pb

    def _to_proto(self, req: ControlRequest, topic_configs: Mapping[str, Mapping[str, str]],
                  deleted: list[str]) -> list[tuple[str, Message]]:
        if isinstance(req, LeaderAndIsrRequest):
            topics = {s.topic_partition.topic for s in req.partition_states}
            return [("LeaderAndIsr", broker_pb2.LeaderAndIsrRequest(
                controller_id=req.controller_id, controller_epoch=req.controller_epoch, broker_epoch=req.broker_epoch,
                partition_states=[self._state_pb(s) for s in req.partition_states],
                live_leaders=self._endpoints(req.live_leaders),
                topic_configs={t: broker_pb2.TopicConfig(entries=dict(topic_configs.get(t, {}))) for t in topics}))]
        if isinstance(req, UpdateMetadataRequest):
            return [("UpdateMetadata", broker_pb2.UpdateMetadataRequest(
                controller_id=req.controller_id, controller_epoch=req.controller_epoch, broker_epoch=req.broker_epoch,
                partition_states=[self._state_pb(s) for s in req.partition_states],
                live_brokers=self._endpoints(req.live_brokers), deleted_topics=deleted))]
        assert isinstance(req, StopReplicaRequest)
        # The proto has one delete flag per request: one request per flag value.
        out: list[tuple[str, Message]] = []
        for delete in (False, True):
            parts = [common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                     for tp, d in req.partitions if d is delete]
            if parts:
                out.append(("StopReplica", broker_pb2.StopReplicaRequest(
                    controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                    broker_epoch=req.broker_epoch, partitions=parts, delete_partitions=delete)))
        return out

    def _endpoints(self, broker_ids: Iterable[int]) -> list[common_pb2.BrokerEndpoint]:
        return [self.endpoints[b] for b in sorted(broker_ids) if b in self.endpoints]


def partition_state_pb(info: PartitionStateInfo,
                       topic_ids: Mapping[str, bytes] | None = None) -> broker_pb2.LeaderAndIsrPartitionState:
    lai = info.leader_and_isr
    return broker_pb2.LeaderAndIsrPartitionState(
        topic=info.topic_partition.topic, partition=info.topic_partition.partition,
        controller_epoch=lai.controller_epoch, leader=lai.leader, leader_epoch=lai.leader_epoch, isr=list(lai.isr),
        partition_epoch=lai.partition_epoch, replicas=list(info.replicas), is_new=info.is_new,
        topic_id=(topic_ids or {}).get(info.topic_partition.topic, b""), offline_replicas=list(info.offline_replicas))
