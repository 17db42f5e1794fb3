//! Building Python records under the GIL from bytes the decoder thread already checked.

use jiter::{FloatMode, JsonErrorType, PartialMode, PythonParse, StringCacheMode};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::key_cache::KeyCache;
use syvain_core::codec::lines::nesting_exceeds;
use syvain_core::codec::msgpack::{self, Cursor, Scalar, Token};
use syvain_core::codec::MAX_JSON_DEPTH;

/// An open container being filled: a borrowed pointer (its parent, or the root we own, holds
/// the reference) and what is left to read.
struct Open {
    container: *mut ffi::PyObject,
    map: bool,
    /// Map entries or list items still to read.
    remaining: usize,
    /// The next list index to set.
    index: ffi::Py_ssize_t,
}

/// Why building stopped: the payload was not valid (`Ok(reason)`), or Python failed (memory).
type BuildError = Result<&'static str, PyErr>;

/// Builds the dict of a validated MessagePack payload straight through the C API: lists are
/// created at their final size and filled in place (the item reference is stolen), so a value
/// costs one allocation and no reference-count round trip. Iterative, so nesting depth cannot
/// overflow the stack. `Err(Ok(reason))` if the payload was not valid after all.
pub fn msgpack_record<'py>(
    py: Python<'py>,
    payload: &[u8],
    keys: &mut KeyCache,
) -> Result<Bound<'py, PyAny>, BuildError> {
    let mut cursor = Cursor::new(payload);
    let entries = match cursor.token() {
        Ok(Token::Map(entries)) => entries,
        Ok(_) => return Err(Ok(msgpack::NOT_A_MAP)),
        Err(reason) => return Err(Ok(reason)),
    };
    // SAFETY: the GIL is held (`py`); a null result is turned into the pending Python error.
    let root = unsafe { owned(py, ffi::PyDict_New())? };
    let mut stack = vec![Open {
        container: root.as_ptr(),
        map: true,
        remaining: entries,
        index: 0,
    }];
    while let Some(top) = stack.last_mut() {
        if top.remaining == 0 {
            stack.pop();
            continue;
        }
        top.remaining -= 1;
        let (container, map) = (top.container, top.map);
        let index = top.index;
        top.index += 1;
        let key = if map {
            match cursor.token() {
                Ok(Token::Scalar(Scalar::Str(key))) => Some(keys.get(py, key)),
                Ok(_) => return Err(Ok(msgpack::NON_STRING_KEY)),
                Err(reason) => return Err(Ok(reason)),
            }
        } else {
            None
        };
        let (value, open) = match cursor.token() {
            Ok(Token::Scalar(scalar)) => (scalar_object(py, scalar)?, None),
            // SAFETY (both): the GIL is held; null becomes the pending error.
            Ok(Token::Map(entries)) => (
                unsafe { owned(py, ffi::PyDict_New())? },
                Some((true, entries)),
            ),
            Ok(Token::Array(items)) => {
                let len =
                    ffi::Py_ssize_t::try_from(items).map_err(|_| Ok(msgpack::INVALID_PAYLOAD))?;
                (
                    unsafe { owned(py, ffi::PyList_New(len))? },
                    Some((false, items)),
                )
            }
            Err(reason) => return Err(Ok(reason)),
        };
        // The parent keeps the child alive from here on, so the borrowed pointer pushed below
        // stays valid while the child is filled (nothing else can reach it meanwhile).
        let child = value.as_ptr();
        match key {
            // SAFETY: `container` is a live dict and `key` a str; PyDict_SetItem takes its own
            // references to both, ours are released when `key` and `value` drop.
            Some(key) => unsafe {
                if ffi::PyDict_SetItem(container, key.as_ptr(), child) != 0 {
                    return Err(Err(PyErr::fetch(py)));
                }
            },
            // SAFETY: `container` is a live list created with `index` in range (its length is
            // the item count the cursor announced); PyList_SetItem steals our reference.
            None => unsafe {
                if ffi::PyList_SetItem(container, index, value.into_ptr()) != 0 {
                    return Err(Err(PyErr::fetch(py)));
                }
            },
        }
        if let Some((map, remaining)) = open {
            stack.push(Open {
                container: child,
                map,
                remaining,
                index: 0,
            });
        }
    }
    if cursor.remaining() != 0 {
        return Err(Ok(msgpack::INVALID_PAYLOAD));
    }
    Ok(root)
}

