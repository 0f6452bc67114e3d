//! One partition's log: segments by base offset, append with roll, reads,
//! timestamp lookup, recovery on open and the flush policy. Retention and
//! truncation live in `retention.rs`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::batch::{self, BatchHeader, TIMESTAMP_TYPE_MASK};
use crate::epoch::EpochCache;
use crate::error::{invalid, Error, Result};
use crate::records::decode_records;
use crate::segment::{OpenMode, Scanner, Segment, Step};

/// Written by close() and removed by open(); its absence means recovery.
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean-shutdown";
/// Holds log_start_offset once it moved past the first segment's base.
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";

pub fn wall_clock_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Kafka's topic settings in snake case; -1 is unlimited for retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    pub segment_bytes: i64,
    pub segment_ms: i64,
    pub segment_index_bytes: i64,
    pub index_interval_bytes: i64,
    pub retention_bytes: i64,
    pub retention_ms: i64,
    pub flush_messages: i64,
    pub flush_ms: i64,
    pub max_message_bytes: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 604_800_000,
            segment_index_bytes: 10 * 1024 * 1024,
            index_interval_bytes: 4096,
            retention_bytes: -1,
            retention_ms: 604_800_000,
            flush_messages: i64::MAX,
            flush_ms: i64::MAX,
            max_message_bytes: 1_048_588,
        }
    }
}

impl LogConfig {
    /// Positions in the offset index are u32, so a segment stays below 2 GiB.
    fn segment_bytes_max(&self) -> u64 {
        self.segment_bytes.clamp(batch::BATCH_HEADER_SIZE as i64, i32::MAX as i64) as u64
    }
    fn index_bytes(&self) -> usize {
        self.segment_index_bytes.max(0) as usize
    }
    fn interval(&self) -> u64 {
        self.index_interval_bytes.max(0) as u64
    }
}

/// What one append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub offset_of_max_timestamp: i64,
    pub num_batches: usize,
    pub num_records: i64,
    pub valid_bytes: usize,
    pub log_end_offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: i64,
    pub next_offset: i64,
    pub size_bytes: u64,
    pub largest_timestamp: i64,
    pub created_ms: i64,
    pub log_path: String,
    pub offset_index_entries: usize,
    pub time_index_entries: usize,
}

/// A byte range of one segment file; holds the file open.
#[derive(Debug, Clone)]
pub struct Slice {
    pub file: Option<Arc<File>>,
    pub position: u64,
    pub length: u64,
    /// Base offset of the first batch, -1 if empty.
    pub start_offset: i64,
}

impl Slice {
    pub fn empty() -> Self {
        Slice { file: None, position: 0, length: 0, start_offset: -1 }
    }
}

/// The log state; not thread-safe by itself (lib.rs wraps it in a Mutex).
#[derive(Debug)]
pub struct Log {
    pub(crate) dir: PathBuf,
    pub(crate) config: LogConfig,
    pub(crate) segments: BTreeMap<i64, Segment>,
    pub(crate) log_start_offset: i64,
    pub(crate) recovery_point: i64,
    pub(crate) recovered_bytes_truncated: u64,
    pub(crate) epochs: EpochCache,
    pub(crate) last_flush_ms: i64,
    /// A segment file was created since the directory was last fsynced.
    pub(crate) dir_dirty: bool,
}

/// The leading bytes of a batch a leader rewrites: baseOffset, batchLength,
/// partitionLeaderEpoch.
type BatchHead = [u8; 16];

fn segment_bases(dir: &Path) -> Result<Vec<i64>> {
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".log") {
            if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
                bases.push(stem.parse().map_err(|_| Error::Corrupt(format!("bad segment name {name}")))?);
            }
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

