//! PyO3 bindings of the Gregor log engine: the only module that touches Python.
//! Thin wrappers: every disk or socket operation runs with the thread detached
//! (GIL released); engine errors map to the exception classes of `_native.pyi`.

pub mod batch;
pub mod cleaner;
pub mod codec;
pub mod columns;
pub mod epoch;
pub mod error;
pub mod index;
pub mod log;
pub mod records;
pub mod recompress;
pub mod retention;
pub mod segment;
pub mod sendfile;
pub mod txnindex;

#[cfg(test)]
mod tests;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::batch::{BatchHeader, BatchSpec};
use crate::error::Error;
use crate::log::{wall_clock_ms, AppendInfo, LogConfig, SegmentInfo, Slice};
use crate::records::Record;

create_exception!(gregor_native._native, NativeError, PyException, "Base class of every error raised by the native module.");
create_exception!(gregor_native._native, CorruptRecordError, NativeError, "A batch failed validation (CORRUPT_MESSAGE).");
create_exception!(gregor_native._native, InvalidRecordError, NativeError, "A batch is well formed but not acceptable (INVALID_RECORD).");
create_exception!(gregor_native._native, RecordTooLargeError, NativeError, "A batch is larger than max.message.bytes (MESSAGE_TOO_LARGE).");
create_exception!(gregor_native._native, OffsetOutOfRangeError, NativeError, "A read outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE).");
create_exception!(gregor_native._native, LogClosedError, NativeError, "The log was closed (or deleted) and cannot be used any more.");

fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Corrupt(_) => CorruptRecordError::new_err(msg),
        Error::Invalid(_) => InvalidRecordError::new_err(msg),
        Error::TooLarge(_) => RecordTooLargeError::new_err(msg),
        Error::OutOfRange(_) => OffsetOutOfRangeError::new_err(msg),
        Error::Closed => LogClosedError::new_err(msg),
        Error::Io(io) => PyErr::from(io),
    }
}

type NResult<T> = std::result::Result<T, Error>;

// ------------------------------------------------------------ record batches

#[pyfunction]
#[pyo3(name = "crc32c")]
fn py_crc32c(py: Python<'_>, data: &[u8]) -> u32 {
    py.detach(|| batch::crc32c(data))
}

/// The fixed 61-byte header of one v2 record batch (immutable).
#[pyclass(name = "BatchHeader", module = "gregor_native._native", frozen, eq)]
#[derive(Clone, PartialEq)]
struct PyBatchHeader(BatchHeader);

#[pymethods]
impl PyBatchHeader {
    #[getter]
    fn base_offset(&self) -> i64 { self.0.base_offset }
    #[getter]
    fn batch_length(&self) -> i32 { self.0.batch_length }
    #[getter]
    fn partition_leader_epoch(&self) -> i32 { self.0.partition_leader_epoch }
    #[getter]
    fn magic(&self) -> i8 { self.0.magic }
    #[getter]
    fn crc(&self) -> u32 { self.0.crc }
    #[getter]
    fn attributes(&self) -> i16 { self.0.attributes }
    #[getter]
    fn last_offset_delta(&self) -> i32 { self.0.last_offset_delta }
    #[getter]
    fn base_timestamp(&self) -> i64 { self.0.base_timestamp }
    #[getter]
    fn max_timestamp(&self) -> i64 { self.0.max_timestamp }
    #[getter]
    fn producer_id(&self) -> i64 { self.0.producer_id }
    #[getter]
    fn producer_epoch(&self) -> i16 { self.0.producer_epoch }
    #[getter]
    fn base_sequence(&self) -> i32 { self.0.base_sequence }
    #[getter]
    fn records_count(&self) -> i32 { self.0.records_count }
    #[getter]
    fn size_bytes(&self) -> usize { self.0.size_bytes() }
    #[getter]
    fn last_offset(&self) -> i64 { self.0.last_offset() }
    #[getter]
    fn next_offset(&self) -> i64 { self.0.next_offset() }
    #[getter]
    fn compression(&self) -> i16 { self.0.compression() }
    #[getter]
    fn timestamp_type(&self) -> i16 { self.0.timestamp_type() }
    #[getter]
    fn is_transactional(&self) -> bool { self.0.is_transactional() }
    #[getter]
    fn is_control(&self) -> bool { self.0.is_control() }
    #[getter]
    fn last_sequence(&self) -> i32 { self.0.last_sequence() }

    fn __repr__(&self) -> String {
        let h = &self.0;
        format!(
            "BatchHeader(base_offset={}, last_offset_delta={}, records_count={}, size_bytes={}, partition_leader_epoch={}, attributes={}, max_timestamp={})",
            h.base_offset, h.last_offset_delta, h.records_count, h.size_bytes(), h.partition_leader_epoch, h.attributes, h.max_timestamp
        )
    }
}

#[pyfunction]
#[pyo3(signature = (data, verify_crc = true))]
fn parse_batches(py: Python<'_>, data: &[u8], verify_crc: bool) -> PyResult<Vec<PyBatchHeader>> {
    let parsed = py.detach(|| batch::parse_batches(data, verify_crc)).map_err(to_py)?;
    Ok(parsed.into_iter().map(|(_, h)| PyBatchHeader(h)).collect())
}

/// bytes or bytearray (or any buffer-less bytes-like rejected with TypeError).
fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    Err(PyTypeError::new_err(format!("expected bytes, got {}", obj.get_type().name()?)))
}

fn optional_bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<Vec<u8>>> {
    if obj.is_none() { Ok(None) } else { bytes_of(obj).map(Some) }
}

