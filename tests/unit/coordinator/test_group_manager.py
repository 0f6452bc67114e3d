"""The pure group state machine (Kafka's GroupCoordinator) driven with a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from gregor.common import consumer_protocol as cp
from gregor.common import errors
from gregor.coordinator.group import Group, GroupState, JoinResult
from gregor.coordinator.group_manager import GroupConfig, GroupManager

S = GroupState
SESSION = 10000
REBALANCE = 20000


def meta(*topics: str) -> list[tuple[str, bytes]]:
    return [("range", cp.encode_subscription(cp.Subscription(list(topics))))]


def manager(delay_ms: int = 0) -> GroupManager:
    return GroupManager(GroupConfig(initial_rebalance_delay_ms=delay_ms))


def join(m: GroupManager, now: int, member_id: str = "", instance: str = "", topics: tuple[str, ...] = ("t",),
         group: str = "g", session: int = SESSION) -> asyncio.Future[JoinResult]:
    return m.join_group(group, member_id, instance, "client", "/127.0.0.1", session, REBALANCE, "consumer",
                        meta(*topics), now)


async def new_member_id(m: GroupManager, now: int, **kw: object) -> str:
    first = await join(m, now, **kw)  # type: ignore[arg-type]
    assert first.member_id_required and first.member_id
    return first.member_id


async def stable_group(m: GroupManager, n: int, now: int = 0) -> list[str]:
    """n dynamic members joined and synced: returns their ids (leader first)."""
    ids = [await new_member_id(m, now) for _ in range(n)]
    futs = [join(m, now, member_id=i) for i in ids]
    results = [await f for f in futs]
    gen = results[0].generation_id
    leader = results[0].leader
    syncs = [m.sync_group("g", gen, i, "", {j: j.encode() for j in ids} if i == leader else {}, now)
             for i in ids]
    m.release_syncs("g", gen)  # the driver stored the generation
    for s in syncs:
        await s
    assert m.groups["g"].state is S.STABLE
    return [leader] + [i for i in ids if i != leader]


async def test_first_join_requires_member_id_and_second_join_forms_generation_1() -> None:
    m = manager()
    mid = await new_member_id(m, 0)
    assert mid in m.groups["g"].pending_members and m.groups["g"].state is S.EMPTY
    res = await join(m, 0, member_id=mid)
    assert (res.generation_id, res.leader, res.protocol_name) == (1, mid, "range")
    assert [x[0] for x in res.members] == [mid]
    assert m.groups["g"].state is S.COMPLETING_REBALANCE


async def test_join_waits_for_every_member_then_sync_makes_group_stable() -> None:
    m = manager()
    a, b = await new_member_id(m, 0), await new_member_id(m, 0)
    fa = join(m, 0, member_id=a)
    await asyncio.sleep(0)
    assert not fa.done(), "b's member id is still pending: the join phase must wait for it"
    fb = join(m, 1, member_id=b)
    ra, rb = await fa, await fb
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader == rb.leader == a and len(ra.members) == 2 and rb.members == []
    sb = m.sync_group("g", 1, b, "", {}, 2)
    assert not sb.done() and m.groups["g"].state is S.COMPLETING_REBALANCE
    sa = m.sync_group("g", 1, a, "", {a: b"A", b: b"B"}, 3)
    assert m.groups["g"].state is S.STABLE and m.groups["g"].awaiting_store
    await asyncio.sleep(0)
    assert not sa.done() and not sb.done(), "answers wait until the generation is stored"
    m.release_syncs("g", 1)
    assert (await sa, await sb) == (b"A", b"B")


async def test_join_while_generation_is_being_stored_sends_parked_members_to_rejoin() -> None:
    m = manager()
    a, b = await new_member_id(m, 0), await new_member_id(m, 0)
    fa, fb = join(m, 0, member_id=a), join(m, 0, member_id=b)
    await fa, await fb
    sa = m.sync_group("g", 1, a, "", {a: b"A", b: b"B"}, 1)  # leader: Stable, store in flight
    sb = m.sync_group("g", 1, b, "", {}, 1)  # arrives before the store completes: parked too
    await asyncio.sleep(0)
    assert not sb.done()
    c = await new_member_id(m, 2)
    join(m, 2, member_id=c)  # rebalance before the store finished
    for fut in (sa, sb):
        with pytest.raises(errors.RebalanceInProgressError):  # type: ignore[attr-defined]
            await fut
    m.release_syncs("g", 1)  # the late store completion changes nothing
    assert m.groups["g"].state is S.PREPARING_REBALANCE and not m.groups["g"].awaiting_store


async def test_failed_store_voids_assignments_and_rebalances() -> None:
    m = manager()
    a = await new_member_id(m, 0)
    await join(m, 0, member_id=a)
    sa = m.sync_group("g", 1, a, "", {a: b"A"}, 1)
    m.on_store_failed("g", 1, errors.error_for(errors.Code.COORDINATOR_NOT_AVAILABLE), 2)
    with pytest.raises(errors.GregorError) as ei:
        await sa
    assert ei.value.code == errors.Code.COORDINATOR_NOT_AVAILABLE
    g = m.groups["g"]
    assert g.state is S.PREPARING_REBALANCE and g.members[a].assignment == b""


async def test_new_member_triggers_rebalance_heartbeat_says_rebalance_in_progress() -> None:
    m = manager()
    a, b = await stable_group(m, 2)
    c = await new_member_id(m, 10)
    fc = join(m, 10, member_id=c)
    assert m.groups["g"].state is S.PREPARING_REBALANCE
    with pytest.raises(errors.GregorError) as ei:
        m.heartbeat("g", 1, a, "", 11)
    assert ei.value.code == errors.Code.REBALANCE_IN_PROGRESS
    fa, fb = join(m, 12, member_id=a), join(m, 12, member_id=b)
    results = [await f for f in (fa, fb, fc)]
    assert {r.generation_id for r in results} == {2}
    with pytest.raises(errors.GregorError) as ei:
        m.heartbeat("g", 1, a, "", 13)
    assert ei.value.code == errors.Code.ILLEGAL_GENERATION


async def test_session_timeout_evicts_member_and_rebalances() -> None:
    m = manager()
    a, b = await stable_group(m, 2)
    m.heartbeat("g", 1, a, "", SESSION - 1)
    m.tick(SESSION)  # b's session (from its sync at 0) expired; a heartbeated at SESSION - 1
    g = m.groups["g"]
    assert b not in g.members and a in g.members
    assert g.state is S.PREPARING_REBALANCE and m.rebalances_total == 2
    res = await join(m, SESSION + 1, member_id=a)
    assert res.generation_id == 2 and len(res.members) == 1


async def test_member_that_does_not_rejoin_is_dropped_at_rebalance_timeout() -> None:
    m = manager()
    a, b = await stable_group(m, 2)
    fa = join(m, 100, member_id=a, topics=("t", "u"))  # subscription change -> rebalance
    assert m.groups["g"].state is S.PREPARING_REBALANCE
    for t in (9000, 18000):  # b stays alive (heartbeats answer REBALANCE_IN_PROGRESS) but never rejoins
        with pytest.raises(errors.RebalanceInProgressError):  # type: ignore[attr-defined]
            m.heartbeat("g", 1, b, "", t)
        m.tick(t)
    m.tick(100 + REBALANCE - 1)
    assert not fa.done()
    m.tick(100 + REBALANCE)
    res = await fa
    assert res.generation_id == 2 and [x[0] for x in res.members] == [a]


async def test_leave_group_rebalances_and_last_leave_empties_group() -> None:
    m = manager()
    a, b = await stable_group(m, 2)
    m.leave_group("g", b, "", 5)
    assert m.groups["g"].state is S.PREPARING_REBALANCE
    await join(m, 6, member_id=a)
    m.leave_group("g", a, "", 7)
    g = m.groups["g"]
    assert g.state is S.EMPTY and not g.members  # nobody left to wait for: the join phase completes at once
    assert g.generation_id == 3
    with pytest.raises(errors.GregorError) as ei:
        m.leave_group("g", a, "", 9)
    assert ei.value.code == errors.Code.UNKNOWN_MEMBER_ID


async def test_static_member_rejoin_replaces_old_member_without_rebalance() -> None:
    m = manager()
    r1 = await join(m, 0, instance="i-1")  # static members get their id at once
    assert not r1.member_id_required
    old = r1.member_id
    s1 = m.sync_group("g", 1, old, "i-1", {old: b"A"}, 1)
    m.release_syncs("g", 1)
    await s1
    gen, rebalances = m.groups["g"].generation_id, m.rebalances_total
    r2 = await join(m, 2, instance="i-1")  # restarted: no member id, same instance id
    g = m.groups["g"]
    assert r2.member_id != old and r2.generation_id == gen and g.state is S.STABLE
    assert m.rebalances_total == rebalances
    assert await m.sync_group("g", gen, r2.member_id, "i-1", {}, 3) == b"A"
    with pytest.raises(errors.GregorError) as ei:
        m.heartbeat("g", gen, old, "i-1", 4)
    assert ei.value.code == errors.Code.FENCED_INSTANCE_ID


async def test_session_timeout_bounds_and_typed_errors() -> None:
    m = manager()
    for bad in (5999, 1800001):
        with pytest.raises(errors.GregorError) as ei:
            join(m, 0, session=bad)
        assert ei.value.code == errors.Code.INVALID_SESSION_TIMEOUT
    with pytest.raises(errors.GregorError) as ei:
        join(m, 0, member_id="nobody")
    assert ei.value.code == errors.Code.UNKNOWN_MEMBER_ID
    a, = await stable_group(m, 1)
    with pytest.raises(errors.GregorError) as ei:
        m.sync_group("g", 7, a, "", {}, 1)
    assert ei.value.code == errors.Code.ILLEGAL_GENERATION
    with pytest.raises(errors.GregorError) as ei:
        m.join_group("g", "", "", "c", "h", SESSION, REBALANCE, "connect", meta("t"), 1)
    assert ei.value.code == errors.Code.INCONSISTENT_GROUP_PROTOCOL


async def test_initial_rebalance_delay_waits_for_more_members() -> None:
    m = manager(delay_ms=3000)
    a = await new_member_id(m, 0)
    fa = join(m, 0, member_id=a)
    m.tick(2999)
    assert not fa.done()
    b = await new_member_id(m, 1000)
    fb = join(m, 1000, member_id=b)  # extends the delay to 4000
    m.tick(3999)
    assert not fa.done()
    m.tick(4000)
    assert (await fa).generation_id == (await fb).generation_id == 1
    assert len((await fa).members) == 2


async def test_partition_count_change_rebalances_subscribed_groups_only() -> None:
    m = manager()
    await stable_group(m, 1)
    assert m.on_topic_partitions_changed("other", 5) == []
    assert m.groups["g"].state is S.STABLE
    assert m.on_topic_partitions_changed("t", 5) == ["g"]
    assert m.groups["g"].state is S.PREPARING_REBALANCE


async def test_offset_commit_rules_and_delete() -> None:
    m = manager()
    g = m.validate_offset_commit("simple", -1, "", "", 0)  # admin commit creates an Empty group
    assert g.state is S.EMPTY
    a, = await stable_group(m, 1)
    assert m.validate_offset_commit("g", 1, a, "", 1) is m.groups["g"]
    for gen, mid, code in ((-1, "", errors.Code.UNKNOWN_MEMBER_ID), (0, a, errors.Code.ILLEGAL_GENERATION)):
        with pytest.raises(errors.GregorError) as ei:
            m.validate_offset_commit("g", gen, mid, "", 2)
        assert ei.value.code == code
    with pytest.raises(errors.GregorError) as ei:
        m.validate_delete("g")
    assert ei.value.code == errors.Code.NON_EMPTY_GROUP
    with pytest.raises(errors.GregorError) as ei:
        m.validate_delete("nope")
    assert ei.value.code == errors.Code.GROUP_ID_NOT_FOUND
    m.validate_delete("simple")
    m.mark_dead("simple", 3)
    assert "simple" not in m.groups


async def test_expired_groups_are_the_long_empty_ones() -> None:
    m = manager()
    m.validate_offset_commit("old", -1, "", "", 0)
    m.validate_offset_commit("new", -1, "", "", 500)
    assert [g.group_id for g in m.expired_groups(1000, 600)] == ["old"]


def test_illegal_transition_raises() -> None:
    g = Group("g")
    with pytest.raises(errors.GregorError):
        g.transition_to(S.STABLE, 0)
    g.transition_to(S.PREPARING_REBALANCE, 0)
    g.transition_to(S.COMPLETING_REBALANCE, 0)
    g.transition_to(S.STABLE, 0)
    g.transition_to(S.DEAD, 0)
    with pytest.raises(errors.GregorError):
        g.transition_to(S.EMPTY, 0)


async def test_txn_offset_commit_sender_is_checked_by_member_and_generation_only() -> None:
    """KIP-447 (Kafka's doTxnCommitOffsets): a zombie is refused, the group id alone (pre-447) is accepted,
    and a rebalance in progress does not refuse the current member (no REBALANCE_IN_PROGRESS)."""
    m = manager()
    a, b = await stable_group(m, 2)
    gen = m.groups["g"].generation_id
    m.validate_txn_offset_commit("g", gen, a, "")
    m.validate_txn_offset_commit("g", -1, "", "")  # a group id only
    m.validate_txn_offset_commit("unknown", -1, "", "")
    with pytest.raises(errors.IllegalGenerationError):  # type: ignore[attr-defined]
        m.validate_txn_offset_commit("g", gen - 1, a, "")
    with pytest.raises(errors.UnknownMemberIdError):  # type: ignore[attr-defined]
        m.validate_txn_offset_commit("g", gen, "gone-member", "")
    with pytest.raises(errors.IllegalGenerationError):  # type: ignore[attr-defined]
        m.validate_txn_offset_commit("unknown", 1, "x", "")
    join(m, 1, member_id=b)  # a rebalance starts: still the current generation until it completes
    m.validate_txn_offset_commit("g", gen, a, "")


async def test_txn_offset_commit_of_a_replaced_static_member_is_fenced() -> None:
    m = manager()
    r1 = await join(m, 0, instance="i-1")
    old = r1.member_id
    await join(m, 2, instance="i-1")
    new = m.groups["g"].static_members["i-1"]
    assert new != old
    with pytest.raises(errors.FencedInstanceIdError):  # type: ignore[attr-defined]
        m.validate_txn_offset_commit("g", m.groups["g"].generation_id, old, "i-1")
    m.validate_txn_offset_commit("g", m.groups["g"].generation_id, new, "i-1")


async def test_a_member_leaving_with_its_join_unanswered_logs_no_unretrieved_future() -> None:
    """A client whose JoinGroup call was cancelled (its handler gone) then sends LeaveGroup: the join's
    future gets UNKNOWN_MEMBER_ID with nobody awaiting it. That must not log asyncio's "Future exception
    was never retrieved" when the future is collected (seen in coordinator logs after LeaveGroup)."""
    import gc
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:
        m = manager()
        a, b = await stable_group(m, 2)
        fut = join(m, 5, member_id=a)  # a rejoins: the group prepares a rebalance and waits for b
        assert not fut.done()
        m.leave_group("g", a, "", 6)  # a's caller gave up on that JoinGroup and leaves
        assert fut.done() and not fut.cancelled()
        del fut
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert not [c for c in seen if "never retrieved" in str(c.get("message", ""))], seen
