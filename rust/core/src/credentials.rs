//! Where S3 requests get their credentials when no static key pair is given: the AWS SDKs'
//! default chain (environment, web identity, container credentials, instance metadata), or a
//! caller's own [`CredentialProvider`] (the binding's Python callable).
//!
//! Every failure to obtain credentials is a [`CredentialError`]: it fails the operation at once
//! (no retry under the storage budget; the HTTP sources retry a few times themselves), names
//! the source (and, when nothing was found, every source tried), and never holds a secret.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsCredential};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use object_store::{ClientOptions, CredentialProvider, RetryConfig, StaticCredentialProvider};

use crate::classify::error_chain;
use crate::policy::{self, Policy};
use crate::runtime::fork_guard;

/// What object_store signs requests with.
pub type AwsCredentialProvider = Arc<dyn CredentialProvider<Credential = AwsCredential>>;

/// Cached credentials are fetched again once they have less than this left (object_store's
/// own sources use the same margin).
pub const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// The EC2 instance metadata service (IMDSv2).
pub const DEFAULT_METADATA_ENDPOINT: &str = "http://169.254.169.254";
/// The ECS task credentials host that `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` is relative to.
pub const ECS_CREDENTIALS_HOST: &str = "http://169.254.170.2";

/// Credentials could not be obtained. The message names the source; never a secret.
/// `wrong_type`: a provider answered a value of the wrong type (TypeError, not ValueError).
#[derive(Debug)]
pub struct CredentialError {
    pub message: String,
    pub wrong_type: bool,
}

impl fmt::Display for CredentialError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CredentialError {}

/// The object_store error a credential failure travels in (found again by `classify`).
pub fn credential_error(message: impl Into<String>) -> object_store::Error {
    credential_error_of(message, false)
}

/// [`credential_error`], saying whether a value had the wrong type.
pub fn credential_error_of(message: impl Into<String>, wrong_type: bool) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: Box::new(CredentialError {
            message: message.into(),
            wrong_type,
        }),
    }
}

/// The credential failure inside an error, if it is one.
pub fn find_credential_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a CredentialError> {
    let mut current = Some(error);
    while let Some(inner) = current {
        if let Some(found) = inner.downcast_ref::<CredentialError>() {
            return Some(found);
        }
        current = inner.source();
    }
    None
}

/// Credentials cached until shortly before they expire (`None`: never expire).
#[derive(Default)]
pub struct CredentialCache {
    cached: Mutex<Option<(Arc<AwsCredential>, Option<Instant>)>>,
}

impl fmt::Debug for CredentialCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CredentialCache")
    }
}

impl CredentialCache {
    /// The cached credential if it has more than [`REFRESH_MARGIN`] left.
    pub fn fresh(&self) -> Option<Arc<AwsCredential>> {
        let _no_fork = fork_guard();
        let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        match &*cached {
            Some((credential, None)) => Some(credential.clone()),
            Some((credential, Some(expiry)))
                if expiry.saturating_duration_since(Instant::now()) > REFRESH_MARGIN =>
            {
                Some(credential.clone())
            }
            _ => None,
        }
    }

    pub fn store(&self, credential: Arc<AwsCredential>, expires_in: Option<Duration>) {
        let expiry = expires_in.map(|ttl| Instant::now() + ttl);
        let _no_fork = fork_guard();
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some((credential, expiry));
    }
}

/// A non-empty environment variable.
fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .filter(|value| !value.trim().is_empty())
}

/// How the credential sources reach their HTTP endpoints: the storage timeouts, and a few
/// retries of their own (a failure to obtain credentials is not retried by the storage layer).
fn source_options(policy: &Policy) -> (ClientOptions, RetryConfig) {
    let options = ClientOptions::new()
        .with_allow_http(true)
        .with_connect_timeout(policy.connect_timeout)
        .with_timeout(policy.connect_timeout.max(Duration::from_secs(1)) * 3);
    let retry = RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(30),
        backoff: Default::default(),
    };
    (options, retry)
}

/// The AWS SDKs' default credential chain, resolved in each process on first use (a forked or
/// spawned worker resolves its own), each source refreshing its credentials before they expire.
pub struct ChainProvider {
    region: String,
    resolved: Mutex<Option<(u32, Arc<Resolved>)>>,
}

