//! Broker-side recompression (topic `compression.type` other than `producer`):
//! Kafka's LogValidator.validateMessagesAndAssignOffsetsCompressed in one
//! native pass. A batch whose codec differs from the topic's is decompressed,
//! its records walked (counts, offset deltas, keys on compacted topics),
//! recompressed into the topic's codec and rebuilt with the same header fields
//! (base offset, timestamps, producer id/epoch, base sequence, flags) and a new
//! CRC. Batches already in the topic's codec, and control batches, are copied
//! unchanged; when every batch is, nothing is rewritten at all (None).

use crate::batch::{self, BatchHeader, BatchSpec, BATCH_HEADER_SIZE, COMPRESSION_CODEC_MASK};
use crate::codec;
use crate::error::{invalid, Error, Result};
use crate::records::SectionWalk;

/// Whether the batch must be rewritten into `target`.
pub fn needs_rewrite(h: &BatchHeader, target: i16) -> bool {
    h.compression() != target && !h.is_control()
}

/// Validates `data` as a leader append would, then rewrites the batches whose
/// codec is not `target`. None when no batch needed it (the zero-rewrite path).
/// `max_message_bytes` applies to the incoming batches and to the results.
pub fn recompress_for_append(
    data: &[u8],
    target: i16,
    level: Option<i32>,
    max_message_bytes: usize,
    require_keys: bool,
) -> Result<Option<Vec<u8>>> {
    if !(codec::NONE..=codec::ZSTD).contains(&target) {
        return invalid(format!("compression codec {target} is not supported"));
    }
    let batches = batch::validate_for_append_keyed(data, max_message_bytes, require_keys)?;
    if !batches.iter().any(|(_, h)| needs_rewrite(h, target)) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(data.len());
    for (pos, h) in &batches {
        let whole = &data[*pos..*pos + h.size_bytes()];
        if !needs_rewrite(h, target) {
            out.extend_from_slice(whole);
            continue;
        }
        let rebuilt = rewrite_batch(h, &whole[BATCH_HEADER_SIZE..], target, level, require_keys)?;
        if rebuilt.len() > max_message_bytes {
            return Err(Error::TooLarge(format!(
                "batch of {} bytes after recompression exceeds max.message.bytes {}",
                rebuilt.len(),
                max_message_bytes
            )));
        }
        out.extend_from_slice(&rebuilt);
    }
    Ok(Some(out))
}

