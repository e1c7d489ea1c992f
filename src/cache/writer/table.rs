//! The AV as the writer knows it: the backend it inserts into and removes from, and, for every
//! incarnation of ours in the AV, an [`Entry`] at its own index and its identity's slot.
//!
//! [`Table`] guarantees that each identity has at most one slot, that a slot names an index whose
//! entry is here (live or on its way out), and that an entry stays here, counted against the
//! capacity, until its `fi_av_remove` has succeeded: so no second incarnation of an identity goes
//! in beside one the AV still holds. Every lookup is by index or by hash, never a scan.

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::Hasher;
use super::state::{Entry, Holders, LIVE, entry_in, identity_at};
use super::tables::roomy;
use crate::av::AvBackend;
use crate::cache::stored::StoredAddress;
use dma_libfabric_sys::fi_addr_t;

/// The AV and the writer's record of what of ours is in it: one job, to say which incarnation
/// holds which index. Invariant: every slot names an index whose entry is `Some`, each identity
/// has at most one slot, and `entries` ends at the highest index in use once shrunk; each table
/// holds at most the capacity `C` items.
pub(super) struct Table<B> {
    /// The AV: the writer alone calls its `insert` and `remove`.
    pub(super) backend: B,
    /// How many entries the cache keeps in `backend` ([`usable_capacity`]).
    pub(super) capacity: usize,
    /// Every incarnation in the AV, by index: `None` where the AV holds nothing of ours.
    pub(super) entries: Vec<Option<Entry>>,
    /// Identity → the index of its live or removing incarnation. Holds the index alone; the
    /// identity's bytes are read from `entries`.
    pub(super) slots: HashTable<fi_addr_t>,
    pub(super) hasher: Hasher,
}

/// How many entries the cache keeps in `backend`: its capacity, up to
/// [`Configuration::MAX_AV_CAPACITY`](crate::configuration::Configuration::MAX_AV_CAPACITY), since the index and
/// the lease counters are allocated up front for every index. A backend that reports more (a
/// model AV built by hand) is used up to that bound; an index past it is refused as outside the
/// table.
pub(crate) fn usable_capacity(backend: &impl AvBackend) -> usize {
    backend
        .capacity()
        .min(crate::configuration::Configuration::MAX_AV_CAPACITY)
}

impl<B: AvBackend> Table<B> {
    /// An empty table over `backend`.
    pub(super) fn new(backend: B) -> Self {
        Self {
            capacity: usable_capacity(&backend),
            backend,
            entries: Vec::new(),
            slots: HashTable::new(),
            hasher: Hasher::default(),
        }
    }
}

impl<B> Table<B> {
    /// The entry at `fi_addr`.
    pub(super) fn entry(&self, fi_addr: fi_addr_t) -> Option<&Entry> {
        entry_in(&self.entries, fi_addr)
    }

    pub(super) fn entry_mut(&mut self, fi_addr: fi_addr_t) -> Option<&mut Entry> {
        usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.entries.get_mut(index))
            .and_then(Option::as_mut)
    }

    /// The index of `identity`'s live or removing incarnation.
    pub(super) fn slot(&self, identity: &[u8]) -> Option<fi_addr_t> {
        let entries = &self.entries;
        self.slots
            .find(self.hasher.hash_one(identity), |&fi_addr| {
                identity_at(entries, fi_addr) == identity
            })
            .copied()
    }

    /// Record a new live entry at `index` (an index `insert` answered, so below the capacity,
    /// and free here) and its identity's slot.
    pub(super) fn install(&mut self, index: usize, fi_addr: fi_addr_t, address: StoredAddress) {
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
    }

    /// Drop the entry at `fi_addr`, removed from the AV, and its identity's slot.
    pub(super) fn forget(&mut self, fi_addr: fi_addr_t) {
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

    /// Whether no entry is left, live or on its way out.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Cut `entries` to the highest index in use, and each table once it has emptied well below
    /// its peak ([`roomy`]).
    pub(super) fn shrink(&mut self) {
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
    }

    /// No entry is left: free what the tables kept at their smallest size.
    pub(super) fn give_back(&mut self) {
        if self.entries.capacity() > 0 {
            self.entries = Vec::new();
        }
        if self.slots.is_empty() && self.slots.capacity() > 0 {
            self.slots = HashTable::new();
        }
    }
}
