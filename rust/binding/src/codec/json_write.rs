//! Python record -> one JSON line, byte for byte what
//! `json.dumps(record, separators=(",", ":"), ensure_ascii=True, allow_nan=True)` writes.

use std::io::Write as _;

use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

use super::py_value::{
    check_record, kind_of, map_items, refuse, seq_items, str_of, type_name, PyValue,
};
use syvain_core::codec::MAX_LINE_BYTES;

use crate::error::BindingResult;

/// Nesting beyond what the reader accepts (as deep as msgpack.zstf) is refused.
pub const MAX_DEPTH: usize = syvain_core::codec::MAX_JSON_DEPTH;

/// Appends one record as JSON text (without the "\n") to `out`.
///
/// Errors (ValueError): not a mapping, a value `json.dumps` rejects (TypeError there), a key
/// that is not str/int/float/bool/None, a lone surrogate, nesting deeper than [`MAX_DEPTH`],
/// or a line over 1 GiB.
pub fn write_record(record: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> BindingResult<()> {
    check_record(record)?;
    let start = out.len();
    write_value(record, out, 1, start)
}

fn write_value(
    obj: &Bound<'_, PyAny>,
    out: &mut Vec<u8>,
    depth: usize,
    start: usize,
) -> BindingResult<()> {
    match kind_of(obj) {
        PyValue::None => out.extend_from_slice(b"null"),
        PyValue::Bool(b) => out.extend_from_slice(if b { b"true" } else { b"false" }),
        PyValue::Int(i) => write_int(i, out)?,
        PyValue::Float(f) => write_float(f, out),
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
fn write_key(key: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> BindingResult<()> {
    let quoted = |out: &mut Vec<u8>, text: &[u8]| {
        out.push(b'"');
        out.extend_from_slice(text);
        out.push(b'"');
    };
    match kind_of(key) {
        PyValue::Str(s) => write_str(str_of(s)?, out),
        PyValue::Float(f) => {
            let mut text = Vec::new();
            write_float(f, &mut text);
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

fn enter(depth: usize) -> BindingResult<()> {
    if depth > MAX_DEPTH {
        return Err(refuse(format!(
            "record nests deeper than {MAX_DEPTH} levels"
        )));
    }
    Ok(())
}

/// `int.__repr__`, also for int subclasses such as IntEnum (as `json.dumps` does).
fn write_int(i: &Bound<'_, PyInt>, out: &mut Vec<u8>) -> BindingResult<()> {
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
fn write_digits(v: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// `float.__repr__`, with `json`'s NaN / Infinity / -Infinity for the non-finite values.
pub fn write_float(f: f64, out: &mut Vec<u8>) {
    if f.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if f.is_infinite() {
        out.extend_from_slice(if f > 0.0 { b"Infinity" } else { b"-Infinity" });
    } else {
        write_float_repr(f, out);
    }
}

/// Python's `repr(float)` of a finite value. Ryu finds the same digits Python's dtoa (mode 0)
/// does: the shortest string that reads back as `f`, the closest one to `f` when several are
/// that short, an exact tie broken to even. Only the layout differs, so the digits are taken
/// from Ryu's text and laid out as Python does: positional when the decimal point falls
/// between 4 places left of the first digit and 16 right of it (with ".0" for an integral
/// value), otherwise `d.ddde+XX` with at least two exponent digits.
fn write_float_repr(f: f64, out: &mut Vec<u8>) {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(f).as_bytes();
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.iter().position(|&b| b == b'e') {
        Some(at) => (&text[..at], parse_exponent(&text[at + 1..])),
        None => (text, 0),
    };
    // value = 0.DIGITS x 10^point, DIGITS without leading or trailing zeros.
    let mut digits = [0u8; 40];
    let mut count = 0;
    let mut point = exponent;
    let mut seen_point = false;
    for &b in mantissa {
        if b == b'.' {
            seen_point = true;
            continue;
        }
        if count == 0 && b == b'0' {
            if seen_point {
                point -= 1;
            }
            continue;
        }
        if count < digits.len() {
            digits[count] = b;
            count += 1;
        }
        if !seen_point {
            point += 1;
        }
    }
    while count > 0 && digits[count - 1] == b'0' {
        count -= 1;
    }
    if negative {
        out.push(b'-');
    }
    let digits = &digits[..count];
    if digits.is_empty() {
        out.extend_from_slice(b"0.0");
        return;
    }
    let point = point as i64;
    let len = digits.len() as i64;
    if point > -4 && point <= 16 {
        if point <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-point) as usize));
            out.extend_from_slice(digits);
        } else if point >= len {
            out.extend_from_slice(digits);
            out.extend(std::iter::repeat_n(b'0', (point - len) as usize));
            out.extend_from_slice(b".0");
        } else {
            out.extend_from_slice(&digits[..point as usize]);
            out.push(b'.');
            out.extend_from_slice(&digits[point as usize..]);
        }
    } else {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        let shown = point - 1;
        out.extend_from_slice(if shown < 0 { b"e-" } else { b"e+" });
        let magnitude = shown.unsigned_abs();
        if magnitude < 10 {
            out.push(b'0');
        }
        write_digits(magnitude, out);
    }
}

/// The exponent Ryu wrote after its "e" (an optional "-" and digits).
fn parse_exponent(text: &[u8]) -> i32 {
    let (sign, digits) = match text.split_first() {
        Some((b'-', rest)) => (-1, rest),
        _ => (1, text),
    };
    let magnitude = digits
        .iter()
        .fold(0i32, |acc, &b| acc * 10 + i32::from(b.wrapping_sub(b'0')));
    sign * magnitude
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
    use pyo3::ffi;

    fn repr(f: f64) -> String {
        let mut out = Vec::new();
        write_float(f, &mut out);
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

    /// Python's own `repr(float)`, through the function `float_repr` calls.
    fn python_repr(_gil: Python<'_>, f: f64) -> String {
        // SAFETY: the GIL is held (`_gil`); the result is a NUL-terminated buffer we free with PyMem.
        unsafe {
            let text = ffi::PyOS_double_to_string(
                f,
                b'r' as std::ffi::c_char,
                0,
                ffi::Py_DTSF_ADD_DOT_0,
                std::ptr::null_mut(),
            );
            assert!(!text.is_null());
            let repr = std::ffi::CStr::from_ptr(text).to_str().unwrap().to_owned();
            ffi::PyMem_Free(text.cast());
            repr
        }
    }

    #[test]
    fn floats_match_python_repr_at_random() {
        pyo3::prepare_freethreaded_python();
        // A fixed xorshift stream: random bit patterns (every exponent) and decimal-looking
        // values near every power of ten.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        Python::with_gil(|py| {
            for round in 0..400_000 {
                let bits = next();
                let f = if round % 2 == 0 {
                    f64::from_bits(bits)
                } else {
                    let scale = 10f64.powi((bits % 640) as i32 - 320);
                    (bits >> 11) as f64 / (1u64 << 53) as f64 * scale
                };
                if f.is_finite() {
                    assert_eq!(repr(f), python_repr(py, f), "{:#x}", f.to_bits());
                }
            }
        });
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
