//! Uploads (the rules are in `syvain_core::upload`): the bytes of a PUT, whole or as a list of
//! encoded chunks (zero copy), and a spooled file.

use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use object_store::PutPayload;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use syvain_core::upload::{
    self, PutLimits, WriteOptions, MULTIPART_THRESHOLD, PART_SIZE, SINGLE_PUT_MAX,
};

use crate::caller::PythonCaller;
use crate::error::BindingResult;
use crate::storage::NativeStorage;

/// The bytes of a PUT: one bytes-like object, or a list of chunks sent without joining them.
/// Each is borrowed from its Python object (zero copy; the `Bytes` owner keeps it alive).
#[derive(FromPyObject)]
pub enum PutData {
    Whole(PyBackedBytes),
    Chunks(Vec<PyBackedBytes>),
}

impl From<PutData> for PutPayload {
    fn from(data: PutData) -> Self {
        match data {
            PutData::Whole(data) => PutPayload::from(Bytes::from_owner(data)),
            PutData::Chunks(chunks) => chunks
                .into_iter()
                .filter(|chunk| !chunk.is_empty())
                .map(Bytes::from_owner)
                .collect(),
        }
    }
}

/// Uploads a file as an object: one PUT, or a streamed multipart upload. Returns (size, etag).
/// FileExistsError when `create_only` finds an existing object.
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
) -> BindingResult<(u64, String)> {
    let options = WriteOptions {
        content_type,
        metadata: metadata.unwrap_or_default(),
        create_only,
    };
    let limits = PutLimits {
        single_put_max,
        multipart_threshold,
        part_size,
    };
    let caller = PythonCaller(py);
    upload::put_file(&caller, &storage.storage, uri, &path, options, limits)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(put_file, m)?)?;
    m.add("SINGLE_PUT_MAX", SINGLE_PUT_MAX)?;
    m.add("MULTIPART_THRESHOLD", MULTIPART_THRESHOLD)?;
    m.add("PART_SIZE", PART_SIZE)?;
    Ok(())
}
