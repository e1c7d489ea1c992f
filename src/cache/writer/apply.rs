//! Applying requests to the writer's state: resolves (insert, join, park, evict), releases, and
//! admitting a parked incarnation once the entry it waited for is out (retirement and removal
//! are in `reclaim.rs`).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use super::state::{Holders, Holding, LIVE, Parked, Pending, Wait, Waiter};
use super::{Reply, Request, Writer};
use crate::av::AvBackend;
use crate::cache::index::RegistrationIndex;
use crate::cache::reply::Answer;
use crate::cache::stored::StoredAddress;
use crate::error::DmaError;
use dma_libfabric_sys::fi_addr_t;

/// How many registrations of an admission the writer publishes a round: a slice is a bounded
/// step of the writer's, whatever the number of clients parked. An unrelated miss behind an
/// admission waits for the admission itself (`admit`: the insert, the waiters, and a list of
/// the clients, O(clients), a copy each) and one slice, not for every client's enrolment:
/// the parked set becomes the entry's holders whole. One under loom, so that the models' few
/// parked clients are published across rounds too. (What a registration and a listed client
/// cost: `docs/benchmarks.md`, "Figures moved out of the module docs".)
#[cfg(not(dma_loom))]
pub(super) const ADMISSION_SLICE: usize = 256;
/// How many registrations of an admission the writer publishes a round.
#[cfg(dma_loom)]
pub(super) const ADMISSION_SLICE: usize = 1;

impl<B: AvBackend> Writer<B> {
    pub(super) fn apply(&mut self, request: Request) {
        match request {
            Request::Resolve {
                client,
                address,
                reply,
            } => {
                self.stats.misses += 1;
                let result = self.resolve(client, &address);
                let address = address.bytes();
                match reply {
                    Reply::Queued => match &result {
                        Ok(_) | Err(DmaError::WouldBlock) => {}
                        Err(error) => {
                            tracing::warn!(op = "queued_miss_failed", client, %error, "a queued miss failed; the next try_resolve of this client and address returns the error");
                            self.shared.failures.record(client, address, error.clone());
                        }
                    },
                    Reply::Now(reply) => self.outbox.replies.push((reply, result)),
                    Reply::Admitted { answer, deadline } => match result {
                        Err(DmaError::WouldBlock) => {
                            self.wait_for_admission(client, address, answer, deadline)
                        }
                        result => self.outbox.replies.push((answer, result)),
                    },
                }
            }
            Request::ResolveChunk { requests, reply } => {
                let misses = requests.len();
                let results = requests
                    .into_iter()
                    .map(|(client, address)| {
                        self.stats.misses += 1;
                        self.resolve(client, &address)
                    })
                    .collect();
                // The chunk's vector is freed: its misses no longer count (`cache::budget`).
                self.shared.chunk_misses.give_back(misses);
                self.outbox.chunk_replies.push((reply, results));
            }
            Request::Release { client } => {
                self.shared.failures.clear(client);
                self.detach(client);
            }
            Request::Quiesce { .. } | Request::Shutdown => {}
        }
    }

    /// `client` is parked on `address`: answer `reply` once that incarnation is in the AV, or at
    /// `deadline`.
    pub(super) fn wait_for_admission(
        &mut self,
        client: u64,
        address: &[u8],
        reply: Answer,
        deadline: Instant,
    ) {
        let parked = self
            .parking
            .unindexed
            .get(&client)
            .filter(|holding| holding.is_parked())
            .map(|holding| holding.fi_addr())
            .and_then(|at| self.parking.parked.get_mut(&at).map(|parked| (at, parked)))
            .filter(|(_, parked)| {
                parked.address.bytes() == address && parked.clients.contains(&client)
            });
        match parked {
            Some((at, parked)) => {
                // One waiter per client: a caller that asks again (a `lease_within` retried after
                // its caller gave up) supersedes its earlier request, whose answer goes out now,
                // so retries cost no memory however many there are.
                let waiter = Waiter {
                    answer: reply,
                    deadline,
                };
                if let Some(earlier) = parked.waiters.insert(client, waiter) {
                    self.parking
                        .deadlines
                        .remove(&(earlier.deadline, client, at));
                    self.outbox
                        .replies
                        .push((earlier.answer, Err(DmaError::WouldBlock)));
                }
                self.parking.deadlines.insert((deadline, client, at));
            }
            None => self.outbox.replies.push((reply, Err(DmaError::WouldBlock))),
        }
    }

