//! Leases: an owned hold on an entry that keeps its `fi_av_remove` back for as long as an
//! operation posted against it may still be in flight.
//!
//! What a user relies on (the guarantees, the bounds, why a lease borrows its cache) is on
//! [`Lease`]; this page keeps how the counters implement it, and why the orderings suffice.
//!
//! # How
//!
//! One counter per AV index, allocated up front and sized to the AV's capacity (`FI_AV_TABLE`
//! hands out indices below the count it was opened with, and the writer refuses any other). Taking
//! a lease increments the index's counter; dropping it decrements it. The writer removes a retired
//! entry only after both of these, whichever comes later:
//!
//! 1. every reader pinned at its unlink has unpinned (the epoch deferral, argued in the `cache`
//!    module and its writer);
//! 2. its index's counter reads zero.
//!
//! When the writer finds leases out at step 2, it sets the counter's top bit (`AWAITED`) and
//! forgets the entry until the lease that takes the count to zero tells it: that drop sees the
//! bit in the value its decrement returns, sets the index's bit in a bitmap sized to the capacity
//! and rings the writer's doorbell. So a removal held by leases costs the writer nothing while it
//! waits (no rescans, whatever else is queued), and exactly one drop reports it. Half the
//! counter's range lies between its ceiling (`LEASE_LIMIT`, 2³⁰) and `AWAITED`, so clones racing
//! past the ceiling cannot reach the bit (`lease_counts.rs`).
//!
//! # Ordering
//!
//! - **No lease is missed.** A lease is taken only under a live pin that could see the entry:
//!   [`Pinned::lease`](super::Pinned::lease) takes a [`Peer`], which borrows a pin of
//!   this thread (a `Pinned` is not `Send`), so that pin is unpinned after the increment in
//!   program order. The writer reads the counter only after the deferred closure of the unlink has
//!   run, which crossbeam-epoch runs only after every participant pinned at the unlink has
//!   unpinned: the unpin is a `Release` store that the collector reads before it runs the closure
//!   (behind an `Acquire` fence), and the closure then sets a flag the writer reads with
//!   `Acquire`. So the increment happens before the writer's read, and a `Relaxed` increment
//!   suffices. After that point no new lease can be taken on the entry: every pin that could see
//!   it has gone, and a later pin cannot find it.
//! - **No removal under an operation in flight.** Dropping a lease decrements with `Release`; the
//!   writer reads the counter with `Acquire` and removes only at zero. So everything the lease's
//!   holder did before dropping it (reading the operation's completion) happens before
//!   `fi_av_remove`.
//! - **Counters are exact per index.** An index's counter is zero whenever the index is removed
//!   (rule 2), and the writer clears `AWAITED` then, so a lease on a later entry at the same index
//!   starts from zero; a revived entry keeps its index and so its leases (the writer clears
//!   `AWAITED` on revival, and ignores a report that arrives for an entry that is live again).
//! - **No report is lost.** The writer sets `AWAITED` with a read-modify-write that returns the
//!   count: if that count is already zero, the last lease went before it could see the bit, and
//!   the writer removes at once; otherwise the decrement that reaches zero returns `AWAITED | 1`.
//!   The dropper sets the index's bit, then its word's summary bit, then a dirty flag, each
//!   `Release`; the writer swaps them back in the opposite order with `Acquire`, so a bit is never
//!   hidden under a flag already cleared.

use super::Peer;
use super::shared::SharedState;
use dma_libfabric_sys::fi_addr_t;

