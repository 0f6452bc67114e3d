//! The records section of a v2 batch: zigzag varints and per-record encoding.

use crate::error::{corrupt, invalid, Result};

/// One decoded record; offsets and timestamps are deltas from the batch header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Header values may be null on the wire (Java clients allow it).
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

pub fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

pub fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_varlong(out, v as i64)
}

/// A cursor over a byte slice that reports truncation as corruption.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn unsigned(&mut self, max_bytes: usize) -> Result<u64> {
        let mut v: u64 = 0;
        for i in 0..max_bytes {
            let Some(&b) = self.buf.get(self.pos) else {
                return corrupt("truncated varint");
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        corrupt("varint too long")
    }

    pub fn varlong(&mut self) -> Result<i64> {
        let z = self.unsigned(10)?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    pub fn varint(&mut self) -> Result<i32> {
        let z = self.unsigned(5)?;
        if z > u32::MAX as u64 {
            return corrupt("varint overflows 32 bits");
        }
        let z = z as u32;
        Ok(((z >> 1) as i32) ^ -((z & 1) as i32))
    }

    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return corrupt(format!("needs {n} bytes, {} left", self.remaining()));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Skips a length-prefixed byte string (length -1 is null) without copying.
    pub fn skip_nullable_bytes(&mut self) -> Result<()> {
        let len = self.varint()?;
        if len < -1 {
            return corrupt(format!("negative length {len}"));
        }
        if len > 0 {
            self.take(len as usize)?;
        }
        Ok(())
    }

    /// A length-prefixed byte string borrowed from the buffer; length -1 is null.
    pub fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len < -1 {
            return corrupt(format!("negative length {len}"));
        }
        if len == -1 {
            return Ok(None);
        }
        Ok(Some(self.take(len as usize)?))
    }
}

fn put_nullable(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.extend_from_slice(b);
        }
    }
}

/// Bytes of `v` as a zigzag varint.
pub fn varlong_len(v: i64) -> usize {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    let mut n = 1;
    while z >= 0x80 {
        z >>= 7;
        n += 1;
    }
    n
}

fn nullable_len(b: Option<&[u8]>) -> usize {
    match b {
        None => 1,
        Some(b) => varlong_len(b.len() as i64) + b.len(),
    }
}

/// Appends one record (length-prefixed) to `out` from borrowed fields: the
/// body length is computed first, so every byte is written once, in place.
pub fn encode_record_parts(
    out: &mut Vec<u8>,
    offset_delta: i32,
    timestamp_delta: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&[u8], Option<&[u8]>)],
) {
    let mut body = 1
        + varlong_len(timestamp_delta)
        + varlong_len(offset_delta as i64)
        + nullable_len(key)
        + nullable_len(value)
        + varlong_len(headers.len() as i64);
    for (k, v) in headers {
        body += nullable_len(Some(k)) + nullable_len(*v);
    }
    out.reserve(body + 5);
    put_varint(out, body as i32);
    out.push(0); // record attributes, unused in v2
    put_varlong(out, timestamp_delta);
    put_varint(out, offset_delta);
    put_nullable(out, key);
    put_nullable(out, value);
    put_varint(out, headers.len() as i32);
    for (k, v) in headers {
        put_nullable(out, Some(k));
        put_nullable(out, *v);
    }
}

/// Appends one record (length-prefixed) to `out`.
pub fn encode_record(out: &mut Vec<u8>, r: &Record) {
    let headers: Vec<(&[u8], Option<&[u8]>)> = r.headers.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
    encode_record_parts(out, r.offset_delta, r.timestamp_delta, r.key.as_deref(), r.value.as_deref(), &headers);
}

/// Walks one record body without allocating; returns its offset delta and
/// whether its key is null.
fn walk_body(body: &[u8]) -> Result<(i32, bool)> {
    let mut r = Reader::new(body);
    r.take(1)?; // attributes
    r.varlong()?; // timestamp delta
    let offset_delta = r.varint()?;
    let key_len = r.varint()?;
    if key_len < -1 {
        return corrupt(format!("negative length {key_len}"));
    }
    if key_len > 0 {
        r.take(key_len as usize)?;
    }
    let null_key = key_len == -1;
    r.skip_nullable_bytes()?; // value
    let n = r.varint()?;
    if n < 0 {
        return corrupt(format!("negative header count {n}"));
    }
    for _ in 0..n {
        let len = r.varint()?;
        if len < 0 {
            return corrupt("null or negative header key length");
        }
        r.take(len as usize)?;
        r.skip_nullable_bytes()?;
    }
    if r.remaining() != 0 {
        return corrupt(format!("{} bytes left inside a record", r.remaining()));
    }
    Ok((offset_delta, null_key))
}

