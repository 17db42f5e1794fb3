//! Python rows from Arrow record batches, for the Parquet reader (SPEC section 3).
//!
//! pyarrow's `Table.to_pylist` converts a table column by column and then builds every row dict
//! in a Python comprehension. Here one call per batch reads the columns straight from pyarrow's
//! buffers through the Arrow C data interface (the `__arrow_c_array__` capsules; nothing is
//! copied or moved out of them) and builds the row dicts with one interned key object per
//! column. Values are exactly those of `to_pylist`: int, float (float32 widened), bool, str,
//! bytes, list (list, large_list, fixed_size_list), dict (struct), list of `(key, value)` tuples
//! (map), None. A column with any other type at any depth (temporal, decimal, dictionary, views,
//! float16, unions, ...) is converted by pyarrow through the caller's fallback.

use std::ffi::{c_char, c_void, CStr};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyCapsule, PyDict, PyList, PyString, PyTuple};

/// `struct ArrowSchema` of the Arrow C data interface.
#[repr(C)]
struct ArrowSchema {
    format: *const c_char,
    name: *const c_char,
    metadata: *const c_char,
    flags: i64,
    n_children: i64,
    children: *mut *mut ArrowSchema,
    dictionary: *mut ArrowSchema,
    release: Option<unsafe extern "C" fn(*mut ArrowSchema)>,
    private_data: *mut c_void,
}

/// `struct ArrowArray` of the Arrow C data interface.
#[repr(C)]
struct ArrowArray {
    length: i64,
    null_count: i64,
    offset: i64,
    n_buffers: i64,
    n_children: i64,
    buffers: *mut *const c_void,
    children: *mut *mut ArrowArray,
    dictionary: *mut ArrowArray,
    release: Option<unsafe extern "C" fn(*mut ArrowArray)>,
    private_data: *mut c_void,
}

/// The Arrow types converted here, as a tree (struct field names already as Python strings).
enum Kind {
    Null,
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F32,
    F64,
    Utf8 { large: bool },
    Binary { large: bool },
    FixedBinary(usize),
    List { large: bool, item: Box<Kind> },
    FixedList { size: usize, item: Box<Kind> },
    Struct(Vec<(Py<PyString>, Kind)>),
    Map { key: Box<Kind>, value: Box<Kind> },
}

impl Kind {
    /// The (buffers, children) counts an array of this kind has in the C data interface.
    fn layout(&self) -> (i64, i64) {
        match self {
            Kind::Null => (0, 0),
            Kind::Utf8 { .. } | Kind::Binary { .. } => (3, 0),
            Kind::List { .. } | Kind::Map { .. } => (2, 1),
            Kind::FixedList { .. } => (1, 1),
            Kind::Struct(fields) => (1, fields.len() as i64),
            _ => (2, 0),
        }
    }
}

