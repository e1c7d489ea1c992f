//! The writer thread: the only caller of `fi_av_insert` and `fi_av_remove`, the only owner of
//! who holds what, and the only thread that changes the index.
//!
//! # State
//!
//! Every incarnation in the AV has an [`Entry`] at its own index (`fi_addr_t`, which `FI_AV_TABLE`
//! keeps below the AV's capacity): its address, stored once, its holders, and whether it is
//! published (`live`) or on its way out (`removing`: unlinked, its `fi_av_remove` waiting for its
//! readers to unpin and its leases to drop). Each identity (efa: GID + QPN; otherwise the whole
//! address) has at most one incarnation in the AV, live or removing, found through the `slots`
//! table, which stores nothing but the index. A removing incarnation may have a newer one
//! `parked` behind it: clients asked for it, and it may enter the AV only once the old one has
//! left (efa's reverse AV holds one entry per GID and QPN). It is inserted when the removal runs,
//! not before, and the rest of the queue goes on meanwhile.
//!
//! Each client is in at most one place, as a holder of a live entry or a waiter on a parked one.
//!
//! # Batches
//!
//! The writer drains what is queued in its inbox in one go (up to [`BATCH`] requests), applies
//! each in arrival order, and then, once for the batch, flushes its retirements to the epoch
//! collector, publishes the counters and sends the replies: so a caller that reads the counters
//! after its reply sees its request, and a burst of misses shares the bookkeeping.
//!
//! # Ordering
//!
//! Retiring an entry unlinks every registration of it from the index first, and only then defers
//! its removal on the cache's epoch collector (at the latest by the next deferral, which covers
//! every ticket retired before it: see "One deferral at a time"). A reader that found the
//! registration was pinned before the unlink, so the collector runs the deferred closure only
//! after that reader unpins (crossbeam-epoch's guarantee: a closure deferred while a participant
//! is pinned runs after that participant unpins). The closure itself only sets a flag for this
//! thread (an `AcqRel` exchange the writer reads with `Acquire`), so `fi_av_remove` always runs
//! here, after every such reader has gone. A reader that pins after
//! the unlink cannot find the registration, because crossbeam's pin and the writer's flush are
//! `SeqCst` fences that order the unlink before that reader's probe.
//!
//! Once the readers are gone, a removal still waits for the entry's leases (see
//! [`super::lease`]): the writer reads the index's lease counter, and while it is not zero marks
//! it awaited and forgets it until the last lease's drop reports the index. A failed
//! `fi_av_remove` is retried with a backoff, from a set ordered by when each retry is due: its
//! entry still counts against the capacity and its slot stays `removing`, so on efa no second
//! incarnation goes in beside it. Neither is rescanned: a miss costs the same however many
//! removals wait.
//!
//! # One deferral at a time
//!
//! Retirements are not deferred one by one. At most one closure is outstanding on the collector:
//! it covers every ticket retired before it was deferred, and tickets retired while it is out wait
//! for the next one, deferred as soon as it returns. A later deferral is as safe as an earlier one
//! (every reader pinned at a ticket's unlink is either gone by then or pinned still, and so waited
//! for), and it bounds what reclamation costs whatever the readers do: one crossbeam bag in the
//! collector's queue, however long a reader stays pinned and however many entries are retired and
//! revived meanwhile. The closure only sets a flag and rings the writer's doorbell (an atomic
//! store, a fence, an unpark), so the reader whose `pin()` happens to run it allocates nothing and
//! takes no lock.
//!
//! # Bounds
//!
//! Every structure the writer keeps is bounded by the AV's capacity `C` or the inbox bound, not by
//! what readers do: `entries`, `slots`, `pending`, `retries`, `parked` and the scratch list hold at
//! most `C` items each (an entry awaiting removal still occupies its index, and counts against the
//! capacity); `clients` holds one item per client registered or parked, each on one of those
//! entries; a parked incarnation keeps at most one waiter per client (a newer request from the
//! same client answers the older one `WouldBlock`); `replies` and the quiescers at most one per
//! request of a batch. The tables shrink once they empty well below their peak. In bytes: the
//! cache's heap stays within `C` × 384 B + [`INBOX_BOUND`] × 64 B of the empty cache, plus what
//! each thread that uses it registers once (an epoch handle, a reply channel), however long a
//! reader stays pinned (the index's own guard is taken per probe, so a pin holds back no index
//! memory either) and however many releases, revives and retries go by. `tests/soak.rs` checks
//! that bound with a counting allocator (its peaks, at `C` = 4,096: 795 KB under a long pin over
//! 20,000 revives and churn, against 1.8 MB), and the `cache_ops` fuzz target after every step.
//!
//! # Calls from the writer thread
//!
//! Code that runs on the writer thread (a `tracing` subscriber that sees its events, an
//! [`AvBackend`] that calls back into its cache) must not wait for the writer. Every call of the
//! cache that would wait answers [`DmaError::InvalidArgument`] there instead; `release` is queued
//! without waiting, and `quiesce` returns at once.
//!
//! # Requests, backpressure and quiesce
//!
//! Requests arrive on a bounded channel ([`INBOX_BOUND`]): a flood of queued misses cannot grow
//! memory without bound; `resolve` and `release` wait for room, `try_resolve` does not queue and
//! answers `Busy`. The writer parks on its [`Doorbell`], which every sender rings after queueing,
//! and which the deferral's closure and an awaited lease's last drop ring too: neither ever sends
//! on a channel, so neither can wait, allocate or take a lock.
//!
//! A quiescer records the ticket the next retirement would take: it is answered once no removal
//! older than that is pending (or those that are have made no progress for its patience), however
//! busy the inbox is after it. While removals are pending the writer moves the epoch on between
//! requests as well as when idle, so a busy inbox does not hold removals back.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::ops::Range;
use std::time::{Duration, Instant};

use crossbeam_epoch::LocalHandle;
use hashbrown::HashTable;

use super::doorbell::Doorbell;
use super::failures::Failures;
use super::index::{Index, Registration, RegistrationIndex};
use super::lease::LeaseCounts;
use super::reply::Answer;
use super::stats::{CacheStats, Counters};
use super::stored::StoredAddress;
use crate::address::AddressFormat;
use crate::av::AvBackend;
use crate::error::DmaError;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{Arc, mpsc};
#[cfg(dma_loom)]
use crate::sync::{recv_polling, recv_spinning};
use crate::sys::fi_addr_t;

/// How many requests the inbox holds before senders wait (or `try_resolve` gives up).
pub(crate) const INBOX_BOUND: usize = 4096;

/// The most requests applied between two publications of the counters: enough to share the
/// bookkeeping across a burst, few enough that a quiescer or a removal is not kept waiting.
pub(crate) const BATCH: usize = 64;

/// The writer's hasher, for its own tables: foldhash, as the index uses.
type Hasher = foldhash::fast::RandomState;

