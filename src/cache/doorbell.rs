//! The writer's doorbell: how the threads that hand it work wake it when it has parked.
//!
//! The writer parks with `std::thread::park` (with a timeout while removals are pending), not on
//! a channel, so that every source of work can wake it the same way: a request in its inbox, an
//! epoch deferral whose readers have gone, the last lease of an awaited removal.
//!
//! # Guarantees
//!
//! - **No lost wake-up.** The writer announces that it parks (`parked = true`), issues a `SeqCst`
//!   fence, and then looks for work once more before it parks; a ringer makes its work visible,
//!   issues a `SeqCst` fence, and then reads `parked`. Of two `SeqCst` fences one comes first, so
//!   either the writer's last look sees the work, or the ringer sees `parked` and unparks it (an
//!   unpark that comes before the park makes the park return at once).
//! - **Lock-free and allocation-free to ring**: a fence, a load and, when the writer is parked,
//!   `Thread::unpark` (an atomic swap and a futex wake). So a deferred closure that runs inside a
//!   reader's `pin()`, and a lease's drop on a completion thread, may ring it.
//!
//! Under loom the writer waits on its inbox instead (loom has no timed park) and ringing does
//! nothing: the models drive the writer with requests, as they always have.

#[cfg(not(dma_loom))]
use std::sync::OnceLock;
#[cfg(not(dma_loom))]
use std::sync::atomic::{AtomicBool, Ordering, fence};
#[cfg(not(dma_loom))]
use std::time::Duration;

/// See the module docs.
#[derive(Default)]
pub(crate) struct Doorbell {
    #[cfg(not(dma_loom))]
    parked: AtomicBool,
    #[cfg(not(dma_loom))]
    writer: OnceLock<std::thread::Thread>,
}

impl Doorbell {
    /// Wake the writer if it is parked. Call after making the work visible.
    #[inline]
    pub(crate) fn ring(&self) {
        #[cfg(not(dma_loom))]
        {
            fence(Ordering::SeqCst);
            if self.parked.load(Ordering::Relaxed) {
                if let Some(writer) = self.writer.get() {
                    writer.unpark();
                }
            }
        }
    }

    /// Record the calling thread as the writer. Writer only, once, before it first parks.
    #[cfg(not(dma_loom))]
    pub(crate) fn answer_here(&self) {
        let _ = self.writer.set(std::thread::current());
    }

    /// Park the writer until it is rung, `timeout` passes (`None`: no timeout), or a spurious
    /// wake-up, unless `ready` (its last look for work) finds something.
    #[cfg(not(dma_loom))]
    pub(crate) fn park(&self, ready: impl FnOnce() -> bool, timeout: Option<Duration>) {
        self.parked.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !ready() {
            match timeout {
                Some(timeout) => std::thread::park_timeout(timeout),
                None => std::thread::park(),
            }
        }
        self.parked.store(false, Ordering::Relaxed);
    }
}
