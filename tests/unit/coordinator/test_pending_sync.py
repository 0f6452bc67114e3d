"""Kafka's pending-sync expiry (KAFKA-13134): a member that joined a generation but never sends
SyncGroup within the rebalance timeout is removed and the group rebalances."""

from __future__ import annotations

import asyncio

import pytest

from gregor.common import errors
from gregor.coordinator.group import GroupState
from tests.unit.coordinator.test_group_manager import REBALANCE, SESSION, join, manager, new_member_id, stable_group

S = GroupState


async def two_joined(now: int = 0) -> tuple[object, str, str]:
    m = manager()
    a, b = await new_member_id(m, now), await new_member_id(m, now)
    fa, fb = join(m, now, member_id=a), join(m, now, member_id=b)
    ra, _ = await fa, await fb
    assert m.groups["g"].state is S.COMPLETING_REBALANCE and m.groups["g"].pending_sync == {a, b}
    leader = ra.leader
    return m, leader, b if leader == a else a


async def test_member_that_never_syncs_is_removed_after_rebalance_timeout() -> None:
    m, leader, follower = await two_joined()
    g = m.groups["g"]  # type: ignore[attr-defined]
    sl = m.sync_group("g", 1, leader, "", {leader: b"L", follower: b"F"}, 100)  # type: ignore[attr-defined]
    m.release_syncs("g", 1)  # type: ignore[attr-defined]
    assert await sl == b"L" and g.state is S.STABLE and g.pending_sync == {follower}
    # The follower heartbeats but never syncs: heartbeats do not keep a pending-sync member.
    for now in range(1000, REBALANCE, 1000):
        m.heartbeat("g", 1, follower, "", now)  # type: ignore[attr-defined]
        m.heartbeat("g", 1, leader, "", now)  # type: ignore[attr-defined]
        m.tick(now)  # type: ignore[attr-defined]
        assert follower in g.members
    m.tick(REBALANCE)  # type: ignore[attr-defined]
    assert follower not in g.members and g.state is S.PREPARING_REBALANCE
    with pytest.raises(errors.GregorError) as ei:
        m.heartbeat("g", 1, follower, "", REBALANCE + 1)  # type: ignore[attr-defined]
    assert ei.value.code == errors.Code.UNKNOWN_MEMBER_ID
    with pytest.raises(errors.GregorError) as ei:
        m.heartbeat("g", 1, leader, "", REBALANCE + 1)  # type: ignore[attr-defined]
    assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS
    res = await join(m, REBALANCE + 2, member_id=leader)  # type: ignore[arg-type]
    assert res.generation_id == 2 and [x[0] for x in res.members] == [leader]


async def test_leader_that_never_syncs_is_removed_and_parked_follower_told_to_rejoin() -> None:
    m, leader, follower = await two_joined()
    g = m.groups["g"]  # type: ignore[attr-defined]
    sf = m.sync_group("g", 1, follower, "", {}, 100)  # type: ignore[attr-defined]
    assert g.pending_sync == {leader} and not sf.done()
    for now in range(1000, REBALANCE, 1000):  # the leader heartbeats but never syncs
        m.heartbeat("g", 1, leader, "", now)  # type: ignore[attr-defined]
        m.tick(now)  # type: ignore[attr-defined]
    assert leader in g.members
    m.tick(REBALANCE)  # type: ignore[attr-defined]
    assert leader not in g.members and g.state is S.PREPARING_REBALANCE
    with pytest.raises(errors.GregorError) as ei:
        await sf
    assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS


async def test_members_that_sync_in_time_are_kept_and_a_rebalance_clears_pending_syncs() -> None:
    m = manager()
    ids = await stable_group(m, 2)
    g = m.groups["g"]
    assert g.pending_sync == set()
    for now in range(0, 3 * REBALANCE, SESSION // 2):
        for i in ids:
            m.heartbeat("g", 1, i, "", now)
        m.tick(now)
    assert set(g.members) == set(ids) and g.state is S.STABLE
    # A new member triggers a rebalance; the deadline of the old generation does not apply any more.
    new = await new_member_id(m, 3 * REBALANCE)
    fut = join(m, 3 * REBALANCE, member_id=new)
    await asyncio.sleep(0)
    assert g.state is S.PREPARING_REBALANCE and g.pending_sync == set()
    futs = [join(m, 3 * REBALANCE + 1, member_id=i) for i in ids]
    results = [await f for f in [fut, *futs]]
    assert {r.generation_id for r in results} == {2} and g.pending_sync == set(ids) | {new}
    assert g.sync_deadline_ms == 3 * REBALANCE + 1 + REBALANCE
