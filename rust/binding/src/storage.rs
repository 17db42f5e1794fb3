//! `NativeStorage`: the Python-facing storage client. Each method parses its arguments, calls
//! the core's `Storage` with the GIL released, and turns the answer into Python objects.

use std::collections::HashMap;
use std::sync::Arc;

use object_store::PutPayload;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syvain_core::codec::columnar::{column_selection, BatchOptions};
use syvain_core::codec::gzip::GzipEntry;
use syvain_core::codec::parquet_read::{ParquetBatches, ParquetRequest};
use syvain_core::codec::{RecordRange, ShardFormat};
use syvain_core::credentials::AwsCredentialProvider;
use syvain_core::error::NativeError;
use syvain_core::object_stores::StorageConfig;
use syvain_core::source::ByteSource;
use syvain_core::storage::{check_segment, Storage};
use syvain_core::stream::invalid_readahead;
use syvain_core::upload::{self, WriteOptions};

use crate::caller::PythonCaller;
use crate::codec::gzip_points::{gzip_entry, EntryArgument};
use crate::codec::parquet_batches::ParquetBatchReader;
use crate::codec::shard_batches::ShardBatchReader;
use crate::codec::shard_reader::ShardReader;
use crate::credentials::PyCredentialProvider;
use crate::error::BindingResult;
use crate::object_stream::ObjectStream;
use crate::upload::PutData;

/// A storage client for s3:// and file:// URIs. Holds credentials; never shows the secret.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct NativeStorage {
    pub(crate) storage: Storage,
}

