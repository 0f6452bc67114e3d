"""ISR shrink/expand, high watermark, ISR change propagation and leader-epoch truncation (seeds 000, 002, 003)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gregor.common import isr as isr_logic
from gregor.common.isr import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    FollowerFetchState,
    IsrChangePropagation,
    compute_high_watermark,
    end_offset_for_epoch,
    follower_truncation,
    maybe_expand_isr,
    maybe_shrink_isr,
    truncation_offset,
)


def test_isr_expiration_interval_is_half_the_lag_time() -> None:
    assert isr_logic.isr_expiration_interval_ms() == 15_000


def test_shrink_drops_followers_not_caught_up_within_lag_time() -> None:
    caught_up = {2: 1_000, 3: 25_000}
    assert maybe_shrink_isr([1, 2, 3], 1, caught_up, now_ms=31_000) is None  # 30 000 is not > 30 000.
    assert maybe_shrink_isr([1, 2, 3], 1, caught_up, now_ms=31_001) == [1, 3]
    assert maybe_shrink_isr([1, 2, 3], 1, {}, now_ms=40_000, replica_lag_time_max_ms=10_000) == [1]


def test_follower_at_leader_leo_is_never_shrunk() -> None:
    got = maybe_shrink_isr([1, 2], 1, {2: 0}, 99_000, follower_leos={2: 50}, leader_leo=50)
    assert got is None


def test_fetch_state_tracks_last_caught_up_time() -> None:
    st_ = FollowerFetchState()
    st_.update_fetch_state(fetch_offset=10, leader_log_end_offset=10, fetch_time_ms=100)
    assert st_.last_caught_up_time_ms == 100
    st_.update_fetch_state(fetch_offset=10, leader_log_end_offset=15, fetch_time_ms=200)
    assert st_.last_caught_up_time_ms == 100  # Behind now; caught up to what the leader had at 100.
    st_.update_fetch_state(fetch_offset=15, leader_log_end_offset=20, fetch_time_ms=300)
    assert st_.last_caught_up_time_ms == 200  # Reached the LEO the leader had at the previous fetch.
    st_.reset(now_ms=400, in_isr=False)
    assert st_.last_caught_up_time_ms == 0


def test_expand_requires_hw_and_leader_epoch_start() -> None:
    assert maybe_expand_isr(follower_leo=10, hw=10, leader_epoch_start_offset=8)
    assert not maybe_expand_isr(follower_leo=9, hw=10, leader_epoch_start_offset=8)
    assert not maybe_expand_isr(follower_leo=10, hw=5, leader_epoch_start_offset=12)
    assert not maybe_expand_isr(follower_leo=10, hw=5, leader_epoch_start_offset=None)


def test_high_watermark_is_min_isr_leo_and_never_regresses() -> None:
    assert compute_high_watermark(10, [1, 2, 3], {2: 7, 3: 9}, current_hw=5, leader_id=1) == 7
    assert compute_high_watermark(10, [1, 2], {2: 3, 3: 0}, current_hw=5, leader_id=1) == 5
    assert compute_high_watermark(10, [1], {}, current_hw=5, leader_id=1) == 10
    assert compute_high_watermark(10, [1, 2], {}, current_hw=4, leader_id=1) == 4  # 2 not heard from.
    with pytest.raises(ValueError, match="above the leader's log end offset"):
        compute_high_watermark(3, [1], {}, current_hw=4, leader_id=1)


@given(st.integers(0, 100), st.dictionaries(st.integers(2, 6), st.integers(0, 100), min_size=1), st.integers(0, 100))
def test_high_watermark_properties(leader_leo: int, follower_leos: dict[int, int], hw_seed: int) -> None:
    current = min(hw_seed, leader_leo)
    hw = compute_high_watermark(leader_leo, [1, *follower_leos], follower_leos, current, leader_id=1)
    assert current <= hw <= leader_leo
    assert hw == current or all(hw <= leo for leo in follower_leos.values())


def test_isr_change_propagation_rules() -> None:
    p = IsrChangePropagation()
    assert p.maybe_propagate(10_000) is None  # Nothing to propagate.
    p.record_isr_change("t", 0, now_ms=61_000)
    assert p.maybe_propagate(62_500) == [("t", 0)]  # Last propagation (0) is over 60 s ago.
    p.record_isr_change("t", 1, now_ms=63_000)
    assert p.maybe_propagate(65_000) is None  # Changed 2 s ago, propagated 2.5 s ago.
    p.record_isr_change("t", 2, now_ms=66_000)
    assert p.maybe_propagate(71_000) is None  # Exactly 5 s of quiet is not enough.
    assert p.maybe_propagate(71_001) == [("t", 1), ("t", 2)]
    # Changes every 2.5 s keep the blackout open; the 60 s bound still forces propagation.
    now, out = 71_001, None
    while out is None:
        now += isr_logic.ISR_CHANGE_PROPAGATION_CHECK_INTERVAL_MS
        p.record_isr_change("t", 3, now_ms=now)
        out = p.maybe_propagate(now)
    assert now - 71_001 > 60_000 and out == [("t", 3)]


def test_end_offset_for_epoch() -> None:
    entries = [(1, 20), (2, 80), (3, 120)]
    assert end_offset_for_epoch(entries, 3, 150) == (3, 150)
    assert end_offset_for_epoch(entries, 1, 150) == (1, 80)  # Seed 003's example: LastOffset = 80.
    assert end_offset_for_epoch(entries, 0, 150) == (0, 20)
    assert end_offset_for_epoch(entries, 4, 150) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
    assert end_offset_for_epoch([], 1, 150) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def _entries(log: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for offset, (epoch, _) in enumerate(log):
        out = isr_logic.assign_epoch_start_offset(out, epoch, offset)
    return out


def _truncate(
    follower_log: list[tuple[int, int]], leader_log: list[tuple[int, int]], leader_epoch: int | None = None
) -> list[tuple[int, int]]:
    """Run the follower's truncation rounds against a leader; logs are (epoch, value) per offset.

    `leader_epoch` is the leader's current epoch, recorded at its LEO when it took over.
    """
    leader_entries = _entries(leader_log)
    if leader_epoch is not None:
        leader_entries = isr_logic.assign_epoch_start_offset(leader_entries, leader_epoch, len(leader_log))
    log = list(follower_log)
    for _ in range(10):
        mine = _entries(log)
        asked = mine[-1][0] if mine else UNDEFINED_EPOCH
        epoch, end = end_offset_for_epoch(leader_entries, asked, len(leader_log))
        decision = follower_truncation(mine, len(log), epoch, end)
        del log[decision.offset :]
        if decision.completed:
            return log
    raise AssertionError("truncation did not complete")


def test_seed002_examples() -> None:
    # Offsets 1..6 in the seed are 0..5 here. A had 6 records in epoch 1; B (new leader, epoch 2) has 4.
    a = [(1, v) for v in range(1, 7)]
    b_no_new_data = [(1, v) for v in range(1, 5)]
    assert _truncate(a, b_no_new_data) == b_no_new_data  # A drops 5 and 6.
    b = b_no_new_data + [(2, 50), (2, 60), (2, 70)]
    # B answers epoch 1 with epoch 2's start offset (5 in the seed): A drops its own 5 and 6.
    assert end_offset_for_epoch([(1, 0), (2, 4)], 1, 7) == (1, 4)
    assert truncation_offset(4, 6) == 4
    assert _truncate(a, b) == b_no_new_data


def test_seed003_hw_anomalies_do_not_happen_with_leader_epochs() -> None:
    # Data loss: A (leader) and B both hold m0, m1; B's HW is 1 (HW lags one fetch). A dies, B leads.
    a = [(0, 0), (0, 1)]
    b = [(0, 0), (0, 1)]
    b_hw = 1
    assert b[:b_hw] != a  # HW truncation would drop m1, acknowledged with acks=all.
    b_leader = b  # With leader epochs the new leader truncates nothing ...
    assert _truncate(a, b_leader + [(1, 2)]) == a  # ... and A, restarted, keeps m1 as well.
    # Divergence: B truncated to HW=1, took a new m1' in epoch 1; A restarts with m1 in epoch 0.
    b_diverged = [(0, 0), (1, 99)]
    assert _truncate(a, b_diverged) == [(0, 0)]  # A drops its m1 instead of keeping a different offset 1.


def test_follower_not_knowing_leader_epoch_asks_again() -> None:
    # Follower has epochs 0 and 2; leader answers for epoch 1, which the follower never saw.
    decision = follower_truncation([(0, 0), (2, 17)], 20, leader_epoch=1, leader_end_offset=26)
    assert decision == isr_logic.TruncationDecision(17, completed=False)
    assert isr_logic.truncate_epoch_entries([(0, 0), (2, 17)], 17) == [(0, 0)]
    assert follower_truncation([(0, 0)], 20, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, follower_hw=12).offset == 12


@given(
    st.lists(st.tuples(st.sampled_from([1, 3, 5]), st.integers(0, 9)), max_size=12),
    st.lists(st.tuples(st.sampled_from([2, 4, 6]), st.integers(0, 9)), max_size=12),
    st.integers(0, 12),
)
def test_truncation_keeps_the_common_prefix_and_drops_the_rest(
    follower_tail: list[tuple[int, int]], leader_tail: list[tuple[int, int]], common: int
) -> None:
    """Follower and leader share a prefix, then saw different terms: the follower ends on the shared prefix."""
    prefix = [(0, i) for i in range(common)]
    follower = prefix + sorted(follower_tail)
    leader = prefix + sorted(leader_tail)
    got = _truncate(follower, leader, leader_epoch=7)
    assert got == prefix
