//! Log compaction (seed 003; Kafka's LogCleaner / Cleaner / LogCleanerManager).
//!
//! A log is split at the cleaner checkpoint `first_dirty`: below it the
//! "clean" part (each key at most once, as of the last cleaning), from it up to
//! `first_uncleanable` the "dirty" part. `first_uncleanable` is the lowest of
//! the active segment's base (never cleaned), the high watermark the caller
//! passes, and the first segment younger than min.compaction.lag.ms.
//!
//! One cleaning, in three steps so the log lock is held only at the ends:
//! 1. `Log::clean_plan` (locked): the cleanable range and a snapshot of the
//!    sealed segments (their files stay readable through `Arc<File>`).
//! 2. `build` (unlocked): the key -> latest offset map over the dirty part
//!    (bounded by log.cleaner.dedupe.buffer.size at 24 bytes an entry, as
//!    Kafka's SkimpyOffsetMap: the map may end early, the rest waits), then
//!    every segment from the log start to the map's end, grouped up to
//!    segment.bytes, rewritten into `{base}.log.cleaned` files: a record is
//!    kept when no later record has its key; a tombstone (null value) is kept
//!    until its batch's delete horizon (KIP-534: set to now +
//!    delete.retention.ms the first time the tombstone is cleaned, stored in
//!    baseTimestamp with attribute bit 0x40); keyless records go. Batches keep
//!    baseOffset, lastOffsetDelta, producer fields and leader epoch, so
//!    offsets and sequences survive with gaps; a batch left without records
//!    is dropped unless it is its producer's last (kept empty, as Kafka does).
//!    Compressed batches are decompressed and recompressed with their codec.
//!    Transaction markers (COMMIT/ABORT control batches) follow Kafka's rule
//!    for delete.retention.ms: once no data batch of the marker's transaction
//!    is left (aborted data is always dropped; committed data once compaction
//!    removed every record of it), the marker gets a delete horizon as a
//!    tombstone does (KIP-534) and is dropped by the first cleaning at or
//!    after it, together with its `.txnindex` entry. A producer's last batch
//!    is never dropped (it anchors the producer state).
//! 3. `Log::clean_swap` (locked): checks the snapshot still matches, then per
//!    group: rename `.cleaned` -> `{base}.{end}.swap` (the commit point; the
//!    name carries the end of the offsets it replaces), delete the old
//!    segments, rename `.swap` -> `.log`, rebuild the indexes. `Log::open`
//!    finishes a committed swap and drops `.cleaned` leftovers.
//!
//! Offsets and the log end never move, so the leader-epoch cache stays valid.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::batch::{self, BatchHeader, BatchSpec, BATCH_HEADER_SIZE, DELETE_HORIZON_FLAG_MASK, TIMESTAMP_TYPE_MASK};
use crate::codec;
use crate::error::{Error, Result};
use crate::log::{write_atomically, Log};
use crate::records::{self, view_records, RecordView};
use crate::segment::{log_path, Scanner, Segment, Step};
use crate::txnindex::AbortedTxn;

/// Per-log cleaner state: "first_dirty_offset next_delete_horizon_ms".
pub const CLEANER_CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
pub const CLEANED_SUFFIX: &str = ".log.cleaned";
pub const SWAP_SUFFIX: &str = ".swap";
/// Bytes per offset-map entry, as Kafka's SkimpyOffsetMap (MD5 + offset).
const MAP_ENTRY_BYTES: i64 = 24;
const MAP_LOAD_FACTOR: f64 = 0.9;

/// The settings of one cleaning (topic configs and the broker's buffer).
#[derive(Debug, Clone, Copy)]
pub struct CleanConfig {
    pub now_ms: i64,
    /// The high watermark: nothing at or above it is cleaned.
    pub upper_bound_offset: i64,
    pub delete_retention_ms: i64,
    pub min_compaction_lag_ms: i64,
    pub dedupe_buffer_size: i64,
}

