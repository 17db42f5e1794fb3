//! `ObjectStream`: chunks of one object from the core's resumable stream, for Python.

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::caller::next_chunk;
use syvain_core::error::NativeError;
use syvain_core::process_bound::ProcessBound;
use syvain_core::stream::StreamReader;

use crate::caller::PythonCaller;
use crate::error::BindingResult;

/// Chunks of one object, resumed across transient failures. Iterate for `bytes` chunks.
#[pyclass(module = "syvain_training_data._native")]
pub struct ObjectStream {
    /// Bound to this process: a forked child never touches the parent's stream.
    reader: Option<ProcessBound<StreamReader>>,
    /// The unread tail of a chunk that `read(size)` split.
    pending: Option<Bytes>,
}

impl ObjectStream {
    pub fn new(reader: StreamReader) -> Self {
        Self {
            reader: Some(ProcessBound::new(reader)),
            pending: None,
        }
    }

    fn reader(&mut self) -> Result<&mut StreamReader, NativeError> {
        self.reader
            .as_mut()
            .ok_or_else(|| NativeError::Config("the stream is closed".into()))?
            .in_this_process("stream")
    }
}

#[pymethods]
impl ObjectStream {
    /// The next chunk, or None at the end of the object.
    fn read_chunk<'py>(&mut self, py: Python<'py>) -> BindingResult<Option<Bound<'py, PyBytes>>> {
        if let Some(chunk) = self.pending.take() {
            return Ok(Some(PyBytes::new(py, &chunk)));
        }
        let reader = self.reader()?;
        Ok(next_chunk(&PythonCaller(py), reader)?.map(|chunk| PyBytes::new(py, &chunk)))
    }

    /// Up to `size` bytes (all the rest when negative); b"" at the end.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&mut self, py: Python<'py>, size: i64) -> BindingResult<Bound<'py, PyBytes>> {
        let wanted = usize::try_from(size).unwrap_or(usize::MAX);
        let mut out: Vec<u8> = Vec::new();
        while out.len() < wanted {
            let chunk = match self.pending.take() {
                Some(chunk) => chunk,
                None => match next_chunk(&PythonCaller(py), self.reader()?)? {
                    Some(chunk) => chunk,
                    None => break,
                },
            };
            let take = chunk.len().min(wanted - out.len());
            out.extend_from_slice(&chunk[..take]);
            if take < chunk.len() {
                self.pending = Some(chunk.slice(take..));
            }
        }
        Ok(PyBytes::new(py, &out))
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> BindingResult<Option<Bound<'py, PyBytes>>> {
        self.read_chunk(py)
    }

    /// Stops the background download and frees its buffers.
    fn close(&mut self) {
        self.reader = None;
        self.pending = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) {
        self.close();
    }

    #[getter]
    fn uri(&self) -> Option<String> {
        self.reader
            .as_ref()
            .and_then(ProcessBound::get)
            .map(|r| r.uri().to_string())
    }

    #[getter]
    fn size(&self) -> Option<u64> {
        self.reader
            .as_ref()
            .and_then(ProcessBound::get)
            .map(|r| r.size())
    }

    /// Bytes handed to the consumer so far.
    #[getter]
    fn position(&self) -> Option<u64> {
        self.reader
            .as_ref()
            .and_then(ProcessBound::get)
            .map(|r| r.position())
    }

    /// Bytes downloaded ahead of the consumer, bounded by its readahead_bytes.
    #[getter]
    fn buffered_bytes(&self) -> Option<usize> {
        self.reader
            .as_ref()
            .and_then(ProcessBound::get)
            .map(|r| r.buffered_bytes())
    }

    /// Transient failures the stream resumed from so far.
    #[getter]
    fn resumes(&self) -> Option<u32> {
        self.reader
            .as_ref()
            .and_then(ProcessBound::get)
            .map(|r| r.resumes())
    }
}