/// An owned hold on a cache entry: while it lives, the entry's `fi_av_remove` does not run, and
/// its `fi_addr_t` keeps mapping to the address it was resolved for. Hold one for every operation
/// that is in flight after its post returns, and drop it once the operation's completion has been
/// read.
///
/// A [`Pinned`](super::Pinned) guard covers *posting*. An RDMA write, read or send stays in
/// flight after the post returns, until its completion is read, often on another thread; fi_av(3)
/// leaves "operations in progress that reference the removed addresses" undefined, and providers
/// really do free them without a completion (efa RDM) or cancel them (rxm with
/// `FI_AV_REMOVE_CLEANUP=1`). A lease holds the entry until it is dropped, which the completion
/// path does once the completion has been read. The endpoint's RMA calls take a lease with each
/// operation and drop it when they read its completion (a copying send holds none: see
/// [`LibfabricEndpoint`](crate::endpoint::LibfabricEndpoint), "Guarantees"); code that posts
/// through the raw bindings itself holds its own.
///
/// # Guarantees
///
/// - While a lease lives, its `fi_addr_t` maps in the AV to the address it was resolved for: the
///   entry's `fi_av_remove` does not run, and so neither does (on efa) the insert of a newer
///   incarnation parked behind it. A `release` or an eviction meanwhile retires the entry, and its
///   removal runs once the last lease on it has gone
///   ([`CacheStats::removals_awaiting_leases`](super::CacheStats::removals_awaiting_leases) counts
///   the removals waiting so).
/// - Everything the holder did before dropping the lease (reading the operation's completion)
///   happens before that `fi_av_remove`.
/// - A plain `resolve` pays nothing for leases: the counters are touched only by taking and
///   dropping a lease. Taking one is an increment of the index's own counter, and dropping it a
///   decrement: no lock, no allocation.
/// - A lease is `Send` and `Sync`: a completion thread drops it.
///
/// # Bounds
///
/// - At most 2³⁰ leases on one index: taking one more is refused with
///   [`DmaError::InvalidArgument`](crate::error::DmaError::InvalidArgument), and
///   [`Lease::clone`] aborts past it, as `Arc::clone` does (a clone cannot fail, and only leaked
///   clones get there). So a counter never wraps, a lease's index is never removed while the
///   lease lives, and a counter never goes below zero.
/// - Memory is fixed when the cache is built: 4 bytes and a bit per index of the AV's capacity,
///   whatever the number of leases.
///
/// # Why a borrow and not an `Arc`
///
/// A `Lease<'cache>` borrows its cache, so the cache (and the endpoint that owns it) cannot be
/// dropped while a lease is out: the borrow checker refuses it (below), and no lease can outlive
/// the AV it points into. An `Arc` would make it `'static`, but put a contended reference-count
/// write on every operation, on one cache line shared by every posting thread; the borrow costs
/// nothing. Code that must store leases beyond a scope (a completion queue's contexts) keeps them
/// beside the cache they borrow, as the endpoint does. `benches/hit.rs` measures both
/// (`lease_round` and `lease_round_arc`).
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
    /// The client it was taken for.
    client: u64,
    shared: &'cache SharedState,
}

impl<'cache> Lease<'cache> {
    /// A lease on `fi_addr`, whose counter the caller has just incremented.
    pub(crate) fn new(
        fi_addr: fi_addr_t,
        cache: u64,
        client: u64,
        shared: &'cache SharedState,
    ) -> Self {
        Self {
            fi_addr,
            cache,
            client,
            shared,
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
        Peer::new(self.fi_addr, self.cache, self.client)
    }

    /// The client it was taken for (see [`Peer::client`]).
    #[inline]
    pub fn client(&self) -> u64 {
        self.client
    }
}

impl Clone for Lease<'_> {
    /// Another lease on the same entry, for a second operation in flight.
    ///
    /// # Aborts
    /// If this index already has more than 2³⁰ leases out, which only leaking clones
    /// (`std::mem::forget`) can reach: as `Arc::clone` does, rather than let the counter wrap to
    /// zero under a live lease.
    fn clone(&self) -> Self {
        self.shared.leases.add(self.fi_addr);
        Self::new(self.fi_addr, self.cache, self.client, self.shared)
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.shared
            .leases
            .release(self.fi_addr, &self.shared.doorbell);
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
