//! Streaming uploads for the saver: a shard handed over as its list of encoded chunks (zero
//! copy) or as a spooled file, never as one joined buffer next to its pieces.
//!
//! Rules (SPEC sections 4 and 5):
//! - Up to `multipart_threshold` bytes, and for a create-only object up to `single_put_max`
//!   (5 GiB, S3's single PUT limit), the object is one PUT (`If-None-Match: *` when create-only).
//! - Above that it is a multipart upload streamed from the file, `part_size` bytes per part, a
//!   few parts in flight. object_store 0.12 has no create-only multipart completion, so a
//!   create-only object over `single_put_max` is checked with HEAD first and then uploaded: two
//!   writers racing on the same key inside that window both write (the saver's descriptor and
//!   etag checks then catch differing bytes; identical bytes are harmless). Only deterministic
//!   jsonl.gz shards can be that large; the saver documents it.
//! - Every attempt is retried whole under the SPEC budget (`ops::with_retries`), including a
//!   multipart upload the store forgot (NoSuchUpload, transient in `classify`).
//! - A single PUT of a file sends the file mapped into memory (page cache, not heap), so a
//!   5 GiB create-only shard uploads without 5 GiB of process memory.
//! - A retried create-only PUT that finds the object holding exactly its bytes succeeds: the
//!   answer to an earlier attempt that stored them was lost.
//! - A multipart upload is aborted on any failure and when Ctrl-C cancels it.
//! - The local directory store writes durably: see [`crate::local_put`].

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use crate::caller::{spawn_cleanup, with_retries, Caller};
use crate::classify::{classify_store_error, StoreFailure};
use crate::error::{io_error, refuse_special_file, NativeError, NativeResult};
use crate::local_put::{put_local, LocalSource};
use crate::object_stores::Location;
use crate::storage::Storage;
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, MultipartUpload, ObjectStore, PutMode, PutMultipartOptions, PutOptions,
    PutPayload,
};

/// S3's limit for one PUT, and so for a create-only object written in one request.
pub const SINGLE_PUT_MAX: u64 = 5 * 1024 * 1024 * 1024;
/// Objects above this size (and not create-only) stream as multipart uploads.
pub const MULTIPART_THRESHOLD: u64 = 64 * 1024 * 1024;
/// Bytes per multipart part (S3 allows 5 MiB to 5 GiB per part, 10,000 parts).
pub const PART_SIZE: u64 = 64 * 1024 * 1024;
/// Parts uploaded at once: bounds memory to `PARTS_IN_FLIGHT * part_size`.
const PARTS_IN_FLIGHT: usize = 4;

fn mode(create_only: bool) -> PutMode {
    if create_only {
        PutMode::Create
    } else {
        PutMode::Overwrite
    }
}

/// One PUT of an in-memory payload under the retry budget; returns (size, etag).
///
/// A retried create-only PUT that finds the object already there compares it with the payload:
/// an earlier attempt whose answer was lost may have stored it, and those very bytes are a
/// success, not FileExistsError (different bytes still are).
pub fn put_payload<C: Caller>(
    caller: &C,
    storage: &Storage,
    uri: &str,
    payload: PutPayload,
    attributes: Attributes,
    create_only: bool,
) -> Result<(u64, String), C::Error> {
    let location = Location::parse(uri, false)?;
    location.check_writable(uri, "write")?;
    let size = payload.content_length() as u64;
    if let Location::File { path: dest } = &location {
        let dest = PathBuf::from(dest);
        caller.blocking(|| put_local(uri, &dest, LocalSource::Payload(&payload), create_only))?;
        let (_, etag) = storage.head(caller, uri)?;
        return Ok((size, etag));
    }
    let path = location.object_path();
    let owned_uri = uri.to_string();
    with_retries(caller, "PUT", uri, |retry| {
        let store = storage.store(&location, retry)?;
        let (path, uri, payload) = (path.clone(), owned_uri.clone(), payload.clone());
        let options = PutOptions {
            mode: mode(create_only),
            attributes: attributes.clone(),
            ..Default::default()
        };
        Ok(async move {
            let failure = match store.put_opts(&path, payload.clone(), options).await {
                Ok(result) => return Ok((size, result.e_tag.unwrap_or_default())),
                Err(e) => classify_store_error(&uri, e, None),
            };
            let exists = matches!(
                failure,
                StoreFailure::Fatal(NativeError::AlreadyExists { .. })
            );
            if create_only && retry && exists {
                if let Some(etag) = stored_etag_if_same(&*store, &path, &uri, &payload).await? {
                    return Ok((size, etag));
                }
            }
            Err(failure)
        })
    })
}

