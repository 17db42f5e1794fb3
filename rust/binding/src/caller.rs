//! How the binding waits on the core: the GIL released while Rust blocks, Ctrl-C (and any
//! signal handler's exception) honoured every `SIGNAL_POLL`, warnings on the package logger.

use pyo3::prelude::*;
use syvain_core::caller::Caller;

use crate::error::BindingError;

/// The Python thread that called in.
pub struct PythonCaller<'py>(pub Python<'py>);

impl Caller for PythonCaller<'_> {
    type Error = BindingError;

    fn blocking<T: Send, F: FnOnce() -> T + Send>(&self, work: F) -> T {
        crate::exiting::without_gil(self.0, work)
    }

    fn interrupted(&self) -> Result<(), BindingError> {
        Ok(self.0.check_signals()?)
    }
}

/// The core's warning sink: one WARNING line on the package's storage logger. Takes the GIL,
/// so it also serves the decoder threads, which hold none; skipped once the interpreter exits
/// (taking the GIL then would end the thread mid-Rust).
pub fn log_warning(message: &str) {
    if crate::exiting::exiting() {
        return;
    }
    Python::with_gil(|py| {
        let logged = py
            .import("logging")
            .and_then(|logging| {
                logging.call_method1("getLogger", ("syvain_training_data.storage",))
            })
            .and_then(|logger| logger.call_method1("warning", ("%s", message)));
        if let Err(error) = logged {
            error.print(py);
        }
    });
}
