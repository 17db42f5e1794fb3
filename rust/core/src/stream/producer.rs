//! The background task of a stream: ranged GETs from the current offset, resumed at the last
//! received byte after a transient failure, its chunks sent to the reader within the readahead
//! bound.

use std::io::{Read, Seek, SeekFrom};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::{GetOptions, GetRange, GetResult, GetResultPayload, ObjectMeta, ObjectStore};
use tokio::sync::{mpsc, Semaphore};
use tokio::time::Instant;

use super::{
    extent, permits_for, Shared, StoreFactory, StreamRequest, Version, COALESCE_BYTES,
    FIRST_FILE_READ,
};
use crate::caller::retry_message;
use crate::classify::{
    classify_store_error, first_line, is_whole_object_answer, whole_object_answer, StoreFailure,
};
use crate::counters::{Counters, RetryCause};
use crate::error::{NativeError, NativeResult};
use crate::policy::Budget;

/// Local files are read off the runtime in pieces of 64 KiB growing to `largest` (1 MiB, or the
/// readahead bound if less; object_store's own stream reads 8 KiB).
fn body_stream(
    response: GetResult,
    largest: usize,
) -> BoxStream<'static, object_store::Result<Bytes>> {
    match response.payload {
        GetResultPayload::File(file, _) => {
            let range = response.range;
            let state = (Some(file), range.start, range.end, FIRST_FILE_READ);
            futures::stream::try_unfold(state, move |(file, position, end, piece)| {
                async move {
                    let Some(mut file) = file else {
                        return Ok(None);
                    };
                    if position >= end {
                        return Ok(None);
                    }
                    let want = (end - position).min(piece as u64);
                    let read_piece = move || {
                        // Read into spare capacity: no zeroing of a buffer about to be filled.
                        let mut buffer = Vec::with_capacity(want as usize);
                        file.seek(SeekFrom::Start(position))?;
                        (&mut file).take(want).read_to_end(&mut buffer)?;
                        Ok::<_, std::io::Error>((file, buffer))
                    };
                    // The first, small read runs right here: two thread hand-offs fewer before
                    // a shard's first record. The large ones go to the blocking pool, so a
                    // slow disk never holds up the runtime's other streams for long.
                    let read = if piece == FIRST_FILE_READ {
                        Ok(read_piece())
                    } else {
                        tokio::task::spawn_blocking(read_piece).await
                    };
                    let generic = |source: Box<dyn std::error::Error + Send + Sync>| {
                        object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source,
                        }
                    };
                    let (file, buffer) = match read {
                        Ok(Ok(done)) => done,
                        // The io::Error itself, so that `classify_store_error` sorts it by its kind.
                        Ok(Err(io)) => return Err(generic(Box::new(io))),
                        Err(join) => return Err(generic(Box::new(join))),
                    };
                    if buffer.is_empty() {
                        // The file shrank under us: end here, the caller reports the short body.
                        return Ok(None);
                    }
                    let next = position + buffer.len() as u64;
                    let piece = (piece * 4).min(largest);
                    Ok(Some((Bytes::from(buffer), (Some(file), next, end, piece))))
                }
            })
            .boxed()
        }
        GetResultPayload::Stream(stream) => stream,
    }
}

/// The background task's state.
pub(super) struct Producer {
    pub(super) request: StreamRequest,
    pub(super) factory: StoreFactory,
    pub(super) sender: mpsc::Sender<NativeResult<Bytes>>,
    pub(super) readahead: Arc<Semaphore>,
    pub(super) shared: Arc<Shared>,
    pub(super) counters: Option<Arc<Counters>>,
}

/// A failed ranged GET: what to do, and why (for the retry counters).
struct AttemptFailure {
    failure: StoreFailure,
    cause: RetryCause,
}

impl AttemptFailure {
    fn transient(cause: RetryCause, detail: String) -> Self {
        AttemptFailure {
            failure: StoreFailure::Transient(detail),
            cause,
        }
    }

    fn classified(uri: &str, error: object_store::Error, if_match: Option<&str>) -> Self {
        let cause = RetryCause::of(&error);
        AttemptFailure {
            failure: classify_store_error(uri, error, if_match),
            cause,
        }
    }
}

