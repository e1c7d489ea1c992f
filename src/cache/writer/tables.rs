//! The writer's tables give their memory back: once they have emptied well below their peak (a
//! table of more than 64 slots at under a quarter full is cut to twice what it holds), and all
//! of it once the cache holds no entry at all, live or on its way out. So the writer's memory
//! follows what it holds, not the most it ever held, and a cache emptied and quiesced is back to
//! what it was built with (within 16 B a former entry of the empty cache), rather than to its
//! tables' smallest sizes. Run once a batch, with the counters; each check is
//! O(1) unless it frees.

use super::Writer;
use crate::av::AvBackend;

/// Whether a table of `capacity` slots holding `len` items is worth cutting: more than 64 slots
/// at under a quarter full.
pub(super) fn roomy(capacity: usize, len: usize) -> bool {
    capacity > 64 && capacity > 4 * len
}

impl<B: AvBackend> Writer<B> {
    /// Give memory back once the tables have emptied well below their peak, so the writer's
    /// memory follows the live entries rather than the most it ever held (invariant 4); and once
    /// the cache holds no entry at all, live or on its way out, every table gives back all of
    /// its memory, so an emptied cache is back to what it was built with rather than to its
    /// tables' smallest sizes (at `C` = 64: 4,096 B of entries, a B-tree leaf and a table of
    /// slots).
    pub(super) fn shrink(&mut self) {
        self.parking.shrink();
        self.table.shrink();
        self.reclaim.shrink();
        self.outbox.shrink();
        if self.table.is_empty() && self.reclaim.pending.is_empty() {
            self.give_back_everything();
        }
    }

    /// The cache holds no entry: free what each table kept at its smallest size. O(1) when
    /// there is nothing to free, so it may run every batch.
    fn give_back_everything(&mut self) {
        self.table.give_back();
        self.reclaim.give_back();
        self.parking.give_back();
        self.outbox.give_back();
    }
}