fn record_of(i: usize, item: &Bound<'_, PyAny>) -> PyResult<Record> {
    let (key, value, headers, timestamp_delta): (Bound<PyAny>, Bound<PyAny>, Bound<PyAny>, i64) = item.extract()?;
    let mut hs = Vec::new();
    for h in headers.try_iter()? {
        let (k, v): (String, Bound<PyAny>) = h?.extract()?;
        hs.push((k, optional_bytes_of(&v)?));
    }
    Ok(Record {
        offset_delta: i as i32,
        timestamp_delta,
        key: optional_bytes_of(&key)?,
        value: optional_bytes_of(&value)?,
        headers: hs,
    })
}

/// Broker-side recompression into the topic's compression.type (see
/// `recompress.rs`): validated and rewritten with the GIL released; None when
/// every batch is already in `codec` (the caller appends its own bytes).
#[pyfunction]
#[pyo3(signature = (data, codec, max_message_bytes, *, level = None, require_keys = false))]
#[pyo3(text_signature = "(data, codec, max_message_bytes, *, level=None, require_keys=False)")]
fn recompress_batches<'py>(
    py: Python<'py>,
    data: &[u8],
    codec: i16,
    max_message_bytes: i64,
    level: Option<i32>,
    require_keys: bool,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let max = max_message_bytes.max(0) as usize;
    let out = py.detach(|| recompress::recompress_for_append(data, codec, level, max, require_keys)).map_err(to_py)?;
    Ok(out.map(|b| PyBytes::new(py, &b)))
}

/// Key or value of a record to encode: bytes are borrowed, a bytearray (mutable) is copied.
enum Field<'a> {
    Null,
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Field<'_> {
    fn get(&self) -> Option<&[u8]> {
        match self {
            Field::Null => None,
            Field::Borrowed(b) => Some(b),
            Field::Owned(v) => Some(v),
        }
    }
}

fn field_of<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Field<'a>> {
    if obj.is_none() {
        return Ok(Field::Null);
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Field::Borrowed(b.as_bytes()));
    }
    bytes_of(obj).map(Field::Owned)
}

/// Appends the records of `records` ((key, value, headers, timestamp_delta)
/// tuples) to `out`, offset deltas 0, 1, ...; returns how many there were.
/// Keys and values are copied once, straight from their bytes objects.
fn encode_records_into(out: &mut Vec<u8>, records: &Bound<'_, PyAny>) -> PyResult<usize> {
    let mut n = 0;
    let mut encode_one = |item: &Bound<'_, PyAny>| -> PyResult<()> {
        let t = match item.cast::<PyTuple>() {
            Ok(t) if t.len() == 4 => t,
            _ => {
                // Not a 4-tuple: the generic path (other sequences, or its TypeError).
                records::encode_record(out, &record_of(n, item)?);
                n += 1;
                return Ok(());
            }
        };
        let (key, value, headers) = (t.get_item(0)?, t.get_item(1)?, t.get_item(2)?);
        let timestamp_delta: i64 = t.get_item(3)?.extract()?;
        let (key, value) = (field_of(&key)?, field_of(&value)?);
        let offset_delta = i32::try_from(n).map_err(|_| PyValueError::new_err("too many records for one batch"))?;
        if headers.len().map(|l| l == 0).unwrap_or(false) {
            records::encode_record_parts(out, offset_delta, timestamp_delta, key.get(), value.get(), &[]);
        } else {
            let mut hs: Vec<(String, Option<Vec<u8>>)> = Vec::new();
            for h in headers.try_iter()? {
                let (k, v): (String, Bound<PyAny>) = h?.extract()?;
                hs.push((k, optional_bytes_of(&v)?));
            }
            let refs: Vec<(&[u8], Option<&[u8]>)> = hs.iter().map(|(k, v)| (k.as_bytes(), v.as_deref())).collect();
            records::encode_record_parts(out, offset_delta, timestamp_delta, key.get(), value.get(), &refs);
        }
        n += 1;
        Ok(())
    };
    if let Ok(list) = records.cast::<PyList>() {
        for item in list.iter() {
            encode_one(&item)?;
        }
    } else {
        for item in records.try_iter()? {
            encode_one(&item?)?;
        }
    }
    Ok(n)
}

#[pyfunction]
fn encode_records<'py>(py: Python<'py>, records: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    encode_records_into(&mut out, records)?;
    Ok(PyBytes::new(py, &out))
}

/// One uncompressed batch straight from its records: encode_records and
/// build_batch in one pass (the producer's path for compression.type=none).
#[pyfunction]
#[pyo3(signature = (records, *, attributes = 0, base_timestamp = 0, max_timestamp = 0, producer_id = -1,
    producer_epoch = -1, base_sequence = -1))]
#[pyo3(text_signature = "(records, *, attributes=0, base_timestamp=0, max_timestamp=0, producer_id=-1, producer_epoch=-1, base_sequence=-1)")]
#[allow(clippy::too_many_arguments)]
fn encode_batch<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    attributes: i16,
    base_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(4096);
    out.resize(batch::BATCH_HEADER_SIZE, 0);
    let n = encode_records_into(&mut out, records)?;
    if n == 0 {
        return Err(PyValueError::new_err("a record batch holds at least one record"));
    }
    let count = i32::try_from(n).map_err(|_| PyValueError::new_err("too many records for one batch"))?;
    let spec = BatchSpec {
        base_offset: 0,
        partition_leader_epoch: -1,
        attributes,
        last_offset_delta: count - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count: count,
    };
    batch::finish_batch(&mut out, &spec).map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}

type DecodedRecord<'py> = (i32, i64, Option<Bound<'py, PyBytes>>, Option<Bound<'py, PyBytes>>, Vec<(String, Option<Bound<'py, PyBytes>>)>);

fn opt_bytes<'py>(py: Python<'py>, b: Option<&[u8]>) -> Bound<'py, PyAny> {
    match b {
        Some(b) => PyBytes::new(py, b).into_any(),
        None => py.None().into_bound(py),
    }
}

