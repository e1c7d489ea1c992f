//! The lock-free cache of address-vector entries.
//!
//! How the cache works and what it guarantees a user (a hit, leases, misses, the writer, deferred
//! removal; the eight guarantees; why a resolve under a pin can be told to wait; drop) is on
//! [`AddressCache`], where a user reads it. The proofs are the rooms': the writer's protocol and
//! its bounds in bytes in `writer`, the lease counters' orderings in `lease`, the patience's
//! answer in `blocking`, the doorbell's lost-wake-up argument in `doorbell`. How a reader's miss
//! reaches the writer is `reader_side`'s.

mod blocking;
mod budget;
mod doorbell;
pub(crate) mod epoch;
mod failures;
mod inbox;
pub(crate) mod index;
mod lease;
mod lease_counts;
mod pinned;
mod reader_side;
mod reply;
mod role;
mod senders;
mod shared;
mod stats;
mod stored;
pub(crate) mod writer;

use std::marker::PhantomData;

use self::epoch::Epochs;
use self::inbox::Inbox;
pub(crate) use self::inbox::ReleaseQueue;
use self::index::RegistrationIndex;
pub use self::lease::Lease;
pub use self::pinned::{Peer, Pinned};
use self::reader_side::{ReaderSide, on_writer_thread, pinned_here};
/// The writer role, for the loom models (`loom_tests/`).
#[cfg(dma_loom)]
pub use self::role::{Role, Served, Take};
pub use self::stats::CacheStats;
use self::writer::{INBOX_BOUND, Request, SharedState, Writer, on_writer_of};
use crate::address::AddressFormat;
/// The AV trait lives in [`crate::av`]; re-exported here, where the cache is generic over it.
pub use crate::av::AvBackend;
use crate::av::FabricAv;
#[cfg(doc)] // for the docs' links
use crate::error::DmaError;
use crate::sync::{Arc, TrySendError, bounded, mpsc, thread};
#[cfg(feature = "model")]
use dma_libfabric_sys::fi_addr_t;

