//! Parquet shards read in place by arrow-rs: the footer (and its page index, when the file has
//! one) from the object's tail, then only the pages that hold the rows and columns asked for.
//!
//! A read of rows `[start, stop)` selects the row groups around them and, inside them, only
//! those rows: with an offset index (pyarrow's `write_page_index`, which our saver sets), the
//! reader fetches just the pages the rows fall in, so a consumer that reads a slice of a large
//! row group fetches about that slice; without one, the whole column chunks of the row groups
//! it touches. Every byte comes through [`ObjectRanges`]: a local file by `pread`, a stored
//! object by our resumable ranged streams (held to one version by If-Match, resumed after
//! transient failures, counted where the read was opened), adjacent ranges joined into one
//! request.
//!
//! Top-level byte-array columns are decoded dictionary-encoded (a value many rows reference is
//! held once); the Python side expands them in bounded pieces (`formats.parquet.bounds`).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStream};
use parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};

mod thrift_bounds;
mod thrift_idl;

use thrift_bounds::check_struct;
use thrift_idl::{FILE_META_DATA, OFFSET_INDEX};

use crate::counters::{self, Counters};
use crate::error::{io_error, not_a_regular_file, NativeError, NativeResult};
use crate::object_stores::Location;
use crate::source::ByteSource;
use crate::storage::Storage;
use crate::stream::{StreamReader, Version};

const FORMAT: &str = "parquet";
/// The object's last bytes fetched first: the footer and page index of a shard of a few row
/// groups (a larger footer costs a second read of exactly its size). Each block read of a
/// shard fetches it, so it is kept small.
const TAIL_GUESS: u64 = 16 * 1024;
/// The most bytes of footer (with its page index) read; a larger page index is done without.
const MAX_FOOTER_BYTES: u64 = 64 * 1024 * 1024;
/// Ranges at most this far apart are fetched as one request (the gap is read and dropped).
const JOIN_GAP: u64 = 4 * 1024;

/// Rows per decoded batch when the caller gives none: about this much uncompressed column data,
/// a multiple of `ROW_STEP` rows from `ROW_STEP` to `MAX_BATCH_ROWS`.
const BATCH_BYTES: u64 = 1024 * 1024;
const ROW_STEP: u64 = 1024;
const MAX_BATCH_ROWS: u64 = 64 * 1024;

/// What to read of one Parquet shard.
pub struct ParquetRequest {
    pub uri: String,
    pub size: u64,
    /// The version every read is held to (a stored object; None: its first response's).
    pub etag: Option<String>,
    pub start: u64,
    /// None: every row group from `start` to the file's end (the caller counts them).
    pub stop: Option<u64>,
    /// Top-level columns to decode, by name (those the file lacks are left out); None: all.
    pub columns: Option<Vec<String>>,
    /// Rows per batch; None: from the footer's sizes (see `BATCH_BYTES`).
    pub batch_rows: Option<usize>,
    /// The most list values a batch may declare (nested values cost a few bits of levels each
    /// in the file, and bytes once decoded).
    pub max_batch_values: u64,
}

/// The batches of one read, decoded one at a time on the caller's thread.
pub struct ParquetBatches {
    uri: String,
    plain_schema: SchemaRef,
    stream: Option<ParquetRecordBatchStream<ObjectRanges>>,
    fetched: Arc<Fetched>,
    paged: bool,
    rows: i64,
}

/// What a read fetched: requests and bytes (the footer's included).
#[derive(Default)]
pub struct Fetched {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

impl ParquetBatches {
    /// Reads the footer and plans the read; data pages are fetched as batches are decoded.
    pub fn open(storage: &Storage, request: ParquetRequest) -> NativeResult<Self> {
        Self::planned(request, |request| ObjectRanges::open(storage, request))
    }

    /// A read of a file held in memory (`request.size` is taken from `data`): tests and fuzzing.
    pub fn from_bytes(data: Bytes, mut request: ParquetRequest) -> NativeResult<Self> {
        request.size = data.len() as u64;
        Self::planned(request, |request| {
            Ok(ObjectRanges::in_memory(data, request))
        })
    }