fn headers_list<'py>(py: Python<'py>, headers: &[(&str, Option<&[u8]>)]) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<Bound<'py, PyTuple>> = headers
        .iter()
        .map(|(k, v)| PyTuple::new(py, [PyString::new(py, k).into_any(), opt_bytes(py, *v)]))
        .collect::<PyResult<_>>()?;
    PyList::new(py, items)
}

#[pyfunction]
fn decode_records<'py>(py: Python<'py>, section: &[u8], count: usize) -> PyResult<Vec<DecodedRecord<'py>>> {
    let recs = records::decode_record_refs(section, count).map_err(to_py)?;
    let b = |v: Option<&[u8]>| v.map(|v| PyBytes::new(py, v));
    Ok(recs
        .into_iter()
        .map(|r| {
            let headers = r.headers.iter().map(|(k, v)| (k.to_string(), b(*v))).collect();
            (r.offset_delta, r.timestamp_delta, b(r.key), b(r.value), headers)
        })
        .collect())
}

/// The consumer's rows of one uncompressed records section, built in one pass:
/// `(*prefix, offset, timestamp, key, value, headers)` for every record at or
/// above min_offset. The section is `data[start:end]` (end None: to the end),
/// so a fetched buffer is decoded without slicing it first.
#[pyfunction]
#[pyo3(signature = (data, count, *, start = 0, end = None, base_offset = 0, base_timestamp = 0,
    log_append_time = None, min_offset = -1, prefix = None))]
#[pyo3(text_signature = "(data, count, *, start=0, end=None, base_offset=0, base_timestamp=0, log_append_time=None, min_offset=-1, prefix=None)")]
#[allow(clippy::too_many_arguments)]
fn decode_rows<'py>(
    py: Python<'py>,
    data: &[u8],
    count: usize,
    start: usize,
    end: Option<usize>,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    min_offset: i64,
    prefix: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Bound<'py, PyList>> {
    let end = end.unwrap_or(data.len());
    if start > end || end > data.len() {
        return Err(PyValueError::new_err(format!("section [{start}:{end}] is outside data of {} bytes", data.len())));
    }
    let recs = records::decode_record_refs(&data[start..end], count).map_err(to_py)?;
    let prefix: Vec<Bound<'py, PyAny>> = match prefix {
        Some(p) => p.iter().collect(),
        None => Vec::new(),
    };
    let out = PyList::empty(py);
    let mut row: Vec<Bound<'py, PyAny>> = Vec::with_capacity(prefix.len() + 5);
    for r in &recs {
        let offset = base_offset + r.offset_delta as i64;
        if offset < min_offset {
            continue;
        }
        row.clear();
        row.extend(prefix.iter().cloned());
        row.push(offset.into_pyobject(py)?.into_any());
        row.push(match log_append_time {
            Some(t) => t.into_pyobject(py)?.into_any(),
            // Python's arithmetic: a sum beyond i64 is still the exact integer.
            None => match base_timestamp.checked_add(r.timestamp_delta) {
                Some(t) => t.into_pyobject(py)?.into_any(),
                None => (base_timestamp as i128 + r.timestamp_delta as i128).into_pyobject(py)?.into_any(),
            },
        });
        row.push(opt_bytes(py, r.key));
        row.push(opt_bytes(py, r.value));
        row.push(headers_list(py, &r.headers)?.into_any());
        out.append(PyTuple::new(py, row.drain(..))?)?;
    }
    Ok(out)
}

/// Whole fetched batches as Arrow column buffers (`columns.rs`), for bulk
/// readers that build pyarrow arrays with `Array.from_buffers`: one native
/// pass, compressed batches decompressed here, the GIL released meanwhile.
#[pyfunction]
#[pyo3(signature = (data, *, min_offset = -1, max_offset = i64::MAX, headers = false, verify_crc = true))]
#[pyo3(text_signature = "(data, *, min_offset=-1, max_offset=9223372036854775807, headers=False, verify_crc=True)")]
fn decode_columns<'py>(
    py: Python<'py>,
    data: &[u8],
    min_offset: i64,
    max_offset: i64,
    headers: bool,
    verify_crc: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let c = py.detach(|| columns::decode_columns(data, min_offset, max_offset, headers, verify_crc)).map_err(to_py)?;
    let d = PyDict::new(py);
    d.set_item("rows", c.rows)?;
    d.set_item("next_offset", c.next_offset)?;
    let b = |v: &[u8]| PyBytes::new(py, v);
    d.set_item("offset", b(&c.offset))?;
    d.set_item("timestamp", b(&c.timestamp_us))?;
    d.set_item("timestamp_type", b(&c.timestamp_type))?;
    for (name, col) in [("key", &c.key), ("value", &c.value), ("header_key", &c.header_key), ("header_value", &c.header_value)] {
        d.set_item(name, (b(&col.validity), b(&col.offsets), b(&col.data), col.nulls))?;
    }
    d.set_item("header_offsets", b(&c.header_offsets))?;
    Ok(d)
}

#[pyfunction]
#[pyo3(signature = (section, records_count, *, base_offset = 0, partition_leader_epoch = -1, attributes = 0,
    last_offset_delta = None, base_timestamp = 0, max_timestamp = 0, producer_id = -1, producer_epoch = -1,
    base_sequence = -1))]
