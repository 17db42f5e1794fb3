//! Values bound to the process that made them: a forked child neither uses nor drops them.
//!
//! `fork()` copies memory but only the forking thread. A client, a connection pool, a stream's
//! channel or a decoder's channel built in the parent may hold locks (tokio's scheduler,
//! hyper's pool, a channel's waker) that another parent thread held at that moment: in the
//! child those locks stay locked forever, and dropping the value (which wakes or closes
//! something) waits on them forever. So such values live in a [`ProcessBound`]: in another
//! process it hands out nothing, and dropping it there leaks the value instead (the memory of
//! a copy the child never asked for; the parent's own copy is untouched).

use std::mem::ManuallyDrop;

use crate::error::NativeError;

/// A value usable and droppable only in the process that created it.
pub struct ProcessBound<T> {
    owner: u32,
    value: ManuallyDrop<T>,
}

impl<T> ProcessBound<T> {
    pub fn new(value: T) -> Self {
        Self {
            owner: std::process::id(),
            value: ManuallyDrop::new(value),
        }
    }

    /// True in a process forked after this value was made.
    pub fn is_inherited(&self) -> bool {
        self.owner != std::process::id()
    }

    /// The value, in the process that made it.
    pub fn get(&self) -> Option<&T> {
        (!self.is_inherited()).then_some(&*self.value)
    }

    /// The value, in the process that made it.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        if self.is_inherited() {
            return None;
        }
        Some(&mut *self.value)
    }

    /// The value, or the error that says `what` was made before this process forked.
    pub fn in_this_process(&mut self, what: &str) -> Result<&mut T, NativeError> {
        self.get_mut().ok_or_else(|| {
            NativeError::Config(format!(
                "this {what} was opened before the process forked; open it again in this process"
            ))
        })
    }

    /// The value, in the process that made it; in another, None (and the value is leaked).
    pub fn into_inner(self) -> Option<T> {
        let mut this = ManuallyDrop::new(self);
        if this.is_inherited() {
            return None;
        }
        // SAFETY: `this` is never dropped, so the value is taken exactly once.
        Some(unsafe { ManuallyDrop::take(&mut this.value) })
    }
}

impl<T> Drop for ProcessBound<T> {
    fn drop(&mut self) {
        if !self.is_inherited() {
            // SAFETY: dropped once, here; `value` is never touched again.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}

impl<T> std::fmt::Debug for ProcessBound<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProcessBound(owner={})", self.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_owner_uses_and_drops_its_value() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut bound = ProcessBound::new(Counted(drops.clone()));
        assert!(!bound.is_inherited());
        assert!(bound.get().is_some() && bound.get_mut().is_some());
        drop(bound);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn another_process_neither_uses_nor_drops_it() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut bound = ProcessBound::new(Counted(drops.clone()));
        bound.owner = bound.owner.wrapping_add(1); // as seen from a forked child
        assert!(bound.is_inherited());
        assert!(bound.get().is_none() && bound.get_mut().is_none());
        drop(bound);
        assert_eq!(drops.load(Ordering::SeqCst), 0);
    }
}
