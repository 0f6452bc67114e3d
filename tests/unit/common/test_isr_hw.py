"""The leader's HW counts caught-up followers outside the ISR; follower fetches are fenced by broker epoch.

Seed 000's maybeIncrementLeaderHW: min LEO over the ISR plus every replica whose
lastCaughtUpTimeMs is within replica.lag.time.max.ms and that may join the ISR
(Kafka's shouldWaitForReplicaToJoinIsr / isReplicaIsrEligible, KIP-841). KIP-380/903: a fetch from
an earlier incarnation of a follower is STALE_BROKER_EPOCH, and only the live
incarnation may join the ISR.
"""

from __future__ import annotations

import os

import gregor_native as native
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gregor.broker.partition import Partition
from gregor.broker.replication_state import Effect, HighWatermarkChanged
from gregor.common import errors
from gregor.common.config import effective_topic_configs, log_config_kwargs
from gregor.common.isr import compute_high_watermark, is_isr_eligible, is_stale_follower_fetch, isr_eligible_followers
from tests.helpers.batches import make_batch

LAG_MS = 2000


def test_caught_up_follower_outside_isr_holds_the_hw() -> None:
    # ISR {1, 2}; follower 3 is outside it but caught up 500 ms ago at LEO 4.
    leos = {2: 10, 3: 4}
    caught_up = {2: 9_900, 3: 9_500}
    assert compute_high_watermark(10, [1, 2], leos, 0, 1, caught_up, 10_000, LAG_MS) == 4
    # Without caught-up information the rule is the ISR-only one.
    assert compute_high_watermark(10, [1, 2], leos, 0, 1) == 10
    # Once its last catch-up is older than replica.lag.time.max.ms it no longer counts.
    assert compute_high_watermark(10, [1, 2], leos, 0, 1, caught_up, 9_500 + LAG_MS + 1, LAG_MS) == 10
    # Exactly at the bound still counts (Kafka: <= replicaLagTimeMaxMs).
    assert compute_high_watermark(10, [1, 2], leos, 0, 1, caught_up, 9_500 + LAG_MS, LAG_MS) == 4


def test_ineligible_caught_up_follower_is_not_waited_for() -> None:
    # Follower 3 is caught up at LEO 4, outside the ISR {1, 2}.
    leos = {2: 10, 3: 4}
    caught_up = {2: 9_900, 3: 9_500}
    args = (10, [1, 2], leos, 0, 1, caught_up, 10_000, LAG_MS)
    assert compute_high_watermark(*args, isr_eligible={2, 3}) == 4  # eligible: waited for
    assert compute_high_watermark(*args, isr_eligible={2}) == 10  # dead / shutting down / older incarnation
    assert compute_high_watermark(*args, isr_eligible=None) == 4  # nothing known: waited for (as before)
    # ISR members always count, eligible or not (Kafka's maximalIsr).
    assert compute_high_watermark(10, [1, 2], {2: 6}, 0, 1, {2: 9_900}, 10_000, LAG_MS, isr_eligible=set()) == 6


def test_isr_eligible_followers_by_metadata_cache() -> None:
    fetched = {2: 20, 3: 30, 4: -1, 5: 49}
    # 3 is in controlled shutdown (left out of UpdateMetadata's live brokers), 5 fetched as an older
    # incarnation, 4 sent no epoch (not judged), 2 matches.
    assert isr_eligible_followers(fetched, {1: 10, 2: 20, 4: 40, 5: 50}) == {2, 4}
    assert isr_eligible_followers(fetched, None) is None  # no UpdateMetadata yet
    assert isr_eligible_followers(fetched, {}) is None


def test_caught_up_follower_never_lowers_the_hw() -> None:
    assert compute_high_watermark(10, [1], {3: 2}, 6, 1, {3: 100}, 200, LAG_MS) == 6
    # A follower with no recorded catch-up time is not counted.
    assert compute_high_watermark(10, [1], {3: 2}, 6, 1, {}, 200, LAG_MS) == 10


