//! `ShardEncoder`: Python records -> deterministic shard bytes, handed back as they are
//! produced so a whole shard is never held.
//!
//! The records of one `encode` call are serialized here under the GIL (MessagePack or JSON
//! lines, byte for byte what msgspec and Python's json write), then the core's
//! `ShardCompressor` compresses them on its thread while Python carries on. Each call is all
//! or nothing: on a ValueError no byte of that call is produced and the encoder is unchanged.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::codec::compress::{Serialized, ShardCompressor};
use syvain_core::codec::ShardFormat;
use syvain_core::process_bound::ProcessBound;

use super::{json_write, msgpack_write};
use crate::caller::PythonCaller;
use crate::error::{BindingError, BindingResult};

/// Writes one shard.
#[pyclass(module = "syvain_training_data._native")]
pub struct ShardEncoder {
    /// Bound to this process: a forked child never joins the parent's compressor threads.
    compressor: ProcessBound<ShardCompressor>,
    format: ShardFormat,
    records: u64,
    bytes_written: u64,
}

impl ShardEncoder {
    fn compressor(&mut self) -> BindingResult<&mut ShardCompressor> {
        Ok(self.compressor.in_this_process("shard encoder")?)
    }

    /// Serializes every record first (GIL held), so a bad record leaves nothing behind.
    fn serialize(&mut self, records: &Bound<'_, PyAny>) -> BindingResult<Serialized> {
        let format = self.format;
        let mut batch = self.compressor()?.batch();
        for (index, record) in records.try_iter()?.enumerate() {
            let record = record?;
            let out = &mut batch.data;
            let start = out.len();
            let written = match format {
                ShardFormat::MsgpackZstf => msgpack_write::write_record(&record, out),
                ShardFormat::JsonlGz => {
                    json_write::write_record(&record, out).map(|()| out.push(b'\n'))
                }
            };
            if let Err(err) = written {
                let compressor = self.compressor()?;
                compressor.recycle(batch.data);
                return Err(match err {
                    BindingError::Core(err) => compressor.record_error(index, err).into(),
                    python => python,
                });
            }
            batch.end_record(start);
        }
        Ok(batch)
    }

    /// One bytes object of `chunks`, whose buffers go back to the pool. A bytes object the
    /// interpreter cannot allocate is its MemoryError (and the chunks are still recycled).
    fn hand_out<'py>(
        &mut self,
        py: Python<'py>,
        chunks: Vec<Vec<u8>>,
    ) -> BindingResult<Bound<'py, PyBytes>> {
        let total: usize = chunks.iter().map(Vec::len).sum();
        // `new_with` reports a failed allocation as the pending MemoryError; `PyBytes::new`
        // would panic on it.
        let bytes = PyBytes::new_with(py, total, |buffer| {
            let mut at = 0;
            for chunk in &chunks {
                buffer[at..at + chunk.len()].copy_from_slice(chunk);
                at += chunk.len();
            }
            Ok(())
        });
        let compressor = self.compressor()?;
        for chunk in chunks {
            compressor.recycle(chunk);
        }
        match &bytes {
            Ok(_) => self.bytes_written += total as u64,
            Err(_) => compressor.lose_output(),
        }
        Ok(bytes?)
    }
}

#[pymethods]
impl ShardEncoder {
    /// Errors: ValueError for a format other than "msgpack.zstf" or "jsonl.gz".
    #[new]
    fn new(data_format: &str) -> BindingResult<Self> {
        let format = ShardFormat::parse(data_format)?;
        Ok(Self {
            compressor: ProcessBound::new(ShardCompressor::new(format)?),
            format,
            records: 0,
            bytes_written: 0,
        })
    }

    /// Encodes `records` (mappings) and returns the shard bytes ready so far (maybe none: the
    /// compressor thread and gzip hold back output; `finish` returns the rest).
    ///
    /// Errors: ValueError for a record either format cannot represent, after `finish`, or
    /// when the compressor failed.
    fn encode<'py>(
        &mut self,
        py: Python<'py>,
        records: &Bound<'py, PyAny>,
    ) -> BindingResult<Bound<'py, PyBytes>> {
        self.compressor()?.check("encode")?;
        let batch = self.serialize(records)?;
        let count = batch.ends.len() as u64;
        self.compressor()?.submit(&PythonCaller(py), batch)?;
        self.records += count;
        let mut out = Vec::new();
        self.compressor()?.ready(&mut out)?;
        self.hand_out(py, out)
    }

    /// Waits for the compressor and returns the shard's remaining bytes (with the gzip
    /// trailer). Calling it again returns b"".
    fn finish<'py>(&mut self, py: Python<'py>) -> BindingResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        self.compressor()?.finish(&PythonCaller(py), &mut out)?;
        self.hand_out(py, out)
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
