//! Who may touch a `Local` region's bytes now: this endpoint's operations, or the slices it lent
//! out, never both.
//!
//! One atomic word counts both: slices lent in the low 32 bits, operations holding the memory in
//! the high 32. An operation adds itself first and then looks at the slices' half of the value it
//! replaced, backing out if it is not zero; a slice is added by a compare-exchange only onto a
//! value whose operations' half is zero. Every change is a read-modify-write of one location, so
//! they have one order: of a slice and an operation that start at once, the later one sees the
//! earlier one and backs out (both may fail; neither ever proceeds alongside the other). The adds and the
//! subtractions that end a hold or a loan are `AcqRel`/`Release`, and the adds that start one are
//! `AcqRel`, so whatever an operation did to the bytes (its completion read, then its hold
//! released) happens before a slice lent after it, and a slice's reads happen before an
//! operation posted after it is returned.
//!
//! Bounds: at most 2^32 - 1 slices and 2^32 - 1 operations at once. Operations are bounded by
//! the slab ([`MAX_OPERATIONS`](super::rma::MAX_OPERATIONS)); slices by `u32`: a lend that
//! would reach 2^32 is refused.
//!
//! `loom_tests/tests/lent_or_held.rs` checks the protocol under loom (the atomics come from
//! `crate::sync`): a slice's reads and an operation's writes of one cell never overlap.

use crate::sync::atomic::{AtomicU64, Ordering};

/// One slice lent.
const SLICE: u64 = 1;
/// One operation holding the memory.
const OPERATION: u64 = 1 << 32;
/// The slices' half.
const SLICES: u64 = OPERATION - 1;

/// The access word of one `Local` region: see the [module docs](self).
#[derive(Debug)]
pub struct AccessWord(AtomicU64);

impl Default for AccessWord {
    fn default() -> Self {
        Self::new()
    }
}

impl AccessWord {
    /// Nothing lent, nothing held.
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Hold the memory for one operation, unless a slice is lent: `false` then, and nothing
    /// changed.
    pub fn try_hold(&self) -> bool {
        if 0 != self.0.fetch_add(OPERATION, Ordering::AcqRel) & SLICES {
            self.0.fetch_sub(OPERATION, Ordering::Release);
            return false;
        }
        true
    }

    /// One more hold, for a caller that holds one already (so no slice can be lent).
    pub fn add_hold(&self) {
        self.0.fetch_add(OPERATION, Ordering::AcqRel);
    }

    /// End one hold: the operation's completion has been read.
    pub fn release_hold(&self) {
        self.0.fetch_sub(OPERATION, Ordering::Release);
    }

    /// Lend one slice, unless an operation holds the memory (or 2^32 - 1 slices are lent):
    /// `false` then, and nothing changed.
    pub fn try_lend(&self) -> bool {
        // A compare-exchange rather than an add: the slices' half must never carry into the
        // operations' (2^32 slices forgotten, `mem::forget`, would otherwise read as a hold).
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            if 0 != current & !SLICES || SLICES == current & SLICES {
                return false;
            }
            match self.0.compare_exchange_weak(
                current,
                current + SLICE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// Return one slice.
    pub fn return_lend(&self) {
        self.0.fetch_sub(SLICE, Ordering::Release);
    }

    /// Whether an operation holds the memory now. When it answers `false`, every operation that
    /// held it before has been released, and what it did is visible (Acquire).
    pub fn held(&self) -> bool {
        0 != self.0.load(Ordering::Acquire) & !SLICES
    }
}
