//! Python rows from Arrow record batches, for the Parquet reader (SPEC section 3).
//!
//! pyarrow's `Table.to_pylist` converts a table column by column and then builds every row dict
//! in a Python comprehension. Here one call per batch imports the batch through the Arrow C data
//! interface (arrow-rs reads pyarrow's buffers in place; nothing is copied) and builds the row
//! dicts with one interned key object per column. Values are exactly those of `to_pylist`: int,
//! float (float32 widened), bool, str, bytes, list (list, large_list, fixed_size_list), dict
//! (struct), list of `(key, value)` tuples (map), None. A column with any other type at any
//! depth (temporal, decimal, dictionary, views, float16, unions, extension types, ...) is
//! converted by pyarrow through the caller's fallback.

mod convert;
mod import;
mod native;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyString};

use convert::convert;
use import::{import, Batch};
use native::is_native;

/// One column's values for the rows of a batch.
enum Values<'py> {
    Native(Vec<Bound<'py, PyAny>>),
    /// Converted by the caller (a type left to pyarrow).
    Python(Bound<'py, PyList>),
}

/// The rows of a record batch given as `batch.__arrow_c_array__()`, exactly as
/// `batch.to_pylist()` gives them: row i is `{name: value}` in column order, every row sharing
/// one interned key object per column (a repeated name keeps its first position and its last
/// value). A column of a type not converted here is asked of `fallback(index)`, which returns
/// that column's `to_pylist()`. The array capsule is consumed.
///
/// Raises ValueError for a released or inconsistent batch or a fallback list of the wrong
/// length, TypeError for capsules that are not Arrow's, UnicodeDecodeError for a string that
/// is not UTF-8, and whatever `fallback` raises.
#[pyfunction]
fn rows_from_arrow<'py>(
    py: Python<'py>,
    schema: &Bound<'py, PyCapsule>,
    array: &Bound<'py, PyCapsule>,
    fallback: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let batch = import(schema, array)?;
    let rows = batch.rows();
    if rows == 0 {
        return Ok(PyList::empty(py));
    }
    let with_fallback = |index: usize| -> PyResult<Values<'py>> {
        let values = fallback.call1((index,))?.downcast_into::<PyList>()?;
        if values.len() != rows {
            return Err(PyValueError::new_err(format!(
                "fallback gave {} values for column {index} of {rows} rows",
                values.len()
            )));
        }
        Ok(Values::Python(values))
    };
    let mut keys = Vec::new();
    let mut columns = Vec::new();
    match &batch {
        Batch::Arrays(array) => {
            for (index, (field, column)) in array.fields().iter().zip(array.columns()).enumerate() {
                keys.push(PyString::intern(py, field.name()));
                columns.push(if is_native(field) {
                    let mut values = Vec::with_capacity(rows);
                    convert(py, column.as_ref(), 0, rows, &mut values)?;
                    Values::Native(values)
                } else {
                    with_fallback(index)?
                });
            }
        }
        Batch::Unknown { names, .. } => {
            for (index, name) in names.iter().enumerate() {
                keys.push(PyString::intern(py, name));
                columns.push(with_fallback(index)?);
            }
        }
    }
    let mut dicts = Vec::with_capacity(rows);
    for row in 0..rows {
        let dict = PyDict::new(py);
        for (key, values) in keys.iter().zip(&columns) {
            match values {
                Values::Native(values) => dict.set_item(key, &values[row])?,
                // SAFETY: `row` is within the list (its length was checked and no Python code
                // runs meanwhile: exact str keys hash and compare without it); the item is
                // borrowed and PyDict_SetItem takes its own reference.
                Values::Python(list) => unsafe {
                    let value =
                        pyo3::ffi::PyList_GetItem(list.as_ptr(), row as pyo3::ffi::Py_ssize_t);
                    if value.is_null()
                        || pyo3::ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value) != 0
                    {
                        return Err(PyErr::fetch(py));
                    }
                },
            }
        }
        dicts.push(dict);
    }
    PyList::new(py, dicts)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rows_from_arrow, m)?)?;
    Ok(())
}
