//! Leader-epoch cache (seed 002): epoch -> start offset, persisted in
//! `leader-epoch-checkpoint` in Kafka's format ("0", count, "epoch offset" lines).
//!
//! Durability. A new epoch from an append (`assign`) is only added in memory:
//! the owning Log writes the checkpoint (tmp, fsync, rename) when it flushes,
//! closes, or once the epoch's first batch is no longer in the active segment
//! (`Log::checkpoint_sealed_epochs`). An fsync per first append of every
//! replica cost 10,000 fsyncs on the broker's event loop for one record to each
//! of 10,000 partitions (issue 24). This is safe after a crash, power loss
//! included, because of one invariant: the file on disk always holds a prefix
//! of the cache in memory (`durable` entries). Appends only add entries at the
//! end, with epochs above every cached one, each starting at the first batch
//! of its epoch; `Log::recover_epochs` re-assigns exactly those from the
//! batches whose epoch is above the file's latest, so an unwritten suffix comes
//! back from whatever data survived the crash (and entries past the recovered
//! log end go with `truncate_from_end` at open). What a scan cannot repair is
//! an entry on disk that memory no longer has: an epoch above the file's
//! latest is found from batches, a stale entry is not removed by anything.
//! So every change that removes or moves entries (the truncations, `clear`,
//! an `assign` that drops a conflicting entry) writes the file at once, with
//! fsync of the file and of the directory, and the Log makes it before it
//! changes the segments those entries describe. Unlike Kafka before
//! KAFKA-16541, nothing writes the file without fsync: a torn checkpoint would
//! fail the log's open.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{corrupt, Result};

pub const CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
const CHECKPOINT_VERSION: &str = "0";

/// Entries ascending by epoch and by start offset; owned by one Log.
#[derive(Debug)]
pub struct EpochCache {
    path: PathBuf,
    entries: Vec<(i32, i64)>,
    /// The checkpoint file holds entries[..durable] (written and fsynced);
    /// the rest were assigned since and are not on disk yet.
    durable: usize,
}

impl EpochCache {
    /// Loads the checkpoint in `dir` (an absent file is an empty cache).
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(CHECKPOINT_FILE);
        let entries = match fs::read_to_string(&path) {
            Ok(text) => parse_checkpoint(&text)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let durable = entries.len();
        Ok(EpochCache { path, entries, durable })
    }

