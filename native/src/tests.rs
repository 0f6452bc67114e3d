//! Log-level tests: append/read, the four roll conditions, retention,
//! truncation, recovery, timestamp lookup and a random operation sequence.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use proptest::prelude::*;

use crate::batch::{self, BatchSpec};
use crate::error::Error;
use crate::log::{Log, LogConfig, Slice, CLEAN_SHUTDOWN_FILE};
use crate::records::{encode_record, Record};
use crate::txnindex::AbortedTxn;

const T0: i64 = 1_700_000_000_000;

/// A batch of `count` records with timestamps ts, ts+1, ...; values of `value_len` bytes.
fn batch_with(count: i32, ts: i64, value_len: usize) -> Vec<u8> {
    let mut section = Vec::new();
    for i in 0..count {
        let r = Record {
            offset_delta: i,
            timestamp_delta: i as i64,
            key: Some(format!("k{i}").into_bytes()),
            value: Some(vec![b'v'; value_len]),
            headers: vec![],
        };
        encode_record(&mut section, &r);
    }
    let mut spec = BatchSpec {
        base_offset: 0,
        partition_leader_epoch: -1,
        attributes: 0,
        last_offset_delta: count - 1,
        base_timestamp: ts,
        max_timestamp: ts + count as i64 - 1,
        producer_id: -1,
        producer_epoch: -1,
        base_sequence: -1,
        records_count: count,
    };
    spec.max_timestamp = ts + count as i64 - 1;
    batch::build_batch(&section, &spec).unwrap()
}

fn open(dir: &Path, cfg: LogConfig) -> Log {
    Log::open(dir, cfg, T0).unwrap()
}

fn read_all(log: &Log, from: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.log_end_offset() {
        let s = log.read_slice(at, 1 << 20, None, true).unwrap();
        assert!(s.length > 0, "no progress at {at}");
        for (_, h) in batch::parse_batches(&slice_bytes(&s), true).unwrap() {
            out.push((h.base_offset, h.last_offset()));
            at = h.next_offset();
        }
    }
    out
}

/// A replicated batch of `count` records (values of 40 bytes) at `base` under `epoch`.
fn follower_batch(base: i64, epoch: i32, count: i32) -> Vec<u8> {
    let mut b = batch_with(count, T0, 40);
    batch::rewrite_offset_and_epoch(&mut b, 0, base, epoch);
    b
}

/// The batches of the segment holding `from`, from there on.
fn read_bytes(log: &Log, from: i64) -> Vec<u8> {
    slice_bytes(&log.read_slice(from, 1 << 20, None, true).unwrap())
}

fn slice_bytes(s: &Slice) -> Vec<u8> {
    let mut buf = vec![0u8; s.length as usize];
    if let Some(f) = &s.file {
        f.read_exact_at(&mut buf, s.position).unwrap();
    }
    buf
}

#[test]
fn append_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { index_interval_bytes: 100, ..Default::default() });
    let mut data = batch_with(3, T0, 10);
    data.extend(batch_with(2, T0 + 10, 10));
    let info = log.append_as_leader(&data, 5, T0).unwrap();
    assert_eq!((info.first_offset, info.last_offset, info.num_batches, info.num_records), (0, 4, 2, 5));
    assert_eq!((info.max_timestamp, info.offset_of_max_timestamp, info.log_end_offset), (T0 + 11, 4, 5));
    for _ in 0..20 {
        log.append_as_leader(&batch_with(4, T0 + 20, 50), 5, T0).unwrap();
    }
    assert_eq!(log.log_end_offset(), 85);
    assert!(log.segments_info()[0].offset_index_entries > 0);
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 22);
    assert_eq!(all[2], (5, 8));
    // A start inside a batch returns that whole batch.
    let s = log.read_slice(7, 1, None, true).unwrap();
    assert_eq!((s.start_offset, s.length), (5, batch_with(4, 0, 50).len() as u64));
    assert_eq!(log.read_slice(7, 1, None, false).unwrap().length, 0);
    // max_offset excludes batches reaching it.
    let s = log.read_slice(0, 1 << 20, Some(9), true).unwrap();
    let hs = batch::parse_batches(&slice_bytes(&s), true).unwrap();
    assert_eq!(hs.last().unwrap().1.last_offset(), 8);
    assert_eq!(log.read_slice(85, 100, None, true).unwrap().length, 0);
    assert!(matches!(log.read_slice(86, 100, None, true), Err(Error::OutOfRange(_))));
    assert!(matches!(log.read_slice(-1, 100, None, true), Err(Error::OutOfRange(_))));
    assert_eq!(log.epochs().entries(), &[(5, 0)]);
}

#[test]
fn leader_append_rejects_bad_input_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { max_message_bytes: 200, ..Default::default() });
    let good = batch_with(1, T0, 10);
    let mut corrupt = good.clone();
    corrupt[70] ^= 0xff;
    let both = [good.clone(), corrupt].concat();
    assert!(matches!(log.append_as_leader(&both, 0, T0), Err(Error::Corrupt(_))));
    assert!(matches!(log.append_as_leader(&good[..good.len() - 1], 0, T0), Err(Error::Corrupt(_))));
    assert!(matches!(log.append_as_leader(&batch_with(1, T0, 300), 0, T0), Err(Error::TooLarge(_))));
    assert_eq!((log.log_end_offset(), log.size_bytes()), (0, 0));
}

#[test]
fn follower_append_keeps_offsets_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    let mut b = batch_with(2, T0, 1);
    batch::rewrite_offset_and_epoch(&mut b, 0, 0, 1);
    log.append_as_follower(&b, T0).unwrap();
    let mut c = batch_with(3, T0, 1);
    batch::rewrite_offset_and_epoch(&mut c, 0, 2, 2);
    log.append_as_follower(&c, T0).unwrap();
    assert_eq!(log.epochs().entries(), &[(1, 0), (2, 2)]);
    assert!(matches!(log.append_as_follower(&c, T0), Err(Error::Invalid(_))));
    assert_eq!(log.log_end_offset(), 5);
}

#[test]
fn rolls_when_segment_bytes_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 100).len() as i64;
    let mut log = open(dir.path(), LogConfig { segment_bytes: size * 3, ..Default::default() });
    for _ in 0..7 {
        log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    }
    let bases: Vec<i64> = log.segments_info().iter().map(|s| s.base_offset).collect();
    assert_eq!(bases, vec![0, 3, 6]);
    // One append call spanning a roll is split between segments.
    let many: Vec<u8> = (0..4).flat_map(|_| batch_with(1, T0, 100)).collect();
    log.append_as_leader(&many, 0, T0).unwrap();
    assert_eq!(log.num_segments(), 4);
    assert_eq!(read_all(&log, 0).len(), 11);
}

#[test]
fn an_append_that_fits_a_segment_goes_whole_into_one() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 100).len() as i64;
    let mut log = open(dir.path(), LogConfig { segment_bytes: size * 3, ..Default::default() });
    log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    // Three batches fit a segment but not the active one's last slot: rolled first, not split.
    let three: Vec<u8> = (0..3).flat_map(|_| batch_with(1, T0, 100)).collect();
    log.append_as_leader(&three, 0, T0).unwrap();
    let segs: Vec<(i64, u64)> = log.segments_info().iter().map(|s| (s.base_offset, s.size_bytes)).collect();
    assert_eq!(segs, vec![(0, 2 * size as u64), (2, 3 * size as u64)]);
    assert_eq!(read_all(&log, 0).len(), 5);
}

#[test]
fn rolls_when_segment_is_older_than_segment_ms() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_ms: 1000, ..Default::default() });
    log.append_as_leader(&batch_with(1, T0, 1), 0, T0 + 500).unwrap();
    log.append_as_leader(&batch_with(1, T0, 1), 0, T0 + 1000).unwrap();
    assert_eq!(log.num_segments(), 1);
    log.append_as_leader(&batch_with(1, T0, 1), 0, T0 + 1001).unwrap();
    assert_eq!(log.num_segments(), 2);
    assert_eq!(log.segments_info()[1].created_ms, T0 + 1001);
}

#[test]
fn rolls_when_an_index_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_index_bytes: 24, index_interval_bytes: 0, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for i in 0..7 {
        log.append_as_leader(&batch_with(1, T0 + i, 1), 0, T0).unwrap();
    }
    // 24 bytes hold three offset entries (8 B) but only two time entries (12 B).
    let segs = log.segments_info();
    assert_eq!(segs.iter().map(|s| s.base_offset).collect::<Vec<_>>(), vec![0, 2, 4, 6]);
    assert!(segs.iter().all(|s| s.time_index_entries <= 2));
}

#[test]
fn rolls_when_relative_offset_would_overflow() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_follower(&batch_with(1, T0, 1), T0).unwrap();
    let far = 1 + i32::MAX as i64 + 5;
    let (mut a, mut b) = (batch_with(1, T0, 1), batch_with(1, T0, 1));
    batch::rewrite_offset_and_epoch(&mut a, 0, 1, 0);
    batch::rewrite_offset_and_epoch(&mut b, 0, far, 0);
    log.append_as_follower(&[a, b].concat(), T0).unwrap();
    let bases: Vec<i64> = log.segments_info().iter().map(|s| s.base_offset).collect();
    assert_eq!(bases, vec![0, far]);
    assert_eq!(log.log_end_offset(), far + 1);
    assert_eq!(log.read_slice(far, 1000, None, true).unwrap().start_offset, far);
}

#[test]
fn retention_by_time_rolls_expired_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 10).len() as i64;
    let cfg = LogConfig { segment_bytes: size * 2, retention_ms: 1000, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for i in 0..5 {
        log.append_as_leader(&batch_with(1, T0 + i * 100, 10), i as i32, T0).unwrap();
    }
    assert_eq!(log.num_segments(), 3);
    // Segment [0,1] max ts T0+100, [2,3] T0+300, [4] T0+400.
    assert_eq!(log.delete_old_segments(T0 + 1200).unwrap(), 1);
    assert_eq!(log.log_start_offset(), 2);
    assert_eq!(log.epochs().entries()[0], (2, 2));
    assert!(matches!(log.read_slice(1, 10, None, true), Err(Error::OutOfRange(_))));
    assert_eq!(log.delete_old_segments(T0 + 5000).unwrap(), 2);
    assert_eq!((log.num_segments(), log.log_start_offset(), log.log_end_offset()), (1, 5, 5));
    assert_eq!(log.epochs().entries(), &[(4, 5)]);
}

