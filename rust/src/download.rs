//! Downloading an immutable object of known size to a local file, hashing it on the way.
//!
//! The bytes come from the resumable stream of SPEC section 4 (ranged GETs with If-Match,
//! retries, size check); each chunk is written and fed to SHA-256 with the GIL released. The
//! file is created new (never replacing one) and removed on any failure, Ctrl-C included, so a
//! failed download leaves nothing behind. The caller compares the digest with its claim.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pyo3::prelude::*;
use sha2::{Digest, Sha256};

use crate::client::NativeStorage;
use crate::error::{io_error, NativeError, NativeResult};
use crate::ops::log_warning;
use crate::runtime::SIGNAL_POLL;
use crate::stream::{Received, StreamReader};

/// The partial file, removed unless the download finished.
struct PartialFile {
    path: PathBuf,
    file: Option<File>,
    finished: bool,
}

impl PartialFile {
    fn create(path: &Path) -> NativeResult<PartialFile> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| io_error("Cannot create", path, &e))?;
        Ok(PartialFile {
            path: path.to_path_buf(),
            file: Some(file),
            finished: false,
        })
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        // Close before removing (Windows cannot remove an open file).
        self.file = None;
        if !self.finished {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What one GIL-free stretch of the download ended with.
enum Step {
    /// Still going: look for Ctrl-C and come back.
    Continue,
    Done,
}

/// Pulls chunks for up to `SIGNAL_POLL`, writing and hashing each. Call without the GIL.
fn pump(
    reader: &mut StreamReader,
    partial: &mut PartialFile,
    hasher: &mut Sha256,
    written: &mut u64,
) -> NativeResult<Step> {
    let started = Instant::now();
    let file = partial
        .file
        .as_mut()
        .ok_or_else(|| NativeError::Task(format!("{} is closed", partial.path.display())))?;
    loop {
        let left = SIGNAL_POLL.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(Step::Continue);
        }
        match reader.receive(left)? {
            Received::Chunk(chunk) => {
                hasher.update(&chunk);
                file.write_all(&chunk)
                    .map_err(|e| io_error("Cannot write", &partial.path, &e))?;
                *written += chunk.len() as u64;
            }
            Received::End => return Ok(Step::Done),
            Received::Pending => return Ok(Step::Continue),
        }
    }
}

/// True when the caller's cancel flag (anything with `is_set()`, e.g. `threading.Event`) is set.
fn cancelled(cancel: Option<&Bound<'_, PyAny>>) -> NativeResult<bool> {
    match cancel {
        Some(flag) => Ok(flag.call_method0("is_set")?.is_truthy()?),
        None => Ok(false),
    }
}

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
) -> NativeResult<(u64, String)> {
    let mut partial = PartialFile::create(&path)?;
    let mut reader = storage.stream(uri, size_bytes, etag, 0, None)?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    loop {
        if cancelled(cancel.as_ref())? {
            return Err(NativeError::Cancelled(uri.to_string()));
        }
        let step = py.allow_threads(|| pump(&mut reader, &mut partial, &mut hasher, &mut written));
        for warning in reader.take_warnings() {
            log_warning(py, &warning);
        }
        match step? {
            Step::Done => break,
            Step::Continue => py.check_signals()?,
        }
    }
    if written != size_bytes {
        // The stream checks this already; a second look costs nothing.
        return Err(NativeError::InvalidData {
            uri: uri.to_string(),
            reason: format!(
                "size mismatch: received {written} bytes but size_bytes is {size_bytes}"
            ),
        });
    }
    if let Some(file) = partial.file.as_mut() {
        file.flush()
            .map_err(|e| io_error("Cannot write", &partial.path, &e))?;
    }
    partial.finished = true;
    Ok((written, hex::encode(hasher.finalize())))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(download_object, m)?)?;
    Ok(())
}
