//! A Python callable as object_store's `CredentialProvider`: called on a blocking thread that
//! takes the GIL only for the call, so requests that wait for credentials never hold it, and
//! cached until shortly before the expiry it returns.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use syvain_core::credentials::{credential_error, credential_error_of, CredentialCache};

/// What the Python side's validating wrapper returns: (access key id, secret, session token,
/// seconds until expiry).
type Returned = (String, String, Option<String>, Option<f64>);

pub struct PyCredentialProvider {
    /// The validating wrapper around the user's callable (`storage._ProviderCall`).
    callable: Arc<Py<PyAny>>,
    /// The provider's name, for messages.
    name: String,
    cache: CredentialCache,
}

impl fmt::Debug for PyCredentialProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PyCredentialProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl PyCredentialProvider {
    pub fn new(py: Python<'_>, callable: Py<PyAny>) -> Self {
        let name = callable
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "credential_provider".to_string());
        Self {
            callable: Arc::new(callable),
            name,
            cache: CredentialCache::default(),
        }
    }
}

/// The first line of the wrapper's exception (which names the provider and the field, never a
/// value), and whether it is a TypeError (a value of the wrong type).
fn describe(py: Python<'_>, error: &PyErr) -> (String, bool) {
    let text = error.value(py).to_string();
    let first = text.lines().next().unwrap_or("").to_string();
    (first, error.is_instance_of::<PyTypeError>(py))
}

#[async_trait]
impl CredentialProvider for PyCredentialProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some(credential) = self.cache.fresh() {
            return Ok(credential);
        }
        // Python cannot be called once the interpreter exits (the thread would hang there).
        if crate::exiting::exiting() {
            return Err(credential_error(format!(
                "credential provider {}: the interpreter is exiting",
                self.name
            )));
        }
        let callable = self.callable.clone();
        let called = tokio::task::spawn_blocking(move || {
            Python::with_gil(|py| {
                callable
                    .call0(py)
                    .and_then(|value| value.extract::<Returned>(py))
                    .map_err(|error| describe(py, &error))
            })
        })
        .await
        .map_err(|e| credential_error(format!("credential provider {}: {e}", self.name)))?;
        let (key_id, secret_key, token, expires_in) =
            called.map_err(|(message, wrong_type)| credential_error_of(message, wrong_type))?;
        let credential = Arc::new(AwsCredential {
            key_id,
            secret_key,
            token,
        });
        let expires_in = expires_in.map(|seconds| Duration::from_secs_f64(seconds.max(0.0)));
        self.cache.store(credential.clone(), expires_in);
        Ok(credential)
    }
}
