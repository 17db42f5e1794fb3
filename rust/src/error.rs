//! One error enum for the native layer and its mapping to Python exceptions.
//!
//! Messages name the object (URI) and what is wrong; they never contain a credential.

use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyInterruptedError, PyKeyboardInterrupt, PyOSError,
    PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

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

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// Bad URL, unknown scheme, missing credentials: fails at once.
    #[error("{0}")]
    Config(String),
    #[error("Object not found: {uri}")]
    NotFound { uri: String },
    #[error("Object already exists: {uri}")]
    AlreadyExists { uri: String },
    #[error("Access denied to {uri}: {detail}")]
    Permission { uri: String, detail: String },
    #[error("Object changed while reading {uri} (etag {etag:?} no longer matches)")]
    Changed { uri: String, etag: String },
    /// `position` is empty for point operations, else " at offset X of Y bytes".
    #[error(
        "Storage retry budget exhausted for {operation} {uri}{position} after {attempts} \
         attempts without progress ({elapsed_s:.1} s in all); last error: {last_error}"
    )]
    RetryExhausted {
        operation: &'static str,
        uri: String,
        position: String,
        attempts: u32,
        elapsed_s: f64,
        last_error: String,
    },
    /// The object's bytes disagree with what the caller declared (size, etc.).
    #[error("{uri}: {reason}")]
    InvalidData { uri: String, reason: String },
    /// A permanent storage failure that is none of the above.
    #[error("Storage error on {uri}: {detail}")]
    Storage { uri: String, detail: String },
    /// A shard could not be decoded: "Unreadable {format} shard {uri}: {reason}".
    #[error("Unreadable {format} shard {uri}: {reason}")]
    Shard {
        format: &'static str,
        uri: String,
        reason: String,
    },
    /// A local file could not be created, written or read: OSError, whose subclass follows
    /// errno (PermissionError, NotADirectoryError, ...), with the path as its filename.
    #[error("{what} {path}: {reason}")]
    Io {
        what: String,
        path: String,
        reason: String,
        errno: Option<i32>,
    },
    /// A record handed to an encoder cannot be written (ValueError, nothing written).
    #[error("{0}")]
    Encode(String),
    #[error("interrupted")]
    Interrupted,
    /// A storage task ended without an answer (it panicked or was cancelled).
    #[error("storage task failed: {0}")]
    Task(String),
    /// The caller cancelled a download (InterruptedError).
    #[error("Download of {0} cancelled")]
    Cancelled(String),
    /// A Python exception raised while building or reading Python objects.
    #[error("{0}")]
    Python(#[from] PyErr),
}

pub type NativeResult<T> = Result<T, NativeError>;

/// The one way to report a failed local file operation: `what` ("Cannot read") and the path.
pub fn io_error(what: &str, path: &std::path::Path, error: &std::io::Error) -> NativeError {
    NativeError::Io {
        what: what.to_string(),
        path: path.display().to_string(),
        reason: error.to_string(),
        errno: error.raw_os_error(),
    }
}

/// A local path that exists but is no regular file (a FIFO or device would block or never end).
pub fn not_a_regular_file(path: &std::path::Path, file_type: std::fs::FileType) -> NativeError {
    NativeError::Io {
        what: "Cannot read".to_string(),
        path: path.display().to_string(),
        reason: format!("not a regular file ({})", describe_file_type(file_type)),
        errno: None,
    }
}

fn describe_file_type(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Fails when `path` exists and is a FIFO, device or socket (symbolic links followed): opening
/// or reading one would block or never end. A directory fails too unless `allow_directory`
/// (the local store reports it as a missing object). A path that cannot be looked at passes:
/// the operation itself then reports why.
pub fn refuse_special_file(path: &std::path::Path, allow_directory: bool) -> NativeResult<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() || allow_directory && meta.is_dir() => Ok(()),
        Ok(meta) => Err(not_a_regular_file(path, meta.file_type())),
        Err(_) => Ok(()),
    }
}

impl From<NativeError> for PyErr {
    fn from(err: NativeError) -> PyErr {
        let message = err.to_string();
        match err {
            NativeError::Config(_) | NativeError::Encode(_) => PyValueError::new_err(message),
            NativeError::NotFound { .. } => PyFileNotFoundError::new_err(message),
            NativeError::AlreadyExists { .. } => PyFileExistsError::new_err(message),
            NativeError::Permission { .. } => PyPermissionError::new_err(message),
            NativeError::Changed { uri, .. } => {
                package_error("ObjectChangedError", message, &[&uri])
            }
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
            NativeError::Python(e) => e,
        }
    }
}