    fn planned(
        request: ParquetRequest,
        ranges: impl FnOnce(&ParquetRequest) -> NativeResult<ObjectRanges>,
    ) -> NativeResult<Self> {
        let uri = request.uri.clone();
        let ranges = ranges(&request)?;
        // A footer that makes the decoder panic fails this read, not the interpreter.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Self::plan(request, ranges)))
            .unwrap_or_else(|_| {
                Err(shard_error(
                    &uri,
                    "the Parquet decoder failed on its footer",
                ))
            })
    }

    fn plan(request: ParquetRequest, mut ranges: ObjectRanges) -> NativeResult<Self> {
        let uri = request.uri.clone();
        let fetched = ranges.fetched.clone();
        let metadata = read_metadata(&mut ranges)?;
        let data = |e: ParquetError| data_error(&uri, e);
        let plain = ArrowReaderMetadata::try_new(metadata.clone(), ArrowReaderOptions::new())
            .map_err(data)?;
        let plain_schema = plain.schema().clone();
        let rows = metadata.file_metadata().num_rows();
        let paged = metadata.offset_index().is_some_and(|groups| {
            groups.len() == metadata.num_row_groups()
                && groups.iter().all(|columns| {
                    columns.len() == metadata.file_metadata().schema_descr().num_columns()
                })
        });
        if let Some(problem) = unexportable(&plain_schema) {
            return Err(shard_error(&uri, problem));
        }
        let options = ArrowReaderOptions::new().with_schema(dictionary_hint(&plain, &plain_schema));
        let reader = ArrowReaderMetadata::try_new(metadata.clone(), options).map_err(data)?;
        let (groups, selection) = row_plan(&uri, &metadata, request.start, request.stop)?;
        if groups.is_empty() {
            return Ok(Self {
                uri,
                plain_schema,
                stream: None,
                fetched,
                paged,
                rows,
            });
        }
        let batch_rows = request
            .batch_rows
            .unwrap_or_else(|| default_batch_rows(&metadata));
        let nested = values_per_row(&metadata);
        let batch_rows = batch_rows.min((request.max_batch_values / nested).max(1) as usize);
        let projection = match &request.columns {
            None => ProjectionMask::all(),
            Some(names) => {
                let roots = plain_schema
                    .fields()
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| names.contains(f.name()))
                    .map(|(i, _)| i);
                ProjectionMask::roots(metadata.file_metadata().schema_descr(), roots)
            }
        };
        ranges.whole_spans = whole_spans(&metadata, &groups, &selection, &projection);
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(ranges, reader)
            .with_row_groups(groups)
            .with_row_selection(selection)
            .with_projection(projection)
            .with_batch_size(batch_rows.max(1))
            .build()
            .map_err(data)?;
        Ok(Self {
            uri,
            plain_schema,
            stream: Some(stream),
            fetched,
            paged,
            rows,
        })
    }

    /// The file's columns with the types they have once dictionaries are expanded.
    pub fn plain_schema(&self) -> SchemaRef {
        self.plain_schema.clone()
    }

    /// The rows the footer declares.
    pub fn rows(&self) -> i64 {
        self.rows
    }

    /// Whether the file has an offset index for every column chunk (a read of a slice of a
    /// row group then fetches only its pages).
    pub fn paged(&self) -> bool {
        self.paged
    }

    /// (requests, bytes) fetched so far.
    pub fn fetched(&self) -> (u64, u64) {
        let f = &self.fetched;
        (
            f.requests.load(Ordering::Relaxed),
            f.bytes.load(Ordering::Relaxed),
        )
    }

    /// The next batch (blocking: fetches its pages); None at the end of the read.
    pub fn next_batch(&mut self) -> NativeResult<Option<RecordBatch>> {
        let Some(stream) = &mut self.stream else {
            return Ok(None);
        };
        // A decoder that panics on hostile bytes fails this read, not the interpreter.
        let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            futures::executor::block_on(stream.next())
        }));
        let outcome = match next {
            Ok(outcome) => outcome,
            Err(_) => {
                self.stream = None;
                return Err(shard_error(
                    &self.uri,
                    "the Parquet decoder failed on its bytes",
                ));
            }
        };
        match outcome {
            None => {
                self.stream = None;
                Ok(None)
            }
            Some(Ok(batch)) => Ok(Some(batch)),
            Some(Err(error)) => {
                self.stream = None;
                Err(data_error(&self.uri, error))
            }
        }
    }
}