/// A cache of address-vector entries shared by many posting threads.
///
/// Posting threads turn a peer's advertised address into the `fi_addr_t` they post against, once
/// per transfer. The cache makes that a hash probe:
///
/// - **Readers** [`pin`](AddressCache::pin) an epoch and [`resolve`](Pinned::resolve)
///   `(client, address)` pairs. A hit is one probe of a papaya map keyed by the client id, then
///   a comparison of the full address with the address of the entry found: it allocates nothing,
///   takes no lock and writes no shared memory. Each [`Peer`] borrows the [`Pinned`] it came
///   from, so the borrow checker forbids using it after the pin is dropped; and it knows its
///   cache ([`AddressCache::owns`]), so an endpoint refuses another cache's peer.
/// - **Leases** ([`Lease`], taken with [`Pinned::lease`] or [`AddressCache::lease`]) hold an
///   entry for the operations in flight after a post: its removal waits for every lease on it to
///   be dropped, which the completion path does once it has read the completion. A resolve that
///   takes no lease pays nothing for them (see [`Lease`]).
/// - **Many misses at once** ([`Pinned::resolve_all`], [`AddressCache::lease_all`]) go to the
///   writer 64 to a request, with one answer a chunk: a connect storm in `n / 64` round trips.
/// - **One writer at a time** applies every change in arrival order: it alone calls `fi_av_insert`
///   and `fi_av_remove`, counts which clients hold which entry, evicts stale efa incarnations, and
///   publishes and unlinks index entries. The writer is a role, not a thread: a miss queues a
///   request and, if the role is free, applies it (and what else is queued) on its own thread;
///   otherwise the holder answers it. One background thread per process, shared by every
///   cache, takes the same role for the work no caller brings. `resolve` waits for the reply, `try_resolve` does not.
/// - **Removal is deferred**: an entry whose last client has gone is unlinked from the index and
///   its removal deferred on the cache's private `crossbeam_epoch::Collector` (one deferral out at
///   a time, covering every entry retired before it). The deferred closure only tells the writer (a
///   flag and its doorbell), which removes the entries once every reader that was pinned at their
///   unlink has unpinned and every lease on them has been dropped. So no reader and no operation in
///   flight ever holds a `fi_addr_t` that libfabric has removed or handed to another peer (the ABA
///   hazard of `FI_AV_TABLE`, which reuses the lowest free index at once).
///
/// # Guarantees
///
/// 1. A `Peer` maps, in the AV, to exactly the address it was resolved for, for as long as its
///    pin lives, and a `Lease` for as long as it lives.
/// 2. Every `fi_av_insert` is matched by exactly one `fi_av_remove`, after the last client
///    released the entry, every reader that could have seen it unpinned, and every lease on it
///    was dropped. A failed `fi_av_remove` is retried with a backoff; until it succeeds the entry
///    counts against the capacity and (efa) blocks its identity ([`CacheStats::failed_removes`]).
/// 3. The AV never holds two entries for one identity: on efa, a new QKEY on a known GID and QPN
///    evicts the old incarnation (and every client on it), whose removal runs *before* the new
///    incarnation's insert. The new one waits, parked, without stalling other requests.
/// 4. Once every client is released and the cache is quiesced, the AV and the index are empty.
/// 5. Bad input (an address of the wrong length, empty, or all zero bytes: a peer that advertised
///    before its endpoint had an address) is a [`DmaError`] before any AV call,
///    and changes nothing. So is a full AV: the cache never holds more than
///    [`AvBackend::capacity`] entries, counting those awaiting removal.
/// 6. Nothing grows without bound: the writer's inbox holds at most [`AddressCache::INBOX_BOUND`]
///    requests, and at most as many misses queued in `resolve_all`/`lease_all` chunks (a chunk
///    counts as its misses), and `quiesce` answers once the requests before it are applied and
///    their removals have run, however busy the inbox is after it. A queued miss that failed
///    reports its error to the next `try_resolve` (never `WouldBlock` for ever). The cache's heap
///    stays within a bound set by the AV's capacity and the inbox bound however long a probing
///    reader stays pinned and whatever is released, revived or retried (`docs/guarantees.md` gives
///    it in bytes), and a lease counter cannot wrap ([`AddressCache::LEASE_LIMIT`]). One cost is
///    per pin and outside that bound: a [`Pinned`] holds papaya's guard on the index across its
///    probes, so a pin that stops probing holds back the index nodes the writer retires until its
///    next probe or its drop (what one release/revive cycle retires; `tests/soak.rs`,
///    `docs/guarantees.md`). A pin that goes on probing holds at most what was retired since its
///    last probe.
/// 7. No call waits for ever, whoever holds what, on whichever thread or task: every wait (a
///    blocking lease, `lease_all`, `lease_within`, `quiesce`) ends within the cache's patience
///    ([`AddressCache::with_patience`], 5 s by default), whatever timeout it was given, answering
///    [`DmaError::OutOfPatience`] if the entry is not in by then; a wait that another thread's
///    drop ends, ends at that drop. The exact refusals stay: a blocking lease on a thread pinned
///    on the cache, and any wait on the writer's own thread (a `tracing` subscriber, an
///    [`AvBackend`]). See the patience rule on [`with_patience`](AddressCache::with_patience).
/// 8. A hit allocates nothing and takes no lock, even while other threads churn: what a reader's
///    `pin()` may run on the writer's behalf (crossbeam's collection of the one outstanding
///    deferral) only exchanges a flag and rings the writer's doorbell. One cost is crossbeam's
///    own and remains: a pin that collects a bag hands its queue node back through the reader's
///    own bag, and every 64 such nodes that reader allocates one 2,072-byte node to push its bag
///    (`tests/hit_path.rs` measures it while another thread churns: `docs/benchmarks.md`,
///    "Figures moved out of the module docs"; with fewer than 64 grace periods, none). A hit may
///    free, though: when the writer has changed the index since the pin's last probe (one
///    relaxed load of a counter tells), the hit refreshes the pin's papaya guard, which reclaims
///    a batch of index nodes the writer retired when the hit's thread is the last to leave them
///    (`docs/guarantees.md` has what it costs and how often). On an index the writer leaves
///    alone, a hit is one load, one probe and a compare of the address in the node the probe found.
///
/// # Why a resolve under a pin can be told to wait
///
/// A recycled efa slot cannot take its new incarnation until the old one is removed, and the old
/// one cannot be removed while the caller's own pin (taken before the eviction) lives. So when a
/// resolve has to park a new incarnation, it returns [`DmaError::WouldBlock`] rather than wait
/// for itself: the writer inserts the new incarnation once every reader has unpinned and every
/// lease on the old one has been dropped, and a resolve under a later pin finds it.
/// [`AddressCache::lease`], which holds no pin while it waits, waits for that instead, for at
/// most the cache's patience.
///
/// # Drop
///
/// Dropping the cache stops the writer, which removes every pending and live entry before the
/// thread ends; the endpoint closes its AV only after that. No `Drop` and no deferred closure
/// calls libfabric. Every `Pinned` and every `Lease` borrows the cache, so none is left when it
/// drops.
///
/// No call waits for ever: every wait ends within the cache's [`patience`](Self::patience).
/// Code running under the cache's writer role, on its writer thread or on a caller that serves its
/// own miss (a `tracing` subscriber that sees the writer's
/// events, an [`AvBackend`] that calls back in) may call the cache: what would wait for the
/// writer answers [`DmaError::InvalidArgument`] at once (a miss, [`lease`](Self::lease),
/// [`lease_within`](Self::lease_within)), [`release`](Self::release) is queued without waiting,
/// and [`quiesce`](Self::quiesce) returns at once. And `lease` refuses a wait on the calling
/// thread's own pin (see its errors).
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint, SEAL_LEN};
///
/// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
/// let client = LibfabricEndpoint::open(&Configuration::default(), None)?;
/// let address = client.local_address()?; // the provider's name, then the seal
///
/// let pinned = server.cache().pin();
/// let peer = pinned.resolve(7, &address)?;
/// let provider_part = &address[..address.len() - SEAL_LEN];
/// assert_eq!(Some(provider_part), server.lookup(peer.fi_addr())?.as_deref());
/// drop(pinned);
///
/// server.cache().release(7);
/// server.cache().quiesce();
/// assert_eq!(0, server.cache().stats().entries);
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct AddressCache<B: AvBackend = FabricAv> {
    reader_side: ReaderSide,
    /// The background thread, which takes the writer role for the work no caller brings.
    writer: Option<thread::JoinHandle<()>>,
    /// The writer's state, for whoever holds the role (`None` under loom, where the background
    /// thread owns it).
    cell: Option<std::sync::Arc<writer::WriterCell<B>>>,
    backend: PhantomData<fn() -> B>,
}

