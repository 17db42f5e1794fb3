//! URI -> object store: s3:// and gs:// through `object_store`'s S3 and Google Cloud Storage
//! clients, file:// as a local directory, https:// and hf:// (the Hugging Face Hub's resolve
//! URLs) read-only through its HTTP client.

use std::fmt;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AwsCredential, S3ConditionalPut};
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, RetryConfig, StaticCredentialProvider};

use crate::credentials::{AwsCredentialProvider, ChainProvider};
use crate::error::{NativeError, NativeResult};
use crate::policy::Policy;
use crate::retry_after::RetryAfterConnector;

/// Connection settings for s3:// URIs. The secret and the session token never appear in
/// `Debug` or any message.
///
/// Credentials, first match: `skip_signature` (unsigned requests, no credentials at all); a
/// `credential_provider`; the static `access_key_id` + `secret_access_key` (+ `session_token`);
/// otherwise the AWS SDKs' default chain ([`ChainProvider`], set by [`StorageConfig::resolved`]).
#[derive(Clone, Default)]
pub struct StorageConfig {
    pub s3_base_url: Option<String>,
    pub region: String,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    pub session_token: Option<String>,
    pub virtual_hosted_style_request: bool,
    pub skip_signature: bool,
    pub credential_provider: Option<AwsCredentialProvider>,
    /// Set by [`StorageConfig::resolved`] when `credential_provider` is the default chain.
    pub default_chain: bool,
    /// Plain `http://` object URIs (and an `http://` `HF_ENDPOINT`) are read only when the
    /// caller allows it; an http:// `s3_base_url` is allowed by being given.
    pub allow_http: bool,
    /// The Hub's bearer token for hf:// URIs; `HF_TOKEN` when `None`. Never shown.
    pub hub_token: Option<String>,
}

impl StorageConfig {
    /// Where requests get their credentials, for messages and `repr`s.
    pub fn credential_source(&self) -> &'static str {
        if self.skip_signature {
            "unsigned"
        } else if self.default_chain {
            "chain"
        } else if self.credential_provider.is_some() {
            "provider"
        } else if self.access_key_id.is_some() || self.secret_access_key.is_some() {
            "static"
        } else {
            "chain"
        }
    }

    /// The config with the default chain as its provider when it names no other source (one
    /// chain per client, so its credentials are cached across the client's stores).
    pub fn resolved(mut self) -> Self {
        if self.credential_source() == "chain" {
            self.credential_provider = Some(Arc::new(ChainProvider::new(&self.region)));
            self.default_chain = true;
        }
        self
    }
}

impl fmt::Debug for StorageConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageConfig")
            .field("s3_base_url", &self.s3_base_url)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "***"),
            )
            .field("session_token", &self.session_token.as_ref().map(|_| "***"))
            .field(
                "virtual_hosted_style_request",
                &self.virtual_hosted_style_request,
            )
            .field("credentials", &self.credential_source())
            .field("allow_http", &self.allow_http)
            .field("hub_token", &self.hub_token.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Where an object lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    S3 {
        bucket: String,
        key: String,
    },
    /// `gs://bucket/key`: Google Cloud Storage, with the same rules for buckets and keys.
    Gcs {
        bucket: String,
        key: String,
    },
    /// An absolute filesystem path, taken literally (no percent-decoding), like an S3 key.
    File {
        path: String,
    },
    /// A read-only object at `origin` (`https://host[:port]`, or `http://` where the caller
    /// allows plain http) + `/` + `path`. `hub`: a
    /// Hugging Face Hub file (`hf://datasets/owner/name@revision/path`, at the Hub's resolve
    /// URL), sent with the `HF_TOKEN` bearer token when one is set.
    Http {
        origin: String,
        path: String,
        hub: bool,
    },
}

/// The Hugging Face Hub's address; `HF_ENDPOINT` names a mirror (as `huggingface_hub` reads it).
pub fn hub_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".to_string())
}

