//! Sorting storage failures into "retry" (transient) and "fail closed at once" (SPEC section 4).

use std::io::ErrorKind;

use crate::error::{io_error, NativeError};
use crate::object_stores::Location;

/// What to do with a failed attempt.
#[derive(Debug)]
pub enum StoreFailure {
    /// Connection reset or refused, timeout, 5xx, throttling, body ended early: retry.
    Transient(String),
    /// Missing object, authentication, precondition, invalid data, configuration: no retry.
    Fatal(NativeError),
}

/// The first line of an error, for logs and messages.
pub fn first_line(message: &str) -> &str {
    message.lines().next().unwrap_or("")
}

/// Classifies an `object_store` error raised while operating on `uri`. `pinned`: the version
/// a read was held to (`etag "abc"`, `Last-Modified <date>`), so that a failed precondition
/// reads as a changed object; without it, as an existing one (a create-only write).
pub fn classify_store_error(
    uri: &str,
    error: object_store::Error,
    pinned: Option<&str>,
) -> StoreFailure {
    use object_store::Error as E;
    if matches!(
        error,
        E::Generic {
            store: "LocalFileSystem",
            ..
        }
    ) {
        if let Some(io) = io_source(&error) {
            return classify_local_io(uri, io);
        }
        // A range past the file's end: the file is shorter than declared, which no retry
        // heals (object_store keeps the error type private, so its message says it).
        let detail = error_chain(&error);
        if detail.contains("Requested range was invalid") {
            return StoreFailure::Fatal(NativeError::InvalidData {
                uri: uri.to_string(),
                reason: format!("size mismatch: {detail}"),
            });
        }
    }
    // No credentials: fails at once, with the message of the source (never a secret).
    if let Some(found) = crate::credentials::find_credential_error(&error) {
        let message = format!("{uri}: {}", found.message);
        return StoreFailure::Fatal(match found.wrong_type {
            true => NativeError::ConfigType(message),
            false => NativeError::Config(message),
        });
    }
    if is_whole_object_answer(&error) {
        return StoreFailure::Fatal(whole_object_answer(uri, ""));
    }
    let detail = error_chain(&error);
    match error {
        // A multipart upload the store forgot: the whole write is retried (SPEC section 4).
        E::NotFound { .. } if detail.contains("NoSuchUpload") => StoreFailure::Transient(detail),
        E::NotFound { .. } => StoreFailure::Fatal(NativeError::NotFound {
            uri: uri.to_string(),
        }),
        E::AlreadyExists { .. } => StoreFailure::Fatal(NativeError::AlreadyExists {
            uri: uri.to_string(),
        }),
        E::Precondition { .. } | E::NotModified { .. } => match pinned {
            Some(version) => StoreFailure::Fatal(NativeError::Changed {
                uri: uri.to_string(),
                version: version.to_string(),
            }),
            // A create-only write whose precondition failed: the object exists.
            None => StoreFailure::Fatal(NativeError::AlreadyExists {
                uri: uri.to_string(),
            }),
        },
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            StoreFailure::Fatal(NativeError::Permission {
                uri: uri.to_string(),
                detail: first_line(&detail).to_string(),
            })
        }
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => {
            StoreFailure::Fatal(NativeError::Config(format!("{uri}: {detail}")))
        }
        E::NotSupported { .. } | E::NotImplemented => StoreFailure::Fatal(NativeError::Storage {
            uri: uri.to_string(),
            detail,
        }),
        _ => classify_generic(uri, detail),
    }
}

/// What object_store 0.12 says when a ranged GET is answered with anything but 206 (a 2xx:
/// other statuses fail earlier). Its error type (`GetResultError::NotPartial`) is private, so
/// its message, matched whole, is the only way to tell.
const NOT_PARTIAL: &str = "Received non-partial response when range requested";

/// Whether a ranged GET was answered with 200 and (by HTTP's rules) the whole object.
pub fn is_whole_object_answer(error: &object_store::Error) -> bool {
    match error {
        object_store::Error::Generic { store, source } => {
            *store != "LocalFileSystem" && source.to_string() == NOT_PARTIAL
        }
        _ => false,
    }
}

/// The error for a 200 to a ranged GET that cannot be read as the object: no retry changes
/// the server's answer, and its bytes start at 0, not where the read is. `range` says which
/// range was asked for ("" when not known).
pub fn whole_object_answer(uri: &str, range: &str) -> NativeError {
    NativeError::Storage {
        uri: uri.to_string(),
        detail: format!(
            "the server answered a ranged GET{range} with 200 and the whole object \
             (206 Partial Content expected; it ignores Range, so a read cannot resume \
             mid-object)"
        ),
    }
}

/// The `io::Error` underneath a local-store error, if any.
fn io_source<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a std::io::Error> {
    let mut current = Some(error);
    while let Some(inner) = current {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        current = inner.source();
    }
    None
}

/// A local file error heals on retry only when the call was interrupted or timed out; not a
/// directory, permission denied, no space, read-only file system and the rest fail at once.
fn is_transient_io(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
    )
}