/// The footer (with the offset index, when the file has one within `MAX_FOOTER_BYTES`), each
/// checked by [`thrift_bounds`] before arrow-rs decodes it.
fn read_metadata(ranges: &mut ObjectRanges) -> NativeResult<Arc<ParquetMetaData>> {
    let size = ranges.size;
    let uri = ranges.uri.clone();
    let bounded = |bytes: &[u8], index: usize| {
        check_struct(bytes, index).map_err(|problem| shard_error(&uri, problem))
    };
    let mut suffix = size.min(TAIL_GUESS);
    let metadata = loop {
        let tail = ranges.fetch(size - suffix..size)?;
        ranges.tail = (size - suffix, tail.clone());
        if let Some(footer) = whole_footer(&tail) {
            bounded(footer, FILE_META_DATA)?;
        }
        let mut reader = ParquetMetaDataReader::new();
        match reader.try_parse_sized(&tail, size) {
            Ok(()) => break reader.finish().map_err(|e| data_error(&uri, e))?,
            Err(ParquetError::NeedMoreData(needed)) => {
                let needed = needed as u64;
                if needed <= suffix || needed > size {
                    return Err(shard_error(
                        &uri,
                        format!("its footer needs {needed} bytes"),
                    ));
                }
                if needed > MAX_FOOTER_BYTES {
                    return Err(shard_error(
                        &uri,
                        format!(
                            "its footer takes {needed} bytes, over the limit of \
                             {MAX_FOOTER_BYTES}"
                        ),
                    ));
                }
                suffix = needed;
            }
            Err(error) => return Err(data_error(&uri, error)),
        }
    };
    // The offset index: where every column chunk has one, and it sits within the last
    // MAX_FOOTER_BYTES (else the file is read by whole column chunks).
    let mut blobs = Vec::new();
    for chunk in metadata
        .row_groups()
        .iter()
        .flat_map(|group| group.columns())
    {
        let (Some(offset), Some(length)) =
            (chunk.offset_index_offset(), chunk.offset_index_length())
        else {
            return Ok(Arc::new(metadata));
        };
        let (Ok(start), Ok(length)) = (u64::try_from(offset), u64::try_from(length)) else {
            return Err(shard_error(&uri, "its offset index has a negative place"));
        };
        let end = start.checked_add(length).filter(|&end| end <= size);
        let end = end.ok_or_else(|| shard_error(&uri, "its offset index lies past its end"))?;
        blobs.push(start..end);
    }
    let Some(first) = blobs.iter().map(|blob| blob.start).min() else {
        return Ok(Arc::new(metadata));
    };
    if size - first > MAX_FOOTER_BYTES {
        return Ok(Arc::new(metadata));
    }
    if first < ranges.tail.0 {
        let tail = ranges.fetch(first..size)?;
        ranges.tail = (first, tail);
    }
    let (tail_start, tail) = ranges.tail.clone();
    for blob in &blobs {
        let blob = (blob.start - tail_start) as usize..(blob.end - tail_start) as usize;
        bounded(&tail[blob], OFFSET_INDEX)?;
    }
    let mut reader = ParquetMetaDataReader::new_with_metadata(metadata)
        .with_offset_index_policy(PageIndexPolicy::Optional);
    reader
        .read_page_indexes_sized(&tail, size)
        .and_then(|()| reader.finish())
        .map(Arc::new)
        .map_err(|e| data_error(&uri, e))
}

/// The footer's Thrift bytes when `tail` (the file's last bytes) holds all of them.
fn whole_footer(tail: &[u8]) -> Option<&[u8]> {
    let end = tail.len().checked_sub(8)?;
    let length = u32::from_le_bytes(tail[end..end + 4].try_into().ok()?) as usize;
    tail.get(end.checked_sub(length)?..end)
}

