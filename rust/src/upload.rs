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
//! - The local directory store copies the file beside its destination and links it into place
//!   (create-only: a hard link fails when the name exists) or renames it (overwrite); the staged
//!   copy is removed in every case.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use object_store::path::Path;
use object_store::{Attributes, ObjectStore, PutMode, PutMultipartOptions, PutOptions, PutPayload};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::classify::{classify, Failure};
use crate::client::object_attributes;
use crate::client::NativeStorage;
use crate::error::{NativeError, NativeResult};
use crate::ops::with_retries;
use crate::store::Location;

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
fn put_payload(
    py: Python<'_>,
    storage: &NativeStorage,
    uri: &str,
    payload: PutPayload,
    attributes: Attributes,
    create_only: bool,
) -> NativeResult<(u64, String)> {
    let location = Location::parse(uri, false)?;
    let path = location.object_path();
    let size = payload.content_length() as u64;
    let owned_uri = uri.to_string();
    with_retries(py, "PUT", uri, |fresh| {
        let store = storage.store(&location, fresh)?;
        let (path, uri, payload) = (path.clone(), owned_uri.clone(), payload.clone());
        let options = PutOptions {
            mode: mode(create_only),
            attributes: attributes.clone(),
            ..Default::default()
        };
        Ok(async move {
            let result = store
                .put_opts(&path, payload, options)
                .await
                .map_err(|e| classify(&uri, e, None))?;
            Ok((size, result.e_tag.unwrap_or_default()))
        })
    })
}

/// Writes an object from its chunks without joining them (each chunk is borrowed from its
/// Python bytes object). Returns (size, etag). FileExistsError when `create_only` finds one.
#[pyfunction]
#[pyo3(signature = (storage, uri, chunks, *, content_type=None, metadata=None, create_only=false))]
fn put_chunks(
    py: Python<'_>,
    storage: &NativeStorage,
    uri: &str,
    chunks: Vec<PyBackedBytes>,
    content_type: Option<String>,
    metadata: Option<HashMap<String, String>>,
    create_only: bool,
) -> NativeResult<(u64, String)> {
    let location = Location::parse(uri, false)?;
    let payload: PutPayload = chunks
        .into_iter()
        .filter(|chunk| !chunk.is_empty())
        .map(Bytes::from_owner)
        .collect();
    let attributes = object_attributes(&location, content_type, metadata.unwrap_or_default());
    put_payload(py, storage, uri, payload, attributes, create_only)
}

fn io_error(what: &str, path: &FsPath, error: std::io::Error) -> NativeError {
    NativeError::Config(format!("{what} {}: {error}", path.display()))
}

fn read_whole(path: &FsPath) -> NativeResult<Bytes> {
    std::fs::read(path)
        .map(Bytes::from)
        .map_err(|e| io_error("Cannot read", path, e))
}

/// Reads up to `size` bytes at the file's current position (fewer only at its end).
fn read_part(file: &mut File, size: u64) -> std::io::Result<Bytes> {
    let mut part = Vec::with_capacity(size as usize);
    file.by_ref().take(size).read_to_end(&mut part)?;
    Ok(Bytes::from(part))
}

/// Removes the staged copy however the local write ends.
struct Staged(PathBuf);

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn staging_name(dest: &FsPath) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let token: u64 = rand::random();
    dest.with_file_name(format!(
        ".{name}.{}-{token:016x}.staging",
        std::process::id()
    ))
}

/// The local directory store: copy beside the destination, then link (create-only) or rename.
fn put_local_file(uri: &str, dest: &FsPath, src: &FsPath, create_only: bool) -> NativeResult<()> {
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io_error("Cannot create", parent, e))?;
    }
    let staged = Staged(staging_name(dest));
    std::fs::copy(src, &staged.0).map_err(|e| io_error("Cannot copy to", &staged.0, e))?;
    if create_only {
        match std::fs::hard_link(&staged.0, dest) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Err(NativeError::AlreadyExists {
                    uri: uri.to_string(),
                })
            }
            Err(e) => Err(io_error("Cannot link", dest, e)),
        }
    } else {
        std::fs::rename(&staged.0, dest).map_err(|e| io_error("Cannot rename to", dest, e))
    }
}