impl fmt::Debug for ChainProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChainProvider")
    }
}

/// The source the chain settled on.
struct Resolved {
    /// "container credentials (http://...)".
    source: String,
    /// The sources found unset before it, for the message when it fails too.
    tried: Vec<String>,
    provider: AwsCredentialProvider,
}

impl ChainProvider {
    pub fn new(region: &str) -> Self {
        Self {
            region: region.to_string(),
            resolved: Mutex::new(None),
        }
    }

    fn resolve(&self) -> object_store::Result<Arc<Resolved>> {
        let pid = std::process::id();
        {
            let _no_fork = fork_guard();
            let resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((owner, resolved)) = &*resolved {
                if *owner == pid {
                    return Ok(resolved.clone());
                }
            }
        }
        // Built outside the lock (a fork must never find it held).
        let resolved = Arc::new(resolve_chain(&self.region, &policy::current())?);
        let _no_fork = fork_guard();
        *self.resolved.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, resolved.clone()));
        Ok(resolved)
    }
}

#[async_trait]
impl CredentialProvider for ChainProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        // Setting a source up can fail too (a client that cannot be built): never retried.
        let resolved = self
            .resolve()
            .map_err(|error| match find_credential_error(&error) {
                Some(_) => error,
                None => credential_error(format!(
                    "could not set up a credential source: {}",
                    error_chain(&error)
                )),
            })?;
        resolved.provider.get_credential().await.map_err(|error| {
            let detail = match find_credential_error(&error) {
                Some(found) => found.message.clone(),
                None => error_chain(&error),
            };
            let mut message = format!(
                "could not get credentials from {}: {detail}",
                resolved.source
            );
            if resolved.source.starts_with("instance metadata") {
                message = format!(
                    "no credentials found; tried {}; {message}. {NO_CREDENTIALS_HINT}",
                    resolved.tried.join("; ")
                );
            }
            credential_error(message)
        })
    }
}

pub const NO_CREDENTIALS_HINT: &str = "Pass access_key_id and secret_access_key (and \
    session_token), a credential_provider, skip_signature=True for a public bucket, or set \
    AWS_PROFILE (with the aws extra installed)";