impl Location {
    /// Parses `s3://bucket/key` or `file:///absolute/path`. A prefix (for listing) may end in "/".
    pub fn parse(uri: &str, allow_prefix: bool) -> NativeResult<Location> {
        for (scheme, gcs) in [("s3://", false), ("gs://", true)] {
            let Some(rest) = uri.strip_prefix(scheme) else {
                continue;
            };
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            validate_bucket(uri, bucket)?;
            if key.is_empty() && !allow_prefix {
                return Err(NativeError::Config(format!(
                    "Invalid object URI {uri}: the key is empty"
                )));
            }
            validate_key(uri, key, allow_prefix)?;
            let (bucket, key) = (bucket.to_string(), key.to_string());
            return Ok(if gcs {
                Location::Gcs { bucket, key }
            } else {
                Location::S3 { bucket, key }
            });
        }
        if let Some(path) = uri.strip_prefix("file://") {
            if !path.starts_with('/') || (path.len() < 2 && !allow_prefix) {
                return Err(NativeError::Config(format!(
                    "Invalid object URI {uri}: file URIs need an absolute path (file:///dir/name)"
                )));
            }
            validate_key(uri, &path[1..], allow_prefix)?;
            return Ok(Location::File {
                path: path.to_string(),
            });
        }
        if uri.starts_with("https://") || uri.starts_with("http://") {
            return parse_web(uri, allow_prefix);
        }
        if let Some(rest) = uri.strip_prefix("hf://") {
            return parse_hub(uri, rest, allow_prefix);
        }
        Err(NativeError::Config(format!(
            "Invalid object URI {uri}: the scheme must be s3://, gs://, file://, https://, http:// \
             or hf://"
        )))
    }

    /// Whether objects can be written, deleted and listed here (https:// and hf:// are
    /// read-only, gs:// is read and list only: a ConfigError naming the operation otherwise).
    pub fn check_writable(&self, uri: &str, operation: &str) -> NativeResult<()> {
        match self {
            Location::Http { .. } => Err(NativeError::Config(format!(
                "{uri}: cannot {operation}: https:// and hf:// objects are read-only"
            ))),
            // Writes go through the XML API, which the GCS emulator the tests run
            // (fake-gcs-server) does not serve: untested, so not offered yet.
            Location::Gcs { .. } if operation != "list" => Err(NativeError::Config(format!(
                "{uri}: cannot {operation}: gs:// is read-only in this release (write the \
                 dataset to s3:// or file:// and copy it with gsutil or gcloud storage)"
            ))),
            _ => Ok(()),
        }
    }

    /// The key inside the store (S3 key, or the absolute path without its leading "/").
    pub fn object_path(&self) -> Path {
        // Validated in `parse`, so `Path::parse` accepts it; keys are used raw, never re-encoded.
        let raw = match self {
            Location::S3 { key, .. } | Location::Gcs { key, .. } => key.as_str(),
            Location::File { path } => &path[1..],
            Location::Http { path, .. } => path.as_str(),
        };
        Path::parse(raw).unwrap_or_else(|_| Path::from(raw))
    }

    /// The URI of a key in the same bucket or filesystem (for listings).
    pub fn uri_of(&self, path: &Path) -> String {
        match self {
            Location::S3 { bucket, .. } => format!("s3://{bucket}/{path}"),
            Location::Gcs { bucket, .. } => format!("gs://{bucket}/{path}"),
            Location::File { .. } => format!("file:///{path}"),
            Location::Http { origin, .. } => format!("{origin}/{path}"),
        }
    }

    /// The cache key of the store that serves this location.
    pub fn store_key(&self) -> String {
        match self {
            Location::S3 { bucket, .. } => format!("s3://{bucket}"),
            Location::Gcs { bucket, .. } => format!("gs://{bucket}"),
            Location::File { .. } => "file://".to_string(),
            Location::Http { origin, hub, .. } => format!("{origin} hub={hub}"),
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Location::File { .. })
    }
}

