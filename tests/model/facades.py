"""One producer program, every form a user can call it in (issue 19): the async Producer, the blocking
SyncProducer and the producer gateway's TransactionalProduceStream.

Each facade offers the same blocking calls to a test: init / begin / send / flush / commit / abort /
send_offsets / close. send() returns a concurrent.futures.Future of the record's (partition, offset), or
raises what Kafka's send() raises; control calls raise the error the underlying API raises. A facade
that does not offer a call (the gateway has no flush or send_offsets) says so in `offers`, and the
contract tests run that call only where it is offered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
from typing import Any, Callable, Coroutine, Mapping, Optional, TypeVar

from gregor.client import Producer, SyncProducer
from gregor.client.loop_thread import LoopThread
from gregor.common import errors
from gregor.common.rpc import channel
from gregor.rpc.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

T = TypeVar("T")
Offset = tuple[int, int]  # (partition, offset)
ALL_CALLS = frozenset({"init", "begin", "send", "flush", "commit", "abort", "send_offsets", "close"})


class Facade:
    """The calls every facade offers to a test program (all blocking)."""

    name = "?"
    offers: frozenset[str] = ALL_CALLS
    # True when a send error comes back on the future rather than raised by send() (the gateway's stream)
    send_errors_on_future = False

    def init(self) -> None: raise NotImplementedError
    def begin(self) -> None: raise NotImplementedError
    def send(self, topic: str, value: Any, key: Optional[bytes] = None,
             partition: Optional[int] = None) -> "concurrent.futures.Future[Offset]": raise NotImplementedError
    def flush(self) -> None: raise NotImplementedError
    def commit(self) -> None: raise NotImplementedError
    def abort(self) -> None: raise NotImplementedError
    def send_offsets(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None: raise NotImplementedError
    def close(self) -> None: raise NotImplementedError

    def send_error(self, topic: str, value: Any, **kw: Any) -> BaseException:
        """The error a send must fail with: raised by send(), or (gateway) carried by its future."""
        try:
            fut = self.send(topic, value, **kw)
        except BaseException as exc:
            return exc
        if not self.send_errors_on_future:
            raise AssertionError(f"{self.name}: send() returned where Kafka's send() raises")
        failure = fut.exception(timeout=30)
        if failure is None:
            raise AssertionError(f"{self.name}: the send succeeded where it must fail")
        return failure


def _offset_future(md_future: "concurrent.futures.Future[Any]") -> "concurrent.futures.Future[Offset]":
    out: "concurrent.futures.Future[Offset]" = concurrent.futures.Future()

    def done(f: "concurrent.futures.Future[Any]") -> None:
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            md = f.result()
            out.set_result((md.partition, md.offset))
    md_future.add_done_callback(done)
    return out


class AsyncFacade(Facade):
    """The asyncio Producer, driven on an event loop owned by the test thread (run_until_complete per call)."""

    name = "async"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.producer = Producer(dict(config))
        self._run(self.producer.start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def init(self) -> None: self._run(self.producer.init_transactions())
    def begin(self) -> None: self._run(self.producer.begin_transaction())

    def send(self, topic: str, value: Any, key: Optional[bytes] = None,
             partition: Optional[int] = None) -> "concurrent.futures.Future[Offset]":
        out: "concurrent.futures.Future[Offset]" = concurrent.futures.Future()

        def done(md: Any, exc: Optional[BaseException]) -> None:
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result((md.partition, md.offset))
        self._run(self.producer.send(topic, value, key, partition=partition, callback=done))
        return out

    def flush(self) -> None: self._run(self.producer.flush())
    def commit(self) -> None: self._run(self.producer.commit_transaction())
    def abort(self) -> None: self._run(self.producer.abort_transaction())

    def send_offsets(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None:
        self._run(self.producer.send_offsets_to_transaction(dict(offsets), group_id))

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            self._run(self.producer.close())
        finally:
            self.loop.close()


class SyncFacade(Facade):
    """The blocking SyncProducer, called as a script calls it."""

    name = "sync"

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.producer = SyncProducer(dict(config))

    def init(self) -> None: self.producer.init_transactions()
    def begin(self) -> None: self.producer.begin_transaction()

    def send(self, topic: str, value: Any, key: Optional[bytes] = None,
             partition: Optional[int] = None) -> "concurrent.futures.Future[Offset]":
        return _offset_future(self.producer.send(topic, value, key, partition=partition))

    def flush(self) -> None: self.producer.flush()
    def commit(self) -> None: self.producer.commit_transaction()
    def abort(self) -> None: self.producer.abort_transaction()

    def send_offsets(self, offsets: Mapping[tuple[str, int], int], group_id: str) -> None:
        self.producer.send_offsets_to_transaction(dict(offsets), group_id)

    def close(self) -> None: self.producer.close()


class GatewayFacade(Facade):
    """The gateway's TransactionalProduceStream: one stream is one transactional producer.

    Every message gets one result in order; control calls wait for theirs. The gateway offers no flush and
    no send_offsets_to_transaction, and a record's error comes back as its result (the stream goes on)."""

    name = "gateway"
    offers = ALL_CALLS - {"flush", "send_offsets"}
    send_errors_on_future = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.gateway = str(config["gateway"])
        self.transactional_id = str(config["transactional.id"])
        self.timeout_ms = int(config.get("transaction.timeout.ms", 0))
        self._thread = LoopThread("gateway-facade")
        self._ids = itertools.count(1)
        self._pending: dict[int, "concurrent.futures.Future[Offset]"] = {}
        self._queue: Optional[asyncio.Queue[Optional[gateway_pb2.GatewayTxnRequest]]] = None
        self._reader: Optional["concurrent.futures.Future[None]"] = None
        self._closed = False
        self._thread.run(self._open())

    async def _open(self) -> None:
        self._queue = asyncio.Queue()
        queue = self._queue
        self._channel = channel(self.gateway)
        stub = gateway_pb2_grpc.ProducerGatewayServiceStub(self._channel)

        async def requests() -> Any:
            while (msg := await queue.get()) is not None:
                yield msg
        self._call = stub.TransactionalProduceStream(requests())
        self._reader = asyncio.run_coroutine_threadsafe(self._read(), self._thread.loop)

    async def _read(self) -> None:
        try:
            async for res in self._call:
                fut = self._pending.pop(res.correlation_id, None)
                if fut is None:
                    continue
                if res.error.code != 0:
                    fut.set_exception(errors.from_detail(res.error))
                else:
                    fut.set_result((res.partition, res.offset))
        except BaseException as exc:  # the stream broke: every open call fails with why
            err = errors.GregorError(f"gateway stream ended: {exc}")
            for fut in self._pending.values():
                fut.set_exception(err)
            self._pending.clear()

    def _post(self, make: Callable[[int], gateway_pb2.GatewayTxnRequest]) -> "concurrent.futures.Future[Offset]":
        if self._closed:
            raise errors.GregorError("cannot send after the producer is closed")
        cid = next(self._ids)
        fut: "concurrent.futures.Future[Offset]" = concurrent.futures.Future()
        self._pending[cid] = fut
        assert self._queue is not None
        self._thread.loop.call_soon_threadsafe(self._queue.put_nowait, make(cid))
        return fut

    def _control(self, op: str) -> None:
        self._post(lambda cid: gateway_pb2.GatewayTxnRequest(
            **{op: gateway_pb2.GatewayTxnControl(correlation_id=cid)})).result(timeout=120)

    def init(self) -> None:
        self._post(lambda cid: gateway_pb2.GatewayTxnRequest(init=gateway_pb2.GatewayTxnInit(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
            correlation_id=cid))).result(timeout=120)

    def begin(self) -> None: self._control("begin")
    def commit(self) -> None: self._control("commit")
    def abort(self) -> None: self._control("abort")

    def send(self, topic: str, value: Any, key: Optional[bytes] = None,
             partition: Optional[int] = None) -> "concurrent.futures.Future[Offset]":
        if value is not None and not isinstance(value, bytes):
            raise TypeError(f"record value must be bytes or None, not {type(value).__name__}")
        rec = common_pb2.Record()
        if value is not None:
            rec.value = value
        if key is not None:
            rec.key = key
        return self._post(lambda cid: gateway_pb2.GatewayTxnRequest(record=gateway_pb2.GatewayRecord(
            topic=topic, record=rec, correlation_id=cid, **({"partition": partition} if partition is not None
                                                            else {}))))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        assert self._queue is not None
        self._thread.loop.call_soon_threadsafe(self._queue.put_nowait, None)
        try:
            if self._reader is not None:
                self._reader.result(timeout=120)
        finally:
            self._thread.run(self._channel.close())
            self._thread.stop()


FACADES: dict[str, Callable[[Mapping[str, Any]], Facade]] = {
    "async": AsyncFacade, "sync": SyncFacade, "gateway": GatewayFacade}
