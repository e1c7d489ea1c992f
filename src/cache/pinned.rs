//! A reader's side of the cache: [`Pinned`], the pin a posting thread holds across a batch of
//! posts, and [`Peer`], the `fi_addr_t` it resolved, which cannot outlive the pin.
//!
//! A pin holds an epoch (removals wait for it) and, from its first probe, papaya's guard on the
//! index (refreshed when the writer has changed the index: see `index`). The hit is here
//! ([`Pinned::hit`]): one relaxed load, one probe and one compare, no allocation, no lock, no
//! shared write.

use std::marker::PhantomData;

use super::index::{self, RegistrationIndex};
use super::lease::Lease;
use super::reply::{self, Outcome};
use super::stored::StoredAddress;
use super::writer::{Reply, Request};
use super::{ReaderSide, epoch};
use crate::error::DmaError;
use crate::sync::TrySendError;
use dma_libfabric_sys::fi_addr_t;

/// A reader's pin on a cache: the epoch that holds back removals, and papaya's guard on the
/// index's memory, taken at the pin's first probe and held across the rest, so a hit does not
/// pay for taking it.
///
/// Hold a pin for a batch of posts, not across a wait: while it lives, the writer removes no
/// entry from the AV that it could have seen, and until its next probe it holds back the index
/// nodes the writer retired (each probe lets go of what was retired since the one before, when
/// the writer has changed the index; a pin that sits while other threads release and revive
/// clients holds what each cycle retires until it probes or is dropped, measured in
/// `docs/guarantees.md`). Keep one pin of a cache at a time on a thread: papaya refreshes only a
/// thread's last guard, so while two pins of one cache live on one thread, neither's probes let
/// go of anything.
///
/// Neither `Send` nor `Sync`: a pin belongs to the thread that took it.
pub struct Pinned<'cache> {
    /// The table this pin probes and its guard on the table's memory, held across probes and
    /// moved on by [`hit`](Self::hit) alone. In a cell because `hit` takes `&self` (the peers it
    /// returns borrow the pin); the pin is neither `Send` nor `Sync` (its epoch guard is
    /// neither), so only its own thread reaches it. Declared before `epoch`, so it is dropped
    /// first: the table it points into may be freed once the epoch is unpinned.
    index: std::cell::UnsafeCell<<index::Index as RegistrationIndex>::Reader<'cache>>,
    /// Held for its `Drop`, which unpins: every `Peer` borrows this `Pinned`, so none outlives it.
    #[allow(dead_code)]
    epoch: epoch::EpochPin,
    /// The index itself, one load closer than through `reader_side`.
    registrations: &'cache index::Index,
    reader_side: &'cache ReaderSide,
}

impl std::fmt::Debug for Pinned<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Pinned").finish_non_exhaustive()
    }
}

impl<'cache> Pinned<'cache> {
    /// A pin of the cache whose reader side is `reader_side`: its epoch now, its index guard at its
    /// first probe.
    pub(super) fn new(reader_side: &'cache ReaderSide) -> Self {
        Self {
            index: std::cell::UnsafeCell::new(reader_side.shared.index.reader()),
            epoch: reader_side.epochs.pin(),
            registrations: &reader_side.shared.index,
            reader_side,
        }
    }

