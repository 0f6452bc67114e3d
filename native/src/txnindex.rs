//! The aborted-transaction index: `{base:020}.txnindex` beside each segment
//! (Kafka's TransactionIndex). One entry per transaction whose ABORT marker
//! lies in the segment, so a read_committed fetch can tell the consumer which
//! producers' records in the range it reads belong to aborted transactions
//! without the broker (or the consumer) looking at a record.
//!
//! Entry (34 bytes, Kafka's layout): version i16 (0) | producer id i64 |
//! first offset i64 | last offset i64 (the marker's) | last stable offset i64
//! (the partition's LSO once the abort completed). Entries are few (one per
//! aborted transaction), so every append is written at once and the whole
//! file is mirrored in memory. Like the offset and time indexes it holds no
//! descriptor: the file is opened for each write, cut or fsync (issue 24).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub const ENTRY_SIZE: usize = 34;
const VERSION: i16 = 0;

pub fn txn_index_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.txnindex"))
}

/// One aborted transaction of one producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut b = [0u8; ENTRY_SIZE];
        b[0..2].copy_from_slice(&VERSION.to_be_bytes());
        b[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        b[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        b[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        b[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Self> {
        let version = i16::from_be_bytes([b[0], b[1]]);
        if version != VERSION {
            return Err(Error::Corrupt(format!("aborted transaction entry of unknown version {version}")));
        }
        let at = |i: usize| i64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(AbortedTxn { producer_id: at(2), first_offset: at(10), last_offset: at(18), last_stable_offset: at(26) })
    }
}

/// The `.txnindex` of one segment; entries ordered by last offset.
#[derive(Debug)]
pub struct TxnIndex {
    path: PathBuf,
    entries: Vec<AbortedTxn>,
    /// Written since the last fdatasync.
    unsynced: bool,
    /// The segment's files were deleted: nothing is written any more.
    detached: bool,
}

impl TxnIndex {
    /// Loads the index if its file exists (the file is created by the first
    /// append). A torn tail (a partial entry after a crash) is cut off; an
    /// entry of another version makes the file corrupt.
    pub fn open(path: PathBuf) -> Result<Self> {
        let data = match fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TxnIndex::empty(path)),
            Err(e) => return Err(e.into()),
        };
        let whole = data.len() / ENTRY_SIZE * ENTRY_SIZE;
        let entries = data[..whole].chunks_exact(ENTRY_SIZE).map(AbortedTxn::decode).collect::<Result<Vec<_>>>()?;
        if whole != data.len() {
            OpenOptions::new().write(true).open(&path)?.set_len(whole as u64)?;
        }
        Ok(TxnIndex { entries, ..TxnIndex::empty(path) })
    }

    fn empty(path: PathBuf) -> Self {
        TxnIndex { path, entries: Vec::new(), unsynced: false, detached: false }
    }

    /// A new, empty index (a stale file of the same name is removed).
    pub fn create(path: PathBuf) -> Result<Self> {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        Ok(TxnIndex::empty(path))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> &[AbortedTxn] {
        &self.entries
    }

    pub fn last_offset(&self) -> Option<i64> {
        self.entries.last().map(|e| e.last_offset)
    }

    /// The file opened for writing (created if `create`); None if it is absent
    /// and not to be created, or the segment's files were deleted.
    fn file(&mut self, create: bool) -> io::Result<Option<File>> {
        if self.detached {
            return Ok(None);
        }
        match OpenOptions::new().write(true).create(create).truncate(false).open(&self.path) {
            Ok(f) => {
                self.unsynced = true;
                Ok(Some(f))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Called once the segment's files are deleted: nothing is written again.
    pub fn detach(&mut self) {
        self.detached = true;
    }

    /// Appends an entry; one already indexed (a marker re-applied while the
    /// producer state is rebuilt) is ignored. False if nothing was written.
    pub fn append(&mut self, txn: AbortedTxn) -> Result<bool> {
        if let Some(last) = self.last_offset() {
            if txn.last_offset <= last {
                return Ok(false);
            }
        }
        let pos = (self.entries.len() * ENTRY_SIZE) as u64;
        if let Some(f) = self.file(true)? {
            f.write_all_at(&txn.encode(), pos)?;
        }
        self.entries.push(txn);
        Ok(true)
    }

    /// Replaces every entry (the cleaner merges the indexes of the segments it joins).
    pub fn reset(&mut self, entries: Vec<AbortedTxn>) -> Result<()> {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
        if let Some(file) = self.file(!entries.is_empty())? {
            file.set_len(0)?;
            file.write_all_at(&bytes, 0)?;
        }
        self.entries = entries;
        Ok(())
    }

    /// Drops the entries whose marker is at or above `offset` (log truncation).
    pub fn truncate_to(&mut self, offset: i64) -> Result<()> {
        let keep = self.entries.iter().take_while(|e| e.last_offset < offset).count();
        if keep == self.entries.len() {
            return Ok(());
        }
        self.entries.truncate(keep);
        if let Some(f) = self.file(false)? {
            f.set_len((keep * ENTRY_SIZE) as u64)?;
        }
        Ok(())
    }

    /// Entries of transactions that overlap [fetch_offset, upper): their marker
    /// is at or after fetch_offset and they began before upper.
    pub fn collect(&self, fetch_offset: i64, upper: i64, out: &mut Vec<AbortedTxn>) {
        out.extend(self.entries.iter().filter(|e| e.last_offset >= fetch_offset && e.first_offset < upper));
    }

    pub fn sync(&mut self) -> Result<()> {
        if !self.unsynced {
            return Ok(());
        }
        if let Some(f) = self.file(false)? {
            f.sync_data()?;
        }
        self.unsynced = false;
        Ok(())
    }

    pub fn delete(&self) -> Result<()> {
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }
}

impl crate::log::Log {
    /// Indexes an aborted transaction in the segment that holds its marker
    /// (`last_offset`, already appended); False if it was indexed before.
    pub fn append_aborted_txn(&mut self, txn: AbortedTxn) -> Result<bool> {
        if txn.first_offset > txn.last_offset || txn.last_offset >= self.log_end_offset() {
            return Err(Error::Invalid(format!(
                "aborted transaction [{}, {}] is not inside the log (end offset {})",
                txn.first_offset, txn.last_offset, self.log_end_offset()
            )));
        }
        match self.segments.range_mut(..=txn.last_offset).next_back() {
            Some((_, seg)) => seg.txn_index.append(txn),
            None => Ok(false), // the marker's segment was deleted (below the log start)
        }
    }

    /// Aborted transactions overlapping [fetch_offset, upper), oldest marker first.
    pub fn collect_aborted_txns(&self, fetch_offset: i64, upper: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        let start = self.segments.range(..=fetch_offset).next_back().map_or(i64::MIN, |(b, _)| *b);
        for seg in self.segments.range(start..).map(|(_, s)| s) {
            seg.txn_index.collect(fetch_offset, upper, &mut out);
        }
        out
    }
}
