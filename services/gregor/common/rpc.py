"""gRPC plumbing shared by every service: server options, health, reflection, error mapping, latency metrics.

Every servicer method goes through one of two wrappers: rpc_method (unary) or rpc_stream (streams).
Both time and count the call and turn errors into typed statuses; a stream that answers many
requests may also record each one as a request with RequestRecorder.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Protocol, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Counter, Histogram

from gregor.common import errors, tls
from gregor.common.loop_time import Timed
from gregor.common.metrics import LATENCY_BUCKETS_S, STREAM_DURATION_BUCKETS_S
from gregor.common.tls import TlsConfig

log = logging.getLogger(__name__)

REQUEST_LATENCY = Histogram("gregor_request_latency_seconds", "Server-side latency per RPC",
                            ["service", "api"], buckets=LATENCY_BUCKETS_S)
REQUESTS = Counter("gregor_requests_total", "RPCs served, by result code", ["service", "api", "code"])
STREAM_DURATION = Histogram("gregor_stream_duration_seconds", "How long each streaming RPC stayed open",
                            ["service", "api"], buckets=STREAM_DURATION_BUCKETS_S)
STREAMS = Counter("gregor_streams_total", "Streaming RPCs ended, by result code", ["service", "api", "code"])

# gRPC's 4 MiB default is too small for produce and fetch; Kafka's socket.request.max.bytes is 100 MiB.
MAX_MESSAGE_BYTES = 104857600
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.so_reuseport", 0),
    # A 16 MiB stream window so one 1-8 MiB produce or fetch message needs no window updates mid-way.
    ("grpc.http2.lookahead_bytes", 16 << 20),
    # Kafka's reconnect.backoff.ms (50) and reconnect.backoff.max.ms (1000) for a peer that went away.
    # gRPC's own defaults (1 s, growing to 120 s) left a restarted broker unreachable for seconds after
    # it was back (measured: 6.7 s after an 8 s outage; 0.8 s with these).
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


class RequestQuota(Protocol):
    """A servicer's `request_quota` attribute: the request-time quota hook of rpc_method (the broker's
    client quotas, broker/quota_manager.py). admit() waits out the caller's channel mute and says whether
    the call is metered (a token) or exempt (None); charge() records the call's handler time (the event
    loop's time in it, common/loop_time.py) and puts a throttle into the response if it has the field."""

    async def admit(self, api: str, request: Any, context: grpc.aio.ServicerContext) -> Any: ...

    def charge(self, token: Any, seconds: float, response: Any) -> None: ...