impl From<StoreFailure> for AttemptFailure {
    fn from(failure: StoreFailure) -> Self {
        AttemptFailure {
            failure,
            cause: RetryCause::Other,
        }
    }
}

/// How one ranged GET ended.
enum Attempt {
    Done,
    /// The whole-response deadline passed after progress: reopen at once.
    Reopen,
    ConsumerGone,
    /// A ranged GET from offset 0 was answered with 200: read the whole body instead.
    WholeBody,
}

impl Producer {
    pub(super) async fn run(self) {
        let mut offset = self.request.start;
        let mut pin = Version {
            etag: self.request.etag.clone(),
            modified: self.request.modified,
        };
        let mut budget = Budget::new(self.request.policy);
        let mut store = None;
        // A read of the whole object from 0 asks for no range: a server that ignores Range
        // (answers 200 with the whole object, as HTTP allows) then serves it too.
        let mut whole_body = self.request.end == self.request.size;
        loop {
            if offset >= self.request.end {
                return;
            }
            let result = match store.clone() {
                Some(store) => {
                    let plain = whole_body && offset == 0;
                    self.attempt(store, &mut offset, &mut pin, &mut budget, plain)
                        .await
                }
                None => match (self.factory)() {
                    Ok(fresh) => {
                        store = Some(fresh.clone());
                        let plain = whole_body && offset == 0;
                        self.attempt(fresh, &mut offset, &mut pin, &mut budget, plain)
                            .await
                    }
                    Err(error) => Err(StoreFailure::Fatal(error).into()),
                },
            };
            let (failure, cause) = match result {
                Ok(Attempt::Done) | Ok(Attempt::ConsumerGone) => return,
                Ok(Attempt::Reopen) => continue,
                // Once, at once: a plain GET cannot be answered this way again.
                Ok(Attempt::WholeBody) => {
                    whole_body = true;
                    continue;
                }
                Err(AttemptFailure { failure, cause }) => (failure, cause),
            };
            match failure {
                StoreFailure::Fatal(error) => {
                    let _ = self.sender.send(Err(error)).await;
                    return;
                }
                StoreFailure::Transient(detail) => {
                    let elapsed = budget.elapsed_without_progress();
                    let Some(delay) = budget.next_delay() else {
                        let error = NativeError::RetryExhausted {
                            operation: "GET",
                            uri: self.request.uri.clone(),
                            position: format!(
                                " at offset {offset} of {}",
                                extent(self.request.size, self.request.end)
                            ),
                            attempts: budget.failed_attempts(),
                            elapsed_s: budget.elapsed().as_secs_f64(),
                            last_error: first_line(&detail).to_string(),
                        };
                        let _ = self.sender.send(Err(error)).await;
                        return;
                    };
                    let message = retry_message(
                        "GET",
                        &self.request.uri,
                        budget.failed_attempts(),
                        elapsed,
                        delay,
                        &format!("at offset {offset}: {detail}"),
                    );
                    self.shared
                        .warnings
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(message);
                    self.shared.resumes.fetch_add(1, Ordering::Relaxed);
                    if let Some(counters) = &self.counters {
                        counters.retried(cause);
                    }
                    tokio::time::sleep(delay).await;
                    // A fresh client: the old one's connections may be what failed.
                    store = None;
                }
            }
        }
    }

    fn data_error(&self, reason: String) -> StoreFailure {
        StoreFailure::Fatal(match self.request.format {
            Some(format) => NativeError::Shard {
                format,
                uri: self.request.uri.clone(),
                reason,
            },
            None => NativeError::InvalidData {
                uri: self.request.uri.clone(),
                reason,
            },
        })
    }

    /// Sends the held bytes to the consumer, within the readahead bound. False: consumer gone.
    async fn hand_over(&self, held: &mut BytesMut, offset: &mut u64) -> bool {
        if held.is_empty() {
            return true;
        }
        self.hand_over_chunk(held.split().freeze(), offset).await
    }