/// `https://host[:port]/path` (or `http://`): no user info, query or fragment (a request goes
/// only where the URI says), a path of key segments.
fn parse_web(uri: &str, allow_prefix: bool) -> NativeResult<Location> {
    let invalid = |why: &str| NativeError::Config(format!("Invalid object URI {uri}: {why}"));
    // URL parsers read a backslash as a slash (and one before "@" as the end of the host), so
    // the host a reader sees could differ from the one a check saw: refused outright.
    if uri.contains('\\') {
        return Err(invalid("a backslash is not allowed in an object URI"));
    }
    let url = url::Url::parse(uri).map_err(|e| invalid(&e.to_string()))?;
    let Some(host) = url.host_str() else {
        return Err(invalid("no host"));
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("user info is not allowed in an object URI"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid(
            "a query or fragment is not allowed in an object URI",
        ));
    }
    // The path as written: url normalizes "." and ".." segments away, which would name
    // another object than the one written, so they are refused from the raw text.
    let scheme = url.scheme();
    let after_scheme = &uri[scheme.len() + "://".len()..];
    let path = after_scheme.split_once('/').map(|(_, p)| p).unwrap_or("");
    if path.is_empty() && !allow_prefix {
        return Err(invalid("the path is empty"));
    }
    validate_key(uri, path, allow_prefix)?;
    let origin = match url.port() {
        Some(port) => format!("{scheme}://{host}:{port}"),
        None => format!("{scheme}://{host}"),
    };
    Ok(Location::Http {
        origin,
        path: path.to_string(),
        hub: false,
    })
}

/// `hf://datasets/owner/name[@revision]/path` (revision `main` when omitted): the Hub's
/// resolve URL `{endpoint}/datasets/owner/name/resolve/{revision}/path`.
fn parse_hub(uri: &str, rest: &str, allow_prefix: bool) -> NativeResult<Location> {
    let invalid = |why: &str| {
        NativeError::Config(format!(
            "Invalid object URI {uri}: {why}; expected hf://datasets/owner/name@revision/path"
        ))
    };
    let mut parts = rest.splitn(4, '/');
    let (kind, owner, name_revision) = (parts.next(), parts.next(), parts.next());
    let path = parts.next().unwrap_or("");
    if kind != Some("datasets") {
        return Err(invalid("only dataset repositories are supported"));
    }
    let (Some(owner), Some(name_revision)) = (owner, name_revision) else {
        return Err(invalid("no repository"));
    };
    let (name, revision) = name_revision
        .split_once('@')
        .unwrap_or((name_revision, "main"));
    let segment_ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !segment_ok(owner) || !segment_ok(name) || !segment_ok(revision) {
        return Err(invalid(
            "owner, name and revision hold letters, digits, '-', '_', '.'",
        ));
    }
    if path.is_empty() && !allow_prefix {
        return Err(invalid("the path is empty"));
    }
    validate_key(uri, path, allow_prefix)?;
    let endpoint = hub_endpoint();
    let bad_endpoint = || {
        NativeError::Config(format!(
            "Invalid HF_ENDPOINT {endpoint:?}: expected https://host[:port]"
        ))
    };
    let base = endpoint.trim_end_matches('/');
    if !base.starts_with("https://") && !base.starts_with("http://") {
        return Err(bad_endpoint());
    }
    let origin = match parse_web(&format!("{base}/x"), false) {
        Ok(Location::Http { origin, path, .. }) if path == "x" => origin,
        _ => return Err(bad_endpoint()),
    };
    Ok(Location::Http {
        origin,
        path: format!("datasets/{owner}/{name}/resolve/{revision}/{path}"),
        hub: true,
    })
}

/// A bucket name ends up in the request's host (virtual-hosted style) or path: anything that
/// could change where the request goes (`/ ? # @ : %`, whitespace, control characters, and
/// every other character a bucket never holds) is refused before any request is built.
fn validate_bucket(uri: &str, bucket: &str) -> NativeResult<()> {
    if bucket.is_empty() {
        return Err(NativeError::Config(format!(
            "Invalid object URI {uri}: the bucket is empty"
        )));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if let Some(bad) = bucket.chars().find(|c| !allowed(*c)) {
        return Err(NativeError::Config(format!(
            "Invalid object URI {}: the bucket name holds {bad:?}; bucket names may hold only \
             letters, digits, '.', '-' and '_'",
            uri.escape_debug()
        )));
    }
    Ok(())
}

fn validate_key(uri: &str, key: &str, allow_prefix: bool) -> NativeResult<()> {
    let trimmed = if allow_prefix {
        key.strip_suffix('/').unwrap_or(key)
    } else {
        key
    };
    if trimmed.is_empty() {
        return Ok(());
    }
    if trimmed.ends_with('/') || !allow_prefix && key.ends_with('/') {
        return Err(NativeError::Config(format!(
            "Invalid object URI {uri}: an object key may not end in '/'"
        )));
    }
    for segment in trimmed.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(NativeError::Config(format!(
                "Invalid object URI {uri}: empty, '.' or '..' path segment"
            )));
        }
        if segment.chars().any(|c| c.is_ascii_control()) {
            return Err(NativeError::Config(format!(
                "Invalid object URI {uri}: control character in the key"
            )));
        }
    }
    Ok(())
}

