//! Honouring a server's `Retry-After` (SPEC section 4: throttling is transient; the Hub and
//! S3 say how long to wait). object_store's errors do not carry response headers, so every
//! store's HTTP client is wrapped: a 429 or 503 answer that names a delay is held back for that
//! long (at most [`MAX_RETRY_AFTER`]) before it is returned and classified, so that the retry,
//! after our own backoff, comes no sooner than the server asked.

use std::time::Duration;

use async_trait::async_trait;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

/// The longest wait taken from a `Retry-After` (our whole-request and read-inactivity timeouts
/// are longer, so the wait never ends the attempt by itself).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Connects object_store's reqwest client wrapped in [`RetryAfterService`].
#[derive(Debug, Default)]
pub struct RetryAfterConnector;

impl HttpConnector for RetryAfterConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(RetryAfterService { inner }))
    }
}

#[derive(Debug)]
struct RetryAfterService {
    inner: HttpClient,
}

#[async_trait]
impl HttpService for RetryAfterService {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = self.inner.execute(request).await?;
        if let Some(wait) = retry_after(&response) {
            tokio::time::sleep(wait).await;
        }
        Ok(response)
    }
}

/// The delay a 429 or 503 answer asks for (delta-seconds, or an HTTP date), capped.
fn retry_after(response: &HttpResponse) -> Option<Duration> {
    let status = response.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let value = response
        .headers()
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            (at.with_timezone(&chrono::Utc) - chrono::Utc::now())
                .to_std()
                .unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, retry_after: Option<&str>) -> HttpResponse {
        let mut builder = http::Response::builder().status(status);
        if let Some(value) = retry_after {
            builder = builder.header("Retry-After", value);
        }
        builder
            .body(object_store::client::HttpResponseBody::from(
                bytes::Bytes::new(),
            ))
            .unwrap()
    }

    #[test]
    fn throttling_answers_name_their_delay_capped() {
        assert_eq!(
            retry_after(&answer(429, Some("2"))),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&answer(503, Some("3600"))),
            Some(MAX_RETRY_AFTER)
        );
        let past = "Wed, 21 Oct 2015 07:28:00 GMT";
        assert_eq!(retry_after(&answer(429, Some(past))), Some(Duration::ZERO));
        assert_eq!(retry_after(&answer(429, Some("soon"))), None);
        assert_eq!(retry_after(&answer(429, None)), None);
        assert_eq!(retry_after(&answer(500, Some("2"))), None);
        assert_eq!(retry_after(&answer(200, Some("2"))), None);
    }
}
