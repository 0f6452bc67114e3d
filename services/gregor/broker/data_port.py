"""The zero-copy fetch port: record batches go from segment files to the socket with sendfile(2).

gRPC must copy a response into a protobuf message, so consumers that want the
seed's zero-copy path (seed 003) use this raw TCP port instead. Framing
(also in broker.proto, DataFetchResponseHeader):

    request:  [u32 BE n][n bytes FetchRequest]
    response: [u32 BE h][h bytes DataFetchResponseHeader][records_length bytes of batches]

The fetch goes through the same ReplicaManager path as gRPC (DelayedFetch
included); only the transfer differs.

Followers fetch here too (replica.fetch.transport=data, the default): a request frame whose length has
its high bit set carries a ReplicaFetchRequest, answered by one ReplicaFetchResponse frame

    request:  [u32 BE (n | 0x80000000)][n bytes ReplicaFetchRequest]
    response: [u32 BE m][m bytes ReplicaFetchResponse]

and the connection is the follower's fetch session (KIP-227), as the gRPC ReplicaFetch stream is: the
same session rules and purgatory (replica_fetch_server.answer_replica_fetch), only the transport differs.
Why: at a low produce rate the acks=all round trip is a leader -> follower -> leader exchange, and over
grpc.aio each message crossed the C core's poller thread and its per-message path, ~0.2-0.3 ms each way
on this machine against ~0.05 ms for a framed asyncio socket (issue 22's fixed-rate p50). A request that
fails as a whole gets a response with `error` set, and the connection is closed (the session ends). The header and the file range leave in
one native call that releases the GIL on a worker thread of the port's own pool
(`num.network.threads`), so slow readers never hold the threads that retention
and flushes run on; a peer that reads nothing for `data.port.send.timeout.ms`
is disconnected.

With TLS (security.protocol=SSL) the bytes must pass through OpenSSL, so sendfile(2) cannot be used (Kafka
loses zero-copy the same way; kernel TLS is not used): the slice is read into memory by one native call that
releases the GIL (`FileSlice.read`), and the header and records are written to the TLS stream. That is one
copy out of the page cache plus encryption per fetch; `gregor_broker_data_port_tls_bytes_total` counts
these bytes (bench/bench_tls.py measures the cost).

With the authorizer on (authorizer.class.name), the connection's principal is its client certificate's
(ssl.principal.mapping.rules; User:ANONYMOUS on plain text) and each fetch needs Read on its topic (a
follower's ClusterAction on the Cluster); a denied fetch gets the typed error in its header and no bytes.
Concurrency: one asyncio task per connection, requests on a connection served in order.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError
from prometheus_client import Counter

from gregor.broker.limits import REPLICA_FRAME, REPLICA_REQUEST_FRAME_MAX_BYTES, REQUEST_FRAME_MAX_BYTES
from gregor.broker.fetch_api import fetch_response, handle_fetch_request
from gregor.broker.replica_fetch_server import ReplicaFetchSession, answer_replica_fetch
from gregor.common import errors
from gregor.common.acl import CLUSTER_NAME, Operation, ResourceType
from gregor.common.aio import wait_for
from gregor.common.authz import Authz, Caller, denial, transport_caller
from gregor.common.loop_time import Timed
from gregor.common.principal import PrincipalMappingError
from gregor.common.rpc import RequestRecorder
from gregor.rpc.v1 import broker_pb2

if TYPE_CHECKING:
    from gregor.broker.quota_manager import BrokerQuotas, StreamQuota
    from gregor.broker.replica_manager import FetchResult, ReplicaManager

log = logging.getLogger(__name__)

FRAME = struct.Struct(">I")
ZERO_COPY_BYTES = Counter("gregor_broker_zero_copy_bytes_total", "Record bytes sent with sendfile on the data port")
TLS_BYTES = Counter("gregor_broker_data_port_tls_bytes_total",
                    "Record bytes sent on the data port through TLS (read and encrypted, no sendfile)")
BAD_FRAMES = Counter("gregor_broker_data_port_bad_frames_total", "Malformed frames received on the data port")


class DataPortServer:
    """Raw TCP fetch server over the ReplicaManager (event-loop owned)."""

    def __init__(self, replica_manager: "ReplicaManager", host: str, port: int, threads: int = 3,
                 send_timeout_ms: int = 30000, quotas: "BrokerQuotas | None" = None,
                 ssl_context: "ssl.SSLContext | None" = None, authz: "Authz | None" = None) -> None:
        self.replicas = replica_manager
        self.quotas = quotas  # client quotas: consumer_byte_rate of the client named in each FetchRequest
        self.host = host
        self.port = port
        self.send_timeout_ms = send_timeout_ms
        self._senders = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="data-port-send")
        self._server: asyncio.base_events.Server | None = None
        self.ssl_context = ssl_context  # TLS (security.protocol=SSL): no sendfile, see the module doc
        # The authorizer: each fetch needs Read on its topic for the connection's principal (its client
        # certificate's, User:ANONYMOUS on plain text), a follower's ClusterAction on the Cluster.
        self.authz = authz if authz is not None and authz.enabled else None
        # The followers' fetches, counted as the gRPC stream's are (gregor_requests_total{api="ReplicaFetch"}),
        # under service "DataPort".
        self._replica_fetches = RequestRecorder("DataPort", "ReplicaFetch")

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._senders.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        quota = (self.quotas.connection(self.quotas.principal_of(writer.transport), "")
                 if self.quotas is not None else None)
        caller: "Caller | None" = None
        if self.authz is not None:
            try:
                caller = transport_caller(self.authz, writer.transport, writer.get_extra_info("peername"))
            except PrincipalMappingError as exc:  # as the Kafka listener: a subject no rule maps is refused
                log.warning("data port: refusing %s: %s", writer.get_extra_info("peername"), exc)
                writer.close()
                return
        session: ReplicaFetchSession | None = None  # a follower's fetch session, from its first replica frame
        try:
            while True:
                try:
                    (size,) = FRAME.unpack(await reader.readexactly(FRAME.size))
                except asyncio.IncompleteReadError:
                    return  # client closed between requests
                if size & REPLICA_FRAME:
                    if session is None:
                        session = ReplicaFetchSession(self.replicas.fetch_purgatory)
                    if not await self._replica_fetch(size & ~REPLICA_FRAME, reader, writer, caller, session):
                        return
                    continue
                if size == 0 or size > REQUEST_FRAME_MAX_BYTES:
                    await self._reject(writer, f"request frame of {size} bytes is outside 1..{REQUEST_FRAME_MAX_BYTES}")
                    return
                try:
                    request = broker_pb2.FetchRequest.FromString(await reader.readexactly(size))
                except (DecodeError, asyncio.IncompleteReadError) as exc:
                    await self._reject(writer, f"not a FetchRequest: {exc}")
                    return
                refused = self._denied(caller, request) if caller is not None else None
                if refused is not None:  # Kafka's *_AUTHORIZATION_FAILED, nothing read
                    await self._write_header(writer, broker_pb2.DataFetchResponseHeader(error=refused))
                    continue
                await self._fetch(request, writer, sock.fileno(), quota)
                if quota is not None:
                    await quota.channel.wait()  # a throttled fetch mutes the connection (KIP-219)
        except (ConnectionError, OSError):
            return
        finally:
            if session is not None:
                session.close()
            writer.close()

    async def _replica_fetch(self, size: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             caller: "Caller | None", session: ReplicaFetchSession) -> bool:
        """One request of a follower's fetch session; False when the session is over (the connection closes)."""
        if size == 0 or size > REPLICA_REQUEST_FRAME_MAX_BYTES:
            # No follower sends that: garbage (0xffffffff...), answered as any malformed frame is.
            await self._reject(writer, f"request frame of {size | REPLICA_FRAME} bytes is not a FetchRequest's "
                                       f"(1..{REQUEST_FRAME_MAX_BYTES}) nor a replica fetch's")
            return False
        try:
            request = broker_pb2.ReplicaFetchRequest.FromString(await reader.readexactly(size))
        except DecodeError as exc:
            BAD_FRAMES.inc()
            await self._replica_error(writer, errors.error_for(errors.Code.INVALID_REQUEST,
                                                               f"not a ReplicaFetchRequest: {exc}"))
            return False
        start = time.perf_counter()
        if caller is not None and not self._follower_allowed(caller):
            err = denial(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME)
            self._replica_fetches.record(start, err.name)
            await self._replica_error(writer, err)
            return False
        try:
            answer = await answer_replica_fetch(self.replicas, request, session, framed=True)
        except errors.GregorError as err:
            self._replica_fetches.record(start, err.name)
            await self._replica_error(writer, err)
            return False
        self._replica_fetches.record(start, "NONE")
        writer.write(answer)
        await writer.drain()
        return True

    def _follower_allowed(self, caller: Caller) -> bool:
        assert self.authz is not None
        return self.authz.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, "ReplicaFetch")

    async def _replica_error(self, writer: asyncio.StreamWriter, err: errors.GregorError) -> None:
        await self._write_header(writer, broker_pb2.ReplicaFetchResponse(error=err.to_detail()))

    def _denied(self, caller: Caller, request: broker_pb2.FetchRequest) -> Any:
        """The ErrorDetail of a fetch the caller may not make (None: allowed): Read on the topic, or
        ClusterAction on the Cluster for a follower's (as the gRPC Fetch and ReplicaFetch check)."""
        authz = self.authz
        assert authz is not None
        if request.HasField("replica_id"):
            if authz.check(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME, "DataPortFetch"):
                return None
            return denial(caller, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME).to_detail()
        if authz.check(caller, Operation.READ, ResourceType.TOPIC, request.topic, "DataPortFetch"):
            return None
        err = denial(caller, Operation.READ, ResourceType.TOPIC, request.topic)
        return errors.error_for(err.code, err.message, topic=request.topic, partition=request.partition).to_detail()

    async def _fetch(self, request: broker_pb2.FetchRequest, writer: asyncio.StreamWriter, fd: int,
                     quota: "StreamQuota | None" = None) -> None:
        consumer = quota is not None and quota.quotas.enabled and not request.HasField("replica_id")
        if consumer:
            assert quota is not None
            quota.client_id = request.client_id
            request.max_bytes = quota.fetch_max_bytes(request.max_bytes)
        handled = Timed(handle_fetch_request(self.replicas, request))  # the loop's time in it: request_percentage
        try:
            result = await handled
        except errors.GregorError as err:
            if consumer and quota is not None:
                quota.record_request_time(handled.seconds)  # mutes the connection when over
            await self._write_header(writer, broker_pb2.DataFetchResponseHeader(error=err.to_detail()))
            return
        throttle = request_throttle = 0
        if consumer and quota is not None:
            request_throttle = quota.record_request_time(handled.seconds)
            throttle = quota.record_fetch(result.slice.length)
        if throttle:  # answered without records, as Kafka answers a throttled fetch
            await self._write_header(writer, broker_pb2.DataFetchResponseHeader(
                response=fetch_response(result, throttle_time_ms=max(throttle, request_throttle)), records_length=0))
            return
        header = broker_pb2.DataFetchResponseHeader(
            response=fetch_response(result, throttle_time_ms=request_throttle),
            records_length=result.slice.length).SerializeToString()
        if self.ssl_context is not None:
            await self._send_tls(result, writer, header)
            return
        await writer.drain()  # nothing of ours may sit in the transport buffer before the raw send
        sent = await asyncio.get_running_loop().run_in_executor(
            self._senders, result.slice.send_to, fd, FRAME.pack(len(header)) + header, self.send_timeout_ms)
        ZERO_COPY_BYTES.inc(sent)
        if sent < result.slice.length:
            # The segment shrank under the read (truncation): the peer was promised records_length
            # bytes and the framing cannot recover, so end the connection; the client reconnects.
            raise ConnectionResetError(f"sent {sent} of {result.slice.length} promised bytes")

    async def _send_tls(self, result: "FetchResult", writer: asyncio.StreamWriter, header: bytes) -> None:
        """The TLS path: the records read off the segment (GIL released) and written through the TLS stream."""
        records = await asyncio.get_running_loop().run_in_executor(self._senders, result.slice.read)
        writer.write(FRAME.pack(len(header)) + header)
        writer.write(records)
        await wait_for(writer.drain(), self.send_timeout_ms / 1000)
        TLS_BYTES.inc(len(records))
        if len(records) < result.slice.length:
            raise ConnectionResetError(f"read {len(records)} of {result.slice.length} promised bytes")

    async def _reject(self, writer: asyncio.StreamWriter, why: str) -> None:
        BAD_FRAMES.inc()
        err = errors.error_for(errors.Code.INVALID_REQUEST, why)
        await self._write_header(writer, broker_pb2.DataFetchResponseHeader(error=err.to_detail()))

    @staticmethod
    async def _write_header(writer: asyncio.StreamWriter,
                            header: "broker_pb2.DataFetchResponseHeader | broker_pb2.ReplicaFetchResponse") -> None:
        """One length-prefixed message: a fetch's header, or a replica fetch's refusal."""
        data = header.SerializeToString()
        writer.write(FRAME.pack(len(data)) + data)
        await writer.drain()