#[pyo3(text_signature = "(section, records_count, *, base_offset=0, partition_leader_epoch=-1, attributes=0, last_offset_delta=None, base_timestamp=0, max_timestamp=0, producer_id=-1, producer_epoch=-1, base_sequence=-1)")]
#[allow(clippy::too_many_arguments)]
fn build_batch<'py>(
    py: Python<'py>,
    section: &[u8],
    records_count: i32,
    base_offset: i64,
    partition_leader_epoch: i32,
    attributes: i16,
    last_offset_delta: Option<i32>,
    base_timestamp: i64,
    max_timestamp: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> PyResult<Bound<'py, PyBytes>> {
    let spec = BatchSpec {
        base_offset,
        partition_leader_epoch,
        attributes,
        last_offset_delta: last_offset_delta.unwrap_or(records_count - 1),
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    };
    let b = py.detach(|| batch::build_batch(section, &spec)).map_err(to_py)?;
    Ok(PyBytes::new(py, &b))
}

// ------------------------------------------------------------ config and results

/// Per-log settings, Kafka's topic config names in snake case.
#[pyclass(name = "LogConfig", module = "gregor_native._native", get_all, set_all)]
#[derive(Clone)]
struct PyLogConfig {
    segment_bytes: i64,
    segment_ms: i64,
    segment_index_bytes: i64,
    index_interval_bytes: i64,
    retention_bytes: i64,
    retention_ms: i64,
    flush_messages: i64,
    flush_ms: i64,
    max_message_bytes: i64,
    compact: bool,
}

#[pymethods]
impl PyLogConfig {
    #[new]
    #[pyo3(signature = (*, segment_bytes = 1073741824, segment_ms = 604800000, segment_index_bytes = 10485760,
        index_interval_bytes = 4096, retention_bytes = -1, retention_ms = 604800000,
        flush_messages = 9223372036854775807, flush_ms = 9223372036854775807, max_message_bytes = 1048588, compact = false))]
    #[pyo3(text_signature = "(*, segment_bytes=1073741824, segment_ms=604800000, segment_index_bytes=10485760, index_interval_bytes=4096, retention_bytes=-1, retention_ms=604800000, flush_messages=9223372036854775807, flush_ms=9223372036854775807, max_message_bytes=1048588, compact=False)")]
    #[allow(clippy::too_many_arguments)]
    fn new(
        segment_bytes: i64,
        segment_ms: i64,
        segment_index_bytes: i64,
        index_interval_bytes: i64,
        retention_bytes: i64,
        retention_ms: i64,
        flush_messages: i64,
        flush_ms: i64,
        max_message_bytes: i64,
        compact: bool,
    ) -> Self {
        PyLogConfig {
            segment_bytes,
            segment_ms,
            segment_index_bytes,
            index_interval_bytes,
            retention_bytes,
            retention_ms,
            flush_messages,
            flush_ms,
            max_message_bytes,
            compact,
        }
    }

    fn __repr__(&self) -> String {
        let c = self.to_config();
        format!(
            "LogConfig(segment_bytes={}, segment_ms={}, segment_index_bytes={}, index_interval_bytes={}, retention_bytes={}, retention_ms={}, flush_messages={}, flush_ms={}, max_message_bytes={}, compact={})",
            c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes, c.retention_bytes,
            c.retention_ms, c.flush_messages, c.flush_ms, c.max_message_bytes, if c.compact { "True" } else { "False" }
        )
    }
}

impl PyLogConfig {
    fn to_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes: self.segment_bytes,
            segment_ms: self.segment_ms,
            segment_index_bytes: self.segment_index_bytes,
            index_interval_bytes: self.index_interval_bytes,
            retention_bytes: self.retention_bytes,
            retention_ms: self.retention_ms,
            flush_messages: self.flush_messages,
            flush_ms: self.flush_ms,
            max_message_bytes: self.max_message_bytes,
            compact: self.compact,
        }
    }
    fn from_config(c: LogConfig) -> Self {
        PyLogConfig::new(
            c.segment_bytes, c.segment_ms, c.segment_index_bytes, c.index_interval_bytes, c.retention_bytes,
            c.retention_ms, c.flush_messages, c.flush_ms, c.max_message_bytes, c.compact,
        )
    }
}

/// What an append wrote.
#[pyclass(name = "AppendInfo", module = "gregor_native._native", frozen, get_all)]
struct PyAppendInfo {
    first_offset: i64,
    last_offset: i64,
    max_timestamp: i64,
    offset_of_max_timestamp: i64,
    num_batches: usize,
    num_records: i64,
    valid_bytes: usize,
    log_end_offset: i64,
}

#[pymethods]
impl PyAppendInfo {
    fn __repr__(&self) -> String {
        format!(
            "AppendInfo(first_offset={}, last_offset={}, num_batches={}, num_records={}, log_end_offset={})",
            self.first_offset, self.last_offset, self.num_batches, self.num_records, self.log_end_offset
        )
    }
}

impl From<AppendInfo> for PyAppendInfo {
    fn from(a: AppendInfo) -> Self {
        PyAppendInfo {
            first_offset: a.first_offset,
            last_offset: a.last_offset,
            max_timestamp: a.max_timestamp,
            offset_of_max_timestamp: a.offset_of_max_timestamp,
            num_batches: a.num_batches,
            num_records: a.num_records,
            valid_bytes: a.valid_bytes,
            log_end_offset: a.log_end_offset,
        }
    }
}

/// How dirty a log is, for the log cleaner (Kafka's LogToClean).
#[pyclass(name = "CleanableInfo", module = "gregor_native._native", frozen, get_all)]
struct PyCleanableInfo {
    first_dirty_offset: i64,
    first_uncleanable_offset: i64,
    clean_bytes: u64,
    dirty_bytes: u64,
    dirty_ratio: f64,
    first_dirty_timestamp: i64,
    next_delete_horizon_ms: i64,
}

#[pymethods]
impl PyCleanableInfo {
    fn __repr__(&self) -> String {
        format!(
            "CleanableInfo(first_dirty_offset={}, first_uncleanable_offset={}, dirty_ratio={:.3})",
            self.first_dirty_offset, self.first_uncleanable_offset, self.dirty_ratio
        )
    }
}