def rpc_method(service: str) -> Callable[[Handler[Req, Resp]], Handler[Req, Resp]]:
    """Decorate a servicer method: time it, count it, and turn errors into typed statuses.

    A GregorError becomes its gRPC status with an ErrorDetail; anything else is
    logged and answered as UNKNOWN_SERVER_ERROR, so a bug never kills the server.
    A servicer with a `request_quota` (RequestQuota) has every call's handler time metered by it.
    """

    def wrap(fn: Handler[Req, Resp]) -> Handler[Req, Resp]:
        api = fn.__name__
        latency = REQUEST_LATENCY.labels(service=service, api=api)
        # The counter child per result code, looked up once: labels() costs ~2 µs per call.
        counters: dict[str, Any] = {}

        @functools.wraps(fn)
        async def handler(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
            start = time.perf_counter()
            code = "NONE"
            quota: RequestQuota | None = getattr(self, "request_quota", None)
            try:
                token = None if quota is None else await quota.admit(api, request, context)
                if token is None:
                    return await fn(self, request, context)
                assert quota is not None
                timed = Timed(fn(self, request, context))
                try:
                    response = await timed
                except BaseException:
                    quota.charge(token, timed.seconds, None)
                    raise
                quota.charge(token, timed.seconds, response)
                return response
            except errors.GregorError as err:
                code = err.name
                await errors.abort_with(context, err)
                raise  # unreachable: abort raises
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                code = "ABORTED"
                raise
            except Exception as exc:
                code = "UNKNOWN_SERVER_ERROR"
                log.exception("%s.%s failed", service, api)
                await errors.abort_with(context, errors.GregorError(f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                latency.observe(time.perf_counter() - start)
                counter = counters.get(code)
                if counter is None:
                    counter = counters[code] = REQUESTS.labels(service=service, api=api, code=code)
                counter.inc()

        return handler

    return wrap


class RequestRecorder:
    """gregor_request_latency_seconds / gregor_requests_total for the requests of one API, with the label
    children looked up once (labels() costs ~2 µs per call): what rpc_method records per call, for the
    requests a stream carries (ProduceStream, ReplicaFetch)."""

    def __init__(self, service: str, api: str) -> None:
        self.service, self.api = service, api
        self.latency = REQUEST_LATENCY.labels(service=service, api=api)
        self.counters: dict[str, Any] = {}

    def record(self, start: float, code: str) -> None:
        """One request ended with `code` ("NONE": success); start is its time.perf_counter()."""
        self.latency.observe(time.perf_counter() - start)
        counter = self.counters.get(code)
        if counter is None:
            counter = self.counters[code] = REQUESTS.labels(service=self.service, api=self.api, code=code)
        counter.inc()


StreamHandler = Callable[[Any, AsyncIterator[Req], grpc.aio.ServicerContext], AsyncIterator[Resp]]


def rpc_stream(service: str) -> Callable[[StreamHandler[Req, Resp]], StreamHandler[Req, Resp]]:
    """Decorate a streaming servicer method (an async generator): rpc_method for streams.

    Each stream is timed (gregor_stream_duration_seconds{service,api}) and counted when it ends
    (gregor_streams_total{service,api,code}: NONE, CANCELLED, ABORTED or the error's name). A
    GregorError raised by the handler ends the stream with its gRPC status and ErrorDetail; anything
    else is logged and ends it as UNKNOWN_SERVER_ERROR, so a bug never kills the server.
    """

    def wrap(fn: StreamHandler[Req, Resp]) -> StreamHandler[Req, Resp]:
        api = fn.__name__
        duration = STREAM_DURATION.labels(service=service, api=api)
        counters: dict[str, Any] = {}

        @functools.wraps(fn)
        async def handler(self: Any, request_iterator: AsyncIterator[Req],
                          context: grpc.aio.ServicerContext) -> AsyncIterator[Resp]:
            start = time.perf_counter()
            code = "NONE"
            responses = fn(self, request_iterator, context)
            try:
                async for response in responses:
                    yield response
            except errors.GregorError as err:
                code = err.name
                await errors.abort_with(context, err)
                raise  # unreachable: abort raises
            except (asyncio.CancelledError, GeneratorExit):
                code = "CANCELLED"
                raise
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                code = "ABORTED"
                raise
            except Exception as exc:
                code = "UNKNOWN_SERVER_ERROR"
                log.exception("%s.%s failed", service, api)
                await errors.abort_with(context, errors.GregorError(f"{type(exc).__name__}: {exc}"))
                raise
            finally:
                await responses.aclose()  # type: ignore[attr-defined]  # the handler's own finally runs now
                duration.observe(time.perf_counter() - start)
                counter = counters.get(code)
                if counter is None:
                    counter = counters[code] = STREAMS.labels(service=service, api=api, code=code)
                counter.inc()

        return handler

    return wrap


def make_server() -> grpc.aio.Server:
    return grpc.aio.server(options=CHANNEL_OPTIONS, maximum_concurrent_rpcs=None)


def add_health_and_reflection(server: grpc.aio.Server, service_names: Iterable[str]) -> health.HealthServicer:
    """Standard grpc.health.v1 (every service SERVING) and server reflection."""
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    for name in names:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME, health.SERVICE_NAME], server)
    return health_servicer


def channel(target: str, security: "TlsConfig | None" = None) -> grpc.aio.Channel:
    """An aio channel with Gregor's message limits; TLS when `security` (default: the process's TLS config,
    gregor.common.tls) says security.protocol=SSL."""
    return tls.channel(target, CHANNEL_OPTIONS, security)


async def wait_for_shutdown(name: str, stopped: "asyncio.Future[Any] | None" = None) -> int:
    """Block a service's main task until SIGTERM/SIGINT, or until the service's own `stopped`
    future completes (e.g. the controller lost etcd for good). Returns the process exit code:
    1 when `stopped` ended with an exception (logged), else 0."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # A signal mask is inherited through fork and exec: a service started with SIGTERM or SIGINT blocked (by a
    # harness, a parent thread) would never see them, and its handlers above would wait forever.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    stop_wait: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    await asyncio.wait([stop_wait] + ([stopped] if stopped is not None else []),
                       return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if stopped is not None and stopped.done() and not stopped.cancelled() and stopped.exception() is not None:
        log.error("%s failed: %s", name, stopped.exception())
        return 1
    return 0
