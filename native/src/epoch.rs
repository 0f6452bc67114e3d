//! Leader-epoch cache (seed 002): epoch -> start offset, persisted in
//! `leader-epoch-checkpoint` in Kafka's format ("0", count, "epoch offset" lines).

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
        Ok(EpochCache { path, entries })
    }

    pub fn entries(&self) -> &[(i32, i64)] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.0)
    }

    /// Seed 002 rule 3.1: a larger epoch starts at `start_offset`. Entries that
    /// would conflict (start at or after it) are dropped, as Kafka does.
    pub fn assign(&mut self, epoch: i32, start_offset: i64) -> Result<bool> {
        if epoch < 0 || self.latest_epoch().is_some_and(|l| epoch <= l) {
            return Ok(false);
        }
        self.entries.retain(|&(_, s)| s < start_offset);
        self.entries.push((epoch, start_offset));
        self.persist()?;
        Ok(true)
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
    pub fn truncate_from_end(&mut self, end_offset: i64) -> Result<()> {
        let before = self.entries.len();
        self.entries.retain(|&(_, s)| s < end_offset);
        if self.entries.len() != before {
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
        self.persist()
    }

    /// Writes the checkpoint atomically: tmp file, fsync, rename.
    fn persist(&self) -> Result<()> {
        let mut text = format!("{CHECKPOINT_VERSION}\n{}\n", self.entries.len());
        for (e, s) in &self.entries {
            text.push_str(&format!("{e} {s}\n"));
        }
        let tmp = self.path.with_extension("tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &self.path)?;
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
