//! Python rows from Arrow record batches, for the Parquet reader (SPEC section 3).
//!
//! pyarrow's `Table.to_pylist` converts a table column by column and then builds every row dict
//! in a Python comprehension. Here one call per batch reads the columns straight from pyarrow's
//! buffers through the Arrow C data interface (the `__arrow_c_array__` capsules; nothing is
//! copied or moved out of them) and builds the row dicts with one interned key object per
//! column. Values are exactly those of `to_pylist`: int, float (float32 widened), bool, str,
//! bytes, list (list, large_list, fixed_size_list), dict (struct), list of `(key, value)` tuples
//! (map), None. A column with any other type at any depth (temporal, decimal, dictionary, views,
//! float16, unions, ...) is converted by pyarrow through the caller's fallback.

mod column;
mod convert;
mod ffi;
mod kind;

use std::ffi::CStr;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyString};

use column::view;
use convert::convert;
use ffi::{batch_children, capsule_pointer, ArrowArray, ArrowSchema};
use kind::parse_kind;

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
/// that column's `to_pylist()`.
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
    let schema = capsule_pointer::<ArrowSchema>(schema, c"arrow_schema")?;
    let array = capsule_pointer::<ArrowArray>(array, c"arrow_array")?;
    // SAFETY: the capsules hold pyarrow's exported structs and stay alive (borrowed by this
    // call) until it returns; nothing is moved out of them, so their destructors release them.
    let (keys, columns, rows) = unsafe {
        let (schema, array) = (&*schema, &*array);
        let fields = batch_children(schema, array).map_err(PyValueError::new_err)?;
        let rows = array.length as usize;
        let start = array.offset as usize;
        let mut keys = Vec::with_capacity(fields.len());
        let mut columns = Vec::with_capacity(fields.len());
        for (index, (field, child)) in fields.into_iter().enumerate() {
            let name = CStr::from_ptr(field.name).to_str().map_err(|_| {
                PyValueError::new_err(format!("column {index} has a name that is not UTF-8"))
            })?;
            keys.push(PyString::intern(py, name));
            columns.push(match parse_kind(py, field) {
                Some(kind) => {
                    let column = view(&kind, child).map_err(PyValueError::new_err)?;
                    if column.length < start + rows {
                        return Err(PyValueError::new_err("Arrow column shorter than its batch"));
                    }
                    let mut values = Vec::with_capacity(rows);
                    convert(py, &kind, &column, start, rows, &mut values)?;
                    Values::Native(values)
                }
                None => {
                    let values = fallback.call1((index,))?.downcast_into::<PyList>()?;
                    if values.len() != rows {
                        return Err(PyValueError::new_err(format!(
                            "fallback gave {} values for column {index} of {rows} rows",
                            values.len()
                        )));
                    }
                    Values::Python(values)
                }
            });
        }
        (keys, columns, rows)
    };
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
