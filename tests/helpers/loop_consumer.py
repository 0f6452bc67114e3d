"""An asyncio Consumer on a loop thread of the test's own, for blocking tests that drive the async API."""

from __future__ import annotations

from typing import Any, Callable

from gregor.client.consumer import Consumer
from gregor.client.loop_thread import LoopThread


class LoopConsumer:
    """Owns the Consumer (`self.c`) and its loop thread (`self.lt`); `_sync` runs a plain call on the loop."""

    def __init__(self, cfg: dict[str, Any], name: str = "test-async-consumer",
                 factory: Callable[[dict[str, Any]], Consumer] = Consumer) -> None:
        self.lt = LoopThread(name)

        async def make() -> Consumer:
            return factory(cfg)
        self.c: Consumer = self.lt.run(make())

    def _sync(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)
        return self.lt.run(run())
