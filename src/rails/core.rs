//! The rail logic that does not care what the caches sit on: [`RailCaches`] over any
//! [`AvBackend`] (the model AV in tests), and the same code under [`RailSet`](super::RailSet).
//!
//! A rail is anything that has an [`AddressCache`]: the cache itself, or a
//! [`LibfabricEndpoint`], whose cache is its AV's. [`RailCore`] holds the rails, the hooks through
//! which an efa eviction on one rail releases the client on all the others, and the calls that act
//! on every rail: pin, lease, release, quiesce. See [`RailSet`](super::RailSet) for the ordering.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::MAX_RAILS;
use super::resolve::{RailLease, RailsPinned};
use super::shape::{Rails, Shape, address_for, check_addresses};
use crate::av::{AvBackend, FabricAv};
use crate::cache::{AddressCache, Pinned, ReleaseQueue};
use crate::endpoint::LibfabricEndpoint;
use crate::error::DmaError;

/// What the rail logic needs of one rail: its cache.
pub(crate) trait RailCache: Sync {
    /// The cache's AV backend.
    type Backend: AvBackend;
    /// The rail's cache.
    fn cache(&self) -> &AddressCache<Self::Backend>;
}

impl<B: AvBackend> RailCache for AddressCache<B> {
    type Backend = B;
    fn cache(&self) -> &AddressCache<B> {
        self
    }
}

impl RailCache for LibfabricEndpoint {
    type Backend = FabricAv;
    fn cache(&self) -> &AddressCache<FabricAv> {
        self.peers()
    }
}

/// How many clients an efa eviction on one rail has released on every other rail.
///
/// There is no queue: each rail's cache calls its eviction hook on its writer thread, and the
/// hook queues the client's release straight into every other rail's inbox without waiting
/// ([`ReleaseQueue::try_release`]). A full inbox answers `false`, and the evicting writer keeps
/// the client (once) and hands it to the hook again every round until every rail took it. So
/// nothing here grows, whether or not anyone calls the rail set, and no lock is taken on a
/// writer thread.
#[derive(Default)]
pub(crate) struct Evictions {
    propagated: AtomicU64,
}

impl Evictions {
    /// On rail `rail`'s writer: queue `client`'s release on every rail of `queues` but `rail`;
    /// whether all took it (those that did take it again on the retry: a repeated release is
    /// harmless).
    fn propagate(&self, queues: &[ReleaseQueue], rail: usize, client: u64) -> bool {
        let mut taken = true;
        for (other, queue) in queues.iter().enumerate() {
            if other != rail {
                taken &= queue.try_release(client);
            }
        }
        if taken {
            self.propagated.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }
}

/// The rails, and what acts on all of them.
pub(crate) struct RailCore<T: RailCache> {
    /// Rail 0 first. Dropped last to first (see `Drop`).
    rails: Vec<T>,
    shape: Shape,
    evictions: Arc<Evictions>,
}

impl<T: RailCache> RailCore<T> {
    /// Rails over `rails`, with every cache's eviction hook set to queue for the others.
    pub(crate) fn new(rails: Vec<T>) -> Result<Self, DmaError> {
        if rails.is_empty() || rails.len() > MAX_RAILS {
            return Err(DmaError::InvalidArgument(format!(
                "a rail set has 1 to {MAX_RAILS} rails, not {}",
                rails.len()
            )));
        }
        for (at, rail) in rails.iter().enumerate() {
            if rails[..at]
                .iter()
                .any(|other| std::ptr::eq(other.cache(), rail.cache()))
            {
                return Err(DmaError::InvalidArgument(
                    "a cache appears twice among the rails".into(),
                ));
            }
        }
        let evictions = Arc::new(Evictions::default());
        let queues: Arc<[ReleaseQueue]> = rails
            .iter()
            .map(|rail| rail.cache().release_queue())
            .collect();
        for (at, rail) in rails.iter().enumerate() {
            let (evictions, queues) = (Arc::clone(&evictions), Arc::clone(&queues));
            if !rail.cache().on_eviction(Box::new(move |client| {
                evictions.propagate(&queues, at, client)
            })) {
                return Err(DmaError::InvalidArgument(
                    "a cache already belongs to a rail set".into(),
                ));
            }
        }
        let mut address_lens = [0; MAX_RAILS];
        for (len, rail) in address_lens.iter_mut().zip(&rails) {
            *len = rail.cache().address_len();
        }
        Ok(Self {
            shape: Shape {
                count: rails.len(),
                address_lens,
            },
            rails,
            evictions,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.rails.len()
    }

    pub(crate) fn rail(&self, rail: usize) -> &T {
        &self.rails[rail]
    }

    pub(crate) fn rails(&self) -> &[T] {
        &self.rails
    }

    /// How many clients an eviction on one rail has released on every rail so far.
    pub(crate) fn evictions_propagated(&self) -> u64 {
        self.evictions.propagated.load(Ordering::Relaxed)
    }

    pub(crate) fn pin(&self) -> RailsPinned<'_> {
        RailsPinned::new(self)
    }

    /// Register `client` on every rail (waiting as [`AddressCache::lease`] does) and lease it
    /// there, all or nothing, waiting at most the patience of rail 0's cache in all: each rail
    /// waits for what is left of it, and a round that a release or eviction undid is tried again
    /// only while some is left.
    pub(crate) fn lease(
        &self,
        client: u64,
        addresses: &[&[u8]],
    ) -> Result<RailLease<'_>, DmaError> {
        check_addresses(&self.shape, addresses)?;
        let patience = self.rails[0].cache().patience();
        let started = std::time::Instant::now();
        loop {
            // Wait for every rail's registration first, holding no lease of our own while a rail
            // waits (a parked incarnation waits for leases; two threads each holding one rail's
            // lease and waiting on the other's rail would wait until their patience ran out).
            for (rail, cache) in self.rails.iter().enumerate() {
                let left = patience.saturating_sub(started.elapsed());
                if let Err(error) =
                    cache
                        .cache()
                        .lease_within(client, address_for(addresses, rail), left)
                {
                    self.release_everywhere(client);
                    return Err(error);
                }
            }
            // Then lease every rail under one pin of each: all hits unless a release or eviction
            // came in between, which the next round registers again.
            let pinned = self.pin();
            match pinned.resolve(client, addresses) {
                Ok(peers) => return pinned.lease(&peers),
                Err(DmaError::WouldBlock) if started.elapsed() < patience => continue,
                Err(DmaError::WouldBlock) => {
                    return Err(DmaError::OutOfPatience {
                        client,
                        leases: 0,
                        held_for: std::time::Duration::ZERO,
                    });
                }
                Err(error) => return Err(error),
            }
        }
    }

