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
use crate::segment::{write_all_vectored_at, OpenMode, Scanner, Segment, Step};

/// Leader appends of at least this many bytes are written while they are
/// validated, on two threads (`overlapped_write_validate`); smaller ones
/// validate first (the threshold of the earlier one-thread streamed path,
/// not re-measured for the pool: a handoff costs ~10 µs).
const STREAM_MIN_BYTES: usize = 512 * 1024;
/// Piece size of the one-thread fallback (`stream_write_validate`): a piece
/// and its page-cache copy stay in L2; 512 KiB measured best (256 KiB and
/// below pay more per-call kernel overhead than they save, 1 MiB spills L2).
const STREAM_CHUNK_BYTES: usize = 512 * 1024;

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
    /// cleanup.policy includes compact: leader appends need keyed records.
    pub compact: bool,
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
            compact: false,
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
    /// Bumped by every truncation: a rolled flush planned before one does not count (the bytes it synced
    /// may have been replaced at the same positions).
    pub(crate) truncations: u64,
}

/// The leading bytes of a batch a leader rewrites: baseOffset, batchLength,
/// partitionLeaderEpoch.
pub(crate) type BatchHead = [u8; 16];

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
    let swapped = crate::cleaner::recover_swaps(dir)?;
    let bases = segment_bases(dir)?;
    let mut segments = BTreeMap::new();
    let mut truncated = 0;
    for (i, &base) in bases.iter().enumerate() {
        let mode = match (i + 1 == bases.len(), clean) {
            (false, _) => OpenMode::Sealed,
            (true, false) => OpenMode::Recover,
            (true, true) => OpenMode::Active,
        };
        let (mut seg, cut) = if swapped.contains(&base) && mode == OpenMode::Sealed {
            (Segment::open_rebuilt(dir, base, config.index_bytes(), config.interval())?, 0)
        } else {
            Segment::open(dir, base, config.index_bytes(), config.interval(), mode)?
        };
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
            truncations: 0,
        };
        let leo = log.log_end_offset();
        let first_base = *log.segments.keys().next().expect("at least one segment");
        log.log_start_offset = stored_start.unwrap_or(first_base).max(first_base).min(leo);
        log.recovery_point = leo;
        // Entries beyond the recovered end describe data that is gone, and
        // entries below the log start history that is (a crash between a
        // segment deletion and the cache's trim; Kafka's LogLoader does both).
        log.epochs.truncate_from_end(leo + 1)?;
        log.epochs.truncate_from_start(log.log_start_offset)?;
        log.recover_epochs()?;
        log.checkpoint_sealed_epochs()?;
        Ok(log)
    }

    /// Writes the epoch checkpoint once an epoch not on disk yet starts below
    /// the active segment: the file then misses at most epochs that start in
    /// the active segment, so recovery after a crash scans at most that
    /// segment (which an unclean open reads anyway) to find them again. One
    /// comparison per append; an fsync only on the append that rolled past a
    /// new epoch's first batch.
    fn checkpoint_sealed_epochs(&mut self) -> Result<()> {
        if self.epochs.first_unflushed_start().is_some_and(|s| s < self.active().base_offset) {
            self.epochs.flush()?;
        }
        Ok(())
    }

    /// Re-assigns epochs from the batches' partitionLeaderEpoch where the
    /// checkpoint lags the data (a crash before the Log wrote the epochs its
    /// appends assigned: see epoch.rs), as Kafka's LogSegment.recover does. Epochs grow
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
        if data.len() >= STREAM_MIN_BYTES {
            if let Some(info) = self.try_append_streamed(data, leader_epoch, now_ms)? {
                return Ok(info);
            }
        }
        let mut batches = batch::validate_for_append_keyed(data, self.config.max_message_bytes.max(0) as usize, self.config.compact)?;
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

    /// The leader append for buffers that fit the active segment: the write
    /// and the checks (CRC-32C, record walk) run at the same time on two
    /// threads, or, without the check threads, in one pass of cache-sized
    /// pieces (validate-then-write read a buffer from DRAM twice before the
    /// kernel copy read it a third time).
    /// Nothing is published until every batch validated: a bad batch cuts
    /// the file back to its old size, readers are bounded by the segment size
    /// in the meantime, and offsets, indexes and epochs do not move. Returns
    /// None (nothing done) when the buffer needs the general path: framing
    /// errors (reported there, in its order) or a segment roll.
    fn try_append_streamed(&mut self, data: &[u8], leader_epoch: i32, now_ms: i64) -> Result<Option<AppendInfo>> {
        let Ok(original) = batch::parse_batches(data, false) else {
            return Ok(None);
        };
        let first_offset = self.log_end_offset();
        let mut next = first_offset;
        let mut assigned = Vec::with_capacity(original.len());
        let mut heads: Vec<BatchHead> = Vec::with_capacity(original.len());
        for (pos, h) in &original {
            let mut head: BatchHead = data[*pos..*pos + 16].try_into().expect("16 header bytes");
            batch::rewrite_offset_and_epoch(&mut head, 0, next, leader_epoch);
            heads.push(head);
            let mut a = *h;
            a.base_offset = next;
            a.partition_leader_epoch = leader_epoch;
            if self.should_roll(&a, *pos as u64, a.size_bytes() as u64, now_ms) {
                return Ok(None);
            }
            next = a.next_offset();
            assigned.push((*pos, a));
        }
        let (file, start) = (self.active().file.clone(), self.active().size);
        let max = self.config.max_message_bytes.max(0) as usize;
        if let Err(e) = write_checked(&file, start, data, &original, &heads, max, self.config.compact) {
            file.set_len(start)?;
            return Err(e);
        }
        self.active_mut().commit_written(data.len() as u64, &assigned)?;
        if !assigned.is_empty() {
            self.epochs.assign(leader_epoch, first_offset)?;
        }
        self.after_append(&assigned, data.len(), now_ms).map(Some)
    }

    /// Appends replicated batches as they are: offsets must go on from the
    /// log end (gaps allowed, as Kafka's UnexpectedAppendOffsetException
    /// only fires below it: a compacted leader log has gaps).
    pub fn append_as_follower(&mut self, data: &[u8], now_ms: i64) -> Result<AppendInfo> {
        let batches = batch::validate_for_follower(data, self.config.max_message_bytes.max(0) as usize)?;
        let mut expected = self.log_end_offset();
        for (_, h) in batches.iter() {
            // Gaps are allowed (a compacted leader log has them), going back is not.
            let ok = h.base_offset >= expected;
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
        self.checkpoint_sealed_epochs()?;
        if leo - self.recovery_point >= self.config.flush_messages {
            self.flush_at(now_ms)?;
        }
        Ok(info)
    }

    /// Writes the batches of one append; `heads` replaces the first 16 bytes
    /// of each batch (leader appends). An append that fits in a segment goes
    /// whole into one, rolled first if the active one cannot take it all
    /// (Kafka's maybeRoll): one write, cut back if it fails, so a failed
    /// append leaves none of its batches behind. Split between segments it
    /// could leave its first share counted and readable while the produce
    /// failed (the second share's write hit ENOSPC), and a retry would append
    /// it again. Only an append larger than a whole segment (or, with a
    /// compacted leader's gaps, wider than a segment's 32-bit relative
    /// offsets) is still split; if a share of it fails, what landed is cut
    /// off again.
    fn append_batches(&mut self, data: &[u8], batches: &[(usize, BatchHeader)], heads: Option<&[BatchHead]>, now_ms: i64) -> Result<()> {
        let (Some(first), Some(last)) = (batches.first(), batches.last()) else {
            return Ok(());
        };
        let total = (last.0 + last.1.size_bytes() - first.0) as u64;
        let one_segment = total <= self.config.segment_bytes_max() && last.1.last_offset() - first.1.base_offset <= i32::MAX as i64;
        if one_segment {
            if self.should_roll(&last.1, 0, total, now_ms) {
                self.roll_at(first.1.base_offset, now_ms)?;
            }
            return self.write_run(data, batches, heads, 0..batches.len());
        }
        let end_before = self.log_end_offset();
        let written = self.append_split(data, batches, heads, now_ms);
        if written.is_err() {
            let _ = self.truncate_to(end_before, now_ms); // best effort: the error below is what counts
        }
        written
    }

    /// Runs of batches with one write per segment, rolling between.
    fn append_split(&mut self, data: &[u8], batches: &[(usize, BatchHeader)], heads: Option<&[BatchHead]>, now_ms: i64) -> Result<()> {
        let mut run_start = 0;
        for i in 0..batches.len() {
            let run_bytes = (batches[i].0 - batches[run_start].0) as u64;
            if self.should_roll(&batches[i].1, run_bytes, batches[i].1.size_bytes() as u64, now_ms) {
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
            Some(heads) => head_parts(data, &batches[run.clone()], &heads[run]),
        };
        self.active_mut().append(&parts, &rel)
    }

    /// The four roll conditions of seed 003, checked before `adding` bytes
    /// ending with batch `last` go into the active segment, which already has
    /// `pending` unwritten bytes (a whole append: `last` its last batch, no
    /// pending bytes; a batch of a split run: itself, after the run so far).
    fn should_roll(&self, last: &BatchHeader, pending: u64, adding: u64, now_ms: i64) -> bool {
        let seg = self.active();
        let size = seg.size + pending;
        let non_empty = size > 0;
        let too_big = non_empty && size + adding > self.config.segment_bytes_max();
        let too_old = non_empty && now_ms.saturating_sub(seg.created_ms) > self.config.segment_ms;
        let index_full = seg.offset_index.is_full() || seg.time_index.is_full();
        let offset_overflow = last.last_offset() - seg.base_offset > i32::MAX as i64;
        too_big || too_old || index_full || offset_overflow
    }

    /// Starts a new active segment at `base` (an empty active one is replaced).
    pub(crate) fn roll_at(&mut self, base: i64, now_ms: i64) -> Result<i64> {
        let (active_base, empty) = (self.active().base_offset, self.active().is_empty());
        if empty {
            if active_base == base {
                return Ok(base);
            }
            let mut seg = self.segments.remove(&active_base).expect("active segment");
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
        let base = self.roll_at(leo, now_ms)?;
        self.checkpoint_sealed_epochs()?;
        Ok(base)
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

    /// fsyncs every segment holding unflushed data, then writes the epochs
    /// appends assigned since the last write (epoch.rs), then fsyncs the
    /// directory if a segment or a checkpoint was created since. The active segment's indexes are left to
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
        if self.epochs.flush()? {
            self.dir_dirty = true;
        }
        if self.dir_dirty {
            File::open(&self.dir)?.sync_all()?;
            self.dir_dirty = false;
        }
        self.recovery_point = self.log_end_offset();
        self.last_flush_ms = now_ms;
        Ok(())
    }

    /// What a roll left unflushed: the sealed segments from the recovery point up to the active segment
    /// (Kafka's flush of the old segment scheduled at roll, `flushUptoOffsetExclusive`). None when the
    /// recovery point is already at or past the active segment's base. The files are synced by
    /// `sync_rolled` without the log lock; `finish_rolled_flush` then moves the recovery point.
    pub fn rolled_flush_plan(&self) -> Option<RolledFlush> {
        let target = self.active().base_offset;
        if self.recovery_point >= target {
            return None;
        }
        let from = self.segments.range(..=self.recovery_point).next_back().map_or(i64::MIN, |(b, _)| *b);
        let segments: Vec<RolledSegment> = self
            .segments
            .range(from..target)
            .map(|(_, s)| RolledSegment {
                base_offset: s.base_offset,
                size: s.size,
                file: s.file.clone(),
                index_paths: vec![s.offset_index.path().to_owned(), s.time_index.path().to_owned(), s.txn_index.path().to_owned()],
            })
            .collect();
        Some(RolledFlush { target, dir: self.dir.clone(), segments, truncations: self.truncations })
    }

    /// After `sync_rolled`: the recovery point moves to the plan's target if every planned segment is
    /// still the one synced and no shorter (no truncation, compaction swap or deletion below the target
    /// replaced bytes that were not synced). True if it moved.
    pub fn finish_rolled_flush(&mut self, plan: &RolledFlush) -> bool {
        if self.recovery_point >= plan.target || self.log_end_offset() < plan.target || self.truncations != plan.truncations {
            return false;
        }
        let from = plan.segments.first().map_or(plan.target, |s| s.base_offset);
        let now: Vec<(i64, u64, &Arc<File>)> =
            self.segments.range(from..plan.target).map(|(b, s)| (*b, s.size, &s.file)).collect();
        let same = now.len() == plan.segments.len()
            && now.iter().zip(&plan.segments).all(|((b, size, f), p)| *b == p.base_offset && *size == p.size && Arc::ptr_eq(f, &p.file));
        if same {
            self.recovery_point = plan.target;
        }
        same
    }

    /// Flushes and writes the clean-shutdown marker.
    pub fn close(&mut self) -> Result<()> {
        self.sync(wall_clock_ms(), true)?;
        write_atomically(&self.dir.join(CLEAN_SHUTDOWN_FILE), "")
    }
}

/// The threads that validate a large leader append while the appending
/// thread writes it (one per core, named for `top -H`); None if they could
/// not be started, and in a child forked after they were (it has none of
/// them: waiting on them would hang): appends then validate and write on
/// one thread.
pub(crate) fn check_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<(u32, Option<rayon::ThreadPool>)> = std::sync::OnceLock::new();
    let (pid, pool) = POOL.get_or_init(|| {
        let pool = rayon::ThreadPoolBuilder::new().thread_name(|i| format!("gregor-check-{i}")).build().ok();
        (std::process::id(), pool)
    });
    pool.as_ref().filter(|_| *pid == std::process::id())
}

/// Writes a leader append at `start` of `file` while (or as) it is checked,
/// on two threads when the check pool runs, else on one. Bytes go to the
/// file before their checks end, so the first batch is written with a
/// provisional head and gets its real one only once every check passed: a
/// crash in between leaves a tail that recovery cuts at its first byte (a
/// refused request never comes back with offsets after a restart). On an
/// error the written bytes stay for the caller to cut.
pub(crate) fn write_checked(file: &File, start: u64, data: &[u8], batches: &[(usize, BatchHeader)], heads: &[BatchHead], max: usize, require_keys: bool) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let provisional = provisional_heads(heads);
    match check_pool() {
        Some(pool) => overlapped_write_validate(pool, file, start, data, batches, &provisional, max, require_keys),
        None => stream_write_validate(file, start, data, batches, &provisional, max, require_keys),
    }?;
    if let (Some((pos, _)), Some(head)) = (batches.first(), heads.first()) {
        file.write_all_at(head, start + *pos as u64)?;
    }
    Ok(())
}

