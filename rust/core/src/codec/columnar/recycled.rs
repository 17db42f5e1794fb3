//! Int64 column buffers recycled across batches. A decoded batch's ints (token ids) reach
//! Python as an Arrow buffer; when Python drops it, the Vec comes back here and the next batch
//! writes into pages that are already mapped. A fresh allocation of a few MiB per batch costs
//! its page faults every time (the allocator hands such blocks back to the system), which made
//! a second int column (a loss mask) cost as much as decoding the tokens.
//!
//! The pool is small (`KEPT` buffers, `KEPT_BYTES` in all) and only ever `try_lock`ed: a
//! thread that finds it busy, or a forked child that inherited it locked, allocates or frees
//! as if there were no pool.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use arrow_buffer::{Buffer, ScalarBuffer};

const KEPT: usize = 4;
const KEPT_BYTES: usize = 32 << 20;

static POOL: Mutex<Vec<Vec<i64>>> = Mutex::new(Vec::new());

/// An empty Vec, with the capacity of a recycled one when the pool holds one, then `rows`
/// zeros (the nulls before a column's first value).
pub fn int_vec(rows: usize) -> Vec<i64> {
    let mut values = POOL
        .try_lock()
        .ok()
        .and_then(|mut pool| pool.pop())
        .unwrap_or_default();
    values.clear();
    values.resize(rows, 0);
    values
}

/// Gives its Vec back to the pool when the Arrow buffer that reads it is dropped.
struct Recycled(Vec<i64>);

impl Drop for Recycled {
    fn drop(&mut self) {
        let values = std::mem::take(&mut self.0);
        if let Ok(mut pool) = POOL.try_lock() {
            let held: usize = pool.iter().map(|v| v.capacity() * 8).sum();
            if pool.len() < KEPT && held + values.capacity() * 8 <= KEPT_BYTES {
                pool.push(values);
            }
        }
    }
}

/// `values` as an Arrow buffer without a copy; its memory goes back to the pool once every
/// array reading it is gone.
pub fn int_buffer(values: Vec<i64>) -> ScalarBuffer<i64> {
    let len = values.len();
    let Some(ptr) = NonNull::new(values.as_ptr().cast_mut().cast::<u8>()) else {
        return ScalarBuffer::from(values);
    };
    let owner = Arc::new(Recycled(values));
    // SAFETY: `ptr` points at the `len` initialised i64s of the Vec that `owner` holds (moving
    // a Vec does not move its heap memory); the Buffer keeps `owner` alive while it is read,
    // and nothing writes the Vec until `owner` drops.
    let buffer = unsafe { Buffer::from_custom_allocation(ptr, len * 8, owner) };
    ScalarBuffer::new(buffer, 0, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_comes_back_with_its_capacity() {
        let mut values = int_vec(3);
        assert_eq!(values, [0, 0, 0]);
        values.extend(0..1000);
        let capacity = values.capacity();
        let buffer = int_buffer(values);
        assert_eq!(buffer.len(), 1003);
        assert_eq!(buffer[1002], 999);
        let copy = buffer.clone();
        drop(buffer);
        assert_eq!(copy[3], 0); // still readable while any reader lives
        drop(copy);
        let again = int_vec(2);
        assert_eq!(again, [0, 0]);
        // Another test may have taken it first; when it is ours it kept its memory.
        assert!(again.capacity() == capacity || again.capacity() >= 2);
    }
}
