//! Python record -> one JSON line, byte for byte what
//! `json.dumps(record, separators=(",", ":"), ensure_ascii=True, allow_nan=True)` writes.

use std::ffi::{c_char, CStr};
use std::io::Write as _;
use std::ptr::null_mut;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

use super::py_value::{classify, map_items, seq_items, str_of, type_name, PyValue};
use super::MAX_LINE_BYTES;
use crate::error::{NativeError, NativeResult};

/// The reader builds records with jiter, which stops at this nesting; writing deeper records
/// would produce lines our own reader skips.
pub const MAX_DEPTH: usize = 200;

fn refuse(problem: impl Into<String>) -> NativeError {
    NativeError::Encode(problem.into())
}

/// Appends one record as JSON text (without the "\n") to `out`.
///
/// Errors (ValueError): not a mapping, a value `json.dumps` rejects (TypeError there), a key
/// that is not str/int/float/bool/None, a lone surrogate, nesting deeper than [`MAX_DEPTH`],
/// or a line over 1 GiB.
pub fn write_record(record: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> NativeResult<()> {
    if !matches!(classify(record), PyValue::Map) {
        return Err(refuse(format!(
            "record is not a mapping but {}",
            type_name(record)
        )));
    }
    let start = out.len();
    write_value(record, out, 1, start)
}

fn write_value(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u8>,
    depth: usize,
    start: usize,
) -> NativeResult<()> {
    match classify(obj) {
        PyValue::None => out.extend_from_slice(b"null"),
        PyValue::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        PyValue::Int(i) => write_int(i, out)?,
        PyValue::Float(f) => write_float(obj.py(), f, out)?,
        PyValue::Str(s) => write_str(str_of(s)?, out),
        PyValue::Map => {
            enter(depth)?;
            out.push(b'{');
            for (n, (key, value)) in map_items(obj)?.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_key(key, out)?;
                out.push(b':');
                write_value(value, out, depth + 1, start)?;
            }
            out.push(b'}');
        }
        PyValue::Seq if obj.is_exact_instance_of::<PyList>() => {
            // A list is walked in place (nothing here runs Python code that could change it).
            let list = obj.downcast::<PyList>().map_err(PyErr::from)?;
            enter(depth)?;
            out.push(b'[');
            for (n, item) in list.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_value(&item, out, depth + 1, start)?;
            }
            out.push(b']');
        }
        PyValue::Seq => {
            enter(depth)?;
            out.push(b'[');
            for (n, item) in seq_items(obj)?.iter().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                write_value(item, out, depth + 1, start)?;
            }
            out.push(b']');
        }
        PyValue::Bytes | PyValue::Other => {
            return Err(refuse(format!(
                "Object of type {} is not JSON serializable",
                type_name(obj)
            )))
        }
    }
    if (out.len() - start) as u64 > MAX_LINE_BYTES {
        return Err(refuse("record is longer than 1 GiB as a JSON line"));
    }
    Ok(())
}