/// The iovecs of a leader write: each batch's rewritten 16-byte head, then
/// the rest of the batch from the caller's buffer (no copy of the payload).
fn head_parts<'a>(data: &'a [u8], batches: &[(usize, BatchHeader)], heads: &'a [BatchHead]) -> Vec<&'a [u8]> {
    batches.iter().zip(heads).flat_map(|((pos, h), head)| [&head[..], &data[pos + 16..pos + h.size_bytes()]]).collect()
}

/// `heads` with the first batch's batchLength set to 0: what recovery reads
/// there is no batch, so it cuts the log at that point.
pub(crate) fn provisional_heads(heads: &[BatchHead]) -> Vec<BatchHead> {
    let mut out = heads.to_vec();
    if let Some(first) = out.first_mut() {
        first[8..12].copy_from_slice(&0i32.to_be_bytes());
    }
    out
}

/// `stream_write_validate` on two cores: the calling thread writes the whole
/// buffer (one pwritev per 1024 parts) while a pool thread runs the checks of
/// `validate_for_append` over it, so an append takes about as long as the
/// kernel's copy instead of copy + CRC-32C + record walk (1 MiB batches
/// here: the checks were ~30% of a serial append; docs/benchmarks.md).
/// Nothing is published before both finish, as there; an error leaves
/// written bytes behind for the caller to cut. A write error is reported
/// before a check failure, so a failing disk surfaces as a storage error; a
/// panic in the check is a failed check, not an unwind past the caller's cut.
#[allow(clippy::too_many_arguments)]
pub(crate) fn overlapped_write_validate(pool: &rayon::ThreadPool, file: &File, start: u64, data: &[u8], batches: &[(usize, BatchHeader)], heads: &[BatchHead], max: usize, require_keys: bool) -> Result<()> {
    let mut checked: Result<()> = Ok(());
    let written = pool.in_place_scope(|s| {
        s.spawn(|_| {
            let check = || StreamCheck::new(data, batches, max, require_keys).feed(data.len());
            checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check))
                .unwrap_or_else(|_| Err(Error::Corrupt("the batch check panicked".into())));
        });
        write_all_vectored_at(file, &head_parts(data, batches, heads), start)
    });
    written.map_err(Error::from).and(checked)
}