/// The row groups holding rows `[start, stop)` and the selection of those rows inside them.
fn row_plan(
    uri: &str,
    metadata: &ParquetMetaData,
    start: u64,
    stop: Option<u64>,
) -> NativeResult<(Vec<usize>, RowSelection)> {
    let mut groups = Vec::new();
    let (mut skip, mut first_row, mut held) = (0u64, 0u64, 0u64);
    for (index, group) in metadata.row_groups().iter().enumerate() {
        let rows = u64::try_from(group.num_rows())
            .map_err(|_| shard_error(uri, format!("row group {index} declares negative rows")))?;
        if stop.is_some_and(|stop| first_row >= stop) {
            break;
        }
        if first_row + rows > start {
            if groups.is_empty() {
                skip = start - first_row;
            }
            groups.push(index);
            held += rows;
        }
        first_row = first_row
            .checked_add(rows)
            .ok_or_else(|| shard_error(uri, "its row groups declare too many rows"))?;
    }
    let wanted = match stop {
        Some(stop) => (stop - start).min(held - skip),
        None => held - skip,
    };
    let selectors = [
        RowSelector::skip(skip as usize),
        RowSelector::select(wanted as usize),
        RowSelector::skip((held - skip - wanted) as usize),
    ];
    Ok((
        groups,
        selectors
            .into_iter()
            .filter(|s| s.row_count > 0)
            .collect::<Vec<_>>()
            .into(),
    ))
}

/// The byte spans of the row groups of `groups` that `selection` reads whole, over the leaves
/// of `projection`.
fn whole_spans(
    metadata: &ParquetMetaData,
    groups: &[usize],
    selection: &RowSelection,
    projection: &ProjectionMask,
) -> Vec<Range<u64>> {
    let selectors: Vec<RowSelector> = selection.clone().into();
    let (skipped, wanted) = match selectors.as_slice() {
        [RowSelector {
            skip: true,
            row_count: skip,
        }, RowSelector {
            skip: false,
            row_count: n,
        }, ..] => (*skip, *n),
        [RowSelector {
            skip: false,
            row_count: n,
        }, ..] => (0, *n),
        _ => return Vec::new(),
    };
    let (mut first_row, mut spans) = (0usize, Vec::new());
    for &group in groups {
        let rows = metadata.row_group(group).num_rows().max(0) as usize;
        let whole = first_row >= skipped && first_row + rows <= skipped + wanted;
        first_row += rows;
        if !whole {
            continue;
        }
        let columns = metadata.row_group(group).columns();
        let span = (0..columns.len())
            .filter(|&leaf| projection.leaf_included(leaf))
            .map(|leaf| {
                let (start, length) = columns[leaf].byte_range();
                start..start.saturating_add(length)
            })
            .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end));
        spans.extend(span);
    }
    spans
}

/// The reader's schema with every top-level byte-array column that the file dictionary-encodes
/// read as a dictionary (a value many rows reference stays one value). A column of plain pages
/// is read plain: turning it into a dictionary would hash every value, to be expanded again.
fn dictionary_hint(reader: &ArrowReaderMetadata, plain: &SchemaRef) -> SchemaRef {
    let metadata = reader.metadata();
    let descr = metadata.file_metadata().schema_descr();
    let dictionary_encoded = |leaf: usize| {
        metadata.row_groups().iter().any(|group| {
            let chunk = group.column(leaf);
            chunk.dictionary_page_offset().is_some()
                || chunk
                    .encodings()
                    .iter()
                    .any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY))
        })
    };
    let byte_array_roots: Vec<bool> = (0..plain.fields().len())
        .map(|root| {
            let leaves: Vec<_> = (0..descr.num_columns())
                .filter(|&leaf| descr.get_column_root_idx(leaf) == root)
                .collect();
            leaves.len() == 1 && {
                let column = descr.column(leaves[0]);
                column.physical_type() == PhysicalType::BYTE_ARRAY
                    && column.max_rep_level() == 0
                    && column.path().parts().len() == 1
                    && dictionary_encoded(leaves[0])
            }
        })
        .collect();
    let fields: Vec<Field> = plain
        .fields()
        .iter()
        .zip(byte_array_roots)
        .map(|(field, byte_array)| match field.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
                if byte_array =>
            {
                field.as_ref().clone().with_data_type(DataType::Dictionary(
                    Box::new(DataType::Int32),
                    Box::new(field.data_type().clone()),
                ))
            }
            _ => field.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, plain.metadata().clone()))
}