    /// The entry `client` posts to for `address`, inserting it through the writer on a miss and
    /// waiting for the writer's answer.
    ///
    /// A client re-advertising a different address lets go of its old entry. On efa, an address
    /// that only changes the QKEY of a slot others hold evicts them.
    ///
    /// # Errors
    /// - [`DmaError::InvalidAddress`] for an address of the wrong length or of all zero bytes;
    ///   nothing changes.
    /// - [`DmaError::Capacity`] when a new entry would exceed the AV's capacity; nothing changes.
    /// - [`DmaError::WouldBlock`] when the address is a new incarnation of a slot whose old one
    ///   must leave the AV first (see [`AddressCache`](super::AddressCache), "Why a resolve
    ///   under a pin can be told to wait"): resolve again under a later pin.
    /// - [`DmaError::Closed`] when the writer has stopped.
    /// - Whatever `fi_av_insert` returned, when it failed; nothing changes.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// let peer = pinned.resolve(1, &[1; 16])?; // a miss: the writer inserts it
    /// assert_eq!(peer, pinned.resolve(1, &[1; 16])?); // a hit
    /// assert!(matches!(pinned.resolve(1, &[1; 3]), Err(DmaError::InvalidAddress(_))));
    /// # Ok::<(), DmaError>(())
    /// ```
    #[inline]
    pub fn resolve(&self, client: u64, address: &[u8]) -> Result<Peer<'_>, DmaError> {
        if let Some(peer) = self.hit(client, address)? {
            return Ok(peer);
        }
        match reply::round_trip(
            |answer| self.reader_side.ask(client, address, Reply::Now(answer)),
            None,
            self.reader_side.requests.waiting(),
        ) {
            Outcome::Answered(fi_addr) => Ok(self.peer(fi_addr?, client)),
            // Without a deadline the answer always comes.
            Outcome::TimedOut => Err(DmaError::WouldBlock),
        }
    }

    /// The hit alone: the [`Peer`] for `client` at `address` if the index holds that
    /// registration now, `None` if it does not. Nothing is queued and nothing changes on a
    /// `None` (not even for an address the cache would refuse: that is a `None` too, and
    /// [`resolve`](Self::resolve) names the error). For a posting thread that wants to know
    /// whether it would miss before it decides what to do; on a miss, [`resolve`](Self::resolve)
    /// applies the miss itself when the writer's role is free, where a
    /// [`try_resolve`](Self::try_resolve) first would hand it to the background thread and then
    /// queue it a second time. Costs what a hit costs: no allocation, no lock, no shared write.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// assert!(pinned.probe(1, &[1; 16]).is_none(), "a miss, and nothing queued");
    /// let peer = pinned.resolve(1, &[1; 16])?;
    /// assert_eq!(Some(peer), pinned.probe(1, &[1; 16]));
    /// assert!(pinned.probe(1, &[2; 16]).is_none(), "another address is another registration");
    /// # Ok::<(), DmaError>(())
    /// ```
    #[inline]
    #[must_use]
    pub fn probe(&self, client: u64, address: &[u8]) -> Option<Peer<'_>> {
        // `hit` answers no error today; were it to, a probe says "not here", and resolve names it.
        self.hit(client, address).ok().flatten()
    }

    /// [`resolve`](Self::resolve) for many `(client, address)` pairs at once, for a server that
    /// learns of many clients together (after a restart, from a control plane): hits are probed
    /// here, and the misses go to the writer in chunks of at most 64, one request and one answer
    /// a chunk, so a connect storm of `n` new clients costs `n / 64` round trips instead of `n`.
    ///
    /// The results come back in request order, each as `resolve` would answer it: a bad address
    /// fails its own entry only, and an entry that must wait for an old incarnation's removal
    /// answers [`DmaError::WouldBlock`] (resolve it again under a later pin).
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// let peers = pinned.resolve_all(&[(1, &[1; 16]), (2, &[2; 3]), (3, &[3; 16])]);
    /// assert!(peers[0].is_ok() && peers[2].is_ok());
    /// assert!(matches!(peers[1], Err(DmaError::InvalidAddress(_))), "its own entry only");
    /// assert_eq!(2, cache.stats().entries);
    /// ```
    pub fn resolve_all(&self, requests: &[(u64, &[u8])]) -> Vec<Result<Peer<'_>, DmaError>> {
        let mut results: Vec<Result<Peer<'_>, DmaError>> = Vec::with_capacity(requests.len());
        // The misses, as the writer is asked them, and where each one's answer goes.
        let mut misses: Vec<(u64, StoredAddress)> = Vec::new();
        let mut positions: Vec<usize> = Vec::new();
        for (position, &(client, address)) in requests.iter().enumerate() {
            let probed = self.hit(client, address).and_then(|hit| match hit {
                Some(peer) => Ok(Some(peer)),
                None => self.reader_side.stored(address).map(|stored| {
                    misses.push((client, stored));
                    positions.push(position);
                    None
                }),
            });
            // A miss's place is filled in below, from its chunk's answer.
            results.push(match probed {
                Ok(Some(peer)) => Ok(peer),
                Ok(None) => Err(DmaError::Closed),
                Err(error) => Err(error),
            });
        }
        for (position, answer) in positions.iter().zip(self.reader_side.ask_chunks(&misses)) {
            if let (Some(slot), Some(&(client, _))) =
                (results.get_mut(*position), requests.get(*position))
            {
                *slot = answer.map(|fi_addr| self.peer(fi_addr, client));
            }
        }
        results
    }

    /// As [`resolve`](Self::resolve), but never blocks: a miss is queued for the writer and
    /// answers [`DmaError::WouldBlock`], which means *queued*: once the writer has applied it
    /// (after [`AddressCache::quiesce`](super::AddressCache::quiesce), say), a resolve under a later pin finds the entry.
    ///
    /// When the writer's inbox is full ([`AddressCache::INBOX_BOUND`](super::AddressCache::INBOX_BOUND)), nothing is queued and
    /// nothing changes: the answer is [`DmaError::Busy`], and a later `try_resolve` queues the
    /// miss once the writer has made room (or [`resolve`](Self::resolve) waits for room).
    ///
    /// # Errors
    /// - [`DmaError::WouldBlock`]: the miss was queued (see above).
    /// - [`DmaError::Busy`]: the inbox is full; nothing was queued.
    /// - [`DmaError::InvalidAddress`] for an address of the wrong length or of all zero bytes,
    ///   before anything is queued.
    /// - [`DmaError::Closed`] when the writer has stopped.
    /// - A queued miss that failed (a full AV, a failed `fi_av_insert`) is logged by the writer
    ///   and recorded: the next `try_resolve` of the same client and address returns that error
    ///   (once; the one after queues a new attempt), so a queued miss never answers `WouldBlock`
    ///   for ever.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let queued = loop {
    ///     match cache.pin().try_resolve(1, &[1; 16]).map(|peer| peer.fi_addr()) {
    ///         Err(DmaError::Busy) => continue, // nothing was queued: ask again
    ///         other => break other,
    ///     }
    /// };
    /// assert_eq!(Err(DmaError::WouldBlock), queued);
    /// cache.quiesce(); // the queued miss has been applied
    /// assert!(cache.pin().try_resolve(1, &[1; 16]).is_ok());
    /// ```
    #[inline]
    pub fn try_resolve(&self, client: u64, address: &[u8]) -> Result<Peer<'_>, DmaError> {
        if let Some(peer) = self.hit(client, address)? {
            return Ok(peer);
        }
        if let Some(error) = self.reader_side.shared.failures.take(client, address) {
            return Err(error);
        }
        match self.reader_side.requests.try_send(Request::Resolve {
            client,
            address: self.reader_side.stored(address)?,
            reply: Reply::Queued,
        }) {
            Ok(()) => Err(DmaError::WouldBlock),
            Err(TrySendError::Full) => Err(DmaError::Busy),
            Err(TrySendError::Disconnected) => Err(DmaError::Closed),
        }
    }

    /// A [`Lease`] on `peer`'s entry: it keeps the entry in the AV after this pin is dropped,
    /// until the lease itself is dropped. Take one for each operation that stays in flight after
    /// its post (an RDMA write or read, a send whose completion is read later), and drop it once
    /// the completion has been read.
    ///
    /// Costs one uncontended atomic add on a counter of the entry's own, and nothing to resolves
    /// that take no lease.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for a peer resolved through another cache.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let lease = {
    ///     let pinned = cache.pin();
    ///     let peer = pinned.resolve(1, &[1; 16])?;
    ///     pinned.lease(peer)? // outlives the pin
    /// };
    /// assert_eq!(1, cache.stats().leases);
    /// drop(lease);
    /// assert_eq!(0, cache.stats().leases);
    /// # Ok::<(), DmaError>(())
    /// ```
    #[inline]
    pub fn lease(&self, peer: Peer<'_>) -> Result<Lease<'cache>, DmaError> {
        if peer.cache != self.reader_side.id {
            return Err(DmaError::InvalidArgument(
                "the peer was resolved through another cache".into(),
            ));
        }
        self.reader_side.shared.leases.acquire(peer.fi_addr)?;
        Ok(Lease::new(
            peer.fi_addr,
            self.reader_side.id,
            peer.client,
            &self.reader_side.shared,
        ))
    }

    /// The hot path: one relaxed load, one probe by the client and a compare of the address in
    /// the node the probe found; no allocation, no lock, no shared write.
    ///
    /// The index's memory guard (papaya's) is the pin's, taken once: entering and leaving it per
    /// probe would add an atomic swap to every hit. Held as long as the pin, though, it would keep every
    /// index node the writer retires meanwhile alive, without bound. So the index counts the
    /// writer's changes, and a probe that sees the count moved refreshes the guard first: papaya
    /// lets go of what was retired since the last refresh, and frees it here if this thread is
    /// the last to leave it. A `Peer` is a copied `fi_addr_t`, kept valid by the epoch pin, never
    /// a reference into the index, so refreshing under live peers invalidates nothing.
    #[inline]
    pub(super) fn hit(&self, client: u64, address: &[u8]) -> Result<Option<Peer<'_>>, DmaError> {
        // No check of the address here: one of the wrong length (or all zero) is never
        // registered, so it misses, and every miss checks it (`ReaderSide::stored`) before anything is
        // queued, answering `InvalidAddress`.
        // SAFETY: the pin is neither `Send` nor `Sync`, so this thread alone reaches the cell, and
        // this is the one place that borrows it: the borrow ends with this function, and nothing
        // in it calls back into the pin (papaya's reclamation on refresh drops index nodes, plain
        // data). No `Peer` refers into the index (a peer is a copied `fi_addr_t`), so refreshing
        // the guard while peers of this pin are alive invalidates nothing they hold.
        let reader = unsafe { &mut *self.index.get() };
        // SAFETY: this thread is pinned on the cache's epoch (`self.epoch`) until the reader is
        // dropped, which it is before the pin (the fields' order).
        let found = unsafe { self.registrations.probe(reader, client, address) };
        Ok(found.map(|fi_addr| self.peer(fi_addr, client)))
    }

    fn peer(&self, fi_addr: fi_addr_t, client: u64) -> Peer<'_> {
        Peer::new(fi_addr, self.reader_side.id, client)
    }

    /// The peer at `fi_addr` as this pin sees it: for the fuzz driver (`testkit`), which
    /// rebuilds the peers it resolved under a pin it still holds. Not part of the API (feature
    /// `model`, as every test hook: the default build's surface has none).
    ///
    /// # Safety
    /// `fi_addr` was resolved through this very pin. Any other index may have been removed, or
    /// handed to another peer, and posting to it writes into someone else's memory.
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub unsafe fn peer_unchecked(&self, client: u64, fi_addr: fi_addr_t) -> Peer<'_> {
        self.peer(fi_addr, client)
    }
}

