//! Python values from checked Arrow columns, exactly as pyarrow's `to_pylist` gives them.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyList, PyTuple};

use super::column::{bit, Column};
use super::kind::Kind;

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

/// Appends the Python values of logical slots `start..start + len` of `column` to `out`.
pub fn convert<'py>(
    py: Python<'py>,
    kind: &Kind,
    column: &Column<'_>,
    start: usize,
    len: usize,
    out: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    if len == 0 {
        // An empty array may come without its offsets buffer.
        return Ok(());
    }
    let base = column.offset + start;
    let none = || py.None().into_bound(py);
    macro_rules! primitive {
        ($ty:ty, $to_py:expr) => {{
            let data = column.buffer::<$ty>(1);
            for physical in base..base + len {
                out.push(if column.is_valid(physical) {
                    let value = unsafe { *data.add(physical) };
                    $to_py(value)?
                } else {
                    none()
                });
            }
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
    match kind {
        Kind::Null => out.extend((0..len).map(|_| none())),
        Kind::Bool => {
            let data = column.buffer::<u8>(1);
            for physical in base..base + len {
                out.push(if column.is_valid(physical) {
                    PyBool::new(py, unsafe { bit(data, physical) })
                        .to_owned()
                        .into_any()
                } else {
                    none()
                });
            }
        }
        Kind::I8 => primitive!(i8, |v| int(i64::from(v))),
        Kind::I16 => primitive!(i16, |v| int(i64::from(v))),
        Kind::I32 => primitive!(i32, |v| int(i64::from(v))),
        Kind::I64 => primitive!(i64, int),
        Kind::U8 => primitive!(u8, |v| uint(u64::from(v))),
        Kind::U16 => primitive!(u16, |v| uint(u64::from(v))),
        Kind::U32 => primitive!(u32, |v| uint(u64::from(v))),
        Kind::U64 => primitive!(u64, uint),
        Kind::F32 => primitive!(f32, |v| float(f64::from(v))),
        Kind::F64 => primitive!(f64, float),
        Kind::Utf8 { large } | Kind::Binary { large } => {
            let data = column.buffer::<u8>(2);
            let text = matches!(kind, Kind::Utf8 { .. });
            for physical in base..base + len {
                if !column.is_valid(physical) {
                    out.push(none());
                    continue;
                }
                let from = column.offset_at(*large, physical);
                let to = column.offset_at(*large, physical + 1);
                let bytes = unsafe { std::slice::from_raw_parts(data.add(from), to - from) };
                out.push(if text {
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
        }
        Kind::FixedBinary(width) => {
            let data = column.buffer::<u8>(1);
            for physical in base..base + len {
                out.push(if column.is_valid(physical) {
                    let bytes =
                        unsafe { std::slice::from_raw_parts(data.add(physical * width), *width) };
                    PyBytes::new(py, bytes).into_any()
                } else {
                    none()
                });
            }
        }
        Kind::List { large, item } => {
            let first = column.offset_at(*large, base);
            let last = column.offset_at(*large, base + len);
            let mut items = Vec::with_capacity(last - first);
            convert(
                py,
                item,
                &column.children[0],
                first,
                last - first,
                &mut items,
            )?;
            let mut items = items.into_iter();
            for physical in base..base + len {
                let count =
                    column.offset_at(*large, physical + 1) - column.offset_at(*large, physical);
                let row = items.by_ref().take(count);
                out.push(if column.is_valid(physical) {
                    PyList::new(py, row)?.into_any()
                } else {
                    row.for_each(drop);
                    none()
                });
            }
        }
        Kind::FixedList { size, item } => {
            let mut items = Vec::with_capacity(len * size);
            convert(
                py,
                item,
                &column.children[0],
                base * size,
                len * size,
                &mut items,
            )?;
            let mut items = items.into_iter();
            for physical in base..base + len {
                let row = items.by_ref().take(*size);
                out.push(if column.is_valid(physical) {
                    PyList::new(py, row)?.into_any()
                } else {
                    row.for_each(drop);
                    none()
                });
            }
        }
        Kind::Struct(fields) => {
            let mut values = Vec::with_capacity(fields.len());
            for ((_, field_kind), child) in fields.iter().zip(&column.children) {
                let mut field_values = Vec::with_capacity(len);
                convert(py, field_kind, child, base, len, &mut field_values)?;
                values.push(field_values);
            }
            for (i, physical) in (base..base + len).enumerate() {
                out.push(if column.is_valid(physical) {
                    let dict = PyDict::new(py);
                    for ((name, _), field_values) in fields.iter().zip(&values) {
                        dict.set_item(name.bind(py), &field_values[i])?;
                    }
                    dict.into_any()
                } else {
                    none()
                });
            }
        }
        Kind::Map { key, value } => {
            let first = column.offset_at(false, base);
            let last = column.offset_at(false, base + len);
            let entries = &column.children[0];
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            let at = entries.offset + first;
            convert(py, key, &entries.children[0], at, last - first, &mut keys)?;
            convert(
                py,
                value,
                &entries.children[1],
                at,
                last - first,
                &mut values,
            )?;
            let mut pairs = keys.into_iter().zip(values);
            for physical in base..base + len {
                let count =
                    column.offset_at(false, physical + 1) - column.offset_at(false, physical);
                let row = pairs.by_ref().take(count);
                out.push(if column.is_valid(physical) {
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
    }
    Ok(())
}