/// Reads a schema into a [`Kind`]; `None` for a type left to pyarrow.
///
/// # Safety
/// `schema` must be a valid, unreleased `ArrowSchema` (pyarrow's export).
unsafe fn parse_kind(py: Python<'_>, schema: &ArrowSchema) -> Option<Kind> {
    if !schema.dictionary.is_null()
        || schema.format.is_null()
        || schema.n_children < 0
        || is_extension(schema.metadata)
    {
        return None;
    }
    let format = CStr::from_ptr(schema.format).to_bytes();
    let children: &[*mut ArrowSchema] = if schema.n_children == 0 {
        &[]
    } else if schema.children.is_null() {
        return None;
    } else {
        std::slice::from_raw_parts(schema.children, schema.n_children as usize)
    };
    let child = |i: usize| -> Option<Kind> {
        let ptr = *children.get(i)?;
        if ptr.is_null() {
            return None;
        }
        parse_kind(py, &*ptr)
    };
    let kind = match format {
        b"n" => Kind::Null,
        b"b" => Kind::Bool,
        b"c" => Kind::I8,
        b"s" => Kind::I16,
        b"i" => Kind::I32,
        b"l" => Kind::I64,
        b"C" => Kind::U8,
        b"S" => Kind::U16,
        b"I" => Kind::U32,
        b"L" => Kind::U64,
        b"f" => Kind::F32,
        b"g" => Kind::F64,
        b"u" => Kind::Utf8 { large: false },
        b"U" => Kind::Utf8 { large: true },
        b"z" => Kind::Binary { large: false },
        b"Z" => Kind::Binary { large: true },
        b"+l" | b"+L" if children.len() == 1 => Kind::List {
            large: format == b"+L",
            item: Box::new(child(0)?),
        },
        b"+s" => {
            let mut fields = Vec::with_capacity(children.len());
            for (i, &ptr) in children.iter().enumerate() {
                if ptr.is_null() || (*ptr).name.is_null() {
                    return None;
                }
                let name = CStr::from_ptr((*ptr).name).to_str().ok()?;
                // to_pylist refuses duplicate field names; pyarrow raises its own error.
                if fields
                    .iter()
                    .any(|(n, _): &(Py<PyString>, Kind)| n.bind(py).to_str().ok() == Some(name))
                {
                    return None;
                }
                fields.push((PyString::intern(py, name).unbind(), child(i)?));
            }
            Kind::Struct(fields)
        }
        b"+m" if children.len() == 1 => match child(0)? {
            Kind::Struct(mut entry) if entry.len() == 2 => {
                let (_, value) = entry.pop()?;
                let (_, key) = entry.pop()?;
                Kind::Map {
                    key: Box::new(key),
                    value: Box::new(value),
                }
            }
            _ => return None,
        },
        _ => {
            let text = std::str::from_utf8(format).ok()?;
            if let Some(width) = text.strip_prefix("w:") {
                Kind::FixedBinary(width.parse().ok()?)
            } else if let Some(size) = text.strip_prefix("+w:") {
                if children.len() != 1 {
                    return None;
                }
                Kind::FixedList {
                    size: size.parse().ok()?,
                    item: Box::new(child(0)?),
                }
            } else {
                return None;
            }
        }
    };
    Some(kind)
}

/// Whether field metadata (the interface's encoding: an i32 count, then length-prefixed keys
/// and values) names an extension type, whose `to_pylist` values may differ from its storage
/// type's (`uuid.UUID` for arrow.uuid, bool for arrow.bool8, ...).
///
/// # Safety
/// `metadata` must be null or point to metadata encoded as the interface specifies.
unsafe fn is_extension(metadata: *const c_char) -> bool {
    const KEY: &[u8] = b"ARROW:extension:name";
    if metadata.is_null() {
        return false;
    }
    unsafe fn next_i32(at: &mut *const u8) -> usize {
        let value = i32::from_ne_bytes(std::ptr::read_unaligned(at.cast::<[u8; 4]>()));
        *at = at.add(4);
        value.max(0) as usize
    }
    let mut at = metadata.cast::<u8>();
    for _ in 0..next_i32(&mut at) {
        let key_len = next_i32(&mut at);
        if std::slice::from_raw_parts(at, key_len) == KEY {
            return true;
        }
        at = at.add(key_len);
        let value_len = next_i32(&mut at);
        at = at.add(value_len);
    }
    false
}

/// A checked view of one `ArrowArray` and its children (the layout matches its [`Kind`]).
struct Column<'a> {
    length: usize,
    offset: usize,
    /// Validity bitmap; None when every value is valid.
    validity: Option<*const u8>,
    buffers: &'a [*const c_void],
    children: Vec<Column<'a>>,
}

impl Column<'_> {
    fn is_valid(&self, physical: usize) -> bool {
        self.validity
            .is_none_or(|bits| unsafe { bit(bits, physical) })
    }

    fn buffer<T>(&self, index: usize) -> *const T {
        self.buffers[index].cast()
    }

    /// List or string offset at a physical slot.
    fn offset_at(&self, large: bool, physical: usize) -> usize {
        unsafe {
            if large {
                *self.buffer::<i64>(1).add(physical) as usize
            } else {
                *self.buffer::<i32>(1).add(physical) as usize
            }
        }
    }
}

unsafe fn bit(bits: *const u8, index: usize) -> bool {
    (*bits.add(index >> 3) >> (index & 7)) & 1 == 1
}

