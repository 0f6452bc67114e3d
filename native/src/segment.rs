//! One log segment: `{base:020}.log` plus its sparse `.index` and `.timeindex`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::batch::{verify_crc, BatchHeader, BATCH_HEADER_SIZE};
use crate::error::{Error, Result};
use crate::index::{Index, OffsetEntry, TimeEntry};
use crate::txnindex::{txn_index_path, TxnIndex};

/// Bytes read per pread while walking batch headers.
const SCAN_CHUNK_BYTES: usize = 64 * 1024;

pub fn log_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.log"))
}
fn index_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.index"))
}
fn time_index_path(dir: &Path, base: i64) -> PathBuf {
    dir.join(format!("{base:020}.timeindex"))
}

/// How `Segment::open` treats an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Crash recovery: verify every batch (CRC included), cut at the first bad one.
    Recover,
    /// Active segment after a clean shutdown: trust the indexes, but recover
    /// as above if they or the tail turn out damaged.
    Active,
    /// Sealed segment: rebuild damaged indexes, never cut.
    Sealed,
}

/// Sequential reader of batch headers with a chunked buffer.
pub struct Scanner<'a> {
    file: &'a File,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    pub pos: u64,
}

/// What the scanner found at its position.
pub enum Step {
    Batch(u64, BatchHeader),
    End,
    /// A torn or invalid batch starts at this position.
    Bad(u64, Error),
}

impl<'a> Scanner<'a> {
    pub fn new(file: &'a File, pos: u64, end: u64) -> Self {
        Scanner { file, end, buf: Vec::new(), buf_start: pos, pos }
    }

    /// Makes buf cover [pos, pos+len); false when that range passes the end.
    fn fill(&mut self, pos: u64, len: usize) -> io::Result<bool> {
        if pos + len as u64 > self.end {
            return Ok(false);
        }
        let covered = pos >= self.buf_start && pos + len as u64 <= self.buf_start + self.buf.len() as u64;
        if !covered {
            let want = len.max(SCAN_CHUNK_BYTES).min((self.end - pos) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, pos)?;
            self.buf_start = pos;
        }
        Ok(true)
    }

    fn slice(&self, pos: u64, len: usize) -> &[u8] {
        let at = (pos - self.buf_start) as usize;
        &self.buf[at..at + len]
    }

    /// Reads the next header (checking the whole batch's CRC when `verify`).
    pub fn step(&mut self, verify: bool) -> io::Result<Step> {
        let pos = self.pos;
        if pos == self.end {
            return Ok(Step::End);
        }
        if !self.fill(pos, BATCH_HEADER_SIZE)? {
            return Ok(Step::Bad(pos, Error::Corrupt("torn batch header".into())));
        }
        let h = match BatchHeader::parse(self.slice(pos, BATCH_HEADER_SIZE)) {
            Ok(h) => h,
            Err(e) => return Ok(Step::Bad(pos, e)),
        };
        if pos + h.size_bytes() as u64 > self.end {
            return Ok(Step::Bad(pos, Error::Corrupt("torn batch".into())));
        }
        if verify {
            self.fill(pos, h.size_bytes())?;
            if let Err(e) = verify_crc(&h, self.slice(pos, h.size_bytes())) {
                return Ok(Step::Bad(pos, e));
            }
        }
        self.pos += h.size_bytes() as u64;
        Ok(Step::Batch(pos, h))
    }
}

/// Most iovecs one pwritev(2) accepts on Linux.
const IOV_MAX: usize = 1024;

