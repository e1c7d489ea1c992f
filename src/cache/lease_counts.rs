//! The lease counters: one per AV index, and the bitmap through which the last lease of an
//! awaited removal tells the writer. The guarantees and bounds are on [`Lease`](super::Lease),
//! the protocol in the [`lease`](super::lease) module; this file is the counters the writer and the leases share,
//! below both, so that neither imports the other.

use super::doorbell::Doorbell;
use crate::error::DmaError;
use crate::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use dma_libfabric_sys::fi_addr_t;

/// The low bits of a counter: how many leases are out.
const COUNT: u32 = AWAITED - 1;
/// The top bit of a counter: the writer is waiting for this index's last lease, and whoever drops
/// it tells the writer.
const AWAITED: u32 = 1 << 31;
/// The most leases one index may have out: [`Pinned::lease`](super::Pinned::lease) refuses to go
/// past it, and [`Lease::clone`] aborts the process past it, as `Arc::clone` does, since a clone
/// cannot fail. Half the counter's range lies between this and [`AWAITED`], so clones racing past
/// the bound on every thread of the process cannot reach the flag, let alone wrap.
pub(crate) const LEASE_LIMIT: u32 = 1 << 30;

/// One lease counter per AV index, and the bitmap through which the last lease of an awaited
/// index tells the writer.
///
/// Memory: 4 bytes a counter plus one bit (and 1/64 of a bit) of bitmap per index of the AV's
/// capacity, allocated once, whatever the leases do.
pub(crate) struct LeaseCounts {
    counts: Box<[AtomicU32]>,
    /// One bit per index whose last awaited lease has been dropped since the writer last looked.
    released: Box<[AtomicU64]>,
    /// One bit per word of `released` that may have a bit set.
    summary: Box<[AtomicU64]>,
    /// Whether any bit of `summary` may be set: the writer looks at the bitmap only then.
    dirty: AtomicBool,
}

impl LeaseCounts {
    /// Counters for indices `0..capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        let words = capacity.div_ceil(64);
        Self {
            counts: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            released: (0..words).map(|_| AtomicU64::new(0)).collect(),
            summary: (0..words.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            dirty: AtomicBool::new(false),
        }
    }

    /// Whether `fi_addr` has a counter: the writer admits no entry whose index does not.
    pub(crate) fn covers(&self, fi_addr: fi_addr_t) -> bool {
        self.slot(fi_addr).is_some()
    }

