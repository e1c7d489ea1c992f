//! What readers, leases and the writer share: the index, the counters, the lease counters, the
//! failure records, the chunk-miss budget, the doorbell, the deferral's flag and the eviction
//! hook. Its own room, below the writer and the leases, so that neither imports the other.

use super::budget::MissBudget;
use super::doorbell::Doorbell;
use super::failures::Failures;
use super::index::Index;
use super::lease_counts::LeaseCounts;
use super::stats::Counters;
use crate::sync::atomic::AtomicBool;

/// What readers and the writer share.
pub(crate) struct SharedState {
    pub(crate) index: Index,
    pub(crate) counters: Counters,
    pub(crate) leases: LeaseCounts,
    pub(crate) failures: Failures,
    /// The misses queued in chunks, which count against the inbox's bound (`cache::budget`).
    pub(crate) chunk_misses: MissBudget,
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

/// What [`SharedState::on_evict`] holds: a call per evicted client, made on the writer thread, which
/// must not wait for any writer, and answers whether it is done with the client.
pub(crate) type EvictionHook = std::sync::OnceLock<Box<dyn Fn(u64) -> bool + Send + Sync>>;

impl SharedState {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            index: Index::with_capacity(capacity),
            counters: Counters::default(),
            leases: LeaseCounts::new(capacity),
            failures: Failures::default(),
            chunk_misses: MissBudget::default(),
            doorbell: Doorbell::default(),
            readers_gone: AtomicBool::new(false),
            on_evict: EvictionHook::new(),
        }
    }
}