/// Checks an uncompressed records section against its header, as Kafka's
/// LogValidator does, with lengths and varints only (no allocation): exactly
/// `count` records, offset deltas 0..count-1, ending exactly at the section
/// end. A section that does not parse is Corrupt; a count or offset-delta
/// mismatch is Invalid.
pub fn validate_section(section: &[u8], count: i32) -> Result<()> {
    SectionWalk::new(count).advance(section, true)
}

/// `validate_section` in steps, for a section that arrives in pieces: each
/// `advance` walks the records lying wholly inside the prefix seen so far,
/// so the one-thread streamed append (the fallback of log.rs's two-core
/// path) reads every byte while it is still in cache.
#[derive(Debug, Clone, Copy)]
pub struct SectionWalk {
    pos: usize,
    n: i32,
    count: i32,
    require_keys: bool,
}

impl SectionWalk {
    pub fn new(count: i32) -> Self {
        SectionWalk { pos: 0, n: 0, count, require_keys: false }
    }

    /// Also rejects records without a key (a compacted topic's leader, as
    /// Kafka's LogValidator: INVALID_RECORD).
    pub fn requiring_keys(mut self, yes: bool) -> Self {
        self.require_keys = yes;
        self
    }

    /// Walks on through `avail`, a prefix of the section (the whole section
    /// when `last`: then it must end exactly at a record boundary and hold
    /// exactly `count` records). A record cut by the prefix end waits.
    pub fn advance(&mut self, avail: &[u8], last: bool) -> Result<()> {
        while self.pos < avail.len() {
            let rest = &avail[self.pos..];
            let mut r = Reader::new(rest);
            let len = match r.varint() {
                Ok(len) => len,
                // A varint is at most 5 bytes: shorter may just be cut off.
                Err(_) if !last && rest.len() < 5 => return Ok(()),
                Err(e) => return Err(e),
            };
            if len < 0 {
                return corrupt(format!("negative record length {len}"));
            }
            if !last && len as usize > r.remaining() {
                return Ok(());
            }
            let (delta, null_key) = walk_body(r.take(len as usize)?)?;
            if null_key && self.require_keys {
                return invalid("Compacted topic cannot accept message without key");
            }
            if self.n >= self.count {
                return invalid(format!("records section holds more than records_count {} records", self.count));
            }
            if delta != self.n {
                return invalid(format!("record {} has offset delta {delta}", self.n));
            }
            self.n += 1;
            self.pos += r.pos;
        }
        if last && self.n != self.count {
            return invalid(format!("records section holds {} records, header says {}", self.n, self.count));
        }
        Ok(())
    }
}

/// One record of a section, borrowed: its whole encoding (length prefix
/// included) and the fields the log cleaner looks at.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    pub raw: &'a [u8],
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value_is_null: bool,
}

/// Every record of an uncompressed section, without copying.
pub fn view_records(section: &[u8]) -> Result<Vec<RecordView<'_>>> {
    let mut out = Vec::new();
    let mut r = Reader::new(section);
    while r.remaining() != 0 {
        let start = r.pos;
        let len = r.varint()?;
        if len < 0 {
            return corrupt(format!("negative record length {len}"));
        }
        let body = r.take(len as usize)?;
        walk_body(body)?;
        let mut b = Reader::new(body);
        b.take(1)?;
        let timestamp_delta = b.varlong()?;
        let offset_delta = b.varint()?;
        let klen = b.varint()?;
        let key = if klen < 0 { None } else { Some(b.take(klen as usize)?) };
        let value_is_null = b.varint()? < 0;
        out.push(RecordView { raw: &section[start..r.pos], offset_delta, timestamp_delta, key, value_is_null });
    }
    Ok(out)
}

/// The follower's check of an uncompressed section, which may come from a
/// compacted log: exactly `count` records (zero allowed), offset deltas
/// strictly increasing within 0..=last_offset_delta (gaps allowed).
pub fn validate_section_compacted(section: &[u8], count: i32, last_offset_delta: i32) -> Result<()> {
    let mut prev = -1;
    let records = view_records(section)?;
    for r in &records {
        if r.offset_delta <= prev || r.offset_delta > last_offset_delta {
            return invalid(format!("record offset delta {} after {prev} (last offset delta {last_offset_delta})", r.offset_delta));
        }
        prev = r.offset_delta;
    }
    if records.len() != count.max(0) as usize {
        return invalid(format!("records section holds {} records, header says {count}", records.len()));
    }
    Ok(())
}

/// One record of a section, borrowed (see `decode_record_refs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// Keys checked to be UTF-8.
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

impl RecordRef<'_> {
    /// The same record with every field copied out of the section.
    pub fn to_record(&self) -> Record {
        Record {
            offset_delta: self.offset_delta,
            timestamp_delta: self.timestamp_delta,
            key: self.key.map(<[u8]>::to_vec),
            value: self.value.map(<[u8]>::to_vec),
            headers: self.headers.iter().map(|(k, v)| (k.to_string(), v.map(<[u8]>::to_vec))).collect(),
        }
    }
}

