//! Where the clients the index does not hold are: those parked behind a removal, with their
//! waiters' deadlines, and those an admission has enrolled as holders and not yet published.
//!
//! [`Parking`] guarantees that a client is in `unindexed` or in the index, never both; that a
//! place left parked behind an index an admission has forwarded reads as holding the admitted
//! entry ([`Parking::forward`]) until the admission is published in full; and that an
//! admission's registration is published only while its client still holds that live entry, so
//! the index never names an entry its client does not hold. Each step is bounded: a slice of
//! [`ADMISSION_SLICE`] registrations a round, whatever the number of clients parked.

use std::collections::HashMap;

use super::Hasher;
use super::apply::ADMISSION_SLICE;
use super::state::{Deadlines, Holding, Parked};
use super::table::Table;
use super::tables::roomy;
use crate::cache::index::{Index, RegistrationIndex};
use dma_libfabric_sys::fi_addr_t;

/// The clients the index does not hold, and the incarnations they wait for: one job, to say
/// where such a client is. Invariant: a client is in `unindexed` or in the index, never both;
/// every parked client is in its incarnation's set and in `unindexed` as parked there; each map
/// holds at most one item per client or per entry (so at most the clients term or `C`).
pub(super) struct Parking {
    /// Incarnations parked behind a removal, by the index of the removing entry.
    pub(super) parked: HashMap<fi_addr_t, Box<Parked>, Hasher>,
    /// Where the clients the index does not hold are: those parked behind a removal, and those
    /// an admission has enrolled as holders and not yet published (`unpublished`). A client is
    /// here or in the index, never both: a published client's entry is read from the index.
    /// Empties as they are admitted and published, released or evicted.
    pub(super) unindexed: HashMap<u64, Holding, Hasher>,
    /// Admitted clients whose registrations are still to be published, a slice a round: each
    /// holds its entry in `unindexed` already (so at most one item per client).
    pub(super) unpublished: Vec<u64>,
    /// Admissions whose clients may still be in `unindexed` as parked behind the old entry's
    /// index, which no parked incarnation uses any more: that index → the admitted entry's. An
    /// admission takes its parked clients over as holders in one step and leaves their places in
    /// `unindexed` as they were, so its cost does not grow with its clients; such a place reads
    /// as holding the admitted entry ([`Parking::forward`]). No parked incarnation is keyed by an
    /// index here (`park` publishes every admission first), so a place cannot be read both
    /// ways. At most one per admission whose registrations are not all published, and so at most
    /// `C`; emptied with `unpublished`.
    pub(super) forwarded: HashMap<fi_addr_t, fi_addr_t, Hasher>,
    /// Every waiter on a parked incarnation, by deadline: the writer answers each at its deadline
    /// if the incarnation is not in by then.
    pub(super) deadlines: Deadlines,
}

impl Parking {
    pub(super) fn new() -> Self {
        Self {
            parked: HashMap::default(),
            unindexed: HashMap::default(),
            unpublished: Vec::new(),
            forwarded: HashMap::default(),
            deadlines: Deadlines::new(),
        }
    }

    /// What a place in `unindexed` means: a client left parked behind an index that no parked
    /// incarnation uses, by an admission not yet published in full, holds the admitted entry.
    pub(super) fn forward(&self, holding: Holding) -> Holding {
        if self.forwarded.is_empty() || !holding.is_parked() {
            return holding;
        }
        let at = holding.fi_addr();
        match self.forwarded.get(&at) {
            Some(&fi_addr) if !self.parked.contains_key(&at) => Holding::live(fi_addr),
            _ => holding,
        }
    }

    /// Publish every admission's remaining registrations, and so forget every forwarding: before
    /// an incarnation parks behind an index that one of them forwards from.
    pub(super) fn publish_every_admission<B>(&mut self, table: &Table<B>, index: &Index) {
        while !self.unpublished.is_empty() {
            self.publish_admitted(table, index);
        }
        self.forwarded = HashMap::default();
    }

    /// Publish the next [`ADMISSION_SLICE`] registrations of an admission on `index`, each only
    /// if its client still holds that live entry of `table` (it may have been released, moved
    /// or evicted since: then nothing is published, so the index never names an entry its client
    /// does not hold).
    pub(super) fn publish_admitted<B>(&mut self, table: &Table<B>, index: &Index) {
        for _ in 0..ADMISSION_SLICE {
            let Some(client) = self.unpublished.pop() else {
                self.unpublished = Vec::new();
                // Every admission is published: no place is read through a forwarding now.
                if !self.forwarded.is_empty() {
                    self.forwarded = HashMap::default();
                }
                return;
            };
            // A client released, moved or evicted since is no longer in `unindexed` as a holder
            // (or is there for a later admission, which publishes it in its own slice). One
            // lookup: taken out, and put back only if it is parked again.
            let Some(place) = self.unindexed.remove(&client) else {
                continue;
            };
            let holding = self.forward(place);
            let fi_addr = holding.fi_addr();
            let live = table.entry(fi_addr).filter(|entry| entry.is_live());
            if let (false, Some(entry)) = (holding.is_parked(), live) {
                index.publish(client, fi_addr, &entry.address);
            } else {
                self.unindexed.insert(client, place);
            }
        }
    }

    /// Shrink each map once it has emptied well below its peak ([`roomy`]).
    pub(super) fn shrink(&mut self) {
        if roomy(self.unindexed.capacity(), self.unindexed.len()) {
            self.unindexed.shrink_to(2 * self.unindexed.len());
        }
        if roomy(self.parked.capacity(), self.parked.len()) {
            self.parked.shrink_to(2 * self.parked.len());
        }
    }

    /// The cache holds no entry: free what each emptied map kept at its smallest size.
    pub(super) fn give_back(&mut self) {
        if self.deadlines.is_empty() {
            self.deadlines = Deadlines::new();
        }
        if self.parked.is_empty() && self.parked.capacity() > 0 {
            self.parked = HashMap::default();
        }
        if self.unindexed.is_empty() && self.unindexed.capacity() > 0 {
            self.unindexed = HashMap::default();
        }
    }

    /// Forget everything (shutdown): waiters on a parked incarnation are told `Closed` when
    /// their senders drop with it.
    pub(super) fn clear(&mut self) {
        self.parked.clear();
        self.deadlines.clear();
        self.unindexed.clear();
        self.unpublished.clear();
        self.forwarded.clear();
    }
}