/// How dirty a log is (Kafka's LogToClean).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cleanable {
    pub first_dirty_offset: i64,
    pub first_uncleanable_offset: i64,
    pub clean_bytes: u64,
    pub dirty_bytes: u64,
    /// dirty / (clean + dirty), 0 when both are 0.
    pub dirty_ratio: f64,
    /// Timestamp of the first dirty batch (-1 if none): max.compaction.lag.ms.
    pub first_dirty_timestamp: i64,
    /// The earliest delete horizon of a kept tombstone batch, -1 if none.
    pub next_delete_horizon_ms: i64,
}

/// What one cleaning did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_retained: u64,
    pub tombstones_removed: u64,
    pub segments_before: usize,
    pub segments_after: usize,
    /// The new checkpoint (end of the offset map); -1 when nothing was done.
    pub end_offset: i64,
}

#[derive(Debug, Clone)]
struct SegSnap {
    base: i64,
    file: Arc<File>,
    size: u64,
    next_offset: i64,
}

/// Step 1's output: what `build` may read and `clean_swap` checks.
#[derive(Debug)]
pub struct CleanPlan {
    dir: PathBuf,
    segment_bytes: u64,
    cfg: CleanConfig,
    cleanable: Cleanable,
    /// Sealed segments below first_uncleanable, in order.
    segments: Vec<SegSnap>,
    /// Aborted transactions of those segments (their `.txnindex`): their records never shadow
    /// committed ones in the offset map, and are dropped (Kafka's cleaner does the same).
    aborted: Vec<AbortedTxn>,
}

/// Step 2's output.
#[derive(Debug)]
pub struct Built {
    /// (old segment bases replaced, cleaned file, its base, the end offset).
    groups: Vec<(Vec<i64>, PathBuf, i64, i64)>,
    stats: CleanStats,
    end_offset: i64,
    next_delete_horizon_ms: i64,
    /// Offsets of the markers dropped: their `.txnindex` entries go with them, or a
    /// read_committed reader would treat the producer's later records as aborted.
    dropped_markers: Vec<i64>,
}

impl Built {
    /// (base, end offset) of every cleaned group.
    pub fn swap_targets(&self) -> Vec<(i64, i64)> {
        self.groups.iter().map(|g| (g.2, g.3)).collect()
    }
}

pub(crate) fn read_checkpoint(dir: &Path) -> (i64, i64) {
    let text = fs::read_to_string(dir.join(CLEANER_CHECKPOINT_FILE)).unwrap_or_default();
    let mut it = text.split_whitespace().map(|t| t.parse::<i64>().ok());
    (it.next().flatten().unwrap_or(-1), it.next().flatten().unwrap_or(-1))
}

/// Lowers the cleaner checkpoint to `offset` after a truncation (Kafka's
/// LogCleanerManager.maybeTruncateCheckpoint): data re-appended above it is dirty.
pub(crate) fn truncate_checkpoint(dir: &Path, offset: i64) -> Result<()> {
    let (checkpoint, horizon) = read_checkpoint(dir);
    if checkpoint > offset {
        write_atomically(&dir.join(CLEANER_CHECKPOINT_FILE), &format!("{offset} {horizon}\n"))?;
    }
    Ok(())
}

fn swap_name(base: i64, end: i64) -> String {
    format!("{base:020}.{end:020}{SWAP_SUFFIX}")
}

