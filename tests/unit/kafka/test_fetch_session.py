"""KIP-227 fetch session bookkeeping (gregor.broker.fetch_session, the broker's one session cache), pure logic."""

from __future__ import annotations

import pytest

from gregor.broker.fetch_session import (
    FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, CachedPartition, FetchSessionCache, FetchSessionError,
)


def part(offset: int) -> CachedPartition:
    return CachedPartition(fetch_offset=offset, max_bytes=1024)


def test_sessionless_full_fetch_opens_nothing() -> None:
    cache = FetchSessionCache()
    ctx = cache.resolve(0, -1, [(("t", 0), part(5))], [])
    assert ctx.session is None and not ctx.incremental and [tp for tp, _ in ctx.partitions] == [("t", 0)]
    assert cache.sessions == {}


def test_incremental_requests_update_add_and_forget_partitions() -> None:
    cache = FetchSessionCache()
    full = cache.resolve(0, 0, [(("t", 0), part(0)), (("t", 1), part(0))], [])
    assert full.session is not None and not full.incremental
    sid = full.session.session_id
    inc = cache.resolve(sid, 1, [(("t", 1), part(7)), (("u", 0), part(0))], [("t", 0)])
    assert inc.incremental
    assert {tp: p.fetch_offset for tp, p in inc.partitions} == {("t", 1): 7, ("u", 0): 0}
    with pytest.raises(FetchSessionError) as stale:
        cache.resolve(sid, 1, [], [])  # epoch 1 again: the next one is 2
    assert stale.value.code == INVALID_FETCH_SESSION_EPOCH
    assert cache.resolve(sid, 2, [], []).incremental


def test_changed_reports_only_moved_watermarks() -> None:
    p = part(0)
    assert p.changed(10, 10, 0)  # first answer: new to the client
    assert not p.changed(10, 10, 0)
    assert p.changed(11, 11, 0)


def test_final_epoch_closes_and_unknown_ids_are_not_found() -> None:
    cache = FetchSessionCache()
    sid = cache.resolve(0, 0, [(("t", 0), part(0))], []).session.session_id  # type: ignore[union-attr]
    assert cache.resolve(sid, -1, [(("t", 0), part(3))], []).session is None
    with pytest.raises(FetchSessionError) as gone:
        cache.resolve(sid, 1, [], [])
    assert gone.value.code == FETCH_SESSION_ID_NOT_FOUND


def test_least_recently_used_session_is_evicted_when_slots_run_out() -> None:
    cache = FetchSessionCache(max_slots=2)
    a = cache.resolve(0, 0, [], []).session.session_id  # type: ignore[union-attr]
    b = cache.resolve(0, 0, [], []).session.session_id  # type: ignore[union-attr]
    cache.resolve(a, 1, [], [])  # a used: b is now the oldest
    cache.resolve(0, 0, [], [])
    assert a in cache.sessions and b not in cache.sessions