    /// Sends a chunk to the consumer in pieces of at most the readahead bound (zero-copy), so
    /// that the bound holds for the bytes buffered, not just for the permits.
    async fn hand_over_chunk(&self, mut chunk: Bytes, offset: &mut u64) -> bool {
        let bound = self.request.readahead;
        while chunk.len() > bound {
            let piece = chunk.split_to(bound);
            if !self.send_within_bound(piece, offset).await {
                return false;
            }
        }
        self.send_within_bound(chunk, offset).await
    }

    async fn send_within_bound(&self, chunk: Bytes, offset: &mut u64) -> bool {
        let permits = permits_for(chunk.len(), self.request.readahead);
        let Ok(permit) = self.readahead.acquire_many(permits as u32).await else {
            return false;
        };
        permit.forget();
        *offset += chunk.len() as u64;
        self.sender.send(Ok(chunk)).await.is_ok()
    }

    async fn attempt(
        &self,
        store: Arc<dyn ObjectStore>,
        offset: &mut u64,
        pin: &mut Version,
        budget: &mut Budget,
        plain: bool,
    ) -> Result<Attempt, AttemptFailure> {
        let request = &self.request;
        let policy = &request.policy;
        // Without a range the body is the whole object; a segment takes its prefix.
        let prefix_only = plain && request.end < request.size;
        let options = GetOptions {
            range: (!plain).then_some(GetRange::Bounded(*offset..request.end)),
            if_match: pin.etag.clone(),
            if_unmodified_since: pin.modified,
            ..Default::default()
        };
        let pinned = pin.describe();
        let deadline = Instant::now() + policy.stream_response_deadline;
        let opened = tokio::time::timeout_at(
            deadline.min(Instant::now() + policy.read_inactivity_timeout),
            store.get_opts(&request.path, options),
        )
        .await
        .map_err(|_| {
            AttemptFailure::transient(
                RetryCause::Timeout,
                "timed out waiting for the response".into(),
            )
        })?;
        let response = match opened {
            Ok(response) => response,
            Err(e) if is_whole_object_answer(&e) => {
                if *offset == 0 {
                    return Ok(Attempt::WholeBody);
                }
                let asked = format!(" for bytes={}-{}", *offset, request.end - 1);
                return Err(StoreFailure::Fatal(whole_object_answer(&request.uri, &asked)).into());
            }
            Err(e) => {
                return Err(AttemptFailure::classified(
                    &request.uri,
                    e,
                    pinned.as_deref(),
                ))
            }
        };
        if response.meta.size != request.size {
            return Err(self
                .data_error(format!(
                    "size mismatch: the object has {} bytes but size_bytes is {}",
                    response.meta.size, request.size
                ))
                .into());
        }
        pin.check(&request.uri, &response.meta, request.require_etag)?;
        *self.shared.pinned.lock().unwrap_or_else(|p| p.into_inner()) = Some(pin.clone());
        // Neither a local file's piece nor a merged chunk grows past the readahead bound.
        let largest = COALESCE_BYTES.min(request.readahead);
        let mut body = body_stream(response, largest);
        // Chunks that arrive back to back are merged (local files come in 8 KiB pieces);
        // whatever is held is handed over before waiting on the network.
        let mut held = BytesMut::new();
        let mut received_here = false;
        loop {
            let next = match body.next().now_or_never() {
                Some(next) => next,
                None => {
                    if !self.hand_over(&mut held, offset).await {
                        return Ok(Attempt::ConsumerGone);
                    }
                    let wake = deadline.min(Instant::now() + policy.read_inactivity_timeout);
                    match tokio::time::timeout_at(wake, body.next()).await {
                        Ok(next) => next,
                        Err(_) if Instant::now() >= deadline && received_here => {
                            return Ok(Attempt::Reopen)
                        }
                        Err(_) => {
                            return Err(AttemptFailure::transient(
                                RetryCause::Timeout,
                                format!(
                                    "no data for {:.1} s",
                                    policy.read_inactivity_timeout.as_secs_f64()
                                ),
                            ))
                        }
                    }
                }
            };
            let chunk = match next {
                None => break,
                Some(Err(error)) => {
                    if !self.hand_over(&mut held, offset).await {
                        return Ok(Attempt::ConsumerGone);
                    }
                    return Err(AttemptFailure::classified(
                        &request.uri,
                        error,
                        pinned.as_deref(),
                    ));
                }
                Some(Ok(chunk)) => chunk,
            };
            let room = request.end - *offset - held.len() as u64;
            let (chunk, last) = match chunk.len() as u64 {
                // The whole object's body, of which the segment wants only a prefix.
                n if prefix_only && n >= room => (chunk.slice(..room as usize), true),
                _ => (chunk, false),
            };
            if chunk.len() as u64 > room {
                let reason = if request.end == request.size {
                    format!("received more bytes than size_bytes ({})", request.size)
                } else {
                    format!(
                        "received more bytes than the segment ending at offset {}",
                        request.end
                    )
                };
                return Err(self.data_error(reason).into());
            }
            budget.progress();
            received_here = true;
            if held.is_empty() && chunk.len() >= FIRST_FILE_READ {
                // Large enough as it is (a local file's piece): handed over without a copy.
                if !self.hand_over_chunk(chunk, offset).await {
                    return Ok(Attempt::ConsumerGone);
                }
                if last {
                    break;
                }
                continue;
            }
            held.extend_from_slice(&chunk);
            if last {
                break;
            }
            if held.len() >= largest && !self.hand_over(&mut held, offset).await {
                return Ok(Attempt::ConsumerGone);
            }
        }
        if !self.hand_over(&mut held, offset).await {
            return Ok(Attempt::ConsumerGone);
        }
        if *offset < request.end {
            return Err(AttemptFailure::transient(
                RetryCause::EndedEarly,
                format!(
                    "response body ended early at offset {offset} of {}",
                    extent(request.size, request.end)
                ),
            ));
        }
        Ok(Attempt::Done)
    }
}

