//! Cheap counters of the streams a consumer opens: streams, bytes handed over, retries by cause.
//!
//! Counters are entered (the binding's `StreamCounters` context manager) around the call that
//! opens a stream; every stream opened by that thread meanwhile adds to them for its whole
//! life, reconnections included. A stream opened outside any counters counts nowhere, at no
//! cost.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::classify::{error_chain, http_status};

/// Why a stream retried, as reported by `StreamCounters.retries`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryCause {
    /// The connection failed, was refused, reset or dropped (before or during the body).
    Connection,
    /// No response or no data within the timeouts.
    Timeout,
    /// The store answered with a retryable HTTP status (5xx, throttling, 408).
    Status,
    /// The body ended before the object's size.
    EndedEarly,
    /// Any other transient failure (a local read interrupted, ...).
    Other,
}

impl RetryCause {
    pub const ALL: [RetryCause; 5] = [
        RetryCause::Connection,
        RetryCause::Timeout,
        RetryCause::Status,
        RetryCause::EndedEarly,
        RetryCause::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RetryCause::Connection => "connection",
            RetryCause::Timeout => "timeout",
            RetryCause::Status => "status",
            RetryCause::EndedEarly => "ended_early",
            RetryCause::Other => "other",
        }
    }

    /// The cause of a transient `object_store` error, by the error's type and HTTP status.
    pub fn of(error: &object_store::Error) -> RetryCause {
        let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(inner) = current {
            if let Some(http) = inner.downcast_ref::<object_store::client::HttpError>() {
                return match http.kind() {
                    object_store::client::HttpErrorKind::Timeout => RetryCause::Timeout,
                    _ => RetryCause::Connection,
                };
            }
            if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::TimedOut => RetryCause::Timeout,
                    std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof => RetryCause::Connection,
                    _ => RetryCause::Other,
                };
            }
            current = inner.source();
        }
        if http_status(&error_chain(error)).is_some() {
            RetryCause::Status
        } else {
            RetryCause::Other
        }
    }
}

/// The shared counts; streams hold it through an `Arc` for their whole life.
#[derive(Default)]
pub struct Counters {
    streams: AtomicU64,
    bytes: AtomicU64,
    retries: [AtomicU64; RetryCause::ALL.len()],
}

impl Counters {
    pub fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::Relaxed);
    }

    pub fn bytes_received(&self, bytes: usize) {
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn retried(&self, cause: RetryCause) {
        self.retries[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Streams opened.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Bytes the streams handed to their readers.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Retries with this cause.
    pub fn retries(&self, cause: RetryCause) -> u64 {
        self.retries[cause as usize].load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The counters entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<Arc<Counters>>> = const { RefCell::new(Vec::new()) };
}

/// The counters a stream opened now on this thread adds to, if any.
pub fn entered() -> Option<Arc<Counters>> {
    ENTERED.with(|entered| entered.borrow().last().cloned())
}

/// Makes streams opened on this thread add to `counters` until [`exit`] (innermost wins).
pub fn enter(counters: Arc<Counters>) {
    ENTERED.with(|entered| entered.borrow_mut().push(counters));
}

/// Undoes the innermost [`enter`] of `counters` on this thread.
pub fn exit(counters: &Arc<Counters>) {
    ENTERED.with(|entered| {
        let mut entered = entered.borrow_mut();
        if let Some(at) = entered.iter().rposition(|c| Arc::ptr_eq(c, counters)) {
            entered.remove(at);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cause_names_are_distinct_and_indexed_in_order() {
        for (index, cause) in RetryCause::ALL.iter().enumerate() {
            assert_eq!(*cause as usize, index);
        }
        let mut names: Vec<_> = RetryCause::ALL.iter().map(|c| c.name()).collect();
        names.dedup();
        assert_eq!(names.len(), RetryCause::ALL.len());
    }

    #[test]
    fn entered_counters_nest_per_thread() {
        let outer = Arc::new(Counters::default());
        let inner = Arc::new(Counters::default());
        enter(outer.clone());
        enter(inner.clone());
        assert!(Arc::ptr_eq(&entered().unwrap(), &inner));
        std::thread::spawn(|| assert!(entered().is_none()))
            .join()
            .unwrap();
        exit(&inner);
        assert!(Arc::ptr_eq(&entered().unwrap(), &outer));
        exit(&outer);
        assert!(entered().is_none());
    }
}