/// Checks an array against its kind so that conversion only reads inside its buffers.
///
/// # Safety
/// `array` must be a valid, unreleased `ArrowArray` (pyarrow's export). Offsets into child
/// arrays are checked against the children's lengths; string and binary data buffers are not
/// sized by the interface and are trusted as exported.
unsafe fn view<'a>(kind: &Kind, array: &'a ArrowArray) -> Result<Column<'a>, String> {
    let (n_buffers, n_children) = kind.layout();
    if array.release.is_none() {
        return Err("the Arrow array was released".into());
    }
    if array.length < 0 || array.offset < 0 || array.n_buffers != n_buffers {
        return Err("unexpected Arrow array layout".into());
    }
    if array.n_children != n_children {
        return Err("unexpected Arrow array children".into());
    }
    let length = array.length as usize;
    let offset = array.offset as usize;
    let buffers: &[*const c_void] = if n_buffers == 0 {
        &[]
    } else if array.buffers.is_null() {
        return Err("missing Arrow buffers".into());
    } else {
        std::slice::from_raw_parts(array.buffers, n_buffers as usize)
    };
    if length > 0 && buffers.iter().skip(1).any(|b| b.is_null()) {
        return Err("missing Arrow data buffer".into());
    }
    let validity = match buffers.first() {
        Some(bits) if !bits.is_null() && array.null_count != 0 => Some(bits.cast::<u8>()),
        _ => None,
    };
    let raw_children: &[*mut ArrowArray] = if n_children == 0 {
        &[]
    } else if array.children.is_null() {
        return Err("missing Arrow children".into());
    } else {
        std::slice::from_raw_parts(array.children, n_children as usize)
    };
    let child = |index: usize| match raw_children.get(index) {
        Some(&ptr) if !ptr.is_null() => Ok(&*ptr),
        _ => Err(String::from("missing Arrow child")),
    };
    let children = match kind {
        Kind::List { item, .. } | Kind::FixedList { item, .. } => vec![view(item, child(0)?)?],
        Kind::Struct(fields) => fields
            .iter()
            .enumerate()
            .map(|(index, (_, field))| view(field, child(index)?))
            .collect::<Result<_, _>>()?,
        Kind::Map { key, value } => vec![map_entries(key, value, child(0)?)?],
        _ => Vec::new(),
    };
    let column = Column {
        length,
        offset,
        validity,
        buffers,
        children,
    };
    // Child ranges reached through offsets or fixed sizes must lie inside the child.
    let (large, child_len) = match kind {
        Kind::List { large, .. } => (*large, column.children[0].length),
        Kind::Map { .. } => (false, column.children[0].length),
        Kind::Utf8 { large } | Kind::Binary { large } if length > 0 => {
            check_offsets(&column, *large, usize::MAX)?;
            return Ok(column);
        }
        Kind::FixedList { size, .. } => {
            let needed = (offset + length)
                .checked_mul(*size)
                .ok_or("fixed-size list too long")?;
            if needed > column.children[0].length {
                return Err("fixed-size list child too short".into());
            }
            return Ok(column);
        }
        Kind::Struct(_) => {
            if column.children.iter().any(|c| c.length < offset + length) {
                return Err("struct child too short".into());
            }
            return Ok(column);
        }
        _ => return Ok(column),
    };
    if length > 0 {
        check_offsets(&column, large, child_len)?;
    }
    Ok(column)
}

/// A map's entries child: a struct array of exactly (key, value).
unsafe fn map_entries<'a>(
    key: &Kind,
    value: &Kind,
    entries: &'a ArrowArray,
) -> Result<Column<'a>, String> {
    if entries.release.is_none()
        || entries.n_children != 2
        || entries.children.is_null()
        || entries.length < 0
        || entries.offset < 0
    {
        return Err("unexpected Arrow map entries".into());
    }
    let raw = std::slice::from_raw_parts(entries.children, 2);
    if raw.iter().any(|c| c.is_null()) {
        return Err("missing Arrow map child".into());
    }
    let children = vec![view(key, &*raw[0])?, view(value, &*raw[1])?];
    let length = entries.length as usize;
    let offset = entries.offset as usize;
    if children.iter().any(|c| c.length < offset + length) {
        return Err("map entries child too short".into());
    }
    Ok(Column {
        length,
        offset,
        validity: None,
        buffers: &[],
        children,
    })
}