/// pwritev(2) of all `parts` at `offset`, resuming after partial writes.
pub fn write_all_vectored_at(file: &File, parts: &[&[u8]], mut offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (mut idx, mut skip) = (0usize, 0usize);
    loop {
        while idx < parts.len() && parts[idx].len() == skip {
            (idx, skip) = (idx + 1, 0);
        }
        if idx == parts.len() {
            return Ok(());
        }
        let iovs: Vec<libc::iovec> = parts[idx..]
            .iter()
            .take(IOV_MAX)
            .enumerate()
            .map(|(i, p)| {
                let p = if i == 0 { &p[skip..] } else { p };
                libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }
            })
            .collect();
        // SAFETY: every iovec points into a live slice of `parts`.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iovs.as_ptr(), iovs.len() as i32, offset as libc::off_t) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        let mut n = n as usize;
        while n > 0 {
            let rest = parts[idx].len() - skip;
            if n >= rest {
                (n, idx, skip) = (n - rest, idx + 1, 0);
            } else {
                (n, skip) = (0, skip + n);
            }
        }
    }
}

/// A segment and its indexes; owned by the Log (callers hold the log lock).
#[derive(Debug)]
pub struct Segment {
    pub base_offset: i64,
    pub log_path: PathBuf,
    pub file: Arc<File>,
    pub size: u64,
    pub next_offset: i64,
    /// -1 when empty.
    pub max_timestamp: i64,
    pub offset_of_max_timestamp: i64,
    /// partitionLeaderEpoch of the last batch, -1 when empty.
    pub last_epoch: i32,
    pub created_ms: i64,
    pub offset_index: Index<OffsetEntry>,
    pub time_index: Index<TimeEntry>,
    /// Aborted transactions whose ABORT marker is in this segment.
    pub txn_index: TxnIndex,
    bytes_since_last_index: u64,
    index_interval_bytes: u64,
}

