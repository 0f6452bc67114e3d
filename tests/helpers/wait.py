"""The one way tests wait for a condition: poll it until it holds, fail naming what did not happen.

`until` is for async tests (the condition may be a plain function or return an awaitable) and returns the
seconds it took, which failover tests report; `wait_for` is its blocking form for synchronous tests and
returns the condition's truthy value. Neither sleeps a fixed time: each returns as soon as it holds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, Callable


def _timed_out(what: str, timeout_s: float) -> AssertionError:
    return AssertionError(f"not within {timeout_s:g} s: {what}")


async def until(cond: Callable[[], Any], timeout_s: float, what: str = "the condition",
                interval_s: float = 0.05) -> float:
    """Poll cond() (its result awaited if awaitable) until truthy; the seconds it took."""
    start = time.monotonic()
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return time.monotonic() - start
        if time.monotonic() - start >= timeout_s:
            raise _timed_out(what, timeout_s)
        await asyncio.sleep(interval_s)


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str = "the condition",
             interval_s: float = 0.2) -> Any:
    """Blocking form: poll cond() until it returns something truthy, and return that."""
    start = time.monotonic()
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() - start >= timeout_s:
            raise _timed_out(what, timeout_s)
        time.sleep(interval_s)