/// Sorts a local-store failure by its `io::ErrorKind` (never by message text).
pub fn classify_local_io(uri: &str, error: &std::io::Error) -> StoreFailure {
    if is_transient_io(error.kind()) {
        return StoreFailure::Transient(format!("{uri}: {error}"));
    }
    // The error names the file; a URI that is no file:// location (never parsed this far) is
    // named as given.
    let path = match Location::parse(uri, true) {
        Ok(Location::File { path }) => path,
        _ => uri.to_string(),
    };
    StoreFailure::Fatal(io_error(
        "Cannot access",
        std::path::Path::new(&path),
        error,
    ))
}

/// Generic errors carry an HTTP status in their text when the server answered at all.
fn classify_generic(uri: &str, detail: String) -> StoreFailure {
    match http_status(&detail) {
        Some(status) if is_permanent_status(status, &detail) => {
            StoreFailure::Fatal(NativeError::Storage {
                uri: uri.to_string(),
                detail,
            })
        }
        _ => StoreFailure::Transient(detail),
    }
}

/// 4xx answers are the caller's fault and final, except timeouts and throttling.
fn is_permanent_status(status: u16, detail: &str) -> bool {
    let throttled_or_timed_out = matches!(status, 408 | 429)
        || detail.contains("RequestTimeout")
        || detail.contains("SlowDown")
        || detail.contains("NoSuchUpload");
    (400..500).contains(&status) && !throttled_or_timed_out
}

pub fn http_status(detail: &str) -> Option<u16> {
    let marker = "status code: ";
    let start = detail.find(marker)? + marker.len();
    detail.get(start..start + 3)?.parse().ok()
}

/// The error with its sources, joined: object_store puts the useful part at the end.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_past_a_local_files_end_fails_at_once() {
        let error = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: "Requested range was invalid: Wanted range starting at 832, but object \
                     was only 13 bytes long"
                .into(),
        };
        let failure = classify_store_error("file:///x", error, None);
        assert!(matches!(
            failure,
            StoreFailure::Fatal(NativeError::InvalidData { .. })
        ));
    }

    #[test]
    fn a_200_to_a_ranged_get_fails_at_once_naming_the_answer() {
        // The Display of object_store's private GetResultError::NotPartial, as it is boxed.
        let error = object_store::Error::Generic {
            store: "S3",
            source: NOT_PARTIAL.into(),
        };
        assert!(is_whole_object_answer(&error));
        match classify_store_error("s3://b/k", error, None) {
            StoreFailure::Fatal(NativeError::Storage { uri, detail }) => {
                assert_eq!(uri, "s3://b/k");
                assert!(
                    detail.contains("ranged GET with 200 and the whole object"),
                    "{detail}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Only that answer: another error that mentions it, or a local one, is not it.
        for (store, text) in [
            ("S3", format!("connection reset: {NOT_PARTIAL}")),
            ("LocalFileSystem", NOT_PARTIAL.to_string()),
        ] {
            let error = object_store::Error::Generic {
                store,
                source: text.into(),
            };
            assert!(!is_whole_object_answer(&error), "{store}");
        }
    }

    #[test]
    fn statuses() {
        assert_eq!(
            http_status("Error performing GET in 1ms - Server returned non-2xx status code: 503 Service Unavailable: SlowDown"),
            Some(503)
        );
        assert!(!is_permanent_status(503, ""));
        assert!(!is_permanent_status(500, ""));
        assert!(!is_permanent_status(429, ""));
        assert!(!is_permanent_status(400, "<Code>RequestTimeout</Code>"));
        assert!(is_permanent_status(400, "InvalidArgument"));
        assert!(matches!(
            classify_generic("s3://b/k", "connection reset by peer".into()),
            StoreFailure::Transient(_)
        ));
    }

    fn local_failure(error: std::io::Error) -> StoreFailure {
        let error = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(error),
        };
        classify_store_error("file:///data/x.json", error, None)
    }

    #[test]
    fn local_errors_that_cannot_heal_fail_at_once_with_their_errno() {
        for kind in [
            ErrorKind::NotADirectory,
            ErrorKind::PermissionDenied,
            ErrorKind::StorageFull,
            ErrorKind::ReadOnlyFilesystem,
            ErrorKind::IsADirectory,
        ] {
            match local_failure(std::io::Error::from(kind)) {
                StoreFailure::Fatal(NativeError::Io { path, .. }) => {
                    assert_eq!(path, "/data/x.json")
                }
                other => panic!("{kind:?}: {other:?}"),
            }
        }
        // errno 28 (ENOSPC) and 30 (EROFS) as the kernel reports them.
        for errno in [28, 30] {
            match local_failure(std::io::Error::from_raw_os_error(errno)) {
                StoreFailure::Fatal(NativeError::Io { errno: got, .. }) => {
                    assert_eq!(got, Some(errno))
                }
                other => panic!("errno {errno}: {other:?}"),
            }
        }
        assert!(matches!(
            local_failure(std::io::Error::from(ErrorKind::Interrupted)),
            StoreFailure::Transient(_)
        ));
    }
}
