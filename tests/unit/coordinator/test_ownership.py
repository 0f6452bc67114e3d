"""ShardOwnership's release order (coordinator/ownership.py), the rule both coordinators share: a shard
is given up only after every write in flight to it has ended, and no write is admitted once it goes.

The etcd client is a recorder (these are the mechanism's own rules, not etcd's); the handover with real
processes is tests/integration/test_txn_shard_handover.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gregor.common import errors
from gregor.common.clock import monotonic_ms
from gregor.common.etcd import Delete
from gregor.common.etcd_layout import CoordinatorsZNode
from gregor.coordinator.ownership import LeaseFence, ShardOwnership

Code = errors.Code


class RecordingEtcd:
    """Records the claim deletions; keys as the real client builds them."""

    prefix = b"/gregor/test/"

    def __init__(self) -> None:
        self.deleted: list[bytes] = []

    def key(self, *parts: str | int) -> bytes:
        return self.prefix + "/".join(str(p) for p in parts).encode()

    def relative(self, key: bytes) -> str:
        return key[len(self.prefix):].decode()

    async def txn(self, compares: Any, success: list[Any], failure: Any = ()) -> Any:
        self.deleted += [op.key for op in success if isinstance(op, Delete)]
        return True


def shards(owned: set[int]) -> tuple[ShardOwnership, RecordingEtcd, list[int]]:
    etcd = RecordingEtcd()
    fence = LeaseFence(etcd, 2000, 800, 200)  # type: ignore[arg-type]
    fence._valid_until_ms = monotonic_ms() + 60000  # the lease certainly outlives every write here
    unloaded: list[int] = []

    async def load(p: int, loading: Any) -> bool:
        return True

    own = ShardOwnership(etcd, 0, CoordinatorsZNode.TXN_CLAIMS, "__transaction_state", fence,  # type: ignore[arg-type]
                         load, unloaded.append, lambda task: None)
    own.owned = set(owned)
    return own, etcd, unloaded


async def test_release_deletes_the_claim_only_after_the_writes_in_flight_end() -> None:
    own, etcd, unloaded = shards({1, 2})
    acked = asyncio.Event()

    async def write() -> None:
        async with own.writing(1):
            await acked.wait()  # the write's acks=all answer

    w = asyncio.create_task(write())
    await asyncio.sleep(0)
    assert own.inflight(1) == 1
    release = asyncio.create_task(own.release(1))
    for _ in range(20):
        await asyncio.sleep(0)
    # Unloaded and closed to new writes at once, but the claim stays while the write is in flight.
    assert unloaded == [1] and 1 not in own.owned and not etcd.deleted and not release.done()
    with pytest.raises(errors.GregorError) as ei:
        async with own.writing(1):
            pass
    assert ei.value.code == Code.NOT_COORDINATOR
    acked.set()
    await release
    assert etcd.deleted == [CoordinatorsZNode.claim_key(etcd, CoordinatorsZNode.TXN_CLAIMS, 1)]  # type: ignore[arg-type]
    # The write landed, but the shard moved meanwhile: its caller is told NOT_COORDINATOR, not success.
    with pytest.raises(errors.GregorError) as ei:
        await w
    assert ei.value.code == Code.NOT_COORDINATOR
    assert own.owned == {2}


async def test_release_of_a_shard_without_writes_does_not_wait() -> None:
    own, etcd, unloaded = shards({3})
    await asyncio.wait_for(own.release(3), 5)
    assert unloaded == [3] and len(etcd.deleted) == 1


async def test_shutdown_drains_every_shard_and_admits_nothing_more() -> None:
    own, etcd, unloaded = shards({1, 2})
    acked = asyncio.Event()

    async def write(p: int) -> None:
        async with own.writing(p):
            await acked.wait()

    writes = [asyncio.create_task(write(p)) for p in (1, 2)]
    await asyncio.sleep(0)
    stop = asyncio.create_task(own.release_all())
    for _ in range(20):
        await asyncio.sleep(0)
    assert sorted(unloaded) == [1, 2] and not stop.done()
    with pytest.raises(errors.GregorError):
        own.check_fence(1)
    acked.set()
    await stop
    assert not etcd.deleted  # the claims go with the lease, revoked next
    for w in writes:
        with pytest.raises(errors.GregorError):
            await w


async def test_write_refused_when_the_lease_may_not_outlive_it() -> None:
    own, _, _ = shards({1})
    own.fence._valid_until_ms = monotonic_ms() + 900  # < 800 write timeout + 200 margin
    with pytest.raises(errors.GregorError) as ei:
        async with own.writing(1):
            raise AssertionError("a fenced write was admitted")
    assert ei.value.code == Code.NOT_COORDINATOR and "fenced" in ei.value.message and not own.inflight(1)


async def test_a_lost_lease_gives_every_shard_up_at_once_and_drains_its_writes() -> None:
    own, etcd, unloaded = shards({1, 2})
    own.loading = {3}
    acked = asyncio.Event()

    async def write() -> None:
        async with own.writing(1):
            await acked.wait()

    w = asyncio.create_task(write())
    await asyncio.sleep(0)
    assert own.fence.on_lost == [own.lease_lost]  # LeaseFence runs it before granting a new lease
    lost = asyncio.create_task(own.lease_lost())
    for _ in range(20):
        await asyncio.sleep(0)
    # Nothing is served from now on, but the hook returns (and a new lease is granted) only once the
    # write in flight has ended: no write of ours can land after the shards are claimed again.
    assert sorted(unloaded) == [1, 2, 3] and not own.owned and not own.loading and not lost.done()
    with pytest.raises(errors.GregorError):
        own.check_fence(2)
    acked.set()
    await lost
    assert not etcd.deleted and not own.epochs  # the claims go with the lease, not by our deletes
    with pytest.raises(errors.GregorError):
        await w


async def test_a_claim_created_while_the_lease_is_declared_lost_is_not_served() -> None:
    own, etcd, _ = shards(set())
    own.fence.lease = type("L", (), {"id": 0x1})()  # type: ignore[assignment]
    created = asyncio.Event()
    answered = asyncio.Event()

    async def create_if_absent(key: bytes, value: bytes, lease: int = 0) -> Any:
        created.set()
        await answered.wait()  # the round trip, during which the lease is declared lost
        return type("R", (), {"revision": 7, "__bool__": lambda self: True})()

    etcd.create_if_absent = create_if_absent  # type: ignore[attr-defined]
    acquire = asyncio.create_task(own._acquire(0))
    await created.wait()
    own.fence.generation += 1  # LeaseFence._replace declares the loss
    answered.set()
    await acquire
    assert 0 not in own.loading and 0 not in own.owned and 0 not in own.epochs
    # And while the loss is being repaired nothing is claimed at all.
    own.fence._declared = True
    created.clear()
    await own._acquire(1)
    assert not created.is_set()


async def test_a_replay_started_before_the_lease_was_lost_does_not_install_after_the_shard_is_claimed_again() -> None:
    """The shard is claimed, its replay hangs (a slow partition), the lease is lost and the shard claimed again
    on the new lease: when the first replay finally returns it must not make the shard served — its state may
    predate a successor's writes; only the replay of the latest claim does."""
    own, etcd, _ = shards(set())
    own.fence.lease = type("L", (), {"id": 0x1})()  # type: ignore[assignment]
    replays: list[asyncio.Event] = []
    still: list[Any] = []

    async def load(p: int, current: Any) -> bool:
        done = asyncio.Event()
        replays.append(done)
        still.append(current)
        await done.wait()
        return bool(current())

    async def create_if_absent(key: bytes, value: bytes, lease: int = 0) -> Any:
        return type("R", (), {"revision": 7, "__bool__": lambda self: True})()

    own._load = load  # type: ignore[method-assign]
    etcd.create_if_absent = create_if_absent  # type: ignore[attr-defined]
    await own._acquire(0)
    await asyncio.sleep(0)
    assert own.loading == {0} and len(replays) == 1
    await own.lease_lost()
    own.claims.pop(0)  # the old lease's claim is gone (the watch's delete)
    await own._acquire(0)  # claimed again on the new lease
    await asyncio.sleep(0)
    assert len(replays) == 2 and not still[0]() and still[1]()
    replays[0].set()  # the first replay returns late
    for _ in range(10):
        await asyncio.sleep(0)
    assert 0 not in own.owned and own.loading == {0}
    replays[1].set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert own.owned == {0} and not own.loading