/// Offsets of the column's slots are non-decreasing and end inside `limit`.
fn check_offsets(column: &Column<'_>, large: bool, limit: usize) -> Result<(), String> {
    let mut previous = 0usize;
    for physical in column.offset..=column.offset + column.length {
        let raw = unsafe {
            if large {
                *column.buffer::<i64>(1).add(physical)
            } else {
                i64::from(*column.buffer::<i32>(1).add(physical))
            }
        };
        if raw < 0 || (physical > column.offset && (raw as usize) < previous) {
            return Err("invalid Arrow offsets".into());
        }
        previous = raw as usize;
    }
    if previous > limit {
        return Err("Arrow offsets beyond the child array".into());
    }
    Ok(())
}

/// Reuses the int objects of recurring values within one conversion (token ids repeat across
/// a batch): a direct-mapped table keyed by the value's low bits. Ints are immutable, so a shared
/// object is indistinguishable from a fresh one except by `is`.
struct IntCache<'py> {
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
fn convert<'py>(
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

/// The capsule's pointer, after checking its name (the PyCapsule interface of Arrow).
fn capsule_pointer<T>(capsule: &Bound<'_, PyCapsule>, name: &CStr) -> PyResult<*mut T> {
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

/// One column's values for the rows of a batch.
enum Values<'py> {
    Native(Vec<Bound<'py, PyAny>>),
    /// Converted by the caller (a type left to pyarrow).
    Python(Bound<'py, PyList>),
}

/// The rows of a record batch given as `batch.__arrow_c_array__()`, exactly as
/// `batch.to_pylist()` gives them: row i is `{name: value}` in column order, every row sharing
/// one interned key object per column (a repeated name keeps its first position and its last
/// value). A column of a type not converted here is asked of `fallback(index)`, which returns
/// that column's `to_pylist()`.
///
/// Raises ValueError for a released or inconsistent batch or a fallback list of the wrong
/// length, TypeError for capsules that are not Arrow's, UnicodeDecodeError for a string that
/// is not UTF-8, and whatever `fallback` raises.
#[pyfunction]
fn rows_from_arrow<'py>(
    py: Python<'py>,
    schema: &Bound<'py, PyCapsule>,
    array: &Bound<'py, PyCapsule>,
    fallback: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyList>> {
    let schema = capsule_pointer::<ArrowSchema>(schema, c"arrow_schema")?;
    let array = capsule_pointer::<ArrowArray>(array, c"arrow_array")?;
    // SAFETY: the capsules hold pyarrow's exported structs and stay alive (borrowed by this
    // call) until it returns; nothing is moved out of them, so their destructors release them.
    let (keys, columns, rows) = unsafe {
        let (schema, array) = (&*schema, &*array);
        let fields = batch_children(schema, array).map_err(PyValueError::new_err)?;
        let rows = array.length as usize;
        let start = array.offset as usize;
        let mut keys = Vec::with_capacity(fields.len());
        let mut columns = Vec::with_capacity(fields.len());
        for (index, (field, child)) in fields.into_iter().enumerate() {
            let name = CStr::from_ptr(field.name).to_str().map_err(|_| {
                PyValueError::new_err(format!("column {index} has a name that is not UTF-8"))
            })?;
            keys.push(PyString::intern(py, name));
            columns.push(match parse_kind(py, field) {
                Some(kind) => {
                    let column = view(&kind, child).map_err(PyValueError::new_err)?;
                    if column.length < start + rows {
                        return Err(PyValueError::new_err("Arrow column shorter than its batch"));
                    }
                    let mut values = Vec::with_capacity(rows);
                    convert(py, &kind, &column, start, rows, &mut values)?;
                    Values::Native(values)
                }
                None => {
                    let values = fallback.call1((index,))?.downcast_into::<PyList>()?;
                    if values.len() != rows {
                        return Err(PyValueError::new_err(format!(
                            "fallback gave {} values for column {index} of {rows} rows",
                            values.len()
                        )));
                    }
                    Values::Python(values)
                }
            });
        }
        (keys, columns, rows)
    };
    let mut dicts = Vec::with_capacity(rows);
    for row in 0..rows {
        let dict = PyDict::new(py);
        for (key, values) in keys.iter().zip(&columns) {
            match values {
                Values::Native(values) => dict.set_item(key, &values[row])?,
                // SAFETY: `row` is within the list (its length was checked and no Python code
                // runs meanwhile: exact str keys hash and compare without it); the item is
                // borrowed and PyDict_SetItem takes its own reference.
                Values::Python(list) => unsafe {
                    let value = ffi::PyList_GetItem(list.as_ptr(), row as ffi::Py_ssize_t);
                    if value.is_null()
                        || ffi::PyDict_SetItem(dict.as_ptr(), key.as_ptr(), value) != 0
                    {
                        return Err(PyErr::fetch(py));
                    }
                },
            }
        }
        dicts.push(dict);
    }
    PyList::new(py, dicts)
}

/// The (field, column) pairs of an exported record batch: a struct array without nulls.
///
/// # Safety
/// `schema` and `array` must be valid exported structs.
unsafe fn batch_children<'a>(
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rows_from_arrow, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    unsafe extern "C" fn release(_: *mut ArrowArray) {}

    fn array(length: i64, offset: i64, buffers: &mut [*const c_void]) -> ArrowArray {
        ArrowArray {
            length,
            null_count: 0,
            offset,
            n_buffers: buffers.len() as i64,
            n_children: 0,
            buffers: buffers.as_mut_ptr(),
            children: null_mut(),
            dictionary: null_mut(),
            release: Some(release),
            private_data: null_mut(),
        }
    }

    #[test]
    fn validity_bits_are_lsb_first() {
        let bits = [0b0000_0101u8, 0b1000_0000];
        let read: Vec<bool> = (0..16).map(|i| unsafe { bit(bits.as_ptr(), i) }).collect();
        assert_eq!(read.iter().filter(|b| **b).count(), 3);
        assert!(read[0] && !read[1] && read[2] && read[15]);
    }

    #[test]
    fn primitive_layout_is_checked() {
        let values = [1i64, 2, 3];
        let mut buffers = [null(), values.as_ptr().cast()];
        let good = array(2, 1, &mut buffers);
        let column = unsafe { view(&Kind::I64, &good) }.unwrap();
        assert_eq!(
            (column.length, column.offset, column.validity),
            (2, 1, None)
        );

        let mut one_buffer = [null()];
        let wrong = array(3, 0, &mut one_buffer);
        assert!(unsafe { view(&Kind::I64, &wrong) }.is_err());

        let mut missing = [null(), null()];
        assert!(unsafe { view(&Kind::I64, &array(3, 0, &mut missing)) }.is_err());
        // An empty array may leave its data buffer out.
        assert!(unsafe { view(&Kind::I64, &array(0, 0, &mut missing)) }.is_ok());

        let mut released = array(2, 0, &mut buffers);
        released.release = None;
        assert!(unsafe { view(&Kind::I64, &released) }.is_err());
    }

    #[test]
    fn list_offsets_must_stay_inside_the_child() {
        let values = [10i64, 20, 30];
        let mut child_buffers = [null(), values.as_ptr().cast()];
        let mut child = array(3, 0, &mut child_buffers);
        let mut children = [&mut child as *mut ArrowArray];
        let children = children.as_mut_ptr();
        let kind = Kind::List {
            large: false,
            item: Box::new(Kind::I64),
        };
        let check = |offsets: &[i32], length: i64, offset: i64| {
            let mut buffers = [null(), offsets.as_ptr().cast()];
            let mut list = array(length, offset, &mut buffers);
            list.n_children = 1;
            list.children = children;
            unsafe { view(&kind, &list) }.map(|_| ())
        };
        assert!(check(&[0, 1, 3], 2, 0).is_ok());
        assert!(check(&[0, 1, 3], 1, 1).is_ok());
        assert!(
            check(&[0, 2, 4], 2, 0).is_err(),
            "past the child's 3 values"
        );
        assert!(check(&[0, 2, 1], 2, 0).is_err(), "decreasing");
        assert!(check(&[-1, 0, 1], 2, 0).is_err(), "negative");
    }
}