impl<B: AvBackend> std::fmt::Debug for AddressCache<B> {
    /// The format and the writer's counters: O(1), without the live lease total that
    /// [`AddressCache::stats`] sums.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AddressCache")
            .field("format", &self.reader_side.format)
            .field("counters", &self.reader_side.shared.counters.snapshot())
            .finish_non_exhaustive()
    }
}

impl<B: AvBackend> AddressCache<B> {
    /// A cache over `backend`, with its writer thread started.
    ///
    /// It holds at most [`AvBackend::capacity`] entries, and at most
    /// [`Configuration::MAX_AV_CAPACITY`](crate::configuration::Configuration::MAX_AV_CAPACITY) whatever the
    /// backend says: the index and the lease counters are allocated up front for every index.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
    ///
    /// let av = ModelAv::new(AddressFormat::Efa);
    /// let cache = AddressCache::with_backend(av.clone());
    /// let peer = cache.pin().resolve(1, &[9; 32])?.fi_addr();
    /// assert_eq!(Some(vec![9; 32]), av.lookup(peer));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn with_backend(backend: B) -> Self {
        let format = backend.format();
        let address_len = backend.address_len();
        let shared = Arc::new(SharedState::new(writer::usable_capacity(&backend)));
        let epochs = Epochs::new();
        let (requests, inbox) = bounded(INBOX_BOUND);
        let id = next_cache_id();
        let (writer, cell) = start_writer(backend, &shared, epochs.collector(), inbox, id);
        Self {
            reader_side: ReaderSide {
                id,
                requests: Inbox {
                    channel: requests,
                    shared: Arc::clone(&shared),
                    writer: cell
                        .clone()
                        .map(|cell| cell as std::sync::Arc<dyn writer::Serve>),
                },
                shared,
                epochs,
                format,
                address_len,
                identity_len: identity_len_for(format, address_len, address_len),
                sealed_identity_len: identity_len_for(
                    format,
                    address_len,
                    address_len + crate::address::SEAL_LEN,
                ),
                patience: Self::DEFAULT_PATIENCE,
            },
            writer,
            cell,
            backend: PhantomData,
        }
    }

    /// Pin the calling thread: every [`Peer`] resolved through the pin stays valid until it is
    /// dropped. Hold a pin across the posts that use its peers, and not much longer: a pin held
    /// for ever holds back every removal.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = cache.pin();
    /// let one = pinned.resolve(1, &[1; 16])?;
    /// let two = pinned.resolve(2, &[2; 16])?; // one pin, many peers
    /// assert_ne!(one.fi_addr(), two.fi_addr());
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn pin(&self) -> Pinned<'_> {
        Pinned::new(&self.reader_side)
    }

    /// Let go of `client`'s entry. Waits for no one (only, like every request, for room in a full
    /// inbox): if the writer role is free the release is applied on this thread (the writer's
    /// bookkeeping, and any removal whose readers and leases are already gone), otherwise the
    /// role's holder applies it. The entry leaves the AV once its readers have unpinned and its
    /// leases are dropped, if `client` was its last holder. Unknown and repeated ids are
    /// harmless.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
    ///
    /// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// cache.pin().resolve(1, &[1; 16])?;
    /// cache.release(1);
    /// cache.release(1); // harmless
    /// cache.quiesce();
    /// assert_eq!((0, 1), (cache.stats().entries, cache.stats().removes));
    /// # Ok::<(), DmaError>(())
    /// ```
    ///
    /// On the cache's own writer thread (a `tracing` subscriber, an [`AvBackend`]) it never
    /// waits: a full inbox queues the release beside it, applied at the writer's next round.
    pub fn release(&self, client: u64) {
        if on_writer_of(self.reader_side.id) {
            if let Err(TrySendError::Full) = self
                .reader_side
                .requests
                .try_send(Request::Release { client })
            {
                if !writer::queue_own_release(self.reader_side.id, client) {
                    tracing::error!(
                        client,
                        "release called on the writer thread with its inbox and overflow full: dropped"
                    );
                }
            }
            return;
        }
        // Applied here if the writer role is free (a release is a few hundred nanoseconds of the
        // writer's work; ringing the background thread for it costs a wake-up and a context
        // switch), else by the holder's second look. A stopped writer holds nothing any more.
        let _ = self
            .reader_side
            .requests
            .send_and_serve(Request::Release { client });
    }

    /// How many requests (misses, releases, quiesces) the writer's inbox holds. A sender that
    /// finds it full waits for room ([`Pinned::resolve`], [`release`](Self::release),
    /// [`quiesce`](Self::quiesce), [`lease`](Self::lease)), or queues nothing and answers
    /// [`DmaError::Busy`] ([`Pinned::try_resolve`], whose `WouldBlock` always means queued). A
    /// chunk of [`Pinned::resolve_all`] or [`lease_all`](Self::lease_all) counts as its misses
    /// too: at most this many misses are queued in chunks at once, and a sender waits for room
    /// before it queues more. So a flood of queued misses costs at most this many requests and
    /// this many chunked misses of memory, however fast it comes and however many threads send.
    pub const INBOX_BOUND: usize = INBOX_BOUND;

    /// The writer's counters, as of its last applied request, with the leases out now.
    ///
    /// Costs O(capacity) loads (no write): the writer's counters are O(1), but
    /// [`CacheStats::leases`] is summed live over the per-index counters, because a shared total
    /// would put a contended write on every lease taken and dropped. `Debug` leaves it out.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            leases: self.reader_side.shared.leases.total(),
            ..self.reader_side.shared.counters.snapshot()
        }
    }

    /// How addresses are laid out for this cache's AV.
    pub fn format(&self) -> AddressFormat {
        self.reader_side.format
    }

    /// How long every address must be.
    pub fn address_len(&self) -> usize {
        self.reader_side.address_len
    }

    /// How many registrations the index holds now (one per client on a live entry).
    pub fn indexed(&self) -> usize {
        // The pin keeps the table read alive against the writer's replacing it.
        self.reader_side
            .shared
            .index
            .len(&self.reader_side.epochs.pin())
    }

    /// Whether `peer` was resolved through this cache. The endpoint refuses to post to a peer of
    /// another cache: its index means nothing in this AV.
    ///
    /// ```
    /// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
    ///
    /// let one = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let two = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    /// let pinned = one.pin();
    /// let peer = pinned.resolve(1, &[1; 16])?;
    /// assert!(one.owns(peer));
    /// assert!(!two.owns(peer));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    #[inline]
    pub fn owns(&self, peer: Peer<'_>) -> bool {
        peer.cache == self.reader_side.id
    }

    /// How many misses are queued in `resolve_all`/`lease_all` chunks now: at most
    /// [`INBOX_BOUND`](Self::INBOX_BOUND). For tests of that bound. Not part of the API (feature
    /// `model`).
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub fn queued_chunk_misses(&self) -> usize {
        self.reader_side.shared.chunk_misses.queued()
    }

    /// How many times the writer has replaced the index's table with a smaller one (once it had
    /// emptied to an eighth of what it grew to). For tests of that shrink. Not part of the API
    /// (feature `model`).
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub fn index_replacements(&self) -> u64 {
        self.reader_side.shared.index.replacements()
    }

    /// Set the lease counter of `fi_addr`, for tests that reach the lease bound without 2³⁰
    /// real clones. Not part of the API (feature `model`).
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub fn force_lease_count(&self, fi_addr: fi_addr_t, leases: u32) {
        self.reader_side.shared.leases.force(fi_addr, leases);
    }

    /// Call `hook` on the writer thread for each client an efa eviction of a live entry drops
    /// (other than the client whose new incarnation evicted it); `false` if a hook is set already.
    /// For the rail set, which evicts such a client on every rail. The hook must not wait for any
    /// cache's writer; it answers whether it is done with the client, and the writer calls it
    /// again for a client it was not done with, every round, until it is (see
    /// `Writer::deferred_evictions`).
    pub(crate) fn on_eviction(&self, hook: Box<dyn Fn(u64) -> bool + Send + Sync>) -> bool {
        self.reader_side.shared.on_evict.set(hook).is_ok()
    }

    /// A handle that queues releases in this cache's inbox without ever waiting: for another
    /// cache's writer (a rail set's eviction hook). It does not keep this cache's shared state
    /// alive, so two caches that hold each other's handles leave no cycle.
    pub(crate) fn release_queue(&self) -> ReleaseQueue {
        self.reader_side.requests.release_queue()
    }

    /// The most leases one entry may have out at once: [`Pinned::lease`] refuses past it, and
    /// `Lease::clone` aborts the process past it (as `Arc::clone` does), so a lease counter never
    /// wraps.
    pub const LEASE_LIMIT: u32 = lease_counts::LEASE_LIMIT;
}

