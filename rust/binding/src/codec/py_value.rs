//! What kind of value a Python object is, for the two record writers.

use std::borrow::Cow;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PyMemoryView,
    PyString, PyTuple,
};

use syvain_core::error::NativeError;

use crate::error::{BindingError, BindingResult};

pub enum PyValue<'a, 'py> {
    None,
    Bool(bool),
    Int(&'a Bound<'py, PyInt>),
    Float(f64),
    Str(&'a Bound<'py, PyString>),
    /// bytes, bytearray or memoryview.
    Bytes,
    /// dict, or any other `collections.abc.Mapping`.
    Map,
    /// list or tuple.
    Seq,
    Other,
}

/// Classifies in the order `json.dumps` and msgspec test types (bool before int).
pub fn kind_of<'a, 'py>(obj: &'a Bound<'py, PyAny>) -> PyValue<'a, 'py> {
    let ptr = obj.as_ptr();
    // Exact built-in types first: one pointer comparison each (bool is not an exact int).
    // SAFETY: `ptr` is a live object (we hold a reference); the checks only read its type,
    // and each cast matches the exact type just checked.
    unsafe {
        if ffi::PyUnicode_CheckExact(ptr) != 0 {
            return PyValue::Str(obj.downcast_unchecked());
        }
        if ffi::PyLong_CheckExact(ptr) != 0 {
            return PyValue::Int(obj.downcast_unchecked());
        }
        if ffi::PyDict_CheckExact(ptr) != 0 {
            return PyValue::Map;
        }
        if ffi::PyList_CheckExact(ptr) != 0 {
            return PyValue::Seq;
        }
        if ffi::PyFloat_CheckExact(ptr) != 0 {
            return PyValue::Float(ffi::PyFloat_AsDouble(ptr));
        }
    }
    if obj.is_none() {
        PyValue::None
    } else if let Ok(b) = obj.downcast::<PyBool>() {
        PyValue::Bool(b.is_true())
    } else if let Ok(i) = obj.downcast::<PyInt>() {
        PyValue::Int(i)
    } else if let Ok(f) = obj.downcast::<PyFloat>() {
        PyValue::Float(f.value())
    } else if let Ok(s) = obj.downcast::<PyString>() {
        PyValue::Str(s)
    } else if obj.is_instance_of::<PyDict>() {
        PyValue::Map
    } else if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        PyValue::Seq
    } else if obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyMemoryView>()
    {
        PyValue::Bytes
    } else if obj.downcast::<PyMapping>().is_ok() {
        PyValue::Map
    } else {
        PyValue::Other
    }
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The (key, value) pairs of a mapping, in its iteration order.
pub fn map_items<'py>(
    obj: &Bound<'py, PyAny>,
) -> BindingResult<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>> {
    if let Ok(dict) = obj.downcast::<PyDict>() {
        return Ok(dict.iter().collect());
    }
    let mut items = Vec::new();
    for item in obj.call_method0("items")?.try_iter()? {
        let pair = item?;
        let (key, value): (Bound<'py, PyAny>, Bound<'py, PyAny>) = pair.extract()?;
        items.push((key, value));
    }
    Ok(items)
}

/// The elements of a list or tuple.
pub fn seq_items<'py>(obj: &Bound<'py, PyAny>) -> BindingResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.downcast::<PyList>() {
        return Ok(list.iter().collect());
    }
    Ok(obj
        .downcast::<PyTuple>()
        .map_err(PyErr::from)?
        .iter()
        .collect())
}

/// The raw bytes of a bytes, bytearray or memoryview (C order, as `bytes(view)`).
pub fn bytes_of<'a>(obj: &'a Bound<'_, PyAny>) -> BindingResult<Cow<'a, [u8]>> {
    if let Ok(b) = obj.downcast::<PyBytes>() {
        return Ok(Cow::Borrowed(b.as_bytes()));
    }
    if let Ok(b) = obj.downcast::<PyByteArray>() {
        return Ok(Cow::Owned(b.to_vec()));
    }
    let copy = obj.call_method0("tobytes")?;
    Ok(Cow::Owned(
        copy.downcast::<PyBytes>()
            .map_err(PyErr::from)?
            .as_bytes()
            .to_vec(),
    ))
}

/// The UTF-8 text of a str; a lone surrogate cannot be written by either format.
pub fn str_of<'a>(s: &'a Bound<'_, PyString>) -> BindingResult<&'a str> {
    s.to_str().map_err(|_| {
        NativeError::Encode("a str with a lone surrogate is not valid UTF-8".into()).into()
    })
}

/// An encoding error (ValueError) of a record writer.
pub fn refuse(problem: impl Into<String>) -> BindingError {
    NativeError::Encode(problem.into()).into()
}

/// A record must be a mapping.
pub fn check_record(record: &Bound<'_, PyAny>) -> BindingResult<()> {
    if matches!(kind_of(record), PyValue::Map) {
        return Ok(());
    }
    Err(refuse(format!(
        "record is not a mapping but {}",
        type_name(record)
    )))
}
