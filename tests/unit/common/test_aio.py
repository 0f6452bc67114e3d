"""gregor.common.aio.wait_for keeps a cancellation that arrives as the awaited thing completes."""

from __future__ import annotations

import asyncio
import pathlib
import re
import sys
from typing import Any, Awaitable, Callable

import pytest

from gregor.common.aio import wait_for

SERVICES = pathlib.Path(__file__).resolve().parents[3] / "services" / "gregor"


async def _cancelled_as_it_completes(waiter: Callable[[Awaitable[int], float], Awaitable[Any]]) -> bool:
    """Cancel a task in the same iteration as the future it waits on (through waiter) completes; True when
    the task ended cancelled, False when it went on past the wait."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()
    went_on = asyncio.Event()

    async def body() -> None:
        await waiter(fut, 10.0)
        went_on.set()
        await asyncio.sleep(3600)

    task = loop.create_task(body())
    await asyncio.sleep(0)  # the task is parked in the wait
    fut.set_result(1)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:
        assert went_on.is_set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False
    return task.cancelled()


async def test_a_cancellation_racing_completion_is_not_lost() -> None:
    assert await _cancelled_as_it_completes(wait_for)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="CPython 3.12 rebuilt asyncio.wait_for on asyncio.timeout")
async def test_the_race_loses_the_cancellation_in_asyncio_wait_for_on_3_11() -> None:
    """The reproduction above does hit the race: 3.11's own wait_for swallows the cancel in it."""
    assert not await _cancelled_as_it_completes(asyncio.wait_for)


async def test_result_timeout_and_inner_cancellation() -> None:
    assert await wait_for(asyncio.sleep(0, "x"), 1.0) == "x"
    assert await wait_for(asyncio.sleep(0, 2), None) == 2
    inner = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
    with pytest.raises(TimeoutError):
        await wait_for(inner, 0.01)
    await asyncio.sleep(0)
    assert inner.cancelled()  # as asyncio.wait_for: the timed-out awaitable is cancelled


def test_services_use_the_safe_wait_for() -> None:
    files = sorted(p for p in SERVICES.rglob("*.py") if p.name != "aio.py")
    uses = [f"{p.relative_to(SERVICES)}:{n}" for p in files
            for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\basyncio\.wait_for\(", line)]
    assert len(files) > 100 and uses == []
