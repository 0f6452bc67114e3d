"""One partition's fetch transport: gRPC Fetch (default) or the broker's zero-copy data port.

`fetch.transport=data` reads from the raw TCP port that sends segment bytes
with sendfile(2) (framing in gregor/broker/data_port.py); the answer is the
same FetchResponse fields plus whole record batches, so the consumer does not
care which one it uses.
"""

from __future__ import annotations

import asyncio
import struct
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import grpc
from google.protobuf.message import DecodeError

from gregor.common.aio import wait_for
from gregor.common.tls import client_ssl
from gregor.client.metadata import ClusterMetadata, call_error
from gregor.client.throttles import Throttles
from gregor.common import errors
from gregor.rpc.v1 import broker_pb2

FRAME = struct.Struct(">I")
TopicPartition = tuple[str, int]


@dataclass
class FetchResult:
    records: bytes
    high_watermark: int
    log_start_offset: int
    leader_epoch: int
    # read_committed: (producer id, first offset) of the aborted transactions in range.
    aborted_transactions: tuple[tuple[int, int], ...] = ()
    last_stable_offset: int = -1


def aborted_of(resp: broker_pb2.FetchResponse) -> tuple[tuple[int, int], ...]:
    return tuple((a.producer_id, a.first_offset) for a in resp.aborted_transactions)


class FetchThrottles(Throttles):
    """A consumer's throttled brokers (KIP-219, client/throttles.py) and Kafka's fetch-throttle-time sensor,
    shared by the consumer's per-partition fetch loops: a broker that answered with throttle_time_ms gets no
    fetch from this consumer until the time has passed. Concurrency: one event loop."""

    def metrics(self) -> dict[str, float]:
        """Kafka's fetch-throttle-time-avg / -max (ms; over the consumer's life, not a window)."""
        avg = self.throttle_time_ms_total / self.responses if self.responses else 0.0
        return {"fetch-throttle-time-avg": avg, "fetch-throttle-time-max": float(self.throttle_time_ms_max)}


_THROTTLES: "weakref.WeakKeyDictionary[ClusterMetadata, FetchThrottles]" = weakref.WeakKeyDictionary()


def fetch_throttles(metadata: ClusterMetadata) -> FetchThrottles:
    """The throttles of the consumer that owns `metadata` (one ClusterMetadata per consumer)."""
    found = _THROTTLES.get(metadata)
    if found is None:
        found = _THROTTLES[metadata] = FetchThrottles()
    return found


class Fetcher(Protocol):
    async def fetch(self, tp: TopicPartition, offset: int, isolation: int,
                    topic_id: bytes = b"") -> FetchResult: ...

    async def close(self) -> None: ...


class GrpcFetcher:
    """BrokerService.Fetch against the partition leader (stateless apart from the config)."""

    def __init__(self, metadata: ClusterMetadata, cfg: Mapping[str, Any]) -> None:
        self.metadata = metadata
        self.max_bytes = int(cfg["max.partition.fetch.bytes"])
        self.min_bytes = int(cfg["fetch.min.bytes"])
        self.max_wait_ms = int(cfg["fetch.max.wait.ms"])
        self.request_timeout_ms = int(cfg["request.timeout.ms"])
        # client.id: a field of the request for the data port (gRPC calls carry it as metadata: ClusterMetadata).
        self.client_id = metadata.client_id
        self.throttles = fetch_throttles(metadata)

    def request(self, tp: TopicPartition, offset: int, isolation: int, leader: int,
                topic_id: bytes = b"") -> broker_pb2.FetchRequest:
        """A consumer fetch carrying the leader epoch our metadata knows for `leader` (KIP-320).

        The leader answers FENCED_LEADER_EPOCH if our epoch is older than its own (our
        metadata is stale: the consumer refreshes it, following the error's leader hint)
        and UNKNOWN_LEADER_EPOCH if it is newer (the broker has not applied the
        LeaderAndIsr we already know of: the consumer backs off and retries). Without
        a known epoch the field stays absent and the broker skips the check.
        """
        req = broker_pb2.FetchRequest(topic=tp[0], partition=tp[1], fetch_offset=offset, max_bytes=self.max_bytes,
                                      min_bytes=self.min_bytes, max_wait_ms=self.max_wait_ms,
                                      isolation_level=isolation, topic_id=topic_id,  # type: ignore[arg-type]
                                      client_id=self.client_id)
        epoch = self.current_leader_epoch(tp, leader)
        if epoch is not None:
            req.current_leader_epoch = epoch
        return req

    def current_leader_epoch(self, tp: TopicPartition, leader: int) -> Optional[int]:
        """The metadata's leader epoch of tp if it names `leader` as the leader, else None."""
        info = self.metadata.partition(tp[0], tp[1])
        if info is None or info.leader != leader or info.leader_epoch < 0:
            return None
        return info.leader_epoch

    @property
    def timeout_s(self) -> float:
        # The broker may legitimately hold the request for max_wait_ms.
        return (self.max_wait_ms + self.request_timeout_ms) / 1000

    async def fetch(self, tp: TopicPartition, offset: int, isolation: int, topic_id: bytes = b"") -> FetchResult:
        """One fetch; with topic_id (KIP-516) the leader refuses another topic under the same name."""
        leader, stub = await self.metadata.leader_stub(tp[0], tp[1], self.request_timeout_ms)
        await self.throttles.wait(leader)
        try:
            resp = await stub.Fetch(self.request(tp, offset, isolation, leader, topic_id), timeout=self.timeout_s)
        except (grpc.RpcError, asyncio.TimeoutError) as exc:
            raise call_error(exc) from None
        self.throttles.record(leader, resp.throttle_time_ms)
        return FetchResult(resp.records, resp.high_watermark, resp.log_start_offset, resp.leader_epoch,
                           aborted_of(resp), resp.last_stable_offset)

    async def close(self) -> None:
        pass


