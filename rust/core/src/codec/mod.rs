//! Shard codecs: msgpack.zstf and jsonl.gz framing, decoding and encoding (SPEC section 3).
//!
//! Framing, decompression and validation here (fuzzed without Python); decoder threads that
//! hand on validated payloads or lines ([`decoder`]) or Arrow batches ([`columnar`]); the
//! compressor pipeline of the encoders ([`compress`]). The binding turns payloads into Python
//! objects and Python records into payloads.

use crate::error::{NativeError, NativeResult};

mod chunks;
pub mod columnar;
pub mod compress;
pub mod decoder;
pub mod gzip;
pub mod gzip_points;
pub mod lines;
pub mod msgpack;
pub mod parquet_read;
pub mod raw_inflate;
pub mod zstf;

/// A zstd frame (its 8-byte length prefix excluded) may hold at most this many bytes.
pub const MAX_FRAME_BYTES: u64 = 256 << 20;
/// A decompressed MessagePack payload may hold at most this many bytes.
pub const MAX_PAYLOAD_BYTES: u64 = 1 << 30;
/// A jsonl.gz line (its "\n" excluded) may hold at most this many bytes.
pub const MAX_LINE_BYTES: u64 = 1 << 30;
/// JSON objects and arrays may nest this deep (the record is level 1), as msgpack.zstf.
pub const MAX_JSON_DEPTH: usize = 1000;

/// The two shard formats with native codecs (parquet goes through pyarrow).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardFormat {
    MsgpackZstf,
    JsonlGz,
}

impl ShardFormat {
    /// Parses a manifest `data_format`; other names are a ValueError.
    pub fn parse(name: &str) -> NativeResult<Self> {
        match name {
            "msgpack.zstf" => Ok(Self::MsgpackZstf),
            "jsonl.gz" => Ok(Self::JsonlGz),
            other => Err(NativeError::Config(format!(
                "Unsupported native shard format {other:?}; expected \"msgpack.zstf\" or \"jsonl.gz\""
            ))),
        }
    }

    /// The format of a shard the native readers decode; other names are a ValueError naming
    /// the shard.
    pub fn of_shard(uri: &str, name: &str) -> NativeResult<Self> {
        Self::parse(name).map_err(|_| {
            NativeError::Config(format!(
                "{uri}: the native reader decodes msgpack.zstf and jsonl.gz, not {name:?}"
            ))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::MsgpackZstf => "msgpack.zstf",
            Self::JsonlGz => "jsonl.gz",
        }
    }
}

/// Why the pure-Rust decoding core stopped: the shard's bytes are wrong, or the source failed.
#[derive(Debug)]
pub enum DecodeFailure {
    /// A reason such as "truncated compressed frame"; the caller adds format and URI.
    Shard(String),
    /// The byte source's own error (retry budget, changed object, ...), passed through as is.
    Source(NativeError),
}

impl DecodeFailure {
    pub fn shard(reason: impl Into<String>) -> Self {
        Self::Shard(reason.into())
    }

    pub fn into_native(self, format: ShardFormat, uri: &str) -> NativeError {
        match self {
            Self::Shard(reason) => shard_error(format, uri, reason),
            Self::Source(err) => err,
        }
    }
}

impl From<NativeError> for DecodeFailure {
    fn from(err: NativeError) -> Self {
        Self::Source(err)
    }
}

pub fn shard_error(format: ShardFormat, uri: &str, reason: impl Into<String>) -> NativeError {
    NativeError::Shard {
        format: format.name(),
        uri: uri.to_owned(),
        reason: reason.into(),
    }
}

/// The records `[start, stop)` of a shard that holds `declared` records.
///
/// A full range (`0..declared`) keeps every end check of SPEC 3 in the reader; a partial one
/// is checked by the decoder core, which counts the records it passes (skipped or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRange {
    pub start: u64,
    pub stop: u64,
    pub declared: u64,
}

impl RecordRange {
    pub fn full(declared: u64) -> Self {
        Self {
            start: 0,
            stop: declared,
            declared,
        }
    }

    /// `stop` defaults to `declared`; a ValueError unless `0 <= start <= stop <= declared`
    /// (signed, so a negative index from Python is that ValueError too).
    pub fn new(declared: u64, start: i64, stop: Option<i64>) -> NativeResult<Self> {
        let stop_or_all = stop.map_or(Ok(declared), u64::try_from);
        match (u64::try_from(start), stop_or_all) {
            (Ok(start), Ok(stop)) if start <= stop && stop <= declared => Ok(Self {
                start,
                stop,
                declared,
            }),
            _ => {
                let stop = stop.map_or(declared.to_string(), |stop| stop.to_string());
                Err(NativeError::Config(format!(
                    "Invalid record range start={start}, stop={stop} for a shard of \
                     {declared} records; expected 0 <= start <= stop <= {declared}"
                )))
            }
        }
    }

    /// Every record of the shard: the reader keeps today's full-read semantics.
    pub fn is_full(&self) -> bool {
        self.start == 0 && self.stop == self.declared
    }

    /// The range ends at the shard's last record, so the end of the object is checked too.
    pub fn reaches_end(&self) -> bool {
        self.stop == self.declared
    }

    /// Records the range holds.
    pub fn records(&self) -> u64 {
        self.stop - self.start
    }
}

pub fn found_more(declared: u64) -> String {
    format!("declared {declared} records but found more")
}

pub fn count_mismatch(declared: u64, yielded: u64) -> String {
    format!("declared {declared} records but yielded {yielded}")
}
