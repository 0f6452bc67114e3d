"""KIP-219 on the client side: a server that answered with throttle_time_ms gets no request from this client
until that time has passed (Kafka's NetworkClient keeps a throttled connection not-ready meanwhile). The
server mutes the channel as well; waiting here keeps the client's requests from queueing behind the mute.

Concurrency: one event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class Throttles:
    """Throttled servers (a broker id, a coordinator's host:port) and the throttle times they handed out."""

    until: dict[Hashable, float] = field(default_factory=dict)  # server -> monotonic seconds
    responses: int = 0
    throttle_time_ms_total: int = 0
    throttle_time_ms_max: int = 0

    async def wait(self, server: Hashable) -> None:
        delay = self.until.get(server, 0.0) - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def record(self, server: Hashable, throttle_ms: int) -> None:
        self.responses += 1
        if throttle_ms > 0:
            self.throttle_time_ms_total += throttle_ms
            self.throttle_time_ms_max = max(self.throttle_time_ms_max, throttle_ms)
            self.until[server] = max(self.until.get(server, 0.0), time.monotonic() + throttle_ms / 1000)
