"""The broker's Kafka-protocol listener: one asyncio server, requests on a connection handled one at a time.

Requests of a connection are read and their effects applied in the order they came, and answered
in that order, so an idempotent producer's pipelined Produce requests (max.in.flight 5) append in
the order they were sent. Unlike Kafka, which mutes a connection until its one request in flight
is answered, a Produce's acks (acks=all: the ISR catching up) are awaited while the connection's
next Produce is read and appended: with acks=all one request at a time would cap a connection at
one replication round trip per request. Any other request waits until everything before it is
answered and is handled alone. Produce with acks=0 gets no response at all.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
import struct
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kio.static.constants import EntityType
from prometheus_client import Counter, Histogram

from gregor.broker.quota_manager import KAFKA_FETCH, StreamQuota, throttle_kafka_response
from gregor.common.loop_time import Timed
from gregor.common.authz import set_connection_caller
from gregor.kafka import codec, zero_copy
from gregor.kafka.handlers import SUPPORTED, KafkaHandlers
from gregor.kafka.admin_handlers import ADMIN_API_NAMES
from gregor.kafka.txn_handlers import TXN_API_NAMES

if TYPE_CHECKING:
    from gregor.broker.broker import Broker

log = logging.getLogger(__name__)

_I32 = struct.Struct(">i")
PRODUCE = 0
# Produce requests of one connection appended and waiting for their acks at once; Kafka's clients send at most
# max.in.flight.requests.per.connection (5 by default), so this bounds a misbehaving client only.
MAX_PIPELINED_PRODUCE = 32
# The connection's StreamReader pauses the socket past twice this and resumes it on the next read: at asyncio's
# 64 KiB a 1 MB Produce (librdkafka's batch.size) took ~8 pause/resume rounds of the event loop to arrive
# (0.67-0.71 ms from its size to its last byte; 0.57-0.58 ms with 4 MiB, issue 22's acks=all round trip).
# A frame is read whole before it is handled either way (socket.request.max.bytes bounds it), so this
# adds no memory a client could not already make the listener hold.
READ_BUFFER_LIMIT = 4 << 20

API_NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit", 9: "OffsetFetch",
             10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup",
             15: "DescribeGroups", 16: "ListGroups", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics",
             22: "InitProducerId", 23: "OffsetForLeaderEpoch", 32: "DescribeConfigs", 37: "CreatePartitions",
             42: "DeleteGroups", 60: "DescribeCluster", 29: "DescribeAcls", 30: "CreateAcls", 31: "DeleteAcls",
             **TXN_API_NAMES, **ADMIN_API_NAMES}
# Kafka's RequestsPerSec{request,version}: per API, and which version each client negotiated (e.g. OffsetFetch
# v8's batched groups from Kafka's AdminClient); sum by (api) for the requests of an API.
REQUESTS = Counter("gregor_kafka_requests_total", "Kafka-protocol requests handled, by API and request version",
                   ["api", "version"])
REQUEST_SECONDS = Histogram("gregor_kafka_request_duration_seconds",
                            "Kafka-protocol request handling time (TotalTimeMs without the network), by API", ["api"])
UNSUPPORTED = Counter("gregor_kafka_unsupported_requests_total",
                      "Kafka-protocol requests of an API or version not served (connection closed)")
# The children of the two per-request metrics, looked up once per (api, version): labels() takes a lock and
# builds a key per call, which a profile of 100 consumers' fetches put at ~3 % of the broker's samples. Both
# sets are bounded by the APIs and versions served.
_requests_of = functools.lru_cache(maxsize=None)(REQUESTS.labels)
_request_seconds_of = functools.lru_cache(maxsize=None)(REQUEST_SECONDS.labels)


def parse_listener(value: str) -> tuple[str, str, int] | None:
    """The Kafka listener of a `listeners` value (`PLAINTEXT://host:port[,...]` or `SSL://host:port`):
    (name, host, port). SSL listeners use the broker's ssl.* keys (gregor.common.tls)."""
    for item in filter(None, (s.strip() for s in value.split(","))):
        name, sep, rest = item.partition("://")
        if not sep:
            raise ValueError(f"listener {item!r} is not NAME://host:port")
        host, _, port = rest.rpartition(":")
        if name.upper() in ("PLAINTEXT", "KAFKA", "SSL"):
            return name.upper(), host or "0.0.0.0", int(port)
    return None