/// Takes ownership of a new reference returned by the C API; null means a Python error is set.
///
/// # Safety
/// `ptr` must be null or a new (owned) reference, and the GIL held.
unsafe fn owned<'py>(
    py: Python<'py>,
    ptr: *mut ffi::PyObject,
) -> Result<Bound<'py, PyAny>, BuildError> {
    Bound::from_owned_ptr_or_err(py, ptr).map_err(Err)
}

fn scalar_object<'py>(py: Python<'py>, value: Scalar<'_>) -> Result<Bound<'py, PyAny>, BuildError> {
    // SAFETY: the GIL is held; each call returns a new reference or null with an error set;
    // string and bytes pointers come with their exact lengths (which fit: they are slices).
    unsafe {
        let ptr = match value {
            Scalar::Nil => return Ok(py.None().into_bound(py)),
            Scalar::Bool(b) => ffi::PyBool_FromLong(b.into()),
            Scalar::Int(i) => ffi::PyLong_FromLongLong(i),
            Scalar::UInt(u) => ffi::PyLong_FromUnsignedLongLong(u),
            Scalar::Float(f) => ffi::PyFloat_FromDouble(f),
            Scalar::Str(s) => {
                ffi::PyUnicode_FromStringAndSize(s.as_ptr().cast(), s.len() as ffi::Py_ssize_t)
            }
            Scalar::Bin(b) => {
                ffi::PyBytes_FromStringAndSize(b.as_ptr().cast(), b.len() as ffi::Py_ssize_t)
            }
        };
        owned(py, ptr)
    }
}

/// What one jsonl line holds.
pub enum JsonLine<'py> {
    Record(Bound<'py, PyDict>),
    /// Not JSON, or not an object: the caller logs and skips it.
    Invalid,
    /// Nested deeper than [`MAX_JSON_DEPTH`]: a shard error, found before anything is built.
    TooDeep,
}

/// Parses one jsonl line.
///
/// Like `json.loads`: NaN and (-)Infinity are floats, big integers are `int`, a repeated key
/// keeps its last value. jiter builds the common line; it stops at a fixed depth of 200 (its
/// limit is a `u8` it does not let callers raise), so a deeper line, once its depth is checked,
/// is built by `json.loads` itself, which takes the same input to the same objects.
/// Errors: only Python's own (MemoryError).
pub fn json_record<'py>(py: Python<'py>, line: &[u8]) -> PyResult<JsonLine<'py>> {
    let parser = PythonParse {
        allow_inf_nan: true,
        cache_mode: StringCacheMode::Keys,
        partial_mode: PartialMode::Off,
        catch_duplicate_keys: false,
        float_mode: FloatMode::Float,
    };
    let value = match parser.python_parse(py, line) {
        Ok(value) => value,
        Err(err) if err.error_type == JsonErrorType::RecursionLimitExceeded => {
            if nesting_exceeds(line, MAX_JSON_DEPTH) {
                return Ok(JsonLine::TooDeep);
            }
            let loads = py.import("json")?.getattr("loads")?;
            match loads.call1((PyBytes::new(py, line),)) {
                Ok(value) => value,
                Err(err) if err.is_instance_of::<PyValueError>(py) => return Ok(JsonLine::Invalid),
                Err(err) => return Err(err),
            }
        }
        Err(_) => return Ok(JsonLine::Invalid),
    };
    Ok(value
        .downcast_into::<PyDict>()
        .map_or(JsonLine::Invalid, JsonLine::Record))
}
