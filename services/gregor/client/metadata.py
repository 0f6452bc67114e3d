"""Cluster metadata cache of a client: brokers, partition leaders, and one gRPC channel per broker.

Concurrency: event-loop owned; refreshes are coalesced (one Metadata RPC in
flight at a time, callers share its result).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import grpc

from gregor.common.tls import TlsConfig
from gregor.common import errors
from gregor.common import rpc
from gregor.common.quotas import CLIENT_ID_METADATA
from gregor.rpc.v1 import broker_pb2, broker_pb2_grpc

# Errors after which the leader we know is probably wrong (Kafka's invalidMetadata set).
# Leader epochs (KIP-320; the consumer's fetches carry the epoch this cache holds):
# FENCED_LEADER_EPOCH means ours is older than the broker's, so a refresh is due, and the
# error's leader hint (request_update) moves the partition at once. UNKNOWN_LEADER_EPOCH
# means ours is newer: the broker has not applied that LeaderAndIsr yet, and the caller
# backs off (retry.backoff.ms) and retries. Kafka's consumer does not refresh for it; we
# do, because without topic ids a topic deleted and created again under the same name
# starts its epochs at 0 again, and a client holding the old, larger epoch would be
# refused until metadata.max.age.ms. A refresh costs one Metadata call per backoff.
STALE_METADATA_CODES = frozenset({
    errors.Code.NOT_LEADER_OR_FOLLOWER, errors.Code.UNKNOWN_TOPIC_OR_PARTITION,
    errors.Code.LEADER_NOT_AVAILABLE, errors.Code.FENCED_LEADER_EPOCH,
    errors.Code.UNKNOWN_LEADER_EPOCH, errors.Code.NETWORK_EXCEPTION,
    errors.Code.BROKER_NOT_AVAILABLE, errors.Code.REPLICA_NOT_AVAILABLE,
    # Kafka's KafkaStorageException is an InvalidMetadataException: the leader's log dir is offline and the
    # controller moves leadership off it, so the retry looks the leader up again.
    errors.Code.KAFKA_STORAGE_ERROR,
})


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    host: str
    grpc_port: int
    data_port: int = 0
    rack: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error: int = 0


@dataclass
class TopicInfo:
    name: str
    partitions: list[PartitionInfo] = field(default_factory=list)
    error: int = 0
    is_internal: bool = False
    topic_id: bytes = b""  # KIP-516; b"" when the topic is unknown or the cluster sends no ids


class _WithCallMetadata:
    """A multicallable whose calls carry `metadata` first (then whatever the caller passes)."""

    __slots__ = ("_call", "_metadata")

    def __init__(self, call: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._call, self._metadata = call, metadata

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._call(*args, metadata=self._metadata if not metadata else (*self._metadata, *metadata),
                          **kwargs)


class ClientIdChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A channel every call of which carries the client's client.id as `client-id` metadata, as every
    Kafka request header carries it: the brokers' and coordinators' client quotas (request_percentage,
    byte rates) and request logs key on it. Unary and streaming calls alike, whatever the stub; the
    calls themselves are the channel's own (no interceptor: grpc.aio's wrap each call in a task, and
    each write of a stream in another)."""

    def __init__(self, channel: grpc.aio.Channel, client_id: str) -> None:
        self._channel = channel
        self._metadata = ((CLIENT_ID_METADATA, client_id),)

    async def __aenter__(self) -> "ClientIdChannel":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close(None)

    async def close(self, grace: Optional[float] = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithCallMetadata(self._channel.unary_unary(*args, **kwargs), self._metadata)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithCallMetadata(self._channel.unary_stream(*args, **kwargs), self._metadata)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithCallMetadata(self._channel.stream_unary(*args, **kwargs), self._metadata)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithCallMetadata(self._channel.stream_stream(*args, **kwargs), self._metadata)


def call_error(exc: BaseException) -> errors.GregorError:
    """Any failure of an RPC as a GregorError (never a raw RpcError)."""
    if isinstance(exc, errors.GregorError):
        return exc
    if isinstance(exc, grpc.RpcError):
        return errors.from_rpc_error(exc)
    if isinstance(exc, asyncio.TimeoutError):
        return errors.RequestTimedOutError("request timed out")  # type: ignore[attr-defined]
    return errors.NetworkExceptionError(f"{type(exc).__name__}: {exc}")  # type: ignore[attr-defined]


class ClusterMetadata:
    """Brokers and topics as the last Metadata answer described them (event-loop owned)."""

    def __init__(self, bootstrap: Sequence[str], *, request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, metadata_max_age_ms: int = 300000,
                 security: "TlsConfig | None" = None, client_id: str = "") -> None:
        if not bootstrap:
            raise errors.InvalidConfigError("bootstrap.servers is empty")  # type: ignore[attr-defined]
        self.bootstrap = list(bootstrap)
        self.security = security  # TLS of every channel (None: the process's, gregor.common.tls)
        self.client_id = client_id  # client.id: every call on these channels carries it ("": none)
        self.request_timeout_s = request_timeout_ms / 1000
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.max_age_s = metadata_max_age_ms / 1000
        self.cluster_id = ""
        self.controller_id = -1
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.updated_at = 0.0
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._refresh: Optional[asyncio.Task[None]] = None
        self._wanted: set[str] = set()
        self._refreshed_at = 0.0  # when the last refresh attempt ended
        # (topic, partition) -> (leader epoch a leader hint set, until when older answers are overruled)
        self._hinted: dict[tuple[str, int], tuple[int, float]] = {}
        self._closed = False

    # ------------------------------------------------------------ channels
    def channel(self, address: str) -> grpc.aio.Channel:
        """The pooled channel to host:port (100 MiB message limits, as the servers); every call on it
        carries client.id (ClientIdChannel), so no caller passes it."""
        ch = self._channels.get(address)
        if ch is None:
            ch = rpc.channel(address, self.security)
            if self.client_id:
                ch = ClientIdChannel(ch, self.client_id)
            self._channels[address] = ch
        return ch

    def broker_address(self, broker_id: int) -> str:
        broker = self.brokers.get(broker_id)
        if broker is None:
            raise errors.BrokerNotAvailableError(f"broker {broker_id} is not in the metadata")  # type: ignore[attr-defined]
        return broker.address

    def broker_stub(self, broker_id: int) -> broker_pb2_grpc.BrokerServiceStub:
        return broker_pb2_grpc.BrokerServiceStub(self.channel(self.broker_address(broker_id)))

    def any_address(self) -> str:
        known = [b.address for b in self.brokers.values()]
        return random.choice(known or self.bootstrap)

    async def close(self) -> None:
        self._closed = True
        if self._refresh is not None:
            self._refresh.cancel()
        channels, self._channels = list(self._channels.values()), {}
        await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)

    # ------------------------------------------------------------ lookups
    def partitions_for(self, topic: str) -> list[PartitionInfo]:
        info = self.topics.get(topic)
        return info.partitions if info is not None and not info.error else []

    def partition(self, topic: str, partition: int) -> Optional[PartitionInfo]:
        for p in self.partitions_for(topic):
            if p.partition == partition:
                return p
        return None

    def topic_id(self, topic: str) -> bytes:
        """The topic's id (KIP-516) as the last metadata answer said; b"" when unknown."""
        info = self.topics.get(topic)
        return info.topic_id if info is not None else b""

    def leader_for(self, topic: str, partition: int) -> int:
        """Leader broker id, -1 when unknown or offline."""
        p = self.partition(topic, partition)
        return p.leader if p is not None and p.leader in self.brokers else -1

    @property
    def stale(self) -> bool:
        return time.monotonic() - self.updated_at > self.max_age_s

    def refresh_backoff_left(self, now: float) -> float:
        """Seconds until another refresh may start: retry.backoff.ms after the last one ended
        (Kafka's Metadata.timeToAllowUpdate), so a cluster mid-failover is not hammered."""
        return max(0.0, self._refreshed_at + self.retry_backoff_s - now)

    def connectable(self, broker_id: int) -> bool:
        """False while the channel to the broker is failing (Kafka's NetworkClient.ready() false for a
        node whose connection failed): the sender holds its batches instead of failing them."""
        broker = self.brokers.get(broker_id)
        ch = self._channels.get(broker.address) if broker is not None else None
        return ch is None or ch.get_state(try_to_connect=False) != grpc.ChannelConnectivity.TRANSIENT_FAILURE

    # ------------------------------------------------------------ refresh
    def add_topics(self, *topics: str) -> None:
        self._wanted.update(topics)

    async def refresh(self, topics: Sequence[str] | None = None) -> None:
        """One Metadata round trip (shared with concurrent callers); GregorError if no broker answers."""
        if topics:
            self._wanted.update(topics)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._do_refresh())
        try:
            await asyncio.shield(self._refresh)
        finally:
            if self._refresh.done():
                self._refreshed_at = time.monotonic()

    def request_update(self, err: errors.GregorError | None = None) -> None:
        """Mark metadata stale after err (refreshed by the next caller that needs it).

        A NOT_LEADER_OR_FOLLOWER (or fenced epoch) that names the current leader and a newer
        leader epoch moves the partition to that leader right away (KIP-951, Kafka 3.7+):
        the retry goes there without waiting for the Metadata round trip.
        """
        if err is None or err.code in STALE_METADATA_CODES:
            self.updated_at = 0.0
        if err is not None and err.leader_id >= 0 and err.topic:
            self._apply_leader_hint(err.topic, err.partition, err.leader_id, err.leader_epoch)

    def _apply_leader_hint(self, topic: str, partition: int, leader: int, leader_epoch: int) -> None:
        info = self.topics.get(topic)
        if info is None or leader not in self.brokers:
            return
        for i, p in enumerate(info.partitions):
            if p.partition == partition and leader_epoch > p.leader_epoch:
                info.partitions[i] = dataclasses.replace(p, leader=leader, leader_epoch=leader_epoch)
                self._hinted[(topic, partition)] = (leader_epoch, time.monotonic() + self.request_timeout_s)
                return

    async def _do_refresh(self) -> None:
        addresses = [b.address for b in self.brokers.values()] + self.bootstrap
        failures: dict[str, str] = {}
        # Every known broker, then the bootstrap list: the first answer wins. Brokers whose
        # channel is failing (e.g. the leader that just died) go last, as Kafka asks the least
        # loaded *connectable* node.
        for address in sorted(dict.fromkeys(addresses), key=self._failing):
            stub = broker_pb2_grpc.BrokerServiceStub(self.channel(address))
            try:
                resp = await stub.Metadata(broker_pb2.MetadataRequest(topics=sorted(self._wanted)),
                                           timeout=self.request_timeout_s)
            except (grpc.RpcError, asyncio.TimeoutError) as exc:
                failures[address] = call_error(exc).message
                continue
            if not resp.brokers:
                # A broker the controller has not reached yet (just restarted) answers from an empty cache:
                # applied, it would make us forget every broker we know. Kafka's client ignores such an
                # answer and asks another node.
                failures[address] = "answered with no brokers (its metadata is not initialized yet)"
                continue
            self._apply(resp)
            return
        raise errors.NetworkExceptionError(  # type: ignore[attr-defined]
            "no broker answered Metadata: " + "; ".join(f"{a}: {m}" for a, m in failures.items()))

    def _failing(self, address: str) -> bool:
        ch = self._channels.get(address)
        return ch is not None and ch.get_state(try_to_connect=False) == grpc.ChannelConnectivity.TRANSIENT_FAILURE

    def _apply(self, resp: broker_pb2.MetadataResponse) -> None:
        self.cluster_id = resp.cluster_id
        self.controller_id = resp.controller_id
        self.brokers = {b.broker_id: BrokerInfo(b.broker_id, b.host, b.grpc_port, b.data_port, b.rack)
                        for b in resp.brokers}
        lagging = False
        for t in resp.topics:
            parts = sorted((PartitionInfo(t.name, p.partition, p.leader, p.leader_epoch, tuple(p.replicas),
                                          tuple(p.isr), tuple(p.offline_replicas), p.error)
                            for p in t.partitions), key=lambda p: p.partition)
            if self._hinted:
                # A broker whose metadata is older than a leader hint we followed must not move the
                # partition back to the old leader (Kafka keeps the newer leader epoch); ask again.
                # Without topic ids a hint only overrules answers for request.timeout.ms (a recreated
                # topic starts its epochs again).
                now = time.monotonic()
                previous = self.topics.get(t.name)
                if previous is not None and previous.topic_id and t.topic_id and previous.topic_id != t.topic_id:
                    # Another topic under the same name: its epochs start again, old hints mean nothing.
                    for p in parts:
                        self._hinted.pop((t.name, p.partition), None)
                for i, p in enumerate(parts):
                    hinted, until = self._hinted.pop((t.name, p.partition), (-1, 0.0))
                    old = self.partition(t.name, p.partition)
                    if hinted > p.leader_epoch and now < until and old is not None and old.leader_epoch == hinted:
                        parts[i] = dataclasses.replace(p, leader=old.leader, leader_epoch=hinted)
                        self._hinted[(t.name, p.partition)] = (hinted, until)
                        lagging = True
            self.topics[t.name] = TopicInfo(t.name, parts, t.error, t.is_internal, bytes(t.topic_id))
        # Behind a leader hint: ask again after retry.backoff.ms rather than trust this answer for long.
        self.updated_at = time.monotonic() - (self.max_age_s if lagging else 0.0)

    async def wait_for_topic(self, topic: str, max_wait_ms: int, partition: int = 0) -> list[PartitionInfo]:
        """Partitions of topic, refreshing until it is known with partition among them or max_wait_ms
        passed (Kafka's waitOnMetadata: a partition beyond the known count may just have been added)."""
        deadline = time.monotonic() + max_wait_ms / 1000
        if topic not in self._wanted:
            self._wanted.add(topic)
            self.updated_at = 0.0
        while True:
            parts = self.partitions_for(topic)
            if len(parts) > partition and not self.stale:
                return parts
            try:
                await self.refresh([topic])
            except errors.GregorError:
                if time.monotonic() >= deadline:
                    raise
            parts = self.partitions_for(topic)
            if len(parts) > partition:
                return parts
            info = self.topics.get(topic)
            if info is not None and info.error == errors.Code.TOPIC_AUTHORIZATION_FAILED:
                # Kafka's waitOnMetadata: an unauthorized topic fails the send at once (no wait for it to appear).
                raise errors.error_for(info.error, f"not authorized to access topic {topic!r}", topic=topic)
            if time.monotonic() >= deadline:
                code = info.error if info is not None and info.error else errors.Code.UNKNOWN_TOPIC_OR_PARTITION
                what = f"partition {partition} of topic {topic!r} with partition count {len(parts)}" if parts \
                    else f"topic {topic!r}"
                raise errors.error_for(code, f"{what} not present in metadata after {max_wait_ms} ms",
                                       topic=topic, **({"partition": partition} if parts else {}))
            await asyncio.sleep(self.retry_backoff_s)

    async def leader_stub(self, topic: str, partition: int, max_wait_ms: int) -> tuple[
            int, broker_pb2_grpc.BrokerServiceStub]:
        """(leader id, stub) of a partition, refreshing metadata until a leader is known."""
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            leader = self.leader_for(topic, partition)
            if leader >= 0 and not self.stale:
                return leader, self.broker_stub(leader)
            try:
                await self.refresh([topic])
            except errors.GregorError:
                if time.monotonic() >= deadline:
                    raise
            leader = self.leader_for(topic, partition)
            if leader >= 0:
                return leader, self.broker_stub(leader)
            if time.monotonic() >= deadline:
                if self.topics.get(topic) is None or not self.partitions_for(topic):
                    raise errors.UnknownTopicOrPartitionError(  # type: ignore[attr-defined]
                        f"unknown topic {topic!r}", topic=topic, partition=partition)
                if self.partition(topic, partition) is None:
                    raise errors.UnknownTopicOrPartitionError(  # type: ignore[attr-defined]
                        f"topic {topic!r} has no partition {partition}", topic=topic, partition=partition)
                raise errors.LeaderNotAvailableError(  # type: ignore[attr-defined]
                    "no leader", topic=topic, partition=partition)
            await asyncio.sleep(self.retry_backoff_s)


async def list_offset(metadata: ClusterMetadata, tp: tuple[str, int], timestamp_ms: int, isolation: int,
                      timeout_ms: int, backoff_s: float) -> tuple[int, int]:
    """ListOffsets on the leader: (offset, timestamp) for -2 earliest, -1 latest, else the first offset at or
    after the time; retriable errors (leader moved) refresh the metadata and retry until timeout_ms."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            _, stub = await metadata.leader_stub(tp[0], tp[1], timeout_ms)
            resp = await stub.ListOffsets(broker_pb2.ListOffsetsRequest(
                topic=tp[0], partition=tp[1], timestamp_ms=timestamp_ms, isolation_level=isolation),  # type: ignore[arg-type]
                timeout=timeout_ms / 1000)
            return int(resp.offset), int(resp.timestamp_ms)
        except (grpc.RpcError, asyncio.TimeoutError, errors.GregorError) as exc:
            err = call_error(exc)
            if not err.retriable or time.monotonic() >= deadline:
                raise err from None
            metadata.request_update(err)
            await asyncio.sleep(backoff_s)
