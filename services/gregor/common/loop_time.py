"""The event loop's time spent running one request: Kafka's request-handler time, for request quotas.

Kafka's `request_percentage` quota (KIP-124) counts the time request handler and network threads spend
on a client's requests, not the time a request waits (a fetch parked in purgatory costs no thread). A
Gregor service handles a request as a coroutine on one event loop, so the equivalent is the time the
loop spends inside that coroutine's steps: `Timed(coro)` drives the coroutine and adds up the wall time
of each step (between two awaits that suspend), leaving out the time it is suspended. Two clock reads
per step, nothing per record.

Concurrency: event-loop owned; a Timed is awaited once.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Generator, Generic, TypeVar

T = TypeVar("T")


class Timed(Generic[T]):
    """Await `coro`; afterwards `seconds` is the loop time its steps took (also after an exception)."""

    __slots__ = ("_awaitable", "seconds")

    def __init__(self, awaitable: Awaitable[T]) -> None:
        self._awaitable = awaitable
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        inner = self._awaitable.__await__()
        clock = time.perf_counter
        value: Any = None
        error: BaseException | None = None
        while True:
            started = clock()
            try:
                if error is None:
                    step = inner.send(value)
                else:
                    thrown, error = error, None
                    step = inner.throw(thrown)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            finally:
                self.seconds += clock() - started
            try:
                value = yield step
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as exc:  # noqa: B036 - a cancellation goes into the coroutine, as await does
                value, error = None, exc
