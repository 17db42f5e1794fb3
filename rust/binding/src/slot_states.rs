//! `SlotStates`: the free/held state of each slot of a shared-memory ring, read and written with
//! atomics.
//!
//! A DataLoader worker writes a batch into a free slot, then marks it held; the training
//! process reads the batch in place through a [`HeldSlot`], whose end marks the slot free. The
//! orderings make this safe on any CPU: the worker's writes come after an acquire load that saw
//! "free", and the training process's last read comes before a release store of "free".
//! Python has no atomics, hence this.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyRuntimeError, PyValueError};
use pyo3::ffi;
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

    /// The ``length`` bytes of ``memory`` from ``start`` on, which hold held ``slot``'s batch,
    /// as a writable buffer that frees the slot when it is gone (so once every tensor made from
    /// it is gone).
    fn lend(slf: Bound<'_, Self>, slot: usize, start: usize, length: usize) -> PyResult<HeldSlot> {
        let this = slf.get();
        if this.state(slot)?.load(Ordering::Acquire) != HELD {
            return Err(PyRuntimeError::new_err(format!(
                "batch ring slot {slot} was sent but not written"
            )));
        }
        let header = this.slots * 4;
        let fits = start >= header
            && start
                .checked_add(length)
                .is_some_and(|end| end <= this.memory.len_bytes());
        if !fits {
            return Err(PyValueError::new_err(format!(
                "bytes {start}..+{length} are not in the slots of a {}-byte ring",
                this.memory.len_bytes()
            )));
        }
        Ok(HeldSlot {
            states: slf.unbind(),
            slot,
            start,
            length: length as ffi::Py_ssize_t,
        })
    }
}

/// A held slot's batch bytes in the training process, lent without a copy: a writable
/// one-dimensional byte buffer. The slot goes back to its worker when this object is gone.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct HeldSlot {
    states: Py<SlotStates>,
    slot: usize,
    start: usize,
    /// The view's shape points here (this object outlives every view of it).
    length: ffi::Py_ssize_t,
}

#[pymethods]
impl HeldSlot {
    fn __len__(&self) -> usize {
        self.length as usize
    }

    /// Exports the bytes, writable, as `memoryview` and `torch.frombuffer` expect.
    ///
    /// # Safety
    /// Called by the interpreter with a valid `view`; the exported pointers stay valid while
    /// `view.obj` (a new reference to this object, which keeps the ring's memory mapped and
    /// the slot held) lives.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no buffer view to fill"));
        }
        let this = slf.get();
        // `lend` checked that the range lies inside the memory.
        let buf = this.states.get().memory.buf_ptr().cast::<u8>();
        // SAFETY: `view` is non-null and ours to fill; `shape` points into this object (the
        // view's `obj`), which outlives the view; the format is a static string; the bytes stay
        // mapped while `states` holds the memory's buffer, and no worker writes them while the
        // slot is held.
        unsafe {
            (*view).buf = buf.add(this.start).cast::<c_void>();
            (*view).len = this.length;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                std::ptr::addr_of!(this.length).cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = std::ptr::null_mut();
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        // Every view of the bytes is gone (each held a reference to this object): the slot is
        // its worker's again, after every read of it.
        if let Ok(state) = self.states.get().state(self.slot) {
            state.store(FREE, Ordering::Release);
        }
    }
}
