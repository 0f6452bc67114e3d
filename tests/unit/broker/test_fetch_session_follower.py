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


def item(partition: int, offset: int, epoch: int = 1) -> tuple[Any, ...]:
    return (("t", partition), PartitionFetchState(leader_epoch=epoch), None, offset)


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
