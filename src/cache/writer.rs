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
//! its removal on the cache's epoch collector. A reader that found the registration was pinned
//! before the unlink, so the collector runs the deferred closure only after that reader unpins
//! (crossbeam-epoch's guarantee: a closure deferred while a participant is pinned runs after that
//! participant unpins). The closure itself only sends the ticket back to this thread, so
//! `fi_av_remove` always runs here, after every such reader has gone. A reader that pins after
//! the unlink cannot find the registration, because crossbeam's pin and the writer's flush are
//! `SeqCst` fences that order the unlink before that reader's probe.

//!
//! Once the readers are gone, a removal still waits for the entry's leases (see
//! [`super::lease`]): the writer reads the index's lease counter, and while it is not zero keeps
//! the ticket on its `held` list and reads again on later rounds. A failed `fi_av_remove` stays
//! on that list too, retried with a backoff: its entry still counts against the capacity and its
//! slot stays `removing`, so on efa no second incarnation goes in beside it.
//!
//! # Requests, backpressure and quiesce
//!
//! Requests arrive on a bounded channel ([`INBOX_BOUND`]): a flood of queued misses cannot grow
//! memory without bound; `resolve` and `release` wait for room, `try_resolve` does not queue and
//! answers `WouldBlock`. Reclaimed tickets come back on a channel of their own, so that a deferred
//! closure, which may run on the writer's own thread, never waits on a full inbox; the closure
//! then tries (without waiting) to put a [`Request::Nudge`] in the inbox, so a writer parked there
//! wakes to remove the entry instead of waiting out its tick.
//!
//! A quiescer records the ticket the next retirement would take: it is answered once no removal
//! older than that is pending (or those that are have made no progress for its patience), however
//! busy the inbox is after it. While removals are pending the writer moves the epoch on between
//! requests as well as when idle, so a busy inbox does not hold removals back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use crossbeam_epoch::LocalHandle;
use hashbrown::HashTable;

use super::failures::Failures;
use super::index::{Index, Registration, RegistrationIndex};
use super::lease::LeaseCounts;
use super::reply::Answer;
use super::stats::{CacheStats, Counters};
use super::stored::StoredAddress;
use crate::address::AddressFormat;
use crate::av::AvBackend;
use crate::error::DmaError;
use crate::sync::{Arc, Bounded, mpsc, recv_polling, recv_spinning};
use crate::sys::fi_addr_t;

/// How many requests the inbox holds before senders wait (or `try_resolve` gives up).
pub(crate) const INBOX_BOUND: usize = 4096;

/// The most requests applied between two publications of the counters: enough to share the
/// bookkeeping across a burst, few enough that a quiescer or a removal is not kept waiting.
const BATCH: usize = 64;

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

/// What the writer is asked to do. Requests are applied in the order they arrive.
pub(crate) enum Request {
    /// Register `client` on `address`.
    Resolve {
        client: u64,
        address: StoredAddress,
        reply: Reply,
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
    /// Nothing to apply: a deferred removal's readers have gone (its ticket is on the reclaims
    /// channel), and a writer parked on its inbox should wake to collect it.
    Nudge,
}

/// What readers and the writer share.
pub(crate) struct Shared {
    pub(crate) index: Index,
    pub(crate) counters: Counters,
    pub(crate) leases: LeaseCounts,
    pub(crate) failures: Failures,
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
    /// Its readers are gone; it is on the `held` list, removed once its leases are dropped and
    /// any retry is due.
    Held {
        retry_at: Option<Instant>,
        backoff: Duration,
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
    /// Tickets whose readers are gone but whose removal waits for leases or a retry.
    held: Vec<u64>,
    next_ticket: u64,
    stats: CacheStats,
    epoch: LocalHandle,
    inbox: mpsc::Receiver<Request>,
    reclaims: mpsc::Receiver<u64>,
    reclaimed: mpsc::Sender<u64>,
    /// The inbox, for deferred closures to wake the writer with a [`Request::Nudge`]: without
    /// it a reclaimed ticket waited for the writer's next timeout (up to `LAST_TICK`).
    nudge: Bounded<Request>,
    quiescing: Vec<Quiescer>,
    /// This batch's answers, sent once its counters are published.
    replies: Vec<(Answer, Result<fi_addr_t, DmaError>)>,
    /// Whether this batch deferred removals that the collector has not been handed yet.
    unflushed: bool,
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
        nudge: Bounded<Request>,
    ) -> Self {
        let (reclaimed, reclaims) = mpsc::channel();
        Self {
            format: backend.format(),
            address_len: backend.address_len(),
            capacity: backend.capacity(),
            backend,
            shared,
            entries: Vec::new(),
            slots: HashTable::new(),
            hasher: Hasher::default(),
            parked: HashMap::default(),
            clients: HashMap::default(),
            pending: BTreeMap::new(),
            held: Vec::new(),
            next_ticket: 0,
            stats: CacheStats::default(),
            epoch,
            inbox,
            reclaims,
            reclaimed,
            nudge,
            quiescing: Vec::new(),
            replies: Vec::new(),
            unflushed: false,
        }
    }