/// The identity's length of every address of `len` bytes in `format`, where the provider's are
/// `address_len`, if the format takes that length.
fn identity_len_for(format: AddressFormat, address_len: usize, len: usize) -> Option<usize> {
    let probe = vec![0; len];
    format.layout_identity_len(&probe, address_len).ok()
}

/// A fresh cache id. Ids are never reused: a `u64` counter does not wrap in practice.
fn next_cache_id() -> u64 {
    // Plain std even under loom: an id, not part of the protocol.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Build the writer and register it with the process's background thread: the writer's state
/// goes in a cell that whoever holds the writer role uses (see `role`), and the background thread
/// (one per process, shared by every cache: `writer::background`) takes the role for the work no
/// caller brings. If the thread cannot start, callers still serve their own misses; releases and
/// removals then wait for the next miss, and the cache's drop removes everything.
#[cfg(not(dma_loom))]
fn start_writer<B: AvBackend>(
    backend: B,
    shared: &Arc<SharedState>,
    collector: &crossbeam_epoch::Collector,
    inbox: mpsc::Receiver<Request>,
    cache: u64,
) -> (
    Option<thread::JoinHandle<()>>,
    Option<std::sync::Arc<writer::WriterCell<B>>>,
) {
    let writer = Writer::new(
        backend,
        Arc::clone(shared),
        collector.register(),
        inbox,
        cache,
    );
    let cell = std::sync::Arc::new(writer::WriterCell::new(writer, Arc::clone(shared), cache));
    let tended: std::sync::Arc<dyn writer::Tend> = cell.clone();
    // The process's one background thread (see `writer::background`); if it could not be
    // started, callers serve what they can.
    writer::tend(std::sync::Arc::downgrade(&tended));
    (None, Some(cell))
}

/// Start the writer thread, which holds the writer role for its whole life under loom. Its epoch
/// handle is registered on the thread itself.
#[cfg(dma_loom)]
fn start_writer<B: AvBackend>(
    backend: B,
    shared: &Arc<SharedState>,
    collector: &crossbeam_epoch::Collector,
    inbox: mpsc::Receiver<Request>,
    cache: u64,
) -> (
    Option<thread::JoinHandle<()>>,
    Option<std::sync::Arc<writer::WriterCell<B>>>,
) {
    let (shared, collector) = (Arc::clone(shared), collector.clone());
    let run = move || Writer::new(backend, shared, collector.register(), inbox, cache).run();
    (Some(thread::spawn(run)), None)
}

impl<B: AvBackend> Drop for AddressCache<B> {
    fn drop(&mut self) {
        let _ = self.reader_side.requests.send(Request::Shutdown);
        // A writer that panicked closed its inbox, so the send above rang nobody: the background
        // thread must still see the poisoned role and end.
        self.reader_side.shared.doorbell.wake_background();
        match self.writer.take() {
            Some(writer) => {
                if writer.join().is_err() {
                    tracing::error!(
                        "the address cache's writer thread panicked; its AV entries were not removed"
                    );
                }
            }
            // The background thread is the process's, not this cache's: stop the writer here
            // (no `Pinned` and no `Lease` is left, so only the background thread may hold the
            // role meanwhile, for one round, which may take the shutdown itself).
            None => {
                if let Some(writer) = &self.reader_side.requests.writer {
                    while !self.reader_side.shared.doorbell.role.poisoned() {
                        writer.serve();
                        if !self.reader_side.shared.doorbell.role.poisoned() {
                            thread::yield_now();
                        }
                    }
                }
            }
        }
        if self.cell.as_ref().is_some_and(|cell| cell.panicked()) {
            tracing::error!("the address cache's writer panicked; its AV entries were not removed");
        }
    }
}