/// Keys are coerced to strings the way `json.dumps` does.
fn write_key(key: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> NativeResult<()> {
    let quoted = |out: &mut Vec<u8>, text: &[u8]| {
        out.push(b'"');
        out.extend_from_slice(text);
        out.push(b'"');
    };
    match classify(key) {
        PyValue::Str(s) => write_str(str_of(s)?, out),
        PyValue::Float(f) => {
            let mut text = Vec::new();
            write_float(key.py(), f, &mut text)?;
            quoted(out, &text);
        }
        PyValue::Bool(b) => quoted(out, if b { b"true" } else { b"false" }),
        PyValue::None => quoted(out, b"null"),
        PyValue::Int(i) => {
            let mut text = Vec::new();
            write_int(i, &mut text)?;
            quoted(out, &text);
        }
        _ => {
            return Err(refuse(format!(
                "keys must be str, int, float, bool or None, not {}",
                type_name(key)
            )))
        }
    }
    Ok(())
}

fn enter(depth: usize) -> NativeResult<()> {
    if depth > MAX_DEPTH {
        return Err(refuse(format!(
            "record nests deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(())
}

/// `int.__repr__`, also for int subclasses such as IntEnum (as `json.dumps` does).
fn write_int(i: &Bound<'_, PyInt>, out: &mut Vec<u8>) -> NativeResult<()> {
    if let Ok(v) = i.extract::<i64>() {
        if v < 0 {
            out.push(b'-');
        }
        write_digits(v.unsigned_abs(), out);
    } else if let Ok(v) = i.extract::<u64>() {
        write_digits(v, out);
    } else {
        let py = i.py();
        let text = py.get_type::<PyInt>().getattr("__repr__")?.call1((i,))?;
        out.extend_from_slice(text.extract::<&str>()?.as_bytes());
    }
    Ok(())
}

/// The decimal digits of `v`.
fn write_digits(mut v: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// `float.__repr__`, with `json`'s NaN / Infinity / -Infinity for the non-finite values.
pub fn write_float(py: Python<'_>, f: f64, out: &mut Vec<u8>) -> PyResult<()> {
    if f.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if f.is_infinite() {
        out.extend_from_slice(if f > 0.0 { b"Infinity" } else { b"-Infinity" });
    } else {
        write_float_repr(py, f, out)?;
    }
    Ok(())
}

/// Python's own `repr(float)` (what `float_repr` calls): among the shortest round-tripping
/// digit strings there can be two, and Python breaks that tie to even, which Rust's
/// formatting does not.
fn write_float_repr(py: Python<'_>, f: f64, out: &mut Vec<u8>) -> PyResult<()> {
    // SAFETY: the GIL is held (`py`), as PyMem needs; on success the result is a
    // NUL-terminated buffer we own and free with PyMem_Free.
    unsafe {
        let text =
            ffi::PyOS_double_to_string(f, b'r' as c_char, 0, ffi::Py_DTSF_ADD_DOT_0, null_mut());
        if text.is_null() {
            return Err(PyErr::fetch(py));
        }
        out.extend_from_slice(CStr::from_ptr(text).to_bytes());
        ffi::PyMem_Free(text.cast());
    }
    Ok(())
}

/// A JSON string with everything outside printable ASCII escaped (`ensure_ascii=True`).
pub fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            0x80..=0xbf => {} // continuation byte: written with its lead byte
            _ if b < 0x80 => escape_unit(u32::from(b), out),
            _ => {
                // A lead byte: escape the whole character as UTF-16 code units.
                let c = s[i..].chars().next().map_or(0xfffd, u32::from);
                if c > 0xffff {
                    let v = c - 0x1_0000;
                    escape_unit(0xd800 | (v >> 10), out);
                    escape_unit(0xdc00 | (v & 0x3ff), out);
                } else {
                    escape_unit(c, out);
                }
            }
        }
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

fn escape_unit(unit: u32, out: &mut Vec<u8>) {
    let _ = write!(out, "\\u{unit:04x}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(f: f64) -> String {
        pyo3::prepare_freethreaded_python();
        let mut out = Vec::new();
        Python::with_gil(|py| write_float(py, f, &mut out)).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn escaped(s: &str) -> String {
        let mut out = Vec::new();
        write_str(s, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn floats_match_python_repr() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (123.456, "123.456"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e16, "1.2345e+16"),
            (123456789012345.6, "123456789012345.6"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (-2.5e300, "-2.5e+300"),
            (2145970842131215.2, "2145970842131215.2"), // a tie, broken to even
            (f64::NAN, "NaN"),
            (f64::INFINITY, "Infinity"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (value, expected) in cases {
            assert_eq!(repr(value), expected, "{value:e}");
        }
    }

    #[test]
    fn digits_match_display() {
        for v in [0, 1, 9, 10, 99, 100, 12345, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            write_digits(v, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), v.to_string());
        }
    }

    #[test]
    fn strings_are_ascii_escaped() {
        assert_eq!(escaped("plain"), "\"plain\"");
        assert_eq!(
            escaped("q\"b\\n\n\t\r\x08\x0c\x00\x1f\x7f"),
            r#""q\"b\\n\n\t\r\b\f\u0000\u001f\u007f""#
        );
        assert_eq!(
            escaped("\u{e9}\u{20ac}\u{1f600}"),
            r#""\u00e9\u20ac\ud83d\ude00""#
        );
        assert_eq!(escaped(""), "\"\"");
    }
}
