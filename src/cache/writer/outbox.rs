//! What the writer owes outside itself and has not delivered yet: this batch's answers, the
//! quiescers' answers, and the evicted clients the eviction hook has not taken.
//!
//! [`Outbox`] guarantees that a batch's answers go out only when [`Outbox::send`] is called,
//! which the writer does once the batch's counters are published, so a caller that reads the
//! counters after its reply sees its request; and that each list is bounded by a batch's
//! requests or by the clients this writer evicted.

use std::collections::HashSet;

use dma_libfabric_sys::fi_addr_t;

use super::Hasher;
use super::run::Quiescer;
use super::tables::roomy;
use super::{ChunkAnswer, ChunkReply, SharedState};
use crate::cache::reply::Answer;
use crate::error::DmaError;

/// Every answer and report the writer owes: one job, to hold them until they may go out.
/// Invariant: `replies` and `chunk_replies` hold at most one item per request of the batch, and
/// are sent and emptied at the end of every batch; `quiescing` holds one item per quiesce
/// request not yet answered, `deferred_evictions` one per client this writer evicted.
pub(super) struct Outbox {
    /// This batch's answers, sent once its counters are published.
    pub(super) replies: Vec<(Answer, Result<fi_addr_t, DmaError>)>,
    /// This batch's answers to chunks, sent with the others.
    pub(super) chunk_replies: Vec<(ChunkReply, ChunkAnswer)>,
    /// Callers blocked in `quiesce`, answered once their removals are done or stalled.
    pub(super) quiescing: Vec<Quiescer>,
    /// Evicted clients the eviction hook was not done with (a rail's inbox was full): handed to
    /// it again every round until it is. One item per client, each one this writer held, so it
    /// is bounded by the clients term of the bound.
    pub(super) deferred_evictions: HashSet<u64, Hasher>,
}

impl Outbox {
    pub(super) fn new() -> Self {
        Self {
            replies: Vec::new(),
            chunk_replies: Vec::new(),
            quiescing: Vec::new(),
            deferred_evictions: HashSet::default(),
        }
    }

    /// Send this batch's answers: after its counters are published.
    pub(super) fn send(&mut self) {
        for (answer, result) in self.replies.drain(..) {
            answer.send(result);
        }
        for (reply, results) in self.chunk_replies.drain(..) {
            // The caller may have gone; nothing to do about that.
            let _ = reply.send(results);
        }
    }

    /// Hand the eviction hook again each evicted client it was not done with.
    pub(super) fn retry_evictions(&mut self, shared: &SharedState) {
        if self.deferred_evictions.is_empty() {
            return;
        }
        if let Some(hook) = shared.on_evict.get() {
            self.deferred_evictions.retain(|&client| !hook(client));
        } else {
            self.deferred_evictions.clear();
        }
    }

    /// Shrink each list once it has emptied well below its peak ([`roomy`]).
    pub(super) fn shrink(&mut self) {
        if roomy(
            self.deferred_evictions.capacity(),
            self.deferred_evictions.len(),
        ) {
            self.deferred_evictions
                .shrink_to(2 * self.deferred_evictions.len());
        }
        // This batch's answers go out after this, so they are counted at their most.
        if roomy(self.replies.capacity(), self.replies.len()) {
            self.replies.shrink_to(2 * self.replies.len());
        }
    }

    /// The cache holds no entry: free what each emptied list kept.
    pub(super) fn give_back(&mut self) {
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