/// The object's etag when it holds exactly `expected` (size first, then every byte, streamed
/// so memory stays one chunk); None when it differs.
async fn stored_etag_if_same(
    store: &dyn ObjectStore,
    path: &Path,
    uri: &str,
    expected: &PutPayload,
) -> Result<Option<String>, StoreFailure> {
    let response = store
        .get(path)
        .await
        .map_err(|e| classify_store_error(uri, e, None))?;
    let size = response.meta.size;
    if size != expected.content_length() as u64 {
        return Ok(None);
    }
    let etag = response.meta.e_tag.clone().unwrap_or_default();
    let mut pieces = expected.iter().map(|piece| piece.as_ref());
    let mut want: &[u8] = &[];
    let mut received = 0u64;
    let mut body = response.into_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| classify_store_error(uri, e, None))?;
        received += chunk.len() as u64;
        let mut got: &[u8] = &chunk;
        while !got.is_empty() {
            while want.is_empty() {
                match pieces.next() {
                    Some(piece) => want = piece,
                    None => return Ok(None),
                }
            }
            let n = want.len().min(got.len());
            if want[..n] != got[..n] {
                return Ok(None);
            }
            (want, got) = (&want[n..], &got[n..]);
        }
    }
    if received < size {
        return Err(StoreFailure::Transient(format!(
            "{uri}: body ended at {received} of {size} bytes while comparing it"
        )));
    }
    Ok(Some(etag))
}

/// The file as one payload without reading it onto the heap: its pages are mapped, so the
/// kernel reads them in as the request is hashed and sent and may drop them again (page cache,
/// not process memory). The spool file is ours alone; nothing truncates it under the upload.
fn mapped_payload(path: &FsPath) -> NativeResult<PutPayload> {
    let file = File::open(path).map_err(|e| io_error("Cannot open", path, &e))?;
    if file
        .metadata()
        .map_err(|e| io_error("Cannot read", path, &e))?
        .len()
        == 0
    {
        return Ok(PutPayload::new());
    }
    // SAFETY: the mapping is read-only and the file is not modified while it is uploaded.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_error("Cannot map", path, &e))?;
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Sequential);
    Ok(PutPayload::from(Bytes::from_owner(map)))
}

/// Reads up to `size` bytes at the file's current position (fewer only at its end).
fn read_part(file: &mut File, size: u64) -> std::io::Result<Bytes> {
    let mut part = Vec::with_capacity(size as usize);
    file.by_ref().take(size).read_to_end(&mut part)?;
    Ok(Bytes::from(part))
}

/// One whole multipart attempt: parts read from the file as they are sent, at most
/// `PARTS_IN_FLIGHT` held at once; aborted on any failure.
async fn multipart_attempt(
    store: Arc<dyn ObjectStore>,
    path: Path,
    uri: String,
    file_path: PathBuf,
    size: u64,
    part_size: u64,
    attributes: Attributes,
) -> Result<(u64, String), StoreFailure> {
    let options = PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    let upload = store
        .put_multipart_opts(&path, options)
        .await
        .map_err(|e| classify_store_error(&uri, e, None))?;
    let mut guard = AbortUnlessCompleted(Some(upload));
    let sent = async {
        let Some(upload) = guard.0.as_mut() else {
            return Err(StoreFailure::Fatal(NativeError::Task(format!(
                "{uri}: the multipart upload is gone"
            ))));
        };
        let mut file = File::open(&file_path)
            .map_err(|e| StoreFailure::Fatal(io_error("Cannot open", &file_path, &e)))?;
        let mut in_flight = FuturesUnordered::new();
        let mut offset = 0u64;
        while offset < size {
            let part = tokio::task::block_in_place(|| read_part(&mut file, part_size))
                .map_err(|e| StoreFailure::Fatal(io_error("Cannot read", &file_path, &e)))?;
            if part.is_empty() {
                return Err(StoreFailure::Fatal(NativeError::InvalidData {
                    uri: uri.to_string(),
                    reason: format!(
                        "the file {} shrank while it was uploaded",
                        file_path.display()
                    ),
                }));
            }
            offset += part.len() as u64;
            in_flight.push(upload.put_part(PutPayload::from(part)));
            while in_flight.len() >= PARTS_IN_FLIGHT {
                if let Some(result) = in_flight.next().await {
                    result.map_err(|e| classify_store_error(&uri, e, None))?;
                }
            }
        }
        while let Some(result) = in_flight.next().await {
            result.map_err(|e| classify_store_error(&uri, e, None))?;
        }
        upload
            .complete()
            .await
            .map_err(|e| classify_store_error(&uri, e, None))
    }
    .await;
    match sent {
        Ok(result) => {
            guard.0 = None;
            Ok((size, result.e_tag.unwrap_or_default()))
        }
        Err(failure) => {
            if let Some(mut upload) = guard.0.take() {
                let _ = upload.abort().await;
            }
            Err(failure)
        }
    }
}

