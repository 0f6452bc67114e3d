//! Removing data from a Log: retention by time and size, log-start moves,
//! truncation for followers (seed 002 cache rules 3.2-3.4) and deletion.

use std::fs;

use crate::error::{Error, Result};
use crate::log::{write_atomically, Log, LOG_START_OFFSET_FILE};
use crate::segment::Segment;

impl Log {
    /// Removes everything at or after `offset`; false if nothing is there.
    pub fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<bool> {
        if offset >= self.log_end_offset() {
            return Ok(false);
        }
        if offset < self.log_start_offset {
            self.truncate_fully_and_start_at(offset, now_ms)?;
            return Ok(true);
        }
        self.truncations += 1;
        // The cache is cut (durably) before the data: a crash in between
        // leaves batches the checkpoint lacks, which open re-assigns from the
        // batches, where the other order could leave a checkpoint entry at
        // the recovered end for data that is gone, which nothing removes.
        self.epochs.truncate_from_end(offset)?;
        let doomed: Vec<i64> = self.segments.range(offset + 1..).map(|(b, _)| *b).collect();
        // Keep at least one segment: if every one starts after offset, the
        // first of them is emptied instead of deleted.
        let keep_first = doomed.len() == self.segments.len();
        for base in doomed.iter().skip(keep_first as usize) {
            let mut seg = self.segments.remove(base).expect("listed segment");
            seg.delete_files()?;
        }
        self.segments.values_mut().next_back().expect("a segment").truncate_to(offset)?;
        let leo = self.log_end_offset();
        crate::cleaner::truncate_checkpoint(&self.dir, leo)?;
        self.recovery_point = self.recovery_point.min(leo);
        // Below `offset` only when the batch holding it was cut whole.
        self.epochs.truncate_from_end(leo)?;
        // Cutting the whole batch that holds the log start takes the end below
        // it: the start comes down too (Kafka: min(target, logStartOffset)).
        if self.log_start_offset > leo {
            self.log_start_offset = leo;
            self.persist_log_start_offset()?;
        }
        Ok(true)
    }

    /// Deletes every segment and starts empty at `offset`; clears the cache.
    pub fn truncate_fully_and_start_at(&mut self, offset: i64, now_ms: i64) -> Result<()> {
        // Cleared before the segments go, as in truncate_to.
        self.truncations += 1;
        self.epochs.clear()?;
        for (_, mut seg) in std::mem::take(&mut self.segments) {
            seg.delete_files()?;
        }
        let (index_bytes, interval) = (self.config.segment_index_bytes.max(0) as usize, self.config.index_interval_bytes.max(0) as u64);
        self.segments.insert(offset, Segment::create(&self.dir, offset, index_bytes, interval, now_ms)?);
        self.dir_dirty = true;
        self.log_start_offset = offset;
        self.recovery_point = offset;
        self.persist_log_start_offset()
    }

    /// Moves log_start_offset forward (DeleteRecords); trims the epoch cache.
    pub fn maybe_increment_log_start_offset(&mut self, offset: i64) -> Result<bool> {
        let leo = self.log_end_offset();
        if offset > leo {
            return Err(Error::OutOfRange(format!("log start {offset} beyond log end {leo}")));
        }
        if offset <= self.log_start_offset {
            return Ok(false);
        }
        self.log_start_offset = offset;
        self.epochs.truncate_from_start(offset)?;
        self.persist_log_start_offset()?;
        Ok(true)
    }

    fn persist_log_start_offset(&self) -> Result<()> {
        write_atomically(&self.dir.join(LOG_START_OFFSET_FILE), &format!("{}\n", self.log_start_offset))
    }

    /// Retention: segments below the log start, then expired ones (by their
    /// largest timestamp), then the oldest while over retention.bytes. The
    /// active segment is rolled first when every segment has expired.
    /// Equivalent to `delete_old_segments_below(now_ms, None)`.
    pub fn delete_old_segments(&mut self, now_ms: i64) -> Result<usize> {
        self.delete_old_segments_below(now_ms, None)
    }

    /// Retention bounded by `upper_bound_offset` (Kafka's min(HW, LEO); None is
    /// the log end): a segment is deleted only if the next segment's base
    /// offset is <= the bound, so nothing at or above it is ever removed, and
    /// the active segment is rolled for expiry only if the log end is <= the
    /// bound.
    pub fn delete_old_segments_below(&mut self, now_ms: i64, upper_bound_offset: Option<i64>) -> Result<usize> {
        let leo = self.log_end_offset();
        let bound = upper_bound_offset.map_or(leo, |b| b.min(leo));
        let below = |log: &Log, seg: &Segment| log.segment_after(seg) <= bound;
        let mut deleted =
            self.delete_prefix_while(|log, seg| below(log, seg) && log.segment_after(seg) <= log.log_start_offset)?;
        let retention_ms = self.config.retention_ms;
        if retention_ms >= 0 {
            let expired = |s: &Segment| now_ms.saturating_sub(s.max_timestamp) > retention_ms;
            if !self.active().is_empty() && leo <= bound && self.segments.values().all(expired) {
                self.roll(now_ms)?;
            }
            deleted += self.delete_prefix_while(|log, seg| below(log, seg) && expired(seg))?;
        }
        if self.config.retention_bytes >= 0 {
            let mut excess = self.size_bytes() as i64 - self.config.retention_bytes;
            deleted += self.delete_prefix_while(|log, seg| {
                let go = below(log, seg) && excess - seg.size as i64 >= 0;
                if go {
                    excess -= seg.size as i64;
                }
                go
            })?;
        }
        if deleted > 0 {
            let first = *self.segments.keys().next().expect("active segment remains");
            if first > self.log_start_offset {
                self.log_start_offset = first;
                self.persist_log_start_offset()?;
            }
            self.epochs.truncate_from_start(self.log_start_offset)?;
        }
        Ok(deleted)
    }

    /// Base offset of the segment after `seg` (log end for the active one).
    fn segment_after(&self, seg: &Segment) -> i64 {
        self.segments.range(seg.base_offset + 1..).next().map_or(self.log_end_offset(), |(b, _)| *b)
    }

    /// Deletes the oldest non-active segments while `pred` holds.
    fn delete_prefix_while(&mut self, mut pred: impl FnMut(&Log, &Segment) -> bool) -> Result<usize> {
        let mut n = 0;
        while self.segments.len() > 1 {
            let (&base, seg) = self.segments.iter().next().expect("non-empty");
            if !pred(self, seg) {
                break;
            }
            let mut seg = self.segments.remove(&base).expect("first segment");
            seg.delete_files()?;
            n += 1;
        }
        Ok(n)
    }

    /// Removes the directory and everything in it.
    pub fn delete(self) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}
