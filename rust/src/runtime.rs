//! The process's async runtime, rebuilt in a forked child.
//!
//! A tokio runtime's worker threads do not survive `fork()`: a child that inherited the parent's
//! runtime would wait forever on threads that no longer exist (PyTorch DataLoader workers fork).
//! We remember the process id the runtime was built in and build a fresh one when it changes.

use std::sync::{Arc, Mutex};

use tokio::runtime::{Builder, Runtime};

use crate::error::{NativeError, NativeResult};

static RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The runtime of the current process, built on first use (and again after a fork).
pub fn runtime() -> NativeResult<Arc<Runtime>> {
    let pid = std::process::id();
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