/// One batch's records section re-encoded with `target`, header fields kept.
fn rewrite_batch(h: &BatchHeader, section: &[u8], target: i16, level: Option<i32>, require_keys: bool) -> Result<Vec<u8>> {
    let plain = codec::decompress(h.compression(), section)?;
    // Uncompressed input was walked by validate_for_append; compressed input is walked here.
    if h.compression() != codec::NONE {
        SectionWalk::new(h.records_count).requiring_keys(require_keys).advance(&plain, true)?;
    }
    let packed = codec::compress_level(target, &plain, level)?;
    let spec = BatchSpec {
        base_offset: h.base_offset,
        partition_leader_epoch: h.partition_leader_epoch,
        attributes: (h.attributes & !COMPRESSION_CODEC_MASK) | target,
        last_offset_delta: h.last_offset_delta,
        base_timestamp: h.base_timestamp,
        max_timestamp: h.max_timestamp,
        producer_id: h.producer_id,
        producer_epoch: h.producer_epoch,
        base_sequence: h.base_sequence,
        records_count: h.records_count,
    };
    batch::build_batch(&packed, &spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{decode_records, encode_record, Record};

    const CODECS: [i16; 5] = [codec::NONE, codec::GZIP, codec::SNAPPY, codec::LZ4, codec::ZSTD];

    fn recs(n: i32) -> Vec<Record> {
        (0..n)
            .map(|i| Record {
                offset_delta: i,
                timestamp_delta: i as i64 * 7,
                key: (i % 3 != 0).then(|| format!("key-{i}").into_bytes()),
                value: (i % 5 != 4).then(|| format!("value {i} ").repeat(i as usize % 9 + 1).into_bytes()),
                headers: if i % 2 == 0 { vec![("h".to_string(), Some(vec![i as u8])), ("n".to_string(), None)] } else { vec![] },
            })
            .collect()
    }

    fn spec(codec_id: i16, n: i32) -> BatchSpec {
        BatchSpec {
            base_offset: 0,
            partition_leader_epoch: 3,
            attributes: codec_id | batch::TRANSACTIONAL_FLAG_MASK,
            last_offset_delta: n - 1,
            base_timestamp: 1_700_000_000_000,
            max_timestamp: 1_700_000_000_000 + 7 * (n as i64 - 1),
            producer_id: 4242,
            producer_epoch: 7,
            base_sequence: 100,
            records_count: n,
        }
    }

    fn batch_with(codec_id: i16, records: &[Record]) -> Vec<u8> {
        let mut section = Vec::new();
        for r in records {
            encode_record(&mut section, r);
        }
        let packed = codec::compress(codec_id, &section).unwrap();
        batch::build_batch(&packed, &spec(codec_id, records.len() as i32)).unwrap()
    }

    fn decoded(b: &[u8]) -> (BatchHeader, Vec<Record>) {
        let h = batch::parse_batches(b, true).unwrap()[0].1;
        let plain = codec::decompress(h.compression(), &b[BATCH_HEADER_SIZE..h.size_bytes()]).unwrap();
        (h, decode_records(&plain, h.records_count as usize).unwrap())
    }

    #[test]
    fn every_source_target_pair_round_trips_records_and_header() {
        let records = recs(40);
        for src in CODECS {
            let input = batch_with(src, &records);
            let h_in = BatchHeader::decode(&input);
            for target in CODECS {
                let out = recompress_for_append(&input, target, None, 1 << 20, false).unwrap();
                if src == target {
                    assert!(out.is_none(), "{src}->{target} must not rewrite");
                    continue;
                }
                let out = out.unwrap_or_else(|| panic!("{src}->{target} must rewrite"));
                let (h, got) = decoded(&out);
                assert_eq!(got, records, "{src}->{target}");
                assert_eq!(h.compression(), target);
                assert_eq!(h.attributes & !COMPRESSION_CODEC_MASK, h_in.attributes & !COMPRESSION_CODEC_MASK);
                let keep = |h: &BatchHeader| {
                    (h.base_offset, h.partition_leader_epoch, h.last_offset_delta, h.base_timestamp, h.max_timestamp,
                     h.producer_id, h.producer_epoch, h.base_sequence, h.records_count)
                };
                assert_eq!(keep(&h), keep(&h_in), "{src}->{target}");
                assert!(batch::validate_for_append(&out, 1 << 20).is_ok());
            }
        }
    }

    #[test]
    fn levels_change_gzip_and_zstd_output_not_records() {
        let records = recs(200);
        let input = batch_with(codec::NONE, &records);
        for (target, lo, hi) in [(codec::GZIP, 1, 9), (codec::ZSTD, 1, 19)] {
            let a = recompress_for_append(&input, target, Some(lo), 1 << 20, false).unwrap().unwrap();
            let b = recompress_for_append(&input, target, Some(hi), 1 << 20, false).unwrap().unwrap();
            assert_ne!(a, b);
            assert_eq!(decoded(&a).1, records);
            assert_eq!(decoded(&b).1, records);
        }
    }

    #[test]
    fn mixed_buffer_rewrites_only_batches_in_another_codec() {
        let zs = batch_with(codec::ZSTD, &recs(3));
        let gz = batch_with(codec::GZIP, &recs(5));
        let mut buf = zs.clone();
        buf.extend_from_slice(&gz);
        let out = recompress_for_append(&buf, codec::ZSTD, None, 1 << 20, false).unwrap().unwrap();
        assert_eq!(&out[..zs.len()], &zs[..], "the zstd batch is copied byte for byte");
        let parsed = batch::parse_batches(&out, true).unwrap();
        assert_eq!(parsed.len(), 2);
        assert!(parsed.iter().all(|(_, h)| h.compression() == codec::ZSTD));
        assert_eq!(decoded(&out[parsed[1].0..]).1, recs(5));
    }

    #[test]
    fn control_batches_are_kept() {
        let mut s = spec(codec::NONE, 1);
        s.attributes |= batch::CONTROL_FLAG_MASK;
        let mut section = Vec::new();
        encode_record(&mut section, &recs(1)[0]);
        let b = batch::build_batch(&section, &s).unwrap();
        assert!(recompress_for_append(&b, codec::ZSTD, None, 1 << 20, false).unwrap().is_none());
    }

    #[test]
    fn undecodable_compressed_batch_is_corrupt() {
        let mut s = spec(codec::GZIP, 2);
        s.attributes = codec::GZIP;
        let b = batch::build_batch(b"definitely not gzip", &s).unwrap();
        assert!(matches!(recompress_for_append(&b, codec::ZSTD, None, 1 << 20, false), Err(Error::Corrupt(_))));
        // Decompresses, but holds 3 records where the header says 5.
        let mut section = Vec::new();
        for r in recs(3) {
            encode_record(&mut section, &r);
        }
        let mut s5 = spec(codec::LZ4, 5);
        s5.attributes = codec::LZ4;
        let short = batch::build_batch(&codec::compress(codec::LZ4, &section).unwrap(), &s5).unwrap();
        assert!(recompress_for_append(&short, codec::NONE, None, 1 << 20, false).is_err());
    }

    #[test]
    fn compacted_topics_refuse_keyless_records_inside_compressed_batches() {
        let b = batch_with(codec::GZIP, &recs(4)); // record 0 and 3 have no key
        assert!(matches!(recompress_for_append(&b, codec::ZSTD, None, 1 << 20, true), Err(Error::Invalid(_))));
    }

    #[test]
    fn max_message_bytes_applies_to_the_result() {
        let records = recs(300);
        let gz = batch_with(codec::GZIP, &records);
        let plain_len = batch_with(codec::NONE, &records).len();
        assert!(gz.len() < plain_len);
        let limit = gz.len() + 10;
        match recompress_for_append(&gz, codec::NONE, None, limit, false) {
            Err(Error::TooLarge(m)) => assert!(m.contains("after recompression"), "{m}"),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(recompress_for_append(&gz, codec::NONE, None, plain_len, false).unwrap().is_some());
        assert!(recompress_for_append(&gz, 5, None, 1 << 20, false).is_err());
    }
}