/// Completes or discards a cleaning a crash interrupted (run by `Log::open`
/// before the segments are opened): `.cleaned` files were never committed
/// and go; a `{base}.{end}.swap` was committed: every segment with a base in
/// [base, end) is deleted and the swap becomes `{base}.log`. Returns the
/// bases whose indexes must be rebuilt.
pub(crate) fn recover_swaps(dir: &Path) -> Result<Vec<i64>> {
    let mut swaps = Vec::new();
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(CLEANED_SUFFIX) {
            fs::remove_file(dir.join(&name))?;
        } else if let Some(stem) = name.strip_suffix(SWAP_SUFFIX) {
            let parsed = stem.split_once('.').and_then(|(b, e)| Some((b.parse::<i64>().ok()?, e.parse::<i64>().ok()?)));
            match parsed {
                Some((b, e)) => swaps.push((b, e, name)),
                None => return Err(Error::Corrupt(format!("bad swap file name {name}"))),
            }
        } else if let Some(stem) = name.strip_suffix(".log") {
            if let Ok(b) = stem.parse::<i64>() {
                bases.push(b);
            }
        }
    }
    let mut rebuilt = Vec::new();
    swaps.sort();
    for (b, e, name) in swaps {
        for &old in bases.iter().filter(|&&x| x >= b && x < e) {
            Segment::delete_files_at(dir, old)?;
        }
        Segment::delete_files_at(dir, b)?;
        fs::rename(dir.join(&name), log_path(dir, b))?;
        rebuilt.push(b);
    }
    if !rebuilt.is_empty() {
        File::open(dir)?.sync_all()?;
    }
    Ok(rebuilt)
}

impl Log {
    /// The cleanable range and dirty ratio (Kafka's LogCleanerManager.cleanableOffsets).
    pub fn cleanable(&self, now_ms: i64, upper_bound_offset: i64, min_compaction_lag_ms: i64) -> Result<Cleanable> {
        let (checkpoint, horizon) = read_checkpoint(&self.dir);
        let leo = self.log_end_offset();
        // A checkpoint outside the log (truncation, deleted segments) restarts at the log start.
        let first_dirty = if checkpoint < self.log_start_offset || checkpoint > leo { self.log_start_offset } else { checkpoint };
        let mut first_uncleanable = self.active().base_offset.min(upper_bound_offset.max(first_dirty));
        let lag_limit = now_ms.saturating_sub(min_compaction_lag_ms.max(0));
        if min_compaction_lag_ms > 0 {
            for seg in self.segments.values().filter(|s| s.next_offset > first_dirty && s.base_offset < first_uncleanable) {
                if seg.max_timestamp > lag_limit {
                    first_uncleanable = seg.base_offset.max(first_dirty);
                    break;
                }
            }
        }
        let first_uncleanable = first_uncleanable.max(first_dirty);
        let clean_bytes: u64 = self.segments.values().filter(|s| s.next_offset <= first_dirty).map(|s| s.size).sum();
        let dirty = || self.segments.values().filter(|s| s.next_offset > first_dirty && s.base_offset < first_uncleanable);
        let dirty_bytes: u64 = dirty().map(|s| s.size).sum();
        let total = clean_bytes + dirty_bytes;
        let mut first_dirty_timestamp = -1;
        if let Some(seg) = dirty().next() {
            if let Some((_, h)) = seg.find_batch(first_dirty)? {
                first_dirty_timestamp = h.base_timestamp;
            }
        }
        Ok(Cleanable {
            first_dirty_offset: first_dirty,
            first_uncleanable_offset: first_uncleanable,
            clean_bytes,
            dirty_bytes,
            dirty_ratio: if total == 0 { 0.0 } else { dirty_bytes as f64 / total as f64 },
            first_dirty_timestamp,
            next_delete_horizon_ms: horizon,
        })
    }

    /// Step 1: the snapshot `build` works on (None if nothing is cleanable).
    pub fn clean_plan(&self, cfg: CleanConfig) -> Result<Option<CleanPlan>> {
        let cleanable = self.cleanable(cfg.now_ms, cfg.upper_bound_offset, cfg.min_compaction_lag_ms)?;
        let horizon_due = cleanable.next_delete_horizon_ms >= 0 && cleanable.next_delete_horizon_ms <= cfg.now_ms;
        if cleanable.first_uncleanable_offset <= cleanable.first_dirty_offset && !horizon_due {
            return Ok(None);
        }
        let active = self.active().base_offset;
        let segments: Vec<SegSnap> = self
            .segments
            .values()
            .filter(|s| s.base_offset < active && s.next_offset <= cleanable.first_uncleanable_offset.max(cleanable.first_dirty_offset))
            .map(|s| SegSnap { base: s.base_offset, file: s.file.clone(), size: s.size, next_offset: s.next_offset })
            .collect();
        if segments.is_empty() {
            return Ok(None);
        }
        let segment_bytes = self.config.segment_bytes.clamp(BATCH_HEADER_SIZE as i64, i32::MAX as i64) as u64;
        let aborted = self.segments.values().flat_map(|s| s.txn_index.entries().iter().copied()).collect();
        Ok(Some(CleanPlan { dir: self.dir.clone(), segment_bytes, cfg, cleanable, segments, aborted }))
    }

