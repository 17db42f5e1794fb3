//! `SlotStates`: the free/held state of each slot of a shared-memory ring, read and written with
//! atomics.
//!
//! A DataLoader worker writes a batch into a free slot, then marks it held; the training
//! process copies the batch out, then marks it free. The orderings make the copy safe on any
//! CPU: the worker's writes come after an acquire load that saw "free", and the training
//! process's copy comes before a release store of "free". Python has no atomics, hence this.

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

const FREE: u32 = 0;
const HELD: u32 = 1;

/// The states of ``slots`` slots, 4 bytes each at the start of ``memory`` (a writable buffer,
/// e.g. an ``mmap`` shared with forked workers, 4-byte aligned).
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct SlotStates {
    memory: PyBuffer<u8>,
    slots: usize,
}

impl SlotStates {
    fn state(&self, slot: usize) -> PyResult<&AtomicU32> {
        if slot >= self.slots {
            return Err(PyIndexError::new_err(format!(
                "slot {slot} of a ring of {} slots",
                self.slots
            )));
        }
        let first = self.memory.buf_ptr().cast::<u32>();
        // SAFETY: `new` checked that the buffer is writable, contiguous, 4-byte aligned and
        // holds `slots` states; `memory` keeps it alive. Other processes touch these words only
        // through the same atomics.
        Ok(unsafe { AtomicU32::from_ptr(first.add(slot)) })
    }
}

#[pymethods]
impl SlotStates {
    #[new]
    fn new(memory: &Bound<'_, PyAny>, slots: usize) -> PyResult<Self> {
        let memory = PyBuffer::<u8>::get(memory)?;
        let fits = slots
            .checked_mul(4)
            .is_some_and(|bytes| bytes <= memory.len_bytes());
        if memory.readonly() || !memory.is_c_contiguous() || !fits {
            return Err(PyValueError::new_err(format!(
                "slot states need a writable contiguous buffer of at least {slots} x 4 bytes"
            )));
        }
        if !(memory.buf_ptr() as usize).is_multiple_of(std::mem::align_of::<AtomicU32>()) {
            return Err(PyValueError::new_err(
                "slot states need a 4-byte aligned buffer",
            ));
        }
        Ok(SlotStates { memory, slots })
    }

    /// Whether ``slot`` is free; if so, the caller may write it (its owner only), then
    /// :meth:`hold` it.
    fn is_free(&self, slot: usize) -> PyResult<bool> {
        Ok(self.state(slot)?.load(Ordering::Acquire) == FREE)
    }

    /// Marks ``slot`` held: what was written to it before is complete for whoever sees this.
    fn hold(&self, slot: usize) -> PyResult<()> {
        self.state(slot)?.store(HELD, Ordering::Release);
        Ok(())
    }

    /// Whether ``slot`` is held (its writes complete, for the reader to copy out).
    fn is_held(&self, slot: usize) -> PyResult<bool> {
        Ok(self.state(slot)?.load(Ordering::Acquire) == HELD)
    }

    /// Marks ``slot`` free: the reads of it before this are done before its owner writes again.
    fn free(&self, slot: usize) -> PyResult<()> {
        self.state(slot)?.store(FREE, Ordering::Release);
        Ok(())
    }
}