class KafkaListener:
    def __init__(self, broker: "Broker", host: str, port: int, advertised_host: str,
                 max_request_bytes: int, ssl_context: "ssl.SSLContext | None" = None,
                 security_protocol: str = "PLAINTEXT") -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.advertised_host = advertised_host
        self.max_request_bytes = max_request_bytes
        self.handlers = KafkaHandlers(broker, self)
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.advertised_port = port
        self.ssl_context = ssl_context
        self.security_protocol = security_protocol  # PLAINTEXT or SSL: the listener's name in `endpoints`
        # Zero-copy Fetch (kafka/zero_copy.py): plain text only; its sendfile calls run on this pool.
        self._senders: ThreadPoolExecutor | None = None
        if ssl_context is None and broker.config.kafka_fetch_zero_copy_enable:
            self._senders = ThreadPoolExecutor(max_workers=max(1, broker.config.num_network_threads),
                                               thread_name_prefix="kafka-fetch-send")

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, ssl=self.ssl_context,
                                                  limit=READ_BUFFER_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        self.advertised_port = self.port
        return self.port

    @property
    def advertised(self) -> str:
        """host:port a Kafka client is told to connect to (Metadata, FindCoordinator, cluster.json)."""
        return f"{self.advertised_host}:{self.advertised_port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
        await self.handlers.close()
        if self._senders is not None:
            self._senders.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests in order. A Produce is appended at once and its answer queued while its acks are
        pending, so the next pipelined Produce is read and appended meanwhile (a client's max.in.flight);
        any other request first waits until every queued answer is written, then is handled alone. Answers
        leave in the order the requests came."""
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        peer = writer.get_extra_info("peername")
        # Client quotas (broker/quota_manager.py): a throttled response mutes this connection.
        quota = self.broker.quotas.connection(self.broker.quotas.principal_of(writer.transport), "")
        answers: asyncio.Queue[asyncio.Task[bytes | None]] = asyncio.Queue(MAX_PIPELINED_PRODUCE)
        sender = asyncio.create_task(self._send_in_order(answers, writer, peer, task))
        try:
            if not set_connection_caller(self.broker.authz, writer.transport, peer):  # its principal (ACLs)
                return
            while True:
                try:
                    (size,) = _I32.unpack(await reader.readexactly(4))
                except asyncio.IncompleteReadError:
                    return
                if size < 0 or size > self.max_request_bytes:
                    log.warning("kafka: closing %s: request of %d bytes exceeds socket.request.max.bytes", peer, size)
                    return
                frame = await reader.readexactly(size)
                pipelined = self._start_produce(frame, quota)
                if pipelined is not None:
                    await answers.put(asyncio.create_task(pipelined))  # waits while MAX_PIPELINED_PRODUCE are queued
                    await quota.channel.wait()
                    continue
                await answers.join()  # everything before this request is answered
                out = await self._handle(frame, peer, quota)
                if isinstance(out, list):  # a Fetch whose records go by sendfile (kafka/zero_copy.py)
                    assert self._senders is not None
                    await zero_copy.send(writer, out, self._senders, self.broker.config.data_port_send_timeout_ms)
                elif out is not None:
                    writer.write(out)
                    await writer.drain()
                await quota.channel.wait()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:  # the listener is stopping: end quietly (streams would log it)
            return
        except codec.ProtocolError as exc:
            log.warning("kafka: closing %s: %s", peer, exc)
        except Exception:  # a handler bug: the client sees a closed connection and retries; we keep serving
            log.exception("kafka: closing %s after an unexpected error", peer)
        finally:
            self._conns.discard(task)
            sender.cancel()
            while not answers.empty():
                answers.get_nowait().cancel()
            await asyncio.gather(sender, return_exceptions=True)
            writer.close()

    def _start_produce(self, frame: bytes, quota: StreamQuota | None = None) -> Coroutine[Any, Any, bytes | None] | None:
        """A supported Produce: appended now; the awaitable gives its encoded answer (None for acks=0).
        Anything else: None (handled in order by _handle)."""
        header, pos = codec.read_header(frame)
        supported = SUPPORTED.get(header.api_key)
        if header.api_key != PRODUCE or supported is None or not supported[0] <= header.api_version <= supported[1]:
            return None
        request = codec.parse_body(frame, pos, header)
        _requests_of("Produce", str(header.api_version)).inc()
        started = time.perf_counter()
        mod = codec.module(header.api_key, header.api_version, EntityType.response)
        pending = self.handlers.start_produce(header, request, mod)
        handler_seconds = time.perf_counter() - started  # the append (request_percentage); the acks wait is not

        async def answer() -> bytes | None:
            body = await pending
            _request_seconds_of("Produce").observe(time.perf_counter() - started)
            if quota is not None and quota.quotas.enabled:
                body = throttle_kafka_response(quota, header.api_key, header.client_id or "", len(frame), body,
                                               handler_seconds)
            return None if body is None else codec.encode_response(header, body)
        return answer()

    async def _send_in_order(self, answers: "asyncio.Queue[asyncio.Task[bytes | None]]",
                             writer: asyncio.StreamWriter, peer: object, reader_task: "asyncio.Task[None]") -> None:
        """Write the queued Produce answers in order. If one cannot be written or its handler failed, the
        connection is over: the reading side is cancelled (it may be waiting on this queue) and cleans up."""
        try:
            while True:
                queued = await answers.get()
                try:
                    out = await queued
                    if out is not None:
                        writer.write(out)
                        await writer.drain()
                finally:
                    answers.task_done()
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            reader_task.cancel()
        except Exception:  # a handler bug: the client sees a closed connection and retries
            log.exception("kafka: closing %s after an unexpected error in a Produce", peer)
            reader_task.cancel()

    async def _handle(self, frame: bytes, peer: object,
                      quota: StreamQuota | None = None) -> bytes | list[zero_copy.Part] | None:
        header, pos = codec.read_header(frame)
        supported = SUPPORTED.get(header.api_key)
        if header.api_key == codec.API_VERSIONS and (supported is None or
                                                     not supported[0] <= header.api_version <= supported[1]):
            # KIP-511: an ApiVersions version we do not know gets v0's body with UNSUPPORTED_VERSION.
            return codec.encode_response(header, self.handlers.api_versions_unsupported())
        if supported is None or not supported[0] <= header.api_version <= supported[1]:
            UNSUPPORTED.inc()
            raise codec.ProtocolError(f"api {header.api_key} v{header.api_version} is not supported "
                                      f"(client {header.client_id!r})")
        request = codec.parse_body(frame, pos, header)
        api = API_NAMES.get(header.api_key, str(header.api_key))
        _requests_of(api, str(header.api_version)).inc()
        collector = None
        if header.api_key == KAFKA_FETCH and self._senders is not None:  # plain text: records by sendfile
            collector, token = zero_copy.begin()
        handled = Timed(self.handlers.handle(header, request))  # the loop's time in it: request_percentage
        try:
            with _request_seconds_of(api).time():
                body = await handled
        finally:
            if collector is not None:
                zero_copy.end(token)
        if quota is not None and quota.quotas.enabled:
            body = throttle_kafka_response(quota, header.api_key, header.client_id or "", len(frame), body,
                                           handled.seconds,
                                           fetch_bytes=collector.total if collector is not None else None)
        if body is None:
            return None  # Produce acks=0
        out = codec.encode_response(header, body)
        if collector is not None and collector.slices:
            return zero_copy.splice(out, collector, type(body).__flexible__)
        return out


async def start_listener(broker: "Broker") -> KafkaListener:
    """Start the Kafka listener named by the broker's `listeners` (and `advertised.listeners`) config."""
    cfg = broker.config
    try:
        bind = parse_listener(cfg.listeners)
        adv = parse_listener(cfg.advertised_listeners) if cfg.advertised_listeners else None
    except ValueError as exc:
        from gregor.common import errors

        raise errors.error_for(errors.Code.INVALID_CONFIG, f"listeners: {exc}") from None
    if bind is None:
        from gregor.common import errors

        raise errors.error_for(errors.Code.INVALID_CONFIG,
                               f"listeners={cfg.listeners!r} names no PLAINTEXT:// or SSL:// (Kafka) listener")
    name, host, port = bind
    protocol = "SSL" if name == "SSL" else "PLAINTEXT"
    if protocol == "SSL" and not cfg.tls.keystore:
        from gregor.common import errors

        raise errors.error_for(errors.Code.INVALID_CONFIG, "an SSL:// listener needs ssl.keystore.location and "
                               "ssl.truststore.location (docs/security.md)")
    if protocol == "PLAINTEXT" and cfg.tls.enabled:
        log.warning("security.protocol=SSL but the Kafka listener %s is plain text", cfg.listeners)
    adv_host = adv[1] if adv and adv[1] not in ("", "0.0.0.0") else (host if host not in ("", "0.0.0.0") else cfg.host)
    listener = KafkaListener(broker, host, port, adv_host, cfg.socket_request_max_bytes,
                             cfg.tls.server_ssl_context() if protocol == "SSL" else None, protocol)
    await listener.start()
    if adv and adv[2]:
        listener.advertised_port = adv[2]
    return listener