#[pymethods]
impl NativeStorage {
    /// Credentials, first match: `skip_signature`; `credential_provider` (a callable returning
    /// `(access_key_id, secret_access_key, session_token | None, seconds_left | None)`); the
    /// static keys (+ `session_token`); else the AWS SDKs' default chain. `allow_http`: read
    /// plain http:// URIs; `hf_token`: the Hub's bearer token for hf:// (else `HF_TOKEN`).
    #[new]
    #[pyo3(signature = (*, s3_base_url=None, region="us-east-1".to_string(), access_key_id=None, secret_access_key=None, session_token=None, virtual_hosted_style_request=false, skip_signature=false, credential_provider=None, allow_http=false, hf_token=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        s3_base_url: Option<String>,
        region: String,
        access_key_id: Option<String>,
        secret_access_key: Option<String>,
        session_token: Option<String>,
        virtual_hosted_style_request: bool,
        skip_signature: bool,
        credential_provider: Option<Py<PyAny>>,
        allow_http: bool,
        hf_token: Option<String>,
    ) -> BindingResult<Self> {
        let credential_provider = credential_provider.map(|callable| {
            Arc::new(PyCredentialProvider::new(py, callable)) as AwsCredentialProvider
        });
        let config = StorageConfig {
            s3_base_url: s3_base_url.filter(|u| !u.is_empty()),
            region,
            access_key_id,
            secret_access_key,
            session_token,
            virtual_hosted_style_request,
            skip_signature,
            credential_provider,
            default_chain: false,
            allow_http,
            hub_token: hf_token.filter(|t| !t.is_empty()),
        };
        // Misconfiguration fails at once, not on first use.
        Ok(Self {
            storage: Storage::new(config)?,
        })
    }

    fn __repr__(&self) -> String {
        let config = self.storage.config();
        format!(
            "NativeStorage(s3_base_url={:?}, region={:?}, virtual_hosted_style_request={}, \
             credentials={:?}, allow_http={}, hf_token={})",
            config.s3_base_url,
            config.region,
            config.virtual_hosted_style_request,
            config.credential_source(),
            config.allow_http,
            if config.hub_token.is_some() {
                "***"
            } else {
                "None"
            },
        )
    }

    /// The whole object as bytes. FileNotFoundError if it does not exist.
    fn get<'py>(&self, py: Python<'py>, uri: &str) -> BindingResult<Bound<'py, PyBytes>> {
        let data = self.storage.get(&PythonCaller(py), uri)?;
        Ok(PyBytes::new(py, &data))
    }

    /// (size, etag) of an object; the etag is "" where the store gives none.
    fn head(&self, py: Python<'_>, uri: &str) -> BindingResult<(u64, String)> {
        self.storage.head(&PythonCaller(py), uri)
    }

    /// Writes an object from bytes or a list of chunks (not joined); `create_only` refuses to
    /// replace one (FileExistsError). Returns (size, etag).
    #[pyo3(signature = (uri, data, *, content_type=None, metadata=None, create_only=false))]
    fn put(
        &self,
        py: Python<'_>,
        uri: &str,
        data: PutData,
        content_type: Option<String>,
        metadata: Option<HashMap<String, String>>,
        create_only: bool,
    ) -> BindingResult<(u64, String)> {
        let payload = PutPayload::from(data);
        let options = WriteOptions {
            content_type,
            metadata: metadata.unwrap_or_default(),
            create_only,
        };
        upload::put(&PythonCaller(py), &self.storage, uri, payload, options)
    }

    /// Deletes an object (no error if it is already gone).
    fn delete(&self, py: Python<'_>, uri: &str) -> BindingResult<()> {
        self.storage.delete(&PythonCaller(py), uri)
    }

    /// Every object under a prefix ("directory" semantics: `s3://b/a` lists `a/...`), as
    /// (uri, size, etag) sorted by URI.
    fn list(&self, py: Python<'_>, prefix_uri: &str) -> BindingResult<Vec<(String, u64, String)>> {
        self.storage.list(&PythonCaller(py), prefix_uri)
    }

    /// Decodes a msgpack.zstf or jsonl.gz shard straight from a resumable stream, off the GIL:
    /// the records `[start, stop)` (`stop` defaults to `records`; earlier ones are skipped
    /// without being decoded).
    ///
    /// `segment=(byte_start, byte_end)`: only those bytes of the object (which must still have
    /// `size_bytes` bytes) are requested, and read as a whole shard of `records` records and
    /// `byte_end - byte_start` bytes; `start`/`stop` count records inside the segment.
    ///
    /// `entry=(member_start, unused_bits, window, skip, first_record, first_line)` (jsonl.gz,
    /// with `segment`): the segment starts at that access point of the shard's index (see
    /// `GzipAccessPoints`); `records`, `start` and `stop` then count in the whole shard.
    ///
    /// `readahead_bytes`: the most bytes the read downloads ahead of its decoder (8 MiB when
    /// `None`; ValueError outside 64 KiB..=8 MiB).
    #[pyo3(signature = (uri, data_format, *, size_bytes, records, etag=None, start=0, stop=None, segment=None, entry=None, readahead_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn open_shard(
        &self,
        py: Python<'_>,
        uri: &str,
        data_format: &str,
        size_bytes: u64,
        records: u64,
        etag: Option<String>,
        start: i64,
        stop: Option<i64>,
        segment: Option<(i64, i64)>,
        entry: Option<EntryArgument>,
        readahead_bytes: Option<i64>,
    ) -> BindingResult<ShardReader> {
        let range = RecordRange::new(records, start, stop)?;
        let format = ShardFormat::of_shard(uri, data_format)?;
        let entry = checked_entry(format, segment, entry)?;
        let (source, decoded_size) =
            self.shard_read(uri, size_bytes, etag, format, segment, readahead_bytes)?;
        Ok(ShardReader::open(
            py,
            format,
            uri.to_string(),
            source,
            decoded_size,
            range,
            entry,
        )?)
    }

    /// Builds Arrow record batches of up to `batch_size` records of a msgpack.zstf or jsonl.gz
    /// shard straight from a resumable stream, off the GIL (`columns`: only those top-level
    /// keys, in that order). `segment`, `entry` and `readahead_bytes` as for `open_shard`.
    #[pyo3(signature = (uri, data_format, *, size_bytes, records, etag=None, start=0, stop=None, columns=None, batch_size, segment=None, entry=None, readahead_bytes=None))]
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
        segment: Option<(i64, i64)>,
        entry: Option<EntryArgument>,
        readahead_bytes: Option<i64>,
    ) -> BindingResult<ShardBatchReader> {
        let range = RecordRange::new(records, start, stop)?;
        let format = ShardFormat::of_shard(uri, data_format)?;
        let entry = checked_entry(format, segment, entry)?;
        let options = BatchOptions {
            columns: column_selection(columns)?,
            batch_rows: batch_size,
        };
        let (source, decoded_size) =
            self.shard_read(uri, size_bytes, etag, format, segment, readahead_bytes)?;
        let uri = uri.to_string();
        Ok(ShardBatchReader::open(
            format,
            uri,
            source,
            decoded_size,
            range,
            options,
            entry,
        )?)
    }

    /// Reads rows `[start, stop)` of a Parquet shard in place (`stop` None: every row group
    /// from `start` to the file's end): its footer, then only the pages of those rows (where
    /// the file has an offset index) of `columns` (top-level names; None: all). Batches of
    /// `batch_rows` rows (None: about 1 MiB of the file's column data), fewer where a batch
    /// would declare more than `max_batch_values` list values. Fetches the footer here.
    #[pyo3(signature = (uri, *, size_bytes, etag=None, start=0, stop=None, columns=None, batch_rows=None, max_batch_values))]
    #[allow(clippy::too_many_arguments)]
    fn open_parquet(
        &self,
        py: Python<'_>,
        uri: String,
        size_bytes: u64,
        etag: Option<String>,
        start: u64,
        stop: Option<u64>,
        columns: Option<Vec<String>>,
        batch_rows: Option<usize>,
        max_batch_values: u64,
    ) -> BindingResult<ParquetBatchReader> {
        let request = ParquetRequest {
            uri,
            size: size_bytes,
            etag: etag.filter(|e| !e.is_empty()),
            start,
            stop,
            columns,
            batch_rows,
            max_batch_values,
        };
        let storage = &self.storage;
        let batches = crate::exiting::without_gil(py, || ParquetBatches::open(storage, request))?;
        Ok(ParquetBatchReader::new(batches))
    }

    /// Bytes `[start, end)` (`start < end`) of an immutable object of `size_bytes` bytes, read
    /// whole: a local file's by one read, without a stream (small reads, such as index
    /// entries); held to `etag` as `open_stream` is.
    #[pyo3(signature = (uri, size_bytes, *, start, end, etag=None))]
    fn read_range<'py>(
        &self,
        py: Python<'py>,
        uri: &str,
        size_bytes: u64,
        start: u64,
        end: u64,
        etag: Option<String>,
    ) -> BindingResult<Bound<'py, PyBytes>> {
        let bytes =
            (self.storage).read_range(&PythonCaller(py), uri, size_bytes, etag, start, end)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// A resumable stream over bytes `[start, end)` (default: to the end) of an immutable
    /// object of known size; `readahead_bytes` as for `open_shard`.
    #[pyo3(signature = (uri, size_bytes, *, etag=None, start=0, end=None, readahead_bytes=None))]
    fn open_stream(
        &self,
        uri: &str,
        size_bytes: u64,
        etag: Option<String>,
        start: u64,
        end: Option<u64>,
        readahead_bytes: Option<i64>,
    ) -> BindingResult<ObjectStream> {
        let readahead = readahead(readahead_bytes)?;
        let end = end.unwrap_or(size_bytes);
        let reader =
            (self.storage).stream_range(uri, size_bytes, etag, start, end, None, readahead)?;
        Ok(ObjectStream::new(reader))
    }
}

