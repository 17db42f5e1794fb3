//! Record batches from the Arrow PyCapsule interface, imported with arrow-rs's C data interface.

use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow_array::ffi::{from_ffi_and_data_type, FFI_ArrowArray, FFI_ArrowSchema};
use arrow_array::{Array, StructArray};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// An imported batch: its columns as arrow-rs arrays, or only its shape when it has no rows or
/// arrow-rs does not know one of its types (every column is then left to the caller's
/// fallback).
pub enum Batch {
    Arrays(StructArray),
    Unknown { names: Vec<String>, rows: usize },
}

impl Batch {
    pub fn rows(&self) -> usize {
        match self {
            Batch::Arrays(array) => array.len(),
            Batch::Unknown { rows, .. } => *rows,
        }
    }
}

/// Imports `batch.__arrow_c_array__()`. The array is moved out of its capsule (the interface's
/// way: the capsule's destructor then has nothing left to release); the schema is borrowed.
/// Malformed exports are a ValueError: a panic inside arrow-rs's import never crosses into
/// Python.
pub fn import(schema: &Bound<'_, PyCapsule>, array: &Bound<'_, PyCapsule>) -> PyResult<Batch> {
    let schema = capsule_pointer::<FFI_ArrowSchema>(schema, c"arrow_schema")?;
    let array = capsule_pointer::<FFI_ArrowArray>(array, c"arrow_array")?;
    // SAFETY: the capsules hold the producer's exported structs and stay alive (borrowed by
    // this call) until it returns.
    catch_unwind(AssertUnwindSafe(|| unsafe {
        import_structs(&*schema, array)
    }))
    .unwrap_or_else(|_| Err("inconsistent Arrow batch".into()))
    .map_err(PyValueError::new_err)
}

/// # Safety
/// `schema` and `array` must be exported structs of the C data interface.
unsafe fn import_structs(
    schema: &FFI_ArrowSchema,
    array: *mut FFI_ArrowArray,
) -> Result<Batch, String> {
    if (*array).is_released() {
        return Err("the Arrow batch was released".into());
    }
    if schema.format() != "+s" {
        return Err("expected a record batch (an Arrow struct array)".into());
    }
    if (*array).null_count() > 0 {
        return Err("unexpected Arrow batch layout".into());
    }
    let names: Vec<String> = schema
        .children()
        .map(|field| field.name().unwrap_or_default().to_owned())
        .collect();
    if (*array).num_children() != names.len() {
        return Err("Arrow batch schema and array disagree".into());
    }
    let rows = (*array).len();
    // arrow-rs sizes a sliced-off empty string column's data as nothing while its offsets
    // point past it: an empty batch has no values to read anyway.
    let imported = DataType::try_from(schema).ok().filter(|_| rows > 0);
    let Some(data_type @ DataType::Struct(_)) = imported else {
        return Ok(Batch::Unknown { names, rows });
    };
    let mut data = from_ffi_and_data_type(FFI_ArrowArray::from_raw(array), data_type)
        .map_err(|error| error.to_string())?;
    // Reading goes through typed slices: misaligned buffers are copied, and every buffer must
    // hold the array's length (offsets into data and children are checked as they are read).
    data.align_buffers();
    data.validate().map_err(|error| error.to_string())?;
    let data = unsliced(&data, 0, rows);
    Ok(Batch::Arrays(StructArray::from(data)))
}

/// Slots `offset..offset + len` of `data` with every struct and fixed-size list in it at
/// offset 0 and its children cut to its slots. In the C data interface a struct's offset
/// applies to its children, but arrow-rs's struct slicing applies it to children again when
/// they are already cut, and panics on a nested struct of a sliced batch.
fn unsliced(data: &ArrayData, offset: usize, len: usize) -> ArrayData {
    let nulls = data.nulls().map(|nulls| nulls.slice(offset, len));
    let start = data.offset() + offset;
    let (children, buffers) = match data.data_type() {
        DataType::Struct(_) => (
            data.child_data()
                .iter()
                .map(|child| unsliced(child, start, len))
                .collect(),
            Vec::new(),
        ),
        DataType::FixedSizeList(_, size) => {
            let size = *size as usize;
            let child = unsliced(&data.child_data()[0], start * size, len * size);
            (vec![child], Vec::new())
        }
        _ => {
            // Offsets index the whole child, which keeps its length.
            let data = data.slice(offset, len);
            if data.child_data().is_empty() {
                return data;
            }
            let children = (data.child_data().iter())
                .map(|child| unsliced(child, 0, child.len()))
                .collect::<Vec<_>>();
            // SAFETY: `data`'s validated buffers; the children hold the same slots.
            return unsafe { data.into_builder().child_data(children).build_unchecked() };
        }
    };
    let builder = ArrayData::builder(data.data_type().clone())
        .len(len)
        .nulls(nulls)
        .buffers(buffers)
        .child_data(children);
    // SAFETY: the same buffers as `data`, which was validated, cut inside its slots.
    unsafe { builder.build_unchecked() }
}

/// The capsule's pointer, after checking its name (the PyCapsule interface of Arrow).
fn capsule_pointer<T>(capsule: &Bound<'_, PyCapsule>, name: &std::ffi::CStr) -> PyResult<*mut T> {
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
