//! How a blocking call waits, and point operations retried under the SPEC budget.
//!
//! The thread that calls into the core decides what happens while it waits and what
//! interrupts it: the binding releases the GIL and looks for Ctrl-C every `SIGNAL_POLL`; a Rust
//! caller ([`Uninterrupted`]) just blocks. Retry warnings go to [`crate::warnings`].

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::classify::{first_line, StoreFailure};
use crate::error::NativeError;
use crate::policy::{self, Budget};
use crate::process_bound::ProcessBound;
use crate::runtime::{fork_guard, runtime, SIGNAL_POLL};
use crate::stream::{Received, StreamReader};
use crate::warnings;

/// The thread a blocking call runs on.
pub trait Caller {
    /// What the call fails with: the core's errors, or what interrupted it.
    type Error: From<NativeError>;

    /// Runs `work`, which blocks, letting the caller's other threads run meanwhile.
    fn blocking<T: Send, F: FnOnce() -> T + Send>(&self, work: F) -> T;

    /// Fails when the caller was interrupted (Ctrl-C) since it last looked.
    fn interrupted(&self) -> Result<(), Self::Error>;
}

/// A caller that nothing interrupts: Rust tests and tools.
pub struct Uninterrupted;

impl Caller for Uninterrupted {
    type Error = NativeError;

    fn blocking<T: Send, F: FnOnce() -> T + Send>(&self, work: F) -> T {
        work()
    }

    fn interrupted(&self) -> Result<(), NativeError> {
        Ok(())
    }
}

/// How long an interruption waits for cleanups (aborting a multipart upload) before it is
/// reported.
const CLEANUP_GRACE: Duration = Duration::from_secs(10);

/// Cleanup requests started by a cancelled operation, for `wait` to let finish.
/// A forked child leaks the parent's (they belong to the parent's runtime).
static CLEANUPS: Mutex<Vec<ProcessBound<JoinHandle<()>>>> = Mutex::new(Vec::new());

fn lock_cleanups() -> std::sync::MutexGuard<'static, Vec<ProcessBound<JoinHandle<()>>>> {
    CLEANUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a cleanup request (from a `Drop`, inside the runtime) that an interrupted `wait`
/// lets finish before it returns.
pub fn spawn_cleanup<F>(future: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let task = handle.spawn(future);
    let _no_fork = fork_guard();
    let mut cleanups = lock_cleanups();
    cleanups.retain(|task| task.get().is_some_and(|task| !task.is_finished()));
    cleanups.push(ProcessBound::new(task));
}

/// Runs `future` on the process runtime while the caller waits; an interruption aborts it.
pub fn wait<C, F, T>(caller: &C, future: F) -> Result<T, C::Error>
where
    C: Caller,
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = runtime()?;
    let mut handle = runtime.spawn(future);
    loop {
        let polled = caller.blocking(|| {
            runtime.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut handle).await })
        });
        match polled {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(join_error)) => return Err(NativeError::Task(join_error.to_string()).into()),
            Err(_) => {
                if let Err(interrupt) = caller.interrupted() {
                    handle.abort();
                    // Let the cancelled task drop (starting its cleanups), then let those run.
                    caller.blocking(|| {
                        runtime.block_on(async {
                            let _ = (&mut handle).await;
                            let cleanups = {
                                let _no_fork = fork_guard();
                                std::mem::take(&mut *lock_cleanups())
                            };
                            let cleanups =
                                cleanups.into_iter().filter_map(ProcessBound::into_inner);
                            let all = futures::future::join_all(cleanups);
                            let _ = tokio::time::timeout(CLEANUP_GRACE, all).await;
                        })
                    });
                    return Err(interrupt);
                }
            }
        }
    }
}

/// Sleeps while the caller waits, waking for an interruption.
pub fn sleep<C: Caller>(caller: &C, delay: Duration) -> Result<(), C::Error> {
    // The timer must be created inside the runtime, so it is built in the async block.
    wait(caller, async move { tokio::time::sleep(delay).await })
}

/// The warning of SPEC section 4: operation, URI, attempt, elapsed, delay, first error line.
pub fn retry_message(
    operation: &str,
    uri: &str,
    attempt: u32,
    elapsed: Duration,
    delay: Duration,
    error: &str,
) -> String {
    format!(
        "Retrying {operation} {uri}: attempt {attempt} failed after {:.1} s; next attempt in \
         {:.2} s: {}",
        elapsed.as_secs_f64(),
        delay.as_secs_f64(),
        first_line(error)
    )
}

/// Runs a point operation (get, head, put, list, delete) until it succeeds, fails closed, or
/// spends the budget. `attempt(fresh)` builds the future; `fresh` asks for a new client.
pub fn with_retries<C, T, F, Fut>(
    caller: &C,
    operation: &'static str,
    uri: &str,
    mut attempt: F,
) -> Result<T, C::Error>
where
    C: Caller,
    F: FnMut(bool) -> Result<Fut, NativeError>,
    Fut: Future<Output = Result<T, StoreFailure>> + Send + 'static,
    T: Send + 'static,
{
    let mut budget = Budget::new(policy::current());
    let mut fresh = false;
    loop {
        let future = attempt(fresh)?;
        match wait(caller, future)? {
            Ok(value) => return Ok(value),
            Err(StoreFailure::Fatal(error)) => return Err(error.into()),
            Err(StoreFailure::Transient(detail)) => {
                let elapsed = budget.elapsed_without_progress();
                let Some(delay) = budget.next_delay() else {
                    return Err(NativeError::RetryExhausted {
                        operation,
                        uri: uri.to_string(),
                        position: String::new(),
                        attempts: budget.failed_attempts(),
                        elapsed_s: budget.elapsed().as_secs_f64(),
                        last_error: first_line(&detail).to_string(),
                    }
                    .into());
                };
                let message = retry_message(
                    operation,
                    uri,
                    budget.failed_attempts(),
                    elapsed,
                    delay,
                    &detail,
                );
                warnings::warn(&message);
                sleep(caller, delay)?;
                fresh = true;
            }
        }
    }
}

/// The stream's next chunk, waiting as the caller waits and reporting its retry warnings.
pub fn next_chunk<C: Caller>(
    caller: &C,
    reader: &mut StreamReader,
) -> Result<Option<bytes::Bytes>, C::Error> {
    loop {
        let received = caller.blocking(|| reader.receive(SIGNAL_POLL));
        for warning in reader.take_warnings() {
            warnings::warn(&warning);
        }
        match received? {
            Received::Chunk(chunk) => return Ok(Some(chunk)),
            Received::End => return Ok(None),
            Received::Pending => caller.interrupted()?,
        }
    }
}

/// The next message of a decoder thread, waiting as the caller waits; `None` once the thread
/// is gone. (The mutex only makes the receiver shareable with the waiting closure.)
pub fn receive<C: Caller, T: Send>(
    caller: &C,
    receiver: &std::sync::Mutex<std::sync::mpsc::Receiver<T>>,
) -> Result<Option<T>, C::Error> {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let got = caller.blocking(|| {
            let receiver = receiver
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            receiver.recv_timeout(SIGNAL_POLL)
        });
        match got {
            Ok(message) => return Ok(Some(message)),
            Err(RecvTimeoutError::Timeout) => caller.interrupted()?,
            Err(RecvTimeoutError::Disconnected) => return Ok(None),
        }
    }
}