/// Builds a fresh store (new HTTP client, new connections) for a location.
pub fn build_store(
    config: &StorageConfig,
    location: &Location,
    policy: &Policy,
) -> NativeResult<Arc<dyn ObjectStore>> {
    match location {
        Location::File { .. } => Ok(Arc::new(LocalFileSystem::new())),
        Location::S3 { bucket, .. } => build_s3(config, bucket, policy),
        Location::Gcs { bucket, .. } => build_gcs(config, bucket, policy),
        Location::Http { origin, hub, .. } => build_http(config, location, origin, *hub, policy),
    }
}

/// A Google Cloud Storage client for `bucket`. Credentials as Google's own clients find them
/// (`GoogleCloudStorageBuilder::from_env`: `GOOGLE_SERVICE_ACCOUNT` / `_PATH` / `_KEY`,
/// `GOOGLE_APPLICATION_CREDENTIALS`, the application default credentials file, then the
/// metadata server, its tokens refreshed before they expire); unsigned with `skip_signature`
/// (public buckets); and, as those clients do, unsigned requests to an emulator named by
/// `STORAGE_EMULATOR_HOST`.
fn build_gcs(
    config: &StorageConfig,
    bucket: &str,
    policy: &Policy,
) -> NativeResult<Arc<dyn ObjectStore>> {
    let mut client_options = ClientOptions::new()
        .with_connect_timeout(policy.connect_timeout)
        .with_timeout(policy.request_timeout);
    let emulator = std::env::var("STORAGE_EMULATOR_HOST")
        .ok()
        .filter(|host| !host.is_empty());
    let mut builder = match emulator {
        Some(host) => {
            let base = if host.contains("://") {
                host
            } else {
                format!("http://{host}")
            };
            client_options = client_options.with_allow_http(true);
            // object_store's way to an emulator: a key that names its URL and no OAuth.
            let key = serde_json::json!({
                "gcs_base_url": base.trim_end_matches('/'),
                "disable_oauth": true,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            });
            GoogleCloudStorageBuilder::new().with_service_account_key(key.to_string())
        }
        None => GoogleCloudStorageBuilder::from_env(),
    };
    builder = builder
        .with_bucket_name(bucket)
        .with_skip_signature(config.skip_signature)
        .with_client_options(client_options)
        .with_http_connector(RetryAfterConnector)
        .with_retry(no_retries(policy));
    let store = builder.build().map_err(|e| {
        NativeError::Config(format!(
            "gs://{bucket}: invalid Google Cloud Storage configuration: {e}"
        ))
    })?;
    Ok(Arc::new(store))
}

/// Our own budget (policy.rs) does every retry, so object_store must not retry underneath it.
fn no_retries(policy: &Policy) -> RetryConfig {
    RetryConfig {
        max_retries: 0,
        retry_timeout: policy.request_timeout,
        backoff: Default::default(),
    }
}

