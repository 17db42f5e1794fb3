//! `StreamCounters`: the core's stream counters as a Python context manager.
//!
//! Entered around the call that opens a stream, it counts every stream that thread opens
//! meanwhile, for the stream's whole life, reconnections included.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syvain_core::counters::{self, Counters, RetryCause};

/// Counters of the streams opened on this thread while it is entered (``with counters: ...``).
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct StreamCounters {
    counters: Arc<Counters>,
}

#[pymethods]
impl StreamCounters {
    #[new]
    fn new() -> Self {
        StreamCounters {
            counters: Arc::default(),
        }
    }

    /// The counters entered on this thread (innermost), for a helper thread to enter too, so
    /// the streams it opens for the same read count alike; None when none is entered.
    #[staticmethod]
    fn entered() -> Option<StreamCounters> {
        counters::entered().map(|counters| StreamCounters { counters })
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        counters::enter(slf.counters.clone());
        slf
    }

    fn __exit__(
        &self,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) {
        counters::exit(&self.counters);
    }

    /// Streams opened.
    #[getter]
    fn streams(&self) -> u64 {
        self.counters.streams()
    }

    /// Bytes the streams handed to their readers.
    #[getter]
    fn bytes(&self) -> u64 {
        self.counters.bytes()
    }

    /// Retries by cause: connection, timeout, status, ended_early, other (every key present).
    #[getter]
    fn retries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let retries = PyDict::new(py);
        for cause in RetryCause::ALL {
            retries.set_item(cause.name(), self.counters.retries(cause))?;
        }
        Ok(retries)
    }

    fn __repr__(&self) -> String {
        format!(
            "StreamCounters(streams={}, bytes={})",
            self.streams(),
            self.bytes()
        )
    }
}
