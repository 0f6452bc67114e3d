//! Kafka v2 record batches: the 61-byte header, CRC-32C, validation, building.
//!
//! This module never decompresses: records are only decoded (see `records.rs`)
//! when a caller hands over an uncompressed section; the codecs live in
//! `codec.rs` (log cleaner, recompression into a topic's compression.type).

use crate::error::{corrupt, invalid, Error, Result};

pub const BATCH_HEADER_SIZE: usize = 61;
pub const MAGIC_V2: i8 = 2;
/// Bytes before the batchLength field's payload: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD: usize = 12;
/// The smallest legal batchLength: a header without records.
pub const MIN_BATCH_LENGTH: i32 = (BATCH_HEADER_SIZE - LOG_OVERHEAD) as i32;

pub const COMPRESSION_CODEC_MASK: i16 = 0x07;
pub const TIMESTAMP_TYPE_MASK: i16 = 0x08;
pub const TRANSACTIONAL_FLAG_MASK: i16 = 0x10;
pub const CONTROL_FLAG_MASK: i16 = 0x20;
/// KIP-534: baseTimestamp holds the delete horizon of the batch's tombstones.
pub const DELETE_HORIZON_FLAG_MASK: i16 = 0x40;

// Field positions inside the header.
const PARTITION_LEADER_EPOCH_POS: usize = 12;
const MAGIC_POS: usize = 16;
const CRC_POS: usize = 17;
/// The CRC covers everything from attributes to the end of the batch.
pub const ATTRIBUTES_POS: usize = 21;

/// The fixed header of one v2 batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("slice of N bytes")
}

impl BatchHeader {
    /// Decodes the header fields without any validation; `b` holds >= 61 bytes.
    pub fn decode(b: &[u8]) -> BatchHeader {
        BatchHeader {
            base_offset: i64::from_be_bytes(be(b, 0)),
            batch_length: i32::from_be_bytes(be(b, 8)),
            partition_leader_epoch: i32::from_be_bytes(be(b, 12)),
            magic: b[16] as i8,
            crc: u32::from_be_bytes(be(b, 17)),
            attributes: i16::from_be_bytes(be(b, 21)),
            last_offset_delta: i32::from_be_bytes(be(b, 23)),
            base_timestamp: i64::from_be_bytes(be(b, 27)),
            max_timestamp: i64::from_be_bytes(be(b, 35)),
            producer_id: i64::from_be_bytes(be(b, 43)),
            producer_epoch: i16::from_be_bytes(be(b, 51)),
            base_sequence: i32::from_be_bytes(be(b, 53)),
            records_count: i32::from_be_bytes(be(b, 57)),
        }
    }

    /// Parses a header and checks the framing fields (length and magic).
    pub fn parse(b: &[u8]) -> Result<BatchHeader> {
        if b.len() < BATCH_HEADER_SIZE {
            return corrupt(format!("{} bytes cannot hold a batch header", b.len()));
        }
        let h = BatchHeader::decode(b);
        if h.batch_length < MIN_BATCH_LENGTH {
            return corrupt(format!("batch length {} below {}", h.batch_length, MIN_BATCH_LENGTH));
        }
        if h.magic != MAGIC_V2 {
            return invalid(format!("magic {} is not 2", h.magic));
        }
        Ok(h)
    }

    pub fn size_bytes(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
    pub fn compression(&self) -> i16 {
        self.attributes & COMPRESSION_CODEC_MASK
    }
    pub fn timestamp_type(&self) -> i16 {
        (self.attributes & TIMESTAMP_TYPE_MASK) >> 3
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_FLAG_MASK != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_FLAG_MASK != 0
    }
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return -1;
        }
        // Sequences wrap at i32::MAX as in Kafka's DefaultRecordBatch.
        let last = self.base_sequence as i64 + self.last_offset_delta as i64;
        if last > i32::MAX as i64 {
            (last - i32::MAX as i64 - 1) as i32
        } else {
            last as i32
        }
    }

    /// Checks what an appender needs: at least one record, and records_count
    /// and lastOffsetDelta agree (Kafka's LogValidator).
    pub fn check_counts(&self) -> Result<()> {
        if self.records_count <= 0 || self.last_offset_delta < 0 {
            return invalid(format!(
                "records_count {} / last_offset_delta {}: a batch needs at least one record",
                self.records_count, self.last_offset_delta
            ));
        }
        if self.last_offset_delta != self.records_count - 1 {
            return invalid(format!(
                "last_offset_delta {} != records_count {} - 1",
                self.last_offset_delta, self.records_count
            ));
        }
        Ok(())
    }
}

pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Verifies the CRC of one whole batch `b` (header + records).
pub fn verify_crc(h: &BatchHeader, b: &[u8]) -> Result<()> {
    let actual = crc32c(&b[ATTRIBUTES_POS..h.size_bytes()]);
    if actual != h.crc {
        return corrupt(format!(
            "crc mismatch at offset {}: stored {:#010x}, computed {:#010x}",
            h.base_offset, h.crc, actual
        ));
    }
    Ok(())
}

/// Splits `data` into whole batches and returns their headers and positions.
pub fn parse_batches(data: &[u8], verify: bool) -> Result<Vec<(usize, BatchHeader)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let rest = &data[pos..];
        if rest.len() < BATCH_HEADER_SIZE {
            return corrupt(format!("truncated batch header at byte {pos}"));
        }
        let h = BatchHeader::parse(rest)?;
        if h.size_bytes() > rest.len() {
            return corrupt(format!("truncated batch at byte {pos}: needs {}", h.size_bytes()));
        }
        if verify {
            verify_crc(&h, rest)?;
        }
        out.push((pos, h));
        pos += h.size_bytes();
    }
    Ok(out)
}

/// Validates a produce buffer: whole batches, CRC, size, counts, and for
/// uncompressed batches the records section itself (exactly records_count
/// records with offset deltas 0..n-1 ending at the batch end).
pub fn validate_for_append(data: &[u8], max_message_bytes: usize) -> Result<Vec<(usize, BatchHeader)>> {
    validate_for_append_keyed(data, max_message_bytes, false)
}

/// `validate_for_append`; with `require_keys` (cleanup.policy=compact) an
/// uncompressed record without a key is Invalid too.
pub fn validate_for_append_keyed(data: &[u8], max_message_bytes: usize, require_keys: bool) -> Result<Vec<(usize, BatchHeader)>> {
    let batches = parse_batches(data, true)?;
    for (pos, h) in &batches {
        if h.size_bytes() > max_message_bytes {
            return Err(Error::TooLarge(format!(
                "batch of {} bytes exceeds max.message.bytes {}",
                h.size_bytes(),
                max_message_bytes
            )));
        }
        h.check_counts()?;
        if h.compression() == 0 {
            let section = &data[pos + BATCH_HEADER_SIZE..pos + h.size_bytes()];
            crate::records::SectionWalk::new(h.records_count).requiring_keys(require_keys).advance(section, true)?;
        }
    }
    Ok(batches)
}

/// What a follower accepts: whole batches, CRC, size, and counts that a
/// compacted log may hold (the leader's log cleaner removes records but keeps
/// offsets: records_count <= lastOffsetDelta + 1, an empty batch kept for its
/// producer's state), records checked for uncompressed batches.
pub fn validate_for_follower(data: &[u8], max_message_bytes: usize) -> Result<Vec<(usize, BatchHeader)>> {
    let batches = parse_batches(data, true)?;
    for (pos, h) in &batches {
        if h.size_bytes() > max_message_bytes {
            return Err(Error::TooLarge(format!(
                "batch of {} bytes exceeds max.message.bytes {}",
                h.size_bytes(),
                max_message_bytes
            )));
        }
        if h.records_count < 0 || h.last_offset_delta < 0 || h.records_count as i64 > h.last_offset_delta as i64 + 1 {
            return invalid(format!(
                "records_count {} / last_offset_delta {} do not fit",
                h.records_count, h.last_offset_delta
            ));
        }
        if h.compression() == 0 {
            let section = &data[pos + BATCH_HEADER_SIZE..pos + h.size_bytes()];
            crate::records::validate_section_compacted(section, h.records_count, h.last_offset_delta)?;
        }
    }
    Ok(batches)
}

