//! The one exporter of the buffer protocol: fills a `Py_buffer` with a one-dimensional view of
//! memory that the exporting object owns (`memoryview`, `numpy.frombuffer` and
//! `torch.frombuffer` take it without a copy).

use std::ffi::{c_int, c_void, CStr};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A one-dimensional view of `*items` items of `item_size` bytes at `buf`.
pub struct OneDimension<'a> {
    pub buf: *const c_void,
    /// The item count; the view's shape points here.
    pub items: &'a ffi::Py_ssize_t,
    pub item_size: usize,
    /// The struct-module format of an item.
    pub format: &'static CStr,
    pub writable: bool,
    /// The stride, given to a consumer that asks for strides (none: C-contiguous).
    pub stride: Option<&'a ffi::Py_ssize_t>,
}

/// Fills `view` with `dimension`, held by `owner` (the view's `obj`).
///
/// # Safety
/// `view` is the interpreter's, for `__getbuffer__`; `dimension`'s memory, and its `items` and
/// `stride`, must live in `owner` (or be static) and stay valid and unmoved while `owner`
/// lives; a read-only dimension's memory is never written.
pub unsafe fn fill_view(
    owner: Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
    dimension: OneDimension<'_>,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no buffer view to fill"));
    }
    if !dimension.writable && flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
        return Err(PyBufferError::new_err("the buffer is read-only"));
    }
    let asked = |flag: c_int| flags & flag == flag;
    // SAFETY: `view` is non-null and ours to fill; the pointers stored in it live in `owner`
    // (its new reference in `obj` keeps them) or are static.
    unsafe {
        (*view).buf = dimension.buf.cast_mut();
        (*view).len = *dimension.items * dimension.item_size as ffi::Py_ssize_t;
        (*view).readonly = c_int::from(!dimension.writable);
        (*view).itemsize = dimension.item_size as ffi::Py_ssize_t;
        (*view).format = if asked(ffi::PyBUF_FORMAT) {
            dimension.format.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if asked(ffi::PyBUF_ND) {
            std::ptr::from_ref(dimension.items).cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = match dimension.stride {
            Some(stride) if asked(ffi::PyBUF_STRIDES) => std::ptr::from_ref(stride).cast_mut(),
            _ => std::ptr::null_mut(),
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
        (*view).obj = owner.into_ptr();
    }
    Ok(())
}
