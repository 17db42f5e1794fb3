//! Shard records to and from Python: the decoders' payloads become dicts ([`shard_reader`]) or
//! Arrow batches ([`shard_batches`]); Python records become payloads for the core's compressor
//! ([`shard_encoder`]).

use pyo3::prelude::*;

pub mod arrow_batch;
mod json_write;
mod key_cache;
mod msgpack_write;
mod py_build;
mod py_value;
pub mod shard_batches;
pub mod shard_encoder;
pub mod shard_reader;

/// Registers the codec classes and functions on the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<shard_reader::ShardReader>()?;
    m.add_class::<shard_encoder::ShardEncoder>()?;
    m.add_function(wrap_pyfunction!(shard_reader::shard_reader_from_bytes, m)?)?;
    shard_batches::register(m)?;
    Ok(())
}