    pub fn entries(&self) -> &[(i32, i64)] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.0)
    }

    /// Seed 002 rule 3.1: a larger epoch starts at `start_offset`. Entries that
    /// would conflict (start at or after it) are dropped, as Kafka does. The
    /// new entry is in memory only (see the module note; `flush` writes it),
    /// unless an entry was dropped: that removal is written at once.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<bool> {
        if epoch < 0 || self.latest_epoch().is_some_and(|l| epoch <= l) {
            return Ok(false);
        }
        let before = self.entries.len();
        self.entries.retain(|&(_, s)| s < start_offset);
        let dropped = self.entries.len() != before;
        self.entries.push((epoch, start_offset));
        if dropped {
            self.persist()?;
        }
        Ok(true)
    }

    /// Writes the entries assigned since the last write, if any (fsync).
    /// Returns whether it wrote.
    pub fn flush(&mut self) -> Result<bool> {
        if self.durable == self.entries.len() {
            return Ok(false);
        }
        self.write_file(false)?;
        Ok(true)
    }

    /// Start offset of the first entry not on disk yet.
    pub fn first_unflushed_start(&self) -> Option<i64> {
        self.entries.get(self.durable).map(|e| e.1)
    }

    /// OffsetForLeaderEpoch (seed 002 rule 3), Kafka's
    /// LeaderEpochFileCache.endOffsetFor: (epoch, end offset).
    /// - requested epoch UNDEFINED (-1): (-1, -1);
    /// - the latest epoch: (epoch, log end offset);
    /// - no epoch larger than the requested one: (-1, -1);
    /// - smaller than every cached epoch: (requested epoch, start offset of the
    ///   first cached epoch); the history was removed with the log start;
    /// - otherwise: (largest cached epoch <= requested, start offset of the
    ///   smallest cached epoch > requested).
    pub fn end_offset_for(&self, epoch: i32, log_end_offset: i64) -> (i32, i64) {
        const UNDEFINED_EPOCH: i32 = -1;
        const UNDEFINED: (i32, i64) = (UNDEFINED_EPOCH, -1);
        if epoch == UNDEFINED_EPOCH {
            return UNDEFINED;
        }
        if self.latest_epoch() == Some(epoch) {
            return (epoch, log_end_offset);
        }
        let Some(&(_, higher_start)) = self.entries.iter().find(|&&(e, _)| e > epoch) else {
            return UNDEFINED;
        };
        match self.entries.iter().rev().find(|&&(e, _)| e <= epoch) {
            Some(&(floor, _)) => (floor, higher_start),
            None => (epoch, higher_start),
        }
    }

    /// Seed 002 rule 3.4: remove entries starting at or after `end_offset`.
    /// Written at once if the file held a removed entry; removing only
    /// entries not on disk yet leaves the file a prefix of the cache.
    pub fn truncate_from_end(&mut self, end_offset: i64) -> Result<()> {
        self.entries.retain(|&(_, s)| s < end_offset);
        if self.entries.len() < self.durable {
            self.persist()?;
        }
        Ok(())
    }

    /// Seed 002 rule 3.2: the log start moved to `start_offset`; entries
    /// before it go, but the epoch covering it is kept, moved to start there.
    pub fn truncate_from_start(&mut self, start_offset: i64) -> Result<()> {
        let n = self.entries.partition_point(|&(_, s)| s <= start_offset);
        if n == 0 || (n == 1 && self.entries[0].1 == start_offset) {
            return Ok(());
        }
        let epoch = self.entries[n - 1].0;
        self.entries.drain(..n);
        self.entries.insert(0, (epoch, start_offset));
        self.persist()
    }

    /// Seed 002 rule 3.3: full truncation clears the cache.
    pub fn clear(&mut self) -> Result<()> {
        self.entries.clear();
        if self.durable > 0 {
            self.persist()?;
        }
        Ok(())
    }

    /// Writes a removal (the file stops being a prefix of the old cache):
    /// durable on return, the rename included.
    fn persist(&mut self) -> Result<()> {
        self.write_file(true)
    }

    /// Writes the checkpoint atomically: tmp file, fsync, rename, and with
    /// `sync_dir` an fsync of the directory, without which a power loss may
    /// bring the old file back. A flush of appended entries leaves the rename
    /// to the Log's directory fsync: the old file is a prefix of the new one,
    /// which recovery completes from the batches.
    fn write_file(&mut self, sync_dir: bool) -> Result<()> {
        let mut text = format!("{CHECKPOINT_VERSION}\n{}\n", self.entries.len());
        for (e, s) in &self.entries {
            text.push_str(&format!("{e} {s}\n"));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        if sync_dir {
            if let Some(dir) = self.path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        self.durable = self.entries.len();
        Ok(())
    }
}

fn parse_checkpoint(text: &str) -> Result<Vec<(i32, i64)>> {
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some(CHECKPOINT_VERSION) {
        return corrupt("leader-epoch-checkpoint: unknown version");
    }
    let count: usize = match lines.next().and_then(|l| l.trim().parse().ok()) {
        Some(c) => c,
        None => return corrupt("leader-epoch-checkpoint: bad count"),
    };
    let mut entries = Vec::with_capacity(count);
    for line in lines.take(count) {
        let mut parts = line.split_whitespace();
        let e = parts.next().and_then(|p| p.parse().ok());
        let s = parts.next().and_then(|p| p.parse().ok());
        match (e, s) {
            (Some(e), Some(s)) => entries.push((e, s)),
            _ => return corrupt(format!("leader-epoch-checkpoint: bad line {line:?}")),
        }
    }
    if entries.len() != count {
        return corrupt("leader-epoch-checkpoint: fewer entries than its count");
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_002_example() {
        let dir = tempfile::tempdir().unwrap();
        // B after becoming leader with epoch 2 and appending offset 5.
        let mut b = EpochCache::open(dir.path()).unwrap();
        b.assign(1, 1).unwrap();
        b.assign(2, 5).unwrap();
        // A asks with epoch 1: the smallest larger epoch (2) starts at 5.
        assert_eq!(b.end_offset_for(1, 8), (1, 5));
        assert_eq!(b.end_offset_for(2, 8), (2, 8));
        // Older than every cached epoch: Kafka answers the requested epoch with
        // the start offset of the first cached epoch.
        assert_eq!(b.end_offset_for(0, 8), (0, 1));
        assert_eq!(b.end_offset_for(-1, 8), (-1, -1));
        assert_eq!(b.end_offset_for(3, 8), (-1, -1));
        // A truncates >= 5 and its cache drops nothing starting before 5.
        let adir = tempfile::tempdir().unwrap();
        let mut a = EpochCache::open(adir.path()).unwrap();
        a.assign(1, 1).unwrap();
        a.truncate_from_end(5).unwrap();
        assert_eq!(a.entries(), &[(1, 1)]);
        a.assign(2, 5).unwrap();
        assert_eq!(a.entries(), b.entries());
    }

    #[test]
    fn gaps_between_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = EpochCache::open(dir.path()).unwrap();
        c.assign(1, 0).unwrap();
        c.assign(4, 10).unwrap();
        assert_eq!(c.end_offset_for(2, 20), (1, 10));
        assert!(!c.assign(3, 12).unwrap());
        assert_eq!(c.end_offset_for(0, 20), (0, 0));
        assert_eq!(c.end_offset_for(4, 20), (4, 20));
        assert_eq!(c.end_offset_for(5, 20), (-1, -1));
        assert_eq!(EpochCache::open(tempfile::tempdir().unwrap().path()).unwrap().end_offset_for(0, 3), (-1, -1));
        // Assigned epochs are in memory until flushed.
        assert!(EpochCache::open(dir.path()).unwrap().entries().is_empty());
        assert_eq!(c.first_unflushed_start(), Some(0));
        assert!(c.flush().unwrap());
        assert!(!c.flush().unwrap());
        assert_eq!(c.first_unflushed_start(), None);
        assert_eq!(EpochCache::open(dir.path()).unwrap().entries(), &[(1, 0), (4, 10)]);
    }

    #[test]
    fn truncations_and_persistence() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = EpochCache::open(dir.path()).unwrap();
        for (e, s) in [(1, 0), (2, 10), (3, 20)] {
            c.assign(e, s).unwrap();
        }
        c.truncate_from_start(15).unwrap();
        assert_eq!(c.entries(), &[(2, 15), (3, 20)]);
        c.truncate_from_end(20).unwrap();
        assert_eq!(c.entries(), &[(2, 15)]);
        let text = fs::read_to_string(dir.path().join(CHECKPOINT_FILE)).unwrap();
        assert_eq!(text, "0\n1\n2 15\n");
        c.clear().unwrap();
        assert!(EpochCache::open(dir.path()).unwrap().entries().is_empty());
        fs::write(dir.path().join(CHECKPOINT_FILE), "0\n2\n1 0\n").unwrap();
        assert!(EpochCache::open(dir.path()).is_err());
    }
}