impl Segment {
    /// Creates an empty segment (replacing stale files of the same name).
    pub fn create(dir: &Path, base: i64, index_bytes: usize, interval: u64, now_ms: i64) -> Result<Self> {
        for p in [index_path(dir, base), time_index_path(dir, base)] {
            let _ = fs::remove_file(p);
        }
        let log_path = log_path(dir, base);
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&log_path)?;
        let (offset_index, _) = Index::open(&index_path(dir, base), index_bytes)?;
        let (time_index, _) = Index::open(&time_index_path(dir, base), index_bytes)?;
        let txn_index = TxnIndex::create(txn_index_path(dir, base))?;
        Ok(Segment {
            base_offset: base,
            log_path,
            file: Arc::new(file),
            size: 0,
            next_offset: base,
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            last_epoch: -1,
            created_ms: now_ms,
            offset_index,
            time_index,
            txn_index,
            bytes_since_last_index: 0,
            index_interval_bytes: interval,
        })
    }

    /// Opens an existing segment (see `OpenMode`); returns it and the bytes
    /// cut from its tail.
    pub fn open(dir: &Path, base: i64, index_bytes: usize, interval: u64, mode: OpenMode) -> Result<(Self, u64)> {
        let log_path = log_path(dir, base);
        let file = OpenOptions::new().read(true).write(true).open(&log_path)?;
        let meta = file.metadata()?;
        let created_ms = meta.modified()?.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let (offset_index, ok_o) = Index::open(&index_path(dir, base), index_bytes)?;
        let (time_index, ok_t) = Index::open(&time_index_path(dir, base), index_bytes)?;
        let txn_index = TxnIndex::open(txn_index_path(dir, base))?;
        let mut seg = Segment {
            base_offset: base,
            log_path,
            file: Arc::new(file),
            size: meta.len(),
            next_offset: base,
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            last_epoch: -1,
            created_ms,
            offset_index,
            time_index,
            txn_index,
            bytes_since_last_index: 0,
            index_interval_bytes: interval,
        };
        let trusted = mode != OpenMode::Recover && ok_o && ok_t;
        if !trusted || !seg.offset_index_matches_log()? || !seg.load_tail_state()? {
            let (mut seg, cut) = seg.rebuild(mode != OpenMode::Sealed)?;
            // Markers cut with a torn tail take their entries with them.
            seg.txn_index.truncate_to(seg.next_offset)?;
            return Ok((seg, cut));
        }
        Ok((seg, 0))
    }

    /// Opens a sealed segment whose indexes are rebuilt from the .log (a
    /// segment the log cleaner swapped in).
    pub fn open_rebuilt(dir: &Path, base: i64, index_bytes: usize, interval: u64) -> Result<Self> {
        for p in [index_path(dir, base), time_index_path(dir, base)] {
            let _ = fs::remove_file(p);
        }
        let (seg, _) = Segment::open(dir, base, index_bytes, interval, OpenMode::Sealed)?;
        let (mut seg, _) = seg.rebuild(false)?;
        seg.on_become_inactive()?;
        Ok(seg)
    }

    /// Removes the .log and index files of the segment at `base`, if any.
    pub fn delete_files_at(dir: &Path, base: i64) -> Result<()> {
        for p in [log_path(dir, base), index_path(dir, base), time_index_path(dir, base), txn_index_path(dir, base)] {
            match fs::remove_file(&p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }

    /// True if every offset-index entry is the position of a whole batch
    /// whose last offset is the entry's offset: one header pread per entry
    /// (the index is sparse), so a shifted position cannot misguide reads.
    fn offset_index_matches_log(&self) -> Result<bool> {
        let mut head = [0u8; BATCH_HEADER_SIZE];
        for e in self.offset_index.entries() {
            let pos = e.position as u64;
            if pos + BATCH_HEADER_SIZE as u64 > self.size {
                return Ok(false);
            }
            self.file.read_exact_at(&mut head, pos)?;
            let ok = BatchHeader::parse(&head).is_ok_and(|h| {
                h.last_offset() == self.base_offset + e.relative_offset as i64 && pos + h.size_bytes() as u64 <= self.size
            });
            if !ok {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Walks the whole file rebuilding both indexes; with `cut`, verifies CRCs
    /// and truncates the file at the first bad batch.
    fn rebuild(mut self, cut: bool) -> Result<(Self, u64)> {
        self.offset_index.reset(Vec::new())?;
        self.time_index.reset(Vec::new())?;
        let (old_size, file) = (self.size, self.file.clone());
        self.size = 0;
        self.next_offset = self.base_offset;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = -1;
        self.last_epoch = -1;
        self.bytes_since_last_index = 0;
        let mut sc = Scanner::new(&file, 0, old_size);
        let mut end = old_size;
        loop {
            match sc.step(cut)? {
                Step::Batch(pos, h) if h.base_offset >= self.next_offset => {
                    self.index_batch(pos, &h)?;
                    self.size = pos + h.size_bytes() as u64;
                }
                Step::Batch(pos, _) | Step::Bad(pos, _) => {
                    end = pos;
                    break;
                }
                Step::End => break,
            }
        }
        let mut cut_bytes = 0;
        if cut && end < old_size {
            file.set_len(end)?;
            cut_bytes = old_size - end;
        }
        self.size = if cut { end } else { old_size };
        Ok((self, cut_bytes))
    }

    /// Derives next offset and max timestamp from the indexes plus a scan of
    /// the tail after the last offset-index entry. False if the indexes
    /// point past the file or disagree with it (the caller rebuilds).
    fn load_tail_state(&mut self) -> Result<bool> {
        let last_pos = self.offset_index.last().map_or(0, |e| e.position as u64);
        let positions_ok = self.offset_index.entries().iter().all(|e| (e.position as u64) < self.size);
        if !positions_ok || last_pos > self.size {
            return Ok(false);
        }
        if let Some(t) = self.time_index.last() {
            self.max_timestamp = t.timestamp;
            self.offset_of_max_timestamp = self.base_offset + t.relative_offset as i64;
        }
        let file = self.file.clone();
        let mut sc = Scanner::new(&file, last_pos, self.size);
        let mut first = true;
        loop {
            match sc.step(false)? {
                Step::Batch(_, h) => {
                    let expected = self.offset_index.last().filter(|_| first);
                    if expected.is_some_and(|e| self.base_offset + e.relative_offset as i64 != h.last_offset()) {
                        return Ok(false);
                    }
                    first = false;
                    self.next_offset = h.next_offset();
                    self.last_epoch = h.partition_leader_epoch;
                    if h.max_timestamp > self.max_timestamp {
                        self.max_timestamp = h.max_timestamp;
                        self.offset_of_max_timestamp = h.last_offset();
                    }
                }
                Step::End => break,
                Step::Bad(..) => return Ok(false),
            }
        }
        let time_ok = self.time_index.entries().iter().all(|t| self.base_offset + (t.relative_offset as i64) < self.next_offset);
        Ok(time_ok)
    }

    fn relative(&self, offset: i64) -> u32 {
        (offset - self.base_offset) as u32
    }

    /// Updates indexes and counters for one batch written at `pos`
    /// (Kafka's LogSegment.append loop).
    fn index_batch(&mut self, pos: u64, h: &BatchHeader) -> io::Result<()> {
        if h.max_timestamp > self.max_timestamp {
            self.max_timestamp = h.max_timestamp;
            self.offset_of_max_timestamp = h.last_offset();
        }
        if self.bytes_since_last_index >= self.index_interval_bytes {
            let e = OffsetEntry { relative_offset: self.relative(h.last_offset()), position: pos as u32 };
            self.offset_index.append(e)?;
            self.maybe_append_time_entry()?;
            self.bytes_since_last_index = 0;
        }
        self.bytes_since_last_index += h.size_bytes() as u64;
        self.next_offset = h.next_offset();
        self.last_epoch = h.partition_leader_epoch;
        Ok(())
    }

    fn maybe_append_time_entry(&mut self) -> io::Result<()> {
        if self.max_timestamp < 0 || self.time_index.last().is_some_and(|t| t.timestamp >= self.max_timestamp) {
            return Ok(());
        }
        let rel = self.relative(self.offset_of_max_timestamp);
        self.time_index.append(TimeEntry { timestamp: self.max_timestamp, relative_offset: rel })
    }

    /// Writes `parts` (together whole batches at the given positions) with
    /// one pwritev(2) per 1024 parts, then indexes each batch.
    /// A write that fails part-way (ENOSPC, EIO) is cut back to the segment's
    /// end: whole batches it did land would otherwise come back at recovery
    /// as records whose produce failed (seen on a full tmpfs: 3 complete
    /// batches past the tracked end after a failed 20-batch append).
    pub fn append(&mut self, parts: &[&[u8]], batches: &[(usize, BatchHeader)]) -> Result<()> {
        if let Err(e) = write_all_vectored_at(&self.file, parts, self.size) {
            let _ = self.file.set_len(self.size); // shrinking needs no free space
            return Err(e.into());
        }
        self.commit_written(parts.iter().map(|p| p.len() as u64).sum::<u64>(), batches)
    }

    /// Publishes `len` bytes already written after the current end (whole
    /// batches at the given relative positions): size, indexes, counters.
    /// Until then readers, bounded by `size`, do not see them.
    pub fn commit_written(&mut self, len: u64, batches: &[(usize, BatchHeader)]) -> Result<()> {
        let start = self.size;
        self.size += len;
        for (pos, h) in batches {
            self.index_batch(start + *pos as u64, h)?;
        }
        Ok(())
    }

    /// Called when the segment stops being active: the final time entry.
    /// Called when the segment stops being active: the final time entry,
    /// and every pending index entry goes to the files.
    pub fn on_become_inactive(&mut self) -> Result<()> {
        self.maybe_append_time_entry()?;
        self.offset_index.write_pending()?;
        Ok(self.time_index.write_pending()?)
    }

    pub fn set_config(&mut self, index_bytes: usize, interval: u64) {
        self.offset_index.set_max_bytes(index_bytes);
        self.time_index.set_max_bytes(index_bytes);
        self.index_interval_bytes = interval;
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    /// The first batch whose last offset is >= `offset`, found via the index.
    /// A guided scan that meets a bad header, or a batch other than the one
    /// the index entry names, starts over from position 0; offsets are never
    /// skipped: damage on the way is CorruptRecordError.
    pub fn find_batch(&self, offset: i64) -> Result<Option<(u64, BatchHeader)>> {
        let entry = (offset > self.base_offset)
            .then(|| self.offset_index.floor((offset - self.base_offset).min(u32::MAX as i64)))
            .flatten();
        if let Some(e) = entry {
            let expected = self.base_offset + e.relative_offset as i64;
            if let Ok(found) = self.scan_for(offset, e.position as u64, Some(expected)) {
                return Ok(found);
            }
        }
        self.scan_for(offset, 0, None)
    }

    /// Scans from `start` for the first batch whose last offset is >= `offset`;
    /// `expected` is the last offset the first batch must have.
    fn scan_for(&self, offset: i64, start: u64, expected: Option<i64>) -> Result<Option<(u64, BatchHeader)>> {
        let mut sc = Scanner::new(&self.file, start, self.size);
        let mut first = true;
        loop {
            match sc.step(false)? {
                Step::Batch(pos, h) if first && expected.is_some_and(|x| x != h.last_offset()) => {
                    return Err(Error::Corrupt(format!("{}: no batch ending at {} at {pos}", self.log_path.display(), expected.unwrap_or(-1))));
                }
                Step::Batch(pos, h) if h.last_offset() >= offset => return Ok(Some((pos, h))),
                Step::Batch(..) => first = false,
                Step::End => return Ok(None),
                Step::Bad(pos, e) => return Err(Error::Corrupt(format!("{} at {pos}: {e}", self.log_path.display()))),
            }
        }
    }

    /// Whole batches from the one holding `offset`: (position, length, first base).
    /// Stops before max_bytes (unless `min_one` and nothing taken yet) and
    /// before any batch whose last offset reaches `max_offset`.
    pub fn slice(&self, offset: i64, max_bytes: u64, max_offset: i64, min_one: bool) -> Result<Option<(u64, u64, i64)>> {
        let Some((start, first)) = self.find_batch(offset)? else {
            return Ok(None);
        };
        let mut len = 0u64;
        let mut sc = Scanner::new(&self.file, start, self.size);
        while let Step::Batch(_, h) = sc.step(false)? {
            let size = h.size_bytes() as u64;
            let fits = len + size <= max_bytes || (len == 0 && min_one);
            if !fits || h.last_offset() >= max_offset {
                break;
            }
            len += size;
        }
        Ok(Some((start, len, first.base_offset)))
    }

    /// Removes every batch whose last offset is >= `offset`; returns bytes cut.
    pub fn truncate_to(&mut self, offset: i64) -> Result<u64> {
        let Some((pos, _)) = self.find_batch(offset)? else {
            return Ok(0);
        };
        let cut = self.size - pos;
        self.file.set_len(pos)?;
        self.size = pos;
        self.offset_index.truncate_where(|e| (e.position as u64) < pos)?;
        self.txn_index.truncate_to(offset)?;
        let last_kept = self.offset_index.last();
        self.time_index.truncate_where(|t| last_kept.is_some_and(|o| t.relative_offset <= o.relative_offset))?;
        self.next_offset = self.base_offset;
        self.max_timestamp = -1;
        self.offset_of_max_timestamp = -1;
        self.last_epoch = -1;
        if !self.load_tail_state()? {
            return Err(Error::Corrupt(format!("{} inconsistent after truncation", self.log_path.display())));
        }
        self.bytes_since_last_index = self.size - last_kept.map_or(0, |e| e.position as u64);
        Ok(cut)
    }

    /// fdatasync of the .log, and of both indexes when `indexes`.
    pub fn flush(&mut self, indexes: bool) -> Result<()> {
        self.file.sync_data()?;
        if indexes {
            self.offset_index.sync()?;
            self.time_index.sync()?;
            self.txn_index.sync()?;
        }
        Ok(())
    }

    /// Removes the files; open slices keep reading through their Arc<File>,
    /// and the indexes stop writing (a new segment may take their names).
    pub fn delete_files(&mut self) -> Result<()> {
        self.offset_index.detach();
        self.time_index.detach();
        self.txn_index.detach();
        for p in [&self.log_path, &self.offset_index.path().to_owned(), &self.time_index.path().to_owned()] {
            match fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        self.txn_index.delete()
    }
}
