//! `ShardEncoder`: records -> deterministic shard bytes, handed back as they are produced so a
//! whole shard is never held. Records are serialized under the GIL, compressed without it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::gzip::GzipWriter;
use super::{json_write, msgpack_write, ShardFormat, MAX_FRAME_BYTES};
use crate::error::{NativeError, NativeResult};

/// The Zstandard level of msgpack.zstf; the content size goes in each frame header, with no
/// checksum and no dictionary (the zstd defaults for one-shot compression).
const ZSTD_LEVEL: i32 = 3;

enum Writer {
    MsgpackZstf(zstd::bulk::Compressor<'static>),
    JsonlGz(GzipWriter),
}

/// Writes one shard. Each `encode` call is all or nothing: on a ValueError no byte of that
/// call is produced and the encoder is unchanged.
#[pyclass(module = "syvain_training_data._native")]
pub struct ShardEncoder {
    format: ShardFormat,
    writer: Writer,
    records: u64,
    bytes_written: u64,
    finished: bool,
}

impl ShardEncoder {
    /// Serializes every record first (GIL held), so a bad record leaves nothing behind.
    fn serialize(&self, records: &Bound<'_, PyAny>) -> NativeResult<Vec<Vec<u8>>> {
        let mut encoded = Vec::new();
        for (index, record) in records.try_iter()?.enumerate() {
            let record = record?;
            let mut out = Vec::new();
            let written = match self.format {
                ShardFormat::MsgpackZstf => msgpack_write::write_record(&record, &mut out),
                ShardFormat::JsonlGz => {
                    json_write::write_record(&record, &mut out).map(|()| out.push(b'\n'))
                }
            };
            written.map_err(|err| match err {
                NativeError::Encode(problem) => NativeError::Encode(format!(
                    "Cannot write {} record {index}: {problem}",
                    self.format.name()
                )),
                other => other,
            })?;
            encoded.push(out);
        }
        Ok(encoded)
    }
}

impl Writer {
    /// Compresses serialized records; runs without the GIL.
    fn compress(&mut self, encoded: &[Vec<u8>]) -> NativeResult<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            Writer::MsgpackZstf(compressor) => {
                for (index, payload) in encoded.iter().enumerate() {
                    let frame = compressor.compress(payload).map_err(|e| {
                        NativeError::Encode(format!("zstd compression failed: {e}"))
                    })?;
                    if frame.len() as u64 > MAX_FRAME_BYTES {
                        return Err(NativeError::Encode(format!(
                            "Cannot write msgpack.zstf record {index}: its compressed frame is \
                             larger than 256 MiB"
                        )));
                    }
                    out.extend_from_slice(&(frame.len() as u64).to_be_bytes());
                    out.extend_from_slice(&frame);
                }
            }
            Writer::JsonlGz(gzip) => {
                // Line by line: zlib's output does not depend on how its input is split.
                for line in encoded {
                    gzip.write(line, &mut out).map_err(NativeError::Encode)?;
                }
            }
        }
        Ok(out)
    }
}

#[pymethods]
impl ShardEncoder {
    /// Errors: ValueError for a format other than "msgpack.zstf" or "jsonl.gz".
    #[new]
    fn new(data_format: &str) -> PyResult<Self> {
        let format = ShardFormat::parse(data_format)?;
        let writer = match format {
            ShardFormat::MsgpackZstf => Writer::MsgpackZstf(
                zstd::bulk::Compressor::new(ZSTD_LEVEL)
                    .map_err(|e| PyValueError::new_err(format!("zstd setup failed: {e}")))?,
            ),
            ShardFormat::JsonlGz => Writer::JsonlGz(GzipWriter::new()),
        };
        Ok(Self {
            format,
            writer,
            records: 0,
            bytes_written: 0,
            finished: false,
        })
    }

    /// Encodes `records` (mappings) and returns the shard bytes this call produced (maybe none:
    /// gzip holds back output until it has enough).
    ///
    /// Errors: ValueError for a record either format cannot represent, or after `finish`.
    fn encode<'py>(
        &mut self,
        py: Python<'py>,
        records: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        if self.finished {
            return Err(PyValueError::new_err(
                "ShardEncoder.encode called after finish",
            ));
        }
        let encoded = self.serialize(records)?;
        let count = encoded.len() as u64;
        let writer = &mut self.writer;
        let out = py.allow_threads(move || writer.compress(&encoded))?;
        self.records += count;
        self.bytes_written += out.len() as u64;
        Ok(PyBytes::new(py, &out))
    }

    /// Ends the shard and returns its last bytes (the gzip trailer; nothing for msgpack.zstf).
    /// Calling it again returns b"".
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        if !self.finished {
            if let Writer::JsonlGz(gzip) = &mut self.writer {
                py.allow_threads(|| gzip.finish(&mut out))
                    .map_err(PyValueError::new_err)?;
            }
            self.finished = true;
        }
        self.bytes_written += out.len() as u64;
        Ok(PyBytes::new(py, &out))
    }

    /// Records encoded so far.
    #[getter]
    fn records(&self) -> u64 {
        self.records
    }

    /// Bytes returned by `encode` and `finish` so far: the shard's size once finished.
    #[getter]
    fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    #[getter]
    fn data_format(&self) -> &'static str {
        self.format.name()
    }
}