/// A resolved peer: the `fi_addr_t` to post against, valid while the [`Pinned`] it came from
/// lives.
///
/// ```compile_fail
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
///
/// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
/// let pinned = cache.pin();
/// let peer = pinned.resolve(1, &[1; 16]).unwrap();
/// drop(pinned);
/// let _ = peer.fi_addr(); // a peer cannot outlive its pin
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer<'pin> {
    fi_addr: fi_addr_t,
    /// The id of the cache that resolved it.
    pub(super) cache: u64,
    /// The client it was resolved for: what errors about it name.
    client: u64,
    pin: PhantomData<&'pin ()>,
}

impl Peer<'_> {
    pub(crate) fn new(fi_addr: fi_addr_t, cache: u64, client: u64) -> Self {
        Self {
            fi_addr,
            cache,
            client,
            pin: PhantomData,
        }
    }

    /// The `fi_addr_t` to post against.
    #[inline]
    pub fn fi_addr(self) -> fi_addr_t {
        self.fi_addr
    }

    /// The client it was resolved (or leased) for: the id an operation's
    /// [`DmaError::PeerUnreachable`] and [`OverdueOperation`](crate::endpoint::OverdueOperation)
    /// name. Two clients of one address get equal `fi_addr`s and unequal peers.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// let (one, two) = (pinned.resolve(1, &[1; 16])?, pinned.resolve(2, &[1; 16])?);
    /// assert_eq!((1, 2), (one.client(), two.client()));
    /// assert_eq!(one.fi_addr(), two.fi_addr());
    /// # Ok::<(), DmaError>(())
    /// ```
    #[inline]
    pub fn client(self) -> u64 {
        self.client
    }
}