    /// Step 3: swaps the cleaned groups in; nothing is swapped (and the
    /// cleaned files are removed) if the log changed under the snapshot.
    pub fn clean_swap(&mut self, plan: &CleanPlan, built: Built) -> Result<CleanStats> {
        let unchanged = plan.segments.iter().all(|snap| {
            self.segments.get(&snap.base).is_some_and(|s| s.size == snap.size && s.next_offset == snap.next_offset)
        }) && plan.segments.last().is_some_and(|s| s.base < self.active().base_offset);
        if !unchanged {
            for (_, path, _, _) in &built.groups {
                let _ = fs::remove_file(path);
            }
            return Ok(CleanStats { end_offset: -1, ..Default::default() });
        }
        let (index_bytes, interval) = (self.config.segment_index_bytes.max(0) as usize, self.config.index_interval_bytes.max(0) as u64);
        for (olds, cleaned, base, end) in &built.groups {
            let swap = self.dir.join(swap_name(*base, *end));
            fs::rename(cleaned, &swap)?;
            File::open(&self.dir)?.sync_all()?;
            // The joined segment keeps every aborted-transaction entry of the ones it
            // replaces whose ABORT marker it still holds.
            let mut aborted = Vec::new();
            for old in olds {
                if let Some(mut seg) = self.segments.remove(old) {
                    aborted.extend(seg.txn_index.entries().iter().filter(|t| !built.dropped_markers.contains(&t.last_offset)));
                    seg.delete_files()?;
                }
            }
            fs::rename(&swap, log_path(&self.dir, *base))?;
            let mut seg = Segment::open_rebuilt(&self.dir, *base, index_bytes, interval)?;
            seg.txn_index.reset(aborted)?;
            self.segments.insert(*base, seg);
        }
        File::open(&self.dir)?.sync_all()?;
        let text = format!("{} {}\n", built.end_offset, built.next_delete_horizon_ms);
        write_atomically(&self.dir.join(CLEANER_CHECKPOINT_FILE), &text)?;
        let mut stats = built.stats;
        stats.segments_after = self.segments.len();
        Ok(stats)
    }

    /// All three steps under one borrow (tests and single-threaded callers).
    pub fn clean(&mut self, cfg: CleanConfig) -> Result<CleanStats> {
        match self.clean_plan(cfg)? {
            None => Ok(CleanStats { end_offset: -1, segments_before: self.segments.len(), segments_after: self.segments.len(), ..Default::default() }),
            Some(plan) => {
                let built = build(&plan)?;
                self.clean_swap(&plan, built)
            }
        }
    }
}

/// Removes the `.cleaned` files a failed `build` left behind.
pub fn discard_cleaned(plan: &CleanPlan) {
    for seg in &plan.segments {
        let _ = fs::remove_file(plan.dir.join(format!("{:020}{CLEANED_SUFFIX}", seg.base)));
    }
}

/// Every batch of a snapshot segment, CRC-checked.
fn for_each_batch(seg: &SegSnap, mut f: impl FnMut(&BatchHeader, &[u8]) -> Result<()>) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut sc = Scanner::new(&seg.file, 0, seg.size);
    let mut buf = Vec::new();
    loop {
        match sc.step(true)? {
            Step::Batch(pos, h) => {
                buf.resize(h.size_bytes(), 0);
                seg.file.read_exact_at(&mut buf, pos)?;
                f(&h, &buf)?;
            }
            Step::End => return Ok(()),
            Step::Bad(pos, e) => return Err(Error::Corrupt(format!("segment {} at {pos}: {e}", seg.base))),
        }
    }
}