#[test]
fn retention_by_bytes_keeps_active() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 10).len() as i64;
    let cfg = LogConfig { segment_bytes: size, retention_bytes: size * 2, retention_ms: -1, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for _ in 0..5 {
        log.append_as_leader(&batch_with(1, T0, 10), 0, T0).unwrap();
    }
    assert_eq!(log.delete_old_segments(T0).unwrap(), 3);
    assert_eq!((log.log_start_offset(), log.size_bytes()), (3, 2 * size as u64));
}

#[test]
fn retention_never_deletes_at_or_above_upper_bound() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 10).len() as i64;
    let cfg = LogConfig { segment_bytes: size, retention_bytes: 0, retention_ms: -1, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for _ in 0..5 {
        log.append_as_leader(&batch_with(1, T0, 10), 0, T0).unwrap();
    }
    // Segments [0] [1] [2] [3] [4]; the high watermark is 2: only [0] and [1]
    // lie wholly below it (the next segment's base <= 2).
    assert_eq!(log.num_segments(), 5);
    assert_eq!(log.delete_old_segments_below(T0, Some(2)).unwrap(), 2);
    assert_eq!(log.log_start_offset(), 2);
    assert_eq!(log.delete_old_segments_below(T0, Some(2)).unwrap(), 0);
    assert_eq!(log.delete_old_segments_below(T0, Some(0)).unwrap(), 0);
    // A bound past the log end is the log end.
    assert_eq!(log.delete_old_segments_below(T0, Some(99)).unwrap(), 2);
    assert_eq!((log.log_start_offset(), log.num_segments()), (4, 1));
}

#[test]
fn retention_by_time_bounded_by_upper_bound() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 10).len() as i64;
    let cfg = LogConfig { segment_bytes: size * 2, retention_ms: 1000, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for i in 0..5 {
        log.append_as_leader(&batch_with(1, T0 + i * 100, 10), 0, T0).unwrap();
    }
    // Segments [0,1] [2,3] [4], all expired at T0+5000, HW 3: only [0,1]
    // (next base 2 <= 3) goes, and the active segment is not rolled.
    assert_eq!(log.delete_old_segments_below(T0 + 5000, Some(3)).unwrap(), 1);
    assert_eq!((log.log_start_offset(), log.num_segments(), log.log_end_offset()), (2, 2, 5));
    // HW 4 < LEO 5: [2,3] may go (next base 4 <= 4), the active is not rolled.
    assert_eq!(log.delete_old_segments_below(T0 + 5000, Some(4)).unwrap(), 1);
    assert_eq!((log.log_start_offset(), log.num_segments()), (4, 1));
    // HW == LEO: the active segment is rolled and deleted.
    assert_eq!(log.delete_old_segments_below(T0 + 5000, Some(5)).unwrap(), 1);
    assert_eq!((log.log_start_offset(), log.num_segments(), log.log_end_offset()), (5, 1, 5));
}

#[test]
fn retention_of_log_start_breach_bounded_by_upper_bound() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(1, T0, 10).len() as i64;
    let cfg = LogConfig { segment_bytes: size, retention_ms: -1, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    for _ in 0..4 {
        log.append_as_leader(&batch_with(1, T0, 10), 0, T0).unwrap();
    }
    assert!(log.maybe_increment_log_start_offset(3).unwrap());
    assert_eq!(log.delete_old_segments_below(T0, Some(1)).unwrap(), 1);
    assert_eq!(log.delete_old_segments_below(T0, None).unwrap(), 2);
    assert_eq!(log.segments_info()[0].base_offset, 3);
}

#[test]
fn log_start_offset_moves_and_persists() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_bytes: 200, ..Default::default() });
    for _ in 0..6 {
        log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    }
    assert!(log.maybe_increment_log_start_offset(3).unwrap());
    assert!(!log.maybe_increment_log_start_offset(2).unwrap());
    assert!(matches!(log.maybe_increment_log_start_offset(99), Err(Error::OutOfRange(_))));
    assert!(log.delete_old_segments(T0).unwrap() >= 1);
    log.close().unwrap();
    drop(log);
    let log = open(dir.path(), LogConfig::default());
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (3, 6));
}

#[test]
fn truncate_to_removes_whole_batches_and_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_bytes: 300, index_interval_bytes: 0, ..Default::default() });
    for e in 0..6 {
        log.append_as_leader(&batch_with(3, T0 + e as i64, 50), e, T0).unwrap();
    }
    assert!(log.num_segments() > 2);
    assert!(!log.truncate_to(18, T0).unwrap());
    // 10 sits inside batch [9, 11]: that batch goes too.
    assert!(log.truncate_to(10, T0).unwrap());
    assert_eq!(log.log_end_offset(), 9);
    assert_eq!(log.epochs().entries(), &[(0, 0), (1, 3), (2, 6)]);
    assert_eq!(read_all(&log, 0).last(), Some(&(6, 8)));
    let info = log.append_as_leader(&batch_with(1, T0, 1), 7, T0).unwrap();
    assert_eq!(info.first_offset, 9);
    assert_eq!(log.segments_info().last().unwrap().largest_timestamp, T0);
    log.truncate_fully_and_start_at(100, T0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset(), log.num_segments()), (100, 100, 1));
    assert!(log.epochs().entries().is_empty());
}

#[test]
fn slices_survive_segment_deletion() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_bytes: 100, retention_bytes: 0, ..Default::default() });
    log.append_as_leader(&batch_with(1, T0, 60), 0, T0).unwrap();
    log.append_as_leader(&batch_with(1, T0, 60), 0, T0).unwrap();
    let s = log.read_slice(0, 1000, None, true).unwrap();
    assert_eq!(log.delete_old_segments(T0).unwrap(), 1);
    assert!(!dir.path().join(format!("{:020}.log", 0)).exists());
    assert_eq!(batch::parse_batches(&slice_bytes(&s), true).unwrap().len(), 1);
}

#[test]
fn offset_for_timestamp_finds_exact_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { index_interval_bytes: 0, segment_bytes: 400, ..Default::default() });
    for i in 0..10 {
        log.append_as_leader(&batch_with(5, T0 + i * 10, 20), 0, T0).unwrap();
    }
    assert!(log.num_segments() > 1);
    assert_eq!(log.offset_for_timestamp(T0).unwrap(), Some((0, T0)));
    assert_eq!(log.offset_for_timestamp(T0 + 33).unwrap(), Some((18, T0 + 33)));
    assert_eq!(log.offset_for_timestamp(T0 + 36).unwrap(), Some((20, T0 + 40)));
    assert_eq!(log.offset_for_timestamp(T0 + 94).unwrap(), Some((49, T0 + 94)));
    assert_eq!(log.offset_for_timestamp(T0 + 95).unwrap(), None);
    // A compressed batch answers with its base offset and max timestamp.
    let mut z = batch_with(3, T0 + 200, 5);
    z[22] |= 1;
    let crc = batch::crc32c(&z[21..]);
    z[17..21].copy_from_slice(&crc.to_be_bytes());
    log.append_as_leader(&z, 0, T0).unwrap();
    assert_eq!(log.offset_for_timestamp(T0 + 201).unwrap(), Some((50, T0 + 202)));
}

const FILL_CFG: LogConfig = LogConfig {
    segment_bytes: 1000,
    segment_ms: 604_800_000,
    segment_index_bytes: 10 * 1024 * 1024,
    index_interval_bytes: 0,
    retention_bytes: -1,
    retention_ms: 604_800_000,
    flush_messages: i64::MAX,
    flush_ms: i64::MAX,
    max_message_bytes: 1_048_588,
    compact: false,
};

fn fill(dir: &Path, n: usize) -> (Vec<i64>, u64) {
    let mut log = open(dir, FILL_CFG);
    for i in 0..n {
        log.append_as_leader(&batch_with(2, T0 + i as i64, 40), 1, T0).unwrap();
    }
    let ends = read_all(&log, 0).iter().map(|b| b.1).collect();
    (ends, log.size_bytes())
}

fn active_log_path(dir: &Path) -> std::path::PathBuf {
    let mut logs: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|e| e == "log")).collect();
    logs.sort();
    logs.pop().unwrap()
}

#[test]
fn recovery_cuts_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (ends, _) = fill(dir.path(), 20);
    let path = active_log_path(dir.path());
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len - 7).unwrap();
    let log = open(dir.path(), LogConfig::default());
    let batch_size = batch_with(2, T0, 40).len() as u64;
    assert_eq!(log.recovered_bytes_truncated(), batch_size - 7);
    assert_eq!(log.log_end_offset(), ends[ends.len() - 2] + 1);
    assert_eq!(read_all(&log, 0).len(), 19);
}

#[test]
fn recovery_cuts_at_corrupt_bytes_and_clean_open_skips_scan() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 20);
    let path = active_log_path(dir.path());
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    let batch_size = batch_with(2, T0, 40).len() as u64;
    let len = f.metadata().unwrap().len();
    // Flip a byte in the records of the second-to-last batch.
    f.write_all_at(&[0xAA], len - batch_size - 5).unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    assert_eq!(log.recovered_bytes_truncated(), 2 * batch_size);
    let leo = log.log_end_offset();
    let epochs_before = log.epochs().entries().to_vec();
    log.close().unwrap();
    assert!(dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    let log = open(dir.path(), LogConfig::default());
    assert!(!dir.path().join(CLEAN_SHUTDOWN_FILE).exists());
    assert_eq!((log.log_end_offset(), log.recovered_bytes_truncated()), (leo, 0));
    assert_eq!(log.epochs().entries(), &epochs_before[..]);
}