/// What one cleaning did; end_offset is -1 when nothing was cleaned.
#[pyclass(name = "CleanStats", module = "gregor_native._native", frozen, get_all)]
struct PyCleanStats {
    bytes_read: u64,
    bytes_written: u64,
    records_read: u64,
    records_retained: u64,
    tombstones_removed: u64,
    segments_before: usize,
    segments_after: usize,
    end_offset: i64,
}

#[pymethods]
impl PyCleanStats {
    fn __repr__(&self) -> String {
        format!(
            "CleanStats(end_offset={}, bytes_read={}, bytes_written={}, records_retained={}/{})",
            self.end_offset, self.bytes_read, self.bytes_written, self.records_retained, self.records_read
        )
    }
}

impl From<cleaner::CleanStats> for PyCleanStats {
    fn from(c: cleaner::CleanStats) -> Self {
        PyCleanStats {
            bytes_read: c.bytes_read,
            bytes_written: c.bytes_written,
            records_read: c.records_read,
            records_retained: c.records_retained,
            tombstones_removed: c.tombstones_removed,
            segments_before: c.segments_before,
            segments_after: c.segments_after,
            end_offset: c.end_offset,
        }
    }
}

/// One segment's description.
#[pyclass(name = "SegmentInfo", module = "gregor_native._native", frozen, get_all)]
struct PySegmentInfo {
    base_offset: i64,
    next_offset: i64,
    size_bytes: u64,
    largest_timestamp: i64,
    created_ms: i64,
    log_path: String,
    offset_index_entries: usize,
    time_index_entries: usize,
}

#[pymethods]
impl PySegmentInfo {
    fn __repr__(&self) -> String {
        format!("SegmentInfo(base_offset={}, next_offset={}, size_bytes={})", self.base_offset, self.next_offset, self.size_bytes)
    }
}

impl From<SegmentInfo> for PySegmentInfo {
    fn from(s: SegmentInfo) -> Self {
        PySegmentInfo {
            base_offset: s.base_offset,
            next_offset: s.next_offset,
            size_bytes: s.size_bytes,
            largest_timestamp: s.largest_timestamp,
            created_ms: s.created_ms,
            log_path: s.log_path,
            offset_index_entries: s.offset_index_entries,
            time_index_entries: s.time_index_entries,
        }
    }
}

// ------------------------------------------------------------ file slices

/// A byte range of one segment file holding whole batches; keeps the file open.
#[pyclass(name = "FileSlice", module = "gregor_native._native", frozen)]
struct PyFileSlice(Slice);

impl PyFileSlice {
    fn read_bytes<'py>(py: Python<'py>, s: &Slice) -> PyResult<Bound<'py, PyBytes>> {
        let Some(file) = &s.file else {
            return Ok(PyBytes::new(py, b""));
        };
        PyBytes::new_with(py, s.length as usize, |buf| {
            py.detach(|| file.read_exact_at(buf, s.position)).map_err(PyErr::from)
        })
    }
}

#[pymethods]
impl PyFileSlice {
    #[getter]
    fn length(&self) -> u64 { self.0.length }
    #[getter]
    fn position(&self) -> u64 { self.0.position }
    #[getter]
    fn start_offset(&self) -> i64 { self.0.start_offset }

    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        Self::read_bytes(py, &self.0)
    }

    #[pyo3(signature = (fd, prefix = b"".as_slice(), timeout_ms = -1),
           text_signature = "($self, fd, prefix=b'', timeout_ms=-1)")]
    fn send_to(&self, py: Python<'_>, fd: i32, prefix: &[u8], timeout_ms: i32) -> PyResult<u64> {
        let s = &self.0;
        py.detach(|| match &s.file {
            Some(f) => sendfile::send_range(fd, prefix, f, s.position, s.length, timeout_ms),
            None => sendfile::write_all_fd(fd, prefix, timeout_ms).map(|_| 0),
        })
        .map_err(PyErr::from)
    }

    fn __len__(&self) -> usize {
        self.0.length as usize
    }

    fn __repr__(&self) -> String {
        format!("FileSlice(start_offset={}, position={}, length={})", self.0.start_offset, self.0.position, self.0.length)
    }
}

// ------------------------------------------------------------ the partition log

/// The log behind its Mutex, plus the counters Python reads most (log end,
/// log start, size) mirrored in atomics. Every operation publishes them before
/// it releases the lock, so they can be read without the lock: a reader never
/// waits behind an fsync (flush) or an unlink (retention) in progress.
pub(crate) struct LogCell {
    inner: Mutex<Option<log::Log>>,
    open: AtomicBool,
    log_end_offset: AtomicI64,
    log_start_offset: AtomicI64,
    size_bytes: AtomicU64,
    recovery_point: AtomicI64,
    active_base: AtomicI64,
}

impl LogCell {
    pub(crate) fn new(log: log::Log) -> Self {
        let cell = LogCell {
            inner: Mutex::new(None),
            open: AtomicBool::new(true),
            log_end_offset: AtomicI64::new(0),
            log_start_offset: AtomicI64::new(0),
            size_bytes: AtomicU64::new(0),
            recovery_point: AtomicI64::new(0),
            active_base: AtomicI64::new(0),
        };
        cell.publish(&log);
        *cell.guard() = Some(log);
        cell
    }

