//! Python values from Arrow arrays, exactly as pyarrow's `to_pylist` gives them.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt64Type, UInt8Type,
};
use arrow_array::{Array, OffsetSizeTrait};
use arrow_schema::DataType;
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyString, PyTuple};

/// Reuses the int objects of recurring values within one conversion (token ids repeat across
/// a batch): a direct-mapped table keyed by the value's low bits. Ints are immutable, so a shared
/// object is indistinguishable from a fresh one except by `is`.
pub struct IntCache<'py> {
    mask: usize,
    slots: Vec<Option<(i64, Bound<'py, PyAny>)>>,
}

impl<'py> IntCache<'py> {
    /// At most 64 Ki slots; fewer for short conversions, so that the table costs no more than
    /// the values it serves.
    fn new(values: usize) -> Self {
        let size = values.clamp(1, 1 << 16).next_power_of_two();
        Self {
            mask: size - 1,
            slots: Vec::new(),
        }
    }

    fn get(&mut self, py: Python<'py>, value: i64) -> PyResult<Bound<'py, PyAny>> {
        if self.slots.is_empty() {
            self.slots.resize_with(self.mask + 1, || None);
        }
        let slot = &mut self.slots[value as usize & self.mask];
        if let Some((cached, object)) = slot {
            if *cached == value {
                return Ok(object.clone());
            }
        }
        // SAFETY: a new reference or NULL with an exception set.
        let object = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromLongLong(value))? };
        *slot = Some((value, object.clone()));
        Ok(object)
    }
}

/// Appends the Python values of slots `start..start + len` of `array` (a type that
/// [`super::native::is_native`] accepts; `start + len` within its length) to `out`.
pub fn convert<'py>(
    py: Python<'py>,
    array: &dyn Array,
    start: usize,
    len: usize,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    if len == 0 {
        // An empty array may come without its offsets.
        return Ok(());
    }
    let none = || py.None().into_bound(py);
    let nulls = array.nulls();
    let valid = |i: usize| nulls.is_none_or(|nulls| nulls.is_valid(i));
    macro_rules! primitive {
        ($ty:ty, $to_py:expr) => {{
            let values = array.as_primitive::<$ty>().values();
            for i in start..start + len {
                out.push(if valid(i) { $to_py(values[i])? } else { none() });
            }
        }};
    }
    // str (`text`) or bytes values of a string or binary array.
    macro_rules! strings {
        ($array:expr, $text:expr) => {{
            let array = $array;
            let offsets = array.value_offsets();
            bytes(
                py,
                offsets,
                array.value_data(),
                valid,
                start,
                len,
                $text,
                out,
            )?
        }};
    }
    macro_rules! lists {
        ($array:expr) => {{
            let array = $array;
            list(
                py,
                array.value_offsets(),
                array.values(),
                valid,
                start,
                len,
                out,
            )?
        }};
    }
    let mut ints = IntCache::new(len);
    let mut int = |v: i64| ints.get(py, v);
    let mut uint = |v: u64| match i64::try_from(v) {
        Ok(v) => int(v),
        // SAFETY: a new reference or NULL with an exception set.
        Err(_) => unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromUnsignedLongLong(v)) },
    };
    // SAFETY: a new reference or NULL with an exception set.
    let float = |v: f64| unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyFloat_FromDouble(v)) };
    out.reserve(len);
    match array.data_type() {
        DataType::Null => out.extend((0..len).map(|_| none())),
        DataType::Boolean => {
            let values = array.as_boolean().values();
            for i in start..start + len {
                out.push(if valid(i) {
                    PyBool::new(py, values.value(i)).to_owned().into_any()
                } else {
                    none()
                });
            }
        }
        DataType::Int8 => primitive!(Int8Type, |v| int(i64::from(v))),
        DataType::Int16 => primitive!(Int16Type, |v| int(i64::from(v))),
        DataType::Int32 => primitive!(Int32Type, |v| int(i64::from(v))),
        DataType::Int64 => primitive!(Int64Type, int),
        DataType::UInt8 => primitive!(UInt8Type, |v| uint(u64::from(v))),
        DataType::UInt16 => primitive!(UInt16Type, |v| uint(u64::from(v))),
        DataType::UInt32 => primitive!(UInt32Type, |v| uint(u64::from(v))),
        DataType::UInt64 => primitive!(UInt64Type, uint),
        DataType::Float32 => primitive!(Float32Type, |v| float(f64::from(v))),
        DataType::Float64 => primitive!(Float64Type, float),
        DataType::Utf8 => strings!(array.as_string::<i32>(), true),
        DataType::LargeUtf8 => strings!(array.as_string::<i64>(), true),
        DataType::Binary => strings!(array.as_binary::<i32>(), false),
        DataType::LargeBinary => strings!(array.as_binary::<i64>(), false),
        DataType::FixedSizeBinary(_) => {
            let array = array.as_fixed_size_binary();
            for i in start..start + len {
                out.push(if valid(i) {
                    PyBytes::new(py, array.value(i)).into_any()
                } else {
                    none()
                });
            }
        }
        DataType::List(_) => lists!(array.as_list::<i32>()),
        DataType::LargeList(_) => lists!(array.as_list::<i64>()),
        DataType::FixedSizeList(_, _) => {
            let array = array.as_fixed_size_list();
            let size = array.value_length() as usize;
            let mut items = Vec::with_capacity(len * size);
            convert(py, array.values(), start * size, len * size, &mut items)?;
            let mut items = items.into_iter();
            for i in start..start + len {
                let row = items.by_ref().take(size);
                out.push(if valid(i) {
                    PyList::new(py, row)?.into_any()
                } else {
                    row.for_each(drop);
                    none()
                });
            }
        }
        DataType::Struct(fields) => {
            let array = array.as_struct();
            let names: Vec<_> = fields
                .iter()
                .map(|f| PyString::intern(py, f.name()))
                .collect();
            let mut values = Vec::with_capacity(fields.len());
            for child in array.columns() {
                let mut field_values = Vec::with_capacity(len);
                convert(py, child, start, len, &mut field_values)?;
                values.push(field_values);
            }
            for (row, i) in (start..start + len).enumerate() {
                out.push(if valid(i) {
                    let dict = PyDict::new(py);
                    for (name, field_values) in names.iter().zip(&values) {
                        dict.set_item(name, &field_values[row])?;
                    }
                    dict.into_any()
                } else {
                    none()
                });
            }
        }
        DataType::Map(_, _) => {
            let array = array.as_map();
            let offsets = array.value_offsets();
            let (first, last) = child_range(offsets, start, len, array.entries().len())?;
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            convert(py, array.keys(), first, last - first, &mut keys)?;
            convert(py, array.values(), first, last - first, &mut values)?;
            let mut pairs = keys.into_iter().zip(values);
            for i in start..start + len {
                let row = pairs.by_ref().take(count(offsets, i)?);
                out.push(if valid(i) {
                    let tuples = row
                        .map(|(k, v)| PyTuple::new(py, [k, v]))
                        .collect::<PyResult<Vec<_>>>()?;
                    PyList::new(py, tuples)?.into_any()
                } else {
                    row.for_each(drop);
                    none()
                });
            }
        }
        other => {
            return Err(PyValueError::new_err(format!(
                "Arrow type {other} is not built natively"
            )))
        }
    }
    Ok(())
}

