//! Shard records to and from Python: the decoders' payloads become dicts ([`shard_reader`]) or
//! Arrow batches ([`shard_batches`]); Python records become payloads for the core's compressor
//! ([`shard_encoder`]).

use bytes::Bytes;
use pyo3::prelude::*;
use syvain_core::source::MemorySource;

pub mod arrow_batch;
pub mod gzip_points;
mod invalid_lines;
mod json_write;
mod key_cache;
mod msgpack_write;
pub mod parquet_batches;
mod py_build;
mod py_value;
pub mod shard_batches;
pub mod shard_encoder;
pub mod shard_reader;

/// Shard bytes held in memory as a source, cut into `chunk_size` pieces as a network stream
/// would deliver them (the `*_from_bytes` readers of tests and benchmarks).
fn memory_source(data: &[u8], chunk_size: Option<usize>) -> Box<MemorySource> {
    let chunk = chunk_size.unwrap_or(data.len()).max(1);
    let chunks: Vec<Bytes> = data.chunks(chunk).map(Bytes::copy_from_slice).collect();
    Box::new(MemorySource::new(chunks))
}

/// Registers the codec classes and functions on the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<shard_reader::ShardReader>()?;
    m.add_class::<shard_encoder::ShardEncoder>()?;
    m.add_class::<gzip_points::GzipAccessPoints>()?;
    m.add_class::<parquet_batches::ParquetBatchReader>()?;
    m.add_function(wrap_pyfunction!(shard_reader::shard_reader_from_bytes, m)?)?;
    shard_batches::register(m)?;
    Ok(())
}
