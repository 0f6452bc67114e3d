"""ProducerIdManager: hands out producer ids for InitProducerId from blocks of 1000 (Kafka's ProducerIdManager).

Cluster mode (`RpcProducerIdManager`): blocks come from the active controller's
AllocateProducerIds, which records the latest block in etcd, so no two brokers
ever hand out the same id; the next block is prefetched once 90% of the
current one is used. Standalone (`LocalProducerIdManager`): the broker records
its latest block in `<log dir>/producer-id-block` (temp file, fsync, rename)
before handing out any id of it, so a restart never reuses an id.
Concurrency: event-loop owned; at most one block request in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Awaitable, Callable, Optional

from gregor.broker.limits import (
    PRODUCER_ID_PREFETCH_THRESHOLD as PREFETCH_THRESHOLD,
    PRODUCER_ID_BLOCK_WAIT_S as BLOCK_WAIT_S,
    PRODUCER_ID_BLOCK_RETRY_S as BLOCK_RETRY_S,
)
from gregor.common import errors
from gregor.common.aio import wait_for

log = logging.getLogger(__name__)

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE
BLOCK_FILE = "producer-id-block"


class ProducerIdBlock:
    """Ids [first, first + size) and the next one to hand out."""

    def __init__(self, first: int, size: int) -> None:
        self.first = first
        self.size = size
        self.next_id = first

    @property
    def exhausted(self) -> bool:
        return self.next_id >= self.first + self.size

    @property
    def used_share(self) -> float:
        return (self.next_id - self.first) / self.size if self.size else 1.0


class RpcProducerIdManager:
    """Producer ids from blocks the controller allocates (prefetching the next block at 90%)."""

    def __init__(self, allocate: Callable[[], Awaitable[tuple[int, int]]]) -> None:
        self._allocate = allocate
        self._current: Optional[ProducerIdBlock] = None
        self._next: Optional[ProducerIdBlock] = None
        self._fetch: Optional[asyncio.Task[None]] = None

    def _maybe_request_block(self) -> asyncio.Task[None]:
        if self._fetch is None or self._fetch.done():
            self._fetch = asyncio.ensure_future(self._request_block())
        return self._fetch

    async def _request_block(self) -> None:
        while True:
            try:
                start, size = await self._allocate()
                if size <= 0 or start < 0:
                    raise errors.error_for(errors.Code.UNKNOWN_SERVER_ERROR,
                                           f"controller returned an invalid producer id block {start}+{size}")
                self._next = ProducerIdBlock(start, size)
                log.info("got producer id block [%d, %d)", start, start + size)
                return
            except errors.GregorError as err:
                log.warning("AllocateProducerIds failed: %s; retrying", err)
                await asyncio.sleep(BLOCK_RETRY_S)

    async def generate_producer_id(self) -> int:
        """The next unused producer id, waiting (up to BLOCK_WAIT_S) for a block if none is left."""
        block = self._current
        if block is None or block.exhausted:
            if self._next is None:
                fetch = self._maybe_request_block()
                try:
                    await wait_for(asyncio.shield(fetch), BLOCK_WAIT_S)
                except asyncio.TimeoutError:
                    raise errors.error_for(errors.Code.COORDINATOR_LOAD_IN_PROGRESS,
                                           "no producer id block from the controller yet; retry") from None
            if self._current is None or self._current.exhausted:
                self._current, self._next = self._next, None
            block = self._current
            assert block is not None
        pid = block.next_id
        block.next_id += 1
        if block.used_share >= PREFETCH_THRESHOLD and self._next is None:
            self._maybe_request_block()
        return pid

    def close(self) -> None:
        if self._fetch is not None:
            self._fetch.cancel()


class LocalProducerIdManager:
    """A standalone broker's producer ids: blocks recorded in `<log dir>/producer-id-block` before use."""

    def __init__(self, log_dir: str) -> None:
        self.path = os.path.join(log_dir, BLOCK_FILE)
        self._current: Optional[ProducerIdBlock] = None

    def _last_block_end(self) -> int:
        try:
            with open(self.path) as f:
                return int(json.load(f)["block_end"])
        except FileNotFoundError:
            return -1
        except (ValueError, KeyError, TypeError) as exc:
            raise errors.error_for(errors.Code.UNKNOWN_SERVER_ERROR,
                                   f"{self.path} is unreadable ({exc}); refusing to risk reusing producer ids")

    def _allocate_block(self) -> ProducerIdBlock:
        start = self._last_block_end() + 1
        end = start + PRODUCER_ID_BLOCK_SIZE - 1
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"version": 1, "block_start": start, "block_end": end}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return ProducerIdBlock(start, PRODUCER_ID_BLOCK_SIZE)

    async def generate_producer_id(self) -> int:
        if self._current is None or self._current.exhausted:
            self._current = self._allocate_block()
        pid = self._current.next_id
        self._current.next_id += 1
        return pid

    def close(self) -> None:
        pass
