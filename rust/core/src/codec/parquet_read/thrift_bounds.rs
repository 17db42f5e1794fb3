//! A walk over Thrift compact protocol bytes (a Parquet footer, an offset index) made exactly
//! as arrow-rs will read them, checking every list length before arrow-rs reserves it: its
//! generated decoder reads each known field by the IDL's type, whatever the wire type says, and
//! reserves a list's declared length up front, so a few bytes declaring 10^9 column chunks asked
//! for gigabytes and aborted the process (found by the `parquet_read` fuzz target). The fields
//! and their types are arrow-rs's own ([`super::thrift_idl`], generated from its source); the
//! protocol rules are those of its `TCompactSliceInputProtocol` (a pending boolean from a field
//! header, a list's length truncated to i32, no sets or maps). A list may declare at most as
//! many elements as bytes remain (each takes at least one) and at most `MAX_LIST` (pyarrow's
//! container limit).

use super::thrift_idl::{Value, STRUCTS};

/// The most elements one list may declare (pyarrow's `thrift_container_size_limit`).
pub const MAX_LIST: usize = 1_000_000;
/// The thrift crate's skip depth.
const MAX_SKIP_DEPTH: u32 = 64;

/// Ok when `data` starts with struct `index` of [`STRUCTS`] whose lists all fit; else what is
/// wrong. Malformed bytes arrow-rs would refuse anyway may pass or fail here alike.
pub fn check_struct(data: &[u8], index: usize) -> Result<(), String> {
    let mut walker = Walker {
        data,
        at: 0,
        pending_bool: None,
    };
    walker.value(Value::Struct(index))
}

struct Walker<'a> {
    data: &'a [u8],
    at: usize,
    pending_bool: Option<bool>,
}

const STOP: u8 = 0;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const STRUCT: u8 = 12;
/// Booleans on the wire (a field header's 1 or 2), as one kind.
const BOOL: u8 = 1;

fn ends_early() -> String {
    "its Thrift metadata ends early".into()
}

