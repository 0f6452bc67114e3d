"""The follower's side of the replica fetch session (KIP-227): which partitions a request names (pure).

FollowerFetchState is the IO-free state both ReplicaFetcher and the simulation (tests/sim) drive.
"""

from __future__ import annotations

from gregor.broker.fetcher_state import FollowerFetchState, PartitionFetchState
from gregor.common import errors

Item = tuple[tuple[str, int], PartitionFetchState, int]


def fetcher(lag_ms: int = 30_000) -> FollowerFetchState[tuple[str, int]]:
    return FollowerFetchState.for_lag_time(lag_ms)


STATES: dict[tuple[int, int], PartitionFetchState] = {}


def item(partition: int, offset: int, epoch: int = 1) -> Item:
    """A partition the fetcher follows (the same state object for the same partition and epoch)."""
    st = STATES.setdefault((partition, epoch), PartitionFetchState(leader_epoch=epoch))
    return (("t", partition), st, offset)


OPEN, NEW = False, True  # a stream whose session is running; a new stream (a new session on the leader)


def request(f: FollowerFetchState[tuple[str, int]], batch: list[Item], new_stream: bool,
            now: float) -> tuple[list[tuple[int, int]], bool]:
    listed, incremental = f.session_request(batch, new_stream, now)
    return [(batch[i][0][1], batch[i][2]) for i in listed], incremental


def test_full_on_a_new_stream_then_only_moved_partitions() -> None:
    f = fetcher()
    listed, incremental = request(f, [item(0, 5), item(1, 7)], NEW, now=100.0)
    assert not incremental and listed == [(0, 5), (1, 7)]
    listed, incremental = request(f, [item(0, 5), item(1, 7)], OPEN, now=100.1)
    assert incremental and listed == []  # nothing moved: a bare long poll on the session
    listed, incremental = request(f, [item(0, 6), item(1, 7)], OPEN, now=100.2)
    assert incremental and listed == [(0, 6)]
    listed, incremental = request(f, [item(0, 6), item(1, 7, epoch=2)], OPEN, now=100.3)
    assert incremental and listed == [(1, 7)]  # a new leader epoch is news too


def test_full_again_when_the_partition_set_changes_or_the_refresh_is_due() -> None:
    f = fetcher(lag_ms=3_000)  # a full request at least every second
    request(f, [item(0, 5), item(1, 7)], NEW, now=100.0)
    listed, incremental = request(f, [item(0, 5)], OPEN, now=100.1)
    assert not incremental and listed == [(0, 5)]  # partition 1 left (backing off, moved away)
    listed, incremental = request(f, [item(0, 5)], OPEN, now=100.5)
    assert incremental and listed == []
    listed, incremental = request(f, [item(0, 5)], OPEN, now=101.2)
    assert not incremental and listed == [(0, 5)]  # the leader records a fresh fetch of idle ones


def test_partitions_added_to_a_large_session_are_named_incrementally() -> None:
    """New partitions (a creation's LeaderAndIsr chunks) are added to the leader's session by an incremental
    request naming only them; before, every addition re-listed the whole session (issue 24)."""
    f = fetcher()
    request(f, [item(p, 0) for p in range(300)], NEW, now=100.0)
    listed, incremental = request(f, [item(p, 0) for p in range(400)], OPEN, now=100.1)
    assert incremental and listed == [(p, 0) for p in range(300, 400)]
    listed, incremental = request(f, [item(p, 0) for p in range(400)], OPEN, now=100.2)
    assert incremental and listed == []
    listed, incremental = request(f, [item(p, 0) for p in range(1, 400)], OPEN, now=100.3)
    assert not incremental and len(listed) == 399  # one left: only a full request takes it out


