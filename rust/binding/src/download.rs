//! Downloading an immutable object to a new local file, hashed on the way (the rules are in
//! `syvain_core::download`).

use std::path::PathBuf;

use pyo3::prelude::*;
use syvain_core::download::download_to_file;

use crate::caller::PythonCaller;
use crate::error::{BindingError, BindingResult};
use crate::storage::NativeStorage;

/// Streams the object at `uri` (exactly `size_bytes` bytes; If-Match on `etag`, or on the first
/// response's etag) into a new file at `path` and returns (size, lowercase hex SHA-256).
///
/// `cancel` (e.g. a `threading.Event`) stops the download within about 50 ms of being set,
/// from any thread: Ctrl-C reaches only the main thread, so a download in a worker thread
/// needs it to be stopped.
///
/// Errors: OSError when `path` exists or cannot be written; InterruptedError when cancelled;
/// the stream's errors (FileNotFoundError, PermissionError, ObjectChangedError,
/// StorageRetryExhaustedError, RuntimeError for a size mismatch); KeyboardInterrupt.
/// On every error the file is removed.
#[pyfunction]
#[pyo3(signature = (storage, uri, path, *, size_bytes, etag=None, cancel=None))]
fn download_object(
    py: Python<'_>,
    storage: &NativeStorage,
    uri: &str,
    path: PathBuf,
    size_bytes: u64,
    etag: Option<String>,
    cancel: Option<Bound<'_, PyAny>>,
) -> BindingResult<(u64, String)> {
    // True when the caller's cancel flag (anything with `is_set()`) is set.
    let cancelled = || -> Result<bool, BindingError> {
        match &cancel {
            Some(flag) => Ok(flag.call_method0("is_set")?.is_truthy()?),
            None => Ok(false),
        }
    };
    let caller = PythonCaller(py);
    download_to_file(
        &caller,
        &storage.storage,
        uri,
        &path,
        size_bytes,
        etag,
        cancelled,
    )
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(download_object, m)?)?;
    Ok(())
}
