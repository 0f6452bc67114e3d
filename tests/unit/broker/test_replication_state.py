"""A partition's replication state on the broker (seed 000) and the HW checkpoint file."""

from __future__ import annotations

import os

import gregor_native as native
import pytest

from gregor.broker import checkpoint
from gregor.broker.partition import Partition
from gregor.broker.replication_state import Effect, HighWatermarkChanged
from gregor.common import errors
from gregor.common.config import effective_topic_configs, log_config_kwargs
from tests.helpers.batches import make_batch

LAG_MS = 2000


def hw_moved(effects: list[Effect]) -> bool:
    return any(isinstance(e, HighWatermarkChanged) for e in effects)


@pytest.fixture
def partition(tmp_path: os.PathLike[str]) -> Partition:
    configs = effective_topic_configs({"min.insync.replicas": 2}, {})
    lg = native.Log(os.path.join(str(tmp_path), "t-0"), native.LogConfig(**log_config_kwargs(configs)))
    p = Partition("t", 0, lg, 1, configs, replica_lag_time_max_ms=LAG_MS)
    assert p.make_leader(0, [1, 2, 3], [1, 2, 3])
    return p


def test_hw_follows_min_leo_of_isr_and_acks_all_needs_min_isr(partition: Partition) -> None:
    p = partition
    p.append_records_to_leader(make_batch([b"a", b"b"]), -1)
    assert p.high_watermark == 0
    assert not hw_moved(p.on_follower_fetch(2, 2, -1, fetch_time_ms=1000))
    assert hw_moved(p.on_follower_fetch(3, 2, -1, fetch_time_ms=1000))
    assert p.high_watermark == 2
    p.on_isr_write_result(0, [1], 1)  # the ISR shrank to the leader
    with pytest.raises(errors.GregorError) as info:
        p.append_records_to_leader(make_batch([b"c"]), -1)
    assert info.value.code == errors.Code.NOT_ENOUGH_REPLICAS


def test_lagging_follower_is_shrunk_and_expands_once_caught_up(partition: Partition) -> None:
    p = partition
    p.append_records_to_leader(make_batch([b"a", b"b"]), 1)
    start = p.follower_states[2].last_caught_up_time_ms
    p.on_follower_fetch(2, 2, -1, fetch_time_ms=start + 10)  # caught up
    p.on_follower_fetch(3, 0, -1, fetch_time_ms=start + 10)  # behind
    assert p.state.out_of_sync_isr(p.log_end_offset, start + LAG_MS) is None
    assert p.state.out_of_sync_isr(p.log_end_offset, start + LAG_MS + 1) == [1, 2]
    p.on_isr_write_result(0, [1, 2], 1)  # 3 left the ISR
    # Follower 3 was last caught up at `start` (becoming leader counts as that), over LAG_MS ago.
    assert p.maybe_increment_leader_hw(start + LAG_MS + 1) and p.high_watermark == 2
    assert not p.state.needs_expand_isr(3)  # LEO 0 < HW 2
    p.on_follower_fetch(3, 2, -1, fetch_time_ms=start + LAG_MS + 5)
    assert p.state.needs_expand_isr(3)


def test_idle_follower_at_leader_leo_stays_in_sync(partition: Partition) -> None:
    p = partition
    p.on_follower_fetch(2, 0, -1, fetch_time_ms=0)
    p.on_follower_fetch(3, 0, -1, fetch_time_ms=0)
    # Seed 000: a follower whose LEO equals the leader's is in sync however old its fetch.
    assert p.state.out_of_sync_isr(p.log_end_offset, 10 * LAG_MS) is None


def test_same_epoch_leader_and_isr_keeps_follower_state(partition: Partition) -> None:
    p = partition
    p.append_records_to_leader(make_batch([b"a"]), 1)
    p.on_follower_fetch(2, 1, -1, fetch_time_ms=5)
    # The same epoch re-sent (a duplicate, a controller failover) is ignored, as Kafka does.
    assert not p.make_leader(0, [1, 2, 3], [1, 2, 3])
    assert p.follower_states[2].log_end_offset == 1 and p.state.leader_epoch_start_offset == 0
    assert p.make_leader(1, [1, 2, 3], [1, 2, 3])
    assert p.follower_states[2].log_end_offset == 0 and p.state.leader_epoch_start_offset == 1


def test_follower_hw_is_min_of_leader_hw_and_own_leo(partition: Partition) -> None:
    p = partition
    assert p.make_follower(2, 1, [1, 2, 3], [1, 2, 3])
    assert p.append_fetched(b"", 5) == []  # LEO 0
    assert p.high_watermark == 0


def test_checkpoint_round_trip_in_kafka_format(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), checkpoint.REPLICATION_OFFSET_CHECKPOINT)
    assert checkpoint.read_offsets(path) == {}
    checkpoint.write_offsets(path, {("orders", 1): 99, ("my-topic", 0): 1234})
    with open(path) as f:
        assert f.read() == "0\n2\nmy-topic 0 1234\norders 1 99\n"
    assert checkpoint.read_offsets(path) == {("orders", 1): 99, ("my-topic", 0): 1234}
    with open(path, "w") as f:
        f.write("0\n3\nt 0 1\n")
    with pytest.raises(ValueError):
        checkpoint.read_offsets(path)
