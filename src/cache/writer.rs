//! The writer thread: the only caller of `fi_av_insert` and `fi_av_remove`, the only owner of
//! who holds what, and the only thread that changes the index.
//!
//! # State
//!
//! Each identity (efa: GID + QPN; otherwise the whole address) has a [`Slot`] while anything
//! refers to it, in one of these shapes:
//!
//! - `live`: an incarnation in the AV, published in the index for each client that holds it;
//! - `removing`: an unlinked incarnation whose `fi_av_remove` waits for its readers to unpin;
//! - `removing` and `parked`: as above, plus a newer incarnation that clients asked for and that
//!   may enter the AV only once the old one has left it (efa's reverse AV holds one entry per GID
//!   and QPN). It is inserted when the removal runs, not before, and the rest of the queue goes on
//!   meanwhile.
//!
//! `live` and `removing` never coexist: a slot's incarnation is either published or on its way
//! out. Each client is in at most one slot, as a holder of its `live` or a waiter on its `parked`.
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
//! closure, which may run on the writer's own thread, never waits on a full inbox.
//!
//! A quiescer records the ticket the next retirement would take: it is answered once no removal
//! older than that is pending (or those that are have made no progress for its patience), however
//! busy the inbox is after it. While removals are pending the writer moves the epoch on between
//! requests as well as when idle, so a busy inbox does not hold removals back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crossbeam_epoch::LocalHandle;

use super::failures::Failures;
use super::index::{Index, Registration, RegistrationIndex};
use super::lease::LeaseCounts;
use super::stats::{CacheStats, Counters};
use crate::address::AddressFormat;
use crate::av::AvBackend;
use crate::error::DmaError;
use crate::sync::{Arc, mpsc, recv_spinning};
use crate::sys::fi_addr_t;

/// How many requests the inbox holds before senders wait (or `try_resolve` gives up).
pub(crate) const INBOX_BOUND: usize = 4096;

/// Where the writer's answer to a resolve goes.
pub(crate) enum Reply {
    /// Nobody waits (`try_resolve`): a failure is recorded in [`Failures`] instead.
    Queued,
    /// Answer at once, `WouldBlock` included (`resolve`).
    Now(mpsc::Sender<Result<fi_addr_t, DmaError>>),
    /// Answer once the entry is in the AV: a parked incarnation answers when it is admitted
    /// (`AddressCache::lease`).
    Admitted(mpsc::Sender<Result<fi_addr_t, DmaError>>),
}