/// Where the writer's answer to a resolve goes.
pub(crate) enum Reply {
    /// Nobody waits (`try_resolve`): a failure is recorded in [`Failures`] instead.
    Queued,
    /// Answer at once, `WouldBlock` included (`resolve`).
    Now(Answer),
    /// Answer once the entry is in the AV: a parked incarnation answers when it is admitted
    /// (`AddressCache::lease`).
    Admitted(Answer),
}

/// Each entry's result for a chunk of misses, in order.
pub(crate) type ChunkAnswer = Vec<Result<fi_addr_t, DmaError>>;
/// Where the writer sends a chunk's answer.
pub(crate) type ChunkReply = mpsc::Sender<ChunkAnswer>;

/// What the writer is asked to do. Requests are applied in the order they arrive.
pub(crate) enum Request {
    /// Register `client` on `address`.
    Resolve {
        client: u64,
        address: StoredAddress,
        reply: Reply,
    },
    /// Register each client on its address, in order, and answer all of them at once: a chunk of
    /// `Pinned::resolve_all` or `AddressCache::lease_all`, at most [`BATCH`] misses.
    ResolveChunk {
        requests: Vec<(u64, StoredAddress)>,
        reply: ChunkReply,
    },
    /// Let go of `client`'s registration.
    Release { client: u64 },
    /// Reply once every removal retired before this request has run, or once those left have
    /// made no progress for `patience`.
    Quiesce {
        reply: mpsc::Sender<()>,
        patience: Duration,
    },
    /// Remove everything and stop.
    Shutdown,
}

/// What readers and the writer share.
pub(crate) struct Shared {
    pub(crate) index: Index,
    pub(crate) counters: Counters,
    pub(crate) leases: LeaseCounts,
    pub(crate) failures: Failures,
    /// Wakes the parked writer: rung after a request is queued, by the deferral's closure, and by
    /// the last lease of an awaited removal.
    pub(crate) doorbell: Doorbell,
    /// Set by the outstanding deferral's closure: every reader pinned when it was deferred has
    /// unpinned.
    pub(crate) readers_gone: AtomicBool,
    /// Told, on the writer thread, of each client an efa eviction of a live entry drops (other
    /// than the client whose new incarnation evicted it): set once, by a rail set.
    pub(crate) on_evict: EvictionHook,
}

/// What [`Shared::on_evict`] holds: a call per evicted client, made on the writer thread, which
/// must not wait for any writer.
pub(crate) type EvictionHook = std::sync::OnceLock<Box<dyn Fn(u64) + Send + Sync>>;

impl Shared {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            index: Index::with_capacity(capacity),
            counters: Counters::default(),
            leases: LeaseCounts::new(capacity),
            failures: Failures::default(),
            doorbell: Doorbell::default(),
            readers_gone: AtomicBool::new(false),
            on_evict: EvictionHook::new(),
        }
    }
}

#[cfg(not(dma_loom))]
std::thread_local! {
    /// The id of the cache whose writer this thread is, or 0.
    static WRITER_OF: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Clients released by code running on this writer thread while its inbox was full: applied
    /// at the writer's next round, so such a release never waits for the writer. Only this thread
    /// pushes and drains it, so it needs no lock. Bounded by [`INBOX_BOUND`].
    static OWN_RELEASES: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Queue `client`'s release beside the full inbox, from code running on the writer thread;
/// whether there was room (at most [`INBOX_BOUND`]).
pub(crate) fn queue_own_release(client: u64) -> bool {
    #[cfg(not(dma_loom))]
    {
        OWN_RELEASES
            .try_with(|own| {
                let mut own = own.borrow_mut();
                let room = own.len() < INBOX_BOUND;
                if room {
                    own.push(client);
                }
                room
            })
            .unwrap_or(false)
    }
    #[cfg(dma_loom)]
    {
        let _ = client;
        false
    }
}

/// Whether the calling thread is the writer of cache `cache`: a call from it that waited for the
/// writer would wait for ever.
pub(crate) fn on_writer_of(cache: u64) -> bool {
    #[cfg(not(dma_loom))]
    {
        WRITER_OF
            .try_with(|writer| writer.get() == cache)
            .unwrap_or(false)
    }
    #[cfg(dma_loom)]
    {
        let _ = cache;
        false
    }
}

/// How long the writer polls for the next request before it parks: long enough to stay awake
/// through a burst of misses, short enough not to hold a core when idle.
const IDLE_SPIN: Duration = Duration::from_micros(30);

/// The shortest wait between epoch advances while removals are pending.
const FIRST_TICK: Duration = Duration::from_micros(50);
/// The longest, reached by doubling while readers or leases hold everything up.
const LAST_TICK: Duration = Duration::from_millis(10);
/// The first wait before a failed `fi_av_remove` is tried again; it doubles up to
/// [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(1);
/// The longest wait between tries of a failing `fi_av_remove`.
const LAST_RETRY: Duration = Duration::from_secs(1);
/// Epoch advances in a row that free nothing of a quiescer's removals before it starts to suspect
/// that the rest are held back by pinned readers or leases. With no reader pinned, two advances
/// expire every bag crossbeam holds, so four without progress cannot be a slow collector; they
/// are taken back to back, so a `quiesce` with nothing held back answers within microseconds.
///
/// Rounds alone are not enough: a thread that is briefly pinned (one finalizing its epoch handle
/// as it exits, or one running a deferred closure) and then preempted stops the epoch for a whole
/// time slice, which four back-to-back rounds do not outlast on a loaded machine. So after these
/// rounds the writer keeps advancing, sleeping between rounds, until the caller's patience
/// ([`crate::AddressCache::quiesce_with_patience`]) has passed without progress.
const STALLED_ROUNDS: u32 = 4;

/// A caller blocked in `quiesce`.
struct Quiescer {
    reply: mpsc::Sender<()>,
    patience: Duration,
    /// The first ticket retired after the request: older ones are what it waits for.
    watermark: u64,
    /// How many of those were pending at the last round.
    waiting_on: usize,
    /// How many deferrals had returned at the last round: one returning is progress too, since a
    /// ticket retired while another deferral was out waits for that one first.
    deferrals_seen: u64,
    /// Rounds in a row in which none of them was removed.
    stalled: u32,
    /// When one of them was last removed, or the request arrived.
    progress_at: Instant,
}

/// The clients that hold a live entry. Nearly every entry has one, so one is stored inline.
#[derive(Default)]
enum Holders {
    #[default]
    None,
    One(u64),
    // Boxed so that `Holders` stays 16 bytes in every entry; a set is rare.
    #[allow(clippy::box_collection)]
    Many(Box<HashSet<u64, Hasher>>),
}

impl Holders {
    /// Add `client`; whether it was new.
    fn insert(&mut self, client: u64) -> bool {
        match self {
            Self::None => {
                *self = Self::One(client);
                true
            }
            Self::One(held) if *held == client => false,
            Self::One(held) => {
                let mut many = HashSet::with_capacity_and_hasher(2, Hasher::default());
                many.insert(*held);
                many.insert(client);
                *self = Self::Many(Box::new(many));
                true
            }
            Self::Many(many) => many.insert(client),
        }
    }

    /// Drop `client`; whether it was there.
    fn remove(&mut self, client: u64) -> bool {
        match self {
            Self::None => false,
            Self::One(held) if *held == client => {
                *self = Self::None;
                true
            }
            Self::One(_) => false,
            Self::Many(many) => {
                let removed = many.remove(&client);
                if many.len() <= 1 {
                    *self = many.iter().next().map_or(Self::None, |&one| Self::One(one));
                }
                removed
            }
        }
    }

    fn contains(&self, client: u64) -> bool {
        match self {
            Self::None => false,
            Self::One(held) => *held == client,
            Self::Many(many) => many.contains(&client),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(_) => 1,
            Self::Many(many) => many.len(),
        }
    }

    fn to_vec(&self) -> Vec<u64> {
        match self {
            Self::None => Vec::new(),
            Self::One(held) => vec![*held],
            Self::Many(many) => many.iter().copied().collect(),
        }
    }
}

/// The ticket of an entry that is published, not awaiting removal.
const LIVE: u64 = u64::MAX;

/// An incarnation in the AV, at its own index.
struct Entry {
    address: StoredAddress,
    holders: Holders,
    /// [`LIVE`] while published; once retired, the ticket of its pending removal.
    removal: u64,
}

impl Entry {
    fn is_live(&self) -> bool {
        LIVE == self.removal
    }
}

/// Where a client is: holding the live entry at an index, or waiting on the incarnation parked
/// behind the removing entry at an index.
#[derive(Clone, Copy)]
struct Holding(u64);

impl Holding {
    const PARKED: u64 = 1 << 63;

    fn live(fi_addr: fi_addr_t) -> Self {
        Self(fi_addr)
    }

    fn parked(fi_addr: fi_addr_t) -> Self {
        Self(fi_addr | Self::PARKED)
    }

    fn fi_addr(self) -> fi_addr_t {
        self.0 & !Self::PARKED
    }

    fn is_parked(self) -> bool {
        0 != self.0 & Self::PARKED
    }
}

/// A newer incarnation waiting for the removal of the entry it is parked behind.
struct Parked {
    address: StoredAddress,
    clients: HashSet<u64, Hasher>,
    /// Callers of `AddressCache::lease` waiting for this incarnation to enter the AV.
    waiters: Vec<(u64, Answer)>,
}

impl Parked {
    /// Tell `client`'s waiters (every waiter, for `None`) that this incarnation will not get in
    /// for them: they resolve again.
    fn turn_away(&mut self, client: Option<u64>) {
        let (turned_away, kept) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|(waiter, _)| client.is_none_or(|client| client == *waiter));
        self.waiters = kept;
        for (_, answer) in turned_away {
            answer.send(Err(DmaError::WouldBlock));
        }
    }
}