/// A read-only HTTP store at `origin`; for the Hub, requests carry the config's token (else
/// `HF_TOKEN`) as a bearer token (marked sensitive: never logged, and dropped by the client on
/// a redirect to another host, such as the Hub's CDN). A plain `http://` origin only with
/// `allow_http`.
fn build_http(
    config: &StorageConfig,
    location: &Location,
    origin: &str,
    hub: bool,
    policy: &Policy,
) -> NativeResult<Arc<dyn ObjectStore>> {
    let plain = origin.starts_with("http://");
    if plain && !config.allow_http {
        let uri = location.uri_of(&location.object_path());
        let (what, instead) = match hub {
            true => (
                "HF_ENDPOINT is a plain http:// address",
                "an https:// HF_ENDPOINT",
            ),
            false => ("plain http:// is not allowed", "an https:// URI"),
        };
        return Err(NativeError::Config(format!(
            "{uri}: {what} (unencrypted, and anyone on the way can change the bytes); use \
             {instead}, or pass allow_http=True to read from a server you trust over http"
        )));
    }
    let mut client_options = ClientOptions::new()
        .with_allow_http(plain)
        .with_connect_timeout(policy.connect_timeout)
        .with_timeout(policy.request_timeout);
    let (token, source) = match &config.hub_token {
        Some(token) => (Some(token.clone()), "the Hub token"),
        None => (
            std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
            "HF_TOKEN",
        ),
    };
    if let (true, Some(token)) = (hub, token) {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| NativeError::Config(format!("{source} is not a valid header value")))?;
        value.set_sensitive(true);
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, value);
        client_options = client_options.with_default_headers(headers);
    }
    let store = HttpBuilder::new()
        .with_url(origin)
        .with_client_options(client_options)
        .with_http_connector(RetryAfterConnector)
        .with_retry(no_retries(policy))
        .build()
        .map_err(|e| NativeError::Config(format!("{origin}: invalid HTTP configuration: {e}")))?;
    Ok(Arc::new(store))
}

fn build_s3(
    config: &StorageConfig,
    bucket: &str,
    policy: &Policy,
) -> NativeResult<Arc<dyn ObjectStore>> {
    let credentials: AwsCredentialProvider = if config.skip_signature {
        // Never asked for (requests go unsigned); set so nothing looks for credentials.
        Arc::new(StaticCredentialProvider::new(AwsCredential {
            key_id: String::new(),
            secret_key: String::new(),
            token: None,
        }))
    } else if let Some(provider) = &config.credential_provider {
        provider.clone()
    } else {
        match (&config.access_key_id, &config.secret_access_key) {
            (Some(key_id), Some(secret)) => {
                Arc::new(StaticCredentialProvider::new(AwsCredential {
                    key_id: key_id.clone(),
                    secret_key: secret.clone(),
                    token: config.session_token.clone(),
                }))
            }
            (Some(_), None) => {
                return Err(NativeError::Config(format!(
                    "s3://{bucket}: access_key_id is given without secret_access_key"
                )))
            }
            (None, Some(_)) => {
                return Err(NativeError::Config(format!(
                    "s3://{bucket}: secret_access_key is given without access_key_id"
                )))
            }
            // A config that did not go through `resolved()`: the chain, for this store only.
            (None, None) => Arc::new(ChainProvider::new(&config.region)),
        }
    };
    let client_options = ClientOptions::new()
        .with_allow_http(true)
        .with_connect_timeout(policy.connect_timeout)
        .with_timeout(policy.request_timeout);
    let retry = no_retries(policy);
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region(&config.region)
        .with_credentials(credentials)
        .with_skip_signature(config.skip_signature)
        .with_client_options(client_options)
        .with_http_connector(RetryAfterConnector)
        .with_retry(retry)
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_virtual_hosted_style_request(config.virtual_hosted_style_request);
    if let Some(base) = &config.s3_base_url {
        let endpoint = endpoint_for(base, bucket, config.virtual_hosted_style_request)?;
        builder = builder.with_endpoint(endpoint);
    }
    let store = builder.build().map_err(|e| {
        NativeError::Config(format!("s3://{bucket}: invalid S3 configuration: {e}"))
    })?;
    Ok(Arc::new(store))
}