#[test]
fn recovery_rebuilds_missing_and_garbled_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let (ends, size) = fill(dir.path(), 40);
    let mut log = open(dir.path(), FILL_CFG);
    let before = log.segments_info();
    log.close().unwrap();
    drop(log);
    assert!(before.len() > 2);
    fs::remove_file(dir.path().join(format!("{:020}.index", 0))).unwrap();
    let second = before[1].base_offset;
    fs::write(dir.path().join(format!("{second:020}.index")), [7u8; 13]).unwrap();
    fs::write(dir.path().join(format!("{second:020}.timeindex")), [0xffu8; 24]).unwrap();
    let log = open(dir.path(), FILL_CFG);
    assert_eq!(log.segments_info(), before.iter().cloned().map(|mut s| {
        s.created_ms = log.segments_info().iter().find(|x| x.base_offset == s.base_offset).unwrap().created_ms;
        s
    }).collect::<Vec<_>>());
    assert_eq!(log.size_bytes(), size);
    assert_eq!(read_all(&log, 0).iter().map(|b| b.1).collect::<Vec<_>>(), ends);
}

#[test]
fn index_pointing_past_file_end_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 5);
    let mut raw = Vec::new();
    raw.extend_from_slice(&0u32.to_be_bytes());
    raw.extend_from_slice(&1_000_000u32.to_be_bytes());
    fs::write(dir.path().join(format!("{:020}.index", 0)), raw).unwrap();
    fs::write(dir.path().join(CLEAN_SHUTDOWN_FILE), "").unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.log_end_offset(), 10);
    assert_eq!(read_all(&log, 0).len(), 5);
}

#[test]
fn flush_policy_by_messages_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { flush_messages: 4, flush_ms: 1000, ..Default::default() });
    log.append_as_leader(&batch_with(3, T0, 1), 0, T0).unwrap();
    assert_eq!(log.recovery_point(), 0);
    log.append_as_leader(&batch_with(1, T0, 1), 0, T0).unwrap();
    assert_eq!(log.recovery_point(), 4);
    log.append_as_leader(&batch_with(1, T0, 1), 0, T0).unwrap();
    assert!(!log.maybe_flush(T0 + 10).unwrap());
    assert!(log.maybe_flush(T0 + 2000).unwrap());
    assert_eq!(log.recovery_point(), 5);
}

#[test]
fn epoch_cache_trimmed_to_recovered_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(2, T0, 1), 1, T0).unwrap();
    log.append_as_leader(&batch_with(2, T0, 1), 2, T0).unwrap();
    drop(log);
    let path = active_log_path(dir.path());
    let len = fs::metadata(&path).unwrap().len();
    OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1).unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.log_end_offset(), 2);
    assert_eq!(log.epochs().end_offset_for(1, 2), (1, 2));
}

#[derive(Debug, Clone)]
enum Op {
    Append(i32),
    Truncate(u8),
    Reopen(bool),
    Roll,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1..5i32).prop_map(Op::Append),
        1 => any::<u8>().prop_map(Op::Truncate),
        1 => any::<bool>().prop_map(Op::Reopen),
        1 => Just(Op::Roll),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn prop_append_truncate_reopen(ops in proptest::collection::vec(op(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig { segment_bytes: 400, index_interval_bytes: 64, ..Default::default() };
        let mut log = open(dir.path(), cfg);
        let mut model: Vec<(i64, i64)> = Vec::new();
        for op in ops {
            match op {
                Op::Append(n) => {
                    let info = log.append_as_leader(&batch_with(n, T0, 20), 0, T0).unwrap();
                    model.push((info.first_offset, info.last_offset));
                }
                Op::Truncate(x) => {
                    let leo = log.log_end_offset();
                    let target = if leo == 0 { 0 } else { x as i64 % (leo + 1) };
                    log.truncate_to(target, T0).unwrap();
                    model.retain(|b| b.1 < target);
                }
                Op::Reopen(clean) => {
                    if clean { log.close().unwrap(); }
                    drop(log);
                    log = open(dir.path(), cfg);
                    prop_assert_eq!(log.recovered_bytes_truncated(), 0);
                }
                Op::Roll => { log.roll(T0).unwrap(); }
            }
            prop_assert_eq!(log.log_end_offset(), model.last().map_or(0, |b| b.1 + 1));
            prop_assert_eq!(read_all(&log, 0), model.clone());
        }
    }
}

#[test]
fn leader_append_of_many_small_batches_spans_iov_max() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    let one = batch_with(1, T0, 3);
    let data: Vec<u8> = (0..1500).flat_map(|_| one.clone()).collect();
    let info = log.append_as_leader(&data, 3, T0).unwrap();
    assert_eq!((info.num_batches, log.log_end_offset(), log.size_bytes()), (1500, 1500, data.len() as u64));
    let back: Vec<(i64, i64)> = read_all(&log, 0);
    assert_eq!(back, (0..1500).map(|i| (i, i)).collect::<Vec<_>>());
    let s = log.read_slice(1499, 100, None, true).unwrap();
    let h = batch::parse_batches(&slice_bytes(&s), true).unwrap()[0].1;
    assert_eq!((h.base_offset, h.partition_leader_epoch), (1499, 3));
}

// ---------------------------------------------------------------- fixes

/// Four 2-record batches at epoch 0: offsets (0,1) (2,3) (4,5) (6,7).
fn four_pairs(dir: &Path) -> Log {
    let mut log = open(dir, LogConfig::default());
    for _ in 0..4 {
        log.append_as_leader(&batch_with(2, T0, 10), 0, T0).unwrap();
    }
    log
}

fn slice_offsets(log: &Log, from: i64, max_offset: i64, min_one: bool) -> Vec<(i64, i64)> {
    let s = log.read_slice(from, 1 << 20, Some(max_offset), min_one).unwrap();
    batch::parse_batches(&slice_bytes(&s), true).unwrap().iter().map(|(_, h)| (h.base_offset, h.last_offset())).collect()
}

#[test]
fn max_offset_excludes_every_batch_reaching_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = four_pairs(dir.path());
    assert_eq!(slice_offsets(&log, 0, 5, true), vec![(0, 1), (2, 3)]);
    assert_eq!(slice_offsets(&log, 0, 6, true), vec![(0, 1), (2, 3), (4, 5)]);
    // Even min_one_batch does not hand out a batch that ends at or past max_offset.
    assert!(slice_offsets(&log, 4, 5, true).is_empty());
    assert_eq!(log.read_slice(4, 1 << 20, Some(5), true).unwrap().start_offset, -1);
}

#[test]
fn truncate_inside_the_batch_at_log_start_brings_the_start_down() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(1, T0, 5), 0, T0).unwrap();
    log.append_as_leader(&batch_with(2, T0, 5), 0, T0).unwrap();
    assert!(log.maybe_increment_log_start_offset(2).unwrap());
    assert!(log.truncate_to(2, T0).unwrap());
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1, 1));
    assert_eq!(log.read_slice(1, 100, None, true).unwrap().length, 0);
    let text = fs::read_to_string(dir.path().join(crate::log::LOG_START_OFFSET_FILE)).unwrap();
    assert_eq!(text.trim(), "1");
    drop(log);
    assert_eq!(open(dir.path(), LogConfig::default()).log_start_offset(), 1);
}

#[test]
fn offset_for_timestamp_skips_segments_below_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(1, 100, 5), 0, T0).unwrap();
    log.roll(T0).unwrap();
    assert!(log.maybe_increment_log_start_offset(1).unwrap());
    log.append_as_leader(&batch_with(1, 200, 5), 0, T0).unwrap();
    assert_eq!(log.offset_for_timestamp(50).unwrap(), Some((1, 200)));
    assert_eq!(log.offset_for_timestamp(150).unwrap(), Some((1, 200)));
    assert_eq!(log.offset_for_timestamp(201).unwrap(), None);
}

#[test]
fn crash_recovery_restores_epochs_the_checkpoint_missed() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(3, T0, 10), 1, T0).unwrap();
    log.flush_at(T0).unwrap();
    let before = fs::read(&checkpoint).unwrap();
    log.append_as_leader(&batch_with(2, T0, 10), 2, T0).unwrap();
    log.flush_at(T0).unwrap();
    drop(log); // a crash: no clean-shutdown marker
    fs::write(&checkpoint, &before).unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    assert_eq!(log.epochs().entries(), &[(1, 0), (2, 3)]);
    assert_eq!(log.epochs().end_offset_for(1, log.log_end_offset()), (1, 3));
    // Epoch 2 starts in the active segment: written with the next flush.
    assert_eq!(fs::read(&checkpoint).unwrap(), before);
    log.flush_at(T0).unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 3\n");
}

#[test]
fn an_appended_epoch_is_written_at_flush_not_at_append() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(3, T0, 10), 1, T0).unwrap();
    log.append_as_follower(&follower_batch(3, 2, 2), T0).unwrap();
    assert_eq!(log.epochs().entries(), &[(1, 0), (2, 3)]);
    assert!(!checkpoint.exists(), "the first append of an epoch must not write the checkpoint");
    log.flush_at(T0).unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 3\n");
    log.append_as_leader(&batch_with(1, T0, 10), 3, T0).unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 3\n");
    log.close().unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n3\n1 0\n2 3\n3 5\n");
    assert_eq!(open(dir.path(), LogConfig::default()).epochs().entries(), &[(1, 0), (2, 3), (3, 5)]);
}

#[test]
fn a_crash_before_the_flush_recovers_the_epochs_from_the_batches() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(3, T0, 10), 1, T0).unwrap();
    log.flush_at(T0).unwrap();
    log.append_as_leader(&batch_with(2, T0, 10), 1, T0).unwrap();
    log.append_as_follower(&follower_batch(5, 4, 1), T0).unwrap();
    log.append_as_leader(&batch_with(2, T0, 10), 6, T0).unwrap();
    assert_eq!(log.epochs().entries(), &[(1, 0), (4, 5), (6, 6)]);
    drop(log); // a crash: no flush, no close, no clean-shutdown marker
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n1\n1 0\n");
    let mut log = open(dir.path(), LogConfig::default());
    assert_eq!(log.log_end_offset(), 8);
    assert_eq!(log.epochs().entries(), &[(1, 0), (4, 5), (6, 6)]);
    assert_eq!(log.epochs().end_offset_for(1, 8), (1, 5));
    assert_eq!(log.epochs().end_offset_for(5, 8), (4, 6));
    // And a crash before anything was ever written: the whole cache from the batches.
    let fresh = tempfile::tempdir().unwrap();
    let mut other = open(fresh.path(), LogConfig::default());
    other.append_as_follower(&read_bytes(&log, 0), T0).unwrap();
    drop(other);
    assert!(!fresh.path().join(crate::epoch::CHECKPOINT_FILE).exists());
    assert_eq!(open(fresh.path(), LogConfig::default()).epochs().entries(), &[(1, 0), (4, 5), (6, 6)]);
    log.close().unwrap();
}