/// Why a retired entry has not been removed yet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// Readers pinned at its unlink may still be pinned: the epoch deferral has not reported.
    Readers,
    /// Its readers are gone; removed once its leases are dropped (`awaited`: the last one's drop
    /// reports it) and any retry is due (`retry_at`, also in the writer's `retries`).
    Held {
        retry_at: Option<Instant>,
        backoff: Duration,
        awaited: bool,
    },
}

/// A retired entry awaiting `fi_av_remove`; its address stays in its [`Entry`] until then.
struct Pending {
    fi_addr: fi_addr_t,
    wait: Wait,
}

/// The writer's whole state. `run` consumes it on the writer thread.
pub(crate) struct Writer<B> {
    backend: B,
    format: AddressFormat,
    address_len: usize,
    capacity: usize,
    shared: Arc<Shared>,
    /// Every incarnation in the AV, by index: `None` where the AV holds nothing of ours.
    entries: Vec<Option<Entry>>,
    /// Identity → the index of its live or removing incarnation. Holds the index alone; the
    /// identity's bytes are read from `entries`.
    slots: HashTable<fi_addr_t>,
    hasher: Hasher,
    /// Incarnations parked behind a removal, by the index of the removing entry.
    parked: HashMap<fi_addr_t, Box<Parked>, Hasher>,
    clients: HashMap<u64, Holding, Hasher>,
    /// Retired entries awaiting `fi_av_remove`, by ticket (tickets grow, so the oldest is first).
    pending: BTreeMap<u64, Pending>,
    /// Failed removals, by when their retry is due.
    retries: BTreeSet<(Instant, u64)>,
    /// Pending removals whose readers are gone and whose last lease the writer awaits.
    awaiting_leases: u64,
    /// The tickets the outstanding deferral covers, if one is out.
    in_flight: Option<Range<u64>>,
    /// Tickets from here on have not been deferred yet.
    undeferred: u64,
    /// How many deferrals have returned (their readers gone).
    deferrals_returned: u64,
    /// Whether this batch retired an entry.
    retired_in_batch: bool,
    /// Reused for lists of tickets and indices: at most the capacity.
    scratch: Vec<u64>,
    next_ticket: u64,
    /// This cache's id: the writer thread is marked with it ([`on_writer_of`]).
    #[cfg_attr(dma_loom, allow(dead_code))] // no thread-local marks under loom
    cache: u64,
    stats: CacheStats,
    epoch: LocalHandle,
    inbox: mpsc::Receiver<Request>,
    quiescing: Vec<Quiescer>,
    /// This batch's answers, sent once its counters are published.
    replies: Vec<(Answer, Result<fi_addr_t, DmaError>)>,
    /// This batch's answers to chunks, sent with the others.
    chunk_replies: Vec<(ChunkReply, ChunkAnswer)>,
}

/// How many entries the cache keeps in `backend`: its capacity, up to
/// [`Configuration::MAX_AV_CAPACITY`](crate::Configuration::MAX_AV_CAPACITY), since the index and
/// the lease counters are allocated up front for every index. A backend that reports more (a
/// model AV built by hand) is used up to that bound; an index past it is refused as outside the
/// table.
pub(crate) fn usable_capacity(backend: &impl AvBackend) -> usize {
    backend
        .capacity()
        .min(crate::configuration::Configuration::MAX_AV_CAPACITY)
}

/// The inbox has been closed: the cache is gone.
struct Stopped;

/// The request waiting in `inbox`, if one is.
#[cfg(not(dma_loom))]
fn try_next(inbox: &mpsc::Receiver<Request>) -> Result<Option<Request>, Stopped> {
    match inbox.try_recv() {
        Ok(request) => Ok(Some(request)),
        Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
        Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(Stopped),
    }
}

/// Whether work other than a request has come for the writer of `shared`: the deferral's readers
/// have gone, or an awaited lease was dropped.
#[cfg(not(dma_loom))]
fn signalled(shared: &Shared) -> bool {
    shared.readers_gone.load(Ordering::Relaxed) || shared.leases.reported()
}