fn decode_body_ref(body: &[u8]) -> Result<RecordRef<'_>> {
    let mut r = Reader::new(body);
    r.take(1)?; // attributes
    let timestamp_delta = r.varlong()?;
    let offset_delta = r.varint()?;
    let key = r.nullable_bytes()?;
    let value = r.nullable_bytes()?;
    let n = r.varint()?;
    if n < 0 {
        return corrupt(format!("negative header count {n}"));
    }
    let mut headers = Vec::new();
    for _ in 0..n {
        let Some(k) = r.nullable_bytes()? else {
            return corrupt("null header key");
        };
        let Ok(k) = std::str::from_utf8(k) else {
            return corrupt("header key is not utf-8");
        };
        headers.push((k, r.nullable_bytes()?));
    }
    if r.remaining() != 0 {
        return corrupt(format!("{} bytes left inside a record", r.remaining()));
    }
    Ok(RecordRef { offset_delta, timestamp_delta, key, value, headers })
}

/// `decode_records` without copying: every field borrows from `section`.
pub fn decode_record_refs(section: &[u8], count: usize) -> Result<Vec<RecordRef<'_>>> {
    let mut r = Reader::new(section);
    let mut out = Vec::with_capacity(count.min(section.len() / 7 + 1));
    for _ in 0..count {
        let len = r.varint()?;
        if len < 0 {
            return corrupt(format!("negative record length {len}"));
        }
        out.push(decode_body_ref(r.take(len as usize)?)?);
    }
    if r.remaining() != 0 {
        return corrupt(format!("{} bytes after {count} records", r.remaining()));
    }
    Ok(out)
}