impl NativeStorage {
    /// The byte source of a shard read (the whole object, or its `segment`), and the size the
    /// decoder checks it against.
    fn shard_read(
        &self,
        uri: &str,
        size_bytes: u64,
        etag: Option<String>,
        format: ShardFormat,
        segment: Option<(i64, i64)>,
        readahead_bytes: Option<i64>,
    ) -> BindingResult<(Box<dyn ByteSource>, u64)> {
        let segment = byte_segment(uri, size_bytes, segment)?;
        let readahead = readahead(readahead_bytes)?;
        let source = (self.storage).shard_segment_source(
            uri,
            size_bytes,
            etag,
            format.name(),
            segment,
            readahead,
        )?;
        Ok((
            source,
            segment.map_or(size_bytes, |(start, end)| end - start),
        ))
    }
}

/// The `entry` argument, checked: a jsonl.gz read of a `segment` only.
fn checked_entry(
    format: ShardFormat,
    segment: Option<(i64, i64)>,
    entry: Option<EntryArgument>,
) -> BindingResult<Option<GzipEntry>> {
    if entry.is_some() && segment.is_none() {
        return Err(PyValueError::new_err("entry needs the segment it starts").into());
    }
    Ok(gzip_entry(format, entry)?)
}

/// The `segment` argument, checked: `0 <= byte_start < byte_end <= size_bytes`.
fn byte_segment(
    uri: &str,
    size_bytes: u64,
    segment: Option<(i64, i64)>,
) -> BindingResult<Option<(u64, u64)>> {
    let Some((byte_start, byte_end)) = segment else {
        return Ok(None);
    };
    let (Ok(start), Ok(end)) = (u64::try_from(byte_start), u64::try_from(byte_end)) else {
        return Err(NativeError::Config(format!(
            "Invalid segment ({byte_start}, {byte_end}) of shard {uri} of {size_bytes} bytes; \
             expected 0 <= byte_start < byte_end <= {size_bytes}"
        ))
        .into());
    };
    check_segment(uri, size_bytes, Some((start, end)))?;
    Ok(Some((start, end)))
}

/// The `readahead_bytes` argument: a negative one is refused here, the range in the core.
fn readahead(readahead_bytes: Option<i64>) -> BindingResult<Option<u64>> {
    match readahead_bytes {
        None => Ok(None),
        Some(bytes) => match u64::try_from(bytes) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(_) => Err(invalid_readahead(bytes).into()),
        },
    }
}
