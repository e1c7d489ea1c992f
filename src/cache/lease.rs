//! Leases: an owned hold on an entry that keeps its `fi_av_remove` back for as long as an
//! operation posted against it may still be in flight.
//!
//! A pin covers *posting*. An RDMA write, read or send stays in flight after the post returns,
//! until its completion is read, often on another thread; fi_av(3) leaves "operations in progress
//! that reference the removed addresses" undefined, and providers really do free them without a
//! completion (efa RDM) or cancel them (rxm with `FI_AV_REMOVE_CLEANUP=1`). A [`Lease`] holds the
//! entry until it is dropped, which the completion path does once the completion has been read.
//!
//! # Guarantees
//!
//! - While a `Lease` lives, its `fi_addr_t` maps in the AV to the address it was resolved for: the
//!   entry's `fi_av_remove` does not run, and so neither does (on efa) the insert of a newer
//!   incarnation parked behind it.
//! - A plain `resolve` pays nothing for leases: the counters are touched only by taking and
//!   dropping a lease.
//!
//! # How
//!
//! One counter per AV index, allocated up front and sized to the AV's capacity (`FI_AV_TABLE`
//! hands out indices below the count it was opened with, and the writer refuses any other). Taking
//! a lease increments the index's counter; dropping it decrements it. The writer removes a retired
//! entry only after both of these, whichever comes later:
//!
//! 1. every reader pinned at its unlink has unpinned (the epoch deferral, argued in the `cache` module and its writer);
//! 2. its index's counter reads zero.
//!
//! # Ordering
//!
//! - **No lease is missed.** A lease is taken only under a live pin that could see the entry:
//!   [`Pinned::lease`](super::Pinned::lease) takes a [`Peer`], which borrows a pin of
//!   this thread (a `Pinned` is not `Send`), so that pin is unpinned after the increment in
//!   program order. The writer reads the counter only after the deferred closure of the unlink has
//!   run, which crossbeam-epoch runs only after every participant pinned at the unlink has
//!   unpinned: the unpin is a `Release` store that the collector reads before it runs the closure
//!   (behind an `Acquire` fence), and the closure hands the ticket to the writer through a
//!   channel. So the increment happens before the writer's read, and a `Relaxed` increment
//!   suffices. After that point no new lease can be taken on the entry: every pin that could see
//!   it has gone, and a later pin cannot find it.
//! - **No removal under an operation in flight.** Dropping a lease decrements with `Release`; the
//!   writer reads the counter with `Acquire` and removes only at zero. So everything the lease's
//!   holder did before dropping it (reading the operation's completion) happens before
//!   `fi_av_remove`.
//! - **Counters are exact per index.** An index's counter is zero whenever the index is removed
//!   (rule 2), so a lease on a later entry at the same index starts from zero; a revived entry
//!   keeps its index and so its leases.
//!
//! # Why a borrow and not an `Arc`
//!
//! A `Lease<'cache>` borrows its cache. An `Arc` would make it `'static` but put a contended
//! reference-count write on every operation, on one cache line shared by every posting thread;
//! the borrow costs nothing and makes dropping the cache while leases are out impossible (the
//! borrow checker refuses it), so no lease can outlive the AV it points into. Code that must store
//! leases beyond a scope (a completion queue's contexts) keeps them beside the cache it borrows,
//! as the endpoint does. `benches/hit.rs` measures both (`lease round` and `lease round + Arc`).

use super::Peer;
use crate::error::DmaError;
use crate::sync::atomic::{AtomicU32, Ordering};
use crate::sys::fi_addr_t;

/// One lease counter per AV index.
pub(crate) struct LeaseCounts {
    counts: Box<[AtomicU32]>,
}

impl LeaseCounts {
    /// Counters for indices `0..capacity`.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            counts: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
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

