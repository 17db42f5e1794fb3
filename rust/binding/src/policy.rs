//! The storage timing policy (SPEC section 4), read and replaced from Python.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use syvain_core::error::NativeError;
use syvain_core::policy;

use crate::error::BindingResult;

/// Replaces the timing constants (testing seam). Durations in seconds.
#[pyfunction]
#[pyo3(signature = (*, max_attempts, window_s, backoff_base_s, backoff_cap_s, connect_timeout_s, read_inactivity_timeout_s, request_timeout_s, stream_response_deadline_s))]
#[allow(clippy::too_many_arguments)]
pub fn set_storage_policy(
    max_attempts: u32,
    window_s: f64,
    backoff_base_s: f64,
    backoff_cap_s: f64,
    connect_timeout_s: f64,
    read_inactivity_timeout_s: f64,
    request_timeout_s: f64,
    stream_response_deadline_s: f64,
) -> BindingResult<()> {
    let seconds = |name: &str, value: f64| {
        Duration::try_from_secs_f64(value).map_err(|_| {
            NativeError::Config(format!("{name} must be a non-negative number of seconds"))
        })
    };
    if max_attempts == 0 {
        return Err(NativeError::Config("max_attempts must be at least 1".into()).into());
    }
    policy::set(policy::Policy {
        max_attempts,
        window: seconds("window_s", window_s)?,
        backoff_base: seconds("backoff_base_s", backoff_base_s)?,
        backoff_cap: seconds("backoff_cap_s", backoff_cap_s)?,
        connect_timeout: seconds("connect_timeout_s", connect_timeout_s)?,
        read_inactivity_timeout: seconds("read_inactivity_timeout_s", read_inactivity_timeout_s)?,
        request_timeout: seconds("request_timeout_s", request_timeout_s)?,
        stream_response_deadline: seconds(
            "stream_response_deadline_s",
            stream_response_deadline_s,
        )?,
    });
    Ok(())
}

/// The timing constants in force, as a dict of the `set_storage_policy` arguments.
#[pyfunction]
pub fn get_storage_policy(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let p = policy::current();
    let dict = PyDict::new(py);
    dict.set_item("max_attempts", p.max_attempts)?;
    dict.set_item("window_s", p.window.as_secs_f64())?;
    dict.set_item("backoff_base_s", p.backoff_base.as_secs_f64())?;
    dict.set_item("backoff_cap_s", p.backoff_cap.as_secs_f64())?;
    dict.set_item("connect_timeout_s", p.connect_timeout.as_secs_f64())?;
    dict.set_item(
        "read_inactivity_timeout_s",
        p.read_inactivity_timeout.as_secs_f64(),
    )?;
    dict.set_item("request_timeout_s", p.request_timeout.as_secs_f64())?;
    dict.set_item(
        "stream_response_deadline_s",
        p.stream_response_deadline.as_secs_f64(),
    )?;
    Ok(dict)
}
