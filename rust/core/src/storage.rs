//! A storage client for s3:// and file:// URIs: its stores (one per bucket, pooled), resumable
//! streams, and the point operations (GET, HEAD, DELETE, LIST) under the retry budget.
//! Writes are in [`crate::upload`], downloads to a file in [`crate::download`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use object_store::ObjectStore;

use crate::caller::{with_retries, Caller};
use crate::classify::{classify_store_error, StoreFailure};
use crate::error::{refuse_special_file, NativeError, NativeResult};
use crate::local_file::LocalShardSource;
use crate::object_stores::{build_store, endpoint_for, Location, StorageConfig};
use crate::policy;
use crate::process_bound::ProcessBound;
use crate::runtime::fork_guard;
use crate::source::ByteSource;
use crate::stream::{readahead_bound, StoreFactory, StreamReader, StreamRequest, Version};

/// Stores built in this process, by bucket. A forked child builds its own and leaks the
/// parent's (their pools may hold locks taken by the parent's threads: see [`ProcessBound`]).
type StoreCache = Mutex<HashMap<String, ProcessBound<Arc<dyn ObjectStore>>>>;

/// A storage client. Holds credentials; its `Debug` never shows the secret. A clone shares
/// its stores.
#[derive(Debug, Clone)]
pub struct Storage {
    config: StorageConfig,
    stores: Arc<StoreCache>,
}