impl Version {
    /// Whether `seen` (the version another stream over the object was held to) is this one.
    pub fn holds(&self, seen: &Version) -> bool {
        match (&self.etag, &seen.etag) {
            (Some(held), Some(seen)) => same_etag(held, seen),
            (None, None) => self.modified == seen.modified,
            _ => false,
        }
    }

    /// What the read is held to, for a changed-object error (`None`: nothing yet).
    pub fn describe(&self) -> Option<String> {
        match (&self.etag, &self.modified) {
            (Some(etag), _) => Some(format!("etag {etag:?}")),
            (None, Some(modified)) => Some(format!("Last-Modified {}", http_date(modified))),
            (None, None) => None,
        }
    }

    /// Holds a response to the pin, or pins the first response's version. `require`: the
    /// server must give one (an https:// object), else a clear refusal, never a retry.
    fn check(&mut self, uri: &str, meta: &ObjectMeta, require: bool) -> Result<(), StoreFailure> {
        let changed = |version: String| {
            StoreFailure::Fatal(NativeError::Changed {
                uri: uri.to_string(),
                version,
            })
        };
        // object_store reads a missing Last-Modified as the epoch.
        let modified = (meta.last_modified.timestamp() != 0).then_some(meta.last_modified);
        match (self.etag.as_deref(), meta.e_tag.as_deref()) {
            // If-Match was sent; a server that ignored it too must not pass another object.
            (Some(expected), Some(got)) if !same_etag(expected, got) => {
                return Err(changed(format!("etag {expected:?}")));
            }
            (Some(_), _) => return Ok(()),
            (None, Some(got)) if self.modified.is_none() => {
                self.etag = Some(got.to_string());
                return Ok(());
            }
            _ => {}
        }
        match (self.modified, modified) {
            // If-Unmodified-Since was sent; a server that ignored it (or whose clock went
            // back) must not pass another version either.
            (Some(pinned), got) if got != Some(pinned) => {
                Err(changed(format!("Last-Modified {}", http_date(&pinned))))
            }
            (Some(_), _) => Ok(()),
            (None, Some(got)) if require => {
                self.modified = Some(got);
                Ok(())
            }
            (None, None) if require => Err(StoreFailure::Fatal(NativeError::Config(format!(
                "{uri}: the server gave neither an ETag nor a Last-Modified, so a resumed \
                 read could not be held to the same bytes; serve the file with an ETag or a \
                 Last-Modified header"
            )))),
            (None, _) => Ok(()),
        }
    }
}