/// Why the Arrow C interface could not carry `schema` (its strings are C strings), if it
/// cannot: a NUL byte in a column name or a metadata key or value.
fn unexportable(schema: &Schema) -> Option<String> {
    let has_nul = |text: &str| text.contains('\0');
    let metadata_nul = |metadata: &std::collections::HashMap<String, String>| {
        metadata.iter().any(|(k, v)| has_nul(k) || has_nul(v))
    };
    if metadata_nul(schema.metadata()) {
        return Some("its schema metadata holds a NUL byte".into());
    }
    let mut fields: Vec<&Field> = schema.fields().iter().map(|f| f.as_ref()).collect();
    while let Some(field) = fields.pop() {
        if has_nul(field.name()) || metadata_nul(field.metadata()) {
            return Some(format!("its column {:?} holds a NUL byte", field.name()));
        }
        match field.data_type() {
            DataType::Struct(children) => fields.extend(children.iter().map(|f| f.as_ref())),
            DataType::List(child)
            | DataType::LargeList(child)
            | DataType::FixedSizeList(child, _)
            | DataType::Map(child, _)
            | DataType::ListView(child)
            | DataType::LargeListView(child) => fields.push(child.as_ref()),
            DataType::Union(children, _) => fields.extend(children.iter().map(|(_, f)| f.as_ref())),
            _ => {}
        }
    }
    None
}

/// Rows per batch of about `BATCH_BYTES` of the file's uncompressed column data.
fn default_batch_rows(metadata: &ParquetMetaData) -> usize {
    let groups = metadata.row_groups();
    let rows: u64 = groups.iter().map(|g| g.num_rows().max(0) as u64).sum();
    let bytes: u64 = groups
        .iter()
        .map(|g| g.total_byte_size().max(0) as u64)
        .sum();
    let per_row = (bytes / rows.max(1)).max(1);
    let batch = BATCH_BYTES / per_row / ROW_STEP * ROW_STEP;
    batch.clamp(ROW_STEP, MAX_BATCH_ROWS) as usize
}

/// The most values any column chunk declares per row (long lists show here before decoding).
fn values_per_row(metadata: &ParquetMetaData) -> u64 {
    let mut most = 1u64;
    for group in metadata.row_groups() {
        let rows = group.num_rows().max(1) as u64;
        for column in group.columns() {
            let values = column.num_values().max(0) as u64;
            most = most.max(values.div_ceil(rows));
        }
    }
    most
}

fn shard_error(uri: &str, reason: impl Into<String>) -> NativeError {
    NativeError::Shard {
        format: FORMAT,
        uri: uri.to_string(),
        reason: reason.into(),
    }
}

/// A decoder error; a fetch's own error (the store's) comes back as it was raised.
fn data_error(uri: &str, error: ParquetError) -> NativeError {
    match error {
        ParquetError::External(inner) => external(uri, inner),
        other => shard_error(uri, other.to_string()),
    }
}

fn external(uri: &str, error: Box<dyn std::error::Error + Send + Sync>) -> NativeError {
    match error.downcast::<NativeError>() {
        Ok(native) => *native,
        Err(other) => shard_error(uri, other.to_string()),
    }
}

/// The bytes of one shard by range: a local file by `pread`, a stored object by ranged streams
/// (or bytes held in memory).
pub struct ObjectRanges {
    storage: Option<Storage>,
    file: Option<File>,
    memory: Option<Bytes>,
    uri: String,
    size: u64,
    /// The version every read of the object is held to: the caller's etag, else the first
    /// response's etag or (a web server without ETags) Last-Modified, so that a footer and
    /// the pages it points to come from one version.
    version: Mutex<Version>,
    counters: Option<Arc<Counters>>,
    fetched: Arc<Fetched>,
    /// The object's last bytes, fetched for the footer and kept: the pages they cover (all of
    /// a small file) are not fetched again.
    tail: (u64, Bytes),
    /// The byte spans of the row groups read whole (their selected columns), in file order.
    whole_spans: Vec<Range<u64>>,
    /// A stream opened ahead over one of them.
    ahead: Option<(Range<u64>, StreamReader)>,
}

