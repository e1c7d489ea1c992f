//! Each cache's private epoch collector, and the per-thread handles readers pin through.
//!
//! A `crossbeam_epoch::LocalHandle` is a thread's membership of one collector. Registering one
//! allocates, so a thread registers once per cache and keeps the handle in a thread-local list;
//! `pin` then costs a short scan of that list and crossbeam's own pin. Handles of caches that
//! have been dropped are pruned whenever a new one is registered, so a thread that meets many
//! caches over its life holds handles only for the live ones.
//!
//! A thread that exits gives its handles back to their caches' spare lists, and a thread's first
//! pin of a cache takes a spare handle before it registers a new one. So a cache holds at most
//! as many handles as threads have held one of its handles at once, however many threads come
//! and go. Dropping a handle instead would cost an exited thread its participant (2,304 B) and
//! the empty bag crossbeam seals when the participant leaves (2,072 B), which crossbeam frees
//! only once every reader pinned then has unpinned: 4,376 B a thread kept while one reader stays
//! pinned. Kept on the spare list, an exited thread's handle costs nothing more
//! (`tests/cache_worst_case_bounds.rs`; figures: `docs/benchmarks.md`, "Figures moved out of the
//! module docs").

use std::cell::RefCell;

use crossbeam_epoch::{Collector, Guard, LocalHandle};

// The liveness token and the spare list are bookkeeping, not synchronisation (no loom operation
// inside the lock), and loom's `Arc` has no `Weak`.
use std::sync::{Arc, Mutex, Weak};

use crate::sync::lock;

/// An unpinned handle of a thread that has exited, waiting for the next thread's first pin.
struct Spare(LocalHandle);

// SAFETY: crossbeam makes `LocalHandle` `!Send` because its participant's fields are plain
// `Cell`s that must not be used from two threads at once, and because a guard must not outlive
// its handle's thread. A `Spare` is made only of a handle that is not pinned (no guard refers to
// it: `Registered::drop` checks) by the thread that owned it, as that thread gives it up; it
// moves through the spare list's mutex, which orders the giving thread's last use before the
// taking thread's first; and it is used again by one thread only, the one that took it. The
// participant keeps no thread-local state of its own (only crossbeam's default collector's handle
// is thread-local, and a cache's collector is its own), so which thread uses it does not matter.
unsafe impl Send for Spare {}

/// A cache's spare handles, which is also the token that says the cache is alive.
type Spares = Mutex<Vec<Spare>>;

/// A cache's collector with its spare handles (the token that says the cache is alive).
pub(crate) struct Epochs {
    collector: Collector,
    #[cfg_attr(dma_loom, allow(dead_code))]
    alive: Arc<Spares>,
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
    alive: Weak<Spares>,
    /// `None` only once `drop` has taken it.
    handle: Option<LocalHandle>,
}

#[cfg_attr(dma_loom, allow(dead_code))]
impl Registered {
    fn handle(&self) -> Option<&LocalHandle> {
        self.handle.as_ref()
    }
}

impl Drop for Registered {
    /// Give the handle back to its cache, if the cache is alive and nothing holds the handle
    /// pinned; otherwise drop it (crossbeam keeps the participant until its last guard drops).
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        if handle.is_pinned() {
            return;
        }
        if let Some(spares) = self.alive.upgrade() {
            lock(&spares).push(Spare(handle));
        }
    }
}

std::thread_local! {
    static HANDLES: RefCell<Vec<Registered>> = const { RefCell::new(Vec::new()) };
}

impl Epochs {
    pub(crate) fn new() -> Self {
        Self {
            collector: Collector::new(),
            alive: Arc::new(Mutex::new(Vec::new())),
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
                    registered.handle().is_some_and(|handle| {
                        handle.collector() == &self.collector && handle.is_pinned()
                    })
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
            if let Some(handle) = handles
                .iter()
                .filter_map(Registered::handle)
                .find(|handle| handle.collector() == &self.collector)
            {
                return handle.pin();
            }
            handles.retain(|registered| 0 < registered.alive.strong_count());
            let spare = lock(&self.alive).pop();
            let handle = match spare {
                Some(Spare(handle)) => handle,
                None => self.collector.register(),
            };
            let guard = handle.pin();
            handles.push(Registered {
                alive: Arc::downgrade(&self.alive),
                handle: Some(handle),
            });
            guard
        });
        // During thread teardown the list may already be gone: pin through a handle of our own,
        // which the guard outlives safely (crossbeam keeps the participant until both drop).
        pinned.unwrap_or_else(|_| self.collector.register().pin())
    }
}
