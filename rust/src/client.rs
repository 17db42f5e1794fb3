//! The Python-facing storage client: point operations and object streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{Attribute, Attributes, ObjectStore, PutPayload};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use crate::classify::{classify, Failure};
use crate::codec::columnar::{column_selection, BatchOptions, ShardBatchReader};
use crate::codec::{RecordRange, ShardFormat, ShardReader};
use crate::error::{refuse_special_file, NativeError, NativeResult};
use crate::ops::{log_warning, with_retries};
use crate::policy;
use crate::runtime::fork_guard;
use crate::runtime::SIGNAL_POLL;
use crate::store::{build_store, Location, StoreConfig};
use crate::stream::{Received, StoreFactory, StreamReader, StreamRequest};
use crate::upload::put_payload;

/// Stores built in this process, by bucket; rebuilt after a fork (their pools are not shared).
type StoreCache = Mutex<HashMap<String, (u32, Arc<dyn ObjectStore>)>>;

/// A storage client for s3:// and file:// URIs. Holds credentials; never shows the secret.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct NativeStorage {
    pub(crate) config: StoreConfig,
    stores: Arc<StoreCache>,
}

impl NativeStorage {
    pub(crate) fn store(
        &self,
        location: &Location,
        fresh: bool,
    ) -> NativeResult<Arc<dyn ObjectStore>> {
        let pid = std::process::id();
        let key = location.store_key();
        if !fresh {
            let _no_fork = fork_guard();
            let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((owner, store)) = stores.get(&key) {
                if *owner == pid {
                    return Ok(store.clone());
                }
            }
        }
        // Built outside the lock: a fork while the lock is held would leave it held forever in
        // the child, and building a client takes a while.
        let store = build_store(&self.config, location, &policy::current())?;
        let _no_fork = fork_guard();
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores.insert(key, (pid, store.clone()));
        Ok(store)
    }

    /// The stores a stream connects with: first this client's pooled store (a shard open
    /// then costs no client, TLS set-up or connection of its own), then a fresh one for every
    /// reconnection after a failure, whose old connections may be what failed.
    fn factory(&self, location: &Location) -> NativeResult<StoreFactory> {
        let first = Mutex::new(Some(self.store(location, false)?));
        let config = self.config.clone();
        let location = location.clone();
        Ok(Arc::new(move || {
            if let Some(store) = first.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Ok(store);
            }
            build_store(&config, &location, &policy::current())
        }))
    }

    /// Opens a stream over `[start, size)` (shared by `open_stream` and the shard readers).
    pub fn stream(
        &self,
        uri: &str,
        size: u64,
        etag: Option<String>,
        start: u64,
        format: Option<&'static str>,
    ) -> NativeResult<StreamReader> {
        let location = Location::parse(uri, false)?;
        let etag = match &location {
            // A local file's etag (inode, mtime) changes with every copy or restore of the same
            // bytes, so it is not enforced (SPEC section 4); the size guards the read.
            Location::File { path } => {
                refuse_special_file(std::path::Path::new(path), true)?;
                None
            }
            Location::S3 { .. } => etag,
        };
        if start > size {
            return Err(NativeError::Config(format!(
                "{uri}: start offset {start} is past the size {size}"
            )));
        }
        let request = StreamRequest {
            uri: uri.to_string(),
            path: location.object_path(),
            size,
            etag: etag.filter(|e| !e.is_empty()),
            start,
            format,
            policy: policy::current(),
        };
        StreamReader::open(request, self.factory(&location)?)
    }
}