@given(st.integers(0, 100), st.dictionaries(st.integers(2, 6), st.integers(0, 100), min_size=1),
       st.dictionaries(st.integers(2, 6), st.integers(0, 10_000)), st.sets(st.integers(2, 6)), st.integers(0, 100))
def test_hw_with_caught_up_replicas_properties(leader_leo: int, leos: dict[int, int], caught_up: dict[int, int],
                                               isr_followers: set[int], hw_seed: int) -> None:
    leos = {r: min(leo, leader_leo) for r, leo in leos.items()}
    isr = [1, *sorted(r for r in isr_followers if r in leos)]
    current = min(hw_seed, leader_leo)
    now = 10_000
    hw = compute_high_watermark(leader_leo, isr, leos, current, 1, caught_up, now, LAG_MS)
    isr_only = compute_high_watermark(leader_leo, isr, leos, current, 1)
    assert current <= hw <= isr_only <= leader_leo
    counted = [leos[r] for r in leos if r in isr or (r in caught_up and now - caught_up[r] <= LAG_MS)]
    assert hw == current or all(hw <= leo for leo in counted)


def test_broker_epoch_rules() -> None:
    assert is_stale_follower_fetch(5, 7)
    assert not is_stale_follower_fetch(7, 7)
    assert not is_stale_follower_fetch(9, 7)  # the leader has not heard of the new incarnation yet
    assert not is_stale_follower_fetch(-1, 7)  # no epoch sent: not judged
    assert is_isr_eligible(7, 7, True)
    assert not is_isr_eligible(9, 7, True)  # newer than the controller's view: wait for UpdateMetadata
    assert not is_isr_eligible(7, None, True)  # not live at all
    assert is_isr_eligible(7, None, False)  # no UpdateMetadata yet: nothing to check against


def hw_moved(effects: list[Effect]) -> bool:
    return any(isinstance(e, HighWatermarkChanged) for e in effects)


@pytest.fixture
def partition(tmp_path: os.PathLike[str]) -> Partition:
    configs = effective_topic_configs({"min.insync.replicas": 2}, {})
    lg = native.Log(os.path.join(str(tmp_path), "t-0"), native.LogConfig(**log_config_kwargs(configs)))
    p = Partition("t", 0, lg, 1, configs, replica_lag_time_max_ms=LAG_MS)
    assert p.make_leader(0, [1, 2], [1, 2, 3])
    return p


def test_partition_hw_waits_for_a_caught_up_follower_outside_the_isr(partition: Partition) -> None:
    p = partition
    p.append_records_to_leader(make_batch([b"a", b"b", b"c"]), 1)
    t0 = p.follower_states[2].last_caught_up_time_ms
    p.on_follower_fetch(2, 3, -1, fetch_time_ms=t0 + 10)
    assert p.high_watermark == 3  # follower 3 has never been caught up: the ISR alone decides
    # Follower 3 fetches at the LEO (caught up), then the leader appends two more.
    p.on_follower_fetch(3, 3, -1, fetch_time_ms=t0 + 20)
    p.on_isr_write_result(0, None, -1)  # its ISR expansion was refused (nobody writes one here)
    p.append_records_to_leader(make_batch([b"d", b"e"]), 1)
    p.on_follower_fetch(2, 5, -1, fetch_time_ms=t0 + 30)
    assert p.high_watermark == 3  # 3 is caught up (20 ms ago) at LEO 3: it holds the HW
    assert p.maybe_increment_leader_hw(t0 + 20 + LAG_MS + 1) and p.high_watermark == 5