    fn slot(&self, fi_addr: fi_addr_t) -> Option<&AtomicU32> {
        usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.counts.get(index))
    }

    /// Take one lease on `fi_addr`, refusing past [`LEASE_LIMIT`].
    pub(crate) fn acquire(&self, fi_addr: fi_addr_t) -> Result<(), DmaError> {
        let Some(count) = self.slot(fi_addr) else {
            return Err(DmaError::InvalidArgument(format!(
                "index {fi_addr} is outside this cache's address vector"
            )));
        };
        // Relaxed: see the module docs (the pin the caller holds orders it before the writer's
        // read).
        let before = count.fetch_add(1, Ordering::Relaxed);
        if before & COUNT >= LEASE_LIMIT {
            // Not awaited (the caller's pin can still see the entry, so the writer has not begun
            // its removal), so this is never the awaited last lease.
            count.fetch_sub(1, Ordering::Relaxed);
            return Err(DmaError::InvalidArgument(format!(
                "{LEASE_LIMIT} leases are out on index {fi_addr} already"
            )));
        }
        Ok(())
    }

    /// One more lease on `fi_addr`, on which the caller holds one: [`Lease::clone`].
    pub(super) fn add(&self, fi_addr: fi_addr_t) {
        if let Some(count) = self.slot(fi_addr) {
            // Relaxed: the caller's lease already holds the entry, so the writer cannot be between
            // its read and its removal (module docs).
            let before = count.fetch_add(1, Ordering::Relaxed);
            if before & COUNT >= LEASE_LIMIT {
                // As `Arc::clone` does: the only way here is leaking clones (`mem::forget`), and
                // carrying on would let the counter reach the flag and then wrap to zero under a
                // live lease, after which the writer would remove the entry under it.
                std::process::abort();
            }
        }
    }

    /// Drop one lease on `fi_addr`; the last one of an awaited index tells the writer.
    pub(super) fn release(&self, fi_addr: fi_addr_t, doorbell: &Doorbell) {
        let Some(count) = self.slot(fi_addr) else {
            return;
        };
        // Release: whatever the holder did with the entry happens before the writer's Acquire
        // read that lets `fi_av_remove` run.
        let before = count.fetch_sub(1, Ordering::Release);
        if before == AWAITED | 1 {
            self.mark(fi_addr);
            doorbell.ring();
        }
    }

    /// Set `fi_addr`'s bit, then its word's summary bit, then the dirty flag: the writer clears
    /// them in the opposite order, so it never clears a flag above a bit it has not read.
    fn mark(&self, fi_addr: fi_addr_t) {
        let Ok(index) = usize::try_from(fi_addr) else {
            return;
        };
        let word = index / 64;
        if let (Some(released), Some(summary)) =
            (self.released.get(word), self.summary.get(word / 64))
        {
            released.fetch_or(1 << (index % 64), Ordering::Release);
            summary.fetch_or(1 << (word % 64), Ordering::Release);
            // An exchange rather than a store, as for the deferral's flag (see the writer).
            self.dirty.swap(true, Ordering::AcqRel);
        }
    }

    /// Whether leases on `fi_addr` are out. Writer only, after the entry's readers are gone: if
    /// they are, the index is marked awaited, so that the last one's drop tells the writer (see
    /// [`take_released`](Self::take_released)) and the writer need not look again until then.
    pub(crate) fn await_release(&self, fi_addr: fi_addr_t) -> bool {
        let Some(count) = self.slot(fi_addr) else {
            return false;
        };
        // Acquire: pairs with the Release of `Lease::drop`.
        if 0 == count.load(Ordering::Acquire) & COUNT {
            return false;
        }
        let before = count.fetch_or(AWAITED, Ordering::AcqRel);
        if 0 == before & COUNT {
            // The last lease went between the two reads, before it could see the flag: nobody
            // will tell, and nobody can take another (no pin can find the entry), so take the
            // flag back and remove now.
            count.fetch_and(!AWAITED, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Stop awaiting `fi_addr`: its entry was revived, or has been removed. Writer only. A bit
    /// its last lease set meanwhile is left for [`take_released`](Self::take_released), whose
    /// caller checks the entry's state.
    pub(crate) fn stop_awaiting(&self, fi_addr: fi_addr_t) {
        if let Some(count) = self.slot(fi_addr) {
            count.fetch_and(!AWAITED, Ordering::Relaxed);
        }
    }

    /// Whether a last awaited lease may have been dropped since the writer last looked.
    #[cfg_attr(dma_loom, allow(dead_code))] // the writer waits on its inbox under loom
    pub(crate) fn reported(&self) -> bool {
        self.dirty.load(Ordering::Relaxed)
    }

    /// Hand `each` every index whose last awaited lease was dropped since the last call. Writer
    /// only. Costs nothing unless a lease was released: one flag, then only the marked words.
    pub(crate) fn take_released(&self, mut each: impl FnMut(fi_addr_t)) {
        if !self.dirty.swap(false, Ordering::Acquire) {
            return;
        }
        for (high, summary) in self.summary.iter().enumerate() {
            let mut words = summary.swap(0, Ordering::Acquire);
            while words != 0 {
                let word = high * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                let mut bits = self
                    .released
                    .get(word)
                    .map_or(0, |released| released.swap(0, Ordering::Acquire));
                while bits != 0 {
                    let index = word * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    each(index as fi_addr_t);
                }
            }
        }
        // Acquire, for the counters the caller reads next: each was decremented before its bit
        // was set.
        fence(Ordering::Acquire);
    }

    /// How many leases are out on `fi_addr` now: what an [`OutOfPatience`] error reports.
    ///
    /// [`OutOfPatience`]: crate::error::DmaError::OutOfPatience
    pub(crate) fn count(&self, fi_addr: fi_addr_t) -> u64 {
        self.slot(fi_addr)
            .map_or(0, |count| u64::from(count.load(Ordering::Relaxed) & COUNT))
    }

    /// How many leases are out now, over every index: O(capacity) loads, no write. A shared
    /// total would put a write on a cache line every posting thread shares on every lease.
    pub(crate) fn total(&self) -> u64 {
        self.counts
            .iter()
            .map(|count| u64::from(count.load(Ordering::Relaxed) & COUNT))
            .sum()
    }

    /// Set `fi_addr`'s counter: for tests that reach [`LEASE_LIMIT`] without 2³⁰ real clones.
    #[cfg(any(test, feature = "model"))]
    pub(crate) fn force(&self, fi_addr: fi_addr_t, leases: u32) {
        if let Some(count) = self.slot(fi_addr) {
            // Keep the writer's flag: it is the writer's, not the count's.
            let _ = count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now & AWAITED | leases & COUNT)
            });
        }
    }
}