/// The uncompressed records section of a batch.
fn section_of(h: &BatchHeader, raw: &[u8]) -> Result<Vec<u8>> {
    codec::decompress(h.compression(), &raw[BATCH_HEADER_SIZE..h.size_bytes()])
}

/// Step 2: the offset map, then the cleaned files (see the module doc).
pub fn build(plan: &CleanPlan) -> Result<Built> {
    let cfg = plan.cfg;
    let (first_dirty, first_uncleanable) = (plan.cleanable.first_dirty_offset, plan.cleanable.first_uncleanable_offset);
    let capacity = ((cfg.dedupe_buffer_size.max(MAP_ENTRY_BYTES) / MAP_ENTRY_BYTES) as f64 * MAP_LOAD_FACTOR) as usize;
    let mut map: HashMap<Vec<u8>, i64> = HashMap::new();
    let mut last_batch_of_producer: HashMap<i64, i64> = HashMap::new();
    let mut stats = CleanStats { segments_before: plan.segments.len(), ..Default::default() };
    // The map covers whole segments from the first dirty one on, as many as fit.
    let mut end_offset = first_dirty;
    for seg in &plan.segments {
        let mut sc = Scanner::new(&seg.file, 0, seg.size);
        while let Step::Batch(_, h) = sc.step(false)? {
            if h.producer_id >= 0 {
                last_batch_of_producer.insert(h.producer_id, h.last_offset());
            }
        }
    }
    for seg in plan.segments.iter().filter(|s| s.next_offset > first_dirty && s.base < first_uncleanable) {
        let upper = (seg.next_offset - seg.base).max(0) as usize;
        if end_offset > first_dirty && map.len() + upper > capacity {
            break;
        }
        for_each_batch(seg, |h, raw| {
            if h.is_control() || h.last_offset() < first_dirty || is_aborted(h, &plan.aborted) {
                return Ok(());
            }
            let section = section_of(h, raw)?;
            for r in view_records(&section)? {
                let offset = h.base_offset + r.offset_delta as i64;
                if let (Some(k), true) = (r.key, offset >= first_dirty) {
                    map.insert(k.to_vec(), offset);
                }
            }
            Ok(())
        })?;
        end_offset = seg.next_offset;
    }
    let horizon_due = plan.cleanable.next_delete_horizon_ms >= 0 && plan.cleanable.next_delete_horizon_ms <= cfg.now_ms;
    if end_offset <= first_dirty && !horizon_due {
        return Ok(Built {
            groups: Vec::new(),
            stats: CleanStats { end_offset: -1, ..stats },
            end_offset: first_dirty,
            next_delete_horizon_ms: plan.cleanable.next_delete_horizon_ms,
            dropped_markers: Vec::new(),
        });
    }
    let end_offset = end_offset.max(first_dirty);
    // Groups of segments below the map's end, each at most segment.bytes and
    // within i32 relative offsets (Kafka's groupSegmentsBySize).
    let to_clean: Vec<&SegSnap> = plan.segments.iter().filter(|s| s.next_offset <= end_offset.max(first_dirty)).collect();
    let mut groups: Vec<Vec<&SegSnap>> = Vec::new();
    for seg in to_clean {
        match groups.last_mut() {
            Some(g) if g.iter().map(|s| s.size).sum::<u64>() + seg.size <= plan.segment_bytes
                && seg.next_offset - 1 - g[0].base <= i32::MAX as i64 =>
            {
                g.push(seg)
            }
            _ => groups.push(vec![seg]),
        }
    }
    let mut out = Vec::new();
    let mut next_horizon = -1i64;
    // Per producer, whether its current transaction still has a data batch in the cleaned log
    // (batches are read in offset order from the log start, so a marker's data comes before it).
    let mut txn_data_left: HashMap<i64, bool> = HashMap::new();
    let mut dropped_markers = Vec::new();
    for g in groups {
        let base = g[0].base;
        let path = plan.dir.join(format!("{base:020}{CLEANED_SUFFIX}"));
        let mut w = io::BufWriter::with_capacity(1 << 20, File::create(&path)?);
        for seg in &g {
            stats.bytes_read += seg.size;
            for_each_batch(seg, |h, raw| {
                let producer_last = h.producer_id >= 0 && last_batch_of_producer.get(&h.producer_id) == Some(&h.last_offset());
                let kept = if h.is_control() {
                    let data_left = txn_data_left.remove(&h.producer_id).unwrap_or(false);
                    let kept = clean_marker(h, raw, !data_left && !producer_last, cfg)?;
                    if kept.is_none() {
                        dropped_markers.push(h.base_offset);
                    }
                    kept
                } else {
                    let aborted = is_aborted(h, &plan.aborted);
                    let kept = clean_batch(h, raw, &map, producer_last, cfg, aborted, &mut stats)?;
                    if h.is_transactional() {
                        *txn_data_left.entry(h.producer_id).or_insert(false) |= kept.is_some();
                    }
                    kept
                };
                if let Some((bytes, horizon)) = kept {
                    if horizon >= 0 && (next_horizon < 0 || horizon < next_horizon) {
                        next_horizon = horizon;
                    }
                    stats.bytes_written += bytes.len() as u64;
                    w.write_all(&bytes)?;
                }
                Ok(())
            })?;
        }
        let f = w.into_inner().map_err(|e| Error::Io(e.into_error()))?;
        f.sync_all()?;
        let end = g.last().map_or(base, |s| s.next_offset);
        out.push((g.iter().map(|s| s.base).collect(), path, base, end));
    }
    stats.end_offset = end_offset;
    Ok(Built { groups: out, stats, end_offset, next_delete_horizon_ms: next_horizon, dropped_markers })
}