/// The entry at `fi_addr` in `entries`.
fn entry_in(entries: &[Option<Entry>], fi_addr: fi_addr_t) -> Option<&Entry> {
    usize::try_from(fi_addr)
        .ok()
        .and_then(|index| entries.get(index))
        .and_then(Option::as_ref)
}

/// The identity of the entry at `fi_addr`: what `slots` hashes and compares.
fn identity_at(entries: &[Option<Entry>], fi_addr: fi_addr_t) -> &[u8] {
    entry_in(entries, fi_addr).map_or(&[], |entry| entry.address.identity())
}

impl<B: AvBackend> Writer<B> {
    pub(crate) fn new(
        backend: B,
        shared: Arc<Shared>,
        epoch: LocalHandle,
        inbox: mpsc::Receiver<Request>,
        cache: u64,
    ) -> Self {
        Self {
            format: backend.format(),
            address_len: backend.address_len(),
            capacity: usable_capacity(&backend),
            backend,
            shared,
            entries: Vec::new(),
            slots: HashTable::new(),
            hasher: Hasher::default(),
            parked: HashMap::default(),
            clients: HashMap::default(),
            pending: BTreeMap::new(),
            retries: BTreeSet::new(),
            awaiting_leases: 0,
            in_flight: None,
            undeferred: 0,
            deferrals_returned: 0,
            retired_in_batch: false,
            scratch: Vec::new(),
            next_ticket: 0,
            cache,
            stats: CacheStats::default(),
            epoch,
            inbox,
            quiescing: Vec::new(),
            replies: Vec::new(),
            chunk_replies: Vec::new(),
        }
    }

    /// Serve requests until shutdown, then remove everything.
    pub(crate) fn run(mut self) {
        #[cfg(not(dma_loom))]
        {
            let _ = WRITER_OF.try_with(|writer| writer.set(self.cache));
            self.shared.doorbell.answer_here();
        }
        let mut tick = FIRST_TICK;
        let mut deferred_at_last_tick = u64::MAX;
        let mut last_advance = Instant::now();
        let mut last_request = Instant::now();
        loop {
            // Removals may have let parked incarnations in: publish them and answer their waiters
            // before waiting for the next request.
            if self.collect() || !self.replies.is_empty() {
                self.finish_batch();
            }
            self.answer_quiescers();
            // Quiescing, the first rounds run back to back; once they suspect a pinned reader or
            // a lease, the writer sleeps between rounds so that reader gets the core to finish on.
            let hurry = self
                .quiescing
                .iter()
                .any(|quiescer| quiescer.stalled < STALLED_ROUNDS)
                || cfg!(dma_loom) && !self.quiescing.is_empty();
            // Removals awaiting only their leases need no ticks: the last lease rings.
            let waiting =
                self.in_flight.is_some() || !self.retries.is_empty() || !self.quiescing.is_empty();
            let request = if hurry {
                match self.inbox.try_recv() {
                    Ok(request) => Some(request),
                    Err(std::sync::mpsc::TryRecvError::Empty) => None,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                }
            } else if waiting {
                // Poll first, as when idle, for what is left of `IDLE_SPIN` since the last
                // request: a miss that finds the writer parked pays a wake-up, and while removals
                // are pending (most of the time under churn) that would be every miss. Polling
                // longer than that, with no traffic, only took the core from the readers whose
                // pins move the epoch on (the reclamation bench's delay went from 0.15 to 4 ms).
                let spin = IDLE_SPIN.saturating_sub(last_request.elapsed()).min(tick);
                match self.next_request(spin, Some(tick)) {
                    Ok(request) => request,
                    Err(Stopped) => break,
                }
            } else {
                match self.next_request(IDLE_SPIN, None) {
                    Ok(request) => request,
                    Err(Stopped) => break,
                }
            };
            let idle = request.is_none();
            if !idle {
                last_request = Instant::now();
            }
            let mut stop = false;
            if let Some(request) = request {
                stop = self.accept(request, &mut tick);
                // The rest of what is queued, as one batch.
                let mut taken = 1;
                while !stop && taken < BATCH {
                    match self.inbox.try_recv() {
                        Ok(request) => stop = self.accept(request, &mut tick),
                        Err(std::sync::mpsc::TryRecvError::Empty) => break,
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => stop = true,
                    }
                    taken += 1;
                }
                self.finish_batch();
            }
            if stop {
                break;
            }
            // Move the epoch on so the outstanding deferral runs without reader traffic: when
            // idle, and, while one is out, between requests too, at most once a tick (loom has no
            // time, so there it advances only when idle).
            let due = self.in_flight.is_some()
                && cfg!(not(dma_loom))
                && last_advance.elapsed() >= FIRST_TICK;
            if idle || due {
                // Back off only while readers hold the outstanding deferral up: a new deferral
                // since the last round is progress.
                let deferred = self.undeferred;
                if deferred != deferred_at_last_tick {
                    tick = FIRST_TICK;
                } else if idle {
                    tick = (tick * 2).min(LAST_TICK);
                }
                deferred_at_last_tick = deferred;
                self.advance();
                last_advance = Instant::now();
                self.collect();
                self.round();
                self.finish_batch();
            }
        }
        self.finish_batch();
        self.shutdown();
    }

