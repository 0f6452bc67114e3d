"""`wait_for` that never loses a cancellation (CPython 3.11's `asyncio.wait_for` can).

In 3.11, when the task awaiting `asyncio.wait_for(aw, t)` is cancelled in the same loop iteration in which
`aw` completes, `wait_for` returns `aw`'s result and the cancellation is gone (CPython gh-86296, fixed in
3.12 by rebuilding `wait_for` on `asyncio.timeout`). The task goes on with `cancelling()` set: a loop
around it never ends, and whoever cancelled it and waits for it to finish waits for good. A fresh-clone CI
run hung that way: a controller stopped right after resigning cancelled its standby metadata watches while
one watch's stream creation (bounded by `wait_for`) was completing, and `stop()` waited on that watch for
the test's whole 300 s. `asyncio.timeout` (3.11+) re-raises a cancellation it did not cause.

Concurrency: called on the running event loop, like `asyncio.wait_for`.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """`asyncio.wait_for(aw, timeout)`: TimeoutError after timeout seconds (None: no limit), `aw` cancelled;
    a cancellation of the caller always propagates, even if `aw` completed in the same iteration."""
    async with asyncio.timeout(timeout):
        return await aw


__all__ = ["wait_for"]
