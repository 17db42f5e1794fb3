//! The Arrow types converted to Python values here, read from an exported schema.

use std::ffi::{c_char, CStr};

use pyo3::prelude::*;
use pyo3::types::PyString;

use super::ffi::ArrowSchema;

/// The Arrow types converted here, as a tree (struct field names already as Python strings).
pub enum Kind {
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
    pub fn layout(&self) -> (i64, i64) {
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
pub unsafe fn parse_kind(py: Python<'_>, schema: &ArrowSchema) -> Option<Kind> {
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