    /// The next request: polled for (yielding) for up to `spin`, then waited for, parked, until
    /// `timeout` (none: until one comes). `None` if the wait ended first, or if other work came
    /// (the deferral's readers have gone, an awaited lease was dropped).
    #[cfg(not(dma_loom))]
    fn next_request(
        &mut self,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<Request>, Stopped> {
        let started = Instant::now();
        loop {
            if let Some(request) = try_next(&self.inbox)? {
                return Ok(Some(request));
            }
            if signalled(&self.shared) {
                return Ok(None);
            }
            if started.elapsed() >= spin {
                break;
            }
            std::thread::yield_now();
        }
        let mut received = Ok(None);
        let (inbox, shared) = (&self.inbox, &self.shared);
        shared.doorbell.park(
            || {
                received = try_next(inbox);
                !matches!(received, Ok(None)) || signalled(shared)
            },
            timeout.map(|timeout| timeout.saturating_sub(started.elapsed())),
        );
        match received {
            Ok(None) => try_next(&self.inbox),
            received => received,
        }
    }

    /// The next request: under loom, waited for on the inbox alone (the models drive the writer
    /// with requests; loom has no timed park).
    #[cfg(dma_loom)]
    fn next_request(
        &mut self,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<Request>, Stopped> {
        match timeout {
            Some(timeout) => match recv_polling(&self.inbox, spin, timeout) {
                Ok(request) => Ok(Some(request)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Stopped),
            },
            None => recv_spinning(&self.inbox, spin)
                .map(Some)
                .map_err(|_| Stopped),
        }
    }

    /// Take one request of a batch; whether it asks the writer to stop.
    fn accept(&mut self, request: Request, tick: &mut Duration) -> bool {
        match request {
            Request::Shutdown => return true,
            Request::Quiesce { reply, patience } => {
                self.quiescing.push(Quiescer {
                    reply,
                    patience,
                    watermark: self.next_ticket,
                    waiting_on: usize::MAX,
                    deferrals_seen: self.deferrals_returned,
                    stalled: 0,
                    progress_at: Instant::now(),
                });
                *tick = FIRST_TICK;
            }
            request => {
                let retired = self.next_ticket;
                self.apply(request);
                // A new removal waits for epoch advances: start them at the shortest tick again,
                // whatever the backoff had grown to while older removals were held.
                if retired != self.next_ticket {
                    *tick = FIRST_TICK;
                }
            }
        }
        false
    }

    /// End a batch: hand its retirements to the collector, publish the counters, then answer.
    fn finish_batch(&mut self) {
        self.own_releases();
        if std::mem::take(&mut self.retired_in_batch) && self.in_flight.is_some() {
            // The new tickets wait for the deferral that is out: move the epoch on for it, as a
            // deferral of their own would have (one pin and flush a batch, no bag).
            self.advance();
        }
        self.defer_retired();
        // Counters first, so a caller reading them after its reply sees its request.
        self.publish_stats();
        for (answer, result) in self.replies.drain(..) {
            answer.send(result);
        }
        for (reply, results) in self.chunk_replies.drain(..) {
            // The caller may have gone; nothing to do about that.
            let _ = reply.send(results);
        }
    }

    /// One round for the quiescers: count what each still waits for, note progress or a stall.
    fn round(&mut self) {
        for quiescer in &mut self.quiescing {
            let waiting_on = self.pending.range(..quiescer.watermark).count();
            if waiting_on < quiescer.waiting_on
                || self.deferrals_returned != quiescer.deferrals_seen
            {
                quiescer.deferrals_seen = self.deferrals_returned;
                quiescer.stalled = 0;
                quiescer.progress_at = Instant::now();
            } else {
                quiescer.stalled = quiescer.stalled.saturating_add(1);
            }
            quiescer.waiting_on = waiting_on;
        }
    }

    /// Answer every quiescer that has nothing left to wait for: no removal retired before it
    /// pending, or those left stalled for longer than its patience. Under loom time does not
    /// pass, so rounds decide.
    fn answer_quiescers(&mut self) {
        if self.quiescing.is_empty() {
            return;
        }
        let oldest = self.pending.keys().next().copied();
        let mut answered = false;
        let mut index = 0;
        while index < self.quiescing.len() {
            let quiescer = &self.quiescing[index];
            let done = oldest.is_none_or(|oldest| quiescer.watermark <= oldest);
            let gave_up = quiescer.stalled >= STALLED_ROUNDS
                && (cfg!(dma_loom) || quiescer.progress_at.elapsed() >= quiescer.patience);
            if done || gave_up {
                if !answered {
                    self.publish_stats();
                    answered = true;
                }
                let quiescer = self.quiescing.swap_remove(index);
                // The caller may have gone; nothing to do about that.
                let _ = quiescer.reply.send(());
            } else {
                index += 1;
            }
        }
    }

    fn apply(&mut self, request: Request) {
        match request {
            Request::Resolve {
                client,
                address,
                reply,
            } => {
                self.stats.misses += 1;
                let address = address.bytes();
                let result = self.resolve(client, address);
                match reply {
                    Reply::Queued => match &result {
                        Ok(_) | Err(DmaError::WouldBlock) => {}
                        Err(error) => {
                            tracing::warn!(op = "queued_miss_failed", client, %error, "a queued miss failed; the next try_resolve of this client and address returns the error");
                            self.shared.failures.record(client, address, error.clone());
                        }
                    },
                    Reply::Now(reply) => self.replies.push((reply, result)),
                    Reply::Admitted(reply) => match result {
                        Err(DmaError::WouldBlock) => {
                            self.wait_for_admission(client, address, reply)
                        }
                        result => self.replies.push((reply, result)),
                    },
                }
            }
            Request::ResolveChunk { requests, reply } => {
                let results = requests
                    .into_iter()
                    .map(|(client, address)| {
                        self.stats.misses += 1;
                        self.resolve(client, address.bytes())
                    })
                    .collect();
                self.chunk_replies.push((reply, results));
            }
            Request::Release { client } => {
                self.shared.failures.clear(client);
                self.detach(client);
            }
            Request::Quiesce { .. } | Request::Shutdown => {}
        }
    }

    /// `client` is parked on `address`: answer `reply` once that incarnation is in the AV.
    fn wait_for_admission(&mut self, client: u64, address: &[u8], reply: Answer) {
        let parked = self
            .clients
            .get(&client)
            .filter(|holding| holding.is_parked())
            .and_then(|holding| self.parked.get_mut(&holding.fi_addr()))
            .filter(|parked| parked.address.bytes() == address && parked.clients.contains(&client));
        match parked {
            Some(parked) => {
                // One waiter per client: a caller that asks again (a `lease_within` retried after
                // its timeout) supersedes its earlier request, whose answer goes out now, so
                // retries cost no memory however many there are.
                if let Some(earlier) = parked
                    .waiters
                    .iter_mut()
                    .find(|(waiter, _)| *waiter == client)
                {
                    let earlier = std::mem::replace(&mut earlier.1, reply);
                    self.replies.push((earlier, Err(DmaError::WouldBlock)));
                } else {
                    parked.waiters.push((client, reply));
                }
            }
            None => self.replies.push((reply, Err(DmaError::WouldBlock))),
        }
    }

    /// Pin, flush this thread's deferred closures to the collector, and let it collect.
    fn advance(&mut self) {
        let guard = self.epoch.pin();
        guard.flush();
    }

    /// If no deferral is out and tickets retired since the last one are still pending, defer one
    /// closure that covers them all, and hand it to the collector. See "One deferral at a time".
    fn defer_retired(&mut self) {
        if self.in_flight.is_some() || self.pending.range(self.undeferred..).next().is_none() {
            return;
        }
        self.in_flight = Some(self.undeferred..self.next_ticket);
        self.undeferred = self.next_ticket;
        let shared = Arc::clone(&self.shared);
        let guard = self.epoch.pin();
        guard.defer(move || {
            // Release: pairs with the writer's Acquire swap, after which it removes. A swap, not a
            // store: under loom a plain store from inside crossbeam's collection was not seen by
            // the writer's later swap (a model of `aba` failed that way), and an exchange costs the
            // same on this rare path.
            shared.readers_gone.swap(true, Ordering::AcqRel);
            shared.doorbell.ring();
        });
        // The closure waits in this thread's bag until it is flushed; flush so that readers'
        // pins can collect it too.
        guard.flush();
    }

    /// Apply the releases that code on this thread queued while the inbox was full.
    fn own_releases(&mut self) {
        #[cfg(not(dma_loom))]
        {
            let released = OWN_RELEASES
                .try_with(|own| std::mem::take(&mut *own.borrow_mut()))
                .unwrap_or_default();
            for client in released {
                self.apply(Request::Release { client });
            }
        }
    }

    /// Take what the readers and leases reported: the outstanding deferral's tickets, whose
    /// readers have gone, and awaited removals whose last lease was dropped; retry the failed
    /// removals that are due. Whether anything was removed. Costs nothing per removal that is
    /// still waiting.
    fn collect(&mut self) -> bool {
        let removes = self.stats.removes;
        let mut scratch = std::mem::take(&mut self.scratch);
        // Acquire: pairs with the closure's Release; the closure ran after every reader pinned
        // at the deferral unpinned.
        if self.shared.readers_gone.swap(false, Ordering::Acquire) {
            if let Some(range) = self.in_flight.take() {
                self.deferrals_returned += 1;
                scratch.clear();
                scratch.extend(self.pending.range(range).map(|(&ticket, _)| ticket));
                for &ticket in &scratch {
                    self.readers_gone(ticket);
                }
            }
        }
        scratch.clear();
        self.shared
            .leases
            .take_released(|fi_addr| scratch.push(fi_addr));
        for &fi_addr in &scratch {
            // A report for an entry revived (or already removed) since is stale.
            let ticket = self
                .entry(fi_addr)
                .filter(|entry| !entry.is_live())
                .map(|entry| entry.removal);
            if let Some(ticket) = ticket {
                self.lease_released(ticket);
            }
        }
        scratch.clear();
        self.scratch = scratch;
        if let Some(&(first, _)) = self.retries.first() {
            let now = Instant::now();
            if first <= now || cfg!(dma_loom) {
                while let Some(&(at, ticket)) = self.retries.first() {
                    if now < at && cfg!(not(dma_loom)) {
                        break;
                    }
                    self.retries.pop_first();
                    if let Some(Pending {
                        wait: Wait::Held { retry_at, .. },
                        ..
                    }) = self.pending.get_mut(&ticket)
                    {
                        *retry_at = None;
                    }
                    self.try_remove(ticket, now);
                }
            }
        }
        self.defer_retired();
        removes != self.stats.removes
    }

    /// The last lease of `ticket`'s entry was dropped: remove it if it was awaited.
    fn lease_released(&mut self, ticket: u64) {
        let awaited = matches!(
            self.pending.get(&ticket),
            Some(Pending {
                wait: Wait::Held { awaited: true, .. },
                ..
            })
        );
        if awaited {
            self.try_remove(ticket, Instant::now());
        }
    }

    fn occupied(&self) -> usize {
        let live = usize::try_from(self.stats.entries).unwrap_or(usize::MAX);
        live.saturating_add(self.pending.len())
    }

    /// The entry at `fi_addr`.
    fn entry(&self, fi_addr: fi_addr_t) -> Option<&Entry> {
        entry_in(&self.entries, fi_addr)
    }

    fn entry_mut(&mut self, fi_addr: fi_addr_t) -> Option<&mut Entry> {
        usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.entries.get_mut(index))
            .and_then(Option::as_mut)
    }

    /// The index of `identity`'s live or removing incarnation.
    fn slot(&self, identity: &[u8]) -> Option<fi_addr_t> {
        let entries = &self.entries;
        self.slots
            .find(self.hasher.hash_one(identity), |&fi_addr| {
                identity_at(entries, fi_addr) == identity
            })
            .copied()
    }

    /// `fi_av_insert`, refusing an index outside the table the lease counters cover, or one
    /// that an entry of ours still holds.
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let fi_addr = self.backend.insert(address)?;
        self.stats.inserts += 1;
        if self.entry(fi_addr).is_some() {
            // The AV handed out an index it still holds for us: removing it would remove ours.
            return Err(DmaError::Fabric {
                call: "fi_av_insert",
                code: 0,
                message: format!(
                    "the provider returned index {fi_addr}, which it already holds for another address"
                ),
            });
        }
        if self.shared.leases.covers(fi_addr) {
            return Ok(fi_addr);
        }
        // FI_AV_TABLE hands out indices below the count the AV was opened with; one that is not
        // cannot be leased, so it goes straight back.
        self.stats.removes += 1;
        if let Err(error) = self.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            tracing::error!(op = "remove_failed", fi_addr, %error, "fi_av_remove of an index outside the table failed");
        }
        Err(DmaError::Fabric {
            call: "fi_av_insert",
            code: 0,
            message: format!(
                "the provider returned index {fi_addr}, outside the table of {} entries the address vector was opened with",
                self.capacity
            ),
        })
    }

    /// Record a new live entry at `fi_addr` (an index `insert` answered, so below the capacity)
    /// and its identity's slot.
    fn install(&mut self, fi_addr: fi_addr_t, address: StoredAddress) {
        let Ok(index) = usize::try_from(fi_addr) else {
            return;
        };
        if self.entries.len() <= index {
            self.entries.resize_with(index + 1, || None);
        }
        let hash = self.hasher.hash_one(address.identity());
        self.entries[index] = Some(Entry {
            address,
            holders: Holders::None,
            removal: LIVE,
        });
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.slots.insert_unique(hash, fi_addr, |&fi_addr| {
            hasher.hash_one(identity_at(entries, fi_addr))
        });
        self.stats.entries += 1;
    }

    fn resolve(&mut self, client: u64, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let identity_len = self.format.identity_len(address, self.address_len)?;
        let identity = &address[..identity_len];
        self.shared.failures.clear(client);

        // Already registered on exactly this? A reader raced its own earlier miss.
        if let Some(&holding) = self.clients.get(&client) {
            let fi_addr = holding.fi_addr();
            if holding.is_parked() {
                if self.parked.get(&fi_addr).is_some_and(|parked| {
                    parked.address.bytes() == address && parked.clients.contains(&client)
                }) {
                    return Err(DmaError::WouldBlock);
                }
            } else if self.entry(fi_addr).is_some_and(|entry| {
                entry.is_live()
                    && entry.address.bytes() == address
                    && entry.holders.contains(client)
            }) {
                return Ok(fi_addr);
            }
        }

        // A brand-new identity needs an insert, which may fail: do it before anything changes.
        if self.slot(identity).is_none() {
            if self.occupied() >= self.capacity {
                return Err(DmaError::Capacity {
                    capacity: self.capacity,
                });
            }
            let fi_addr = self.insert(address)?;
            tracing::debug!(op = "insert", client, fi_addr, "fi_av_insert");
            // The client's previous registration goes before its new one comes in.
            self.detach(client);
            self.install(fi_addr, StoredAddress::new(address, identity_len));
            self.register(client, fi_addr);
            return Ok(fi_addr);
        }

        // The client's previous registration goes before its new one comes in.
        self.detach(client);
        self.join(client, identity, address)
    }

    /// Register `client` on an identity that already has a slot.
    fn join(
        &mut self,
        client: u64,
        identity: &[u8],
        address: &[u8],
    ) -> Result<fi_addr_t, DmaError> {
        // Detaching never drops a slot (a retired entry keeps it until removed), so this finds
        // one; answer as a busy writer would rather than guess if it does not.
        let Some(fi_addr) = self.slot(identity) else {
            return Err(DmaError::WouldBlock);
        };
        let Some(entry) = self.entry(fi_addr) else {
            return Err(DmaError::WouldBlock);
        };
        let (same, live, removal) = (
            entry.address.bytes() == address,
            entry.is_live(),
            entry.removal,
        );
        if live {
            if same {
                self.register(client, fi_addr);
                return Ok(fi_addr);
            }
            // A new incarnation of a slot that others still hold: the old one is dead.
            self.evict_live(client, fi_addr);
            self.park(client, fi_addr, address, identity.len());
            return Err(DmaError::WouldBlock);
        }
        if same {
            // The very incarnation whose removal is pending: its fi_addr_t still maps to these
            // bytes (a removal that failed left it in the AV too), so it can be published again
            // and its removal cancelled.
            self.evict_parked(client, fi_addr);
            if let Some(Pending {
                wait: Wait::Held {
                    retry_at, awaited, ..
                },
                ..
            }) = self.pending.remove(&removal)
            {
                if awaited {
                    self.awaiting_leases -= 1;
                    self.shared.leases.stop_awaiting(fi_addr);
                }
                if let Some(at) = retry_at {
                    self.retries.remove(&(at, removal));
                }
            }
            if let Some(entry) = self.entry_mut(fi_addr) {
                entry.removal = LIVE;
            }
            self.stats.entries += 1;
            tracing::debug!(
                op = "revive",
                client,
                fi_addr,
                "revived an entry awaiting removal"
            );
            self.register(client, fi_addr);
            return Ok(fi_addr);
        }
        self.park(client, fi_addr, address, identity.len());
        Err(DmaError::WouldBlock)
    }

    /// Evict the live entry at `fi_addr` and every client on it.
    fn evict_live(&mut self, asking: u64, fi_addr: fi_addr_t) {
        let Some(entry) = self.entry_mut(fi_addr).filter(|entry| entry.is_live()) else {
            return;
        };
        let holders = std::mem::take(&mut entry.holders);
        let evicted = holders.len();
        for holder in holders.to_vec() {
            self.unregister(holder, fi_addr);
            self.clients.remove(&holder);
            if holder != asking {
                if let Some(hook) = self.shared.on_evict.get() {
                    hook(holder);
                }
            }
        }
        self.stats.entries -= 1;
        self.stats.evictions += 1;
        self.stats.evicted_clients += evicted as u64;
        tracing::warn!(
            op = "evict",
            client = asking,
            evicted,
            fi_addr,
            "a recycled endpoint slot was advertised again: evicted its stale incarnation and the clients that held it"
        );
        self.retire(fi_addr);
    }

    /// Drop the clients waiting on the incarnation parked behind `fi_addr`: a newer one
    /// supersedes it.
    fn evict_parked(&mut self, asking: u64, fi_addr: fi_addr_t) {
        let Some(mut parked) = self.parked.remove(&fi_addr) else {
            return;
        };
        for waiter in &parked.clients {
            self.clients.remove(waiter);
        }
        parked.turn_away(None);
        self.stats.evictions += 1;
        self.stats.evicted_clients += parked.clients.len() as u64;
        tracing::warn!(
            op = "evict",
            client = asking,
            evicted = parked.clients.len(),
            "an incarnation waiting to enter the AV was superseded before it got in"
        );
    }

    /// Queue `client` on the incarnation `address`, which enters the AV once the removal of the
    /// entry at `fi_addr` has run.
    fn park(&mut self, client: u64, fi_addr: fi_addr_t, address: &[u8], identity_len: usize) {
        if self
            .parked
            .get(&fi_addr)
            .is_some_and(|parked| parked.address.bytes() != address)
        {
            self.evict_parked(client, fi_addr);
        }
        self.parked
            .entry(fi_addr)
            .or_insert_with(|| {
                Box::new(Parked {
                    address: StoredAddress::new(address, identity_len),
                    clients: HashSet::default(),
                    waiters: Vec::new(),
                })
            })
            .clients
            .insert(client);
        self.clients.insert(client, Holding::parked(fi_addr));
        tracing::debug!(
            op = "park",
            client,
            "parked behind the removal of a stale incarnation"
        );
    }

    /// Publish `client`'s registration on the live entry at `fi_addr`.
    fn register(&mut self, client: u64, fi_addr: fi_addr_t) {
        let Some(entry) = self.entry_mut(fi_addr) else {
            return;
        };
        let added = entry.holders.insert(client);
        let registration = Registration::new(client, entry.address.clone());
        if added {
            self.stats.clients += 1;
        }
        self.clients.insert(client, Holding::live(fi_addr));
        self.shared.index.publish(registration, fi_addr);
    }

    /// Unlink `client`'s registration on the entry at `fi_addr` from the index.
    fn unregister(&mut self, client: u64, fi_addr: fi_addr_t) {
        self.shared
            .index
            .unlink(client, identity_at(&self.entries, fi_addr));
        self.stats.clients -= 1;
    }

    /// Let go of whatever `client` holds or waits for; retire the entry if it was the last holder.
    fn detach(&mut self, client: u64) {
        let Some(holding) = self.clients.remove(&client) else {
            return;
        };
        let fi_addr = holding.fi_addr();
        if holding.is_parked() {
            if let Some(parked) = self.parked.get_mut(&fi_addr) {
                if parked.clients.remove(&client) {
                    parked.turn_away(Some(client));
                    if parked.clients.is_empty() {
                        self.parked.remove(&fi_addr);
                    }
                }
            }
            return;
        }
        let Some(entry) = self.entry_mut(fi_addr).filter(|entry| entry.is_live()) else {
            return;
        };
        if !entry.holders.remove(client) {
            return;
        }
        let last = entry.holders.is_empty();
        self.unregister(client, fi_addr);
        if last {
            self.stats.entries -= 1;
            self.retire(fi_addr);
        }
    }

    /// Defer the removal of the entry at `fi_addr`, which is no longer in the index.
    fn retire(&mut self, fi_addr: fi_addr_t) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending.insert(
            ticket,
            Pending {
                fi_addr,
                wait: Wait::Readers,
            },
        );
        if let Some(entry) = self.entry_mut(fi_addr) {
            entry.removal = ticket;
        }
        self.retired_in_batch = true;
        // Deferred at the end of the batch, with every other ticket retired since the last
        // deferral (`defer_retired`).
    }

    /// Every reader that could have seen `ticket`'s entry has unpinned: remove it unless a lease
    /// still holds it.
    fn readers_gone(&mut self, ticket: u64) {
        let Some(pending) = self.pending.get_mut(&ticket) else {
            // Revived before its readers left; nothing to remove.
            return;
        };
        if Wait::Readers != pending.wait {
            return;
        }
        pending.wait = Wait::Held {
            retry_at: None,
            backoff: FIRST_RETRY,
            awaited: false,
        };
        self.try_remove(ticket, Instant::now());
    }

    /// Remove `ticket`'s entry unless a lease holds it (then await the last one's report) or a
    /// retry is due later; let in the incarnation parked behind it. Whether it is gone from
    /// `pending`.
    fn try_remove(&mut self, ticket: u64, now: Instant) -> bool {
        let Some(pending) = self.pending.get_mut(&ticket) else {
            return true;
        };
        let Wait::Held {
            retry_at,
            backoff,
            awaited,
        } = pending.wait
        else {
            return false;
        };
        if retry_at.is_some() {
            return false;
        }
        let fi_addr = pending.fi_addr;
        if self.shared.leases.await_release(fi_addr) {
            if !awaited {
                pending.wait = Wait::Held {
                    retry_at,
                    backoff,
                    awaited: true,
                };
                self.awaiting_leases += 1;
            }
            return false;
        }
        if awaited {
            self.awaiting_leases -= 1;
        }
        self.stats.removes += 1;
        if let Err(error) = self.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            let at = now + backoff;
            pending.wait = Wait::Held {
                retry_at: Some(at),
                backoff: (backoff * 2).min(LAST_RETRY),
                awaited: false,
            };
            self.retries.insert((at, ticket));
            tracing::warn!(op = "remove_failed", fi_addr, %error, retry_in = ?backoff, "fi_av_remove failed; the entry stays counted and its identity blocked until a retry succeeds");
            return false;
        }
        tracing::debug!(op = "remove", fi_addr, "fi_av_remove");
        self.shared.leases.stop_awaiting(fi_addr);
        self.pending.remove(&ticket);
        self.forget(fi_addr);
        if let Some(parked) = self.parked.remove(&fi_addr) {
            self.admit(*parked);
        }
        true
    }

    /// Drop the entry at `fi_addr`, removed from the AV, and its identity's slot.
    fn forget(&mut self, fi_addr: fi_addr_t) {
        let Some(entry) = usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.entries.get_mut(index))
            .and_then(Option::take)
        else {
            return;
        };
        let hash = self.hasher.hash_one(entry.address.identity());
        if let Ok(slot) = self.slots.find_entry(hash, |&held| held == fi_addr) {
            slot.remove();
        }
    }

    /// Insert a parked incarnation now that the old one has left the AV.
    fn admit(&mut self, parked: Parked) {
        match self.insert(parked.address.bytes()) {
            Ok(fi_addr) => {
                tracing::debug!(
                    op = "insert",
                    fi_addr,
                    waiting = parked.clients.len(),
                    "fi_av_insert of a parked incarnation"
                );
                self.install(fi_addr, parked.address);
                for &client in &parked.clients {
                    self.register(client, fi_addr);
                }
                for (_, reply) in parked.waiters {
                    self.replies.push((reply, Ok(fi_addr)));
                }
            }
            Err(error) => {
                tracing::warn!(op = "insert_failed", %error, waiting = parked.clients.len(), "fi_av_insert of a parked incarnation failed; its clients must resolve again");
                for client in &parked.clients {
                    self.clients.remove(client);
                }
                for (_, reply) in parked.waiters {
                    self.replies.push((reply, Err(error.clone())));
                }
            }
        }
    }

    /// Publish the counters: O(1), and the tables' shrink checks.
    fn publish_stats(&mut self) {
        self.stats.pending_removals = self.pending.len() as u64;
        self.stats.removals_awaiting_leases = self.awaiting_leases;
        self.shared.counters.publish(&self.stats);
        self.shrink();
    }

    /// Give memory back once the tables have emptied well below their peak, so the writer's
    /// memory follows the live entries rather than the most it ever held (invariant 4).
    fn shrink(&mut self) {
        fn roomy(capacity: usize, len: usize) -> bool {
            capacity > 64 && capacity > 4 * len
        }
        if roomy(self.clients.capacity(), self.clients.len()) {
            self.clients.shrink_to(2 * self.clients.len());
        }
        if roomy(self.parked.capacity(), self.parked.len()) {
            self.parked.shrink_to(2 * self.parked.len());
        }
        if roomy(self.slots.capacity(), self.slots.len()) {
            let (entries, hasher) = (&self.entries, &self.hasher);
            self.slots.shrink_to(2 * self.slots.len(), |&fi_addr| {
                hasher.hash_one(identity_at(entries, fi_addr))
            });
        }
        // Indices are handed out lowest first, so the table ends at the highest one in use.
        if self.entries.last().is_some_and(Option::is_none) {
            let used = self
                .entries
                .iter()
                .rposition(Option::is_some)
                .map_or(0, |last| last + 1);
            self.entries.truncate(used);
        }
        if roomy(self.entries.capacity(), self.entries.len()) {
            self.entries.shrink_to(2 * self.entries.len());
        }
        if roomy(self.scratch.capacity(), self.pending.len()) {
            self.scratch.shrink_to(2 * self.pending.len());
        }
    }

    /// No reader and no lease can exist any more (the cache is being dropped, and every `Pinned`
    /// and every `Lease` borrows it), so everything is removed now, pending removals first.
    fn shutdown(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.retries.clear();
        self.awaiting_leases = 0;
        for (_, pending) in pending {
            self.remove_at_shutdown(pending.fi_addr);
            self.forget(pending.fi_addr);
        }
        for fi_addr in 0..self.entries.len() as fi_addr_t {
            let Some(entry) = self.entry_mut(fi_addr) else {
                continue;
            };
            let holders = std::mem::take(&mut entry.holders);
            for client in holders.to_vec() {
                self.unregister(client, fi_addr);
            }
            self.stats.entries -= 1;
            self.remove_at_shutdown(fi_addr);
            self.forget(fi_addr);
        }
        // Waiters on a parked incarnation are told `Closed` when their senders drop with it.
        self.parked.clear();
        self.clients.clear();
        for quiescer in self.quiescing.drain(..) {
            let _ = quiescer.reply.send(());
        }
        self.publish_stats();
        tracing::debug!(
            inserts = self.stats.inserts,
            removes = self.stats.removes,
            failed_removes = self.stats.failed_removes,
            "address cache writer stopped"
        );
    }

    /// `fi_av_remove` at shutdown, tried a few times: there is no later to retry in.
    fn remove_at_shutdown(&mut self, fi_addr: fi_addr_t) {
        for attempt in 1..=3 {
            self.stats.removes += 1;
            match self.backend.remove(fi_addr) {
                Ok(()) => return,
                Err(error) => {
                    self.stats.failed_removes += 1;
                    tracing::error!(op = "remove_failed", fi_addr, attempt, %error, "fi_av_remove failed at shutdown");
                }
            }
        }
    }
}