#[test]
fn an_epoch_that_leaves_the_active_segment_is_written_with_the_roll() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let one = batch_with(2, T0, 40);
    let mut log = open(dir.path(), LogConfig { segment_bytes: one.len() as i64 * 2, ..Default::default() });
    log.append_as_leader(&one, 1, T0).unwrap();
    assert!(!checkpoint.exists());
    // One follower append of three batches rolls between them, and epoch 2's
    // first batch ends up in a sealed segment: written before the append returns.
    let three: Vec<u8> = (0..3).flat_map(|i| follower_batch(2 + 2 * i, 2, 2)).collect();
    log.append_as_follower(&three, T0).unwrap();
    assert!(log.num_segments() >= 2);
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 2\n");
    // An explicit roll does the same.
    log.append_as_leader(&batch_with(1, T0, 10), 3, T0).unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 2\n");
    log.roll(T0).unwrap();
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n3\n1 0\n2 2\n3 8\n");
}

#[test]
fn open_trims_epochs_below_the_log_start() {
    // A crash after retention moved the log start but before the cache's trim
    // was written leaves an entry below the start; open trims it, as Kafka's
    // LogLoader does.
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(5, T0, 10), 3, T0).unwrap();
    log.maybe_increment_log_start_offset(2).unwrap();
    log.close().unwrap();
    fs::write(&checkpoint, "0\n1\n3 0\n").unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.log_start_offset(), 2);
    assert_eq!(log.epochs().entries(), &[(3, 2)]);
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n1\n3 2\n");
}

#[test]
fn truncation_writes_the_cut_cache_before_the_data_changes() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(5, T0, 10), 1, T0).unwrap();
    log.append_as_leader(&batch_with(5, T0, 10), 2, T0).unwrap();
    log.flush_at(T0).unwrap();
    log.append_as_leader(&batch_with(5, T0, 10), 3, T0).unwrap();
    // Cutting only what is not on disk yet writes nothing.
    assert!(log.truncate_to(10, T0).unwrap());
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 5\n");
    // Cutting a written entry writes at once: a follower that goes on with a
    // lower epoch's batches at 5 must not find (2, 5) again after a crash,
    // which no scan of the batches would remove.
    assert!(log.truncate_to(5, T0).unwrap());
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n1\n1 0\n");
    log.append_as_follower(&follower_batch(5, 1, 1), T0).unwrap();
    log.append_as_follower(&follower_batch(6, 4, 1), T0).unwrap();
    drop(log);
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.epochs().entries(), &[(1, 0), (4, 6)]);
}

#[test]
fn crash_recovery_restores_an_epoch_that_started_in_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let one = batch_with(2, T0, 40);
    let mut log = open(dir.path(), LogConfig { segment_bytes: one.len() as i64 * 2, ..Default::default() });
    log.append_as_leader(&one, 1, T0).unwrap();
    log.flush_at(T0).unwrap();
    let before = fs::read(&checkpoint).unwrap();
    // One append of three batches at epoch 2 rolls after its first batch.
    log.append_as_leader(&[one.clone(), one.clone(), one.clone()].concat(), 2, T0).unwrap();
    assert!(log.num_segments() >= 2);
    drop(log);
    fs::write(&checkpoint, &before).unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.epochs().entries(), &[(1, 0), (2, 2)]);
}

#[test]
fn torn_tail_under_a_clean_marker_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (ends, _) = fill(dir.path(), 20);
    let mut log = open(dir.path(), FILL_CFG);
    log.close().unwrap();
    drop(log);
    let path = active_log_path(dir.path());
    let len = fs::metadata(&path).unwrap().len();
    OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 10).unwrap();
    let mut log = open(dir.path(), FILL_CFG);
    let batch_size = batch_with(2, T0, 40).len() as u64;
    assert_eq!(log.recovered_bytes_truncated(), batch_size - 10);
    assert_eq!(log.log_end_offset(), ends[ends.len() - 2] + 1);
    let info = log.append_as_leader(&batch_with(1, T0, 5), 9, T0).unwrap();
    assert_eq!(info.first_offset, ends[ends.len() - 2] + 1);
    assert_eq!(read_all(&log, 0).len(), 20); // read_all checks every CRC
}

/// Shifts the position of the middle offset-index entry by one byte.
fn shift_middle_entry(raw: &mut [u8]) {
    let at = 8 * (raw.len() / 16) + 4;
    let pos = u32::from_be_bytes(raw[at..at + 4].try_into().unwrap()) + 1;
    raw[at..at + 4].copy_from_slice(&pos.to_be_bytes());
}

#[test]
fn shifted_index_entry_is_rebuilt_on_open() {
    for clean in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (ends, _) = fill(dir.path(), 40);
        let mut log = open(dir.path(), FILL_CFG);
        let second = log.segments_info()[1].clone();
        if clean {
            log.close().unwrap();
        }
        drop(log);
        let path = dir.path().join(format!("{:020}.index", second.base_offset));
        let mut raw = fs::read(&path).unwrap();
        assert!(raw.len() >= 24);
        shift_middle_entry(&mut raw);
        fs::write(&path, &raw).unwrap();
        let log = open(dir.path(), FILL_CFG);
        assert_eq!(log.segments_info()[1].offset_index_entries, second.offset_index_entries);
        for (i, &last) in ends.iter().enumerate() {
            let s = log.read_slice(last, 1, None, true).unwrap();
            assert_eq!(s.start_offset, last - 1, "batch {i}");
        }
    }
}

#[test]
fn reads_never_skip_offsets_past_a_bad_index_entry_or_header() {
    let dir = tempfile::tempdir().unwrap();
    let (ends, _) = fill(dir.path(), 40);
    let mut log = open(dir.path(), FILL_CFG);
    let base = log.segments_info()[1].base_offset;
    let seg = log.segments.get_mut(&base).unwrap();
    let mut entries = seg.offset_index.entries().to_vec();
    let mid = entries.len() / 2;
    entries[mid].position += 1;
    seg.offset_index.reset(entries.clone()).unwrap();
    let damaged = base + entries[mid].relative_offset as i64;
    // The guided scan meets garbage and starts over from position 0.
    for &last in ends.iter() {
        assert_eq!(log.read_slice(last, 1, None, true).unwrap().start_offset, last - 1);
    }
    // Damage in the .log itself: CorruptRecordError, never the next segment's data.
    let seg = &log.segments[&base];
    seg.file.write_all_at(&[0x7f], entries[mid].position as u64 - 1 + 16).unwrap();
    assert!(matches!(log.read_slice(damaged, 1, None, true), Err(Error::Corrupt(_))));
}

#[test]
fn epoch_recovery_ignores_data_below_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(1, T0, 5), 0, T0).unwrap();
    log.append_as_leader(&batch_with(1, T0, 5), 0, T0).unwrap();
    log.maybe_increment_log_start_offset(1).unwrap();
    log.truncate_to(1, T0).unwrap();
    assert!(log.epochs().entries().is_empty());
    drop(log);
    assert!(open(dir.path(), LogConfig::default()).epochs().entries().is_empty());
    // An epoch that covers the log start is re-assigned from the log start.
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&batch_with(4, T0, 5), 3, T0).unwrap();
    log.maybe_increment_log_start_offset(2).unwrap();
    drop(log);
    fs::remove_file(dir.path().join(crate::epoch::CHECKPOINT_FILE)).unwrap();
    assert_eq!(open(dir.path(), LogConfig::default()).epochs().entries(), &[(3, 2)]);
}

#[test]
fn flush_syncs_the_directory_only_after_a_segment_was_created() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { flush_messages: 1, ..Default::default() });
    assert!(log.dir_dirty);
    log.append_as_leader(&batch_with(2, T0, 5), 0, T0).unwrap();
    assert!(!log.dir_dirty);
    log.roll(T0).unwrap();
    assert!(log.dir_dirty);
    log.append_as_leader(&batch_with(2, T0, 5), 0, T0).unwrap();
    assert_eq!((log.dir_dirty, log.recovery_point()), (false, 4));
}

#[test]
fn crash_with_unsynced_active_indexes_rebuilds_them() {
    // flush() leaves the active segment's indexes to the page cache: after a
    // crash they may hold anything, and recovery rebuilds them from the .log.
    let dir = tempfile::tempdir().unwrap();
    let (ends, _) = fill(dir.path(), 20);
    let active = active_log_path(dir.path());
    for ext in ["index", "timeindex"] {
        let p = active.with_extension(ext);
        let len = fs::metadata(&p).unwrap().len() as usize;
        fs::write(&p, vec![0u8; len.max(24)]).unwrap();
    }
    let log = open(dir.path(), FILL_CFG);
    assert_eq!(read_all(&log, 0).iter().map(|b| b.1).collect::<Vec<_>>(), ends);
    assert!(log.segments_info().last().unwrap().offset_index_entries > 0);
    assert_eq!(log.offset_for_timestamp(T0 + 19).unwrap(), Some((37, T0 + 19)));
}

/// Readers of the mirrored counters never take the Log's Mutex: while another
/// thread holds it (as flush does across fdatasync and retention across
/// unlink), log_end_offset / log_start_offset / size_bytes still answer.
#[test]
fn counters_are_readable_while_the_lock_is_held() {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let cell = Arc::new(crate::LogCell::new(open(dir.path(), LogConfig::default())));
    cell.with(|l| l.append_as_leader(&batch_with(3, T0, 10), 0, T0)).unwrap();
    assert_eq!(cell.log_end_offset().unwrap(), 3);

    // A "flush" that holds the lock until told to finish.
    let (locked_tx, locked_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = {
        let cell = Arc::clone(&cell);
        std::thread::spawn(move || {
            cell.with(|l| {
                locked_tx.send(()).unwrap();
                release_rx.recv().unwrap();
                l.flush_at(T0)
            })
            .unwrap()
        })
    };
    locked_rx.recv().unwrap();
    // Read 1000 times from another thread; a lock-taking read would hang.
    let (done_tx, done_rx) = mpsc::channel();
    {
        let cell = Arc::clone(&cell);
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut worst = Duration::ZERO;
            for _ in 0..1000 {
                let t = Instant::now();
                assert_eq!(cell.log_end_offset().unwrap(), 3);
                assert_eq!(cell.log_start_offset().unwrap(), 0);
                assert!(cell.size_bytes().unwrap() > 0);
                worst = worst.max(t.elapsed());
            }
            done_tx.send((start.elapsed(), worst)).unwrap();
        });
    }
    let (total, worst) = done_rx.recv_timeout(Duration::from_secs(10)).expect("reads blocked behind the lock");
    assert!(cell.inner.try_lock().is_err(), "the holder still has the lock");
    assert!(worst < Duration::from_millis(100), "worst read {worst:?}, total {total:?}");
    release_tx.send(()).unwrap();
    holder.join().unwrap();

    // Published after each operation, and Closed after take().
    cell.with(|l| l.append_as_leader(&batch_with(2, T0, 10), 0, T0)).unwrap();
    assert_eq!(cell.log_end_offset().unwrap(), 5);
    let mut log = cell.take().unwrap();
    log.close().unwrap();
    assert!(matches!(cell.log_end_offset(), Err(Error::Closed)));
    assert!(matches!(cell.size_bytes(), Err(Error::Closed)));
}

