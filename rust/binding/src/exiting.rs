//! Threads waiting in native code when the interpreter exits.
//!
//! Before Python 3.14, a thread that takes the GIL back once finalization has begun is ended
//! with `pthread_exit`, whose forced unwind through Rust frames aborts the process ("FATAL:
//! exception not rethrown", status 134) instead of letting it exit with its own status
//! (CPython gh-87135; PyO3 covers `with_gil`, not `allow_threads`). An `atexit` hook, which
//! runs before finalization begins, marks the exit; from then on a waiting thread never
//! re-enters Python: it parks and dies with the process. `Py_IsFinalizing` is not in the
//! 3.12 stable ABI this extension targets, hence the hook.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;

use pyo3::prelude::*;

static EXITING: AtomicBool = AtomicBool::new(false);
/// The thread that runs the exit (the main thread): it must go on, so it never parks.
static EXITING_THREAD: OnceLock<ThreadId> = OnceLock::new();

/// The `atexit` hook.
#[pyfunction]
fn mark_interpreter_exiting() {
    let _ = EXITING_THREAD.set(std::thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
}

/// Registers the hook; called once, when the extension is loaded.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(mark_interpreter_exiting, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}

/// Whether the interpreter is exiting (its `atexit` hooks have begun).
pub fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

/// Never returns on a thread other than the exiting one once the interpreter exits.
pub fn park_if_exiting() {
    if !exiting() || EXITING_THREAD.get() == Some(&std::thread::current().id()) {
        return;
    }
    loop {
        std::thread::park();
    }
}

/// `py.allow_threads(work)`, except that a thread whose work ends after the exit began parks
/// instead of taking the GIL back.
pub fn without_gil<T: Send, F: FnOnce() -> T + Send>(py: Python<'_>, work: F) -> T {
    py.allow_threads(|| {
        let out = work();
        park_if_exiting();
        out
    })
}