/// Picks the first configured source, in the AWS SDKs' order.
fn resolve_chain(region: &str, policy: &Policy) -> object_store::Result<Resolved> {
    let mut tried = Vec::new();
    let (options, retry) = source_options(policy);

    // 1. Environment variables.
    if let (Some(key_id), Some(secret_key)) =
        (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"))
    {
        let credential = AwsCredential {
            key_id,
            secret_key,
            token: env("AWS_SESSION_TOKEN"),
        };
        return Ok(Resolved {
            source: "the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)".into(),
            tried,
            provider: Arc::new(StaticCredentialProvider::new(credential)),
        });
    }
    tried.push(
        "environment variables (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: not set)".into(),
    );

    // 2. Web identity (EKS IRSA): object_store's AssumeRoleWithWebIdentity, over HTTPS.
    if let (Some(token_file), Some(role_arn)) =
        (env("AWS_WEB_IDENTITY_TOKEN_FILE"), env("AWS_ROLE_ARN"))
    {
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name("credentials")
            .with_region(region)
            .with_client_options(options)
            .with_retry(retry);
        if let Some(sts) = env("AWS_ENDPOINT_URL_STS") {
            builder = builder.with_config(AmazonS3ConfigKey::StsEndpoint, sts);
        }
        if let Some(name) = env("AWS_ROLE_SESSION_NAME") {
            builder = builder.with_config(AmazonS3ConfigKey::RoleSessionName, name);
        }
        let store = builder.build()?;
        return Ok(Resolved {
            source: format!(
                "web identity (AWS_WEB_IDENTITY_TOKEN_FILE={token_file}, AWS_ROLE_ARN={role_arn})"
            ),
            tried,
            provider: store.credentials().clone(),
        });
    }
    tried.push("web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN: not set)".into());

    // 3. Container credentials (ECS task roles, EKS Pod Identity).
    let url = container_url(
        env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"),
        env("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
    );
    if let Some(url) = url {
        let token = match (
            env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"),
            env("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        ) {
            (Some(file), _) => ContainerToken::File(file),
            (None, Some(value)) => ContainerToken::Value(value),
            (None, None) => ContainerToken::None,
        };
        let provider = ContainerProvider::new(url.clone(), token, &options)?;
        return Ok(Resolved {
            source: format!("container credentials ({url})"),
            tried,
            provider: Arc::new(provider),
        });
    }
    tried.push(
        "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and \
         AWS_CONTAINER_CREDENTIALS_FULL_URI: not set)"
            .into(),
    );

    // 4. EC2 instance metadata (IMDSv2), unless disabled.
    if env("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        tried.push("instance metadata (disabled by AWS_EC2_METADATA_DISABLED)".into());
        return Err(credential_error(format!(
            "no credentials found; tried {}. {NO_CREDENTIALS_HINT}",
            tried.join("; ")
        )));
    }
    let endpoint = env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or_else(|| DEFAULT_METADATA_ENDPOINT.to_string());
    let endpoint = endpoint.trim_end_matches('/').to_string();
    let store = AmazonS3Builder::new()
        .with_bucket_name("credentials")
        .with_region(region)
        .with_client_options(options.with_connect_timeout(Duration::from_secs(1)))
        .with_retry(retry)
        .with_metadata_endpoint(&endpoint)
        .build()?;
    Ok(Resolved {
        source: format!("instance metadata (IMDSv2 at {endpoint})"),
        tried,
        provider: store.credentials().clone(),
    })
}

/// The container credentials URI: the relative one (ECS) on the task credentials host wins over
/// the full one, as in the AWS SDKs.
fn container_url(relative: Option<String>, full: Option<String>) -> Option<String> {
    match (relative, full) {
        (Some(relative), _) => Some(format!("{ECS_CREDENTIALS_HOST}{relative}")),
        (None, full) => full,
    }
}

/// The authorization token a container credentials request carries.
enum ContainerToken {
    None,
    /// Read again for every request (EKS Pod Identity rotates it).
    File(String),
    Value(String),
}

/// Container credentials: `GET` the URI (with the authorization token, if any); the answer is
/// `{"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}`.
pub struct ContainerProvider {
    url: String,
    token: ContainerToken,
    client: HttpClient,
    cache: CredentialCache,
}

impl fmt::Debug for ContainerProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContainerProvider")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// A container credentials URI over plain HTTP must stay on this host or on the ECS/EKS
/// agents' link-local addresses (as in the AWS SDKs); HTTPS may go anywhere.
fn check_container_url(url: &str) -> object_store::Result<()> {
    let parsed = url::Url::parse(url)
        .map_err(|e| credential_error(format!("invalid container credentials URI {url:?}: {e}")))?;
    let allowed_http = match parsed.host() {
        Some(url::Host::Domain(domain)) => domain == "localhost",
        Some(url::Host::Ipv4(ip)) => {
            ip.is_loopback()
                || ip.octets() == [169, 254, 170, 2]
                || ip.octets() == [169, 254, 170, 23]
        }
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip.segments() == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23]
        }
        None => false,
    };
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if allowed_http => Ok(()),
        _ => Err(credential_error(format!(
            "container credentials URI {url:?} must be https, or http to a loopback address or \
             the ECS/EKS credentials agent"
        ))),
    }
}

impl ContainerProvider {
    fn new(
        url: String,
        token: ContainerToken,
        options: &ClientOptions,
    ) -> object_store::Result<Self> {
        check_container_url(&url)?;
        let client = ReqwestConnector::default().connect(options)?;
        Ok(Self {
            url,
            token,
            client,
            cache: CredentialCache::default(),
        })
    }

    fn authorization(&self) -> Result<Option<String>, String> {
        match &self.token {
            ContainerToken::None => Ok(None),
            ContainerToken::Value(value) => Ok(Some(value.trim().to_string())),
            ContainerToken::File(path) => std::fs::read_to_string(path)
                .map(|token| Some(token.trim().to_string()))
                .map_err(|e| {
                    format!("cannot read AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE {path}: {e}")
                }),
        }
    }