    fn guard(&self) -> MutexGuard<'_, Option<log::Log>> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn publish(&self, log: &log::Log) {
        self.log_end_offset.store(log.log_end_offset(), Ordering::Release);
        self.log_start_offset.store(log.log_start_offset(), Ordering::Release);
        self.size_bytes.store(log.size_bytes(), Ordering::Release);
        self.recovery_point.store(log.recovery_point(), Ordering::Release);
        self.active_base.store(log.active().base_offset, Ordering::Release);
    }

    /// Runs `f` on the open log under the lock, then publishes the counters
    /// (also after an error: a failed operation may have changed the log).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut log::Log) -> NResult<T>) -> NResult<T> {
        let mut g = self.guard();
        let log = g.as_mut().ok_or(Error::Closed)?;
        let r = f(log);
        self.publish(log);
        r
    }

    /// Takes the log out (close, delete); later calls see Closed.
    pub(crate) fn take(&self) -> Option<log::Log> {
        let mut g = self.guard();
        self.open.store(false, Ordering::Release);
        g.take()
    }

    fn read(&self, v: &AtomicI64) -> NResult<i64> {
        if !self.open.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(v.load(Ordering::Acquire))
    }

    /// Lock-free reads of the mirrored counters.
    pub(crate) fn log_end_offset(&self) -> NResult<i64> {
        self.read(&self.log_end_offset)
    }
    pub(crate) fn log_start_offset(&self) -> NResult<i64> {
        self.read(&self.log_start_offset)
    }
    pub(crate) fn recovery_point(&self) -> NResult<i64> {
        self.read(&self.recovery_point)
    }
    /// Sealed segments hold data not yet fsynced (a roll happened since the last flush).
    pub(crate) fn rolled_unflushed(&self) -> NResult<bool> {
        Ok(self.read(&self.recovery_point)? < self.read(&self.active_base)?)
    }
    pub(crate) fn size_bytes(&self) -> NResult<u64> {
        if !self.open.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(self.size_bytes.load(Ordering::Acquire))
    }
}

/// One partition's log. Concurrency: one internal Mutex serialises every
/// operation; the GIL is released while it is held, and slices do their I/O
/// without it. log_end_offset, log_start_offset and size_bytes are read from
/// atomics without the Mutex, so they never wait behind an fsync or unlink.
#[pyclass(name = "Log", module = "gregor_native._native")]
struct PyLog {
    dir: PathBuf,
    cell: LogCell,
}

impl PyLog {
    /// Runs `f` on the open log with the thread detached from Python.
    fn with<T: Send>(&self, py: Python<'_>, f: impl FnOnce(&mut log::Log) -> NResult<T> + Send) -> PyResult<T> {
        py.detach(|| self.cell.with(f)).map_err(to_py)
    }
}

fn now_or_wall(now_ms: Option<i64>) -> i64 {
    now_ms.unwrap_or_else(wall_clock_ms)
}

#[pymethods]
impl PyLog {
    #[new]
    #[pyo3(signature = (dir, config, now_ms = None))]
    fn new(py: Python<'_>, dir: PathBuf, config: PyRef<'_, PyLogConfig>, now_ms: Option<i64>) -> PyResult<Self> {
        let cfg = config.to_config();
        let log = py.detach(|| log::Log::open(&dir, cfg, now_or_wall(now_ms))).map_err(to_py)?;
        Ok(PyLog { dir, cell: LogCell::new(log) })
    }

    #[getter]
    fn dir(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }
    #[getter]
    fn config(&self, py: Python<'_>) -> PyResult<PyLogConfig> {
        self.with(py, |l| Ok(l.config())).map(PyLogConfig::from_config)
    }
    fn update_config(&self, py: Python<'_>, config: PyRef<'_, PyLogConfig>) -> PyResult<()> {
        let cfg = config.to_config();
        self.with(py, |l| {
            l.update_config(cfg);
            Ok(())
        })
    }
    #[getter]
    fn log_start_offset(&self) -> PyResult<i64> {
        self.cell.log_start_offset().map_err(to_py)
    }
    #[getter]
    fn log_end_offset(&self) -> PyResult<i64> {
        self.cell.log_end_offset().map_err(to_py)
    }
    #[getter]
    fn recovery_point(&self) -> PyResult<i64> {
        self.cell.recovery_point().map_err(to_py)
    }
    #[getter]
    fn rolled_unflushed(&self) -> PyResult<bool> {
        self.cell.rolled_unflushed().map_err(to_py)
    }
    #[getter]
    fn size_bytes(&self) -> PyResult<u64> {
        self.cell.size_bytes().map_err(to_py)
    }
    #[getter]
    fn num_segments(&self, py: Python<'_>) -> PyResult<usize> {
        self.with(py, |l| Ok(l.num_segments()))
    }
    #[getter]
    fn recovered_bytes_truncated(&self, py: Python<'_>) -> PyResult<u64> {
        self.with(py, |l| Ok(l.recovered_bytes_truncated()))
    }
    fn segments(&self, py: Python<'_>) -> PyResult<Vec<PySegmentInfo>> {
        let infos = self.with(py, |l| Ok(l.segments_info()))?;
        Ok(infos.into_iter().map(PySegmentInfo::from).collect())
    }

    #[pyo3(signature = (data, leader_epoch, now_ms = None))]
    fn append_as_leader(&self, py: Python<'_>, data: &[u8], leader_epoch: i32, now_ms: Option<i64>) -> PyResult<PyAppendInfo> {
        self.with(py, |l| l.append_as_leader(data, leader_epoch, now_or_wall(now_ms))).map(Into::into)
    }

    #[pyo3(signature = (data, now_ms = None))]
    fn append_as_follower(&self, py: Python<'_>, data: &[u8], now_ms: Option<i64>) -> PyResult<PyAppendInfo> {
        self.with(py, |l| l.append_as_follower(data, now_or_wall(now_ms))).map(Into::into)
    }

