//! Counters the writer publishes and anyone may read.

// Plain std atomics even under loom: statistics, not part of the protocol (see `crate::sync`).
use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a cache's counters.
///
/// ```
/// use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
///
/// let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
/// cache.pin().resolve(1, &[7; 16])?;
/// let stats = cache.stats();
/// assert_eq!((1, 1, 1, 1), (stats.entries, stats.clients, stats.inserts, stats.misses));
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Live entries: unique addresses in the AV that some client holds.
    pub entries: u64,
    /// Clients registered on a live entry.
    pub clients: u64,
    /// `fi_av_insert` calls that succeeded.
    pub inserts: u64,
    /// `fi_av_remove` calls made (failed ones included; see the log).
    pub removes: u64,
    /// Stale incarnations evicted (efa: a new QKEY on a known GID and QPN).
    pub evictions: u64,
    /// Clients evicted with them.
    pub evicted_clients: u64,
    /// Entries unlinked and waiting for their readers to unpin before `fi_av_remove`.
    pub pending_removals: u64,
    /// Resolves that missed the index and went to the writer.
    pub misses: u64,
    /// Leases out now (read live when the snapshot is taken, not as of the writer's last
    /// request).
    pub leases: u64,
    /// Pending removals whose readers have all unpinned but on which a lease is still out.
    pub removals_awaiting_leases: u64,
    /// `fi_av_remove` calls that failed. A failed removal keeps its entry counted against the
    /// capacity, and on efa keeps its identity blocked, and is retried with a backoff.
    pub failed_removes: u64,
}

/// The writer's counters. Only the writer stores; each is a plain store of a value the writer
/// owns, so `Relaxed` suffices, and a snapshot taken after `quiesce` returns is exact because the
/// reply to `quiesce` is sent after the stores (the channel orders them).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    entries: AtomicU64,
    clients: AtomicU64,
    inserts: AtomicU64,
    removes: AtomicU64,
    evictions: AtomicU64,
    evicted_clients: AtomicU64,
    pending_removals: AtomicU64,
    misses: AtomicU64,
    removals_awaiting_leases: AtomicU64,
    failed_removes: AtomicU64,
}

impl Counters {
    pub(crate) fn publish(&self, stats: &CacheStats) {
        self.entries.store(stats.entries, Ordering::Relaxed);
        self.clients.store(stats.clients, Ordering::Relaxed);
        self.inserts.store(stats.inserts, Ordering::Relaxed);
        self.removes.store(stats.removes, Ordering::Relaxed);
        self.evictions.store(stats.evictions, Ordering::Relaxed);
        self.evicted_clients
            .store(stats.evicted_clients, Ordering::Relaxed);
        self.pending_removals
            .store(stats.pending_removals, Ordering::Relaxed);
        self.misses.store(stats.misses, Ordering::Relaxed);
        self.removals_awaiting_leases
            .store(stats.removals_awaiting_leases, Ordering::Relaxed);
        self.failed_removes
            .store(stats.failed_removes, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> CacheStats {
        CacheStats {
            entries: self.entries.load(Ordering::Relaxed),
            clients: self.clients.load(Ordering::Relaxed),
            inserts: self.inserts.load(Ordering::Relaxed),
            removes: self.removes.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            evicted_clients: self.evicted_clients.load(Ordering::Relaxed),
            pending_removals: self.pending_removals.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            leases: 0,
            removals_awaiting_leases: self.removals_awaiting_leases.load(Ordering::Relaxed),
            failed_removes: self.failed_removes.load(Ordering::Relaxed),
        }
    }
}