impl ObjectRanges {
    fn open(storage: &Storage, request: &ParquetRequest) -> NativeResult<Self> {
        let location = Location::parse(&request.uri, false)?;
        let mut ranges = Self {
            storage: None,
            file: None,
            memory: None,
            uri: request.uri.clone(),
            size: request.size,
            version: Mutex::new(Version {
                etag: request.etag.clone(),
                modified: None,
            }),
            counters: counters::entered(),
            fetched: Arc::default(),
            tail: (request.size, Bytes::new()),
            whole_spans: Vec::new(),
            ahead: None,
        };
        if let Location::File { path } = &location {
            let path = std::path::Path::new(path);
            // Opened without blocking (a FIFO would wait for a writer), then checked on the
            // descriptor, so a path swapped after a check cannot slip through.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path);
            let file = file.map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => NativeError::NotFound {
                    uri: request.uri.clone(),
                },
                _ => io_error("Cannot read", path, &e),
            })?;
            let meta = file
                .metadata()
                .map_err(|e| io_error("Cannot read", path, &e))?;
            if !meta.is_file() {
                return Err(not_a_regular_file(path, meta.file_type()));
            }
            ranges.file = Some(file);
        } else {
            ranges.storage = Some(storage.clone());
        }
        Ok(ranges)
    }

    fn in_memory(data: Bytes, request: &ParquetRequest) -> Self {
        Self {
            storage: None,
            file: None,
            size: data.len() as u64,
            memory: Some(data),
            uri: request.uri.clone(),
            version: Mutex::default(),
            counters: None,
            fetched: Arc::default(),
            tail: (request.size, Bytes::new()),
            whole_spans: Vec::new(),
            ahead: None,
        }
    }

    /// Bytes `range` of the object: from the kept tail, else in one read.
    fn fetch(&self, range: Range<u64>) -> NativeResult<Bytes> {
        let (tail_start, tail) = &self.tail;
        if range.end > *tail_start && range.start <= range.end && range.end <= self.size {
            let kept = tail.slice(
                (range.start.max(*tail_start) - tail_start) as usize
                    ..(range.end - tail_start) as usize,
            );
            if range.start >= *tail_start {
                return Ok(kept);
            }
            let mut joined = self.read(range.start..*tail_start)?.to_vec();
            joined.extend_from_slice(&kept);
            return Ok(Bytes::from(joined));
        }
        self.read(range)
    }

    /// Bytes `range` of the object, in one read.
    fn read(&self, range: Range<u64>) -> NativeResult<Bytes> {
        if range.start > range.end || range.end > self.size {
            return Err(shard_error(
                &self.uri,
                format!(
                    "it asks for bytes [{}, {}) of a file of {} bytes",
                    range.start, range.end, self.size
                ),
            ));
        }
        self.fetched.requests.fetch_add(1, Ordering::Relaxed);
        self.fetched
            .bytes
            .fetch_add(range.end - range.start, Ordering::Relaxed);
        if let Some(data) = &self.memory {
            return Ok(data.slice(range.start as usize..range.end as usize));
        }
        if let Some(file) = &self.file {
            if let Some(counters) = &self.counters {
                counters.stream_opened();
                counters.bytes_received((range.end - range.start) as usize);
            }
            let mut data = vec![0u8; (range.end - range.start) as usize];
            file.read_exact_at(&mut data, range.start)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => shard_error(
                        &self.uri,
                        format!("the file is shorter than its {} bytes", self.size),
                    ),
                    _ => io_error("Cannot read", std::path::Path::new(&self.uri), &e),
                })?;
            return Ok(Bytes::from(data));
        }
        self.drain(self.open_stream(&range)?, &range)
    }

    /// A resumable stream over `range` of the stored object, counted where the read began.
    fn open_stream(&self, range: &Range<u64>) -> NativeResult<StreamReader> {
        let storage = self
            .storage
            .as_ref()
            .expect("a stored object has its storage");
        if let Some(counters) = &self.counters {
            counters::enter(counters.clone());
        }
        let version = self
            .version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let opened = storage.stream_version(
            &self.uri,
            self.size,
            version,
            range.start,
            range.end,
            Some(FORMAT),
            None,
        );
        if let Some(counters) = &self.counters {
            counters::exit(counters);
        }
        opened
    }

    /// The bytes of one joined range: from the stream opened ahead for it, else read now. A
    /// stream opened ahead for another range is dropped (its task stops).
    fn fetch_joined(&mut self, range: Range<u64>) -> NativeResult<Bytes> {
        let Some((span, stream)) = self.ahead.take() else {
            return self.fetch(range);
        };
        if span.start != range.start {
            return self.fetch(range);
        }
        let served = range.end.min(span.end);
        let head = self.drain(stream, &(range.start..served))?;
        if served == range.end {
            return Ok(head);
        }
        let mut joined = head.to_vec(); // the rest: from the kept tail, or read now
        joined.extend_from_slice(&self.fetch(served..range.end)?);
        Ok(Bytes::from(joined))
    }

    /// Opens a stream over the next whole row group's span after `end`, so that its bytes
    /// arrive while this one is decoded (a stored object only; at most the stream's read-ahead
    /// bound is held).
    fn read_ahead(&mut self, end: u64) -> NativeResult<()> {
        if self.storage.is_none() {
            return Ok(());
        }
        let Some(next) = self
            .whole_spans
            .iter()
            .find(|span| span.start >= end)
            .cloned()
        else {
            return Ok(());
        };
        let next = next.start..next.end.min(self.tail.0); // the kept tail is not fetched again
        if next.is_empty() {
            return Ok(());
        }
        self.fetched.requests.fetch_add(1, Ordering::Relaxed);
        self.fetched
            .bytes
            .fetch_add(next.end - next.start, Ordering::Relaxed);
        self.ahead = Some((next.clone(), self.open_stream(&next)?));
        Ok(())
    }

    /// The ranges' bytes, nearby ranges fetched as one request; then the next whole row group
    /// is read ahead.
    fn fetch_all(&mut self, ranges: &[Range<u64>]) -> NativeResult<Vec<Bytes>> {
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
        let mut out = vec![Bytes::new(); ranges.len()];
        let mut at = 0;
        while at < order.len() {
            let first = ranges[order[at]].start;
            let mut end = ranges[order[at]].end;
            let mut last = at + 1;
            while last < order.len() && ranges[order[last]].start <= end.saturating_add(JOIN_GAP) {
                end = end.max(ranges[order[last]].end);
                last += 1;
            }
            let joined = self.fetch_joined(first..end)?;
            for &i in &order[at..last] {
                let range = &ranges[i];
                out[i] = joined.slice((range.start - first) as usize..(range.end - first) as usize);
            }
            at = last;
        }
        if let Some(end) = ranges.iter().map(|range| range.end).max() {
            self.read_ahead(end)?;
        }
        Ok(out)
    }
}

