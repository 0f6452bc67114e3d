"""Stateful property test: random operations on gregor_native.Log and on the
reference model (tests/reference/log_model.py) must leave both in the same state."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

import gregor_native as native
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from tests.reference import codec
from tests.reference.log_model import LogModel
from tests.unit.native.support import make_batch, read_all

# Batches of up to ~1.6 KB against segments of 2-8 KB: rolls every few appends.
record_values = st.lists(st.binary(max_size=300), min_size=1, max_size=5)
appends = st.lists(record_values, min_size=1, max_size=3)


class LogMachine(RuleBasedStateMachine):
    """Drives one Log and one LogModel in lockstep; single-threaded."""

    base_dir: Path  # set by the test function below (pytest's tmp_path)
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        LogMachine.runs += 1
        self.dir = self.base_dir / f"run{LogMachine.runs}"
        self.now_ms = 1_000_000
        self.epoch = 0
        self.log: Optional[native.Log] = None

    @initialize(segment_bytes=st.sampled_from([2048, 3000, 4096, 8192]),
                index_interval_bytes=st.sampled_from([64, 128, 512]),
                retention_bytes=st.sampled_from([-1, 0, 1000, 4000, 9000]))
    def open_log(self, segment_bytes: int, index_interval_bytes: int, retention_bytes: int) -> None:
        self.config = native.LogConfig(segment_bytes=segment_bytes, index_interval_bytes=index_interval_bytes,
                                       retention_bytes=retention_bytes, retention_ms=-1)
        self.model = LogModel(segment_bytes=segment_bytes, retention_bytes=retention_bytes,
                              now_ms=self.now_ms)
        self.log = native.Log(str(self.dir), self.config, now_ms=self.now_ms)

    def tick(self) -> int:
        self.now_ms += 7
        return self.now_ms

    # ------------------------------------------------------------ rules
    @rule(batches=appends, epoch_bump=st.sampled_from([0, 0, 0, 1, 2]))
    def append_as_leader(self, batches: list[list[bytes]], epoch_bump: int) -> None:
        self.epoch += epoch_bump
        now = self.tick()
        data = b"".join(make_batch(values, now, base_offset=9_999, epoch=-1) for values in batches)
        info = self.log.append_as_leader(data, leader_epoch=self.epoch, now_ms=now)
        stored = self.model.append_as_leader(data, self.epoch, now)
        self.check_append(info, stored)

    @rule(burst=st.lists(appends, min_size=2, max_size=8))
    def append_burst_as_leader(self, burst: list[list[list[bytes]]]) -> None:
        """Many appends in one step, so segments fill up and retention has work."""
        for batches in burst:
            self.append_as_leader(batches, 0)

    @rule(batches=appends, epoch_bump=st.sampled_from([0, 0, 1]))
    def append_as_follower(self, batches: list[list[bytes]], epoch_bump: int) -> None:
        self.epoch += epoch_bump
        now, offset, parts = self.tick(), self.model.log_end_offset, []
        for values in batches:
            parts.append(make_batch(values, now, base_offset=offset, epoch=self.epoch))
            offset += len(values)
        data = b"".join(parts)
        info = self.log.append_as_follower(data, now_ms=now)
        stored = self.model.append_as_follower(data, now)
        assert [b.data for b in stored] == parts
        self.check_append(info, stored)

    def check_append(self, info: native.AppendInfo, stored: list) -> None:
        assert (info.first_offset, info.last_offset) == (stored[0].base_offset, stored[-1].last_offset)
        assert info.num_batches == len(stored)
        assert info.num_records == sum(len(codec.records_of(b.data)) for b in stored)
        assert info.valid_bytes == sum(len(b.data) for b in stored)
        assert info.log_end_offset == self.model.log_end_offset
        assert info.max_timestamp == max(b.max_timestamp for b in stored)

    @rule(data=st.data())
    def append_below_the_log_end_is_refused(self, data: st.DataObject) -> None:
        # (A gap above the log end is accepted, as in Kafka: compacted leader logs have gaps.)
        offset = self.model.log_end_offset + data.draw(st.sampled_from([-1, -2, -50]))
        if offset < 0:
            return
        with pytest.raises(native.InvalidRecordError):
            self.log.append_as_follower(make_batch([b"x"], self.now_ms, base_offset=offset, epoch=self.epoch))

    @rule()
    def roll(self) -> None:
        now = self.tick()
        assert self.log.roll(now_ms=now) == self.model.roll(now)

    @rule()
    def delete_old_segments(self) -> None:
        now = self.tick()
        assert self.log.delete_old_segments(now_ms=now) == self.model.delete_old_segments(now)

    @rule(back=st.integers(-2, 30))
    def truncate_to(self, back: int) -> None:
        """Mostly a few offsets off the end, as a follower's divergence is."""
        offset = max(self.model.log_start_offset, self.model.log_end_offset - back)
        assert self.log.truncate_to(offset) == self.model.truncate_to(offset)

    @rule(delta=st.integers(-20, 100), skip=st.integers(0, 3))
    def truncate_fully_and_start_at(self, delta: int, skip: int) -> None:
        if skip:  # mostly skipped: it throws the whole log away
            return
        offset = max(0, self.model.log_end_offset + delta)
        now = self.tick()
        self.log.truncate_fully_and_start_at(offset)
        self.model.truncate_fully_and_start_at(offset, now)

    @rule(advance=st.integers(0, 12))
    def maybe_increment_log_start_offset(self, advance: int) -> None:
        offset = min(self.model.log_start_offset + advance, self.model.log_end_offset)
        assert self.log.maybe_increment_log_start_offset(offset) == self.model.maybe_increment_log_start_offset(offset)

    @rule()
    def close_and_reopen(self) -> None:
        self.log.close()
        with pytest.raises(native.LogClosedError):
            self.log.append_as_leader(make_batch([b"late"]), leader_epoch=self.epoch)
        self.log = native.Log(str(self.dir), self.config, now_ms=self.tick())
        assert self.log.recovered_bytes_truncated == 0

    @precondition(lambda self: self.model.log_end_offset > self.model.log_start_offset)
    @rule(data=st.data(), max_bytes=st.integers(1, 5000), min_one_batch=st.booleans())
    def read(self, data: st.DataObject, max_bytes: int, min_one_batch: bool) -> None:
        start = data.draw(st.integers(self.model.log_start_offset, self.model.log_end_offset))
        # A high watermark is some replica's log end: always a batch boundary.
        # (A bound inside a batch is pinned by test_log.test_read_limits_and_segment_bounds.)
        bounds = sorted({b.next_offset for b in self.model.batches() if b.next_offset > start})
        max_offset = data.draw(st.none() | st.sampled_from(bounds)) if bounds else None
        expected = self.model.read(start, max_bytes, max_offset, min_one_batch)
        got = self.log.read(start, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
        assert got == expected
        piece = self.log.read_slice(start, max_bytes, max_offset=max_offset, min_one_batch=min_one_batch)
        assert piece.length == len(expected)
        assert piece.start_offset == (codec.parse_header(expected).base_offset if expected else -1)

    @rule(below=st.integers(1, 5), above=st.integers(1, 5))
    def read_out_of_range(self, below: int, above: int) -> None:
        with pytest.raises(native.OffsetOutOfRangeError):
            self.log.read(self.model.log_end_offset + above, 1000)
        if self.model.log_start_offset - below >= 0:
            with pytest.raises(native.OffsetOutOfRangeError):
                self.log.read(self.model.log_start_offset - below, 1000)

    @rule(back=st.integers(0, 400))
    def offset_for_timestamp(self, back: int) -> None:
        ts = self.now_ms - back
        assert self.log.offset_for_timestamp(ts) == self.model.offset_for_timestamp(ts)

    # ------------------------------------------------------------ invariants
    @invariant()
    def same_offsets_and_sizes(self) -> None:
        if self.log is None:
            return
        m = self.model
        assert (self.log.log_start_offset, self.log.log_end_offset) == (m.log_start_offset, m.log_end_offset)
        assert self.log.size_bytes == m.size_bytes
        assert self.log.recovery_point <= self.log.log_end_offset
        assert self.log.log_start_offset <= self.log.log_end_offset

    @invariant()
    def same_segments(self) -> None:
        if self.log is None:
            return
        got = [(s.base_offset, s.next_offset, s.size_bytes, s.largest_timestamp) for s in self.log.segments()]
        want = [(s.base_offset, s.next_offset, s.size, s.largest_timestamp) for s in self.model.segments]
        assert got == want
        assert self.log.num_segments == len(want)

    @invariant()
    def same_bytes_and_contiguous_offsets(self) -> None:
        if self.log is None:
            return
        data = read_all(self.log)
        assert data == self.model.all_bytes()
        expected_next = self.model.log_start_offset
        for i, (header, _) in enumerate(codec.split_batches(data)):
            if i == 0:  # the log start may fall inside the first batch
                assert header.base_offset <= expected_next <= header.last_offset
            else:
                assert header.base_offset == expected_next
            expected_next = header.next_offset
        assert expected_next == self.model.log_end_offset

    @invariant()
    def same_epoch_cache(self) -> None:
        if self.log is None:
            return
        entries = self.model.epochs.entries
        assert self.log.epoch_entries() == entries
        assert self.log.latest_epoch() == self.model.epochs.latest_epoch()
        for epoch in range(-1, self.epoch + 2):
            assert self.log.end_offset_for_epoch(epoch) == self.model.end_offset_for_epoch(epoch), epoch

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a pass takes ~20 s; shrinking a failure can take minutes
def test_log_matches_model(tmp_path: Path) -> None:
    LogMachine.base_dir = tmp_path
    run_state_machine_as_test(LogMachine, settings=settings(
        max_examples=150, stateful_step_count=80, deadline=None, report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
