//! Checked views of exported Arrow arrays: every buffer and offset a conversion reads is
//! checked against the array's kind and its children's lengths first.

use std::ffi::c_void;

use super::ffi::ArrowArray;
use super::kind::Kind;

/// A checked view of one `ArrowArray` and its children (the layout matches its [`Kind`]).
pub struct Column<'a> {
    pub length: usize,
    pub offset: usize,
    /// Validity bitmap; None when every value is valid.
    pub validity: Option<*const u8>,
    pub buffers: &'a [*const c_void],
    pub children: Vec<Column<'a>>,
}

impl Column<'_> {
    pub fn is_valid(&self, physical: usize) -> bool {
        self.validity
            .is_none_or(|bits| unsafe { bit(bits, physical) })
    }

    pub fn buffer<T>(&self, index: usize) -> *const T {
        self.buffers[index].cast()
    }

    /// List or string offset at a physical slot.
    pub fn offset_at(&self, large: bool, physical: usize) -> usize {
        unsafe {
            if large {
                *self.buffer::<i64>(1).add(physical) as usize
            } else {
                *self.buffer::<i32>(1).add(physical) as usize
            }
        }
    }
}

pub unsafe fn bit(bits: *const u8, index: usize) -> bool {
    (*bits.add(index >> 3) >> (index & 7)) & 1 == 1
}

/// Checks an array against its kind so that conversion only reads inside its buffers.
///
/// # Safety
/// `array` must be a valid, unreleased `ArrowArray` (pyarrow's export). Offsets into child
/// arrays are checked against the children's lengths; string and binary data buffers are not
/// sized by the interface and are trusted as exported.
pub unsafe fn view<'a>(kind: &Kind, array: &'a ArrowArray) -> Result<Column<'a>, String> {
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
pub fn check_offsets(column: &Column<'_>, large: bool, limit: usize) -> Result<(), String> {
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
