//! Kafka's batch compression codecs, for the log cleaner and the leader's
//! recompression into a topic's compression.type (`recompress.rs`); with
//! compression.type=producer produce and fetch never decompress. The same
//! formats as the Python side (cramjam): gzip, raw snappy (xerial-framed
//! snappy from Java clients is read too), the LZ4 frame format, zstd.

use std::io::{Read, Write};

use crate::error::{corrupt, invalid, Result};

pub const NONE: i16 = 0;
pub const GZIP: i16 = 1;
pub const SNAPPY: i16 = 2;
pub const LZ4: i16 = 3;
pub const ZSTD: i16 = 4;

const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;

/// The uncompressed records section of a batch compressed with `codec`.
pub fn decompress(codec: i16, data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() * 4);
    let res = match codec {
        NONE => return Ok(data.to_vec()),
        GZIP => flate2::read::GzDecoder::new(data).read_to_end(&mut out).map(|_| ()),
        SNAPPY if data.starts_with(XERIAL_MAGIC) => return xerial_decompress(data),
        SNAPPY => return snap::raw::Decoder::new().decompress_vec(data).or_else(|e| corrupt(format!("snappy: {e}"))),
        LZ4 => lz4_flex::frame::FrameDecoder::new(data).read_to_end(&mut out).map(|_| ()),
        ZSTD => zstd::stream::read::Decoder::new(data).and_then(|mut d| d.read_to_end(&mut out)).map(|_| ()),
        other => return invalid(format!("compression codec {other} is not supported")),
    };
    match res {
        Ok(()) => Ok(out),
        Err(e) => corrupt(format!("cannot decompress codec {codec} records: {e}")),
    }
}

/// Java clients' snappy: a 16-byte header, then blocks of [u32 length][raw snappy].
fn xerial_decompress(data: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut pos = XERIAL_HEADER_BYTES;
    while pos < data.len() {
        if pos + 4 > data.len() {
            return corrupt("truncated xerial snappy block length");
        }
        let n = u32::from_be_bytes(data[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let block = data.get(pos + 4..pos + 4 + n).map_or_else(|| corrupt("truncated xerial snappy block"), Ok)?;
        let mut dec = snap::raw::Decoder::new();
        out.extend(dec.decompress_vec(block).or_else(|e| corrupt(format!("snappy: {e}")))?);
        pos += 4 + n;
    }
    Ok(out)
}

/// Compresses a records section with `codec` (raw snappy, LZ4 frame, zstd level 3).
pub fn compress(codec: i16, data: &[u8]) -> Result<Vec<u8>> {
    compress_level(codec, data, None)
}

/// `compress` at a level (KIP-390's compression.gzip.level 1..9 and
/// compression.zstd.level; None or gzip's -1 is the codec's default: gzip 6,
/// zstd 3). lz4_flex has one level only, so an LZ4 level is accepted and ignored.
pub fn compress_level(codec: i16, data: &[u8], level: Option<i32>) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| crate::error::Error::Io(e);
    match codec {
        NONE => Ok(data.to_vec()),
        GZIP => {
            let gz = match level {
                Some(l @ 1..=9) => flate2::Compression::new(l as u32),
                _ => flate2::Compression::default(),
            };
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), gz);
            enc.write_all(data).map_err(io)?;
            enc.finish().map_err(io)
        }
        SNAPPY => snap::raw::Encoder::new().compress_vec(data).or_else(|e| invalid(format!("snappy: {e}"))),
        LZ4 => {
            let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
            enc.write_all(data).map_err(io)?;
            enc.finish().or_else(|e| invalid(format!("lz4: {e}")))
        }
        ZSTD => zstd::bulk::compress(data, level.unwrap_or(3)).map_err(io),
        other => invalid(format!("compression codec {other} is not supported")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 251).to_be_bytes()).collect();
        for codec in [NONE, GZIP, SNAPPY, LZ4, ZSTD] {
            let c = compress(codec, &data).unwrap();
            assert_eq!(decompress(codec, &c).unwrap(), data, "codec {codec}");
        }
        assert!(decompress(GZIP, b"not gzip").is_err());
        assert!(decompress(7, b"").is_err());
    }

    #[test]
    fn xerial_snappy_is_read() {
        let block = snap::raw::Encoder::new().compress_vec(b"hello hello hello").unwrap();
        let mut framed = XERIAL_MAGIC.to_vec();
        framed.extend([0, 0, 0, 1, 0, 0, 0, 1]);
        framed.extend((block.len() as u32).to_be_bytes());
        framed.extend(&block);
        assert_eq!(decompress(SNAPPY, &framed).unwrap(), b"hello hello hello");
    }
}