impl Walker<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.data.get(self.at).ok_or_else(ends_early)?;
        self.at += 1;
        Ok(byte)
    }

    fn take(&mut self, count: u64) -> Result<(), String> {
        if count > (self.data.len() - self.at) as u64 {
            return Err(ends_early());
        }
        self.at += count as usize;
        Ok(())
    }

    /// arrow-rs's `read_vlq`: 7 bits a byte until a byte below 0x80.
    fn varint(&mut self) -> Result<u64, String> {
        let (mut value, mut shift) = (0u64, 0u32);
        loop {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7F).wrapping_shl(shift);
            shift = shift.wrapping_add(7);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
    }

    fn zigzag(&mut self) -> Result<i64, String> {
        let value = self.varint()?;
        Ok((value >> 1) as i64 ^ -((value & 1) as i64))
    }

    /// arrow-rs's `read_bool`: the field header's pending value, else a byte.
    fn boolean(&mut self) -> Result<(), String> {
        if self.pending_bool.take().is_none() {
            self.byte()?;
        }
        Ok(())
    }

    /// A wire type of a field header or collection (booleans as BOOL); Err for others.
    fn wire_type(nibble: u8) -> Result<u8, String> {
        match nibble {
            1 | 2 => Ok(BOOL),
            0 | 3..=12 => Ok(nibble),
            other => Err(format!(
                "its Thrift metadata has a value of unknown type {other}"
            )),
        }
    }

    fn value(&mut self, value: Value) -> Result<(), String> {
        match value {
            Value::Bool => self.boolean(),
            Value::Byte => self.take(1),
            Value::I16 | Value::I32 | Value::I64 => self.varint().map(|_| ()),
            Value::Double => self.take(8),
            Value::Binary => {
                let length = self.varint()?;
                self.take(length)
            }
            Value::List(element) => {
                let count = self.list_header()?;
                for _ in 0..count {
                    self.value(*element)?;
                }
                Ok(())
            }
            Value::Struct(index) => {
                let fields = STRUCTS.get(index).ok_or("no such Thrift struct")?;
                let mut last_id: i16 = 0;
                while let Some((id, kind)) = self.field_header(&mut last_id)? {
                    match fields.iter().find(|(known, _)| *known == id) {
                        Some((_, value)) => self.value(*value)?,
                        None => self.skip(kind, MAX_SKIP_DEPTH)?,
                    }
                }
                Ok(())
            }
        }
    }

    /// arrow-rs's `read_field_begin`: the next field's (id, wire type), None at STOP; a
    /// boolean field's value is kept pending.
    fn field_header(&mut self, last_id: &mut i16) -> Result<Option<(i16, u8)>, String> {
        let header = self.byte()?;
        let kind = Self::wire_type(header & 0x0F)?;
        if header & 0x0F == 1 || header & 0x0F == 2 {
            self.pending_bool = Some(header & 0x0F == 1);
        }
        if kind == STOP {
            return Ok(None);
        }
        let delta = i16::from(header >> 4);
        *last_id = if delta != 0 {
            last_id
                .checked_add(delta)
                .ok_or("its Thrift field ids overflow")?
        } else {
            self.zigzag()? as i16
        };
        Ok(Some((*last_id, kind)))
    }

    /// arrow-rs's `read_list_set_begin`, with the length checked before anything reserves it.
    fn list_header(&mut self) -> Result<usize, String> {
        let header = self.byte()?;
        Self::wire_type(header & 0x0F)?;
        let short = header >> 4;
        let count = if short != 15 {
            i64::from(short)
        } else {
            i64::from(self.varint()? as i32) // arrow-rs truncates it so
        };
        let left = (self.data.len() - self.at) as i64;
        if count < 0 || count > left || count > MAX_LIST as i64 {
            return Err(format!(
                "its Thrift metadata declares a list of {count} elements in {left} bytes"
            ));
        }
        Ok(count as usize)
    }

    /// The thrift crate's `skip_till_depth` over arrow-rs's protocol (which has no sets or maps).
    fn skip(&mut self, kind: u8, depth: u32) -> Result<(), String> {
        if depth == 0 {
            return Err("its Thrift metadata is nested too deep".into());
        }
        match kind {
            BOOL => self.boolean(),
            BYTE => self.take(1),
            I16 | I32 | I64 => self.varint().map(|_| ()),
            DOUBLE => self.take(8),
            BINARY => {
                let length = self.varint()?;
                self.take(length)
            }
            STRUCT => {
                let mut last_id: i16 = 0;
                while let Some((_, field_kind)) = self.field_header(&mut last_id)? {
                    self.skip(field_kind, depth - 1)?;
                }
                Ok(())
            }
            LIST => {
                let header = self.data.get(self.at).copied().ok_or_else(ends_early)?;
                let element = Self::wire_type(header & 0x0F)?;
                for _ in 0..self.list_header()? {
                    self.skip(element, depth - 1)?;
                }
                Ok(())
            }
            other => Err(format!(
                "its Thrift metadata has a value of type {other} arrow-rs cannot read"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::thrift_idl::{FILE_META_DATA, OFFSET_INDEX};
    use super::*;

    #[test]
    fn a_list_longer_than_its_bytes_is_refused() {
        // OffsetIndex { 1: list<PageLocation> of 2^31 - 1 elements }, then nothing.
        let data = [0x19, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0x00];
        let problem = check_struct(&data, OFFSET_INDEX).unwrap_err();
        assert!(
            problem.contains("declares a list of 2147483647 elements"),
            "{problem}"
        );
        // Two empty page locations (arrow-rs refuses them later: required fields): fine here.
        assert_eq!(
            check_struct(&[0x19, 0x2C, 0x00, 0x00, 0x00], OFFSET_INDEX),
            Ok(())
        );
        assert!(check_struct(&[0x19, 0x2C, 0x00], OFFSET_INDEX).is_err());
    }

    #[test]
    fn a_known_list_field_is_read_as_a_list_whatever_its_wire_type() {
        // FileMetaData field 4 (row_groups) sent as an i32: arrow-rs reads a list header there.
        let data = [0x45, 0xF0, 0xFF, 0xFF, 0xFF, 0xFF, 0x07];
        assert!(check_struct(&data, FILE_META_DATA)
            .unwrap_err()
            .contains("declares a list"));
    }

    #[test]
    fn deep_unknown_fields_and_unknown_types_are_refused() {
        // Field 99 (unknown) of nested structs, deeper than the skip depth.
        let mut deep = Vec::new();
        for _ in 0..70 {
            deep.extend([0x0C, 0xC6, 0x01]);
        }
        deep.extend([0; 71]);
        assert!(check_struct(&deep, FILE_META_DATA)
            .unwrap_err()
            .contains("nested too deep"));
        assert!(check_struct(&[0x1E], FILE_META_DATA)
            .unwrap_err()
            .contains("unknown type 14"));
    }
}