/// The endpoint URL: the base as given (path style), or with the bucket as a sub-domain.
/// Built with `url::Url`, so a bucket can only ever become a host label, never a new host.
pub fn endpoint_for(base: &str, bucket: &str, virtual_hosted: bool) -> NativeResult<String> {
    let mut url = url::Url::parse(base)
        .map_err(|e| NativeError::Config(format!("Invalid s3_base_url {base:?}: {e}")))?;
    let Some(host) = url.host_str().map(str::to_string) else {
        return Err(NativeError::Config(format!(
            "Invalid s3_base_url {base:?}: expected http(s)://host[:port]"
        )));
    };
    if !matches!(url.scheme(), "http" | "https") {
        return Err(NativeError::Config(format!(
            "Invalid s3_base_url {base:?}: expected http(s)://host[:port]"
        )));
    }
    if !virtual_hosted {
        return Ok(base.trim_end_matches('/').to_string());
    }
    validate_bucket(&format!("s3://{bucket}"), bucket)?;
    url.set_host(Some(&format!("{bucket}.{host}")))
        .map_err(|e| NativeError::Config(format!("Invalid bucket {bucket:?} for {base:?}: {e}")))?;
    url.set_path("");
    Ok(url.as_str().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One table of valid and invalid object URIs, which Python's `uris.check_uri` is held to
    /// as well (tests/test_uris.py), so a manifest that validates is one the store can read.
    const URI_RULES: &str = include_str!("../../../tests/uri_rules.json");

    #[test]
    fn the_shared_uri_table_holds() {
        let table: serde_json::Value = serde_json::from_str(URI_RULES).unwrap();
        let text = |case: &serde_json::Value, name: &str| case[name].as_str().unwrap().to_string();
        for case in table["valid"].as_array().unwrap() {
            let uri = text(case, "uri");
            let found = Location::parse(&uri, false).unwrap();
            if case.get("hub_path").is_some() {
                // The origin is the Hub's (HF_ENDPOINT), not part of the table.
                let Location::Http {
                    path, hub: true, ..
                } = found
                else {
                    panic!("{uri:?}: {found:?}");
                };
                assert_eq!(path, text(case, "hub_path"), "{uri:?}");
                continue;
            }
            let expected = if case.get("path").is_some() {
                Location::File {
                    path: text(case, "path"),
                }
            } else if case.get("gs_bucket").is_some() {
                Location::Gcs {
                    bucket: text(case, "gs_bucket"),
                    key: text(case, "key"),
                }
            } else if case.get("origin").is_some() {
                Location::Http {
                    origin: text(case, "origin"),
                    path: text(case, "http_path"),
                    hub: false,
                }
            } else {
                Location::S3 {
                    bucket: text(case, "bucket"),
                    key: text(case, "key"),
                }
            };
            assert_eq!(found, expected, "{uri:?}");
        }
        for case in table["invalid"].as_array().unwrap() {
            let uri = text(case, "uri");
            let why = text(case, "why");
            assert!(Location::parse(&uri, false).is_err(), "{uri:?}: {why}");
        }
    }

    #[test]
    fn keys_are_used_raw_and_prefixes_may_end_in_a_slash() {
        let key = Location::parse("s3://b/a%2Fb c/é", false).unwrap();
        assert_eq!(key.object_path().as_ref(), "a%2Fb c/é");
        assert!(Location::parse("s3://b/prefix/", true).is_ok());
        assert!(Location::parse("s3://b", true).is_ok());
    }

    #[test]
    fn virtual_hosted_endpoint_puts_the_bucket_in_the_host() {
        assert_eq!(
            endpoint_for("http://localhost:9000/", "data", true).unwrap(),
            "http://data.localhost:9000"
        );
        assert_eq!(
            endpoint_for("http://127.0.0.1:9000/", "data", false).unwrap(),
            "http://127.0.0.1:9000"
        );
        assert!(endpoint_for("ftp://x", "data", false).is_err());
    }

    #[test]
    fn bucket_names_that_could_redirect_a_request_are_refused() {
        for bucket in [
            "127.0.0.1:9000#",
            "a?b",
            "a#b",
            "a@b",
            "a:b",
            "a%2fb",
            "a b",
            "a\tb",
            "a\nb",
            "a\\b",
            "a[b]",
            "é",
        ] {
            let uri = format!("s3://{bucket}/x.json");
            assert!(Location::parse(&uri, false).is_err(), "{uri}");
            assert!(
                endpoint_for("http://127.0.0.1:9000", bucket, true).is_err(),
                "{bucket}"
            );
        }
        assert!(Location::parse("s3://my-data.v2_x/x.json", false).is_ok());
    }

    #[test]
    fn debug_hides_the_secret() {
        let config = StorageConfig {
            s3_base_url: None,
            region: "us-east-1".into(),
            access_key_id: Some("AKID".into()),
            secret_access_key: Some("very-secret".into()),
            session_token: Some("very-secret-token".into()),
            ..Default::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("very-secret"), "{shown}");
        assert!(shown.contains("static"), "{shown}");
        let chain = StorageConfig::default().resolved();
        assert_eq!(chain.credential_source(), "chain");
        assert!(chain.credential_provider.is_some());
    }
}
