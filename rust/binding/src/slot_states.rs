//! `SlotStates`: who owns each slot of a shared-memory batch ring, read and written with
//! atomics (Python has none).
//!
//! A slot's state word is FREE, RETIRED, or a claim: an owner generation (a tag drawn from a
//! counter every process that maps the ring shares) and a phase:
//! - CLAIMED: a worker won the compare-and-swap from FREE and writes its batch there;
//! - SENT: the batch is written (release) and (slot, tag) is on its way to the training process;
//! - LENT: the training process took it (acquire) and reads it in place through a [`HeldSlot`],
//!   whose end makes the slot FREE again (release).
//!
//! Every step is a compare-and-swap from the exact word the step before left. So two workers
//! that both think they own a slot (two DataLoaders whose workers share a ring) cannot both
//! claim it, a message read twice lends nothing the second time, and a release of an older
//! generation (a stale reference, a dropped reservation) cannot free a newer claim.
//!
//! Once a ring's workers are gone the training process retires it: every slot not lent becomes
//! RETIRED and its pages go back to the system (`MADV_REMOVE`); a lent slot's pages go back
//! when its `HeldSlot` ends. A batch kept after its pass holds its own pages, not the ring's.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::buffer_view::{fill_view, OneDimension};

const FREE: u32 = 0;
const RETIRED: u32 = u32::MAX;
const CLAIMED: u32 = 1;
const SENT: u32 = 2;
const LENT: u32 = 3;
const PHASE: u32 = 3;
/// Generations run 1..=GENERATIONS (a tag is a generation shifted past the phase bits): the
/// largest lent word stays below RETIRED.
const GENERATIONS: u32 = (1 << 30) - 2;

/// The states of ``slots`` slots, 4 bytes each at the start of ``memory`` (a writable buffer,
/// e.g. an ``mmap`` shared with the workers, 4-byte aligned), then the generation counter;
/// slot ``i``'s bytes are ``slot_bytes`` from ``header + i * slot_bytes``.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct SlotStates {
    memory: PyBuffer<u8>,
    slots: usize,
    header: usize,
    slot_bytes: usize,
    /// Retired in this process (only the training process retires a ring).
    retired: AtomicBool,
}

impl SlotStates {
    fn word(&self, index: usize) -> &AtomicU32 {
        let first = self.memory.buf_ptr().cast::<u32>();
        // SAFETY: `new` checked that the buffer is writable, contiguous, 4-byte aligned and
        // holds `slots + 1` words; `memory` keeps it alive; callers pass `index <= slots`.
        // Other processes touch these words only through the same atomics.
        unsafe { AtomicU32::from_ptr(first.add(index)) }
    }

    fn state(&self, slot: usize) -> PyResult<&AtomicU32> {
        if slot >= self.slots {
            return Err(PyIndexError::new_err(format!(
                "slot {slot} of a ring of {} slots",
                self.slots
            )));
        }
        Ok(self.word(slot))
    }

    fn next_tag(&self) -> u32 {
        let drawn = self.word(self.slots).fetch_add(1, Ordering::Relaxed);
        (drawn % GENERATIONS + 1) << 2
    }

    /// Whether page ``page`` of the memory holds nothing but retired slots' bytes.
    fn page_unused(&self, page: usize, page_size: usize) -> bool {
        let low = page * page_size;
        let end = self.header + self.slots * self.slot_bytes;
        let high = (low + page_size).min(end);
        if low < self.header || low >= high {
            return false;
        }
        let first = (low - self.header) / self.slot_bytes;
        let last = (high - 1 - self.header) / self.slot_bytes;
        (first..=last.min(self.slots - 1))
            .all(|slot| self.word(slot).load(Ordering::Acquire) == RETIRED)
    }

    /// Returns to the system the pages of bytes ``low..high`` that hold only retired slots.
    fn release(&self, low: usize, high: usize) {
        let Some(page_size) = page_size() else {
            return;
        };
        let base = self.memory.buf_ptr() as usize;
        if !base.is_multiple_of(page_size) || self.slot_bytes == 0 {
            return; // not a mapping of its own: nothing to hand back
        }
        let mut run: Option<usize> = None;
        let last = high.div_ceil(page_size);
        for page in low / page_size..=last {
            let unused = page < last && self.page_unused(page, page_size);
            match (unused, run) {
                (true, None) => run = Some(page),
                (false, Some(first)) => {
                    let start = first * page_size;
                    let length = ((page * page_size).min(self.memory.len_bytes())) - start;
                    remove_pages(base + start, length);
                    run = None;
                }
                _ => {}
            }
        }
    }

