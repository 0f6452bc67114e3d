"""The replica state machine alone (no log, no clock): each rule it owns, and properties over random events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gregor.broker.replication_state import (
    CompleteDelayed,
    FetchMode,
    HighWatermarkChanged,
    ProposeIsr,
    ReplicationState,
    Role,
    StartFetcher,
    StartLogAt,
    StopFetcher,
    TruncateLog,
)
from gregor.common import errors

LAG = 1_000


def leader(isr: tuple[int, ...] = (1, 2, 3), leo: int = 0, epoch: int = 5, now: int = 0) -> ReplicationState:
    s = ReplicationState(1, LAG, "t", 0)
    assert s.on_leader_and_isr(1, epoch, isr, [1, 2, 3], 10, leo, 0, now).applied
    return s


def follower(epoch: int = 5) -> ReplicationState:
    s = ReplicationState(2, LAG, "t", 0)
    assert s.on_leader_and_isr(1, epoch, (1, 2, 3), [1, 2, 3], 10, 0, 0, 0).applied
    return s


def hw_of(effects: list[object]) -> int | None:
    return next((e.high_watermark for e in effects if isinstance(e, HighWatermarkChanged)), None)


# -- LeaderAndIsr ----------------------------------------------------------------------


def test_becoming_leader_stops_fetching_records_the_term_start_and_wakes_waiters() -> None:
    s = ReplicationState(1, LAG)
    out = s.on_leader_and_isr(1, 3, (1, 2), [1, 2, 3], 7, 42, 0, 100)
    assert out.applied and s.role is Role.LEADER and s.leader_epoch == 3 and s.partition_epoch == 7
    assert StopFetcher() in out.effects
    assert CompleteDelayed() in out.effects
    assert s.leader_epoch_start_offset == 42 and set(s.follower_states) == {2, 3}
    # ISR members count as caught up now, others as never.
    assert s.follower_states[2].last_caught_up_time_ms == 100 and s.follower_states[3].last_caught_up_time_ms == 0


def test_becoming_follower_starts_a_fetcher_that_truncates_first() -> None:
    s = follower()
    assert s.role is Role.FOLLOWER and s.fetch_mode is FetchMode.TRUNCATING and s.follower_states == {}
    out = s.on_leader_and_isr(3, 6, (3, 2), [1, 2, 3], 11, 0, 0, 0)
    assert StartFetcher(3, 6) in out.effects and s.leader_id == 3


def test_older_epoch_is_stale() -> None:
    s = leader(epoch=5)
    out = s.on_leader_and_isr(2, 4, (2,), [1, 2, 3], 99, 0, 0, 0)
    assert out.error == errors.Code.STALE_CONTROLLER_EPOCH and out.effects == []
    assert s.role is Role.LEADER and s.leader_epoch == 5


def test_same_epoch_resent_is_stale_and_keeps_what_fetches_told_us() -> None:
    """Kafka ignores a LeaderAndIsr whose leader epoch is not newer (ReplicaManager.becomeLeaderOrFollower)."""
    s = leader(leo=10)
    s.on_follower_fetch(2, 10, -1, 10, 5)
    out = s.on_leader_and_isr(1, 5, (1, 2, 3), [1, 2, 3], 10, 10, 0, 6)
    assert out.error == errors.Code.STALE_CONTROLLER_EPOCH and out.effects == []
    assert s.follower_states[2].log_end_offset == 10
    f = follower()
    f.fetch_mode = FetchMode.FETCHING
    assert f.on_leader_and_isr(1, 5, (1, 2, 3), [1, 2, 3], 10, 0, 0, 0).error == errors.Code.STALE_CONTROLLER_EPOCH
    assert f.fetch_mode is FetchMode.FETCHING  # a duplicate does not truncate again


def test_same_epoch_newer_partition_epoch_updates_the_isr_within_the_term() -> None:
    s = leader(leo=10)
    s.on_follower_fetch(2, 10, -1, 10, 5)
    out = s.on_leader_and_isr(1, 5, (1, 2), [1, 2, 3], 11, 10, 0, 6)
    assert out.applied and s.isr == {1, 2} and s.partition_epoch == 11
    assert s.follower_states[2].log_end_offset == 10 and s.leader_epoch_start_offset == 10  # same term
    assert StopFetcher() not in out.effects


def test_a_stopped_replica_takes_its_epoch_again() -> None:
    s = follower()
    assert StopFetcher() in s.on_stop_replica() and s.role is Role.NONE and s.leader_id == -1
    with pytest.raises(errors.GregorError):
        s.check_leader()
    out = s.on_leader_and_isr(1, 5, (1, 2, 3), [1, 2, 3], 10, 0, 0, 0)
    assert out.applied and StartFetcher(1, 5) in out.effects


def test_no_leader_means_no_fetcher() -> None:
    s = follower()
    out = s.on_leader_and_isr(-1, 6, (2,), [1, 2, 3], 12, 0, 0, 0)
    assert out.applied and s.role is Role.NONE and StopFetcher() in out.effects


# -- leader checks ---------------------------------------------------------------------


@pytest.mark.parametrize("epoch,code", [(4, errors.Code.FENCED_LEADER_EPOCH),
                                        (6, errors.Code.UNKNOWN_LEADER_EPOCH)])
def test_check_leader_fences_other_epochs(epoch: int, code: int) -> None:
    with pytest.raises(errors.GregorError) as info:
        leader().check_leader(epoch)
    assert info.value.code == code and info.value.topic == "t"


def test_follower_is_not_leader() -> None:
    with pytest.raises(errors.GregorError) as info:
        follower().check_leader()
    assert info.value.code == errors.Code.NOT_LEADER_OR_FOLLOWER


def test_list_offsets_waits_until_the_hw_reaches_the_terms_start() -> None:
    # Found by the chaos suite (seed 7): a re-elected leader answered ListOffsets with its follower-time HW,
    # below an offset the previous leader had acknowledged with acks=all.
    s = leader(leo=10)
    assert s.high_watermark == 0
    with pytest.raises(errors.GregorError) as info:
        s.check_offsets_available()
    assert info.value.code == errors.Code.OFFSET_NOT_AVAILABLE and info.value.retriable
    s.on_follower_fetch(2, 10, -1, 10, 1)
    s.on_follower_fetch(3, 10, -1, 10, 1)
    assert s.high_watermark == 10
    s.check_offsets_available()
    follower().check_offsets_available()  # not the leader: check_leader answers that


def test_acks_all_needs_min_insync_replicas() -> None:
    s = leader(isr=(1,))
    s.check_append(1, 2)
    with pytest.raises(errors.GregorError) as info:
        s.check_append(-1, 2)
    assert info.value.code == errors.Code.NOT_ENOUGH_REPLICAS


def test_stale_broker_epoch() -> None:
    s = leader()
    s.on_follower_fetch(2, 0, 100, 0, 1)
    with pytest.raises(errors.GregorError) as info:
        s.check_follower_fetch(2, 90, None)
    assert info.value.code == errors.Code.STALE_BROKER_EPOCH
    s.check_follower_fetch(2, 100, 100)


# -- high watermark (seeds 000, 003, 004) ----------------------------------------------------


def test_hw_is_min_leo_of_the_isr_and_never_goes_back() -> None:
    s = leader(leo=0)
    assert s.on_local_append(5, 1) == []  # followers not heard from hold it
    s.on_follower_fetch(2, 5, -1, 5, 2)
    assert hw_of(s.on_follower_fetch(3, 3, -1, 5, 3)) == 3
    assert hw_of(s.on_follower_fetch(3, 2, -1, 5, 4)) is None and s.high_watermark == 3  # never back
    assert hw_of(s.on_follower_fetch(3, 5, -1, 5, 5)) == 5


def test_hw_moves_once_a_lagging_follower_leaves_the_isr() -> None:
    s = leader(leo=0)
    s.on_follower_fetch(2, 4, -1, 4, 1)
    s.on_follower_fetch(3, 0, -1, 4, 1)
    assert s.high_watermark == 0
    proposal = next(e for e in s.on_tick(4, LAG + 1) if isinstance(e, ProposeIsr))
    assert proposal.remove == {3} and proposal.isr == (1, 2) and proposal.leader_epoch == 5
    assert s.isr == {1, 2, 3}  # nothing applied before the write succeeds
    effects = s.on_isr_write_result(5, [1, 2], 11, 4, LAG + 2)
    assert s.isr == {1, 2} and hw_of(effects) == 4 and s.partition_epoch == 11


def test_caught_up_follower_outside_isr_holds_the_hw_only_if_eligible() -> None:
    s = leader(isr=(1, 2), leo=3)
    live = {1: 1, 2: 20, 3: 31}  # the controller knows a newer incarnation of 3: this one may not join
    assert not [e for e in s.on_follower_fetch(3, 3, 30, 3, 10, live) if isinstance(e, ProposeIsr)]
    s.on_follower_fetch(2, 5, 20, 5, 20)  # no live list: 3 (caught up at LEO 3) is waited for
    assert s.high_watermark == 3
    assert hw_of(s.on_local_append(5, 21, live)) == 5  # with it, 3 is not eligible: not waited for


def test_follower_hw_is_min_of_leader_hw_and_own_leo_and_never_back() -> None:
    s = follower()
    assert s.on_follower_fetched(7, 4) == [HighWatermarkChanged(4)]
    assert s.on_follower_fetched(2, 9) == [] and s.high_watermark == 4


# -- ISR shrink / expand (seed 000) ----------------------------------------------------------


def test_follower_at_leader_leo_is_never_shrunk() -> None:
    s = leader(leo=0)
    s.on_follower_fetch(2, 0, -1, 0, 0)
    s.on_follower_fetch(3, 0, -1, 0, 0)
    assert not [e for e in s.on_tick(0, 100 * LAG) if isinstance(e, ProposeIsr)]


def test_one_isr_write_in_flight() -> None:
    s = leader(leo=4)
    assert [e for e in s.on_tick(4, LAG + 1) if isinstance(e, ProposeIsr)]
    assert not [e for e in s.on_tick(4, LAG + 2) if isinstance(e, ProposeIsr)]
    s.on_isr_write_result(5, None, -1, 4, LAG + 3)  # failed
    assert [e for e in s.on_tick(4, LAG + 4) if isinstance(e, ProposeIsr)]


def test_isr_write_result_of_an_old_term_is_ignored() -> None:
    s = leader(leo=4)
    s.on_tick(4, LAG + 1)
    s.on_leader_and_isr(1, 6, (1, 2, 3), [1, 2, 3], 12, 4, 0, LAG + 2)
    assert s.on_isr_write_result(5, [1], 11, 4, LAG + 3) == [] and s.isr == {1, 2, 3}


def test_expand_needs_the_hw_and_this_terms_start() -> None:
    s = leader(isr=(1, 2), leo=10, now=5 * LAG)  # term starts at 10; 3 was never caught up
    s.on_follower_fetch(2, 10, -1, 10, 5 * LAG + 1)
    assert s.high_watermark == 10
    assert not [e for e in s.on_follower_fetch(3, 9, -1, 10, 5 * LAG + 2) if isinstance(e, ProposeIsr)]
    proposals = [e for e in s.on_follower_fetch(3, 10, 7, 10, 5 * LAG + 3) if isinstance(e, ProposeIsr)]
    assert proposals and proposals[0].add == {3} and proposals[0].isr == (1, 2, 3)


def test_only_the_live_incarnation_expands() -> None:
    s = leader(isr=(1, 2), leo=0)
    assert not [e for e in s.on_follower_fetch(3, 0, 7, 0, 1, {1: 1, 2: 2, 3: 9}) if isinstance(e, ProposeIsr)]
    assert [e for e in s.on_follower_fetch(3, 0, 9, 0, 2, {1: 1, 2: 2, 3: 9}) if isinstance(e, ProposeIsr)]


# -- truncation (seed 002) -------------------------------------------------------------------


def test_no_epoch_truncates_to_the_hw() -> None:
    s = follower()
    s.high_watermark = 3
    assert s.truncation_query(None, 8) == TruncateLog(3) and s.fetch_mode is FetchMode.FETCHING


def test_truncation_by_leader_epoch() -> None:
    s = follower()
    assert s.truncation_query(4, 12) == 4
    # Leader has epoch 4 ending at 9: our records 9..11 of epoch 4 were never committed.
    effect, done = s.on_truncation_point(4, 9, [(2, 0), (4, 5)], 12)
    assert effect == TruncateLog(9) and done and s.fetch_mode is FetchMode.FETCHING


def test_truncation_asks_again_when_the_leader_answers_an_epoch_we_do_not_have() -> None:
    s = follower()
    effect, done = s.on_truncation_point(3, 8, [(2, 0), (4, 5)], 12)  # leader knows 3, we jumped 2 -> 4
    assert effect == TruncateLog(5) and not done and s.fetch_mode is FetchMode.TRUNCATING


def test_truncation_lowers_a_hw_above_the_cut() -> None:
    s = follower()
    s.high_watermark = 10
    s.on_truncation_point(4, 6, [(4, 0)], 12)
    assert s.high_watermark == 6


def test_out_of_range_restarts_truncation_and_resets_to_the_leader_log_start() -> None:
    s = follower()
    s.finish_truncation(3)
    s.restart_truncation()
    assert s.fetch_mode is FetchMode.TRUNCATING
    assert s.on_leader_log_range(100, 150, 3) == StartLogAt(100) and s.high_watermark == 100
    assert s.on_leader_log_range(0, 150, 160) == TruncateLog(150)
    assert s.on_leader_log_range(0, 150, 120) is None


# -- properties ---------------------------------------------------------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5)),
    st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 100)),
    st.tuples(st.just("tick"), st.integers(1, 2 * LAG)),
    st.tuples(st.just("isr_ok"), st.booleans()),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events)
def test_leader_hw_never_regresses_never_passes_the_leo_nor_an_isr_member(evs: list[tuple]) -> None:
    s = leader(leo=0)
    leo, now, pending, leos = 0, 0, None, {2: 0, 3: 0}
    for ev in evs:
        before = s.high_watermark
        if ev[0] == "append":
            leo += ev[1]
            effects = s.on_local_append(leo, now)
        elif ev[0] == "fetch":
            leos[ev[1]] = offset = min(ev[2], leo)
            effects = s.on_follower_fetch(ev[1], offset, -1, leo, now)
        elif ev[0] == "tick":
            now += ev[1]
            effects = s.on_tick(leo, now)
        else:
            effects = []
            if pending is not None:
                effects = s.on_isr_write_result(pending.leader_epoch, pending.isr if ev[1] else None,
                                                s.partition_epoch + 1, leo, now)
                pending = None
        pending = next((e for e in effects if isinstance(e, ProposeIsr)), pending)
        assert before <= s.high_watermark <= leo
        assert 1 in s.isr and s.isr <= {1, 2, 3}
        for r in s.isr - {1}:
            assert s.high_watermark <= max(leos[r], before)


def test_hw_counts_a_replica_whose_isr_expansion_is_in_flight_or_uncertain() -> None:
    """Found by tests/sim: the store may already list the new member (the controller can elect it)
    while the leader has not heard the write's result; the HW must not pass that member's LEO."""
    s = leader(isr=(1, 2), leo=4, now=5 * LAG)
    s.on_follower_fetch(2, 4, -1, 4, 5 * LAG)
    expand = [e for e in s.on_follower_fetch(3, 4, -1, 4, 5 * LAG) if isinstance(e, ProposeIsr)]
    assert expand and s.maximal_isr == {1, 2, 3} and s.isr == {1, 2}
    s.on_follower_fetch(2, 8, -1, 8, 5 * LAG + 1)
    assert s.on_local_append(8, 10 * LAG) == [] and s.high_watermark == 4  # 3 (LEO 4) still counts
    s.on_isr_write_result(5, None, -1, 8, 10 * LAG, outcome_unknown=True)  # etcd failed mid-write
    assert s.on_local_append(8, 10 * LAG + 1) == [] and s.maximal_isr == {1, 2, 3}
    # The uncertain member falls behind: the shrink proposal removes it, and once written the HW moves.
    shrink = next(e for e in s.on_tick(8, 12 * LAG) if isinstance(e, ProposeIsr))
    assert shrink.remove == {3}
    assert hw_of(s.on_isr_write_result(5, [1, 2], 12, 8, 12 * LAG)) == 8 and s.maximal_isr == {1, 2}
