//! The misses queued in chunks: the inbox's bound counts misses, not requests.
//!
//! The writer's inbox holds at most [`INBOX_BOUND`] requests, and its
//! slots are allocated with it. A chunk of `resolve_all` or `lease_all` carries up to 64 misses
//! in a vector of its own, so requests alone would let 4,096 queued chunks hold 262,144 misses
//! (behind one slow insert). So a chunk's misses also take credits from a budget
//! of [`MissBudget::BOUND`] misses: a sender takes them before it queues the chunk and waits while
//! none are left; the writer gives them back once it has applied the chunk. Queued chunks so hold
//! at most `BOUND` misses, 48 B each, whatever number of threads send them.
//!
//! # Guarantees
//!
//! - **Bounded**: at most `BOUND` misses are queued in chunks at once (a chunk holds at most 64,
//!   fewer than `BOUND`, so every chunk eventually fits).
//! - **No lock on the writer**: giving credits back is an atomic subtraction and, only while a
//!   sender waits, a condition variable's `notify_all`, which takes no lock. A sender re-reads the
//!   budget under the condvar's mutex before it waits and waits at most [`RECHECK`], so a
//!   notification that slips between its check and its wait costs it at most that long.
//! - **No wait on a stopped writer**: the writer closes the budget as it stops or unwinds, and a
//!   sender never waits on a closed budget (its send then fails, and it answers `Closed`).
//! - Under loom the budget is unbounded, as the inbox is: backpressure, not part of the protocol
//!   the models check.

/// How many requests the writer's inbox holds before senders wait (or `try_resolve` gives up):
/// the bound the queued requests, the misses queued in chunks and the failure records all count
/// against.
pub(crate) const INBOX_BOUND: usize = 4096;

#[cfg(not(dma_loom))]
use std::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(dma_loom))]
use std::time::Duration;

/// How long a sender waiting for credits sleeps before it looks again without a notification.
#[cfg(not(dma_loom))]
const RECHECK: Duration = Duration::from_millis(1);

/// See the module docs.
#[derive(Default)]
pub(crate) struct MissBudget {
    #[cfg(not(dma_loom))]
    queued: AtomicUsize,
    #[cfg(not(dma_loom))]
    waiting: AtomicUsize,
    /// Set once the writer has stopped: nothing queued will be applied, so nobody waits.
    #[cfg(not(dma_loom))]
    closed: std::sync::atomic::AtomicBool,
    // Plain std even under loom (unused there): senders' bookkeeping, never held by the writer.
    #[cfg(not(dma_loom))]
    room: std::sync::Mutex<()>,
    #[cfg(not(dma_loom))]
    freed: std::sync::Condvar,
}

impl MissBudget {
    /// The most misses queued in chunks at once: as many as the inbox holds requests.
    #[cfg_attr(dma_loom, allow(dead_code))]
    pub(crate) const BOUND: usize = INBOX_BOUND;

    /// Take `misses` credits (at most [`BOUND`](Self::BOUND)), waiting while too few are left.
    pub(crate) fn take(&self, misses: usize) {
        #[cfg(not(dma_loom))]
        {
            let misses = misses.min(Self::BOUND);
            loop {
                if self.closed.load(Ordering::SeqCst) {
                    // The send that follows fails; its caller answers `Closed`.
                    return;
                }
                let queued = self.queued.load(Ordering::Relaxed);
                if queued + misses <= Self::BOUND {
                    if self
                        .queued
                        .compare_exchange_weak(
                            queued,
                            queued + misses,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        return;
                    }
                    continue;
                }
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let guard = crate::sync::lock(&self.room);
                if self.queued.load(Ordering::SeqCst) + misses > Self::BOUND
                    && !self.closed.load(Ordering::SeqCst)
                {
                    let _ = self.freed.wait_timeout(guard, RECHECK);
                }
                self.waiting.fetch_sub(1, Ordering::SeqCst);
            }
        }
        #[cfg(dma_loom)]
        let _ = misses;
    }

    /// Give `misses` credits back: the writer has applied their chunk, or it was never queued.
    pub(crate) fn give_back(&self, misses: usize) {
        #[cfg(not(dma_loom))]
        {
            self.queued
                .fetch_sub(misses.min(Self::BOUND), Ordering::SeqCst);
            if self.waiting.load(Ordering::SeqCst) > 0 {
                self.freed.notify_all();
            }
        }
        #[cfg(dma_loom)]
        let _ = misses;
    }

    /// The writer has stopped (or unwound): wake every waiting sender, and let no one wait again.
    pub(crate) fn close(&self) {
        #[cfg(not(dma_loom))]
        {
            self.closed.store(true, Ordering::SeqCst);
            self.freed.notify_all();
        }
    }

    /// How many misses are queued in chunks now.
    #[cfg_attr(not(feature = "model"), allow(dead_code))]
    pub(crate) fn queued(&self) -> usize {
        #[cfg(not(dma_loom))]
        {
            self.queued.load(Ordering::Relaxed)
        }
        #[cfg(dma_loom)]
        0
    }
}