// ---------------------------------------------------------------- streamed leader append

/// A big leader append (the streamed path) writes exactly what the
/// validate-then-write path writes, batch heads rewritten.
#[test]
fn streamed_leader_append_matches_the_general_path() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cfg = LogConfig { index_interval_bytes: 4096, max_message_bytes: 1 << 21, ..Default::default() };
    let (mut big, mut small) = (open(a.path(), cfg), open(b.path(), cfg));
    // One 1.2 MiB batch (split in pieces) plus many small ones.
    let mut data = batch_with(1200, T0, 1000);
    for i in 0..300 {
        data.extend(batch_with(3, T0 + i, 500));
    }
    assert!(data.len() > 1 << 20);
    let info = big.append_as_leader(&data, 4, T0).unwrap();
    for (pos, h) in batch::parse_batches(&data, true).unwrap() {
        small.append_as_leader(&data[pos..pos + h.size_bytes()], 4, T0).unwrap();
    }
    assert_eq!((info.num_batches, info.first_offset, info.log_end_offset), (301, 0, 2100));
    assert_eq!(big.log_end_offset(), small.log_end_offset());
    let read = |l: &Log| slice_bytes(&l.read_slice(0, 1 << 30, None, true).unwrap());
    assert_eq!(read(&big), read(&small));
    assert_eq!(read_all(&big, 0), read_all(&small, 0));
    assert_eq!(big.epochs().entries(), &[(4, 0)]);
    // Indexes work: a read from the middle.
    let s = big.read_slice(1500, 100, None, true).unwrap();
    assert_eq!(s.start_offset, 1500);
}

/// Damage anywhere in a big append (CRC in the last batch, a record walk
/// failure mid-batch, an oversize batch) leaves the log byte-identical.
#[test]
fn streamed_leader_append_rolls_back_on_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { max_message_bytes: 1 << 21, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    log.append_as_leader(&batch_with(2, T0, 10), 0, T0).unwrap();
    let before = (log.log_end_offset(), log.size_bytes(), fs::read(active_log_path(dir.path())).unwrap());
    let big = batch_with(1200, T0, 1000);
    // CRC damage at the very end.
    let mut bad_crc = [big.clone(), batch_with(3, T0, 10)].concat();
    let n = bad_crc.len();
    bad_crc[n - 2] ^= 1;
    assert!(matches!(log.append_as_leader(&bad_crc, 0, T0), Err(Error::Corrupt(_))));
    // A records section that contradicts its header (CRC valid): 1200 records said, 1199 there.
    let mut section = Vec::new();
    for i in 0..1199 {
        encode_record(&mut section, &Record { offset_delta: i, timestamp_delta: 0, key: None, value: Some(vec![1; 1000]), headers: vec![] });
    }
    let mut spec = batch::tests::spec(0, 1200, T0);
    spec.partition_leader_epoch = -1;
    let short = batch::build_batch(&section, &spec).unwrap();
    assert!(matches!(log.append_as_leader(&[big.clone(), short].concat(), 0, T0), Err(Error::Invalid(_))));
    // Oversize.
    let mut small_cfg = cfg;
    small_cfg.max_message_bytes = 1 << 20;
    log.update_config(small_cfg);
    assert!(matches!(log.append_as_leader(&big, 0, T0), Err(Error::TooLarge(_))));
    log.update_config(cfg);
    let after = (log.log_end_offset(), log.size_bytes(), fs::read(active_log_path(dir.path())).unwrap());
    assert!(before == after, "log changed by rejected appends");
    assert_eq!(log.epochs().entries(), &[(0, 0)]);
    // And the log still takes the same big append afterwards.
    log.append_as_leader(&big, 1, T0).unwrap();
    assert_eq!(log.log_end_offset(), 1202);
    assert_eq!(read_all(&log, 0), vec![(0, 1), (2, 1201)]);
}

/// The two-core append (write on the caller, checks on a pool thread) and
/// the one-thread fallback write the same bytes and refuse the same input
/// with the same error.
#[test]
fn overlapped_and_serial_streamed_writes_agree() {
    use crate::log::{check_pool, overlapped_write_validate, stream_write_validate, BatchHead};
    let pool = check_pool().expect("check threads start");
    let good = [batch_with(1200, T0, 1000), batch_with(3, T0, 10), batch_with(700, T0, 900)].concat();
    let mut bad_crc = good.clone();
    bad_crc[600_000] ^= 1;
    let mut section = Vec::new();
    for i in 0..1199 {
        encode_record(&mut section, &Record { offset_delta: i, timestamp_delta: 0, key: None, value: Some(vec![1; 1000]), headers: vec![] });
    }
    let mut spec = batch::tests::spec(0, 1200, T0);
    spec.partition_leader_epoch = -1;
    let short = [batch_with(3, T0, 10), batch::build_batch(&section, &spec).unwrap()].concat();
    for (data, max, ok) in [(&good, 1 << 21, true), (&bad_crc, 1 << 21, false), (&short, 1 << 21, false), (&good, 1 << 20, false)] {
        let batches = batch::parse_batches(data, false).unwrap();
        let heads: Vec<BatchHead> = batches
            .iter()
            .map(|(p, _)| {
                let mut h: BatchHead = data[*p..*p + 16].try_into().unwrap();
                batch::rewrite_offset_and_epoch(&mut h, 0, 7, 3);
                h
            })
            .collect();
        let run = |overlapped: bool| {
            let file = tempfile::tempfile().unwrap();
            file.write_all_at(b"earlier", 0).unwrap();
            let r = if overlapped {
                overlapped_write_validate(pool, &file, 7, data, &batches, &heads, max, false)
            } else {
                stream_write_validate(&file, 7, data, &batches, &heads, max, false)
            };
            // A refused append may stop writing early: read what is there (the caller cuts it).
            let mut bytes = vec![0u8; file.metadata().unwrap().len() as usize];
            file.read_exact_at(&mut bytes, 0).unwrap();
            (r.map_err(|e| format!("{e:?}")), bytes)
        };
        let (two, one) = (run(true), run(false));
        assert_eq!(two.0, one.0);
        assert_eq!(two.0.is_ok(), ok, "{:?}", two.0);
        if ok {
            assert!(two.1 == one.1, "written bytes differ");
            assert_eq!(two.1.len(), 7 + data.len());
            assert_eq!(&two.1[..7], b"earlier");
            assert_eq!(&two.1[7 + 16..7 + batches[1].0], &data[16..batches[1].0]);
        }
    }
}

/// A crash between the write of a big leader append and the end of its
/// checks leaves what `write_checked` wrote before its verdict: recovery cuts
/// all of it (the provisional first head), where the real heads would let
/// the CRC-valid batches come back with offsets; a passed check leaves the
/// real head.
#[test]
fn crash_before_the_verdict_of_a_big_append_leaves_nothing_after_recovery() {
    use crate::log::{write_checked, BatchHead};
    let good = [batch_with(700, T0, 1000), batch_with(3, T0, 10)].concat();
    let mut oversize_cfg = FILL_CFG;
    oversize_cfg.max_message_bytes = 1 << 21;
    // Refused for max.message.bytes (every CRC valid), and accepted.
    for (max, ok) in [(1usize << 16, false), (1 << 21, true)] {
        let dir = tempfile::tempdir().unwrap();
        let (ends, size) = fill(dir.path(), 3);
        let batches = batch::parse_batches(&good, false).unwrap();
        let mut next = ends[2] + 1;
        let heads: Vec<BatchHead> = batches
            .iter()
            .map(|(p, h)| {
                let mut head: BatchHead = good[*p..*p + 16].try_into().unwrap();
                batch::rewrite_offset_and_epoch(&mut head, 0, next, 1);
                next += h.records_count as i64;
                head
            })
            .collect();
        let f = OpenOptions::new().read(true).write(true).open(active_log_path(dir.path())).unwrap();
        let verdict = write_checked(&f, size, &good, &batches, &heads, max, false);
        assert_eq!(verdict.is_ok(), ok, "{verdict:?}");
        let mut first = [0u8; 16];
        f.read_exact_at(&mut first, size).unwrap();
        assert_eq!(first == heads[0], ok, "the real first head is written only after the checks passed");
        // The process dies here (no cut, no commit); the next open recovers.
        let log = open(dir.path(), oversize_cfg);
        if ok {
            assert_eq!(log.log_end_offset(), next, "valid batches past the published end are kept, as an unflushed tail");
        } else {
            assert_eq!((log.log_end_offset(), log.size_bytes()), (ends[2] + 1, size));
            assert_eq!(log.recovered_bytes_truncated(), good.len() as u64);
        }
    }
}

/// A big append that needs a roll takes the general path and still rolls.
#[test]
fn streamed_leader_append_falls_back_when_a_roll_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig { segment_bytes: 700_000, max_message_bytes: 1 << 21, ..Default::default() };
    let mut log = open(dir.path(), cfg);
    let data: Vec<u8> = (0..4).flat_map(|i| batch_with(300, T0 + i, 1000)).collect();
    log.append_as_leader(&data, 0, T0).unwrap();
    assert!(log.num_segments() >= 2);
    assert_eq!(read_all(&log, 0).len(), 4);
}