/// Content type and metadata as object attributes (the local directory store keeps none).
pub(crate) fn object_attributes(
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

#[pymethods]
impl NativeStorage {
    #[new]
    #[pyo3(signature = (*, s3_base_url=None, region="us-east-1".to_string(), access_key_id=None, secret_access_key=None, virtual_hosted_style_request=false))]
    fn new(
        s3_base_url: Option<String>,
        region: String,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        virtual_hosted_style_request: bool,
    ) -> NativeResult<Self> {
        let config = StoreConfig {
            s3_base_url: s3_base_url.filter(|u| !u.is_empty()),
            region,
            access_key_id,
            secret_access_key,
            virtual_hosted_style_request,
        };
        if let Some(base) = &config.s3_base_url {
            // Misconfiguration fails at once, not on first use.
            crate::store::endpoint_for(base, "bucket", config.virtual_hosted_style_request)?;
        }
        Ok(Self {
            config,
            stores: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "NativeStorage(s3_base_url={:?}, region={:?}, virtual_hosted_style_request={})",
            self.config.s3_base_url, self.config.region, self.config.virtual_hosted_style_request
        )
    }

    /// The whole object as bytes. FileNotFoundError if it does not exist.
    fn get<'py>(&self, py: Python<'py>, uri: &str) -> NativeResult<Bound<'py, PyBytes>> {
        let location = Location::parse(uri, false)?;
        if let Location::File { path } = &location {
            refuse_special_file(std::path::Path::new(path), true)?;
        }
        let path = location.object_path();
        let owned_uri = uri.to_string();
        let data = with_retries(py, "GET", uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (path, uri) = (path.clone(), owned_uri.clone());
            Ok(async move {
                let result = store
                    .get(&path)
                    .await
                    .map_err(|e| classify(&uri, e, None))?;
                result.bytes().await.map_err(|e| classify(&uri, e, None))
            })
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// (size, etag) of an object; the etag is "" where the store gives none.
    fn head(&self, py: Python<'_>, uri: &str) -> NativeResult<(u64, String)> {
        crate::upload::head(py, self, uri)
    }

    /// Writes an object; `create_only` refuses to replace one (FileExistsError).
    /// Returns (size, etag).
    #[pyo3(signature = (uri, data, *, content_type=None, metadata=None, create_only=false))]
    fn put(
        &self,
        py: Python<'_>,
        uri: &str,
        data: PyBackedBytes,
        content_type: Option<String>,
        metadata: Option<HashMap<String, String>>,
        create_only: bool,
    ) -> NativeResult<(u64, String)> {
        let location = Location::parse(uri, false)?;
        // Zero copy: the payload borrows the Python bytes object (kept alive by the Bytes owner).
        let payload = PutPayload::from(Bytes::from_owner(data));
        let attributes = object_attributes(&location, content_type, metadata.unwrap_or_default());
        put_payload(py, self, uri, payload, attributes, create_only)
    }

    /// Deletes an object (no error if it is already gone).
    fn delete(&self, py: Python<'_>, uri: &str) -> NativeResult<()> {
        let location = Location::parse(uri, false)?;
        let path = location.object_path();
        let owned_uri = uri.to_string();
        with_retries(py, "DELETE", uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (path, uri) = (path.clone(), owned_uri.clone());
            Ok(async move {
                match store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(classify(&uri, e, None)),
                }
            })
        })
    }

    /// Every object under a prefix ("directory" semantics: `s3://b/a` lists `a/...`), as
    /// (uri, size, etag) sorted by URI.
    fn list(&self, py: Python<'_>, prefix_uri: &str) -> NativeResult<Vec<(String, u64, String)>> {
        let location = Location::parse(prefix_uri, true)?;
        let prefix = location.object_path();
        let owned_uri = prefix_uri.to_string();
        let location_for_uris = location.clone();
        let mut listed = with_retries(py, "LIST", prefix_uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (prefix, uri) = (prefix.clone(), owned_uri.clone());
            let location = location_for_uris.clone();
            Ok(async move {
                let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
                let objects: Vec<_> = match store.list(prefix.as_ref()).try_collect().await {
                    Ok(objects) => objects,
                    // A local prefix that does not exist yet is an empty listing.
                    Err(object_store::Error::NotFound { .. }) => Vec::new(),
                    Err(e) => return Err::<_, Failure>(classify(&uri, e, None)),
                };
                Ok(objects
                    .into_iter()
                    .map(|m| {
                        (
                            location.uri_of(&m.location),
                            m.size,
                            m.e_tag.unwrap_or_default(),
                        )
                    })
                    .collect::<Vec<_>>())
            })
        })?;
        listed.sort();
        Ok(listed)
    }

    /// Decodes a msgpack.zstf or jsonl.gz shard straight from a resumable stream, off the GIL:
    /// the records `[start, stop)` (`stop` defaults to `records`; earlier ones are skipped
    /// without being decoded).
    #[pyo3(signature = (uri, data_format, *, size_bytes, records, etag=None, start=0, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn open_shard(
        &self,
        uri: &str,
        data_format: &str,
        size_bytes: u64,
        records: u64,
        etag: Option<String>,
        start: i64,
        stop: Option<i64>,
    ) -> NativeResult<ShardReader> {
        let range = RecordRange::new(records, start, stop)?;
        let format = ShardFormat::of_shard(uri, data_format)?;
        let reader = self.stream(uri, size_bytes, etag, 0, Some(format.name()))?;
        ShardReader::open(
            format.name(),
            uri.to_string(),
            Box::new(reader),
            size_bytes,
            range,
        )
    }

    /// Builds Arrow record batches of up to `batch_size` records of a msgpack.zstf or jsonl.gz
    /// shard straight from a resumable stream, off the GIL (`columns`: only those top-level
    /// keys, in that order).
    #[pyo3(signature = (uri, data_format, *, size_bytes, records, etag=None, start=0, stop=None, columns=None, batch_size))]
    #[allow(clippy::too_many_arguments)]
    fn open_shard_batches(
        &self,
        uri: &str,
        data_format: &str,
        size_bytes: u64,
        records: u64,
        etag: Option<String>,
        start: i64,
        stop: Option<i64>,
        columns: Option<Vec<String>>,
        batch_size: usize,
    ) -> PyResult<ShardBatchReader> {
        let range = RecordRange::new(records, start, stop)?;
        let format = ShardFormat::of_shard(uri, data_format)?;
        let options = BatchOptions {
            columns: column_selection(columns)?,
            batch_rows: batch_size,
        };
        let reader = self.stream(uri, size_bytes, etag, 0, Some(format.name()))?;
        let source = Box::new(reader);
        let uri = uri.to_string();
        Ok(ShardBatchReader::open(
            format, uri, source, size_bytes, range, options,
        )?)
    }

    /// A resumable stream over an immutable object of known size.
    #[pyo3(signature = (uri, size_bytes, *, etag=None, start=0))]
    fn open_stream(
        &self,
        uri: &str,
        size_bytes: u64,
        etag: Option<String>,
        start: u64,
    ) -> NativeResult<ObjectStream> {
        Ok(ObjectStream {
            reader: Some(self.stream(uri, size_bytes, etag, start, None)?),
            pending: None,
        })
    }
}

