//! Python record -> MessagePack payload, byte for byte what `msgspec.msgpack.encode` writes.

use pyo3::prelude::*;

use super::py_value::{
    bytes_of, check_record, kind_of, map_items, refuse, seq_items, str_of, type_name, PyValue,
};
use syvain_core::codec::msgpack;
use syvain_core::codec::MAX_PAYLOAD_BYTES;

use crate::error::{BindingError, BindingResult};

/// Nesting beyond this is refused rather than risking the stack of the calling thread.
pub const MAX_DEPTH: usize = 1000;

/// Appends the payload of one record (a mapping with str keys at every depth) to `out`.
///
/// Errors (ValueError): not a mapping, a non-str key, an unsupported type, an int outside
/// -2**63..2**64-1, nesting deeper than [`MAX_DEPTH`], or a payload over 1 GiB.
pub fn write_record(record: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> BindingResult<()> {
    check_record(record)?;
    let start = out.len();
    write_value(record, out, 1, start)
}

/// `start` is where this record's payload begins in `out` (the limits count from there).
fn write_value(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u8>,
    depth: usize,
    start: usize,
) -> BindingResult<()> {
    match kind_of(obj) {
        PyValue::None => msgpack::write_nil(out),
        PyValue::Bool(b) => msgpack::write_bool(out, b),
        PyValue::Int(i) => {
            if let Ok(v) = i.extract::<i64>() {
                msgpack::write_int(out, v);
            } else if let Ok(v) = i.extract::<u64>() {
                msgpack::write_uint(out, v);
            } else {
                return Err(refuse("an int outside -2**63..2**64-1 cannot be written"));
            }
        }
        PyValue::Float(f) => msgpack::write_float(out, f),
        PyValue::Str(s) => write_str(str_of(s)?, out, start)?,
        PyValue::Bytes => {
            let data = bytes_of(obj)?;
            reserve(out, start, data.len())?;
            msgpack::write_bin_header(out, data.len()).ok_or_else(too_large)?;
            out.extend_from_slice(&data);
        }
        PyValue::Map => {
            let items = map_items(obj)?;
            enter(depth)?;
            msgpack::write_map_header(out, items.len()).ok_or_else(too_large)?;
            for (key, value) in &items {
                match kind_of(key) {
                    PyValue::Str(s) => write_str(str_of(s)?, out, start)?,
                    _ => return Err(refuse(format!("a map key is {}, not str", type_name(key)))),
                }
                write_value(value, out, depth + 1, start)?;
            }
        }
        PyValue::Seq => {
            let items = seq_items(obj)?;
            enter(depth)?;
            msgpack::write_array_header(out, items.len()).ok_or_else(too_large)?;
            for item in &items {
                write_value(item, out, depth + 1, start)?;
            }
        }
        PyValue::Other => {
            return Err(refuse(format!(
                "values of type {} cannot be written",
                type_name(obj)
            )))
        }
    }
    if (out.len() - start) as u64 > MAX_PAYLOAD_BYTES {
        return Err(too_large());
    }
    Ok(())
}

fn write_str(s: &str, out: &mut Vec<u8>, start: usize) -> BindingResult<()> {
    reserve(out, start, s.len())?;
    msgpack::write_str(out, s).ok_or_else(too_large)
}

fn enter(depth: usize) -> BindingResult<()> {
    if depth > MAX_DEPTH {
        return Err(refuse(format!(
            "record nests deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(())
}

/// Refuses before copying a large str or bytes that would push the payload over 1 GiB.
fn reserve(out: &[u8], start: usize, len: usize) -> BindingResult<()> {
    if ((out.len() - start) as u64).saturating_add(len as u64) > MAX_PAYLOAD_BYTES {
        return Err(too_large());
    }
    Ok(())
}

fn too_large() -> BindingError {
    refuse("record payload is larger than 1 GiB")
}