/// Writes `batches` of `data` with the leader's `heads` at `start` of `file`
/// in STREAM_CHUNK_BYTES pieces, and validates each piece right after its
/// write, while the kernel's copy has just pulled it into cache: the source
/// comes from DRAM once, as for a plain write(2). Checks are those of
/// `validate_for_append`. An error leaves written bytes behind for the
/// caller to cut.
pub(crate) fn stream_write_validate(file: &File, start: u64, data: &[u8], batches: &[(usize, BatchHeader)], heads: &[BatchHead], max: usize, require_keys: bool) -> Result<()> {
    let mut check = StreamCheck::new(data, batches, max, require_keys);
    let mut parts: Vec<&[u8]> = Vec::new();
    let (mut c0, mut b) = (0usize, 0usize);
    while c0 < data.len() {
        let mut c1 = (c0 + STREAM_CHUNK_BYTES).min(data.len());
        parts.clear();
        let mut cur = c0;
        while b < batches.len() && batches[b].0 < c1 {
            let pos = batches[b].0;
            c1 = c1.max(pos + 16); // a rewritten head is never split
            parts.extend([&data[cur..pos], &heads[b][..]]);
            cur = pos + 16;
            b += 1;
        }
        parts.push(&data[cur..c1]);
        write_all_vectored_at(file, &parts, start + c0 as u64)?;
        check.feed(c1)?;
        c0 = c1;
    }
    Ok(())
}

