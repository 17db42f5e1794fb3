//! The extension module `syvain_training_data._native`: the Python binding of `syvain-core`.
//! Each module turns one concept's core calls into Python classes or functions; this file
//! only registers them.

use pyo3::prelude::*;

mod buffer_view;
mod caller;
mod codec;
mod counters;
mod credentials;
mod download;
mod error;
mod exiting;
mod object_stream;
mod order;
mod policy;
mod rows;
mod slot_states;
mod storage;
mod token_rows;
mod upload;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    syvain_core::warnings::set_sink(caller::log_warning);
    exiting::register(m)?;
    m.add_class::<storage::NativeStorage>()?;
    m.add_class::<object_stream::ObjectStream>()?;
    m.add_class::<counters::StreamCounters>()?;
    m.add_class::<slot_states::SlotStates>()?;
    m.add_class::<slot_states::HeldSlot>()?;
    m.add_function(wrap_pyfunction!(policy::set_storage_policy, m)?)?;
    m.add_function(wrap_pyfunction!(policy::get_storage_policy, m)?)?;
    m.add("READAHEAD_BYTES", syvain_core::stream::READAHEAD_BYTES)?;
    codec::register(m)?;
    rows::register(m)?;
    upload::register(m)?;
    download::register(m)?;
    order::register(m)?;
    token_rows::register(m)?;
    Ok(())
}