fn read_log_start_offset(dir: &Path) -> Result<Option<i64>> {
    match fs::read_to_string(dir.join(LOG_START_OFFSET_FILE)) {
        Ok(t) => Ok(t.trim().parse().ok()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Opens every segment in `dir`: the last one is recovered after a crash or
/// checked (and recovered if damaged) after a clean shutdown; returns the
/// segments and the bytes cut from the tail.
fn open_segments(dir: &Path, config: &LogConfig, clean: bool) -> Result<(BTreeMap<i64, Segment>, u64)> {
    let bases = segment_bases(dir)?;
    let mut segments = BTreeMap::new();
    let mut truncated = 0;
    for (i, &base) in bases.iter().enumerate() {
        let mode = match (i + 1 == bases.len(), clean) {
            (false, _) => OpenMode::Sealed,
            (true, false) => OpenMode::Recover,
            (true, true) => OpenMode::Active,
        };
        let (mut seg, cut) = Segment::open(dir, base, config.index_bytes(), config.interval(), mode)?;
        truncated += cut;
        if mode == OpenMode::Sealed {
            // A rebuilt index of a sealed segment gets its final time entry back.
            seg.on_become_inactive()?;
        }
        segments.insert(base, seg);
    }
    Ok((segments, truncated))
}

/// Writes a small file atomically: tmp file, fsync, rename.
pub(crate) fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)?;
    Ok(())
}

impl Log {
    /// Opens `dir` (creating it) and recovers unless it was shut down cleanly.
    pub fn open(dir: &Path, config: LogConfig, now_ms: i64) -> Result<Log> {
        fs::create_dir_all(dir)?;
        let marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let clean = marker.exists();
        if clean {
            fs::remove_file(&marker)?;
        }
        let stored_start = read_log_start_offset(dir)?;
        let (mut segments, truncated) = open_segments(dir, &config, clean)?;
        if segments.is_empty() {
            let base = stored_start.unwrap_or(0);
            segments.insert(base, Segment::create(dir, base, config.index_bytes(), config.interval(), now_ms)?);
        }
        let mut log = Log {
            dir: dir.to_owned(),
            config,
            segments,
            log_start_offset: 0,
            recovery_point: 0,
            recovered_bytes_truncated: truncated,
            epochs: EpochCache::open(dir)?,
            last_flush_ms: now_ms,
            dir_dirty: true,
        };
        let leo = log.log_end_offset();
        let first_base = *log.segments.keys().next().expect("at least one segment");
        log.log_start_offset = stored_start.unwrap_or(first_base).max(first_base).min(leo);
        log.recovery_point = leo;
        // Entries beyond the recovered end describe data that is gone.
        log.epochs.truncate_from_end(leo + 1)?;
        log.recover_epochs()?;
        Ok(log)
    }

    /// Re-assigns epochs from the batches' partitionLeaderEpoch where the
    /// checkpoint lags the data (a crash between the segment write and the
    /// checkpoint rename), as Kafka's LogSegment.recover does. Epochs grow
    /// with offsets, so only the newest segments whose last batch carries an
    /// epoch above the cache's latest are scanned. Data below the log start
    /// is ignored (an epoch covering it starts at the log start).
    fn recover_epochs(&mut self) -> Result<()> {
        let (latest, lso) = (self.epochs.latest_epoch().unwrap_or(-1), self.log_start_offset);
        let mut stale: Vec<i64> = Vec::new();
        for seg in self.segments.values().rev().filter(|s| !s.is_empty() && s.next_offset > lso) {
            if seg.last_epoch <= latest {
                break;
            }
            stale.push(seg.base_offset);
        }
        for base in stale.into_iter().rev() {
            let seg = &self.segments[&base];
            let mut sc = Scanner::new(&seg.file, 0, seg.size);
            while let Step::Batch(_, h) = sc.step(false)? {
                if h.last_offset() >= lso {
                    self.epochs.assign(h.partition_leader_epoch, h.base_offset.max(lso))?;
                }
            }
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> LogConfig {
        self.config
    }

    pub fn update_config(&mut self, config: LogConfig) {
        self.config = config;
        for seg in self.segments.values_mut() {
            seg.set_config(config.index_bytes(), config.interval());
        }
    }

    pub(crate) fn active(&self) -> &Segment {
        self.segments.values().next_back().expect("a log always has an active segment")
    }
    fn active_mut(&mut self) -> &mut Segment {
        self.segments.values_mut().next_back().expect("a log always has an active segment")
    }

    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.active().next_offset
    }
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }
    pub fn recovered_bytes_truncated(&self) -> u64 {
        self.recovered_bytes_truncated
    }
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.size).sum()
    }
    pub fn num_segments(&self) -> usize {
        self.segments.len()
    }
    pub fn epochs(&self) -> &EpochCache {
        &self.epochs
    }
    pub fn epochs_mut(&mut self) -> &mut EpochCache {
        &mut self.epochs
    }

    pub fn segments_info(&self) -> Vec<SegmentInfo> {
        self.segments
            .values()
            .map(|s| SegmentInfo {
                base_offset: s.base_offset,
                next_offset: s.next_offset,
                size_bytes: s.size,
                largest_timestamp: s.max_timestamp,
                created_ms: s.created_ms,
                log_path: s.log_path.to_string_lossy().into_owned(),
                offset_index_entries: s.offset_index.len(),
                time_index_entries: s.time_index.len(),
            })
            .collect()
    }

    /// Validates everything, then assigns offsets from the log end by
    /// rewriting baseOffset and partitionLeaderEpoch (the CRC does not cover
    /// them). The rewritten 16-byte heads go out with the untouched rest of
    /// each batch in one pwritev(2), so the payload is never copied: a copy of
    /// every 1 MiB append cost ~30% of append throughput.
    pub fn append_as_leader(&mut self, data: &[u8], leader_epoch: i32, now_ms: i64) -> Result<AppendInfo> {
        let mut batches = batch::validate_for_append(data, self.config.max_message_bytes.max(0) as usize)?;
        let first_offset = self.log_end_offset();
        let mut next = first_offset;
        let mut heads: Vec<BatchHead> = Vec::with_capacity(batches.len());
        for (pos, h) in batches.iter_mut() {
            let mut head: BatchHead = data[*pos..*pos + 16].try_into().expect("16 header bytes");
            batch::rewrite_offset_and_epoch(&mut head, 0, next, leader_epoch);
            heads.push(head);
            h.base_offset = next;
            h.partition_leader_epoch = leader_epoch;
            next = h.next_offset();
        }
        self.append_batches(data, &batches, Some(&heads), now_ms)?;
        if !batches.is_empty() {
            self.epochs.assign(leader_epoch, first_offset)?;
        }
        self.after_append(&batches, data.len(), now_ms)
    }

    /// Appends replicated batches as they are: offsets must continue the log.
    pub fn append_as_follower(&mut self, data: &[u8], now_ms: i64) -> Result<AppendInfo> {
        let batches = batch::validate_for_append(data, self.config.max_message_bytes.max(0) as usize)?;
        let mut expected = self.log_end_offset();
        for (i, (_, h)) in batches.iter().enumerate() {
            let ok = if i == 0 { h.base_offset == expected } else { h.base_offset >= expected };
            if !ok {
                return invalid(format!("batch base offset {} where {} was expected", h.base_offset, expected));
            }
            expected = h.next_offset();
        }
        self.append_batches(data, &batches, None, now_ms)?;
        for (_, h) in &batches {
            if h.partition_leader_epoch >= 0 {
                self.epochs.assign(h.partition_leader_epoch, h.base_offset)?;
            }
        }
        self.after_append(&batches, data.len(), now_ms)
    }

    /// Summarises an append and applies flush.messages.
    fn after_append(&mut self, batches: &[(usize, BatchHeader)], bytes: usize, now_ms: i64) -> Result<AppendInfo> {
        let leo = self.log_end_offset();
        let mut info = AppendInfo {
            first_offset: batches.first().map_or(leo, |b| b.1.base_offset),
            last_offset: batches.last().map_or(leo - 1, |b| b.1.last_offset()),
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            num_batches: batches.len(),
            num_records: batches.iter().map(|b| b.1.records_count as i64).sum(),
            valid_bytes: bytes,
            log_end_offset: leo,
        };
        for (_, h) in batches {
            if h.max_timestamp > info.max_timestamp {
                info.max_timestamp = h.max_timestamp;
                info.offset_of_max_timestamp = h.last_offset();
            }
        }
        if leo - self.recovery_point >= self.config.flush_messages {
            self.flush_at(now_ms)?;
        }
        Ok(info)
    }

    /// Writes runs of batches with one write per segment, rolling between.
    /// `heads` replaces the first 16 bytes of each batch (leader appends).
    fn append_batches(&mut self, data: &[u8], batches: &[(usize, BatchHeader)], heads: Option<&[BatchHead]>, now_ms: i64) -> Result<()> {
        let mut run_start = 0;
        for i in 0..batches.len() {
            let run_bytes = (batches[i].0 - batches[run_start].0) as u64;
            if self.should_roll(&batches[i].1, run_bytes, now_ms) {
                self.write_run(data, batches, heads, run_start..i)?;
                self.roll_at(batches[i].1.base_offset, now_ms)?;
                run_start = i;
            }
        }
        self.write_run(data, batches, heads, run_start..batches.len())
    }

    fn write_run(&mut self, data: &[u8], batches: &[(usize, BatchHeader)], heads: Option<&[BatchHead]>, run: Range<usize>) -> Result<()> {
        let (Some(first), Some(last)) = (batches.get(run.start), run.end.checked_sub(1).and_then(|i| batches.get(i))) else {
            return Ok(());
        };
        let (start, end) = (first.0, last.0 + last.1.size_bytes());
        let rel: Vec<(usize, BatchHeader)> = batches[run.clone()].iter().map(|(p, h)| (p - start, *h)).collect();
        let parts: Vec<&[u8]> = match heads {
            None => vec![&data[start..end]],
            Some(heads) => run
                .flat_map(|i| {
                    let (pos, h) = &batches[i];
                    [&heads[i][..], &data[pos + 16..pos + h.size_bytes()]]
                })
                .collect(),
        };
        self.active_mut().append(&parts, &rel)
    }

    /// The four roll conditions of seed 003, checked before a batch is added
    /// to the active segment (which already has `pending` unwritten bytes).
    fn should_roll(&self, h: &BatchHeader, pending: u64, now_ms: i64) -> bool {
        let seg = self.active();
        let size = seg.size + pending;
        let non_empty = size > 0;
        let too_big = non_empty && size + h.size_bytes() as u64 > self.config.segment_bytes_max();
        let too_old = non_empty && now_ms.saturating_sub(seg.created_ms) > self.config.segment_ms;
        let index_full = seg.offset_index.is_full() || seg.time_index.is_full();
        let offset_overflow = h.last_offset() - seg.base_offset > i32::MAX as i64;
        too_big || too_old || index_full || offset_overflow
    }

    /// Starts a new active segment at `base` (an empty active one is replaced).
    pub(crate) fn roll_at(&mut self, base: i64, now_ms: i64) -> Result<i64> {
        let (active_base, empty) = (self.active().base_offset, self.active().is_empty());
        if empty {
            if active_base == base {
                return Ok(base);
            }
            let seg = self.segments.remove(&active_base).expect("active segment");
            seg.delete_files()?;
        } else {
            self.active_mut().on_become_inactive()?;
        }
        let seg = Segment::create(&self.dir, base, self.config.index_bytes(), self.config.interval(), now_ms)?;
        self.segments.insert(base, seg);
        self.dir_dirty = true;
        Ok(base)
    }

    pub fn roll(&mut self, now_ms: i64) -> Result<i64> {
        let leo = self.log_end_offset();
        self.roll_at(leo, now_ms)
    }

    /// Whole batches from the one holding `start_offset` within one segment.
    pub fn read_slice(&self, start_offset: i64, max_bytes: u64, max_offset: Option<i64>, min_one: bool) -> Result<Slice> {
        let leo = self.log_end_offset();
        if start_offset < self.log_start_offset || start_offset > leo {
            return Err(Error::OutOfRange(format!(
                "offset {start_offset} outside [{}, {leo}]",
                self.log_start_offset
            )));
        }
        let max_offset = max_offset.unwrap_or(i64::MAX);
        let floor = self.segments.range(..=start_offset).next_back().map_or(i64::MIN, |(b, _)| *b);
        for seg in self.segments.range(floor..).map(|(_, s)| s) {
            if let Some((position, length, first)) = seg.slice(start_offset, max_bytes, max_offset, min_one)? {
                if length == 0 {
                    return Ok(Slice::empty());
                }
                return Ok(Slice { file: Some(seg.file.clone()), position, length, start_offset: first });
            }
        }
        Ok(Slice::empty())
    }

    /// First record with timestamp >= `target`: (offset, timestamp). Never
    /// answers from a segment or batch wholly below the log start, and goes
    /// on to later segments when a candidate holds no match.
    pub fn offset_for_timestamp(&self, target: i64) -> Result<Option<(i64, i64)>> {
        let lso = self.log_start_offset;
        for seg in self.segments.values().filter(|s| s.next_offset > lso && s.max_timestamp >= target) {
            if let Some(found) = self.offset_for_timestamp_in(seg, target)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    fn offset_for_timestamp_in(&self, seg: &Segment, target: i64) -> Result<Option<(i64, i64)>> {
        let from_offset = seg.time_index.floor(target).map_or(seg.base_offset, |t| seg.base_offset + t.relative_offset as i64);
        let Some((start, _)) = seg.find_batch(from_offset.max(self.log_start_offset))? else {
            return Ok(None);
        };
        let mut sc = Scanner::new(&seg.file, start, seg.size);
        while let Step::Batch(pos, h) = sc.step(false)? {
            if h.max_timestamp < target {
                continue;
            }
            if let Some(found) = first_record_at_or_after(&seg.file, pos, &h, target)? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Applies flush.ms: fsync when the last flush is at least flush.ms old.
    pub fn maybe_flush(&mut self, now_ms: i64) -> Result<bool> {
        let due = now_ms.saturating_sub(self.last_flush_ms) >= self.config.flush_ms;
        if !due || self.log_end_offset() <= self.recovery_point {
            return Ok(false);
        }
        self.flush_at(now_ms)?;
        Ok(true)
    }

    /// fsyncs every segment holding unflushed data, and the directory if a
    /// segment was created since. The active segment's indexes are left to
    /// the page cache: crash recovery rebuilds them from the .log anyway, so
    /// a flush per append costs one fdatasync (close() syncs them too).
    pub fn flush_at(&mut self, now_ms: i64) -> Result<()> {
        self.sync(now_ms, false)
    }

    fn sync(&mut self, now_ms: i64, active_indexes: bool) -> Result<()> {
        let rp = self.recovery_point;
        let from = self.segments.range(..=rp).next_back().map_or(i64::MIN, |(b, _)| *b);
        let active = self.active().base_offset;
        for seg in self.segments.range_mut(from..).map(|(_, s)| s) {
            seg.flush(active_indexes || seg.base_offset != active)?;
        }
        if self.dir_dirty {
            File::open(&self.dir)?.sync_all()?;
            self.dir_dirty = false;
        }
        self.recovery_point = self.log_end_offset();
        self.last_flush_ms = now_ms;
        Ok(())
    }

    /// Flushes and writes the clean-shutdown marker.
    pub fn close(&mut self) -> Result<()> {
        self.sync(wall_clock_ms(), true)?;
        write_atomically(&self.dir.join(CLEAN_SHUTDOWN_FILE), "")
    }
}

/// Within one batch whose max timestamp reaches `target`: the exact record
/// when uncompressed with CreateTime, else the batch's base offset.
fn first_record_at_or_after(file: &File, pos: u64, h: &BatchHeader, target: i64) -> Result<Option<(i64, i64)>> {
    use std::os::unix::fs::FileExt;
    if h.compression() != 0 || h.attributes & TIMESTAMP_TYPE_MASK != 0 {
        return Ok(Some((h.base_offset, h.max_timestamp)));
    }
    let mut raw = vec![0u8; h.size_bytes()];
    file.read_exact_at(&mut raw, pos)?;
    let records = decode_records(&raw[batch::BATCH_HEADER_SIZE..], h.records_count.max(0) as usize)?;
    Ok(records.iter().find(|r| h.base_timestamp + r.timestamp_delta >= target).map(|r| {
        (h.base_offset + r.offset_delta as i64, h.base_timestamp + r.timestamp_delta)
    }))
}
