//! The rail logic that does not care what the caches sit on: [`RailGroup`], which
//! [`RailCaches`](super::RailCaches) runs over any [`AvBackend`] (the model AV in tests) and
//! [`RailSet`](super::RailSet) over its endpoints.
//!
//! A rail is anything that has an [`AddressCache`]: the cache itself, or a
//! [`LibfabricEndpoint`], whose cache is its AV's. [`RailGroup`] holds the rails, the hooks through
//! which an efa eviction on one rail releases the client on all the others, and the calls that act
//! on every rail: pin, lease, release, quiesce; `forward_to_group!` writes the public calls that
//! forward to it once, for both public types. See [`RailSet`](super::RailSet) for the ordering.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::MAX_RAILS;
use super::resolve::{RailLease, RailPinned};
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
        LibfabricEndpoint::cache(self)
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
pub(crate) struct RailGroup<T: RailCache> {
    /// Rail 0 first. Dropped last to first (see `Drop`).
    rails: Vec<T>,
    shape: Shape,
    evictions: Arc<Evictions>,
}

impl<T: RailCache> RailGroup<T> {
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

    pub(crate) fn pin(&self) -> RailPinned<'_> {
        RailPinned::new(self)
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

impl<T: RailCache> Rails for RailGroup<T> {
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

impl<T: RailCache> Drop for RailGroup<T> {
    /// Last rail first: a rail set's region is memory of rail 0's endpoint registered again on
    /// the others, so rail 0 closes after every other domain that may still reach it.
    fn drop(&mut self) {
        while let Some(rail) = self.rails.pop() {
            drop(rail);
        }
    }
}

/// The calls that act on every rail at once, written once for [`RailSet`](super::RailSet) and
/// [`RailCaches`](super::RailCaches): each forwards to the [`RailGroup`] in the type's `group`
/// field. The type passes the type of one rail and the docs of the two calls that differ:
/// `rail` (an endpoint or a cache) and `lease` (whose example needs a real type).
macro_rules! forward_to_group {
    (
        rail: $rail:ty;
        $(#[$rail_doc:meta])*
        fn rail;
        $(#[$lease_doc:meta])*
        fn lease;
    ) => {
        /// How many rails.
        pub fn len(&self) -> usize {
            self.group.len()
        }

        /// Always `false`: a rail set has at least one rail.
        pub fn is_empty(&self) -> bool {
            0 == self.group.len()
        }

        $(#[$rail_doc])*
        pub fn rail(&self, rail: usize) -> &$rail {
            self.group.rail(rail)
        }

        /// Pin every rail's cache (see [`RailPinned`](super::RailPinned)). A client an efa
        /// eviction dropped on some rail is released on the others by the evicting writer itself
        /// ([`RailSet`](crate::rails::RailSet), guarantee 3).
        pub fn pin(&self) -> $crate::rails::RailPinned<'_> {
            self.group.pin()
        }

        $(#[$lease_doc])*
        pub fn lease(
            &self,
            client: u64,
            addresses: &[&[u8]],
        ) -> Result<$crate::rails::RailLease<'_>, $crate::error::DmaError> {
            self.group.lease(client, addresses)
        }

        /// Let go of `client` on every rail. Returns at once (see
        /// [`AddressCache::release`](crate::cache::AddressCache::release)).
        pub fn release(&self, client: u64) {
            self.group.release(client);
        }

        /// [`AddressCache::quiesce`](crate::cache::AddressCache::quiesce) on every rail, after
        /// releasing everywhere the clients an eviction dropped on one rail.
        pub fn quiesce(&self) {
            self.group.quiesce();
        }

        /// How many clients an efa eviction on one rail has released on every rail so far.
        pub fn evictions_propagated(&self) -> u64 {
            self.group.evictions_propagated()
        }
    };
}
pub(super) use forward_to_group;
