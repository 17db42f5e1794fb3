//! How the core's errors reach Python: one mapping from `NativeError` to exception classes.
//!
//! Messages name the object (URI) and what is wrong; they never contain a credential.

use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyInterruptedError, PyKeyboardInterrupt, PyOSError,
    PyPermissionError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use syvain_core::error::NativeError;

/// Our exception classes are defined in Python (`syvain_training_data.errors`) so that they
/// carry the package's module name and can be caught before the extension is imported. The
/// constructor takes the message, then the attributes the class keeps (uri, reason, ...).
fn package_error(name: &str, message: String, attributes: &[&str]) -> PyErr {
    Python::with_gil(|py| {
        let mut values = vec![message.clone()];
        values.extend(attributes.iter().map(|value| value.to_string()));
        let args = PyTuple::new(py, values);
        let error = py
            .import("syvain_training_data.errors")
            .and_then(|module| module.getattr(name))
            .and_then(|class| class.call1(args?));
        match error {
            Ok(error) => PyErr::from_value(error),
            // Only if the package itself is broken: still the documented base class.
            Err(_) => PyRuntimeError::new_err(message),
        }
    })
}

/// A failure on its way to Python: the core's error, or a Python exception raised while
/// building or reading Python objects (or by a signal handler while waiting).
#[derive(Debug)]
pub enum BindingError {
    Core(NativeError),
    Python(PyErr),
}

pub type BindingResult<T> = Result<T, BindingError>;

impl From<NativeError> for BindingError {
    fn from(err: NativeError) -> Self {
        Self::Core(err)
    }
}

impl From<PyErr> for BindingError {
    fn from(err: PyErr) -> Self {
        Self::Python(err)
    }
}

impl From<BindingError> for PyErr {
    fn from(err: BindingError) -> PyErr {
        match err {
            BindingError::Core(err) => to_python(err),
            BindingError::Python(err) => err,
        }
    }
}

/// The Python exception for a core error (SPEC section 4's classes, with their attributes).
pub fn to_python(err: NativeError) -> PyErr {
    let message = err.to_string();
    match err {
        NativeError::Config(_) | NativeError::Encode(_) => PyValueError::new_err(message),
        NativeError::ConfigType(_) => PyTypeError::new_err(message),
        NativeError::NotFound { .. } => PyFileNotFoundError::new_err(message),
        NativeError::AlreadyExists { .. } => PyFileExistsError::new_err(message),
        NativeError::Permission { .. } => PyPermissionError::new_err(message),
        NativeError::Changed { uri, .. } => package_error("ObjectChangedError", message, &[&uri]),
        NativeError::RetryExhausted { uri, .. } => {
            package_error("StorageRetryExhaustedError", message, &[&uri])
        }
        NativeError::InvalidData { uri, reason } => {
            package_error("ObjectDataError", message, &[&uri, &reason])
        }
        NativeError::Storage { uri, detail } => {
            package_error("StorageError", message, &[&uri, &detail])
        }
        NativeError::Task(_) => package_error("StorageError", message, &[]),
        NativeError::Shard {
            format,
            uri,
            reason,
        } => package_error("ShardDataError", message, &[format, &uri, &reason]),
        // OSError(errno, strerror, filename) picks the subclass that matches errno.
        NativeError::Io {
            what,
            path,
            reason,
            errno: Some(errno),
        } => PyOSError::new_err((errno, format!("{what}: {reason}"), path)),
        NativeError::Io { errno: None, .. } => PyOSError::new_err(message),
        NativeError::Cancelled(_) => PyInterruptedError::new_err(message),
        NativeError::Interrupted => PyKeyboardInterrupt::new_err("interrupted"),
    }
}
