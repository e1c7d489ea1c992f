//! Each cache's private epoch collector, and the per-thread handles readers pin through.
//!
//! A `crossbeam_epoch::LocalHandle` is a thread's membership of one collector. Registering one
//! allocates, so a thread registers once per cache and keeps the handle in a thread-local list;
//! `pin` then costs a short scan of that list and crossbeam's own pin. Handles of caches that
//! have been dropped are pruned whenever a new one is registered, so a thread that meets many
//! caches over its life holds handles only for the live ones.

use std::cell::RefCell;

use crossbeam_epoch::{Collector, Guard, LocalHandle};

// The liveness token is bookkeeping, not synchronisation, and loom's `Arc` has no `Weak`.
use std::sync::{Arc, Weak};

/// A cache's collector with the token that says the cache is alive.
pub(crate) struct Epochs {
    collector: Collector,
    #[cfg_attr(dma_loom, allow(dead_code))]
    alive: Arc<()>,
}

/// A reader's pin: the guard, and under loom the handle it was taken through (dropped after it).
pub(crate) struct EpochPin {
    #[allow(dead_code)] // held for its Drop, which unpins
    guard: Guard,
    #[cfg(dma_loom)]
    _handle: LocalHandle,
}

#[cfg_attr(dma_loom, allow(dead_code))]
struct Registered {
    alive: Weak<()>,
    handle: LocalHandle,
}

std::thread_local! {
    static HANDLES: RefCell<Vec<Registered>> = const { RefCell::new(Vec::new()) };
}

impl Epochs {
    pub(crate) fn new() -> Self {
        Self {
            collector: Collector::new(),
            alive: Arc::new(()),
        }
    }

    /// The collector, for the writer thread to register on.
    pub(crate) fn collector(&self) -> &Collector {
        &self.collector
    }

    /// Pin the calling thread on this cache's collector.
    ///
    /// Under loom every pin registers a handle of its own, dropped with the pin. A handle left in
    /// a loom thread-local is finalized in loom's thread teardown, and there (seen on loom 0.7.3
    /// with crossbeam-epoch 0.9.21) it held the epoch back for good, so every model stalled; the
    /// thread-local list itself is plain bookkeeping and is not what the models check.
    #[cfg(dma_loom)]
    pub(crate) fn pin(&self) -> EpochPin {
        let handle = self.collector.register();
        EpochPin {
            guard: handle.pin(),
            _handle: handle,
        }
    }

    /// Pin the calling thread on this cache's collector.
    #[cfg(not(dma_loom))]
    pub(crate) fn pin(&self) -> EpochPin {
        EpochPin {
            guard: self.pin_registered(),
        }
    }

    /// Whether the calling thread is pinned on this cache now.
    #[cfg(not(dma_loom))]
    pub(crate) fn pinned_here(&self) -> bool {
        HANDLES
            .try_with(|handles| {
                handles.borrow().iter().any(|registered| {
                    registered.handle.collector() == &self.collector
                        && registered.handle.is_pinned()
                })
            })
            .unwrap_or(false)
    }

    /// Whether the calling thread is pinned on this cache now: under loom each pin has a handle
    /// of its own, which this cannot see, so never.
    #[cfg(dma_loom)]
    pub(crate) fn pinned_here(&self) -> bool {
        false
    }

    #[cfg(not(dma_loom))]
    fn pin_registered(&self) -> Guard {
        let pinned = HANDLES.try_with(|handles| {
            let mut handles = handles.borrow_mut();
            if let Some(registered) = handles
                .iter()
                .find(|registered| registered.handle.collector() == &self.collector)
            {
                return registered.handle.pin();
            }
            handles.retain(|registered| 0 < registered.alive.strong_count());
            let handle = self.collector.register();
            let guard = handle.pin();
            handles.push(Registered {
                alive: Arc::downgrade(&self.alive),
                handle,
            });
            guard
        });
        // During thread teardown the list may already be gone: pin through a handle of our own,
        // which the guard outlives safely (crossbeam keeps the participant until both drop).
        pinned.unwrap_or_else(|_| self.collector.register().pin())
    }
}