/// A transactional batch inside one of its producer's aborted transactions (marker after it).
fn is_aborted(h: &BatchHeader, aborted: &[AbortedTxn]) -> bool {
    h.is_transactional()
        && !h.is_control()
        && aborted.iter().any(|t| t.producer_id == h.producer_id && t.first_offset <= h.base_offset && h.last_offset() < t.last_offset)
}

/// Kafka's shouldRetainRecord for one record of a batch.
fn retain(r: &RecordView<'_>, offset: i64, map: &HashMap<Vec<u8>, i64>, tombstones_expired: bool) -> bool {
    let Some(key) = r.key else {
        return false; // a compacted topic has no use for keyless records
    };
    if map.get(key).is_some_and(|&latest| offset < latest) {
        return false;
    }
    !(r.value_is_null && tombstones_expired)
}

/// One batch after cleaning: None when dropped, else its bytes and the
/// delete horizon it carries (-1 if it keeps no tombstone).
fn clean_batch(
    h: &BatchHeader,
    raw: &[u8],
    map: &HashMap<Vec<u8>, i64>,
    producer_last: bool,
    cfg: CleanConfig,
    aborted: bool,
    stats: &mut CleanStats,
) -> Result<Option<(Vec<u8>, i64)>> {
    let has_horizon = h.attributes & DELETE_HORIZON_FLAG_MASK != 0;
    let expired = has_horizon && h.base_timestamp <= cfg.now_ms;
    let section = section_of(h, raw)?;
    let views = view_records(&section)?;
    stats.records_read += views.len() as u64;
    let kept: Vec<&RecordView<'_>> = if aborted {
        Vec::new()
    } else {
        views.iter().filter(|r| retain(r, h.base_offset + r.offset_delta as i64, map, expired)).collect()
    };
    stats.records_retained += kept.len() as u64;
    stats.tombstones_removed += views.iter().filter(|r| r.value_is_null).count() as u64 - kept.iter().filter(|r| r.value_is_null).count() as u64;
    let keeps_tombstone = kept.iter().any(|r| r.value_is_null);
    let set_horizon = keeps_tombstone && !has_horizon;
    let horizon = match (keeps_tombstone, set_horizon) {
        (false, _) => -1,
        (true, true) => cfg.now_ms.saturating_add(cfg.delete_retention_ms),
        (true, false) => h.base_timestamp,
    };
    // An empty batch goes once it is no longer its producer's last (it was kept only for that).
    if kept.is_empty() && !producer_last {
        return Ok(None);
    }
    if kept.len() == views.len() && !set_horizon {
        return Ok(Some((raw.to_vec(), horizon)));
    }
    rebuild(h, &section, &kept, set_horizon.then_some(horizon)).map(|b| Some((b, horizon)))
}

