//! The structs of the Arrow C data interface, and reading them out of PyCapsules.

use std::ffi::{c_char, c_void, CStr};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// `struct ArrowSchema` of the Arrow C data interface.
#[repr(C)]
pub struct ArrowSchema {
    pub format: *const c_char,
    pub name: *const c_char,
    pub metadata: *const c_char,
    pub flags: i64,
    pub n_children: i64,
    pub children: *mut *mut ArrowSchema,
    pub dictionary: *mut ArrowSchema,
    pub release: Option<unsafe extern "C" fn(*mut ArrowSchema)>,
    pub private_data: *mut c_void,
}

/// `struct ArrowArray` of the Arrow C data interface.
#[repr(C)]
pub struct ArrowArray {
    pub length: i64,
    pub null_count: i64,
    pub offset: i64,
    pub n_buffers: i64,
    pub n_children: i64,
    pub buffers: *mut *const c_void,
    pub children: *mut *mut ArrowArray,
    pub dictionary: *mut ArrowArray,
    pub release: Option<unsafe extern "C" fn(*mut ArrowArray)>,
    pub private_data: *mut c_void,
}

/// The capsule's pointer, after checking its name (the PyCapsule interface of Arrow).
pub fn capsule_pointer<T>(capsule: &Bound<'_, PyCapsule>, name: &CStr) -> PyResult<*mut T> {
    if capsule.name()? != Some(name) {
        return Err(PyTypeError::new_err(format!(
            "expected a PyCapsule named {:?}",
            name.to_string_lossy()
        )));
    }
    let pointer = capsule.pointer().cast::<T>();
    if pointer.is_null() {
        return Err(PyValueError::new_err("empty Arrow capsule"));
    }
    Ok(pointer)
}

/// The (field, column) pairs of an exported record batch: a struct array without nulls.
///
/// # Safety
/// `schema` and `array` must be valid exported structs.
pub unsafe fn batch_children<'a>(
    schema: &'a ArrowSchema,
    array: &'a ArrowArray,
) -> Result<Vec<(&'a ArrowSchema, &'a ArrowArray)>, String> {
    if schema.release.is_none() || array.release.is_none() {
        return Err("the Arrow batch was released".into());
    }
    if schema.format.is_null() || CStr::from_ptr(schema.format).to_bytes() != b"+s" {
        return Err("expected a record batch (an Arrow struct array)".into());
    }
    if array.length < 0 || array.offset < 0 || array.null_count > 0 {
        return Err("unexpected Arrow batch layout".into());
    }
    let n = schema.n_children;
    if n < 0
        || array.n_children != n
        || (n > 0 && (schema.children.is_null() || array.children.is_null()))
    {
        return Err("Arrow batch schema and array disagree".into());
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    let fields = std::slice::from_raw_parts(schema.children, n as usize);
    let columns = std::slice::from_raw_parts(array.children, n as usize);
    fields
        .iter()
        .zip(columns)
        .map(|(&field, &column)| {
            if field.is_null() || column.is_null() || (*field).name.is_null() {
                Err("missing Arrow batch column".to_string())
            } else {
                Ok((&*field, &*column))
            }
        })
        .collect()
}
