//! The smallest-encoding MessagePack primitives the shard writer uses.

pub fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

pub fn write_bool(out: &mut Vec<u8>, value: bool) {
    out.push(if value { 0xc3 } else { 0xc2 });
}

pub fn write_uint(out: &mut Vec<u8>, value: u64) {
    if value < 0x80 {
        out.push(value as u8);
    } else if let Ok(v) = u8::try_from(value) {
        out.extend_from_slice(&[0xcc, v]);
    } else if let Ok(v) = u16::try_from(value) {
        out.push(0xcd);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = u32::try_from(value) {
        out.push(0xce);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

/// Non-negative values take the unsigned forms, negative ones the smallest signed form.
pub fn write_int(out: &mut Vec<u8>, value: i64) {
    if let Ok(v) = u64::try_from(value) {
        write_uint(out, v);
    } else if value >= -32 {
        out.push(value as i8 as u8);
    } else if let Ok(v) = i8::try_from(value) {
        out.extend_from_slice(&[0xd0, v as u8]);
    } else if let Ok(v) = i16::try_from(value) {
        out.push(0xd1);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = i32::try_from(value) {
        out.push(0xd2);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_float(out: &mut Vec<u8>, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_be_bytes());
}

/// Writes a length header in its smallest form: the fix form `(base, exclusive limit)` and the
/// 8-bit form where the type has them. `None` when the length exceeds 32 bits.
fn write_len(
    out: &mut Vec<u8>,
    len: usize,
    fix: Option<(u8, usize)>,
    m8: Option<u8>,
    m16: u8,
    m32: u8,
) -> Option<()> {
    match fix {
        Some((base, limit)) if len < limit => out.push(base | len as u8),
        _ => match (m8, u8::try_from(len), u16::try_from(len)) {
            (Some(marker), Ok(v), _) => out.extend_from_slice(&[marker, v]),
            (_, _, Ok(v)) => {
                out.push(m16);
                out.extend_from_slice(&v.to_be_bytes());
            }
            _ => {
                out.push(m32);
                out.extend_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
            }
        },
    }
    Some(())
}

pub fn write_str(out: &mut Vec<u8>, value: &str) -> Option<()> {
    write_len(out, value.len(), Some((0xa0, 32)), Some(0xd9), 0xda, 0xdb)?;
    out.extend_from_slice(value.as_bytes());
    Some(())
}

pub fn write_bin_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, None, Some(0xc4), 0xc5, 0xc6)
}

pub fn write_array_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, Some((0x90, 16)), None, 0xdc, 0xdd)
}

pub fn write_map_header(out: &mut Vec<u8>, len: usize) -> Option<()> {
    write_len(out, len, Some((0x80, 16)), None, 0xde, 0xdf)
}