impl Storage {
    /// A client for `config`; a malformed endpoint fails at once, not on first use.
    pub fn new(config: StorageConfig) -> NativeResult<Self> {
        if let Some(base) = &config.s3_base_url {
            endpoint_for(base, "bucket", config.virtual_hosted_style_request)?;
        }
        Ok(Self {
            config: config.resolved(),
            stores: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// The store for `location`'s bucket: this process's pooled one, or a new one when `fresh`
    /// (a retry after a failure, whose old connections may be what failed).
    pub fn store(&self, location: &Location, fresh: bool) -> NativeResult<Arc<dyn ObjectStore>> {
        let key = location.store_key();
        if !fresh {
            let _no_fork = fork_guard();
            let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(store) = stores.get(&key).and_then(ProcessBound::get) {
                return Ok(store.clone());
            }
        }
        // Built outside the lock: a fork while the lock is held would leave it held forever in
        // the child, and building a client takes a while.
        let store = build_store(&self.config, location, &policy::current())?;
        let _no_fork = fork_guard();
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        // Replacing an inherited store leaks it rather than dropping it.
        stores.insert(key, ProcessBound::new(store.clone()));
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

    /// Opens a resumable stream over `[start, size)` of an immutable object. `format`, when
    /// given, makes data errors read "Unreadable {format} shard {uri}: ...".
    pub fn stream(
        &self,
        uri: &str,
        size: u64,
        etag: Option<String>,
        start: u64,
        format: Option<&'static str>,
    ) -> NativeResult<StreamReader> {
        self.stream_range(uri, size, etag, start, size, format, None)
    }

    /// Opens a resumable stream over `[start, end)` of an immutable object of `size` bytes
    /// (the object must still have exactly `size` bytes; only `[start, end)` is requested).
    /// `readahead`: the most bytes it holds ahead of its consumer (`READAHEAD_BYTES` when
    /// `None`; a Config error outside `MIN_READAHEAD_BYTES..=READAHEAD_BYTES`).
    #[allow(clippy::too_many_arguments)]
    pub fn stream_range(
        &self,
        uri: &str,
        size: u64,
        etag: Option<String>,
        start: u64,
        end: u64,
        format: Option<&'static str>,
        readahead: Option<u64>,
    ) -> NativeResult<StreamReader> {
        let version = Version {
            etag,
            modified: None,
        };
        self.stream_version(uri, size, version, start, end, format, readahead)
    }

    /// [`Storage::stream_range`] held to a `version` (an ETag, or a web server's Last-Modified)
    /// that an earlier stream over the same object saw ([`StreamReader::pinned`]).
    #[allow(clippy::too_many_arguments)]
    pub fn stream_version(
        &self,
        uri: &str,
        size: u64,
        version: Version,
        start: u64,
        end: u64,
        format: Option<&'static str>,
        readahead: Option<u64>,
    ) -> NativeResult<StreamReader> {
        let readahead = readahead_bound(readahead)?;
        let location = Location::parse(uri, false)?;
        let Version { etag, modified } = version;
        let (etag, modified) = match &location {
            // A local file's etag (inode, mtime) changes with every copy or restore of the same
            // bytes, so it is not enforced (SPEC section 4); the size guards the read.
            Location::File { path } => {
                refuse_special_file(std::path::Path::new(path), true)?;
                (None, None)
            }
            // An https:// or hf:// read is held to the etag its caller saw (a manifest's are
            // not passed: a mirror's etags are its own), else to its first response's.
            Location::S3 { .. } | Location::Gcs { .. } | Location::Http { .. } => (etag, modified),
        };
        if start > size {
            return Err(NativeError::Config(format!(
                "{uri}: start offset {start} is past the size {size}"
            )));
        }
        if end < start || end > size {
            return Err(NativeError::Config(format!(
                "{uri}: invalid byte range [{start}, {end}) of an object of {size} bytes; \
                 expected start <= end <= {size}"
            )));
        }
        let request = StreamRequest {
            uri: uri.to_string(),
            path: location.object_path(),
            size,
            etag: etag.filter(|e| !e.is_empty()),
            modified,
            require_etag: matches!(location, Location::Http { .. }),
            start,
            end,
            format,
            policy: policy::current(),
            readahead,
        };
        StreamReader::open(request, self.factory(&location)?)
    }

    /// The bytes of a shard for its decoder: a local file's first piece is read by the
    /// decoder itself (no runtime task, no hand-off) and the rest streamed; an S3 object is
    /// streamed from its start.
    pub fn shard_source(
        &self,
        uri: &str,
        size: u64,
        etag: Option<String>,
        format: &'static str,
    ) -> NativeResult<Box<dyn ByteSource>> {
        self.shard_segment_source(uri, size, etag, format, None, None)
    }

    /// The bytes `[byte_start, byte_end)` of a shard of `size` bytes (all of it when `segment`
    /// is `None`), for a decoder that reads them as a whole shard: the object must still
    /// have exactly `size` bytes, but only the segment is requested (SPEC section 4's checks
    /// apply to the segment: no more and no fewer bytes than `byte_end - byte_start`).
    /// `readahead` as for [`Storage::stream_range`] (a local file's first piece is read
    /// directly, within any bound; the stream that takes over keeps to it).
    pub fn shard_segment_source(
        &self,
        uri: &str,
        size: u64,
        etag: Option<String>,
        format: &'static str,
        segment: Option<(u64, u64)>,
        readahead: Option<u64>,
    ) -> NativeResult<Box<dyn ByteSource>> {
        let (start, end) = segment.unwrap_or((0, size));
        check_segment(uri, size, segment)?;
        let readahead = readahead_bound(readahead)?;
        let location = Location::parse(uri, false)?;
        let Location::File { path } = &location else {
            return Ok(Box::new(self.stream_range(
                uri,
                size,
                etag,
                start,
                end,
                Some(format),
                Some(readahead as u64),
            )?));
        };
        let request = (uri, size, start, end, Some(format), readahead);
        Ok(Box::new(self.local_source(&location, path, request)?))
    }

    /// The bytes `[start, end)` of a local file of `size` bytes, its first piece read by the
    /// thread that asks for it; `request` is (uri, size, start, end, format, readahead).
    fn local_source(
        &self,
        location: &Location,
        path: &str,
        request: (&str, u64, u64, u64, Option<&'static str>, usize),
    ) -> NativeResult<LocalShardSource> {
        let (uri, size, start, end, format, readahead) = request;
        let path = std::path::PathBuf::from(path);
        refuse_special_file(&path, true)?;
        let request = StreamRequest {
            uri: uri.to_string(),
            path: location.object_path(),
            size,
            // A local file's etag is not enforced (SPEC section 4).
            etag: None,
            modified: None,
            require_etag: false,
            start,
            end,
            format,
            policy: policy::current(),
            readahead,
        };
        Ok(LocalShardSource::new(
            path,
            request,
            self.factory(location)?,
        ))
    }

    /// Bytes `[start, end)` (`start < end`) of an immutable object that must still have
    /// `size` bytes, read whole: a local file's by one read in the calling thread (no runtime
    /// task, no stream: a few index entries cost a `pread`), another store's by a resumable
    /// stream, held to `etag` as [`Storage::stream_range`] holds it.
    pub fn read_range<C: Caller>(
        &self,
        caller: &C,
        uri: &str,
        size: u64,
        etag: Option<String>,
        start: u64,
        end: u64,
    ) -> Result<Vec<u8>, C::Error> {
        check_segment(uri, size, Some((start, end)))?;
        let location = Location::parse(uri, false)?;
        let mut bytes = Vec::new();
        let Location::File { path } = &location else {
            let mut reader = self.stream_range(uri, size, etag, start, end, None, None)?;
            while let Some(chunk) = crate::caller::next_chunk(caller, &mut reader)? {
                bytes.extend_from_slice(&chunk);
            }
            return Ok(bytes);
        };
        let request = (uri, size, start, end, None, readahead_bound(None)?);
        let mut source = self.local_source(&location, path, request)?;
        caller.blocking(|| -> NativeResult<()> {
            while let Some(chunk) = source.next_chunk()? {
                bytes.extend_from_slice(&chunk);
            }
            Ok(())
        })?;
        Ok(bytes)
    }

    /// The whole object. NotFound if it does not exist.
    pub fn get<C: Caller>(&self, caller: &C, uri: &str) -> Result<bytes::Bytes, C::Error> {
        let location = Location::parse(uri, false)?;
        if let Location::File { path } = &location {
            refuse_special_file(std::path::Path::new(path), true)?;
        }
        let path = location.object_path();
        let owned_uri = uri.to_string();
        with_retries(caller, "GET", uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (path, uri) = (path.clone(), owned_uri.clone());
            Ok(async move {
                let result = store
                    .get(&path)
                    .await
                    .map_err(|e| classify_store_error(&uri, e, None))?;
                result
                    .bytes()
                    .await
                    .map_err(|e| classify_store_error(&uri, e, None))
            })
        })
    }

    /// (size, etag) of an object; the etag is "" where the store gives none.
    pub fn head<C: Caller>(&self, caller: &C, uri: &str) -> Result<(u64, String), C::Error> {
        match self.head_if_exists(caller, uri)? {
            Some(found) => Ok(found),
            None => Err(NativeError::NotFound {
                uri: uri.to_string(),
            }
            .into()),
        }
    }

    /// Whether an object exists (HEAD, under the retry budget).
    pub fn exists<C: Caller>(&self, caller: &C, uri: &str) -> Result<bool, C::Error> {
        Ok(self.head_if_exists(caller, uri)?.is_some())
    }

    /// (size, etag) of an object, or `None` when there is none.
    fn head_if_exists<C: Caller>(
        &self,
        caller: &C,
        uri: &str,
    ) -> Result<Option<(u64, String)>, C::Error> {
        let location = Location::parse(uri, false)?;
        if let Location::File { path } = &location {
            // The local store opens what it heads: a FIFO would block until a writer came.
            refuse_special_file(std::path::Path::new(path), true)?;
        }
        let path = location.object_path();
        let owned_uri = uri.to_string();
        with_retries(caller, "HEAD", uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (path, uri) = (path.clone(), owned_uri.clone());
            Ok(async move {
                match store.head(&path).await {
                    Ok(meta) => Ok(Some((meta.size, meta.e_tag.unwrap_or_default()))),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(classify_store_error(&uri, e, None)),
                }
            })
        })
    }

    /// Deletes an object (no error if it is already gone).
    pub fn delete<C: Caller>(&self, caller: &C, uri: &str) -> Result<(), C::Error> {
        let location = Location::parse(uri, false)?;
        location.check_writable(uri, "delete")?;
        let path = location.object_path();
        let owned_uri = uri.to_string();
        with_retries(caller, "DELETE", uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (path, uri) = (path.clone(), owned_uri.clone());
            Ok(async move {
                match store.delete(&path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(classify_store_error(&uri, e, None)),
                }
            })
        })
    }

    /// Every object under a prefix ("directory" semantics: `s3://b/a` lists `a/...`), as
    /// (uri, size, etag) sorted by URI.
    pub fn list<C: Caller>(
        &self,
        caller: &C,
        prefix_uri: &str,
    ) -> Result<Vec<(String, u64, String)>, C::Error> {
        let location = Location::parse(prefix_uri, true)?;
        location.check_writable(prefix_uri, "list")?;
        let prefix = location.object_path();
        let owned_uri = prefix_uri.to_string();
        let location_for_uris = location.clone();
        let mut listed = with_retries(caller, "LIST", prefix_uri, |fresh| {
            let store = self.store(&location, fresh)?;
            let (prefix, uri) = (prefix.clone(), owned_uri.clone());
            let location = location_for_uris.clone();
            Ok(async move {
                let prefix = (!prefix.as_ref().is_empty()).then_some(prefix);
                let objects: Vec<_> = match store.list(prefix.as_ref()).try_collect().await {
                    Ok(objects) => objects,
                    // A local prefix that does not exist yet is an empty listing.
                    Err(object_store::Error::NotFound { .. }) => Vec::new(),
                    Err(e) => return Err::<_, StoreFailure>(classify_store_error(&uri, e, None)),
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
}

/// A shard segment `(byte_start, byte_end)` must hold `0 <= byte_start < byte_end <= size`.
pub fn check_segment(uri: &str, size: u64, segment: Option<(u64, u64)>) -> NativeResult<()> {
    match segment {
        Some((start, end)) if !(start < end && end <= size) => Err(NativeError::Config(format!(
            "Invalid segment ({start}, {end}) of shard {uri} of {size} bytes; expected \
             0 <= byte_start < byte_end <= {size}"
        ))),
        _ => Ok(()),
    }
}
