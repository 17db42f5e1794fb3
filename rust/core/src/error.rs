//! One error enum for the native layer (the binding maps it to Python exceptions).
//!
//! Messages name the object (URI) and what is wrong; they never contain a credential.

#[derive(Debug, thiserror::Error)]
pub enum NativeError {
    /// Bad URL, unknown scheme, missing credentials: fails at once.
    #[error("{0}")]
    Config(String),
    /// A value of the wrong type where one was configured (a credential provider's answer):
    /// fails at once, as TypeError.
    #[error("{0}")]
    ConfigType(String),
    #[error("Object not found: {uri}")]
    NotFound { uri: String },
    #[error("Object already exists: {uri}")]
    AlreadyExists { uri: String },
    #[error("Access denied to {uri}: {detail}")]
    Permission { uri: String, detail: String },
    /// `version`: what the read was held to, e.g. `etag "abc"` or `Last-Modified <date>`.
    #[error("Object changed while reading {uri} ({version} no longer matches)")]
    Changed { uri: String, version: String },
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