// ---------------------------------------------------------------- log compaction

use crate::cleaner::{self, CleanConfig};

/// One batch of keyed records (None value = tombstone), compressed with `codec`.
fn kv_batch(recs: &[(&str, Option<&str>)], ts: i64, codec: i16, producer_id: i64) -> Vec<u8> {
    let mut section = Vec::new();
    for (i, (k, v)) in recs.iter().enumerate() {
        let r = Record {
            offset_delta: i as i32,
            timestamp_delta: i as i64,
            key: Some(k.as_bytes().to_vec()),
            value: v.map(|v| v.as_bytes().to_vec()),
            headers: vec![],
        };
        encode_record(&mut section, &r);
    }
    let n = recs.len() as i32;
    let spec = BatchSpec {
        base_offset: 0,
        partition_leader_epoch: -1,
        attributes: codec,
        last_offset_delta: n - 1,
        base_timestamp: ts,
        max_timestamp: ts + n as i64 - 1,
        producer_id,
        producer_epoch: if producer_id >= 0 { 0 } else { -1 },
        base_sequence: if producer_id >= 0 { 0 } else { -1 },
        records_count: n,
    };
    batch::build_batch(&crate::codec::compress(codec, &section).unwrap(), &spec).unwrap()
}

/// Every record of the log: (offset, key, value, timestamp).
fn records_of(log: &Log) -> Vec<(i64, String, Option<String>, i64)> {
    let mut out = Vec::new();
    for (h, raw) in batches_of(log) {
        let section = crate::codec::decompress(h.compression(), &raw[61..h.size_bytes()]).unwrap();
        for r in crate::records::decode_records(&section, h.records_count as usize).unwrap() {
            let key = String::from_utf8(r.key.unwrap()).unwrap();
            out.push((h.base_offset + r.offset_delta as i64, key, r.value.map(|v| String::from_utf8(v).unwrap()), h.base_timestamp + r.timestamp_delta));
        }
    }
    out
}

/// Every batch of the log (header, bytes), read from the log start.
fn batches_of(log: &Log) -> Vec<(batch::BatchHeader, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < log.log_end_offset() {
        let s = log.read_slice(at, 1 << 20, None, true).unwrap();
        if s.length == 0 {
            break;
        }
        let bytes = slice_bytes(&s);
        for (pos, h) in batch::parse_batches(&bytes, true).unwrap() {
            at = h.next_offset();
            out.push((h, bytes[pos..pos + h.size_bytes()].to_vec()));
        }
    }
    out
}

fn clean_cfg(now_ms: i64) -> CleanConfig {
    CleanConfig { now_ms, upper_bound_offset: i64::MAX, delete_retention_ms: 1000, min_compaction_lag_ms: 0, dedupe_buffer_size: 1 << 20 }
}

/// 30 updates of 3 keys in batches of 1, small segments: the log after
/// cleaning holds each key's latest value at its original offset.
fn compact_log(dir: &Path, codec: i16) -> Log {
    let mut log = open(dir, LogConfig { segment_bytes: 400, ..Default::default() });
    for i in 0..30 {
        let k = format!("k{}", i % 3);
        let v = format!("v{i}");
        log.append_as_leader(&kv_batch(&[(&k, Some(&v))], T0 + i, codec, -1), 1, T0).unwrap();
    }
    log
}

#[test]
fn cleaning_keeps_the_latest_value_per_key_at_its_offset() {
    for codec in [0i16, 1, 2, 3, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = compact_log(dir.path(), codec);
        let segs = log.num_segments();
        assert!(segs > 3);
        let before = log.cleanable(T0, i64::MAX, 0).unwrap();
        assert_eq!(before.first_dirty_offset, 0);
        assert!(before.dirty_ratio > 0.99);
        let active_base = log.active().base_offset;
        let stats = log.clean(clean_cfg(T0)).unwrap();
        assert_eq!(stats.end_offset, active_base, "codec {codec}");
        assert!(stats.records_retained <= 3 && stats.bytes_written < stats.bytes_read);
        assert!(log.num_segments() <= segs);
        let recs = records_of(&log);
        // Below the active segment only the latest per key; the active segment untouched.
        let cleaned: Vec<_> = recs.iter().filter(|r| r.0 < active_base).collect();
        for r in &cleaned {
            assert!(!recs.iter().any(|o| o.1 == r.1 && o.0 > r.0 && o.0 < active_base), "superseded {r:?} kept");
        }
        assert_eq!(recs.iter().filter(|r| r.0 >= active_base).count() as i64, 30 - active_base);
        let last: Vec<_> = recs.iter().rev().take(3).map(|r| r.2.clone().unwrap()).collect();
        assert_eq!(last, vec!["v29", "v28", "v27"]);
        assert_eq!(log.log_end_offset(), 30);
        assert_eq!(log.epochs().entries(), &[(1, 0)]);
        // A read at an offset cleaning removed answers the next batch.
        let gone = (0..active_base).find(|o| !recs.iter().any(|r| r.0 == *o)).unwrap();
        let s = log.read_slice(gone, 1 << 20, None, true).unwrap();
        assert!(s.start_offset > gone);
        // A second cleaning with nothing new dirty leaves the log alone.
        let again = log.cleanable(T0, i64::MAX, 0).unwrap();
        assert_eq!(again.first_dirty_offset, active_base);
        assert_eq!(again.dirty_bytes, 0);
        // Reopen (clean and crash) keeps the cleaned log and its indexes.
        log.close().unwrap();
        drop(log);
        let log = open(dir.path(), LogConfig { segment_bytes: 400, ..Default::default() });
        assert_eq!(records_of(&log), recs);
    }
}

#[test]
fn tombstones_stay_until_the_delete_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_bytes: 300, ..Default::default() });
    log.append_as_leader(&kv_batch(&[("a", Some("1")), ("b", Some("1"))], T0, 0, -1), 0, T0).unwrap();
    log.append_as_leader(&kv_batch(&[("a", None)], T0 + 5, 0, -1), 0, T0).unwrap();
    for i in 0..6 {
        log.append_as_leader(&kv_batch(&[("c", Some("x"))], T0 + 10 + i, 0, -1), 0, T0).unwrap();
    }
    log.roll(T0).unwrap();
    let now = T0 + 100;
    log.clean(clean_cfg(now)).unwrap();
    let recs = records_of(&log);
    assert!(recs.iter().any(|r| r.1 == "a" && r.2.is_none()), "tombstone kept before its horizon");
    assert!(!recs.iter().any(|r| r.1 == "a" && r.2.is_some()));
    // Timestamps survive the delete-horizon rewrite of the batch.
    assert!(recs.iter().any(|r| r.1 == "a" && r.3 == T0 + 5));
    let info = log.cleanable(now, i64::MAX, 0).unwrap();
    assert_eq!(info.next_delete_horizon_ms, now + 1000);
    // Before the horizon nothing changes; after it the tombstone goes.
    log.clean(clean_cfg(now + 500)).unwrap();
    assert!(records_of(&log).iter().any(|r| r.1 == "a"));
    log.clean(clean_cfg(now + 1000)).unwrap();
    let recs = records_of(&log);
    assert!(!recs.iter().any(|r| r.1 == "a"));
    assert!(recs.iter().any(|r| r.1 == "b"));
    assert_eq!(log.cleanable(now + 1000, i64::MAX, 0).unwrap().next_delete_horizon_ms, -1);
}

#[test]
fn cleaning_respects_upper_bound_and_min_lag() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = compact_log(dir.path(), 0);
    let mut cfg = clean_cfg(T0);
    cfg.upper_bound_offset = 0;
    assert_eq!(log.clean(cfg).unwrap().end_offset, -1);
    cfg.upper_bound_offset = i64::MAX;
    cfg.min_compaction_lag_ms = 1_000_000;
    assert_eq!(log.clean(cfg).unwrap().end_offset, -1);
    assert_eq!(records_of(&log).len(), 30);
}

#[test]
fn the_last_batch_of_a_producer_stays_as_an_empty_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { segment_bytes: 200, ..Default::default() });
    log.append_as_leader(&kv_batch(&[("a", Some("1"))], T0, 0, 7), 0, T0).unwrap();
    log.append_as_leader(&kv_batch(&[("a", Some("2"))], T0, 0, -1), 0, T0).unwrap();
    log.append_as_leader(&kv_batch(&[("b", Some("2"))], T0, 0, -1), 0, T0).unwrap();
    log.roll(T0).unwrap();
    log.clean(clean_cfg(T0)).unwrap();
    let s = log.read_slice(0, 1 << 20, None, true).unwrap();
    let hs = batch::parse_batches(&slice_bytes(&s), true).unwrap();
    assert_eq!((hs[0].1.base_offset, hs[0].1.records_count, hs[0].1.producer_id), (0, 0, 7));
    assert_eq!(records_of(&log).iter().map(|r| r.0).collect::<Vec<_>>(), vec![1, 2]);
}

#[test]
fn a_follower_replicates_a_compacted_log() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut leader = compact_log(a.path(), 1);
    leader.clean(clean_cfg(T0)).unwrap();
    let mut follower = open(b.path(), LogConfig::default());
    let mut at = 0;
    while at < leader.log_end_offset() {
        let data = slice_bytes(&leader.read_slice(at, 300, None, true).unwrap());
        let info = follower.append_as_follower(&data, T0).unwrap();
        at = info.log_end_offset;
    }
    assert_eq!(records_of(&follower), records_of(&leader));
    assert!(matches!(follower.append_as_follower(&slice_bytes(&leader.read_slice(0, 300, None, true).unwrap()), T0), Err(Error::Invalid(_))));
}

#[test]
fn cleaning_aborts_when_the_log_changed_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = compact_log(dir.path(), 0);
    let plan = log.clean_plan(clean_cfg(T0)).unwrap().unwrap();
    let built = cleaner::build(&plan).unwrap();
    log.truncate_to(5, T0).unwrap();
    let stats = log.clean_swap(&plan, built).unwrap();
    assert_eq!(stats.end_offset, -1);
    assert_eq!(records_of(&log).len(), 5);
    assert!(!fs::read_dir(dir.path()).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".cleaned")));
}