/// A multipart upload that is aborted unless it completed, also when its attempt is dropped
/// half-way (Ctrl-C cancels the task that runs it): no orphaned parts stay in the bucket.
struct AbortUnlessCompleted(Option<Box<dyn MultipartUpload>>);

impl Drop for AbortUnlessCompleted {
    fn drop(&mut self) {
        if let Some(mut upload) = self.0.take() {
            spawn_cleanup(async move {
                let _ = upload.abort().await;
            });
        }
    }
}

/// When a file becomes a multipart upload, and its part size (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct PutLimits {
    pub single_put_max: u64,
    pub multipart_threshold: u64,
    pub part_size: u64,
}

impl Default for PutLimits {
    fn default() -> Self {
        Self {
            single_put_max: SINGLE_PUT_MAX,
            multipart_threshold: MULTIPART_THRESHOLD,
            part_size: PART_SIZE,
        }
    }
}

/// What an object is written with: its content type and metadata, and whether it may replace
/// an object already there.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    pub content_type: Option<String>,
    pub metadata: HashMap<String, String>,
    pub create_only: bool,
}

/// Content type and metadata as object attributes (the local directory store keeps none).
pub fn object_attributes(
    location: &Location,
    content_type: Option<String>,
    metadata: HashMap<String, String>,
) -> Attributes {
    let mut attributes = Attributes::new();
    // The local directory store keeps no attributes; its files are the bytes alone.
    if location.is_local() {
        return attributes;
    }
    if let Some(content_type) = content_type {
        attributes.insert(Attribute::ContentType, content_type.into());
    }
    for (key, value) in metadata {
        attributes.insert(Attribute::Metadata(key.into()), value.into());
    }
    attributes
}

/// Writes an in-memory payload as one object; returns (size, etag). AlreadyExists when
/// `create_only` finds one holding other bytes.
pub fn put<C: Caller>(
    caller: &C,
    storage: &Storage,
    uri: &str,
    payload: PutPayload,
    options: WriteOptions,
) -> Result<(u64, String), C::Error> {
    let location = Location::parse(uri, false)?;
    location.check_writable(uri, "write")?;
    let attributes = object_attributes(&location, options.content_type, options.metadata);
    put_payload(
        caller,
        storage,
        uri,
        payload,
        attributes,
        options.create_only,
    )
}

/// Uploads a file as an object: one PUT, or a streamed multipart upload (see the module docs).
/// Returns (size, etag). AlreadyExists when `create_only` finds an existing object.
pub fn put_file<C: Caller>(
    caller: &C,
    storage: &Storage,
    uri: &str,
    path: &FsPath,
    options: WriteOptions,
    limits: PutLimits,
) -> Result<(u64, String), C::Error> {
    let location = Location::parse(uri, false)?;
    location.check_writable(uri, "write")?;
    refuse_special_file(path, false)?;
    let size = std::fs::metadata(path)
        .map_err(|e| io_error("Cannot read", path, &e))?
        .len();
    let create_only = options.create_only;
    if let Location::File { path: dest } = &location {
        let dest = PathBuf::from(dest);
        caller.blocking(|| put_local(uri, &dest, LocalSource::File(path), create_only))?;
        let (_, etag) = storage.head(caller, uri)?;
        return Ok((size, etag));
    }
    let attributes = object_attributes(&location, options.content_type, options.metadata);
    let single =
        size <= limits.multipart_threshold.max(1) || create_only && size <= limits.single_put_max;
    if single {
        let payload = caller.blocking(|| mapped_payload(path))?;
        return put_payload(caller, storage, uri, payload, attributes, create_only);
    }
    if create_only && storage.exists(caller, uri)? {
        return Err(NativeError::AlreadyExists {
            uri: uri.to_string(),
        }
        .into());
    }
    let object_path = location.object_path();
    let owned_uri = uri.to_string();
    let part_size = limits.part_size.max(5 * 1024 * 1024);
    let file_path = path.to_path_buf();
    with_retries(caller, "PUT", uri, |fresh| {
        let store = storage.store(&location, fresh)?;
        Ok(multipart_attempt(
            store,
            object_path.clone(),
            owned_uri.clone(),
            file_path.clone(),
            size,
            part_size,
            attributes.clone(),
        ))
    })
}