/// Chunks of one object, resumed across transient failures. Iterate for `bytes` chunks.
#[pyclass(module = "syvain_training_data._native")]
pub struct ObjectStream {
    reader: Option<StreamReader>,
    /// The unread tail of a chunk that `read(size)` split.
    pending: Option<Bytes>,
}

/// Pulls the next chunk with the GIL released, logging retries and honouring Ctrl-C.
pub fn next_chunk_interruptible(
    py: Python<'_>,
    reader: &mut StreamReader,
) -> NativeResult<Option<Bytes>> {
    loop {
        let received = py.allow_threads(|| reader.receive(SIGNAL_POLL));
        for warning in reader.take_warnings() {
            log_warning(py, &warning);
        }
        match received? {
            Received::Chunk(chunk) => return Ok(Some(chunk)),
            Received::End => return Ok(None),
            Received::Pending => py.check_signals()?,
        }
    }
}

impl ObjectStream {
    fn reader(&mut self) -> NativeResult<&mut StreamReader> {
        self.reader
            .as_mut()
            .ok_or_else(|| NativeError::Config("the stream is closed".into()))
    }
}

#[pymethods]
impl ObjectStream {
    /// The next chunk, or None at the end of the object.
    fn read_chunk<'py>(&mut self, py: Python<'py>) -> NativeResult<Option<Bound<'py, PyBytes>>> {
        if let Some(chunk) = self.pending.take() {
            return Ok(Some(PyBytes::new(py, &chunk)));
        }
        let reader = self.reader()?;
        Ok(next_chunk_interruptible(py, reader)?.map(|chunk| PyBytes::new(py, &chunk)))
    }

    /// Up to `size` bytes (all the rest when negative); b"" at the end.
    #[pyo3(signature = (size=-1))]
    fn read<'py>(&mut self, py: Python<'py>, size: i64) -> NativeResult<Bound<'py, PyBytes>> {
        let wanted = usize::try_from(size).unwrap_or(usize::MAX);
        let mut out: Vec<u8> = Vec::new();
        while out.len() < wanted {
            let chunk = match self.pending.take() {
                Some(chunk) => chunk,
                None => match next_chunk_interruptible(py, self.reader()?)? {
                    Some(chunk) => chunk,
                    None => break,
                },
            };
            let take = chunk.len().min(wanted - out.len());
            out.extend_from_slice(&chunk[..take]);
            if take < chunk.len() {
                self.pending = Some(chunk.slice(take..));
            }
        }
        Ok(PyBytes::new(py, &out))
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> NativeResult<Option<Bound<'py, PyBytes>>> {
        self.read_chunk(py)
    }

    /// Stops the background download and frees its buffers.
    fn close(&mut self) {
        self.reader = None;
        self.pending = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) {
        self.close();
    }

    #[getter]
    fn uri(&self) -> Option<String> {
        self.reader.as_ref().map(|r| r.uri().to_string())
    }

    #[getter]
    fn size(&self) -> Option<u64> {
        self.reader.as_ref().map(|r| r.size())
    }

    /// Bytes handed to the consumer so far.
    #[getter]
    fn position(&self) -> Option<u64> {
        self.reader.as_ref().map(|r| r.position())
    }

    /// Bytes downloaded ahead of the consumer, bounded by READAHEAD_BYTES.
    #[getter]
    fn buffered_bytes(&self) -> Option<usize> {
        self.reader.as_ref().map(|r| r.buffered_bytes())
    }

    /// Transient failures the stream resumed from so far.
    #[getter]
    fn resumes(&self) -> Option<u32> {
        self.reader.as_ref().map(|r| r.resumes())
    }
}

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
) -> NativeResult<()> {
    let seconds = |name: &str, value: f64| {
        Duration::try_from_secs_f64(value).map_err(|_| {
            NativeError::Config(format!("{name} must be a non-negative number of seconds"))
        })
    };
    if max_attempts == 0 {
        return Err(NativeError::Config(
            "max_attempts must be at least 1".into(),
        ));
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
