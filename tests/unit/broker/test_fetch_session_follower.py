"""The follower's side of the replica fetch session (KIP-227): which partitions a request names (pure)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gregor.broker.replica_fetcher import PartitionFetchState, ReplicaFetcher


def fetcher(lag_ms: int = 30_000) -> ReplicaFetcher:
    f = object.__new__(ReplicaFetcher)  # no task: only the session bookkeeping
    f.manager = SimpleNamespace(replicas=SimpleNamespace(config=SimpleNamespace(replica_lag_time_max_ms=lag_ms)))
    f._sent, f._full_at = {}, 0.0
    return f


STATES: dict[tuple[int, int], PartitionFetchState] = {}


def item(partition: int, offset: int, epoch: int = 1) -> tuple[Any, ...]:
    """A partition the fetcher follows (the same state object for the same partition and epoch)."""
    st = STATES.setdefault((partition, epoch), PartitionFetchState(leader_epoch=epoch))
    return (("t", partition), st, None, offset)


OPEN = SimpleNamespace(call=SimpleNamespace(done=lambda: False))  # a stream whose session is running
NEW = SimpleNamespace(call=None)  # a new stream: a new session on the leader


def names(listed: list[tuple[Any, ...]]) -> list[tuple[int, int]]:
    return [(i[0][1], i[3]) for i in listed]


def test_full_on_a_new_stream_then_only_moved_partitions() -> None:
    f = fetcher()
    listed, incremental = f._session_request([item(0, 5), item(1, 7)], NEW, now=100.0)  # type: ignore[arg-type]
    assert not incremental and names(listed) == [(0, 5), (1, 7)]
    listed, incremental = f._session_request([item(0, 5), item(1, 7)], OPEN, now=100.1)  # type: ignore[arg-type]
    assert incremental and listed == []  # nothing moved: a bare long poll on the session
    listed, incremental = f._session_request([item(0, 6), item(1, 7)], OPEN, now=100.2)  # type: ignore[arg-type]
    assert incremental and names(listed) == [(0, 6)]
    listed, incremental = f._session_request([item(0, 6), item(1, 7, epoch=2)], OPEN, now=100.3)  # type: ignore[arg-type]
    assert incremental and names(listed) == [(1, 7)]  # a new leader epoch is news too


def test_full_again_when_the_partition_set_changes_or_the_refresh_is_due() -> None:
    f = fetcher(lag_ms=3_000)  # a full request at least every second
    f._session_request([item(0, 5), item(1, 7)], NEW, now=100.0)  # type: ignore[arg-type]
    listed, incremental = f._session_request([item(0, 5)], OPEN, now=100.1)  # type: ignore[arg-type]
    assert not incremental and names(listed) == [(0, 5)]  # partition 1 left (backing off, moved away)
    listed, incremental = f._session_request([item(0, 5)], OPEN, now=100.5)  # type: ignore[arg-type]
    assert incremental and listed == []
    listed, incremental = f._session_request([item(0, 5)], OPEN, now=101.2)  # type: ignore[arg-type]
    assert not incremental and names(listed) == [(0, 5)]  # the leader records a fresh fetch of idle ones


def test_a_partition_added_anew_is_named_even_at_the_same_offset_and_epoch() -> None:
    """A topic deleted and created again under its name: the leader's session still holds the old
    partition, so the follower names the new one although its offset and epoch look the same."""
    f = fetcher()
    f._session_request([item(5, 0), item(6, 0)], NEW, now=100.0)  # type: ignore[arg-type]
    again = (("t", 5), PartitionFetchState(leader_epoch=1), None, 0)  # removed, then added back
    listed, incremental = f._session_request([again, item(6, 0)], OPEN, now=100.1)  # type: ignore[arg-type]
    assert incremental and names(listed) == [(5, 0)]


def test_a_partition_answered_with_an_error_is_named_again() -> None:
    """The leader's session reports a partition's error once and then leaves it alone until the
    follower names it again; a follower whose only partition failed must not go on with bare
    incremental polls (it did: the partition never replicated after its first fetch came too early)."""
    from gregor.common import errors

    f = fetcher()
    f.leader_id = 0
    only = item(9, 0)
    f._session_request([only], NEW, now=100.0)  # type: ignore[arg-type]
    err = errors.error_for(errors.Code.NOT_LEADER_OR_FOLLOWER, "not yet", topic="t", partition=9)
    f._on_error(None, ("t", 9), only[1], err, SimpleNamespace(time=lambda: 100.0))  # type: ignore[arg-type]
    listed, incremental = f._session_request([only], OPEN, now=100.3)  # type: ignore[arg-type]
    assert not incremental and names(listed) == [(9, 0)]