/// A transaction marker after cleaning (Kafka's rule for delete.retention.ms): kept as it is
/// while `removable` is false (data of its transaction is left, or it is its producer's last
/// batch); the first cleaning that finds it removable stamps a delete horizon (now +
/// delete.retention.ms, KIP-534, as for tombstones) so consumers part-way through the
/// transaction still see it; a cleaning at or after the horizon drops it.
fn clean_marker(h: &BatchHeader, raw: &[u8], removable: bool, cfg: CleanConfig) -> Result<Option<(Vec<u8>, i64)>> {
    let horizon = (h.attributes & DELETE_HORIZON_FLAG_MASK != 0).then_some(h.base_timestamp);
    match (removable, horizon) {
        (false, _) => Ok(Some((raw.to_vec(), horizon.unwrap_or(-1)))),
        (true, Some(at)) if at <= cfg.now_ms => Ok(None),
        (true, Some(at)) => Ok(Some((raw.to_vec(), at))),
        (true, None) => {
            let at = cfg.now_ms.saturating_add(cfg.delete_retention_ms);
            let section = section_of(h, raw)?;
            let views = view_records(&section)?;
            let all: Vec<&RecordView<'_>> = views.iter().collect();
            Ok(Some((rebuild(h, &section, &all, Some(at))?, at)))
        }
    }
}

/// The batch with only the `kept` records, same base offset and lastOffsetDelta; with
/// `new_horizon`, stamped with that delete horizon (record timestamps re-based on it).
fn rebuild(h: &BatchHeader, section: &[u8], kept: &[&RecordView<'_>], new_horizon: Option<i64>) -> Result<Vec<u8>> {
    let set_horizon = new_horizon.is_some();
    let log_append_time = h.attributes & TIMESTAMP_TYPE_MASK != 0;
    let (mut section_out, mut max_ts) = (Vec::with_capacity(section.len()), if log_append_time { h.max_timestamp } else { -1 });
    let base_ts = new_horizon.unwrap_or(h.base_timestamp);
    for r in kept {
        let ts = h.base_timestamp + r.timestamp_delta;
        if !log_append_time {
            max_ts = max_ts.max(ts);
        }
        if base_ts == h.base_timestamp {
            section_out.extend_from_slice(r.raw);
        } else {
            let mut rec = records::decode_records(r.raw, 1)?.remove(0);
            rec.timestamp_delta = ts - base_ts;
            records::encode_record(&mut section_out, &rec);
        }
    }
    if kept.is_empty() {
        max_ts = h.max_timestamp;
    }
    let attributes = if set_horizon { h.attributes | DELETE_HORIZON_FLAG_MASK } else { h.attributes };
    let spec = BatchSpec {
        base_offset: h.base_offset,
        partition_leader_epoch: h.partition_leader_epoch,
        attributes,
        last_offset_delta: h.last_offset_delta,
        base_timestamp: base_ts,
        max_timestamp: max_ts,
        producer_id: h.producer_id,
        producer_epoch: h.producer_epoch,
        base_sequence: h.base_sequence,
        records_count: kept.len() as i32,
    };
    let compressed = codec::compress(h.compression(), &section_out)?;
    batch::build_batch(&compressed, &spec)
}
