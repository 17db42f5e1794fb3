//! Sorting storage failures into "retry" (transient) and "fail closed at once" (SPEC section 4).

use crate::error::NativeError;

/// What to do with a failed attempt.
#[derive(Debug)]
pub enum Failure {
    /// Connection reset or refused, timeout, 5xx, throttling, body ended early: retry.
    Transient(String),
    /// Missing object, authentication, precondition, invalid data, configuration: no retry.
    Fatal(NativeError),
}

/// The first line of an error, for logs and messages.
pub fn first_line(message: &str) -> &str {
    message.lines().next().unwrap_or("")
}

/// Classifies an `object_store` error raised while operating on `uri`.
pub fn classify(uri: &str, error: object_store::Error, if_match: Option<&str>) -> Failure {
    use object_store::Error as E;
    let detail = error_chain(&error);
    match error {
        // A multipart upload the store forgot: the whole write is retried (SPEC section 4).
        E::NotFound { .. } if detail.contains("NoSuchUpload") => Failure::Transient(detail),
        E::NotFound { .. } => Failure::Fatal(NativeError::NotFound {
            uri: uri.to_string(),
        }),
        E::AlreadyExists { .. } => Failure::Fatal(NativeError::AlreadyExists {
            uri: uri.to_string(),
        }),
        E::Precondition { .. } | E::NotModified { .. } => match if_match {
            Some(etag) => Failure::Fatal(NativeError::Changed {
                uri: uri.to_string(),
                etag: etag.to_string(),
            }),
            // A create-only write whose precondition failed: the object exists.
            None => Failure::Fatal(NativeError::AlreadyExists {
                uri: uri.to_string(),
            }),
        },
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => {
            Failure::Fatal(NativeError::Permission {
                uri: uri.to_string(),
                detail: first_line(&detail).to_string(),
            })
        }
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => {
            Failure::Fatal(NativeError::Config(format!("{uri}: {detail}")))
        }
        E::NotSupported { .. } | E::NotImplemented => Failure::Fatal(NativeError::Storage {
            uri: uri.to_string(),
            detail,
        }),
        _ => classify_generic(uri, detail),
    }
}

/// Generic errors carry an HTTP status in their text when the server answered at all.
fn classify_generic(uri: &str, detail: String) -> Failure {
    match http_status(&detail) {
        Some(status) if is_permanent_status(status, &detail) => {
            Failure::Fatal(NativeError::Storage {
                uri: uri.to_string(),
                detail,
            })
        }
        _ => Failure::Transient(detail),
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

fn http_status(detail: &str) -> Option<u16> {
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
            Failure::Transient(_)
        ));
    }
}