/// What the writer is asked to do. Requests are applied in the order they arrive.
pub(crate) enum Request {
    /// Register `client` on `address`.
    Resolve {
        client: u64,
        address: Box<[u8]>,
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
}

/// `recv_timeout`, which loom's channel lacks: under loom time does not pass, so the writer
/// advances epochs only when asked to quiesce, and this is never called.
#[cfg(not(dma_loom))]
fn recv_timeout(
    inbox: &mpsc::Receiver<Request>,
    tick: Duration,
) -> Result<Request, std::sync::mpsc::RecvTimeoutError> {
    inbox.recv_timeout(tick)
}

#[cfg(dma_loom)]
fn recv_timeout(
    inbox: &mpsc::Receiver<Request>,
    _tick: Duration,
) -> Result<Request, std::sync::mpsc::RecvTimeoutError> {
    inbox
        .recv()
        .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
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

struct Live {
    address: Box<[u8]>,
    fi_addr: fi_addr_t,
    clients: HashSet<u64>,
}

struct Parked {
    address: Box<[u8]>,
    clients: HashSet<u64>,
    /// Callers of `AddressCache::lease` waiting for this incarnation to enter the AV.
    waiters: Vec<(u64, mpsc::Sender<Result<fi_addr_t, DmaError>>)>,
}

impl Parked {
    /// Tell `client`'s waiters (every waiter, for `None`) that this incarnation will not get in
    /// for them: they resolve again.
    fn turn_away(&mut self, client: Option<u64>) {
        self.waiters.retain(|(waiter, reply)| {
            if client.is_some_and(|client| client != *waiter) {
                return true;
            }
            // A waiter that gave up has nothing to be told.
            let _ = reply.send(Err(DmaError::WouldBlock));
            false
        });
    }
}

#[derive(Default)]
struct Slot {
    live: Option<Live>,
    removing: Option<u64>,
    /// Boxed: rare, and it would double every slot's size inline.
    parked: Option<Box<Parked>>,
}

impl Slot {
    fn is_empty(&self) -> bool {
        self.live.is_none() && self.removing.is_none() && self.parked.is_none()
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

struct Pending {
    identity: Box<[u8]>,
    address: Box<[u8]>,
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
    slots: HashMap<Box<[u8]>, Slot>,
    clients: HashMap<u64, Box<[u8]>>,
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
    quiescing: Vec<Quiescer>,
}

impl<B: AvBackend> Writer<B> {
    pub(crate) fn new(
        backend: B,
        shared: Arc<Shared>,
        epoch: LocalHandle,
        inbox: mpsc::Receiver<Request>,
    ) -> Self {
        let (reclaimed, reclaims) = mpsc::channel();
        Self {
            format: backend.format(),
            address_len: backend.address_len(),
            capacity: backend.capacity(),
            backend,
            shared,
            slots: HashMap::new(),
            clients: HashMap::new(),
            pending: BTreeMap::new(),
            held: Vec::new(),
            next_ticket: 0,
            stats: CacheStats::default(),
            epoch,
            inbox,
            reclaims,
            reclaimed,
            quiescing: Vec::new(),
        }
    }

    /// Serve requests until shutdown, then remove everything.
    pub(crate) fn run(mut self) {
        let mut tick = FIRST_TICK;
        let mut pending_at_last_tick = usize::MAX;
        let mut last_advance = Instant::now();
        loop {
            self.collect();
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
                match recv_timeout(&self.inbox, tick) {
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
            match request {
                Some(Request::Shutdown) => break,
                Some(Request::Quiesce { reply, patience }) => {
                    self.quiescing.push(Quiescer {
                        reply,
                        patience,
                        watermark: self.next_ticket,
                        waiting_on: usize::MAX,
                        stalled: 0,
                        progress_at: Instant::now(),
                    });
                    tick = FIRST_TICK;
                }
                Some(request) => self.apply(request),
                None => {}
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
            }
            self.publish_stats();
        }
        self.shutdown();
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
                let result = self.resolve(client, &address);
                // Counters first, so a caller reading them after its reply sees this request.
                self.publish_stats();
                match reply {
                    Reply::Queued => match &result {
                        Ok(_) | Err(DmaError::WouldBlock) => {}
                        Err(error) => {
                            tracing::warn!(op = "queued_miss_failed", client, %error, "a queued miss failed; the next try_resolve of this client and address returns the error");
                            self.shared.failures.record(client, &address, error.clone());
                        }
                    },
                    // A caller that stopped waiting has nothing to be told.
                    Reply::Now(reply) => {
                        let _ = reply.send(result);
                    }
                    Reply::Admitted(reply) => match result {
                        Err(DmaError::WouldBlock) => {
                            self.wait_for_admission(client, &address, reply)
                        }
                        result => {
                            let _ = reply.send(result);
                        }
                    },
                }
            }
            Request::Release { client } => {
                self.shared.failures.clear(client);
                self.detach(client);
            }
            Request::Quiesce { .. } | Request::Shutdown => {}
        }
    }

    /// `client` is parked on `address`: answer `reply` once that incarnation is in the AV.
    fn wait_for_admission(
        &mut self,
        client: u64,
        address: &[u8],
        reply: mpsc::Sender<Result<fi_addr_t, DmaError>>,
    ) {
        let parked = self
            .format
            .identity_len(address, self.address_len)
            .ok()
            .and_then(|identity_len| self.slots.get_mut(&address[..identity_len]))
            .and_then(|slot| slot.parked.as_mut())
            .filter(|parked| *parked.address == *address && parked.clients.contains(&client));
        match parked {
            Some(parked) => parked.waiters.push((client, reply)),
            None => {
                let _ = reply.send(Err(DmaError::WouldBlock));
            }
        }
    }

    /// Pin, flush this thread's deferred closures to the collector, and let it collect.
    fn advance(&mut self) {
        let guard = self.epoch.pin();
        guard.flush();
    }

    /// Take the tickets whose readers have gone, and remove what no lease holds any more.
    fn collect(&mut self) {
        while let Ok(ticket) = self.reclaims.try_recv() {
            self.readers_gone(ticket);
        }
        if self.held.is_empty() {
            return;
        }
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

    fn occupied(&self) -> usize {
        let live = usize::try_from(self.stats.entries).unwrap_or(usize::MAX);
        live.saturating_add(self.pending.len())
    }

    /// `fi_av_insert`, refusing an index outside the table the lease counters cover.
    fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let fi_addr = self.backend.insert(address)?;
        if self.shared.leases.covers(fi_addr) {
            self.stats.inserts += 1;
            return Ok(fi_addr);
        }
        // FI_AV_TABLE hands out indices below the count the AV was opened with; one that is not
        // cannot be leased, so it goes straight back.
        self.stats.inserts += 1;
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

    fn resolve(&mut self, client: u64, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let identity_len = self.format.identity_len(address, self.address_len)?;
        let identity = &address[..identity_len];
        self.shared.failures.clear(client);

        // Already registered on exactly this? A reader raced its own earlier miss.
        if self
            .clients
            .get(&client)
            .is_some_and(|held| **held == *identity)
        {
            if let Some(slot) = self.slots.get(identity) {
                if let Some(live) = slot.live.as_ref().filter(|live| *live.address == *address) {
                    if live.clients.contains(&client) {
                        return Ok(live.fi_addr);
                    }
                }
                if slot.parked.as_ref().is_some_and(|parked| {
                    *parked.address == *address && parked.clients.contains(&client)
                }) {
                    return Err(DmaError::WouldBlock);
                }
            }
        }

        // A brand-new identity needs an insert, which may fail: do it before anything changes.
        let inserted = if self.slots.contains_key(identity) {
            None
        } else {
            if self.occupied() >= self.capacity {
                return Err(DmaError::Capacity {
                    capacity: self.capacity,
                });
            }
            let fi_addr = self.insert(address)?;
            tracing::debug!(op = "insert", client, fi_addr, "fi_av_insert");
            Some(fi_addr)
        };

        // The client's previous registration goes before its new one comes in.
        self.detach(client);

        if let Some(fi_addr) = inserted {
            self.slots.insert(
                identity.into(),
                Slot {
                    live: Some(Live {
                        address: address.into(),
                        fi_addr,
                        clients: HashSet::new(),
                    }),
                    ..Slot::default()
                },
            );
            self.stats.entries += 1;
            self.register(client, identity, address, fi_addr);
            return Ok(fi_addr);
        }
        self.join(client, identity, address)
    }

    /// Register `client` on an identity that already has a slot.
    fn join(
        &mut self,
        client: u64,
        identity: &[u8],
        address: &[u8],
    ) -> Result<fi_addr_t, DmaError> {
        let Some(slot) = self.slots.get_mut(identity) else {
            // Detaching never drops a slot that has a live entry or a removal, so this is
            // unreachable; answer as a busy writer would rather than guess.
            return Err(DmaError::WouldBlock);
        };
        if let Some(live) = &slot.live {
            if *live.address == *address {
                let fi_addr = live.fi_addr;
                self.register(client, identity, address, fi_addr);
                return Ok(fi_addr);
            }
            // A new incarnation of a slot that others still hold: the old one is dead.
            self.evict_live(client, identity);
            self.park(client, identity, address);
            return Err(DmaError::WouldBlock);
        }
        let revivable = slot
            .removing
            .and_then(|ticket| self.pending.get(&ticket))
            .is_some_and(|pending| *pending.address == *address);
        if revivable {
            // The very incarnation whose removal is pending: its fi_addr_t still maps to these
            // bytes (a removal that failed left it in the AV too), so it can be published again
            // and its removal cancelled.
            self.evict_parked(client, identity);
            let ticket = self
                .slots
                .get_mut(identity)
                .and_then(|slot| slot.removing.take());
            if let Some(ticket) = ticket {
                self.held.retain(|held| *held != ticket);
            }
            if let Some(pending) = ticket.and_then(|ticket| self.pending.remove(&ticket)) {
                if let Some(slot) = self.slots.get_mut(identity) {
                    slot.live = Some(Live {
                        address: pending.address,
                        fi_addr: pending.fi_addr,
                        clients: HashSet::new(),
                    });
                }
                self.stats.entries += 1;
                tracing::debug!(
                    op = "revive",
                    client,
                    fi_addr = pending.fi_addr,
                    "revived an entry awaiting removal"
                );
                self.register(client, identity, address, pending.fi_addr);
                return Ok(pending.fi_addr);
            }
        }
        self.park(client, identity, address);
        Err(DmaError::WouldBlock)
    }

    /// Evict the live incarnation of `identity` and every client on it.
    fn evict_live(&mut self, asking: u64, identity: &[u8]) {
        let Some(live) = self
            .slots
            .get_mut(identity)
            .and_then(|slot| slot.live.take())
        else {
            return;
        };
        for &holder in &live.clients {
            self.unregister(holder, identity);
            self.clients.remove(&holder);
        }
        self.stats.entries -= 1;
        self.stats.evictions += 1;
        self.stats.evicted_clients += live.clients.len() as u64;
        tracing::warn!(
            op = "evict",
            client = asking,
            evicted = live.clients.len(),
            fi_addr = live.fi_addr,
            "a recycled endpoint slot was advertised again: evicted its stale incarnation and the clients that held it"
        );
        self.retire(identity, live.address, live.fi_addr);
    }

    /// Drop the clients waiting on `identity`'s parked incarnation: a newer one supersedes it.
    fn evict_parked(&mut self, asking: u64, identity: &[u8]) {
        let Some(mut parked) = self
            .slots
            .get_mut(identity)
            .and_then(|slot| slot.parked.take())
        else {
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

    /// Queue `client` on the incarnation `address` of `identity`, which enters the AV once the
    /// pending removal of the old one has run.
    fn park(&mut self, client: u64, identity: &[u8], address: &[u8]) {
        let parked_elsewhere = self
            .slots
            .get(identity)
            .and_then(|slot| slot.parked.as_ref())
            .is_some_and(|parked| *parked.address != *address);
        if parked_elsewhere {
            self.evict_parked(client, identity);
        }
        let Some(slot) = self.slots.get_mut(identity) else {
            return;
        };
        slot.parked
            .get_or_insert_with(|| {
                Box::new(Parked {
                    address: address.into(),
                    clients: HashSet::new(),
                    waiters: Vec::new(),
                })
            })
            .clients
            .insert(client);
        self.clients.insert(client, identity.into());
        tracing::debug!(
            op = "park",
            client,
            "parked behind the removal of a stale incarnation"
        );
    }

    /// Publish `client`'s registration on the live entry of `identity`.
    fn register(&mut self, client: u64, identity: &[u8], address: &[u8], fi_addr: fi_addr_t) {
        if let Some(live) = self
            .slots
            .get_mut(identity)
            .and_then(|slot| slot.live.as_mut())
        {
            if live.clients.insert(client) {
                self.stats.clients += 1;
            }
        }
        self.clients.insert(client, identity.into());
        self.shared
            .index
            .publish(Registration::new(client, address, identity.len()), fi_addr);
    }

    /// Unlink `client`'s registration on `identity` from the index.
    fn unregister(&mut self, client: u64, identity: &[u8]) {
        self.shared.index.unlink(client, identity);
        self.stats.clients -= 1;
    }

    /// Let go of whatever `client` holds or waits for; retire the entry if it was the last holder.
    fn detach(&mut self, client: u64) {
        let Some(identity) = self.clients.remove(&client) else {
            return;
        };
        let Some(slot) = self.slots.get_mut(&identity) else {
            return;
        };
        let mut retired = None;
        if let Some(live) = &mut slot.live {
            if live.clients.remove(&client) {
                if live.clients.is_empty() {
                    retired = slot.live.take();
                }
                self.unregister(client, &identity);
            }
        } else if let Some(parked) = &mut slot.parked {
            if parked.clients.remove(&client) {
                parked.turn_away(Some(client));
                if parked.clients.is_empty() {
                    slot.parked = None;
                }
            }
        }
        if let Some(live) = retired {
            self.stats.entries -= 1;
            self.retire(&identity, live.address, live.fi_addr);
        }
        self.tidy(&identity);
    }

    /// Defer the removal of an entry that is no longer in the index.
    fn retire(&mut self, identity: &[u8], address: Box<[u8]>, fi_addr: fi_addr_t) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending.insert(
            ticket,
            Pending {
                identity: identity.into(),
                address,
                fi_addr,
                wait: Wait::Readers,
            },
        );
        if let Some(slot) = self.slots.get_mut(identity) {
            slot.removing = Some(ticket);
        }
        let reclaimed = self.reclaimed.clone();
        let guard = self.epoch.pin();
        guard.defer(move || {
            // The writer may have shut down, having removed everything itself.
            let _ = reclaimed.send(ticket);
        });
        // A deferred closure waits in this thread's bag until it is flushed; flush now so that
        // readers' pins can collect it too.
        guard.flush();
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
        if self.shared.leases.held(pending.fi_addr) {
            return false;
        }
        self.stats.removes += 1;
        if let Err(error) = self.backend.remove(pending.fi_addr) {
            self.stats.failed_removes += 1;
            pending.wait = Wait::Held {
                retry_at: Some(now + backoff),
                backoff: (backoff * 2).min(LAST_RETRY),
            };
            tracing::warn!(op = "remove_failed", fi_addr = pending.fi_addr, %error, retry_in = ?backoff, "fi_av_remove failed; the entry stays counted and its identity blocked until a retry succeeds");
            return false;
        }
        tracing::debug!(op = "remove", fi_addr = pending.fi_addr, "fi_av_remove");
        let Some(pending) = self.pending.remove(&ticket) else {
            return true;
        };
        let identity = pending.identity;
        let parked = self.slots.get_mut(&identity).and_then(|slot| {
            if slot.removing == Some(ticket) {
                slot.removing = None;
            }
            slot.parked.take()
        });
        if let Some(parked) = parked {
            self.admit(&identity, *parked);
        }
        self.tidy(&identity);
        true
    }

    /// Insert a parked incarnation now that the old one has left the AV.
    fn admit(&mut self, identity: &[u8], parked: Parked) {
        match self.insert(&parked.address) {
            Ok(fi_addr) => {
                self.stats.entries += 1;
                tracing::debug!(
                    op = "insert",
                    fi_addr,
                    waiting = parked.clients.len(),
                    "fi_av_insert of a parked incarnation"
                );
                if let Some(slot) = self.slots.get_mut(identity) {
                    slot.live = Some(Live {
                        address: parked.address.clone(),
                        fi_addr,
                        clients: HashSet::new(),
                    });
                }
                for &client in &parked.clients {
                    self.register(client, identity, &parked.address, fi_addr);
                }
                for (_, reply) in parked.waiters {
                    let _ = reply.send(Ok(fi_addr));
                }
            }
            Err(error) => {
                tracing::warn!(op = "insert_failed", %error, waiting = parked.clients.len(), "fi_av_insert of a parked incarnation failed; its clients must resolve again");
                for client in &parked.clients {
                    self.clients.remove(client);
                }
                for (_, reply) in parked.waiters {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }

    fn tidy(&mut self, identity: &[u8]) {
        if self.slots.get(identity).is_some_and(Slot::is_empty) {
            self.slots.remove(identity);
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

    /// Give memory back once the maps have emptied well below their peak, so the writer's memory
    /// follows the live entries rather than the most it ever held (invariant 4).
    fn shrink(&mut self) {
        fn shrink_map<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
            if map.capacity() > 64 && map.capacity() > 4 * map.len() {
                map.shrink_to(2 * map.len());
            }
        }
        shrink_map(&mut self.slots);
        shrink_map(&mut self.clients);
        if self.held.capacity() > 64 && self.held.capacity() > 4 * self.held.len() {
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
        }
        let slots: Vec<_> = self.slots.drain().collect();
        for (identity, slot) in slots {
            if let Some(live) = slot.live {
                for &client in &live.clients {
                    self.unregister(client, &identity);
                }
                self.stats.entries -= 1;
                self.remove_at_shutdown(live.fi_addr);
            }
        }
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