    #[pyo3(signature = (start_offset, max_bytes, max_offset = None, min_one_batch = true))]
    fn read_slice(&self, py: Python<'_>, start_offset: i64, max_bytes: i64, max_offset: Option<i64>, min_one_batch: bool) -> PyResult<PyFileSlice> {
        let max_bytes = max_bytes.max(0) as u64;
        self.with(py, |l| l.read_slice(start_offset, max_bytes, max_offset, min_one_batch)).map(PyFileSlice)
    }

    #[pyo3(signature = (start_offset, max_bytes, max_offset = None, min_one_batch = true))]
    fn read<'py>(&self, py: Python<'py>, start_offset: i64, max_bytes: i64, max_offset: Option<i64>, min_one_batch: bool) -> PyResult<Bound<'py, PyBytes>> {
        let slice = self.read_slice(py, start_offset, max_bytes, max_offset, min_one_batch)?;
        PyFileSlice::read_bytes(py, &slice.0)
    }

    fn offset_for_timestamp(&self, py: Python<'_>, timestamp_ms: i64) -> PyResult<Option<(i64, i64)>> {
        self.with(py, |l| l.offset_for_timestamp(timestamp_ms))
    }

    #[pyo3(signature = (now_ms = None))]
    fn roll(&self, py: Python<'_>, now_ms: Option<i64>) -> PyResult<i64> {
        self.with(py, |l| l.roll(now_or_wall(now_ms)))
    }

    fn truncate_to(&self, py: Python<'_>, offset: i64) -> PyResult<bool> {
        self.with(py, |l| l.truncate_to(offset, wall_clock_ms()))
    }

    fn truncate_fully_and_start_at(&self, py: Python<'_>, offset: i64) -> PyResult<()> {
        self.with(py, |l| l.truncate_fully_and_start_at(offset, wall_clock_ms()))
    }

    #[pyo3(signature = (now_ms = None, *, upper_bound_offset = None))]
    #[pyo3(text_signature = "($self, now_ms=None, *, upper_bound_offset=None)")]
    fn delete_old_segments(&self, py: Python<'_>, now_ms: Option<i64>, upper_bound_offset: Option<i64>) -> PyResult<usize> {
        self.with(py, |l| l.delete_old_segments_below(now_or_wall(now_ms), upper_bound_offset))
    }

    /// The cleanable range and dirty ratio (nothing at or above
    /// `upper_bound_offset`, the high watermark, is cleanable).
    #[pyo3(signature = (now_ms = None, *, upper_bound_offset = None, min_compaction_lag_ms = 0))]
    #[pyo3(text_signature = "($self, now_ms=None, *, upper_bound_offset=None, min_compaction_lag_ms=0)")]
    fn cleanable(&self, py: Python<'_>, now_ms: Option<i64>, upper_bound_offset: Option<i64>, min_compaction_lag_ms: i64) -> PyResult<PyCleanableInfo> {
        let c = self.with(py, |l| l.cleanable(now_or_wall(now_ms), upper_bound_offset.unwrap_or(i64::MAX), min_compaction_lag_ms))?;
        Ok(PyCleanableInfo {
            first_dirty_offset: c.first_dirty_offset,
            first_uncleanable_offset: c.first_uncleanable_offset,
            clean_bytes: c.clean_bytes,
            dirty_bytes: c.dirty_bytes,
            dirty_ratio: c.dirty_ratio,
            first_dirty_timestamp: c.first_dirty_timestamp,
            next_delete_horizon_ms: c.next_delete_horizon_ms,
        })
    }

    /// Compacts the log (see `cleaner.rs`): the log lock is held only to
    /// take the snapshot and to swap the cleaned segments in; the offset map
    /// and the rewrite run unlocked with the GIL released.
    #[pyo3(signature = (now_ms = None, *, upper_bound_offset = None, delete_retention_ms = 86_400_000, min_compaction_lag_ms = 0, dedupe_buffer_size = 134_217_728))]
    #[pyo3(text_signature = "($self, now_ms=None, *, upper_bound_offset=None, delete_retention_ms=86400000, min_compaction_lag_ms=0, dedupe_buffer_size=134217728)")]
    fn clean(
        &self,
        py: Python<'_>,
        now_ms: Option<i64>,
        upper_bound_offset: Option<i64>,
        delete_retention_ms: i64,
        min_compaction_lag_ms: i64,
        dedupe_buffer_size: i64,
    ) -> PyResult<PyCleanStats> {
        let cfg = cleaner::CleanConfig {
            now_ms: now_or_wall(now_ms),
            upper_bound_offset: upper_bound_offset.unwrap_or(i64::MAX),
            delete_retention_ms,
            min_compaction_lag_ms,
            dedupe_buffer_size,
        };
        let cell = &self.cell;
        py.detach(|| -> NResult<cleaner::CleanStats> {
            let Some(plan) = cell.with(|l| l.clean_plan(cfg))? else {
                return Ok(cleaner::CleanStats { end_offset: -1, ..Default::default() });
            };
            let built = match cleaner::build(&plan) {
                Ok(b) => b,
                Err(e) => {
                    cleaner::discard_cleaned(&plan);
                    return Err(e);
                }
            };
            cell.with(|l| l.clean_swap(&plan, built))
        })
        .map(Into::into)
        .map_err(to_py)
    }

    fn maybe_increment_log_start_offset(&self, py: Python<'_>, offset: i64) -> PyResult<bool> {
        self.with(py, |l| l.maybe_increment_log_start_offset(offset))
    }

    #[pyo3(signature = (now_ms = None))]
    fn maybe_flush(&self, py: Python<'_>, now_ms: Option<i64>) -> PyResult<bool> {
        self.with(py, |l| l.maybe_flush(now_or_wall(now_ms)))
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |l| l.flush_at(wall_clock_ms()))
    }

    /// Kafka's flush of the segments a roll sealed: fdatasync them (and their indexes and the directory)
    /// with neither the log lock nor the GIL held, then move the recovery point to the active segment's
    /// base. False if there was nothing to flush or the log changed below that base meanwhile.
    fn flush_rolled(&self, py: Python<'_>) -> PyResult<bool> {
        let cell = &self.cell;
        py.detach(|| -> NResult<bool> {
            let Some(plan) = cell.with(|l| Ok(l.rolled_flush_plan()))? else {
                return Ok(false);
            };
            log::sync_rolled(&plan)?;
            cell.with(|l| Ok(l.finish_rolled_flush(&plan)))
        })
        .map_err(to_py)
    }

    /// Idempotent: closing a closed log does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| match self.cell.take() {
            Some(mut log) => log.close(),
            None => Ok(()),
        })
        .map_err(to_py)
    }

    fn delete(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| match self.cell.take() {
            Some(log) => log.delete(),
            None => match std::fs::remove_dir_all(&self.dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            },
        })
        .map_err(to_py)
    }

    /// Indexes an aborted transaction (its ABORT marker at `last_offset` is
    /// already in the log) in the marker's segment's `.txnindex`; False if it
    /// was indexed before.
    fn append_aborted_txn(&self, py: Python<'_>, producer_id: i64, first_offset: i64, last_offset: i64, last_stable_offset: i64) -> PyResult<bool> {
        let txn = txnindex::AbortedTxn { producer_id, first_offset, last_offset, last_stable_offset };
        self.with(py, |l| l.append_aborted_txn(txn))
    }

    /// (producer id, first offset) of the aborted transactions overlapping
    /// [fetch_offset, upper_offset): what a read_committed fetch returns.
    fn aborted_txns(&self, py: Python<'_>, fetch_offset: i64, upper_offset: i64) -> PyResult<Vec<(i64, i64)>> {
        let found = self.with(py, |l| Ok(l.collect_aborted_txns(fetch_offset, upper_offset)))?;
        Ok(found.into_iter().map(|t| (t.producer_id, t.first_offset)).collect())
    }

    fn latest_epoch(&self, py: Python<'_>) -> PyResult<Option<i32>> {
        self.with(py, |l| Ok(l.epochs().latest_epoch()))
    }
    fn epoch_entries(&self, py: Python<'_>) -> PyResult<Vec<(i32, i64)>> {
        self.with(py, |l| Ok(l.epochs().entries().to_vec()))
    }
    fn assign_epoch_start_offset(&self, py: Python<'_>, epoch: i32, start_offset: i64) -> PyResult<()> {
        // Not an append: nothing in the batches would bring it back after a
        // crash, so it is written at once, as before.
        self.with(py, |l| {
            l.epochs_mut().assign(epoch, start_offset)?;
            l.epochs_mut().flush().map(|_| ())
        })
    }
    fn end_offset_for_epoch(&self, py: Python<'_>, epoch: i32) -> PyResult<(i32, i64)> {
        self.with(py, |l| Ok(l.epochs().end_offset_for(epoch, l.log_end_offset())))
    }

    fn __repr__(&self) -> String {
        format!("Log({:?})", self.dir)
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NativeError", py.get_type::<NativeError>())?;
    m.add("CorruptRecordError", py.get_type::<CorruptRecordError>())?;
    m.add("InvalidRecordError", py.get_type::<InvalidRecordError>())?;
    m.add("RecordTooLargeError", py.get_type::<RecordTooLargeError>())?;
    m.add("OffsetOutOfRangeError", py.get_type::<OffsetOutOfRangeError>())?;
    m.add("LogClosedError", py.get_type::<LogClosedError>())?;
    m.add("BATCH_HEADER_SIZE", batch::BATCH_HEADER_SIZE)?;
    m.add("RECORD_BATCH_OVERHEAD", batch::BATCH_HEADER_SIZE)?;
    m.add("MAGIC_V2", batch::MAGIC_V2)?;
    m.add("COMPRESSION_NONE", 0)?;
    m.add("COMPRESSION_GZIP", 1)?;
    m.add("COMPRESSION_SNAPPY", 2)?;
    m.add("COMPRESSION_LZ4", 3)?;
    m.add("COMPRESSION_ZSTD", 4)?;
    m.add("COMPRESSION_CODEC_MASK", batch::COMPRESSION_CODEC_MASK)?;
    m.add("TIMESTAMP_TYPE_MASK", batch::TIMESTAMP_TYPE_MASK)?;
    m.add("TRANSACTIONAL_FLAG_MASK", batch::TRANSACTIONAL_FLAG_MASK)?;
    m.add("CONTROL_FLAG_MASK", batch::CONTROL_FLAG_MASK)?;
    m.add_function(wrap_pyfunction!(py_crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(parse_batches, m)?)?;
    m.add_function(wrap_pyfunction!(encode_records, m)?)?;
    m.add_function(wrap_pyfunction!(encode_batch, m)?)?;
    m.add_function(wrap_pyfunction!(decode_records, m)?)?;
    m.add_function(wrap_pyfunction!(decode_rows, m)?)?;
    m.add_function(wrap_pyfunction!(decode_columns, m)?)?;
    m.add_function(wrap_pyfunction!(build_batch, m)?)?;
    m.add_function(wrap_pyfunction!(recompress_batches, m)?)?;
    m.add_class::<PyBatchHeader>()?;
    m.add_class::<PyLogConfig>()?;
    m.add_class::<PyAppendInfo>()?;
    m.add_class::<PySegmentInfo>()?;
    m.add_class::<PyCleanableInfo>()?;
    m.add_class::<PyCleanStats>()?;
    m.add_class::<PyFileSlice>()?;
    m.add_class::<PyLog>()?;
    Ok(())
}
