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

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crossbeam_epoch::LocalHandle;

use super::index::{Index, Registration, RegistrationIndex};
use super::stats::{CacheStats, Counters};
use crate::address::AddressFormat;
use crate::cache::AvBackend;
use crate::error::DmaError;
use crate::sync::{Arc, mpsc, recv_spinning};
use crate::sys::fi_addr_t;

/// What the writer is asked to do. Requests are applied in the order they arrive.
pub(crate) enum Request {
    /// Register `client` on `address`; reply with its `fi_addr_t`, or not at all for
    /// `try_resolve`.
    Resolve {
        client: u64,
        address: Box<[u8]>,
        reply: Option<mpsc::Sender<Result<fi_addr_t, DmaError>>>,
    },
    /// Let go of `client`'s registration.
    Release { client: u64 },
    /// Reply once every removal whose readers are gone has run, or once the rest have made no
    /// progress for `patience`.
    Quiesce {
        reply: mpsc::Sender<()>,
        patience: Duration,
    },
    /// A deferred removal's readers are gone: remove it now.
    Reclaimed { ticket: u64 },
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
}

/// How long the writer polls for the next request before it parks: long enough to stay awake
/// through a burst of misses, short enough not to hold a core when idle.
const IDLE_SPIN: Duration = Duration::from_micros(30);

/// The shortest wait between epoch advances while removals are pending.
const FIRST_TICK: Duration = Duration::from_micros(50);
/// The longest, reached by doubling while readers hold the epoch back.
const LAST_TICK: Duration = Duration::from_millis(10);
/// Epoch advances in a row that free nothing before `quiesce` starts to suspect that the rest of
/// the pending removals are held back by pinned readers. With no reader pinned, two advances
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
}

struct Live {
    address: Box<[u8]>,
    fi_addr: fi_addr_t,
    clients: HashSet<u64>,
}

struct Parked {
    address: Box<[u8]>,
    clients: HashSet<u64>,
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

struct Pending {
    identity: Box<[u8]>,
    address: Box<[u8]>,
    fi_addr: fi_addr_t,
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
    pending: HashMap<u64, Pending>,
    next_ticket: u64,
    stats: CacheStats,
    epoch: LocalHandle,
    inbox: mpsc::Receiver<Request>,
    outbox: mpsc::Sender<Request>,
    quiescing: Vec<Quiescer>,
}

impl<B: AvBackend> Writer<B> {
    pub(crate) fn new(
        backend: B,
        shared: Arc<Shared>,
        epoch: LocalHandle,
        inbox: mpsc::Receiver<Request>,
        outbox: mpsc::Sender<Request>,
    ) -> Self {
        Self {
            format: backend.format(),
            address_len: backend.address_len(),
            capacity: backend.capacity(),
            backend,
            shared,
            slots: HashMap::new(),
            clients: HashMap::new(),
            pending: HashMap::new(),
            next_ticket: 0,
            stats: CacheStats::default(),
            epoch,
            inbox,
            outbox,
            quiescing: Vec::new(),
        }
    }

