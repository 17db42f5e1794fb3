//! The ERROR line a jsonl.gz reader logs for each invalid line it skips (SPEC section 3).

use pyo3::prelude::*;

const LOGGER: &str = "syvain_training_data";

/// The package logger, looked up on the first invalid line of a shard.
#[derive(Default)]
pub struct InvalidLines {
    logger: Option<PyObject>,
}

impl InvalidLines {
    /// Logs "Skipping invalid JSON record in {uri}:{number}" for each line number.
    pub fn log(&mut self, py: Python<'_>, uri: &str, numbers: &[u64]) -> PyResult<()> {
        if numbers.is_empty() {
            return Ok(());
        }
        let logger = match &self.logger {
            Some(logger) => logger.bind(py).clone(),
            None => {
                let logger = py.import("logging")?.call_method1("getLogger", (LOGGER,))?;
                self.logger = Some(logger.clone().unbind());
                logger
            }
        };
        for number in numbers {
            logger.call_method1(
                "error",
                ("Skipping invalid JSON record in %s:%d", uri, *number),
            )?;
        }
        Ok(())
    }
}
