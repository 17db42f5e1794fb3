//! Running storage futures from Python: GIL released, Ctrl-C honoured, retries under the budget.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;

use crate::classify::{first_line, Failure};
use crate::error::{NativeError, NativeResult};
use crate::policy::{self, Budget};
use crate::runtime::SIGNAL_POLL;
use crate::runtime::{fork_guard, runtime};
use tokio::task::JoinHandle;

/// How long Ctrl-C waits for cleanups (aborting a multipart upload) before it is reported.
const CLEANUP_GRACE: Duration = Duration::from_secs(10);

/// Cleanup requests started by a cancelled operation, for `wait` to let finish.
static CLEANUPS: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

fn lock_cleanups() -> std::sync::MutexGuard<'static, Vec<JoinHandle<()>>> {
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
    cleanups.retain(|task| !task.is_finished());
    cleanups.push(task);
}

/// Runs `future` on the process runtime with the GIL released; Ctrl-C aborts it.
pub fn wait<F, T>(py: Python<'_>, future: F) -> NativeResult<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let runtime = runtime()?;
    let mut handle = runtime.spawn(future);
    loop {
        let polled = py.allow_threads(|| {
            runtime.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut handle).await })
        });
        match polled {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(join_error)) => return Err(NativeError::Task(join_error.to_string())),
            Err(_) => {
                if let Err(interrupt) = py.check_signals() {
                    handle.abort();
                    // Let the cancelled task drop (starting its cleanups), then let those run.
                    py.allow_threads(|| {
                        runtime.block_on(async {
                            let _ = (&mut handle).await;
                            let cleanups = {
                                let _no_fork = fork_guard();
                                std::mem::take(&mut *lock_cleanups())
                            };
                            let all = futures::future::join_all(cleanups);
                            let _ = tokio::time::timeout(CLEANUP_GRACE, all).await;
                        })
                    });
                    return Err(interrupt.into());
                }
            }
        }
    }
}

/// Sleeps with the GIL released, waking for Ctrl-C.
pub fn sleep(py: Python<'_>, delay: Duration) -> NativeResult<()> {
    // The timer must be created inside the runtime, so it is built in the async block.
    wait(py, async move { tokio::time::sleep(delay).await })
}

/// Logs one WARNING line on the package's storage logger.
pub fn log_warning(py: Python<'_>, message: &str) {
    let logged = py
        .import("logging")
        .and_then(|logging| logging.call_method1("getLogger", ("syvain_training_data.storage",)))
        .and_then(|logger| logger.call_method1("warning", ("%s", message)));
    if let Err(error) = logged {
        error.print(py);
    }
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
pub fn with_retries<T, F, Fut>(
    py: Python<'_>,
    operation: &'static str,
    uri: &str,
    mut attempt: F,
) -> NativeResult<T>
where
    F: FnMut(bool) -> NativeResult<Fut>,
    Fut: Future<Output = Result<T, Failure>> + Send + 'static,
    T: Send + 'static,
{
    let mut budget = Budget::new(policy::current());
    let mut fresh = false;
    loop {
        let future = attempt(fresh)?;
        match wait(py, future)? {
            Ok(value) => return Ok(value),
            Err(Failure::Fatal(error)) => return Err(error),
            Err(Failure::Transient(detail)) => {
                let elapsed = budget.elapsed_without_progress();
                let Some(delay) = budget.next_delay() else {
                    return Err(NativeError::RetryExhausted {
                        operation,
                        uri: uri.to_string(),
                        position: String::new(),
                        attempts: budget.failed_attempts(),
                        elapsed_s: budget.elapsed().as_secs_f64(),
                        last_error: first_line(&detail).to_string(),
                    });
                };
                let message = retry_message(
                    operation,
                    uri,
                    budget.failed_attempts(),
                    elapsed,
                    delay,
                    &detail,
                );
                log_warning(py, &message);
                sleep(py, delay)?;
                fresh = true;
            }
        }
    }
}