class DataPortFetcher(GrpcFetcher):
    """Fetch over the leader's raw data port; one connection, reopened when the leader moves."""

    def __init__(self, metadata: ClusterMetadata, cfg: Mapping[str, Any]) -> None:
        super().__init__(metadata, cfg)
        self._conn: Optional[tuple[str, asyncio.StreamReader, asyncio.StreamWriter]] = None
        # TLS to the data port as to the gRPC port (the broker reads and encrypts; no sendfile under TLS).
        self._ssl = client_ssl(getattr(metadata, "security", None))

    async def _connect(self, tp: TopicPartition) -> tuple[int, asyncio.StreamReader, asyncio.StreamWriter]:
        leader, _ = await self.metadata.leader_stub(tp[0], tp[1], self.request_timeout_ms)
        broker = self.metadata.brokers[leader]
        if not broker.data_port:
            raise errors.BrokerNotAvailableError(  # type: ignore[attr-defined]
                f"broker {leader} has no data port; use fetch.transport=grpc")
        address = f"{broker.host}:{broker.data_port}"
        if self._conn is not None and self._conn[0] != address:
            await self.close()
        if self._conn is None:
            try:
                reader, writer = await wait_for(
                    asyncio.open_connection(broker.host, broker.data_port, ssl=self._ssl,
                                            server_hostname=broker.host if self._ssl else None),
                    self.request_timeout_ms / 1000)
            except (OSError, asyncio.TimeoutError) as exc:
                raise errors.NetworkExceptionError(f"data port {address}: {exc}") from None  # type: ignore[attr-defined]
            self._conn = (address, reader, writer)
        return leader, self._conn[1], self._conn[2]

    async def fetch(self, tp: TopicPartition, offset: int, isolation: int, topic_id: bytes = b"") -> FetchResult:
        leader, reader, writer = await self._connect(tp)
        await self.throttles.wait(leader)
        body = self.request(tp, offset, isolation, leader, topic_id).SerializeToString()
        try:
            writer.write(FRAME.pack(len(body)) + body)
            await writer.drain()
            # The whole answer (length, header, records) under one deadline: a broker that stalls
            # mid-answer must not hang the fetch. asyncio.timeout, not wait_for: on Python 3.11
            # wait_for can swallow a cancellation that races with the read completing, and
            # close() then waits forever for this task.
            async with asyncio.timeout(self.timeout_s):
                (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                header = broker_pb2.DataFetchResponseHeader.FromString(await reader.readexactly(size))
                records = await reader.readexactly(header.records_length) if header.records_length else b""
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            await self.close()
            raise errors.NetworkExceptionError(f"data port fetch failed: {exc!r}") from None  # type: ignore[attr-defined]
        except DecodeError as exc:
            await self.close()  # the stream is out of step with the framing: never reuse it
            raise errors.CorruptMessageError(  # type: ignore[attr-defined]
                f"data port answered an undecodable response header: {exc}", topic=tp[0], partition=tp[1]) from None
        except BaseException:
            # Cancelled mid-answer: the connection holds an unread response; never reuse it.
            self._drop()
            raise
        if header.HasField("error") and header.error.code != 0:
            raise errors.from_detail(header.error)
        r = header.response
        self.throttles.record(leader, r.throttle_time_ms)
        return FetchResult(records, r.high_watermark, r.log_start_offset, r.leader_epoch, aborted_of(r),
                           r.last_stable_offset)

    def _drop(self) -> Optional[asyncio.StreamWriter]:
        """Forget the connection and start closing it (no await: safe while being cancelled)."""
        if self._conn is None:
            return None
        writer = self._conn[2]
        self._conn = None
        writer.close()
        return writer

    async def close(self) -> None:
        writer = self._drop()
        if writer is not None:
            try:
                await writer.wait_closed()
            except OSError:
                pass


def make_fetcher(transport: str, metadata: ClusterMetadata, cfg: Mapping[str, Any]) -> GrpcFetcher:
    return DataPortFetcher(metadata, cfg) if transport == "data" else GrpcFetcher(metadata, cfg)