    /// Take one lease on `fi_addr`.
    pub(crate) fn acquire(&self, fi_addr: fi_addr_t) -> Result<&AtomicU32, DmaError> {
        let Some(count) = self.slot(fi_addr) else {
            return Err(DmaError::InvalidArgument(format!(
                "index {fi_addr} is outside this cache's address vector"
            )));
        };
        // Relaxed: see the module docs (the pin the caller holds orders it before the writer's
        // read).
        let before = count.fetch_add(1, Ordering::Relaxed);
        if before >= u32::MAX / 2 {
            count.fetch_sub(1, Ordering::Relaxed);
            return Err(DmaError::InvalidArgument(format!(
                "too many leases on index {fi_addr}"
            )));
        }
        Ok(count)
    }

    /// Whether any lease on `fi_addr` is out. Writer only, after the entry's readers are gone.
    pub(crate) fn held(&self, fi_addr: fi_addr_t) -> bool {
        // Acquire: pairs with the Release of `Lease::drop`.
        self.slot(fi_addr)
            .is_some_and(|count| 0 < count.load(Ordering::Acquire))
    }

    /// How many leases are out now, over every index.
    pub(crate) fn total(&self) -> u64 {
        self.counts
            .iter()
            .map(|count| u64::from(count.load(Ordering::Relaxed)))
            .sum()
    }
}

/// An owned hold on a cache entry: while it lives, the entry's `fi_av_remove` does not run, and
/// its `fi_addr_t` keeps mapping to the address it was resolved for. Hold one for every operation
/// that is in flight after its post returns, and drop it once the operation's completion has been
/// read. See the [module docs](self).
///
/// A lease is `Send` and `Sync`: a completion thread drops it. It borrows the cache, so the cache
/// (and the endpoint that owns it) cannot be dropped while a lease is out.
///
/// ```
/// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
///
/// let av = ModelAv::new(AddressFormat::Opaque);
/// let cache = AddressCache::with_backend(av.clone());
/// let pinned = cache.pin();
/// let peer = pinned.resolve(1, &[1; 16])?;
/// let lease = pinned.lease(peer)?;
/// drop(pinned);
///
/// cache.release(1);
/// cache.quiesce();
/// assert_eq!(Some(vec![1; 16]), av.lookup(lease.fi_addr()), "still in the AV");
/// assert_eq!(1, cache.stats().removals_awaiting_leases);
///
/// std::thread::scope(|scope| {
///     scope.spawn(move || drop(lease)); // a completion thread
/// });
/// cache.quiesce();
/// assert!(av.is_empty());
/// # Ok::<(), DmaError>(())
/// ```
///
/// The cache cannot be dropped while a lease on it is out:
///
/// ```compile_fail
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
///
/// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
/// let lease = cache.lease(1, &[1; 16]).unwrap();
/// drop(cache); // error: `cache` is borrowed by `lease`
/// let _ = lease.fi_addr();
/// ```
pub struct Lease<'cache> {
    fi_addr: fi_addr_t,
    cache: u64,
    count: &'cache AtomicU32,
}

impl<'cache> Lease<'cache> {
    pub(crate) fn new(fi_addr: fi_addr_t, cache: u64, count: &'cache AtomicU32) -> Self {
        Self {
            fi_addr,
            cache,
            count,
        }
    }

    /// The `fi_addr_t` to post against.
    #[inline]
    pub fn fi_addr(&self) -> fi_addr_t {
        self.fi_addr
    }

    /// The leased entry as a [`Peer`], to post against: valid while this lease lives.
    #[inline]
    pub fn peer(&self) -> Peer<'_> {
        Peer::new(self.fi_addr, self.cache)
    }
}

impl Clone for Lease<'_> {
    /// Another lease on the same entry, for a second operation in flight.
    fn clone(&self) -> Self {
        // Relaxed: this lease already holds the entry, so the writer cannot be between its read
        // and its removal (module docs).
        self.count.fetch_add(1, Ordering::Relaxed);
        Self {
            fi_addr: self.fi_addr,
            cache: self.cache,
            count: self.count,
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        // Release: whatever the holder did with the entry happens before the writer's Acquire
        // read that lets `fi_av_remove` run.
        self.count.fetch_sub(1, Ordering::Release);
    }
}

impl std::fmt::Debug for Lease<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Lease")
            .field("fi_addr", &self.fi_addr)
            .finish_non_exhaustive()
    }
}