    /// Serve requests until shutdown, then remove everything.
    pub(crate) fn run(mut self) {
        let mut tick = FIRST_TICK;
        let mut stalled = 0;
        let mut pending_at_last_round = usize::MAX;
        let mut pending_at_last_tick = usize::MAX;
        // When the pending removals last shrank, or a quiesce arrived: what patience counts from.
        let mut last_progress = Instant::now();
        loop {
            // Quiescing, the first rounds run back to back; once they suspect a pinned reader,
            // the writer sleeps between rounds so that reader gets the core to finish on.
            let hurry = self.pending.is_empty() || stalled < STALLED_ROUNDS || cfg!(dma_loom);
            let request = if !self.quiescing.is_empty() && hurry {
                match self.inbox.try_recv() {
                    Ok(request) => Some(request),
                    Err(std::sync::mpsc::TryRecvError::Empty) => None,
                    Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                }
            } else if !self.pending.is_empty() && cfg!(not(dma_loom)) {
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
            match request {
                Some(Request::Shutdown) => break,
                Some(Request::Quiesce { reply, patience }) => {
                    self.quiescing.push(Quiescer { reply, patience });
                    stalled = 0;
                    pending_at_last_round = usize::MAX;
                    last_progress = Instant::now();
                    tick = FIRST_TICK;
                }
                Some(request) => self.apply(request),
                None => {
                    // Nothing queued: move the epoch on, so deferred removals run without reader
                    // traffic. Their tickets come back through the inbox.
                    // Freed tickets arrive through the inbox after the advance that ran them, so
                    // progress shows between one idle round and the next: back off only while a
                    // pinned reader holds everything up.
                    if self.pending.len() < pending_at_last_tick {
                        tick = FIRST_TICK;
                    } else {
                        tick = (tick * 2).min(LAST_TICK);
                    }
                    pending_at_last_tick = self.pending.len();
                    self.advance();
                    if !self.quiescing.is_empty() {
                        if self.pending.len() < pending_at_last_round {
                            stalled = 0;
                            last_progress = Instant::now();
                        } else {
                            stalled += 1;
                        }
                        pending_at_last_round = self.pending.len();
                        self.answer_quiescers(stalled >= STALLED_ROUNDS, last_progress);
                    }
                }
            }
            self.publish_stats();
        }
        self.shutdown();
    }

    /// Answer every quiescer that has nothing left to wait for: no removal pending, or the rest
    /// stalled for longer than its patience. Under loom time does not pass, so rounds decide.
    fn answer_quiescers(&mut self, stalled: bool, last_progress: Instant) {
        let done = self.pending.is_empty();
        if !done && !stalled {
            return;
        }
        let waited = last_progress.elapsed();
        let mut answered = false;
        let mut index = 0;
        while index < self.quiescing.len() {
            let patience = self.quiescing[index].patience;
            if done || cfg!(dma_loom) || waited >= patience {
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
                if let Some(reply) = reply {
                    // A caller that stopped waiting has nothing to be told.
                    let _ = reply.send(result);
                }
            }
            Request::Release { client } => self.detach(client),
            Request::Reclaimed { ticket } => self.reclaimed(ticket),
            Request::Quiesce { .. } | Request::Shutdown => {}
        }
    }

    /// Pin, flush this thread's deferred closures to the collector, and let it collect.
    fn advance(&mut self) {
        let guard = self.epoch.pin();
        guard.flush();
    }

    fn occupied(&self) -> usize {
        let live = usize::try_from(self.stats.entries).unwrap_or(usize::MAX);
        live.saturating_add(self.pending.len())
    }

    fn resolve(&mut self, client: u64, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let identity_len = self.format.identity_len(address, self.address_len)?;
        let identity = &address[..identity_len];

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
            let fi_addr = self.backend.insert(address)?;
            self.stats.inserts += 1;
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
            // bytes, so it can be published again and its removal cancelled.
            self.evict_parked(client, identity);
            let ticket = self
                .slots
                .get_mut(identity)
                .and_then(|slot| slot.removing.take());
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
        let Some(parked) = self
            .slots
            .get_mut(identity)
            .and_then(|slot| slot.parked.take())
        else {
            return;
        };
        for waiter in &parked.clients {
            self.clients.remove(waiter);
        }
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
            if parked.clients.remove(&client) && parked.clients.is_empty() {
                slot.parked = None;
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
            },
        );
        if let Some(slot) = self.slots.get_mut(identity) {
            slot.removing = Some(ticket);
        }
        let outbox = self.outbox.clone();
        let guard = self.epoch.pin();
        guard.defer(move || {
            // The writer may have shut down, having removed everything itself.
            let _ = outbox.send(Request::Reclaimed { ticket });
        });
        // A deferred closure waits in this thread's bag until it is flushed; flush now so that
        // readers' pins can collect it too.
        guard.flush();
    }

    /// Every reader that could have seen `ticket`'s entry has unpinned: remove it, and let in the
    /// incarnation parked behind it.
    fn reclaimed(&mut self, ticket: u64) {
        let Some(pending) = self.pending.remove(&ticket) else {
            // Revived before its readers left; nothing to remove.
            return;
        };
        self.stats.removes += 1;
        match self.backend.remove(pending.fi_addr) {
            Ok(()) => tracing::debug!(op = "remove", fi_addr = pending.fi_addr, "fi_av_remove"),
            Err(error) => {
                tracing::warn!(op = "remove_failed", fi_addr = pending.fi_addr, %error, "fi_av_remove failed");
            }
        }
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
    }

    /// Insert a parked incarnation now that the old one has left the AV.
    fn admit(&mut self, identity: &[u8], parked: Parked) {
        match self.backend.insert(&parked.address) {
            Ok(fi_addr) => {
                self.stats.inserts += 1;
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
            }
            Err(error) => {
                tracing::warn!(op = "insert_failed", %error, waiting = parked.clients.len(), "fi_av_insert of a parked incarnation failed; its clients must resolve again");
                for client in &parked.clients {
                    self.clients.remove(client);
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
        shrink_map(&mut self.pending);
    }

    /// No reader can exist any more (the cache is being dropped, and every `Pinned` borrows it),
    /// so everything is removed now, pending removals first.
    fn shutdown(&mut self) {
        let mut pending: Vec<_> = self.pending.drain().collect();
        pending.sort_by_key(|(ticket, _)| *ticket);
        for (_, pending) in pending {
            self.stats.removes += 1;
            if let Err(error) = self.backend.remove(pending.fi_addr) {
                tracing::warn!(op = "remove_failed", fi_addr = pending.fi_addr, %error, "fi_av_remove failed at shutdown");
            }
        }
        let slots: Vec<_> = self.slots.drain().collect();
        for (identity, slot) in slots {
            if let Some(live) = slot.live {
                for &client in &live.clients {
                    self.unregister(client, &identity);
                }
                self.stats.entries -= 1;
                self.stats.removes += 1;
                if let Err(error) = self.backend.remove(live.fi_addr) {
                    tracing::warn!(op = "remove_failed", fi_addr = live.fi_addr, %error, "fi_av_remove failed at shutdown");
                }
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
            "address cache writer stopped"
        );
    }
}