/// Decodes exactly `count` records from an uncompressed section (owned copies
/// of `decode_record_refs`).
pub fn decode_records(section: &[u8], count: usize) -> Result<Vec<Record>> {
    Ok(decode_record_refs(section, count)?.iter().map(RecordRef::to_record).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(i: i32) -> Record {
        Record {
            offset_delta: i,
            timestamp_delta: i as i64 * 3,
            key: if i % 2 == 0 { None } else { Some(vec![i as u8; 3]) },
            value: Some(vec![]),
            headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
        }
    }

    #[test]
    fn varint_known_encodings() {
        let mut v = Vec::new();
        put_varint(&mut v, -1);
        put_varint(&mut v, 1);
        put_varint(&mut v, 300);
        assert_eq!(v, vec![0x01, 0x02, 0xd8, 0x04]);
        let mut r = Reader::new(&v);
        assert_eq!((r.varint().unwrap(), r.varint().unwrap(), r.varint().unwrap()), (-1, 1, 300));
    }

    #[test]
    fn records_round_trip_and_count_mismatch() {
        let mut s = Vec::new();
        for i in 0..5 {
            encode_record(&mut s, &rec(i));
        }
        assert_eq!(decode_records(&s, 5).unwrap(), (0..5).map(rec).collect::<Vec<_>>());
        assert!(decode_records(&s, 4).is_err());
        assert!(decode_records(&s, 6).is_err());
        assert!(decode_records(&s[..s.len() - 1], 5).is_err());
    }

    #[test]
    fn validate_section_walks_records() {
        use crate::error::Error;
        let mut s = Vec::new();
        for i in 0..3 {
            encode_record(&mut s, &rec(i));
        }
        validate_section(&s, 3).unwrap();
        assert!(matches!(validate_section(&s, 4), Err(Error::Invalid(_))));
        assert!(matches!(validate_section(&s, 2), Err(Error::Invalid(_))));
        assert!(matches!(validate_section(&s[..s.len() - 1], 3), Err(Error::Corrupt(_))));
        assert!(matches!(validate_section(b"xyz", 1), Err(Error::Corrupt(_))));
        assert!(matches!(validate_section(b"", 1), Err(Error::Invalid(_))));
        // Offset deltas must run 0..n-1.
        let mut bad = Vec::new();
        encode_record(&mut bad, &rec(0));
        encode_record(&mut bad, &rec(2));
        assert!(matches!(validate_section(&bad, 2), Err(Error::Invalid(_))));
        let mut first = Vec::new();
        encode_record(&mut first, &rec(1));
        assert!(matches!(validate_section(&first, 1), Err(Error::Invalid(_))));
        // Trailing garbage after the last record does not parse as a record.
        let mut tail = s.clone();
        tail.push(0x7f);
        assert!(validate_section(&tail, 3).is_err());
    }

    /// The reference encoding: the body in its own buffer, then its length.
    fn encode_with_body_buffer(out: &mut Vec<u8>, r: &Record) {
        let mut body = Vec::new();
        body.push(0);
        put_varlong(&mut body, r.timestamp_delta);
        put_varint(&mut body, r.offset_delta);
        put_nullable(&mut body, r.key.as_deref());
        put_nullable(&mut body, r.value.as_deref());
        put_varint(&mut body, r.headers.len() as i32);
        for (k, v) in &r.headers {
            put_nullable(&mut body, Some(k.as_bytes()));
            put_nullable(&mut body, v.as_deref());
        }
        put_varint(out, body.len() as i32);
        out.extend_from_slice(&body);
    }

    #[test]
    fn varlong_len_matches_encoding() {
        for v in [0i64, 1, -1, 63, 64, -64, -65, 300, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN] {
            let mut b = Vec::new();
            put_varlong(&mut b, v);
            assert_eq!(varlong_len(v), b.len(), "{v}");
        }
    }

    #[test]
    fn bad_varint_is_corrupt() {
        assert!(decode_records(&[0xff; 12], 1).is_err());
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        let bytes = proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40));
        let header = ("[a-z]{0,8}", proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)));
        (any::<i64>(), bytes.clone(), bytes, proptest::collection::vec(header, 0..4)).prop_map(
            |(ts, key, value, headers)| Record { offset_delta: 0, timestamp_delta: ts, key, value, headers },
        )
    }

    proptest! {
        #[test]
        fn prop_round_trip(mut recs in proptest::collection::vec(arb_record(), 0..20)) {
            for (i, r) in recs.iter_mut().enumerate() { r.offset_delta = i as i32; }
            let mut s = Vec::new();
            for r in &recs { encode_record(&mut s, r); }
            prop_assert_eq!(decode_records(&s, recs.len()).unwrap(), recs);
        }

        #[test]
        fn prop_validate_section_accepts_encoded(mut recs in proptest::collection::vec(arb_record(), 1..20)) {
            for (i, r) in recs.iter_mut().enumerate() { r.offset_delta = i as i32; }
            let mut s = Vec::new();
            for r in &recs { encode_record(&mut s, r); }
            prop_assert!(validate_section(&s, recs.len() as i32).is_ok());
        }

        #[test]
        fn prop_walk_in_pieces_matches_whole(mut recs in proptest::collection::vec(arb_record(), 1..20), cut in 0usize..64, flip in any::<bool>()) {
            for (i, r) in recs.iter_mut().enumerate() { r.offset_delta = i as i32; }
            let mut s = Vec::new();
            for r in &recs { encode_record(&mut s, r); }
            if flip { let at = cut % s.len(); s[at] ^= 0x41; }
            let whole = validate_section(&s, recs.len() as i32).is_ok();
            let mut w = SectionWalk::new(recs.len() as i32);
            let step = cut % 7 + 1;
            let mut end = 0;
            let mut ok = true;
            while end < s.len() && ok {
                end = (end + step).min(s.len());
                ok = w.advance(&s[..end], end == s.len()).is_ok();
            }
            prop_assert_eq!(ok, whole);
        }

        #[test]
        fn prop_encode_in_place_matches_body_buffer(mut recs in proptest::collection::vec(arb_record(), 0..20)) {
            for (i, r) in recs.iter_mut().enumerate() { r.offset_delta = i as i32 * 1000; }
            let (mut ours, mut reference) = (Vec::new(), Vec::new());
            for r in &recs { encode_record(&mut ours, r); encode_with_body_buffer(&mut reference, r); }
            prop_assert_eq!(ours, reference);
        }

        #[test]
        fn prop_refs_match_owned_decode(mut recs in proptest::collection::vec(arb_record(), 0..20), cut in any::<usize>()) {
            for (i, r) in recs.iter_mut().enumerate() { r.offset_delta = i as i32; }
            let mut s = Vec::new();
            for r in &recs { encode_record(&mut s, r); }
            let refs = decode_record_refs(&s, recs.len()).unwrap();
            let owned: Vec<Record> = refs.iter().map(|r| Record {
                offset_delta: r.offset_delta, timestamp_delta: r.timestamp_delta,
                key: r.key.map(|k| k.to_vec()), value: r.value.map(|v| v.to_vec()),
                headers: r.headers.iter().map(|(k, v)| (k.to_string(), v.map(|v| v.to_vec()))).collect(),
            }).collect();
            prop_assert_eq!(owned, recs.clone());
            // A cut section fails the same way for both decoders.
            if !s.is_empty() {
                let at = cut % s.len();
                prop_assert_eq!(decode_record_refs(&s[..at], recs.len()).is_err(), decode_records(&s[..at], recs.len()).is_err());
            }
        }

        #[test]
        fn prop_varlong(v in any::<i64>()) {
            let mut b = Vec::new();
            put_varlong(&mut b, v);
            prop_assert_eq!(Reader::new(&b).varlong().unwrap(), v);
        }
    }
}
