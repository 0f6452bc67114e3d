//! Fetched record batches decoded into Arrow-layout column buffers, for bulk
//! readers (the Spark data source) that build `pyarrow` arrays straight from
//! the buffers: no per-record Python object is ever made.
//!
//! Layout (Arrow's, little-endian): fixed-width columns are packed i64/i32
//! arrays; a binary column is a validity bitmap (bit i set = not null), n + 1
//! i32 offsets and the concatenated bytes; the headers column is a list
//! (n + 1 i32 offsets into the header entries) of structs whose `key` is a
//! utf-8 string column and `value` a nullable binary column. Compressed
//! batches are decompressed here (codec.rs); control batches are skipped.

use crate::batch::{parse_batches, BatchHeader, BATCH_HEADER_SIZE};
use crate::codec;
use crate::error::{corrupt, Result};
use crate::records::decode_record_refs;

/// A nullable binary (or utf-8) Arrow column under construction.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BinaryColumn {
    pub validity: Vec<u8>,
    pub offsets: Vec<u8>,
    pub data: Vec<u8>,
    pub len: usize,
    pub nulls: usize,
}

impl BinaryColumn {
    fn new() -> Self {
        let mut c = BinaryColumn::default();
        c.offsets.extend_from_slice(&0i32.to_le_bytes());
        c
    }

    fn push(&mut self, v: Option<&[u8]>) -> Result<()> {
        if self.len % 8 == 0 {
            self.validity.push(0);
        }
        match v {
            Some(b) => {
                self.data.extend_from_slice(b);
                *self.validity.last_mut().expect("pushed above") |= 1 << (self.len % 8);
            }
            None => self.nulls += 1,
        }
        // Arrow's binary type has i32 offsets: one column of one fetch stays far below 2 GiB.
        let Ok(end) = i32::try_from(self.data.len()) else {
            return corrupt("a binary column of one read exceeds 2 GiB");
        };
        self.offsets.extend_from_slice(&end.to_le_bytes());
        self.len += 1;
        Ok(())
    }
}

/// The columns of Spark's Kafka source schema that vary per record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub rows: usize,
    /// The offset after the last batch looked at (the next fetch position).
    pub next_offset: i64,
    pub offset: Vec<u8>,         // i64
    pub timestamp_us: Vec<u8>,   // i64, microseconds (Spark's timestamp unit)
    pub timestamp_type: Vec<u8>, // i32: 0 CreateTime, 1 LogAppendTime
    pub key: BinaryColumn,
    pub value: BinaryColumn,
    /// Only filled when headers are asked for.
    pub header_offsets: Vec<u8>, // i32, rows + 1
    pub header_key: BinaryColumn,
    pub header_value: BinaryColumn,
}

/// Decodes every record with `min_offset <= offset < max_offset` of the whole
/// batches in `data`. Batches starting at or after max_offset end the scan;
/// `next_offset` is then the first offset not looked at.
pub fn decode_columns(data: &[u8], min_offset: i64, max_offset: i64, headers: bool, verify_crc: bool) -> Result<Columns> {
    let mut c = Columns {
        rows: 0,
        next_offset: min_offset,
        offset: Vec::new(),
        timestamp_us: Vec::new(),
        timestamp_type: Vec::new(),
        key: BinaryColumn::new(),
        value: BinaryColumn::new(),
        header_offsets: 0i32.to_le_bytes().to_vec(),
        header_key: BinaryColumn::new(),
        header_value: BinaryColumn::new(),
    };
    for (pos, h) in parse_batches(data, verify_crc)? {
        if h.base_offset >= max_offset {
            break;
        }
        c.next_offset = c.next_offset.max(h.next_offset().min(max_offset));
        if h.is_control() || h.last_offset() < min_offset {
            continue;
        }
        let raw = &data[pos + BATCH_HEADER_SIZE..pos + h.size_bytes()];
        let owned;
        let section = if h.compression() == codec::NONE {
            raw
        } else {
            owned = codec::decompress(h.compression(), raw)?;
            &owned[..]
        };
        add_batch(&mut c, &h, section, min_offset, max_offset, headers)?;
    }
    Ok(c)
}