/// (size, etag) of an object, under the retry budget.
fn head(py: Python<'_>, storage: &NativeStorage, uri: &str) -> NativeResult<(u64, String)> {
    let location = Location::parse(uri, false)?;
    let path = location.object_path();
    let owned_uri = uri.to_string();
    with_retries(py, "HEAD", uri, |fresh| {
        let store = storage.store(&location, fresh)?;
        let (path, uri) = (path.clone(), owned_uri.clone());
        Ok(async move {
            let meta = store
                .head(&path)
                .await
                .map_err(|e| classify(&uri, e, None))?;
            Ok((meta.size, meta.e_tag.unwrap_or_default()))
        })
    })
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
) -> Result<(u64, String), Failure> {
    let options = PutMultipartOptions {
        attributes,
        ..Default::default()
    };
    let mut upload = store
        .put_multipart_opts(&path, options)
        .await
        .map_err(|e| classify(&uri, e, None))?;
    let sent = async {
        let mut file = File::open(&file_path)
            .map_err(|e| Failure::Fatal(io_error("Cannot open", &file_path, e)))?;
        let mut in_flight = FuturesUnordered::new();
        let mut offset = 0u64;
        while offset < size {
            let part = tokio::task::block_in_place(|| read_part(&mut file, part_size))
                .map_err(|e| Failure::Fatal(io_error("Cannot read", &file_path, e)))?;
            if part.is_empty() {
                return Err(Failure::Fatal(NativeError::InvalidData(format!(
                    "{uri}: the file {} shrank while it was uploaded",
                    file_path.display()
                ))));
            }
            offset += part.len() as u64;
            in_flight.push(upload.put_part(PutPayload::from(part)));
            while in_flight.len() >= PARTS_IN_FLIGHT {
                if let Some(result) = in_flight.next().await {
                    result.map_err(|e| classify(&uri, e, None))?;
                }
            }
        }
        while let Some(result) = in_flight.next().await {
            result.map_err(|e| classify(&uri, e, None))?;
        }
        upload.complete().await.map_err(|e| classify(&uri, e, None))
    }
    .await;
    match sent {
        Ok(result) => Ok((size, result.e_tag.unwrap_or_default())),
        Err(failure) => {
            let _ = upload.abort().await;
            Err(failure)
        }
    }
}

/// Uploads a file as an object: one PUT, or a streamed multipart upload (see the module docs).
/// Returns (size, etag). FileExistsError when `create_only` finds an existing object.
#[pyfunction]
#[pyo3(signature = (
    storage, uri, path, *, content_type=None, metadata=None, create_only=false,
    single_put_max=SINGLE_PUT_MAX, multipart_threshold=MULTIPART_THRESHOLD, part_size=PART_SIZE
))]
#[allow(clippy::too_many_arguments)]
fn put_file(
    py: Python<'_>,
    storage: &NativeStorage,
    uri: &str,
    path: PathBuf,
    content_type: Option<String>,
    metadata: Option<HashMap<String, String>>,
    create_only: bool,
    single_put_max: u64,
    multipart_threshold: u64,
    part_size: u64,
) -> NativeResult<(u64, String)> {
    let location = Location::parse(uri, false)?;
    let size = std::fs::metadata(&path)
        .map_err(|e| io_error("Cannot read", &path, e))?
        .len();
    if let Location::File { path: dest } = &location {
        let dest = PathBuf::from(dest);
        py.allow_threads(|| put_local_file(uri, &dest, &path, create_only))?;
        let (_, etag) = head(py, storage, uri)?;
        return Ok((size, etag));
    }
    let attributes = object_attributes(&location, content_type, metadata.unwrap_or_default());
    let single = size <= multipart_threshold.max(1) || create_only && size <= single_put_max;
    if single {
        // One request needs the body in memory: read it once (the spool's own memory is gone).
        let payload = PutPayload::from(py.allow_threads(|| read_whole(&path))?);
        return put_payload(py, storage, uri, payload, attributes, create_only);
    }
    if create_only {
        match head(py, storage, uri) {
            Ok(_) => {
                return Err(NativeError::AlreadyExists {
                    uri: uri.to_string(),
                })
            }
            Err(NativeError::NotFound { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    let object_path = location.object_path();
    let owned_uri = uri.to_string();
    let part_size = part_size.max(5 * 1024 * 1024);
    with_retries(py, "PUT", uri, |fresh| {
        let store = storage.store(&location, fresh)?;
        Ok(multipart_attempt(
            store,
            object_path.clone(),
            owned_uri.clone(),
            path.clone(),
            size,
            part_size,
            attributes.clone(),
        ))
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(put_chunks, m)?)?;
    m.add_function(wrap_pyfunction!(put_file, m)?)?;
    m.add("SINGLE_PUT_MAX", SINGLE_PUT_MAX)?;
    m.add("MULTIPART_THRESHOLD", MULTIPART_THRESHOLD)?;
    m.add("PART_SIZE", PART_SIZE)?;
    Ok(())
}