/// `validate_for_append` fed in pieces: per batch max.message.bytes and the
/// counts at its header, CRC-32C and the record walk as its bytes arrive.
/// Within a batch a CRC mismatch is reported first, as there.
struct StreamCheck<'a> {
    data: &'a [u8],
    batches: &'a [(usize, BatchHeader)],
    max: usize,
    require_keys: bool,
    /// The batch being checked and how far its bytes are done.
    i: usize,
    done: usize,
    crc: crc_fast::Digest,
    walk: Option<crate::records::SectionWalk>,
    walk_err: Option<Error>,
}

impl<'a> StreamCheck<'a> {
    fn new(data: &'a [u8], batches: &'a [(usize, BatchHeader)], max: usize, require_keys: bool) -> Self {
        let crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        StreamCheck { data, batches, max, require_keys, i: 0, done: 0, crc, walk: None, walk_err: None }
    }

    /// Checks every byte of data[..upto] not checked yet.
    fn feed(&mut self, upto: usize) -> Result<()> {
        use crate::batch::{ATTRIBUTES_POS, BATCH_HEADER_SIZE};
        while let Some(&(pos, h)) = self.batches.get(self.i) {
            if pos >= upto {
                break;
            }
            let end = pos + h.size_bytes();
            if self.done <= pos {
                let checked = if h.size_bytes() > self.max {
                    Err(Error::TooLarge(format!("batch of {} bytes exceeds max.message.bytes {}", h.size_bytes(), self.max)))
                } else {
                    h.check_counts()
                };
                if let Err(e) = checked {
                    batch::verify_crc(&h, &self.data[pos..])?;
                    return Err(e);
                }
                self.crc.reset();
                let keyed = self.require_keys;
                self.walk = (h.compression() == 0).then(|| crate::records::SectionWalk::new(h.records_count).requiring_keys(keyed));
                self.walk_err = None;
                self.done = pos;
            }
            let q = upto.min(end);
            if q > pos + ATTRIBUTES_POS {
                self.crc.update(&self.data[self.done.max(pos + ATTRIBUTES_POS)..q]);
            }
            if let (Some(w), None, true) = (self.walk.as_mut(), self.walk_err.as_ref(), q >= pos + BATCH_HEADER_SIZE) {
                self.walk_err = w.advance(&self.data[pos + BATCH_HEADER_SIZE..q], q == end).err();
            }
            self.done = q;
            if q < end {
                break;
            }
            let actual = self.crc.finalize() as u32;
            if actual != h.crc {
                return Err(Error::Corrupt(format!(
                    "crc mismatch at offset {}: stored {:#010x}, computed {actual:#010x}",
                    h.base_offset, h.crc
                )));
            }
            if let Some(e) = self.walk_err.take() {
                return Err(e);
            }
            self.i += 1;
        }
        Ok(())
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

/// One sealed segment of a RolledFlush: its .log (shared handle) and index files.
#[derive(Debug)]
pub struct RolledSegment {
    pub base_offset: i64,
    pub size: u64,
    pub file: Arc<File>,
    pub index_paths: Vec<PathBuf>,
}

/// The sealed segments a roll left unflushed, to be synced without the log lock.
#[derive(Debug)]
pub struct RolledFlush {
    pub target: i64,
    pub dir: PathBuf,
    pub segments: Vec<RolledSegment>,
    truncations: u64,
}

/// fdatasync of every planned .log and index file, then of the directory (the segments' entries). Runs
/// without the log lock: appends go on into the active segment meanwhile. An index file that is gone (never
/// written, or its segment deleted) is skipped; `finish_rolled_flush` decides whether the sync counts.
pub fn sync_rolled(plan: &RolledFlush) -> Result<()> {
    for seg in &plan.segments {
        seg.file.sync_data()?;
        for path in &seg.index_paths {
            match File::open(path) {
                Ok(f) => f.sync_data()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    File::open(&plan.dir)?.sync_all()?;
    Ok(())
}
