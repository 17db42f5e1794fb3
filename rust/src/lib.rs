//! The extension module `syvain_training_data._native`: registration only.

use pyo3::prelude::*;

pub(crate) mod classify;
pub(crate) mod client;
pub mod codec;
mod counters;
mod download;
pub mod error;
pub(crate) mod ops;
pub(crate) mod policy;
mod rows;
mod runtime;
pub mod source;
pub(crate) mod store;
mod stream;
mod upload;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::NativeStorage>()?;
    m.add_class::<client::ObjectStream>()?;
    m.add_class::<counters::StreamCounters>()?;
    m.add_function(wrap_pyfunction!(client::set_storage_policy, m)?)?;
    m.add_function(wrap_pyfunction!(client::get_storage_policy, m)?)?;
    m.add("READAHEAD_BYTES", stream::READAHEAD_BYTES)?;
    codec::register(m)?;
    rows::register(m)?;
    upload::register(m)?;
    download::register(m)?;
    Ok(())
}