    fn slot_range(&self, slot: usize) -> (usize, usize) {
        let start = self.header + slot * self.slot_bytes;
        (start, start + self.slot_bytes)
    }

    /// The end of a lent slot, in the process that lent it.
    fn give_back(&self, slot: usize, tag: u32) {
        let state = self.word(slot);
        if self.retired.load(Ordering::Acquire) {
            let retired = state
                .compare_exchange(tag | LENT, RETIRED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if retired {
                let (low, high) = self.slot_range(slot);
                self.release(low, high);
            }
        } else {
            // Fails, harmlessly, only for a claim that is not this one's.
            let _ = state.compare_exchange(tag | LENT, FREE, Ordering::Release, Ordering::Relaxed);
        }
    }
}

#[cfg(target_os = "linux")]
fn page_size() -> Option<usize> {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|size| *size > 0)
}

#[cfg(not(target_os = "linux"))]
fn page_size() -> Option<usize> {
    None
}

#[cfg(target_os = "linux")]
fn remove_pages(address: usize, length: usize) {
    if length == 0 {
        return;
    }
    // SAFETY: the range is whole pages of a mapping the caller holds, of slots nobody reads or
    // writes any more (retired); MADV_REMOVE frees their backing memory (they read as zeros).
    // A mapping that cannot (not shared memory) just keeps its pages.
    unsafe {
        libc::madvise(address as *mut c_void, length, libc::MADV_REMOVE);
    }
}

#[cfg(not(target_os = "linux"))]
fn remove_pages(_address: usize, _length: usize) {}

#[pymethods]
impl SlotStates {
    #[new]
    fn new(
        memory: &Bound<'_, PyAny>,
        slots: usize,
        header: usize,
        slot_bytes: usize,
    ) -> PyResult<Self> {
        let memory = PyBuffer::<u8>::get(memory)?;
        let fits = slots
            .checked_add(1)
            .and_then(|words| words.checked_mul(4))
            .is_some_and(|bytes| bytes <= header)
            && slots
                .checked_mul(slot_bytes)
                .and_then(|bytes| bytes.checked_add(header))
                .is_some_and(|bytes| bytes <= memory.len_bytes());
        if memory.readonly() || !memory.is_c_contiguous() || !fits {
            return Err(PyValueError::new_err(format!(
                "slot states need a writable contiguous buffer of a {header}-byte header (at \
                 least {slots} + 1 x 4 bytes) and {slots} x {slot_bytes} bytes"
            )));
        }
        if !(memory.buf_ptr() as usize).is_multiple_of(std::mem::align_of::<AtomicU32>()) {
            return Err(PyValueError::new_err(
                "slot states need a 4-byte aligned buffer",
            ));
        }
        Ok(SlotStates {
            memory,
            slots,
            header,
            slot_bytes,
            retired: AtomicBool::new(false),
        })
    }

    /// Whether ``slot`` is free (no one claims it).
    fn is_free(&self, slot: usize) -> PyResult<bool> {
        Ok(self.state(slot)?.load(Ordering::Acquire) == FREE)
    }