impl ObjectRanges {
    /// The first `range.end - range.start` bytes of a stream that starts at `range.start` (the
    /// rest, if the stream goes further, is dropped with it). The version its responses gave
    /// becomes the one later streams are held to; one that differs from it (a stream opened
    /// before it was known) is a changed object.
    fn drain(&self, mut stream: StreamReader, range: &Range<u64>) -> NativeResult<Bytes> {
        let wanted = (range.end - range.start) as usize;
        let mut data = Vec::with_capacity(wanted);
        while data.len() < wanted {
            let Some(chunk) = stream.next_chunk()? else {
                break;
            };
            data.extend_from_slice(&chunk);
        }
        data.truncate(wanted);
        if let Some(seen) = stream.pinned() {
            let mut held = self.version.lock().unwrap_or_else(|p| p.into_inner());
            if *held == Version::default() {
                *held = seen;
            } else if !held.holds(&seen) {
                return Err(NativeError::Changed {
                    uri: self.uri.clone(),
                    version: held.describe().unwrap_or_default(),
                });
            }
        }
        Ok(Bytes::from(data))
    }
}

fn as_parquet(error: NativeError) -> ParquetError {
    ParquetError::External(Box::new(error))
}

impl AsyncFileReader for ObjectRanges {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        let result = self.fetch(range).map_err(as_parquet);
        async move { result }.boxed()
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        let result = self.fetch_all(&ranges).map_err(as_parquet);
        async move { result }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        // The builder is given the metadata read by `read_metadata`; it never asks again.
        async move {
            Err(ParquetError::General(
                "metadata is read once, up front".into(),
            ))
        }
        .boxed()
    }
}

#[cfg(test)]
#[path = "parquet_read/tests.rs"]
mod tests;