def test_partition_hw_does_not_wait_for_a_departing_follower(partition: Partition) -> None:
    """A follower outside the ISR that fetched once and then went into controlled shutdown.

    Before the fix the leader counted it for replica.lag.time.max.ms (30 s by default),
    holding acks=all back; now the metadata cache's live brokers decide.
    """
    p = partition
    live: dict[int, int] | None = {1: 10, 2: 20, 3: 30}
    p.live_broker_epochs = lambda: live
    p.append_records_to_leader(make_batch([b"a", b"b", b"c"]), 1)
    t0 = p.follower_states[2].last_caught_up_time_ms
    p.on_follower_fetch(3, 3, 30, fetch_time_ms=t0 + 10)  # caught up at LEO 3
    p.on_isr_write_result(0, None, -1)  # its ISR expansion was refused (nobody writes one here)
    p.on_follower_fetch(2, 3, 20, fetch_time_ms=t0 + 10)
    assert p.high_watermark == 3
    p.append_records_to_leader(make_batch([b"d", b"e"]), 1)
    p.on_follower_fetch(2, 5, 20, fetch_time_ms=t0 + 20)
    assert p.high_watermark == 3  # 3 is eligible and caught up: waited for
    live = {1: 10, 2: 20}  # UpdateMetadata without broker 3 (controlled shutdown or gone)
    assert p.maybe_increment_leader_hw(t0 + 30) and p.high_watermark == 5
    # Before any UpdateMetadata there is nothing to check against: it would be waited for again.
    p.append_records_to_leader(make_batch([b"f"]), 1)
    p.on_follower_fetch(3, 5, 30, fetch_time_ms=t0 + 40)
    live = None
    p.on_follower_fetch(2, 6, 20, fetch_time_ms=t0 + 50)
    assert p.high_watermark == 5


def test_fetch_from_an_older_incarnation_is_stale(partition: Partition) -> None:
    p = partition
    p.check_follower_broker_epoch(2, 100, live_epoch=100)
    p.on_follower_fetch(2, 0, 100, fetch_time_ms=1)
    with pytest.raises(errors.GregorError) as info:
        p.check_follower_broker_epoch(2, 90, live_epoch=None)  # older than what its fetches carried
    assert info.value.code == errors.Code.STALE_BROKER_EPOCH
    with pytest.raises(errors.GregorError) as info:
        p.check_follower_broker_epoch(3, 50, live_epoch=60)  # older than the controller's live epoch
    assert info.value.code == errors.Code.STALE_BROKER_EPOCH
    p.check_follower_broker_epoch(3, 70, live_epoch=60)  # a newer incarnation is accepted


def test_only_the_live_incarnation_may_join_the_isr(partition: Partition) -> None:
    p = partition
    p.on_follower_fetch(3, 0, 70, fetch_time_ms=1)
    assert p.state.needs_expand_isr(3)  # no controller view given: LEO 0 >= HW 0
    assert not p.state.needs_expand_isr(3, {1: 10, 2: 20, 3: 60})  # the controller still knows epoch 60
    assert not p.state.needs_expand_isr(3, {1: 10, 2: 20})  # the controller thinks it is dead
    assert p.state.needs_expand_isr(3, {1: 10, 2: 20, 3: 70})


def test_a_restarted_follower_that_fetched_before_the_leader_knew_its_epoch_joins_on_the_update(
        partition: Partition) -> None:
    """Issue 24's unclean restart: the new incarnation (epoch 70) fetched, caught up, while the leader's metadata
    still said 60, so the fetch could not add it; its later incremental fetches name no partition (nothing new),
    so no fetch asks again. The UpdateMetadata that brings epoch 70 must: the follower joins then."""
    from gregor.broker.replication_state import ProposeIsr

    p = partition
    live: dict[int, int] | None = {1: 10, 2: 20, 3: 60}
    p.live_broker_epochs = lambda: live
    effects = p.on_follower_fetch(3, 0, 70, fetch_time_ms=1)  # caught up (LEO 0 = HW 0), but not eligible yet
    assert not any(isinstance(e, ProposeIsr) for e in effects)
    assert p.reconsider_isr_expansion(3) == [], "still epoch 60 at the leader: nothing to do"
    live = {1: 10, 2: 20, 3: 70}  # the UpdateMetadata after the controller saw the new registration
    proposed = [e for e in p.reconsider_isr_expansion(3) if isinstance(e, ProposeIsr)]
    assert len(proposed) == 1 and proposed[0].add == frozenset({3}) and proposed[0].isr == (1, 2, 3)
    assert p.reconsider_isr_expansion(3) == [], "one ISR write at a time"
    assert p.reconsider_isr_expansion(2) == [], "an ISR member is not added again"