    /// Claims the first free slot of ``first``, ``first + 1``, ... within ``low..high``
    /// (wrapping round): ``(slot, tag)``, the slot then the caller's to write until it
    /// :meth:`send` or :meth:`unclaim` it with ``tag``; None if none is free.
    fn claim(&self, first: usize, low: usize, high: usize) -> PyResult<Option<(usize, u32)>> {
        if low >= high || high > self.slots || !(low..high).contains(&first) {
            return Err(PyIndexError::new_err(format!(
                "slots {low}..{high} from {first} of a ring of {} slots",
                self.slots
            )));
        }
        let tag = self.next_tag();
        for slot in (first..high).chain(low..first) {
            let claimed = self
                .word(slot)
                .compare_exchange(FREE, tag | CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if claimed {
                return Ok(Some((slot, tag)));
            }
        }
        Ok(None)
    }

    /// Gives back ``slot`` claimed with ``tag`` and not sent; False if that claim is not its
    /// state (sent, or retired).
    fn unclaim(&self, slot: usize, tag: u32) -> PyResult<bool> {
        let state = self.state(slot)?;
        Ok(state
            .compare_exchange(tag | CLAIMED, FREE, Ordering::Release, Ordering::Relaxed)
            .is_ok())
    }

    /// Marks ``slot``, claimed with ``tag``, sent: what was written to it before is complete
    /// for whoever lends it. False if that claim is not its state (the ring was retired): the
    /// batch must then go another way.
    fn send(&self, slot: usize, tag: u32) -> PyResult<bool> {
        let state = self.state(slot)?;
        Ok(state
            .compare_exchange(
                tag | CLAIMED,
                tag | SENT,
                Ordering::Release,
                Ordering::Relaxed,
            )
            .is_ok())
    }

    /// The first ``length`` bytes of ``slot``, sent with ``tag``, as a writable buffer that
    /// frees the slot when it is gone (so once every tensor made from it is gone). Each sent
    /// batch is lent once: RuntimeError for any other state.
    fn lend(slf: Bound<'_, Self>, slot: usize, tag: u32, length: usize) -> PyResult<HeldSlot> {
        let this = slf.get();
        if length > this.slot_bytes {
            return Err(PyValueError::new_err(format!(
                "{length} bytes do not fit a {}-byte slot",
                this.slot_bytes
            )));
        }
        let lent = this.state(slot)?.compare_exchange(
            tag | SENT,
            tag | LENT,
            Ordering::Acquire,
            Ordering::Relaxed,
        );
        if let Err(found) = lent {
            let what = match found & PHASE {
                _ if found == RETIRED => "the ring was retired",
                _ if found == FREE => "it is free",
                LENT if found & !PHASE == tag => "it was read already",
                CLAIMED if found & !PHASE == tag => "it was sent but not written",
                _ => "another claim holds it",
            };
            return Err(PyRuntimeError::new_err(format!(
                "batch ring slot {slot} cannot be read: {what}"
            )));
        }
        let start = this.header + slot * this.slot_bytes;
        Ok(HeldSlot {
            states: slf.unbind(),
            slot,
            tag,
            start,
            length: length as ffi::Py_ssize_t,
            process: std::process::id(),
        })
    }

    /// Retires the ring once no worker uses it any more: every slot not lent is retired and
    /// its pages go back to the system; a lent slot's go back when it ends.
    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
        for slot in 0..self.slots {
            let state = self.word(slot);
            let mut current = state.load(Ordering::Acquire);
            while current != RETIRED && current & PHASE != LENT {
                match state.compare_exchange(current, RETIRED, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => break,
                    Err(found) => current = found,
                }
            }
        }
        self.release(self.header, self.header + self.slots * self.slot_bytes);
    }

    /// Whether :meth:`retire` was called (in this process).
    #[getter]
    fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

/// A lent slot's batch bytes in the training process, without a copy: a writable
/// one-dimensional byte buffer. The slot goes back to its worker (or, in a retired ring, its
/// pages to the system) when this object is gone.
#[pyclass(module = "syvain_training_data._native", frozen)]
pub struct HeldSlot {
    states: Py<SlotStates>,
    slot: usize,
    tag: u32,
    start: usize,
    /// The view's shape points here (this object outlives every view of it).
    length: ffi::Py_ssize_t,
    /// The process that lent it: a forked child's copy gives nothing back.
    process: u32,
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
    /// the slot lent) lives.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        // `new` and `lend` checked that the slot's bytes lie inside the memory.
        let buf = this.states.get().memory.buf_ptr().cast::<u8>();
        let dimension = OneDimension {
            // SAFETY: inside the mapped memory (checked when the slot was lent).
            buf: unsafe { buf.add(this.start) }.cast(),
            items: &this.length,
            item_size: 1,
            format: c"B",
            writable: true,
            stride: None,
        };
        // SAFETY: `length` lives in this object (the view's `obj`), which outlives the view; the
        // bytes stay mapped while `states` holds the memory's buffer, and no worker writes them
        // while the slot is lent.
        unsafe { fill_view(slf.as_any().clone(), view, flags, dimension) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        // Every view of the bytes is gone (each held a reference to this object): the slot is
        // its worker's again, after every read of it; a stale or forked copy frees nothing.
        if self.process == std::process::id() {
            self.states.get().give_back(self.slot, self.tag);
        }
    }
}
