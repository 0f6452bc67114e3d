"""A broker whose fetchers were shut down (controlled shutdown) starts no new fetcher on a late LeaderAndIsr."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from gregor.broker.replica_fetcher import ReplicaFetcherManager


def test_no_fetcher_after_shutdown() -> None:
    async def scenario() -> tuple[int, int]:
        manager = ReplicaFetcherManager(cast(Any, SimpleNamespace(config=SimpleNamespace(replica_lag_time_max_ms=30_000))), lambda _id: None, lambda: 1)
        partition = cast(Any, SimpleNamespace(key=("t", 0), leader_id=7, leader_epoch=3))
        manager.add_partition(partition)
        before = len(manager.fetchers)
        await manager.shutdown()
        manager.add_partition(partition)
        return before, len(manager.fetchers)

    before, after = asyncio.run(scenario())
    assert before == 1  # the same call before shutdown does start a fetcher
    assert after == 0
