"""An asyncio event loop on a private daemon thread, behind the blocking Sync* client facades.

Concurrency: the loop thread owns every client object; a caller's thread blocks in run() on a
per-call queue that carries the coroutine's outcome and, for calls that accept them, work the loop
hands back to the caller (Kafka runs rebalance listeners and commit callbacks on the caller's thread,
from inside poll()/commitSync()/close()). So a listener may call the blocking facade again: the loop
is not blocked while the caller runs it, only the task that waits for the listener's result is.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import queue
import threading
from typing import Any, Callable, Collection, Coroutine, Optional, TypeVar

T = TypeVar("T")

# Kinds of caller work: a rebalance listener call (poll/close/unsubscribe run it) and a
# commit callback (poll/commit_sync/commit_async/close run it), as in Kafka.
LISTENER = "listener"
CALLBACK = "callback"

_DONE, _ERROR, _WORK = 0, 1, 2


class _Work:
    __slots__ = ("kind", "fn", "args", "future")

    def __init__(self, kind: str, fn: Callable[..., Any], args: tuple[Any, ...],
                 future: Optional["asyncio.Future[Any]"]) -> None:
        self.kind, self.fn, self.args, self.future = kind, fn, args, future


class LoopThread:
    """Owns one event loop running forever on one thread; callers hand it coroutines.

    Caller work (call_on_caller / post_to_caller, loop side) waits in a FIFO until a blocking
    call that accepts its kind is in progress (run(..., accept=...)); the innermost such call
    (a listener may call the facade again) runs it on its own thread.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        # Loop-thread owned: callers now inside run(accept=...), innermost last; work not yet handed out.
        self._inboxes: list[tuple["queue.SimpleQueue[tuple[int, Any]]", frozenset[str]]] = []
        self._pending: collections.deque[_Work] = collections.deque()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> "concurrent.futures.Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None,
            accept: Collection[str] = ()) -> T:
        """Block until coro finished on the loop; meanwhile run caller work of the `accept` kinds here."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking client method was called on its own event loop thread")
        if not accept:
            return self.submit(coro).result(timeout)
        inbox: "queue.SimpleQueue[tuple[int, Any]]" = queue.SimpleQueue()
        kinds = frozenset(accept)

        async def main() -> None:
            entry = (inbox, kinds)
            self._inboxes.append(entry)
            self._flush()
            try:
                result = await coro
            except BaseException as exc:  # handed to the caller, who raises it
                inbox.put((_ERROR, exc))
            else:
                inbox.put((_DONE, result))
            finally:
                self._inboxes.remove(entry)  # no work is put after the outcome: same loop step

        self.submit(main())
        while True:
            tag, payload = inbox.get()
            if tag == _DONE:
                return payload  # type: ignore[no-any-return]
            if tag == _ERROR:
                raise payload
            self._run_work(payload)

    def _run_work(self, work: _Work) -> None:
        fut = work.future
        if fut is not None and fut.cancelled():  # the loop stopped waiting before we got to it
            return
        try:
            value = work.fn(*work.args)
        except BaseException as exc:
            if fut is not None:
                self.loop.call_soon_threadsafe(_settle, fut, None, exc)
            if not isinstance(exc, Exception):
                raise
            return
        if fut is not None:
            self.loop.call_soon_threadsafe(_settle, fut, value, None)

    # ------------------------------------------------------------ loop side
    async def call_on_caller(self, kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        """(On the loop) fn(*args) on the thread of the next blocking call accepting `kind`; its result."""
        fut: "asyncio.Future[Any]" = self.loop.create_future()
        work = _Work(kind, fn, args, fut)
        self._pending.append(work)
        self._flush()
        try:
            return await fut
        except asyncio.CancelledError:
            if work in self._pending:
                self._pending.remove(work)
            raise

    def post_to_caller(self, kind: str, fn: Callable[..., Any], *args: Any) -> None:
        """(On the loop) fn(*args) on the caller's thread as call_on_caller, without waiting for it."""
        self._pending.append(_Work(kind, fn, args, None))
        self._flush()

    def _flush(self) -> None:
        if not self._inboxes or not self._pending:
            return
        keep: collections.deque[_Work] = collections.deque()
        for work in self._pending:
            target = next((q for q, kinds in reversed(self._inboxes) if work.kind in kinds), None)
            if target is None:
                keep.append(work)
            else:
                target.put((_WORK, work))
        self._pending = keep

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        self.loop.close()


def _settle(fut: "asyncio.Future[Any]", value: Any, exc: Optional[BaseException]) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
