//! Downloading an immutable object of known size to a local file, hashing it on the way.
//!
//! The bytes come from the resumable stream of SPEC section 4 (ranged GETs with If-Match,
//! retries, size check); each chunk is written and fed to SHA-256 while the caller waits. The
//! file is created new (never replacing one) and removed on any failure, Ctrl-C included, so a
//! failed download leaves nothing behind. The caller compares the digest with its claim.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::caller::Caller;
use crate::error::{io_error, NativeError, NativeResult};
use crate::runtime::SIGNAL_POLL;
use crate::storage::Storage;
use crate::stream::{Received, StreamReader};
use crate::warnings;

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

/// Pulls chunks for up to `SIGNAL_POLL`, writing and hashing each (blocking).
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

/// Streams the object at `uri` (exactly `size_bytes` bytes; If-Match on `etag`, or on the first
/// response's etag) into a new file at `path` and returns (size, lowercase hex SHA-256).
///
/// `cancelled` is asked between waits of at most `SIGNAL_POLL`; when it says so the download
/// stops with `Cancelled`. Errors: the file exists or cannot be written (Io), the stream's
/// errors, and the caller's interruption. On every error the file is removed.
pub fn download_to_file<C: Caller>(
    caller: &C,
    storage: &Storage,
    uri: &str,
    path: &Path,
    size_bytes: u64,
    etag: Option<String>,
    cancelled: impl Fn() -> Result<bool, C::Error>,
) -> Result<(u64, String), C::Error> {
    let mut partial = PartialFile::create(path)?;
    let mut reader = storage.stream(uri, size_bytes, etag, 0, None)?;
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    loop {
        if cancelled()? {
            return Err(NativeError::Cancelled(uri.to_string()).into());
        }
        let step = caller.blocking(|| pump(&mut reader, &mut partial, &mut hasher, &mut written));
        for warning in reader.take_warnings() {
            warnings::warn(&warning);
        }
        match step? {
            Step::Done => break,
            Step::Continue => caller.interrupted()?,
        }
    }
    if written != size_bytes {
        // The stream checks this already; a second look costs nothing.
        return Err(NativeError::InvalidData {
            uri: uri.to_string(),
            reason: format!(
                "size mismatch: received {written} bytes but size_bytes is {size_bytes}"
            ),
        }
        .into());
    }
    if let Some(file) = partial.file.as_mut() {
        file.flush()
            .map_err(|e| io_error("Cannot write", &partial.path, &e))?;
    }
    partial.finished = true;
    Ok((written, hex::encode(hasher.finalize())))
}