    pub(super) fn occupied(&self) -> usize {
        let live = usize::try_from(self.stats.entries).unwrap_or(usize::MAX);
        live.saturating_add(self.reclaim.pending.len())
    }

    /// `fi_av_insert`, refusing an index outside the table the lease counters cover, or one
    /// that an entry of ours still holds.
    pub(super) fn insert(&mut self, address: &[u8]) -> Result<fi_addr_t, DmaError> {
        let fi_addr = self.table.backend.insert(address)?;
        self.stats.inserts += 1;
        if self.table.entry(fi_addr).is_some() {
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
        if let Err(error) = self.table.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            tracing::error!(op = "remove_failed", fi_addr, %error, "fi_av_remove of an index outside the table failed");
        }
        Err(DmaError::Fabric {
            call: "fi_av_insert",
            code: 0,
            message: format!(
                "the provider returned index {fi_addr}, outside the table of {} entries the address vector was opened with",
                self.table.capacity
            ),
        })
    }

    /// Record a new live entry at `fi_addr` (an index `insert` answered, so below the capacity)
    /// and its identity's slot.
    pub(super) fn install(&mut self, fi_addr: fi_addr_t, address: StoredAddress) {
        let Ok(index) = usize::try_from(fi_addr) else {
            return;
        };
        self.table.install(index, fi_addr, address);
        self.stats.entries += 1;
    }

    /// Register `client` on `stored`, an address the sender checked and whose identity it
    /// measured ([`crate::cache::ReaderSide`]'s `stored`): the writer keeps it as it came, and an
    /// entry or a parked incarnation stores a copy of it, never one rebuilt from its bytes.
    pub(super) fn resolve(
        &mut self,
        client: u64,
        stored: &StoredAddress,
    ) -> Result<fi_addr_t, DmaError> {
        let (address, identity) = (stored.bytes(), stored.identity());
        self.shared.failures.clear(client);

        // Already registered on exactly this? A reader raced its own earlier miss.
        if let Some(holding) = self.holding(client) {
            let fi_addr = holding.fi_addr();
            if holding.is_parked() {
                if self.parking.parked.get(&fi_addr).is_some_and(|parked| {
                    parked.address.bytes() == address && parked.clients.contains(&client)
                }) {
                    return Err(DmaError::WouldBlock);
                }
            } else if self
                .table
                .entry(fi_addr)
                .is_some_and(|entry| entry.is_live() && entry.address.bytes() == address)
            {
                // A holder of the live entry at `fi_addr`. If `unindexed` held it, an admission
                // enrolled it and has not published its registration yet: publish it now.
                if self.parking.unindexed.remove(&client).is_some() {
                    self.publish(client, fi_addr);
                }
                return Ok(fi_addr);
            }
        }

        // A brand-new identity needs an insert, which may fail: do it before anything changes.
        if self.table.slot(identity).is_none() {
            if self.occupied() >= self.table.capacity {
                return Err(DmaError::Capacity {
                    capacity: self.table.capacity,
                });
            }
            let fi_addr = self.insert(address)?;
            tracing::debug!(op = "insert", client, fi_addr, "fi_av_insert");
            // The client's previous registration goes before its new one comes in.
            self.detach(client);
            self.install(fi_addr, stored.clone());
            self.register(client, fi_addr);
            return Ok(fi_addr);
        }

        // The client's previous registration goes before its new one comes in.
        self.detach(client);
        self.join(client, stored)
    }

    /// Register `client` on an identity that already has a slot.
    pub(super) fn join(
        &mut self,
        client: u64,
        stored: &StoredAddress,
    ) -> Result<fi_addr_t, DmaError> {
        let (address, identity) = (stored.bytes(), stored.identity());
        // Detaching never drops a slot (a retired entry keeps it until removed), so this finds
        // one; answer as a busy writer would rather than guess if it does not.
        let Some(fi_addr) = self.table.slot(identity) else {
            return Err(DmaError::WouldBlock);
        };
        let Some(entry) = self.table.entry(fi_addr) else {
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
            self.park(client, fi_addr, stored);
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
            }) = self.reclaim.pending.remove(&removal)
            {
                if awaited {
                    self.reclaim.awaiting_leases -= 1;
                    self.shared.leases.stop_awaiting(fi_addr);
                }
                if let Some(at) = retry_at {
                    self.reclaim.retries.remove(&(at, removal));
                }
            }
            if let Some(entry) = self.table.entry_mut(fi_addr) {
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
        self.park(client, fi_addr, stored);
        Err(DmaError::WouldBlock)
    }

