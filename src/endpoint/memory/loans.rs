//! Who may touch a `Local` region's bytes now: the holds of this endpoint's operations, the
//! slices lent out ([`MemoryRegion::as_slice`]) and the copies (`read_bytes`), kept in the
//! memory's access word (`access.rs`) and two counters beside it, on the registration that owns
//! the memory (its keeper).
//!
//! Fairness: a post that finds copies lent waits for them to end, and refuses new loans while it
//! waits; a post that finds a slice lent answers `Busy` at once (a slice lives as long as the
//! application keeps it). See `hold`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(doc)]
use super::MemoryRegion;
use super::registration::{OperationHold, Registration};
use crate::error::DmaError;

impl Registration {
    /// Hold the memory for one operation, until the returned hold drops (when the operation's
    /// completion has been read).
    ///
    /// While `read_bytes` copies are lent (and no slice), the poster waits for them to end
    /// rather than answer `Busy`: a copy ends once its bytes are copied, and while the poster
    /// waits new loans, copies and slices alike, are refused, so readers that keep copying
    /// cannot keep it out. A slice lent ([`MemoryRegion::as_slice`]) lives as long as the
    /// application keeps it, so the poster does not wait for one.
    ///
    /// # Errors
    /// [`DmaError::Busy`] while a slice of the memory is lent out ([`MemoryRegion::as_slice`]):
    /// nothing is held then.
    pub(crate) fn hold(self: &Arc<Self>) -> Result<OperationHold, DmaError> {
        let counted = self.lends_slices();
        if counted && !self.keeper().access.try_hold() {
            self.keeper().wait_out_copies()?;
        }
        Ok(OperationHold {
            region: Arc::clone(self),
            counted,
        })
    }

    /// Hold the memory once the copies lent now have ended, refusing new loans meanwhile;
    /// `Busy` as soon as a slice is lent. On the keeper.
    ///
    /// Bounded: `posters_waiting` is raised before the first look at `slices`, and a slice
    /// raises `slices` before its look at `posters_waiting` (all `SeqCst`), so of a slice and a
    /// poster that start at once, one sees the other: the slice backs out, or the poster answers
    /// `Busy`. The poster waits only for copies, each a `memcpy` of at most the region, and for
    /// as many as were lent before it raised `posters_waiting` (a copy checks it first).
    fn wait_out_copies(&self) -> Result<(), DmaError> {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.posters_waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.posters_waiting);
        loop {
            if 0 != self.slices.load(Ordering::SeqCst) {
                return Err(DmaError::Busy);
            }
            if self.access.try_hold() {
                return Ok(());
            }
            std::thread::yield_now();
        }
    }

    /// Lend one shared slice ([`MemoryRegion::as_slice`]): [`DmaError::Busy`] while an operation
    /// holds the memory or a poster waits for it.
    pub(crate) fn lend_slice(&self) -> Result<(), DmaError> {
        let keeper = self.keeper();
        keeper.slices.fetch_add(1, Ordering::SeqCst);
        if 0 == keeper.posters_waiting.load(Ordering::SeqCst) && keeper.access.try_lend() {
            return Ok(());
        }
        keeper.slices.fetch_sub(1, Ordering::SeqCst);
        Err(DmaError::Busy)
    }

    /// Give back a slice lent by [`lend_slice`](Self::lend_slice).
    pub(crate) fn return_slice(&self) {
        let keeper = self.keeper();
        keeper.access.return_lend();
        keeper.slices.fetch_sub(1, Ordering::SeqCst);
    }

    /// Lend the memory for one copy (`read_bytes`): [`DmaError::Busy`] while an operation holds
    /// it or a poster waits for it.
    pub(crate) fn lend_copy(&self) -> Result<(), DmaError> {
        let keeper = self.keeper();
        if 0 == keeper.posters_waiting.load(Ordering::SeqCst) && keeper.access.try_lend() {
            Ok(())
        } else {
            Err(DmaError::Busy)
        }
    }

    /// Give back a loan of [`lend_copy`](Self::lend_copy).
    pub(crate) fn return_copy(&self) {
        self.keeper().access.return_lend();
    }

    /// Whether an operation holds the memory now (Acquire: when not, every completed
    /// operation's bytes are visible).
    pub(crate) fn operations_hold(&self) -> bool {
        self.keeper().access.held()
    }
}
