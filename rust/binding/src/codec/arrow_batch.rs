//! The Python face of a built batch: the Arrow PyCapsule interface (pyarrow, polars, arro3 and
//! nanoarrow take it without a copy) and, for torch and numpy without pyarrow, the buffers of
//! an integer-list column through the buffer protocol.

use std::ffi::{c_int, CStr};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch, StructArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use pyo3_arrow::error::PyArrowResult;
use pyo3_arrow::ffi::{
    to_array_pycapsules, to_schema_pycapsule, to_stream_pycapsule, ArrayIterator,
};

use crate::buffer_view::{fill_view, OneDimension};

/// One record batch of a shard.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct ShardBatch {
    batch: RecordBatch,
}

impl ShardBatch {
    pub fn new(batch: RecordBatch) -> Self {
        Self { batch }
    }

    /// The batch as one struct array (what the Arrow C interface exports for a record batch).
    fn as_struct(&self) -> (Arc<Field>, ArrayRef) {
        let fields = self.batch.schema().fields().clone();
        let field = Arc::new(Field::new_struct("", fields, false));
        (field, Arc::new(StructArray::from(self.batch.clone())))
    }
}

#[pymethods]
impl ShardBatch {
    #[getter]
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    #[getter]
    fn column_names(&self) -> Vec<String> {
        let schema = self.batch.schema();
        schema.fields().iter().map(|f| f.name().clone()).collect()
    }

    fn __len__(&self) -> usize {
        self.batch.num_rows()
    }

    fn __repr__(&self) -> String {
        let schema = self.batch.schema();
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{}: {}", f.name(), f.data_type()))
            .collect();
        format!(
            "ShardBatch(num_rows={}, columns=[{}])",
            self.batch.num_rows(),
            columns.join(", ")
        )
    }

    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyArrowResult<Bound<'py, PyCapsule>> {
        to_schema_pycapsule(py, self.batch.schema().as_ref())
    }

    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyArrowResult<Bound<'py, PyTuple>> {
        let (field, array) = self.as_struct();
        to_array_pycapsules(py, field, &array, requested_schema)
    }

    /// A stream of this one batch (for consumers that take streams only).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyCapsule>>,
    ) -> PyArrowResult<Bound<'py, PyCapsule>> {
        let (field, array) = self.as_struct();
        let reader = ArrayIterator::new(std::iter::once(Ok(array)), field);
        to_stream_pycapsule(py, Box::new(reader), requested_schema)
    }

    /// The buffers of a list-of-integers column without nulls: its offsets (int32, one more
    /// than the rows; row i holds the values offsets[i]:offsets[i+1]) and its values (int64),
    /// both read in place through the buffer protocol (`torch.frombuffer`, `numpy.frombuffer`,
    /// `memoryview`).
    ///
    /// Errors: KeyError for a column the batch lacks, ValueError for one that is not a list of
    /// integers, or holds a null list or a null item.
    fn int_list_buffers(&self, column: &str) -> PyResult<(IntBuffer, IntBuffer)> {
        let array = self
            .batch
            .column_by_name(column)
            .ok_or_else(|| PyKeyError::new_err(format!("no column {column:?} in this batch")))?;
        let not_int_lists = || {
            PyValueError::new_err(format!(
                "column {column:?} is {}, not a list of integers without nulls",
                array.data_type()
            ))
        };
        let DataType::List(_) = array.data_type() else {
            return Err(not_int_lists());
        };
        let lists = array.as_list::<i32>();
        if lists.null_count() != 0 {
            return Err(not_int_lists());
        }
        let offsets = lists.offsets().inner().inner().clone();
        let values = lists.values();
        let values = match values.data_type() {
            // Every list of the batch is empty.
            DataType::Null if values.is_empty() => Buffer::from_vec(Vec::<i64>::new()),
            DataType::Int64 if values.null_count() == 0 => {
                values.as_primitive::<Int64Type>().values().inner().clone()
            }
            _ => return Err(not_int_lists()),
        };
        Ok((
            IntBuffer::new(offsets, IntFormat::Int32),
            IntBuffer::new(values, IntFormat::Int64),
        ))
    }
}

#[derive(Clone, Copy)]
enum IntFormat {
    Int32,
    Int64,
}

impl IntFormat {
    /// The struct-module format code and item size.
    fn code(self) -> (&'static CStr, usize) {
        match self {
            IntFormat::Int32 => (c"i", 4),
            IntFormat::Int64 => (c"q", 8),
        }
    }
}

/// A read-only, one-dimensional view of integers held by a batch (kept alive by this object).
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct IntBuffer {
    buffer: Buffer,
    format: IntFormat,
    /// The view's shape and strides point here (this object outlives every view of it).
    shape: ffi::Py_ssize_t,
    stride: ffi::Py_ssize_t,
}

impl IntBuffer {
    fn new(buffer: Buffer, format: IntFormat) -> Self {
        let item_size = format.code().1;
        let items = buffer.len() / item_size;
        Self {
            buffer,
            format,
            shape: items as ffi::Py_ssize_t,
            stride: item_size as ffi::Py_ssize_t,
        }
    }
}

#[pymethods]
impl IntBuffer {
    fn __len__(&self) -> usize {
        self.shape as usize
    }

    /// Exports the integers read-only, as `memoryview` and `numpy.frombuffer` expect.
    ///
    /// # Safety
    /// Called by the interpreter with a valid `view`; the exported pointers stay valid while
    /// `view.obj` (a new reference to this object, which owns the immutable buffer) lives.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let (format, item_size) = this.format.code();
        let dimension = OneDimension {
            buf: this.buffer.as_ptr().cast(),
            items: &this.shape,
            item_size,
            format,
            writable: false,
            stride: Some(&this.stride),
        };
        // SAFETY: the immutable buffer, `shape` and `stride` live in this object (the view's
        // `obj`), which outlives the view.
        unsafe { fill_view(slf.as_any().clone(), view, flags, dimension) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