/// Rewrites baseOffset and partitionLeaderEpoch of the batch at `pos` in place.
/// The CRC does not cover these fields, so it stays valid.
pub fn rewrite_offset_and_epoch(buf: &mut [u8], pos: usize, base_offset: i64, epoch: i32) {
    buf[pos..pos + 8].copy_from_slice(&base_offset.to_be_bytes());
    let e = pos + PARTITION_LEADER_EPOCH_POS;
    buf[e..e + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Everything of a header that a builder chooses (lengths and CRC are computed).
#[derive(Debug, Clone, Copy)]
pub struct BatchSpec {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

/// Wraps a records section into a full v2 batch with batchLength and CRC.
pub fn build_batch(section: &[u8], s: &BatchSpec) -> Result<Vec<u8>> {
    let mut b = Vec::with_capacity(BATCH_HEADER_SIZE + section.len());
    b.resize(BATCH_HEADER_SIZE, 0);
    b.extend_from_slice(section);
    finish_batch(&mut b, s)?;
    Ok(b)
}

/// Fills the header of `b`, a batch whose records section already follows
/// `BATCH_HEADER_SIZE` reserved bytes, then its CRC: the in-place half of
/// `build_batch`, for encoders that write the section straight after the header.
pub fn finish_batch(b: &mut [u8], s: &BatchSpec) -> Result<()> {
    if b.len() < BATCH_HEADER_SIZE {
        return Err(Error::Invalid(format!("{} bytes cannot hold a batch header", b.len())));
    }
    let batch_length = (b.len() - LOG_OVERHEAD) as i64;
    if batch_length > i32::MAX as i64 {
        return Err(Error::TooLarge(format!("section of {} bytes", b.len() - BATCH_HEADER_SIZE)));
    }
    let mut pos = 0;
    let mut put = |field: &[u8]| {
        b[pos..pos + field.len()].copy_from_slice(field);
        pos += field.len();
    };
    put(&s.base_offset.to_be_bytes());
    put(&(batch_length as i32).to_be_bytes());
    put(&s.partition_leader_epoch.to_be_bytes());
    put(&[MAGIC_V2 as u8]);
    put(&[0; 4]); // CRC, filled below
    put(&s.attributes.to_be_bytes());
    put(&s.last_offset_delta.to_be_bytes());
    put(&s.base_timestamp.to_be_bytes());
    put(&s.max_timestamp.to_be_bytes());
    put(&s.producer_id.to_be_bytes());
    put(&s.producer_epoch.to_be_bytes());
    put(&s.base_sequence.to_be_bytes());
    put(&s.records_count.to_be_bytes());
    debug_assert_eq!(pos, BATCH_HEADER_SIZE);
    let crc = crc32c(&b[ATTRIBUTES_POS..]);
    b[CRC_POS..CRC_POS + 4].copy_from_slice(&crc.to_be_bytes());
    debug_assert_eq!(b[MAGIC_POS], 2);
    Ok(())
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn spec(base_offset: i64, count: i32, ts: i64) -> BatchSpec {
        BatchSpec {
            base_offset,
            partition_leader_epoch: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: ts,
            max_timestamp: ts,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records_count: count,
        }
    }

    #[test]
    fn crc_known_vector() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn build_then_parse_round_trip() {
        let b = build_batch(b"abcdef", &spec(7, 3, 1000)).unwrap();
        assert_eq!(b.len(), 61 + 6);
        let v = parse_batches(&b, true).unwrap();
        assert_eq!(v.len(), 1);
        let h = v[0].1;
        assert_eq!((h.base_offset, h.last_offset(), h.size_bytes()), (7, 9, 67));
        assert_eq!(h.batch_length as usize, b.len() - 12);
    }

    #[test]
    fn rewrite_keeps_crc_valid() {
        let mut b = build_batch(b"xyz", &spec(0, 1, 5)).unwrap();
        rewrite_offset_and_epoch(&mut b, 0, 1234, 9);
        let h = parse_batches(&b, true).unwrap()[0].1;
        assert_eq!((h.base_offset, h.partition_leader_epoch), (1234, 9));
    }

    #[test]
    fn detects_corruption() {
        let mut b = build_batch(b"xyz", &spec(0, 1, 5)).unwrap();
        b[62] ^= 1;
        assert!(matches!(parse_batches(&b, true), Err(Error::Corrupt(_))));
        assert!(parse_batches(&b, false).is_ok());
        let b2 = build_batch(b"xyz", &spec(0, 1, 5)).unwrap();
        assert!(matches!(parse_batches(&b2[..b2.len() - 1], true), Err(Error::Corrupt(_))));
        let mut b3 = b2.clone();
        b3[16] = 1;
        assert!(matches!(parse_batches(&b3, true), Err(Error::Invalid(_))));
        let mut b4 = b2.clone();
        b4[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(matches!(parse_batches(&b4, true), Err(Error::Corrupt(_))));
        assert!(parse_batches(b"", true).unwrap().is_empty());
    }

    fn section(n: i32) -> Vec<u8> {
        let mut s = Vec::new();
        for i in 0..n {
            let r = crate::records::Record { offset_delta: i, timestamp_delta: 0, key: None, value: Some(vec![b'v'; 4]), headers: vec![] };
            crate::records::encode_record(&mut s, &r);
        }
        s
    }

    #[test]
    fn append_validation() {
        let b = build_batch(&section(1), &spec(0, 1, 5)).unwrap();
        assert!(validate_for_append(&b, 1 << 20).is_ok());
        assert!(matches!(validate_for_append(&b, 10), Err(Error::TooLarge(_))));
        let mut s = spec(0, 3, 5);
        s.last_offset_delta = 1;
        let bad = build_batch(&section(3), &s).unwrap();
        assert!(matches!(validate_for_append(&bad, 1 << 20), Err(Error::Invalid(_))));
    }

    #[test]
    fn append_validation_walks_uncompressed_sections() {
        let ok = build_batch(&section(3), &spec(0, 3, 5)).unwrap();
        assert_eq!(validate_for_append(&ok, 1 << 20).unwrap().len(), 1);
        // Header says 3 records, the section holds 1.
        let short = build_batch(&section(1), &spec(0, 3, 5)).unwrap();
        assert!(matches!(validate_for_append(&short, 1 << 20), Err(Error::Invalid(_))));
        // Header says 1 record, the section holds 3.
        let long = build_batch(&section(3), &spec(0, 1, 5)).unwrap();
        assert!(matches!(validate_for_append(&long, 1 << 20), Err(Error::Invalid(_))));
        // records_count 0 with last_offset_delta 0.
        let mut z = spec(0, 1, 5);
        z.records_count = 0;
        let zero = build_batch(b"", &z).unwrap();
        assert!(matches!(validate_for_append(&zero, 1 << 20), Err(Error::Invalid(_))));
        let empty = build_batch(b"", &spec(0, 0, 5)).unwrap();
        assert!(validate_for_append(&empty, 1 << 20).is_err());
        // A section that does not parse.
        let junk = build_batch(b"xyz", &spec(0, 1, 5)).unwrap();
        assert!(matches!(validate_for_append(&junk, 1 << 20), Err(Error::Corrupt(_))));
        // One bad batch in a buffer rejects the whole buffer.
        let mut two = ok.clone();
        two.extend_from_slice(&short);
        assert!(validate_for_append(&two, 1 << 20).is_err());
        // Compressed sections are opaque: only the counts are checked.
        let mut c = spec(0, 5, 5);
        c.attributes = 1;
        assert!(validate_for_append(&build_batch(b"opaque", &c).unwrap(), 1 << 20).is_ok());
        c.records_count = 0;
        assert!(matches!(validate_for_append(&build_batch(b"opaque", &c).unwrap(), 1 << 20), Err(Error::Invalid(_))));
    }

    #[test]
    fn last_sequence_wraps() {
        let mut h = BatchHeader::decode(&build_batch(b"", &spec(0, 3, 0)).unwrap());
        assert_eq!(h.last_sequence(), -1);
        h.base_sequence = i32::MAX - 1;
        assert_eq!(h.last_sequence(), 0);
    }
}
