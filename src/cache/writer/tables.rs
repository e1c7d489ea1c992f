//! The writer's tables give their memory back: once they have emptied well below their peak (a
//! table of more than 64 slots at under a quarter full is cut to twice what it holds), and all
//! of it once the cache holds no entry at all, live or on its way out. So the writer's memory
//! follows what it holds, not the most it ever held, and a cache emptied and quiesced is back to
//! what it was built with (within 16 B a former entry of the empty cache), rather than to its
//! tables' smallest sizes. Run once a batch, with the counters; each check is
//! O(1) unless it frees.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::Writer;
use super::state::{Deadlines, identity_at};
use crate::av::AvBackend;

impl<B: AvBackend> Writer<B> {
    /// Give memory back once the tables have emptied well below their peak, so the writer's
    /// memory follows the live entries rather than the most it ever held (invariant 4); and once
    /// the cache holds no entry at all, live or on its way out, every table gives back all of
    /// its memory, so an emptied cache is back to what it was built with rather than to its
    /// tables' smallest sizes (at `C` = 64: 4,096 B of entries, a B-tree leaf and a table of
    /// slots).
    pub(super) fn shrink(&mut self) {
        fn roomy(capacity: usize, len: usize) -> bool {
            capacity > 64 && capacity > 4 * len
        }
        if roomy(self.unindexed.capacity(), self.unindexed.len()) {
            self.unindexed.shrink_to(2 * self.unindexed.len());
        }
        if roomy(self.parked.capacity(), self.parked.len()) {
            self.parked.shrink_to(2 * self.parked.len());
        }
        if roomy(
            self.deferred_evictions.capacity(),
            self.deferred_evictions.len(),
        ) {
            self.deferred_evictions
                .shrink_to(2 * self.deferred_evictions.len());
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
        // This batch's answers go out after this, so they are counted at their most.
        if roomy(self.replies.capacity(), self.replies.len()) {
            self.replies.shrink_to(2 * self.replies.len());
        }
        if self.entries.is_empty() && self.pending.is_empty() {
            self.give_back_everything();
        }
    }

    /// The cache holds no entry: free what each table kept at its smallest size. O(1) when
    /// there is nothing to free, so it may run every batch.
    fn give_back_everything(&mut self) {
        if self.entries.capacity() > 0 {
            self.entries = Vec::new();
        }
        if self.scratch.capacity() > 0 {
            self.scratch = Vec::new();
        }
        if self.slots.is_empty() && self.slots.capacity() > 0 {
            self.slots = HashTable::new();
        }
        // An emptied B-tree keeps its root leaf (808 B for `pending`): a fresh one holds none.
        self.pending = BTreeMap::new();
        if self.retries.is_empty() {
            self.retries = BTreeSet::new();
        }
        if self.deadlines.is_empty() {
            self.deadlines = Deadlines::new();
        }
        if self.parked.is_empty() && self.parked.capacity() > 0 {
            self.parked = HashMap::default();
        }
        if self.unindexed.is_empty() && self.unindexed.capacity() > 0 {
            self.unindexed = HashMap::default();
        }
        if self.deferred_evictions.is_empty() && self.deferred_evictions.capacity() > 0 {
            self.deferred_evictions = HashSet::default();
        }
        if self.replies.is_empty() && self.replies.capacity() > 0 {
            self.replies = Vec::new();
        }
        if self.chunk_replies.is_empty() && self.chunk_replies.capacity() > 0 {
            self.chunk_replies = Vec::new();
        }
        if self.quiescing.is_empty() && self.quiescing.capacity() > 0 {
            self.quiescing = Vec::new();
        }
    }
}