fn add_batch(c: &mut Columns, h: &BatchHeader, section: &[u8], min: i64, max: i64, headers: bool) -> Result<()> {
    let log_append = h.timestamp_type() == 1;
    let ts_type = h.timestamp_type() as i32;
    for r in decode_record_refs(section, h.records_count.max(0) as usize)? {
        let offset = h.base_offset + r.offset_delta as i64;
        if offset < min || offset >= max {
            continue;
        }
        let ts_ms = if log_append { h.max_timestamp } else { h.base_timestamp.saturating_add(r.timestamp_delta) };
        c.offset.extend_from_slice(&offset.to_le_bytes());
        c.timestamp_us.extend_from_slice(&ts_ms.saturating_mul(1000).to_le_bytes());
        c.timestamp_type.extend_from_slice(&ts_type.to_le_bytes());
        c.key.push(r.key)?;
        c.value.push(r.value)?;
        if headers {
            for (k, v) in &r.headers {
                c.header_key.push(Some(k.as_bytes()))?;
                c.header_value.push(*v)?;
            }
            let n = c.header_key.len as i32;
            c.header_offsets.extend_from_slice(&n.to_le_bytes());
        }
        c.rows += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{build_batch, BatchSpec};
    use crate::records::{encode_record, Record};

    fn batch(base: i64, codec_id: i16, recs: &[Record], attrs: i16) -> Vec<u8> {
        let mut section = Vec::new();
        for r in recs {
            encode_record(&mut section, r);
        }
        let section = codec::compress(codec_id, &section).unwrap();
        let spec = BatchSpec {
            base_offset: base,
            partition_leader_epoch: 0,
            attributes: codec_id | attrs,
            last_offset_delta: recs.len() as i32 - 1,
            base_timestamp: 1000,
            max_timestamp: 5000,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            records_count: recs.len() as i32,
        };
        build_batch(&section, &spec).unwrap()
    }

    fn rec(i: i32, key: Option<&[u8]>, headers: Vec<(String, Option<Vec<u8>>)>) -> Record {
        Record { offset_delta: i, timestamp_delta: i as i64, key: key.map(<[u8]>::to_vec), value: Some(vec![b'v'; i as usize]), headers }
    }

    fn i64s(b: &[u8]) -> Vec<i64> {
        b.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }
    fn i32s(b: &[u8]) -> Vec<i32> {
        b.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn columns_of_plain_and_compressed_batches() {
        let h = vec![("a".to_string(), Some(b"1".to_vec())), ("n".to_string(), None)];
        let recs = vec![rec(0, None, vec![]), rec(1, Some(b"k1"), h.clone()), rec(2, Some(b""), vec![])];
        let mut data = batch(10, codec::NONE, &recs, 0);
        data.extend(batch(13, codec::ZSTD, &recs, 0x08)); // LogAppendTime
        data.extend(batch(16, codec::NONE, &recs[..1], 0x20)); // control: skipped
        let c = decode_columns(&data, 11, 15, true, true).unwrap();
        assert_eq!(c.rows, 4);
        assert_eq!(c.next_offset, 15);
        assert_eq!(i64s(&c.offset), vec![11, 12, 13, 14]);
        assert_eq!(i64s(&c.timestamp_us), vec![1_001_000, 1_002_000, 5_000_000, 5_000_000]);
        assert_eq!(i32s(&c.timestamp_type), vec![0, 0, 1, 1]);
        assert_eq!(c.key.validity, vec![0b1011]);
        assert_eq!((c.key.nulls, i32s(&c.key.offsets), c.key.data.as_slice()), (1, vec![0, 2, 2, 2, 4], &b"k1k1"[..]));
        assert_eq!(i32s(&c.value.offsets), vec![0, 1, 3, 3, 4]);
        assert_eq!(i32s(&c.header_offsets), vec![0, 2, 2, 2, 4]);
        assert_eq!(c.header_key.data, b"anan");
        assert_eq!((c.header_value.validity.clone(), c.header_value.nulls), (vec![0b0101], 2));
        let all = decode_columns(&data, 0, i64::MAX, false, true).unwrap();
        assert_eq!((all.rows, all.next_offset, all.header_offsets.len()), (6, 17, 4));
    }

    #[test]
    fn corrupt_section_is_an_error() {
        let mut data = batch(0, codec::NONE, &[rec(0, None, vec![])], 0);
        let n = data.len();
        data[n - 1] ^= 0xff;
        assert!(decode_columns(&data, 0, i64::MAX, false, true).is_err());
    }
}