/// A crash after the .cleaned file was written discards it; a crash after
/// the .swap rename (the commit) completes the swap on open.
#[test]
fn crash_recovery_discards_or_completes_a_swap() {
    let cfg = LogConfig { segment_bytes: 400, ..Default::default() };
    for commit in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let log = compact_log(dir.path(), 0);
        let before = records_of(&log);
        let plan = log.clean_plan(clean_cfg(T0)).unwrap().unwrap();
        let _built = cleaner::build(&plan).unwrap();
        drop(log); // a crash: no close, no swap
        let cleaned: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(".cleaned")).collect();
        assert!(!cleaned.is_empty());
        if commit {
            for (base, end) in _built.swap_targets() {
                let from = dir.path().join(format!("{base:020}.log.cleaned"));
                fs::rename(from, dir.path().join(format!("{base:020}.{end:020}.swap"))).unwrap();
            }
        }
        let log = open(dir.path(), cfg);
        let after = records_of(&log);
        let names: Vec<String> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.ends_with(".cleaned") || n.ends_with(".swap")), "{names:?}");
        if commit {
            assert!(after.len() < before.len());
            // Every key's latest value is still there, at its offset.
            for k in ["k0", "k1", "k2"] {
                assert_eq!(after.iter().rev().find(|r| r.1 == k), before.iter().rev().find(|r| r.1 == k));
            }
            // Offsets only increase.
            assert!(after.windows(2).all(|w| w[0].0 < w[1].0));
        } else {
            assert_eq!(after, before);
        }
    }
}

/// A compacted topic's leader refuses keyless records (Kafka's LogValidator),
/// on both append paths; a follower and a non-compacted log take them.
#[test]
fn compacted_log_leader_rejects_keyless_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig { compact: true, max_message_bytes: 1 << 21, ..Default::default() });
    let keyless = |n: i32, len: usize| {
        let mut section = Vec::new();
        for i in 0..n {
            encode_record(&mut section, &Record { offset_delta: i, timestamp_delta: 0, key: if i == n - 1 { None } else { Some(b"k".to_vec()) }, value: Some(vec![0; len]), headers: vec![] });
        }
        batch::build_batch(&section, &batch::tests::spec(0, n, T0)).unwrap()
    };
    assert!(matches!(log.append_as_leader(&keyless(3, 10), 0, T0), Err(Error::Invalid(_))));
    assert!(matches!(log.append_as_leader(&keyless(700, 1000), 0, T0), Err(Error::Invalid(_)))); // streamed path
    assert_eq!((log.log_end_offset(), log.size_bytes()), (0, 0));
    log.append_as_leader(&kv_batch(&[("a", Some("1"))], T0, 0, -1), 0, T0).unwrap();
    log.append_as_follower(&{ let mut b = keyless(1, 1); batch::rewrite_offset_and_epoch(&mut b, 0, 1, 0); b }, T0).unwrap();
    let plain_dir = tempfile::tempdir().unwrap();
    let mut plain = open(plain_dir.path(), LogConfig::default());
    plain.append_as_leader(&keyless(3, 10), 0, T0).unwrap();
}

/// A truncation below the cleaner checkpoint lowers it: what is appended
/// again above the truncation point is dirty and gets compacted.
#[test]
fn truncation_lowers_the_cleaner_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = compact_log(dir.path(), 0);
    let end = log.clean(clean_cfg(T0)).unwrap().end_offset;
    assert!(end > 10);
    log.truncate_to(10, T0).unwrap();
    let leo = log.log_end_offset();
    assert!(leo <= 10);
    assert_eq!(log.cleanable(T0, i64::MAX, 0).unwrap().first_dirty_offset, leo);
    for i in 0..10 {
        log.append_as_leader(&kv_batch(&[("k0", Some(&format!("again{i}")))], T0, 0, -1), 1, T0).unwrap();
    }
    log.roll(T0).unwrap();
    log.clean(clean_cfg(T0)).unwrap();
    let k0: Vec<_> = records_of(&log).into_iter().filter(|r| r.1 == "k0").collect();
    assert_eq!(k0.len(), 1);
    assert_eq!(k0[0].2.as_deref(), Some("again9"));
}

/// A transactional batch of producer `pid`, or its ABORT (type 0) / COMMIT (type 1) control batch.
fn txn_batch(pid: i64, control_type: Option<i16>) -> Vec<u8> {
    match control_type {
        Some(t) => txn_record(pid, [0i16.to_be_bytes(), t.to_be_bytes()].concat(), vec![0, 0, 0, 0, 0, 5], true, -1),
        None => txn_record(pid, b"k".to_vec(), b"v".to_vec(), false, 0),
    }
}

/// One-record transactional batch (a control batch with `control`).
fn txn_record(pid: i64, key: Vec<u8>, value: Vec<u8>, control: bool, seq: i32) -> Vec<u8> {
    let mut section = Vec::new();
    encode_record(&mut section, &Record { offset_delta: 0, timestamp_delta: 0, key: Some(key), value: Some(value), headers: vec![] });
    let spec = BatchSpec {
        base_offset: 0,
        partition_leader_epoch: -1,
        attributes: batch::TRANSACTIONAL_FLAG_MASK | if control { batch::CONTROL_FLAG_MASK } else { 0 },
        last_offset_delta: 0,
        base_timestamp: T0,
        max_timestamp: T0,
        producer_id: pid,
        producer_epoch: 0,
        base_sequence: seq,
        records_count: 1,
    };
    batch::build_batch(&section, &spec).unwrap()
}

#[test]
fn aborted_txn_index_survives_reopen_truncation_and_roll() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&txn_batch(7, None), 0, T0).unwrap(); // 0
    log.append_as_leader(&txn_batch(8, None), 0, T0).unwrap(); // 1
    log.append_as_leader(&txn_batch(7, Some(0)), 0, T0).unwrap(); // 2: abort of pid 7
    let t = AbortedTxn { producer_id: 7, first_offset: 0, last_offset: 2, last_stable_offset: 1 };
    assert!(log.append_aborted_txn(t).unwrap());
    assert!(!log.append_aborted_txn(t).unwrap(), "an entry already indexed is not written twice");
    assert!(log.append_aborted_txn(AbortedTxn { last_offset: 9, ..t }).is_err(), "a marker past the LEO");
    log.roll(T0).unwrap();
    log.append_as_leader(&txn_batch(8, Some(0)), 0, T0).unwrap(); // 3: abort of pid 8, new segment
    let t8 = AbortedTxn { producer_id: 8, first_offset: 1, last_offset: 3, last_stable_offset: 4 };
    assert!(log.append_aborted_txn(t8).unwrap());
    assert_eq!(log.collect_aborted_txns(0, 4), vec![t, t8]);
    assert_eq!(log.collect_aborted_txns(3, 10), vec![t8], "entries whose marker is below the fetch offset are left out");
    assert_eq!(log.collect_aborted_txns(0, 1), vec![t], "transactions starting at or after upper are left out");
    assert!(dir.path().join(format!("{:020}.txnindex", 3)).exists());
    log.close().unwrap();

    let mut log = open(dir.path(), LogConfig::default());
    assert_eq!(log.collect_aborted_txns(0, 10), vec![t, t8], "entries reload from the .txnindex files");
    log.truncate_to(3, T0).unwrap();
    assert_eq!(log.collect_aborted_txns(0, 10), vec![t], "truncation drops entries of markers it removes");
    log.close().unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.collect_aborted_txns(0, 10), vec![t]);
}

#[test]
fn torn_txn_index_tail_is_cut_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&txn_batch(7, None), 0, T0).unwrap();
    log.append_as_leader(&txn_batch(7, Some(0)), 0, T0).unwrap();
    let t = AbortedTxn { producer_id: 7, first_offset: 0, last_offset: 1, last_stable_offset: 2 };
    log.append_aborted_txn(t).unwrap();
    log.close().unwrap();
    let path = dir.path().join(format!("{:020}.txnindex", 0));
    let f = OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all_at(&[0, 0, 1, 2], 34).unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.collect_aborted_txns(0, 10), vec![t]);
    assert_eq!(fs::metadata(&path).unwrap().len(), 34);
}

/// One transactional record `k=v` of producer `pid` (sequence `seq`).
fn txn_kv(k: &str, v: &str, pid: i64, seq: i32) -> Vec<u8> {
    txn_record(pid, k.into(), v.into(), false, seq)
}

#[test]
fn cleaning_drops_aborted_records_and_never_lets_them_shadow_committed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&kv_batch(&[("k", Some("committed"))], T0, 0, -1), 1, T0).unwrap(); // 0
    log.append_as_leader(&txn_kv("k", "aborted", 7, 0), 1, T0).unwrap(); // 1
    log.append_as_leader(&txn_kv("j", "kept", 8, 0), 1, T0).unwrap(); // 2
    log.append_as_leader(&txn_batch(7, Some(0)), 1, T0).unwrap(); // 3: ABORT of producer 7
    log.append_aborted_txn(AbortedTxn { producer_id: 7, first_offset: 1, last_offset: 3, last_stable_offset: 2 }).unwrap();
    log.append_as_leader(&txn_batch(8, Some(1)), 1, T0).unwrap(); // 4: COMMIT of producer 8
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("z", Some("active"))], T0, 0, -1), 1, T0).unwrap(); // 5, active segment
    log.clean(clean_cfg(T0)).unwrap();
    let recs: Vec<(i64, String)> = records_of(&log).into_iter().map(|r| (r.0, r.2.unwrap_or_default())).collect();
    let values: Vec<&str> = recs.iter().map(|r| r.1.as_str()).filter(|v| v.is_ascii() && !v.starts_with('\0')).collect();
    assert_eq!(values, vec!["committed", "kept", "active"], "the aborted update neither survives nor shadows k");
    let offsets: Vec<i64> = recs.iter().map(|r| r.0).collect();
    assert!(offsets.contains(&3) && offsets.contains(&4), "markers stay: {offsets:?}");
    assert_eq!(log.collect_aborted_txns(0, 10).len(), 1, "the joined segment keeps the aborted index");
}

/// Whether the marker at `offset` carries a delete horizon; None if it is gone.
fn marker_at(log: &Log, offset: i64) -> Option<bool> {
    let found = batches_of(log).into_iter().find(|(h, _)| h.base_offset == offset && h.is_control());
    found.map(|(h, _)| h.attributes & batch::DELETE_HORIZON_FLAG_MASK != 0)
}