    async fn fetch_once(&self) -> Result<(AwsCredential, Option<Duration>), (bool, String)> {
        let authorization = self.authorization().map_err(|e| (false, e))?;
        let mut request = http::Request::builder().method("GET").uri(&self.url);
        if let Some(token) = authorization {
            request = request.header("Authorization", token);
        }
        let request = request.body(HttpRequestBody::empty()).map_err(|_| {
            (
                false,
                "the authorization token is not a valid header value".to_string(),
            )
        })?;
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|e| (true, error_chain(&e)))?;
        let status = response.status();
        let body = response
            .into_body()
            .bytes()
            .await
            .map_err(|e| (true, error_chain(&e)))?;
        if !status.is_success() {
            return Err((status.is_server_error(), format!("HTTP status {status}")));
        }
        parse_credentials_json(&body).map_err(|e| (false, e))
    }
}

/// The JSON of the container and instance metadata services.
pub fn parse_credentials_json(body: &[u8]) -> Result<(AwsCredential, Option<Duration>), String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| "the answer is not JSON".to_string())?;
    let field = |name: &str| -> Result<String, String> {
        value
            .get(name)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| format!("the answer has no string {name}"))
    };
    let credential = AwsCredential {
        key_id: field("AccessKeyId")?,
        secret_key: field("SecretAccessKey")?,
        token: value
            .get("Token")
            .and_then(|v| v.as_str())
            .map(str::to_string),
    };
    let expires_in = match value.get("Expiration").and_then(|v| v.as_str()) {
        None => None,
        Some(text) => {
            let expiration = chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|_| format!("invalid Expiration {text:?}"))?;
            let left = expiration.with_timezone(&chrono::Utc) - chrono::Utc::now();
            Some(left.to_std().unwrap_or_default())
        }
    };
    Ok((credential, expires_in))
}

#[async_trait]
impl CredentialProvider for ContainerProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        if let Some(credential) = self.cache.fresh() {
            return Ok(credential);
        }
        let mut attempt = 0;
        loop {
            match self.fetch_once().await {
                Ok((credential, expires_in)) => {
                    let credential = Arc::new(credential);
                    self.cache.store(credential.clone(), expires_in);
                    return Ok(credential);
                }
                Err((true, _)) if attempt < 3 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                }
                Err((_, detail)) => return Err(credential_error(detail)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_urls_over_http_stay_local() {
        for ok in [
            "http://127.0.0.1:8080/creds",
            "http://localhost/creds",
            "http://169.254.170.2/v2/credentials/x",
            "http://169.254.170.23/v1/credentials",
            "http://[::1]:80/x",
            "https://example.com/creds",
        ] {
            assert!(check_container_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://example.com/creds",
            "http://10.0.0.1/x",
            "ftp://127.0.0.1/x",
            "nope",
        ] {
            assert!(check_container_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_relative_container_uri_wins_and_goes_to_the_ecs_host() {
        let full = Some("http://127.0.0.1:9/creds".to_string());
        assert_eq!(
            container_url(Some("/v2/credentials/abc".into()), full.clone()).as_deref(),
            Some("http://169.254.170.2/v2/credentials/abc")
        );
        assert_eq!(container_url(None, full.clone()), full);
        assert_eq!(container_url(None, None), None);
        assert!(check_container_url("http://169.254.170.2/v2/credentials/abc").is_ok());
    }

    #[test]
    fn credentials_json_is_parsed_without_echoing_secrets() {
        let body = br#"{"AccessKeyId":"AKID","SecretAccessKey":"very-secret","Token":"tok","Expiration":"2000-01-01T00:00:00Z"}"#;
        let (credential, expires_in) = parse_credentials_json(body).unwrap();
        assert_eq!(credential.key_id, "AKID");
        assert_eq!(credential.token.as_deref(), Some("tok"));
        assert_eq!(expires_in, Some(Duration::ZERO));
        let error =
            parse_credentials_json(br#"{"AccessKeyId":"AKID","SecretAccessKey":5}"#).unwrap_err();
        assert!(error.contains("SecretAccessKey"));
        assert!(parse_credentials_json(b"very-secret").unwrap_err() == "the answer is not JSON");
    }

    #[test]
    fn credential_errors_are_found_inside_object_store_errors() {
        let error = credential_error("no credentials found");
        let found = find_credential_error(&error).unwrap();
        assert_eq!(found.message, "no credentials found");
        assert!(!found.wrong_type);
        let error = credential_error_of("returned access_key_id of type int", true);
        assert!(find_credential_error(&error).unwrap().wrong_type);
    }
}