def test_a_partition_added_anew_is_named_even_at_the_same_offset_and_epoch() -> None:
    """A topic deleted and created again under its name: the leader's session still holds the old
    partition, so the follower names the new one although its offset and epoch look the same."""
    f = fetcher()
    request(f, [item(5, 0), item(6, 0)], NEW, now=100.0)
    again = (("t", 5), PartitionFetchState(leader_epoch=1), 0)  # removed, then added back
    listed, incremental = request(f, [again, item(6, 0)], OPEN, now=100.1)
    assert incremental and listed == [(5, 0)]


def test_a_partition_answered_with_an_error_is_named_again() -> None:
    """The leader's session reports a partition's error once and then leaves it alone until the
    follower names it again; a follower whose only partition failed must not go on with bare
    incremental polls (it did: the partition never replicated after its first fetch came too early)."""
    f = fetcher()
    only = item(9, 0)
    request(f, [only], NEW, now=100.0)
    outcome = f.on_error(("t", 9), only[1], errors.Code.NOT_LEADER_OR_FOLLOWER, now=100.0)
    assert not outcome.restart_truncation and not outcome.unexpected
    assert only[1].backoff_until > 100.0
    listed, incremental = request(f, [only], OPEN, now=100.3)
    assert listed == [(9, 0)]


def test_out_of_range_truncates_again_instead_of_backing_off() -> None:
    f = fetcher()
    st = f.add(("t", 1), leader_epoch=3)
    outcome = f.on_error(("t", 1), st, errors.Code.OFFSET_OUT_OF_RANGE, now=5.0)
    assert outcome.restart_truncation and st.out_of_range and st.backoff_until == 0.0
    f.truncation_finished(st)
    assert not st.out_of_range


def test_truncation_stops_when_converged_when_the_epoch_stays_or_after_max_rounds() -> None:
    from gregor.broker.limits import MAX_TRUNCATION_ROUNDS

    st = PartitionFetchState(leader_epoch=7)
    assert FollowerFetchState.truncation_round_done(st, True, 4, 3)  # the ReplicationState says done
    assert FollowerFetchState.truncation_round_done(st, False, 4, 4)  # asking again gets the same answer
    rounds = [FollowerFetchState.truncation_round_done(st, False, 10 - n, 9 - n)
              for n in range(MAX_TRUNCATION_ROUNDS)]
    assert rounds == [False] * (MAX_TRUNCATION_ROUNDS - 1) + [True]


def test_moved_request_names_only_moved_partitions_until_the_refresh() -> None:
    """The fetcher's steady case (issue 24): the same partitions as the last request, so only those whose
    answers it applied are looked at; what did not change since it was last named is not named again."""
    f = fetcher(lag_ms=3_000)
    a, b = item(0, 5), item(1, 7)
    assert f.session_request([a, b], NEW, 100.0, [0, 0]) == ([0, 1], False)  # both at log start 0
    assert f.moved_request([(a[0], a[1], 6, 0)], now=100.1) == [0]
    assert f.moved_request([(a[0], a[1], 6, 0), (b[0], b[1], 7, 0)], now=100.2) == []  # named already / unmoved
    assert f.moved_request([(b[0], b[1], 7, 3)], now=100.3) == [0]  # a new log start is news too
    assert f.moved_request([(a[0], a[1], 6, 0)], now=101.1) is None  # the full refresh is due


def test_version_moves_with_the_partition_set_and_backoffs_not_with_fetches() -> None:
    f = fetcher()
    v0 = f.version
    st = f.add(("t", 0), 1)
    f.add(("t", 1), 1)
    assert f.version == v0 + 2
    v = f.version
    request(f, [(("t", 0), st, 5)], NEW, now=1.0)
    f.moved_request([(("t", 0), st, 6, 0)], now=1.1)
    assert f.version == v  # fetching does not move it
    f.on_error(("t", 0), st, errors.Code.NOT_LEADER_OR_FOLLOWER, now=1.2)  # backs off, forgotten
    assert f.version == v + 1
    f.drop(("t", 1))
    f.drop(("t", 1))  # already gone: no change
    assert f.version == v + 2
    f.on_truncation_failed(st, now=1.3)
    assert f.version == v + 3
