//! Building Python records under the GIL from bytes the decoder thread already checked.

use jiter::{FloatMode, PartialMode, PythonParse, StringCacheMode};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString};

use super::key_cache::KeyCache;
use super::msgpack::{self, ParseError, Scalar, Sink};

enum Open<'py> {
    Map(Bound<'py, PyDict>, Option<Bound<'py, PyString>>),
    Array(Bound<'py, PyList>),
}

/// A [`Sink`] that builds dicts, lists and scalars.
struct PyBuilder<'py, 'c> {
    py: Python<'py>,
    keys: &'c mut KeyCache,
    stack: Vec<Open<'py>>,
    result: Option<Bound<'py, PyAny>>,
}

impl<'py> PyBuilder<'py, '_> {
    fn attach(&mut self, value: Bound<'py, PyAny>) -> PyResult<()> {
        match self.stack.last_mut() {
            None => self.result = Some(value),
            Some(Open::Array(list)) => list.append(value)?,
            Some(Open::Map(dict, key)) => {
                let key = key
                    .take()
                    .ok_or_else(|| PyRuntimeError::new_err("map value without a key"))?;
                dict.set_item(key, value)?;
            }
        }
        Ok(())
    }
}

impl Sink for PyBuilder<'_, '_> {
    type Error = PyErr;

    fn scalar(&mut self, value: Scalar<'_>) -> PyResult<()> {
        let py = self.py;
        let object = match value {
            Scalar::Nil => py.None().into_bound(py),
            Scalar::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
            Scalar::Int(i) => i.into_pyobject(py)?.into_any(),
            Scalar::UInt(u) => u.into_pyobject(py)?.into_any(),
            Scalar::Float(f) => f.into_pyobject(py)?.into_any(),
            Scalar::Str(s) => PyString::new(py, s).into_any(),
            Scalar::Bin(b) => PyBytes::new(py, b).into_any(),
        };
        self.attach(object)
    }

    fn key(&mut self, key: &str) -> PyResult<()> {
        let key = self.keys.get(self.py, key);
        match self.stack.last_mut() {
            Some(Open::Map(_, slot)) => {
                *slot = Some(key);
                Ok(())
            }
            _ => Err(PyRuntimeError::new_err("map key outside a map")),
        }
    }

    fn begin_map(&mut self, _len: usize) -> PyResult<()> {
        self.stack.push(Open::Map(PyDict::new(self.py), None));
        Ok(())
    }

    fn begin_array(&mut self, _len: usize) -> PyResult<()> {
        self.stack.push(Open::Array(PyList::empty(self.py)));
        Ok(())
    }

    fn end(&mut self) -> PyResult<()> {
        let done = match self.stack.pop() {
            Some(Open::Map(dict, _)) => dict.into_any(),
            Some(Open::Array(list)) => list.into_any(),
            None => return Err(PyRuntimeError::new_err("end outside a container")),
        };
        self.attach(done)
    }
}

/// Builds the dict of a validated MessagePack payload; `Err(reason)` if it was not valid.
pub fn msgpack_record<'py>(
    py: Python<'py>,
    payload: &[u8],
    keys: &mut KeyCache,
) -> Result<Bound<'py, PyAny>, Result<&'static str, PyErr>> {
    let mut builder = PyBuilder {
        py,
        keys,
        stack: Vec::new(),
        result: None,
    };
    match msgpack::parse_record(payload, &mut builder) {
        Ok(()) => builder.result.ok_or(Ok(msgpack::INVALID_PAYLOAD)),
        Err(ParseError::Payload(reason)) => Err(Ok(reason)),
        Err(ParseError::Sink(err)) => Err(Err(err)),
    }
}

/// Parses one jsonl line; `None` when it is not JSON or not an object (the caller logs it).
///
/// Like `json.loads`: NaN and (-)Infinity are floats, big integers are `int`, a repeated key
/// keeps its last value.
pub fn json_record<'py>(py: Python<'py>, line: &[u8]) -> Option<Bound<'py, PyDict>> {
    let parser = PythonParse {
        allow_inf_nan: true,
        cache_mode: StringCacheMode::Keys,
        partial_mode: PartialMode::Off,
        catch_duplicate_keys: false,
        float_mode: FloatMode::Float,
    };
    let value = parser.python_parse(py, line).ok()?;
    value.downcast_into::<PyDict>().ok()
}