    /// Serve requests until shutdown, then remove everything.
    pub(crate) fn run(mut self) {
        let mut tick = FIRST_TICK;
        let mut pending_at_last_tick = usize::MAX;
        let mut last_advance = Instant::now();
        let mut last_request = Instant::now();
        loop {
            // Removals may have let parked incarnations in: publish them and answer their waiters
            // before waiting for the next request.
            if self.collect() || !self.replies.is_empty() || self.unflushed {
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
            let waiting = !self.pending.is_empty() || !self.quiescing.is_empty();
            let request = if hurry {
                match self.inbox.try_recv() {
                    Ok(request) => Some(request),
                    Err(std::sync::mpsc::TryRecvError::Empty) => None,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                }
            } else if waiting && cfg!(not(dma_loom)) {
                // Poll first, as when idle, for what is left of `IDLE_SPIN` since the last
                // request: a miss that finds the writer parked pays a wake-up, and while removals
                // are pending (most of the time under churn) that would be every miss. Polling
                // longer than that, with no traffic, only took the core from the readers whose
                // pins move the epoch on (the reclamation bench's delay went from 0.15 to 4 ms).
                let spin = IDLE_SPIN.saturating_sub(last_request.elapsed()).min(tick);
                match recv_polling(&self.inbox, spin, tick) {
                    Ok(request) => Some(request),
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match recv_spinning(&self.inbox, IDLE_SPIN) {
                    Ok(request) => Some(request),
                    Err(_) => break,
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
            // Move the epoch on so deferred removals run without reader traffic: when idle, and,
            // while removals are pending, between requests too, at most once a tick (loom has no
            // time, so there it advances only when idle).
            let due = !self.pending.is_empty()
                && cfg!(not(dma_loom))
                && last_advance.elapsed() >= FIRST_TICK;
            if idle || due {
                // Freed tickets arrive on the reclaims channel after the advance that ran them, so
                // progress shows between one round and the next: back off only while readers or
                // leases hold everything up.
                if self.pending.len() < pending_at_last_tick {
                    tick = FIRST_TICK;
                } else if idle {
                    tick = (tick * 2).min(LAST_TICK);
                }
                pending_at_last_tick = self.pending.len();
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
        if self.unflushed {
            // A deferred closure waits in this thread's bag until it is flushed; flush so that
            // readers' pins can collect it too.
            self.epoch.pin().flush();
            self.unflushed = false;
        }
        // Counters first, so a caller reading them after its reply sees its request.
        self.publish_stats();
        for (answer, result) in self.replies.drain(..) {
            answer.send(result);
        }
    }

    /// One round for the quiescers: count what each still waits for, note progress or a stall.
    fn round(&mut self) {
        for quiescer in &mut self.quiescing {
            let waiting_on = self.pending.range(..quiescer.watermark).count();
            if waiting_on < quiescer.waiting_on {
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
            Request::Release { client } => {
                self.shared.failures.clear(client);
                self.detach(client);
            }
            Request::Quiesce { .. } | Request::Shutdown | Request::Nudge => {}
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
            Some(parked) => parked.waiters.push((client, reply)),
            None => self.replies.push((reply, Err(DmaError::WouldBlock))),
        }
    }

    /// Pin, flush this thread's deferred closures to the collector, and let it collect.
    fn advance(&mut self) {
        let guard = self.epoch.pin();
        guard.flush();
        self.unflushed = false;
    }

    /// Take the tickets whose readers have gone, and remove what no lease holds any more.
    /// Whether anything was removed.
    fn collect(&mut self) -> bool {
        let removes = self.stats.removes;
        while let Ok(ticket) = self.reclaims.try_recv() {
            self.readers_gone(ticket);
        }
        if !self.held.is_empty() {
            let now = Instant::now();
            let mut index = 0;
            while index < self.held.len() {
                let ticket = self.held[index];
                if self.try_remove(ticket, now) {
                    self.held.swap_remove(index);
                } else {
                    index += 1;
                }
            }
        }
        removes != self.stats.removes
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
            self.held.retain(|held| *held != removal);
            self.pending.remove(&removal);
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
        let reclaimed = self.reclaimed.clone();
        let nudge = self.nudge.clone();
        let guard = self.epoch.pin();
        guard.defer(move || {
            // The writer may have shut down, having removed everything itself.
            let _ = reclaimed.send(ticket);
            // Never waits: a full inbox means a busy writer, which collects at its next request.
            // (Under loom the writer advances the epoch itself and collects after, so the models
            // do without the extra request.)
            if cfg!(not(dma_loom)) {
                let _ = nudge.try_send(Request::Nudge);
            }
        });
        // Handed to the collector at the end of the batch (`finish_batch`).
        self.unflushed = true;
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
        };
        if !self.try_remove(ticket, Instant::now()) {
            self.held.push(ticket);
        }
    }

    /// Remove `ticket`'s entry if no lease holds it and no retry is due later; let in the
    /// incarnation parked behind it. Whether it is gone from `pending`.
    fn try_remove(&mut self, ticket: u64, now: Instant) -> bool {
        let Some(pending) = self.pending.get_mut(&ticket) else {
            return true;
        };
        let Wait::Held { retry_at, backoff } = pending.wait else {
            return false;
        };
        if retry_at.is_some_and(|at| now < at && cfg!(not(dma_loom))) {
            return false;
        }
        let fi_addr = pending.fi_addr;
        if self.shared.leases.held(fi_addr) {
            return false;
        }
        self.stats.removes += 1;
        if let Err(error) = self.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            pending.wait = Wait::Held {
                retry_at: Some(now + backoff),
                backoff: (backoff * 2).min(LAST_RETRY),
            };
            tracing::warn!(op = "remove_failed", fi_addr, %error, retry_in = ?backoff, "fi_av_remove failed; the entry stays counted and its identity blocked until a retry succeeds");
            return false;
        }
        tracing::debug!(op = "remove", fi_addr, "fi_av_remove");
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

    fn publish_stats(&mut self) {
        self.stats.pending_removals = self.pending.len() as u64;
        let leases = &self.shared.leases;
        let pending = &self.pending;
        self.stats.removals_awaiting_leases = self
            .held
            .iter()
            .filter_map(|ticket| pending.get(ticket))
            .filter(|pending| leases.held(pending.fi_addr))
            .count() as u64;
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
        if roomy(self.held.capacity(), self.held.len()) {
            self.held.shrink_to(2 * self.held.len());
        }
    }

    /// No reader and no lease can exist any more (the cache is being dropped, and every `Pinned`
    /// and every `Lease` borrows it), so everything is removed now, pending removals first.
    fn shutdown(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.held.clear();
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
