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
    let before = fs::read(&checkpoint).unwrap();
    log.append_as_leader(&batch_with(2, T0, 10), 2, T0).unwrap();
    drop(log); // a crash: no clean-shutdown marker
    fs::write(&checkpoint, &before).unwrap();
    let log = open(dir.path(), LogConfig::default());
    assert_eq!(log.epochs().entries(), &[(1, 0), (2, 3)]);
    assert_eq!(log.epochs().end_offset_for(1, log.log_end_offset()), (1, 3));
    assert_eq!(fs::read_to_string(&checkpoint).unwrap(), "0\n2\n1 0\n2 3\n");
}

#[test]
fn crash_recovery_restores_an_epoch_that_started_in_a_sealed_segment() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join(crate::epoch::CHECKPOINT_FILE);
    let one = batch_with(2, T0, 40);
    let mut log = open(dir.path(), LogConfig { segment_bytes: one.len() as i64 * 2, ..Default::default() });
    log.append_as_leader(&one, 1, T0).unwrap();
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
