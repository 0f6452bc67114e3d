//! The engine's error type; lib.rs maps each variant to a Python exception class.

use std::io;

/// Every failure the pure modules report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// CRC mismatch, bad length, truncated batch, bad varint (CORRUPT_MESSAGE).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Well formed but not acceptable (INVALID_RECORD).
    #[error("invalid record: {0}")]
    Invalid(String),
    /// Larger than max.message.bytes (MESSAGE_TOO_LARGE).
    #[error("record too large: {0}")]
    TooLarge(String),
    /// Offset outside [log_start_offset, log_end_offset] (OFFSET_OUT_OF_RANGE).
    #[error("offset out of range: {0}")]
    OutOfRange(String),
    /// The log was closed or deleted.
    #[error("log is closed")]
    Closed,
    #[error(transparent)]
    Io(#[from] io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

pub fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

pub fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(msg.into()))
}
