//! Where retry warnings go (SPEC section 4: one WARNING line per retried attempt).
//!
//! The core only formats them; the binding installs a sink that writes them to the package's
//! Python logger. Without one (Rust tests, fuzzing) they go to the `log` crate.

use std::sync::OnceLock;

/// Receives one formatted warning line.
pub type WarningSink = fn(&str);

static SINK: OnceLock<WarningSink> = OnceLock::new();

/// Installs the process's sink; the first installation wins.
pub fn set_sink(sink: WarningSink) {
    let _ = SINK.set(sink);
}

/// Reports one warning line.
pub fn warn(message: &str) {
    match SINK.get() {
        Some(sink) => sink(message),
        None => log::warn!(target: "syvain_training_data.storage", "{message}"),
    }
}
