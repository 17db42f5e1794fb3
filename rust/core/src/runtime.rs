//! The process's async runtime, rebuilt in a forked child, and the fork guard of our locks.
//!
//! A tokio runtime's worker threads do not survive `fork()`: a child that inherited the parent's
//! runtime would wait forever on threads that no longer exist (PyTorch DataLoader workers fork).
//! We remember the process id the runtime was built in and build a fresh one when it changes.
//!
//! A lock held by another thread at the moment of `fork()` stays held forever in the child. So
//! every process-wide lock of this crate (the runtime slot, the store caches, the policy) is
//! taken under `fork_guard()`, and a `pthread_atfork` handler makes `fork()` wait until no
//! thread is inside such a section; the child then starts with all of them free.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::runtime::{Builder, Runtime};

use crate::error::{NativeError, NativeResult};

/// How long a call blocked in Rust (without the GIL) waits before it takes the GIL back to
/// look for Ctrl-C (and log what it has to log): one value for every waiting loop.
pub const SIGNAL_POLL: std::time::Duration = std::time::Duration::from_millis(50);

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// Shared by every short critical section; taken exclusively around `fork()`.
static FORK_GUARD: RwLock<()> = RwLock::new(());

thread_local! {
    /// The exclusive hold the forking thread takes before `fork()` and drops after it.
    static FORKING: RefCell<Option<RwLockWriteGuard<'static, ()>>> = const { RefCell::new(None) };
}

/// Keeps `fork()` out while held. Hold it only for short sections that never wait on the GIL,
/// never fork, and never take it again (the lock prefers a waiting fork to new readers).
pub fn fork_guard() -> RwLockReadGuard<'static, ()> {
    register_fork_handlers();
    FORK_GUARD.read().unwrap_or_else(|p| p.into_inner())
}

#[cfg(unix)]
fn register_fork_handlers() {
    static REGISTERED: std::sync::Once = std::sync::Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: the handlers are plain functions that live as long as the process.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork));
        }
    });
}

#[cfg(not(unix))]
fn register_fork_handlers() {}

#[cfg(unix)]
extern "C" fn before_fork() {
    let guard = FORK_GUARD.write().unwrap_or_else(|p| p.into_inner());
    let _ = FORKING.try_with(|held| *held.borrow_mut() = Some(guard));
}

/// Runs in the parent and in the child (there the forking thread is the only thread).
#[cfg(unix)]
extern "C" fn after_fork() {
    let _ = FORKING.try_with(|held| held.borrow_mut().take());
}

/// The runtime of the current process, built on first use (and again after a fork).
pub fn runtime() -> NativeResult<Arc<Runtime>> {
    let pid = std::process::id();
    let _no_fork = fork_guard();
    let mut slot = RUNTIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((owner, runtime)) = slot.as_ref() {
        if *owner == pid {
            return Ok(runtime.clone());
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // Dropping it would join threads that do not exist in this process.
        std::mem::forget(inherited);
    }
    let runtime = Arc::new(
        Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("syvain-io")
            .enable_all()
            .build()
            .map_err(|e| NativeError::Config(format!("cannot start the I/O runtime: {e}")))?,
    );
    *slot = Some((pid, runtime.clone()));
    Ok(runtime)
}