    /// Evict the live entry at `fi_addr` and every client on it.
    pub(super) fn evict_live(&mut self, asking: u64, fi_addr: fi_addr_t) {
        let Some(entry) = self
            .table
            .entry_mut(fi_addr)
            .filter(|entry| entry.is_live())
        else {
            return;
        };
        let holders = std::mem::take(&mut entry.holders);
        let evicted = holders.len();
        for holder in holders.to_vec() {
            self.unregister(holder);
            if holder != asking {
                if let Some(hook) = self.shared.on_evict.get() {
                    if !hook(holder) {
                        self.outbox.deferred_evictions.insert(holder);
                    }
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
    pub(super) fn evict_parked(&mut self, asking: u64, fi_addr: fi_addr_t) {
        let Some(mut parked) = self.parking.parked.remove(&fi_addr) else {
            return;
        };
        for waiter in &parked.clients {
            self.parking.unindexed.remove(waiter);
        }
        parked.turn_away(fi_addr, None, &mut self.parking.deadlines);
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
    pub(super) fn park(&mut self, client: u64, fi_addr: fi_addr_t, stored: &StoredAddress) {
        let address = stored.bytes();
        if self.parking.forwarded.contains_key(&fi_addr) {
            // Clients parked behind this index before may still be read as holding what their
            // admission let in: publish them, so that a place parked here means parked here.
            self.parking
                .publish_every_admission(&self.table, &self.shared.index);
        }
        if self
            .parking
            .parked
            .get(&fi_addr)
            .is_some_and(|parked| parked.address.bytes() != address)
        {
            self.evict_parked(client, fi_addr);
        }
        self.parking
            .parked
            .entry(fi_addr)
            .or_insert_with(|| {
                Box::new(Parked {
                    address: stored.clone(),
                    clients: HashSet::default(),
                    waiters: HashMap::default(),
                })
            })
            .clients
            .insert(client);
        self.parking
            .unindexed
            .insert(client, Holding::parked(fi_addr));
        tracing::debug!(
            op = "park",
            client,
            "parked behind the removal of a stale incarnation"
        );
    }

    /// Where `client` is: in `unindexed` if it is parked, or enrolled by an admission and not yet
    /// published; otherwise on the entry its published registration names, if any. The index
    /// is the writer's own (it alone writes it, and reads its own writes), so it stands in for a
    /// map of every registered client (64 B a client at the worst).
    pub(super) fn holding(&self, client: u64) -> Option<Holding> {
        // An empty map answers before hashing: most of the time nobody is parked.
        if let Some(&holding) = self.parking.unindexed.get(&client) {
            return Some(self.parking.forward(holding));
        }
        self.shared.index.registered(client).map(Holding::live)
    }

    /// Record `client` as a holder of the live entry at `fi_addr` and publish its registration.
    /// `client` holds nothing else (its miss detached it first).
    pub(super) fn register(&mut self, client: u64, fi_addr: fi_addr_t) {
        let Some(entry) = self.table.entry_mut(fi_addr) else {
            return;
        };
        if entry.holders.insert(client) {
            self.stats.clients += 1;
        }
        // Published: the index says where it is from now on.
        self.parking.unindexed.remove(&client);
        self.shared.index.publish(client, fi_addr, &entry.address);
    }

    /// Publish the registration of `client` on the entry at `fi_addr`, which it holds.
    fn publish(&self, client: u64, fi_addr: fi_addr_t) {
        if let Some(entry) = self.table.entry(fi_addr) {
            self.shared.index.publish(client, fi_addr, &entry.address);
        }
    }

    /// Forget `client`, a holder of an entry that its caller has taken out of the entry's
    /// holders: unlink its registration from the index, or drop its place in `unindexed` if an
    /// admission had not published it yet.
    pub(super) fn unregister(&mut self, client: u64) {
        if self.parking.unindexed.remove(&client).is_none() {
            self.shared.index.unlink(client);
        }
        self.unregistered();
    }

    /// A holder is gone from its entry and from the index. If the index has emptied well below
    /// what it grew to, it is replaced by a fresh table (`index::shrink`), whose old one the
    /// batch's deferral covers.
    fn unregistered(&mut self) {
        self.stats.clients -= 1;
        self.shared.index.shrink();
    }

    /// Let go of whatever `client` holds or waits for; retire the entry if it was the last holder.
    pub(super) fn detach(&mut self, client: u64) {
        // Out of `unindexed`, or out of the index: one lookup each, and the client is in at most
        // one of them.
        let holding = match self.parking.unindexed.remove(&client) {
            Some(place) => self.parking.forward(place),
            None => match self.shared.index.unlink(client) {
                Some(fi_addr) => Holding::live(fi_addr),
                None => return,
            },
        };
        let fi_addr = holding.fi_addr();
        if holding.is_parked() {
            if let Some(parked) = self.parking.parked.get_mut(&fi_addr) {
                if parked.clients.remove(&client) {
                    parked.turn_away(fi_addr, Some(client), &mut self.parking.deadlines);
                    if parked.clients.is_empty() {
                        self.parking.parked.remove(&fi_addr);
                    }
                }
            }
            return;
        }
        // It held the live entry at `fi_addr`, published or about to be: one of its holders.
        let Some(entry) = self
            .table
            .entry_mut(fi_addr)
            .filter(|entry| entry.is_live())
        else {
            return;
        };
        if !entry.holders.remove(client) {
            return;
        }
        let last = entry.holders.is_empty();
        self.unregistered();
        if last {
            self.stats.entries -= 1;
            self.retire(fi_addr);
        }
    }

    /// Insert a parked incarnation now that the old one, at `at`, has left the AV.
    ///
    /// O(waiters) and a slice, whatever the number of clients: the parked set becomes the
    /// entry's holders whole, each client's place in `unindexed` is left as it is and read as
    /// holding the new entry (`forwarded`), and their registrations are published a slice a
    /// round. Only listing them for the slices is O(clients), a copy each.
    pub(super) fn admit(&mut self, at: fi_addr_t, parked: Parked) {
        let Parked {
            address,
            clients,
            waiters,
        } = parked;
        for (&client, waiter) in &waiters {
            self.parking
                .deadlines
                .remove(&(waiter.deadline, client, at));
        }
        match self.insert(address.bytes()) {
            Ok(fi_addr) => {
                tracing::debug!(
                    op = "insert",
                    fi_addr,
                    waiting = clients.len(),
                    "fi_av_insert of a parked incarnation"
                );
                self.install(fi_addr, address);
                // Every client holds the entry now, but only the waiters' registrations and a
                // first slice are published at once: the rest go out a slice a round
                // (`publish_admitted`), so an unrelated miss waits for a slice, not for all of
                // them. A client whose registration is still to come misses, and its miss
                // publishes it (`resolve`).
                // The waiters among them are published below and gone from `unindexed` by their
                // slice, which skips them: listing all of them spares a lookup each.
                self.parking.unpublished.reserve_exact(clients.len());
                self.parking.unpublished.extend(clients.iter().copied());
                // The set's order is the hasher's: loom needs the same publishes in every run.
                #[cfg(dma_loom)]
                self.parking.unpublished.sort_unstable();
                let admitted = clients.len() as u64;
                if let Some(entry) = self.table.entry_mut(fi_addr) {
                    entry.holders = Holders::from_set(clients);
                    self.stats.clients += admitted;
                }
                // Until its clients are published, their places (parked at `at`) mean this entry.
                self.parking.forwarded.insert(at, fi_addr);
                for &client in waiters.keys() {
                    if self.parking.unindexed.remove(&client).is_some() {
                        self.publish(client, fi_addr);
                    }
                }
                self.parking
                    .publish_admitted(&self.table, &self.shared.index);
                for (_, waiter) in waiters {
                    self.outbox.replies.push((waiter.answer, Ok(fi_addr)));
                }
            }
            Err(error) => {
                tracing::warn!(op = "insert_failed", %error, waiting = clients.len(), "fi_av_insert of a parked incarnation failed; its clients must resolve again");
                for client in &clients {
                    self.parking.unindexed.remove(client);
                }
                for (_, waiter) in waiters {
                    self.outbox
                        .replies
                        .push((waiter.answer, Err(error.clone())));
                }
            }
        }
    }
}