    pub(crate) fn release(&self, client: u64) {
        self.release_everywhere(client);
    }

    pub(crate) fn quiesce(&self) {
        // Twice at most: an eviction while quiescing queues releases on rails quiesced already,
        // which the second round applies.
        for _ in 0..2 {
            let before = self.evictions_propagated();
            for rail in &self.rails {
                rail.cache().quiesce();
            }
            if self.evictions_propagated() == before {
                break;
            }
        }
    }
}

impl<T: RailCache> Rails for RailCore<T> {
    fn count(&self) -> usize {
        self.rails.len()
    }

    fn pin_rail(&self, rail: usize) -> Option<Pinned<'_>> {
        self.rails.get(rail).map(|rail| rail.cache().pin())
    }

    fn shape(&self) -> &Shape {
        &self.shape
    }

    fn release_everywhere(&self, client: u64) {
        for rail in &self.rails {
            rail.cache().release(client);
        }
    }
}

impl<T: RailCache> Drop for RailCore<T> {
    /// Last rail first: a rail set's region is memory of rail 0's endpoint registered again on
    /// the others, so rail 0 closes after every other domain that may still reach it.
    fn drop(&mut self) {
        while let Some(rail) = self.rails.pop() {
            drop(rail);
        }
    }
}

/// The rail logic over caches of any backend: what [`RailSet`](super::RailSet) runs over its
/// endpoints' caches, here over caches you build, such as `ModelAv` ones with
/// efa's address rules. Pinning, resolving, leasing, releasing and quiescing behave exactly as on
/// a [`RailSet`](super::RailSet) (the same code runs); it has no endpoints, so no memory and no
/// RMA.
///
/// ```
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv, RailCaches};
///
/// let avs = [ModelAv::new(AddressFormat::Opaque), ModelAv::new(AddressFormat::Opaque)];
/// let rails = RailCaches::new(avs.iter().map(|av| AddressCache::with_backend(av.clone())).collect())?;
/// let addresses: [&[u8]; 2] = [&[1; 16], &[2; 16]];
/// let pinned = rails.pin();
/// let peers = pinned.resolve(7, &addresses)?;
/// assert_eq!(Some(vec![2; 16]), avs[1].lookup(peers.rail(1).fi_addr()));
/// drop(pinned);
/// rails.release(7);
/// rails.quiesce();
/// assert!(avs.iter().all(ModelAv::is_empty));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct RailCaches<B: AvBackend> {
    core: RailCore<AddressCache<B>>,
}

impl<B: AvBackend> std::fmt::Debug for RailCaches<B> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RailCaches")
            .field("rails", &self.core.len())
            .finish_non_exhaustive()
    }
}

impl<B: AvBackend> RailCaches<B> {
    /// Rails over `caches`, rail 0 first.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for no caches or more than [`MAX_RAILS`].
    pub fn new(caches: Vec<AddressCache<B>>) -> Result<Self, DmaError> {
        Ok(Self {
            core: RailCore::new(caches)?,
        })
    }

    /// How many rails.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Always `false`: a rail set has at least one rail.
    pub fn is_empty(&self) -> bool {
        0 == self.core.len()
    }

    /// Rail `rail`'s cache.
    ///
    /// # Panics
    /// If `rail >= len()`, as slice indexing does.
    pub fn rail(&self, rail: usize) -> &AddressCache<B> {
        self.core.rail(rail)
    }

    /// As [`RailSet::pin`](super::RailSet::pin).
    pub fn pin(&self) -> RailsPinned<'_> {
        self.core.pin()
    }

    /// As [`RailSet::lease`](super::RailSet::lease).
    ///
    /// # Errors
    /// As [`RailSet::lease`](super::RailSet::lease).
    pub fn lease(&self, client: u64, addresses: &[&[u8]]) -> Result<RailLease<'_>, DmaError> {
        self.core.lease(client, addresses)
    }

    /// As [`RailSet::release`](super::RailSet::release).
    pub fn release(&self, client: u64) {
        self.core.release(client);
    }

    /// As [`RailSet::quiesce`](super::RailSet::quiesce).
    pub fn quiesce(&self) {
        self.core.quiesce();
    }

    /// How many clients an efa eviction on one rail has released on every rail so far.
    pub fn evictions_propagated(&self) -> u64 {
        self.core.evictions_propagated()
    }
}
