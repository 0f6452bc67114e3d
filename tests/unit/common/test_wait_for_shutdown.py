"""wait_for_shutdown: a service stops on SIGTERM even when it was started with SIGTERM blocked (the mask is
inherited through fork and exec; a handler alone never runs for a blocked signal)."""
from __future__ import annotations

import asyncio
import os
import signal

from gregor.common.rpc import wait_for_shutdown


async def test_a_blocked_sigterm_still_stops_the_service() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    waiting = asyncio.ensure_future(wait_for_shutdown("test"))
    try:
        await asyncio.sleep(0.05)  # its handlers are installed
        os.kill(os.getpid(), signal.SIGTERM)
        done, _ = await asyncio.wait([waiting], timeout=3)
        assert waiting in done, "SIGTERM stayed pending: wait_for_shutdown left it blocked"
        assert waiting.result() == 0
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a still-pending SIGTERM reaches the handler, not pytest
        if not waiting.done():
            await asyncio.wait([waiting], timeout=1)
        waiting.cancel()
