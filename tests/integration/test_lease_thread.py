"""gregor.common.lease_thread.ThreadedLease against a real etcd: a busy event loop keeps the lease, a loss is
reported on the owner's loop, a revoke deletes the keys and reports nothing."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import pytest

from gregor.common.etcd import EtcdClient, LeaseLost
from gregor.common.lease_thread import ThreadedLease
from tests.helpers.cluster import Process
from tests.helpers.wait import until

TTL_S = 2  # etcd's minimum with its default raft timings
BLOCK_S = 2 * TTL_S + 1  # longer than etcd takes to expire a lease nobody refreshes (TTL + its 0.5 s check)


@pytest.fixture
async def client(etcd: Process) -> AsyncIterator[EtcdClient]:
    async with EtcdClient(f"http://{etcd.grpc}", cluster="t") as c:
        yield c


async def test_a_loop_held_past_the_ttl_keeps_a_threaded_lease_and_loses_a_loop_lease(client: EtcdClient) -> None:
    """The controller's failover at 10,000 partitions holds its loop for seconds on a loaded machine: with the
    loop's own keepalive (etcd.Lease) its 2 s lease expired meanwhile; the thread's keepalive holds it."""
    threaded = await ThreadedLease.grant(client, TTL_S)
    on_loop = await client.grant_lease(TTL_S)
    kept, gone = client.key("threaded"), client.key("on-loop")
    await client.put(kept, b"1", threaded.id)
    await client.put(gone, b"1", on_loop.id)
    lost: list[LeaseLost] = []
    threaded.on_lost(lost.append)
    time.sleep(BLOCK_S)  # noqa: ASYNC251 - holding the event loop is the point
    assert await client.get(kept) is not None and threaded.alive
    assert await client.get(gone) is None  # what the controller's lease used to do
    await asyncio.sleep(TTL_S)
    assert not lost and threaded.alive
    await threaded.revoke()
    assert await client.get(kept) is None  # revoked: its key goes at once
    assert not lost and not threaded.alive
    await on_loop.revoke()


async def test_a_lease_revoked_elsewhere_is_reported_lost_on_the_owners_loop(client: EtcdClient) -> None:
    lease = await ThreadedLease.grant(client, TTL_S)
    lost: list[LeaseLost] = []
    lease.on_lost(lost.append)
    await client.revoke(lease.id)  # behind the keepalive's back: its next refresh learns it

    async def reported() -> bool:
        return bool(lost)

    await until(reported, TTL_S + 2, "the loss reported")
    assert not lease.alive and lease.lost.done() and "expired or was revoked" in str(lost[0])
    lease.on_lost(lost.append)  # a callback added after the loss runs at once
    assert len(lost) == 2


async def test_a_wedged_loop_is_not_kept_alive_by_the_thread(client: EtcdClient) -> None:
    """Busy is kept, wedged is not: once the owner's loop has run nothing for loop_stall_limit_s the thread stops
    refreshing, etcd expires the lease (its keys go, another controller can win) and the loss is reported when
    the loop runs again. Without the limit a deadlocked controller would stay the active one for good."""
    lease = await ThreadedLease.grant(client, TTL_S, loop_stall_limit_s=TTL_S)
    key = client.key("wedged")
    await client.put(key, b"1", lease.id)
    lost: list[LeaseLost] = []
    lease.on_lost(lost.append)
    time.sleep(2 * TTL_S + BLOCK_S)  # noqa: ASYNC251 - a wedged loop: limit + etcd's expiry, with margin

    async def reported() -> bool:
        return bool(lost)

    await until(reported, TTL_S + 2, "the loss reported once the loop runs")
    assert "event loop has run nothing" in str(lost[0]) and not lease.alive
    assert await client.get(key) is None  # etcd expired it: nobody refreshed it meanwhile