/// Appends the str (`text`) or bytes values of a string or binary array.
#[allow(clippy::too_many_arguments)]
fn bytes<'py, O: OffsetSizeTrait>(
    py: Python<'py>,
    offsets: &[O],
    data: &[u8],
    valid: impl Fn(usize) -> bool,
    start: usize,
    len: usize,
    text: bool,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    for i in start..start + len {
        if !valid(i) {
            out.push(py.None().into_bound(py));
            continue;
        }
        let bytes = match (offsets[i].to_usize(), offsets[i + 1].to_usize()) {
            (Some(from), Some(to)) => data.get(from..to),
            _ => None,
        }
        .ok_or_else(invalid_offsets)?;
        out.push(if text {
            // SAFETY: a new reference or NULL with an exception set (UnicodeDecodeError for a
            // string that is not UTF-8).
            unsafe {
                Bound::from_owned_ptr_or_err(
                    py,
                    ffi::PyUnicode_FromStringAndSize(
                        bytes.as_ptr().cast(),
                        bytes.len() as ffi::Py_ssize_t,
                    ),
                )?
            }
        } else {
            PyBytes::new(py, bytes).into_any()
        });
    }
    Ok(())
}

/// Appends the lists of a list array: its items converted in one pass, then cut per row.
fn list<'py, O: OffsetSizeTrait>(
    py: Python<'py>,
    offsets: &[O],
    items: &dyn Array,
    valid: impl Fn(usize) -> bool,
    start: usize,
    len: usize,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let (first, last) = child_range(offsets, start, len, items.len())?;
    let mut values = Vec::with_capacity(last - first);
    convert(py, items, first, last - first, &mut values)?;
    let mut values = values.into_iter();
    for i in start..start + len {
        let row = values.by_ref().take(count(offsets, i)?);
        out.push(if valid(i) {
            PyList::new(py, row)?.into_any()
        } else {
            row.for_each(drop);
            py.None().into_bound(py)
        });
    }
    Ok(())
}

/// The child slots that rows `start..start + len` span, which must lie inside the child.
fn child_range<O: OffsetSizeTrait>(
    offsets: &[O],
    start: usize,
    len: usize,
    child_len: usize,
) -> PyResult<(usize, usize)> {
    match (offsets[start].to_usize(), offsets[start + len].to_usize()) {
        (Some(first), Some(last)) if first <= last && last <= child_len => Ok((first, last)),
        _ => Err(PyValueError::new_err(
            "Arrow offsets beyond the child array",
        )),
    }
}

/// The number of child slots of row `i` (offsets must not decrease).
fn count<O: OffsetSizeTrait>(offsets: &[O], i: usize) -> PyResult<usize> {
    match (offsets[i].to_i64(), offsets[i + 1].to_i64()) {
        (Some(from), Some(to)) => to.checked_sub(from).and_then(|n| usize::try_from(n).ok()),
        _ => None,
    }
    .ok_or_else(invalid_offsets)
}

fn invalid_offsets() -> PyErr {
    PyValueError::new_err("invalid Arrow offsets")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_offsets_must_stay_inside_the_child_and_not_decrease() {
        assert_eq!(child_range(&[0i32, 1, 3], 0, 2, 3).unwrap(), (0, 3));
        assert_eq!(child_range(&[0i32, 1, 3], 1, 1, 3).unwrap(), (1, 3));
        // Past the child's 3 values, or negative.
        assert!(child_range(&[0i32, 2, 4], 0, 2, 3).is_err());
        assert!(child_range(&[-1i32, 0, 1], 0, 2, 3).is_err());
        assert_eq!(count(&[0i64, 2, 5], 1).unwrap(), 3);
        assert!(count(&[0i32, 2, 1], 1).is_err(), "decreasing");
        assert!(count(&[i64::MIN, i64::MAX], 0).is_err(), "overflow");
    }
}