/// A date as HTTP writes it (RFC 7231's IMF-fixdate).
pub(super) fn http_date(date: &DateTime<Utc>) -> String {
    date.format("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// Etags compared as S3 gives them, quoted or not, weak or strong.
fn same_etag(a: &str, b: &str) -> bool {
    let bare = |e: &str| e.trim_start_matches("W/").trim_matches('"').to_string();
    bare(a) == bare(b)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn meta(etag: Option<&str>, modified_s: i64) -> ObjectMeta {
        ObjectMeta {
            location: object_store::path::Path::from("x"),
            last_modified: Utc.timestamp_opt(modified_s, 0).unwrap(),
            size: 1,
            e_tag: etag.map(String::from),
            version: None,
        }
    }

    fn unpinned() -> Version {
        Version {
            etag: None,
            modified: None,
        }
    }

    fn changed(result: Result<(), StoreFailure>) -> Option<String> {
        match result {
            Err(StoreFailure::Fatal(NativeError::Changed { version, .. })) => Some(version),
            _ => None,
        }
    }

    #[test]
    fn without_an_etag_a_read_is_pinned_to_its_first_last_modified() {
        let mut pin = unpinned();
        assert!(pin.check("u", &meta(None, 1_800_000_000), true).is_ok());
        assert_eq!(pin.modified.map(|m| m.timestamp()), Some(1_800_000_000));
        assert!(pin.describe().unwrap().starts_with("Last-Modified "));
        assert!(pin.check("u", &meta(None, 1_800_000_000), true).is_ok());
        let earlier = changed(pin.check("u", &meta(None, 1_799_999_999), true));
        assert!(earlier.unwrap().ends_with(" GMT"));
        // A date pinned first is kept even if an ETag shows up later.
        assert!(changed(pin.check("u", &meta(Some("\"a\""), 5), true)).is_some());
    }

    #[test]
    fn a_version_holds_only_the_same_etag_or_date() {
        let date = |s: i64| Some(Utc.timestamp_opt(s, 0).unwrap());
        let tagged = |e: &str, m| Version {
            etag: Some(e.to_string()),
            modified: m,
        };
        let dated = |m| Version {
            etag: None,
            modified: m,
        };
        assert!(tagged("\"a\"", None).holds(&tagged("a", date(9))));
        assert!(!tagged("\"a\"", None).holds(&tagged("\"b\"", None)));
        assert!(!tagged("\"a\"", None).holds(&dated(date(9))));
        assert!(dated(date(9)).holds(&dated(date(9))));
        assert!(!dated(date(9)).holds(&dated(date(8))));
        assert!(!dated(date(9)).holds(&tagged("a", date(9))));
    }

    #[test]
    fn an_etag_wins_and_neither_is_refused_where_required() {
        let mut pin = unpinned();
        assert!(pin.check("u", &meta(Some("\"a\""), 5), true).is_ok());
        assert_eq!(pin.describe().as_deref(), Some("etag \"\\\"a\\\"\""));
        assert!(pin.check("u", &meta(Some("a"), 6), true).is_ok());
        assert!(changed(pin.check("u", &meta(Some("\"b\""), 5), true)).is_some());
        let mut bare = unpinned();
        let refused = bare.check("u", &meta(None, 0), true);
        assert!(
            matches!(refused, Err(StoreFailure::Fatal(NativeError::Config(m))) if m.contains("neither"))
        );
        assert!(bare.check("u", &meta(None, 0), false).is_ok());
        assert!(bare.check("u", &meta(None, 7), false).is_ok());
        assert!(bare.modified.is_none()); // an s3:// or file:// read is not pinned by date
    }

    #[test]
    fn etags_match_quoted_or_weak_but_not_another() {
        assert!(same_etag("\"abc\"", "abc"));
        assert!(same_etag("W/\"abc\"", "\"abc\""));
        assert!(!same_etag("\"abc\"", "\"abd\""));
        assert!(!same_etag("\"abc-2\"", "\"abc\""));
    }
}