#[test]
fn commit_marker_kept_while_its_data_remains_then_dropped_after_its_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&txn_kv("k", "old", 8, 0), 1, T0).unwrap(); // 0
    log.append_as_leader(&txn_batch(8, Some(1)), 1, T0).unwrap(); // 1: COMMIT
    log.append_as_leader(&txn_kv("j", "x", 8, 1), 1, T0).unwrap(); // 2
    log.append_as_leader(&txn_batch(8, Some(1)), 1, T0).unwrap(); // 3: COMMIT, producer 8's last batch
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("z", Some("z"))], T0, 0, -1), 1, T0).unwrap(); // 4
    log.clean(clean_cfg(T0 + 100_000)).unwrap();
    assert_eq!(marker_at(&log, 1), Some(false), "k=old is still there: no horizon yet");
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("k", Some("new"))], T0, 0, -1), 1, T0).unwrap(); // 5 shadows 0
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("y", Some("y"))], T0, 0, -1), 1, T0).unwrap(); // 6, active
    let now = T0 + 200_000;
    log.clean(clean_cfg(now)).unwrap();
    assert!(records_of(&log).iter().all(|r| r.0 != 0), "k=old is compacted away");
    assert_eq!(marker_at(&log, 1), Some(true), "the marker's data is gone: it gets a delete horizon");
    log.clean(clean_cfg(now + 999)).unwrap();
    assert_eq!(marker_at(&log, 1), Some(true), "kept before the horizon (delete.retention.ms = 1000)");
    log.clean(clean_cfg(now + 1000)).unwrap();
    assert_eq!(marker_at(&log, 1), None, "dropped at the horizon");
    assert_eq!(marker_at(&log, 3), Some(false), "the marker whose data (j) remains is untouched");
    let values: Vec<Option<String>> = records_of(&log).into_iter().filter(|r| r.0 != 3).map(|r| r.2).collect();
    assert_eq!(values, vec![Some("x".into()), Some("z".into()), Some("new".into()), Some("y".into())]);
}

#[test]
fn abort_marker_and_its_txnindex_entry_dropped_after_its_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&kv_batch(&[("k", Some("committed"))], T0, 0, -1), 1, T0).unwrap(); // 0
    log.append_as_leader(&txn_kv("k", "aborted", 7, 0), 1, T0).unwrap(); // 1
    log.append_as_leader(&txn_batch(7, Some(0)), 1, T0).unwrap(); // 2: ABORT
    let t = AbortedTxn { producer_id: 7, first_offset: 1, last_offset: 2, last_stable_offset: 1 };
    log.append_aborted_txn(t).unwrap();
    log.append_as_leader(&txn_kv("j", "later", 7, 1), 1, T0).unwrap(); // 3: the next transaction
    log.append_as_leader(&txn_batch(7, Some(1)), 1, T0).unwrap(); // 4: its COMMIT
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("z", Some("active"))], T0, 0, -1), 1, T0).unwrap(); // 5
    log.clean(clean_cfg(T0)).unwrap();
    assert!(records_of(&log).iter().all(|r| r.0 != 1), "aborted data dropped");
    assert_eq!(marker_at(&log, 2), Some(true), "the ABORT marker has no data left: horizon set, still kept");
    assert_eq!(log.collect_aborted_txns(0, 10), vec![t], "its index entry stays with it");
    log.clean(clean_cfg(T0 + 999)).unwrap();
    assert_eq!(marker_at(&log, 2), Some(true), "kept before the horizon");
    log.clean(clean_cfg(T0 + 1000)).unwrap();
    assert_eq!(marker_at(&log, 2), None, "dropped at the horizon");
    assert_eq!(marker_at(&log, 4), Some(false), "the COMMIT whose data remains stays");
    assert_eq!(log.collect_aborted_txns(0, 10), vec![], "no entry without its marker: j=later would read as aborted");
    log.close().unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.collect_aborted_txns(0, 10), vec![], "the .txnindex file agrees");
    let values: Vec<Option<String>> = records_of(&log).into_iter().filter(|r| r.0 != 4).map(|r| r.2).collect();
    assert_eq!(values, vec![Some("committed".into()), Some("later".into()), Some("active".into())]);
}

#[test]
fn marker_at_or_above_the_cleaner_bound_is_never_touched() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), LogConfig::default());
    log.append_as_leader(&txn_kv("k", "old", 8, 0), 1, T0).unwrap(); // 0
    log.append_as_leader(&kv_batch(&[("k", Some("new"))], T0, 0, -1), 1, T0).unwrap(); // 1 shadows 0
    log.roll(T0).unwrap();
    log.append_as_leader(&txn_batch(8, Some(1)), 1, T0).unwrap(); // 2: COMMIT of 0
    log.append_as_leader(&txn_kv("j", "x", 8, 1), 1, T0).unwrap(); // 3
    log.append_as_leader(&txn_batch(8, Some(1)), 1, T0).unwrap(); // 4
    log.roll(T0).unwrap();
    log.append_as_leader(&kv_batch(&[("z", Some("z"))], T0, 0, -1), 1, T0).unwrap(); // 5, active
    for now in [T0, T0 + 10_000, T0 + 100_000] {
        log.clean(CleanConfig { upper_bound_offset: 2, ..clean_cfg(now) }).unwrap();
        assert!(records_of(&log).iter().all(|r| r.0 != 0), "below the bound k=old goes");
        assert_eq!(marker_at(&log, 2), Some(false), "the marker at the bound keeps no horizon and stays");
    }
    log.clean(clean_cfg(T0 + 200_000)).unwrap();
    assert_eq!(marker_at(&log, 2), Some(true), "once below the bound it gets its horizon");
    log.clean(clean_cfg(T0 + 201_000)).unwrap();
    assert_eq!(marker_at(&log, 2), None);
}

/// Issue 24: a replica costs one descriptor per segment (its .log); the
/// offset and time indexes are opened only to load and to write.
#[test]
fn a_log_holds_one_descriptor_per_segment() {
    let dir = tempfile::tempdir().unwrap();
    let size = batch_with(4, T0, 50).len() as i64;
    let mut log = open(dir.path(), LogConfig { segment_bytes: size * 3, index_interval_bytes: 0, ..Default::default() });
    for i in 0..10 {
        log.append_as_leader(&batch_with(4, T0 + i, 50), 0, T0).unwrap();
    }
    let segments = log.segments_info().len();
    assert!(segments >= 3, "{segments} segments");
    assert_eq!(crate::index::tests::fds_under(dir.path()), segments);
    // Aborted transactions in a sealed and the active segment: their .txnindex holds no descriptor either.
    for last in [2, log.log_end_offset() - 1] {
        let t = AbortedTxn { producer_id: 7, first_offset: last - 1, last_offset: last, last_stable_offset: last };
        assert!(log.append_aborted_txn(t).unwrap());
    }
    assert_eq!(crate::index::tests::fds_under(dir.path()), segments);
    assert_eq!(log.collect_aborted_txns(0, i64::MAX).len(), 2);
    log.flush_at(T0).unwrap();
    log.truncate_to(5, T0).unwrap();
    let segments = log.segments_info().len();
    assert_eq!(crate::index::tests::fds_under(dir.path()), segments);
    assert_eq!(read_all(&log, 0).last().map(|b| b.1), Some(3));
    log.close().unwrap();
    drop(log);
    let mut log = open(dir.path(), LogConfig { segment_bytes: size * 3, ..Default::default() });
    assert_eq!(crate::index::tests::fds_under(dir.path()), log.segments_info().len());
    assert_eq!(read_all(&log, 0).len(), 1);
    assert_eq!(log.collect_aborted_txns(0, i64::MAX).len(), 1, "the marker kept by the truncation");
    log.truncate_fully_and_start_at(0, T0).unwrap();
    log.append_as_leader(&batch_with(4, T0, 50), 0, T0).unwrap();
    assert_eq!(crate::index::tests::fds_under(dir.path()), 1);
}

/// Offsets 0-6 in segments of three records (bases 0, 3, 6), never flushed.
fn seven_records_in_segments_of_three(dir: &Path) -> Log {
    let size = batch_with(1, T0, 100).len() as i64;
    let mut log = open(dir, LogConfig { segment_bytes: size * 3, ..Default::default() });
    assert!(log.rolled_flush_plan().is_none(), "nothing rolled yet");
    for _ in 0..7 {
        log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    }
    log
}

#[test]
fn a_rolled_flush_syncs_the_sealed_segments_and_moves_the_recovery_point_to_the_active_base() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = seven_records_in_segments_of_three(dir.path());
    assert_eq!(log.recovery_point(), 0);
    let plan = log.rolled_flush_plan().expect("two sealed segments unflushed");
    assert_eq!((plan.target, plan.segments.iter().map(|s| s.base_offset).collect::<Vec<_>>()), (6, vec![0, 3]));
    crate::log::sync_rolled(&plan).unwrap();
    log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap(); // appends go on between the phases
    assert!(log.finish_rolled_flush(&plan));
    assert_eq!(log.recovery_point(), 6, "the active segment's data is not covered");
    assert!(log.rolled_flush_plan().is_none());
    assert!(!log.finish_rolled_flush(&plan), "a plan counts once");
}

#[test]
fn a_rolled_flush_planned_before_a_truncation_does_not_move_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = seven_records_in_segments_of_three(dir.path());
    let plan = log.rolled_flush_plan().unwrap();
    crate::log::sync_rolled(&plan).unwrap();
    // A follower's truncation cuts into the synced segment 3; appends refill it to the same size and
    // roll past the plan's target: the bytes at 4 and 5 are new and were never synced.
    assert!(log.truncate_to(4, T0).unwrap());
    for _ in 0..4 {
        log.append_as_leader(&batch_with(1, T0, 100), 0, T0).unwrap();
    }
    assert!(log.log_end_offset() > plan.target);
    assert!(!log.finish_rolled_flush(&plan));
    assert!(log.recovery_point() < plan.target);
    // A plan made after the truncation counts.
    let again = log.rolled_flush_plan().unwrap();
    crate::log::sync_rolled(&again).unwrap();
    assert!(log.finish_rolled_flush(&again));
    assert_eq!(log.recovery_point(), log.segments_info().last().unwrap().base_offset);
}
