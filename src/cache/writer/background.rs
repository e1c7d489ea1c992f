//! The background thread: one per process, shared by every cache, for the work no caller brings.
//!
//! A cache's writer is a role ([`crate::cache::role`]) that callers take for their own misses.
//! What no caller brings (deferred removals as readers unpin and leases drop, failed removals'
//! retries, `quiesce`, eviction reports, waiters' deadlines, requests of senders that do not
//! serve) is done by one thread, `dma-av-writer`, started with the process's first cache. Each
//! cache registers with it once ([`tend`]); the thread visits a cache when that cache's doorbell
//! rings it, when its timer comes, or when it finds work there on a wake-up for another cache,
//! and a visit is one background round under that cache's role ([`Tend::visit`]). So a process
//! with nine endpoints runs one background thread, not nine.
//!
//! # Guarantees
//!
//! - **No lost wake-up.** Per cache, as with a thread of its own (see `cache::doorbell`): a
//!   visit announces that the thread stops looking at the cache (a state word and a `SeqCst`
//!   fence) before its last look for work; a ringer makes its work visible, issues a fence and
//!   unparks the thread if it reads the announcement. An unpark that comes while the thread is
//!   busy with another cache is kept by the thread's park token, so its next park returns at
//!   once and its next pass looks at every cache.
//! - **Bounded pass.** A pass costs one look (a few atomic loads) per registered cache, plus the
//!   visits of those with work; caches are registered once and dropped from the list once their
//!   writer has stopped and the cache has gone.
//! - **A cache's drop does not wait for the thread.** The dropping thread sends the shutdown and
//!   serves it itself whenever the role is free (see `AddressCache`'s drop); the thread holds a
//!   cache only through a weak reference, and only for the length of a visit.
//! - **Isolation, and its limit.** One cache's poisoned role or stopped writer ends only its own
//!   visits. A backend call that blocks (an [`crate::av::AvBackend`] that waits) holds up the
//!   background work of every cache in the process until it returns; callers' misses, which
//!   serve themselves, are not held up by it.
//!
//! If the thread cannot be started, [`tend`] says so and callers serve what they can without it:
//! their own misses and releases; removals then wait for the next caller, and the cache's drop
//! removes everything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, Weak};
use std::time::Instant;

use super::cell::{After, Tend, Visits};

/// The process's background thread and the caches registered since its last pass.
struct BackgroundThread {
    thread: std::thread::Thread,
    /// Caches registered and not yet in the thread's own list. Locked by a registering cache
    /// (once per cache) and by the thread when `arrived` says there is something to take.
    arrivals: Mutex<Vec<Weak<dyn Tend>>>,
    arrived: AtomicBool,
}

/// The thread, once started (`None` if it could not be).
static BACKGROUND: OnceLock<Option<BackgroundThread>> = OnceLock::new();

/// Register `cache` with the process's background thread, starting the thread with the first
/// cache; whether there is one to do the cache's background work.
pub(crate) fn tend(cache: Weak<dyn Tend>) -> bool {
    let Some(background) = BACKGROUND.get_or_init(start) else {
        return false;
    };
    if let Some(strong) = cache.upgrade() {
        strong.answer_at(background.thread.clone());
    }
    crate::sync::lock(&background.arrivals).push(cache);
    background.arrived.store(true, Ordering::Release);
    background.thread.unpark();
    true
}

/// Start the thread; `None` if the system refuses one.
fn start() -> Option<BackgroundThread> {
    let spawned = std::thread::Builder::new()
        .name("dma-av-writer".into())
        .spawn(run);
    match spawned {
        Ok(handle) => Some(BackgroundThread {
            thread: handle.thread().clone(),
            arrivals: Mutex::new(Vec::new()),
            arrived: AtomicBool::new(false),
        }),
        Err(error) => {
            tracing::error!(%error, "could not start the address caches' background thread");
            None
        }
    }
}

/// One registered cache, as the thread keeps it.
struct Slot {
    cache: Weak<dyn Tend>,
    visits: Visits,
    /// When to visit it next, if no ring comes first (`None`: only when rung).
    due: Option<Instant>,
    /// Visit it on the next pass whatever its doorbell says.
    again: bool,
}

/// The thread's loop: take the caches registered since the last pass, visit each that is due or
/// has work, and park until the earliest timer or a ring.
fn run() {
    let background = loop {
        // The `OnceLock` is set by the thread that spawned this one just after the spawn.
        if let Some(Some(background)) = BACKGROUND.get() {
            break background;
        }
        std::thread::park();
    };
    let mut slots: Vec<Slot> = Vec::new();
    loop {
        if background.arrived.swap(false, Ordering::Acquire) {
            let arrivals = std::mem::take(&mut *crate::sync::lock(&background.arrivals));
            slots.extend(arrivals.into_iter().map(|cache| Slot {
                cache,
                visits: Visits::default(),
                due: None,
                again: true,
            }));
        }
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut again = false;
        slots.retain_mut(|slot| {
            let Some(cache) = slot.cache.upgrade() else {
                return false;
            };
            let due = slot.again || slot.due.is_some_and(|due| due <= now) || cache.ready();
            if due {
                match cache.visit(&mut slot.visits) {
                    After::Gone => return false,
                    After::Again => {
                        slot.again = true;
                        again = true;
                        return true;
                    }
                    After::Park(at) => {
                        slot.again = false;
                        slot.due = at;
                    }
                }
            }
            if let Some(due) = slot.due {
                next = Some(next.map_or(due, |next| next.min(due)));
            }
            true
        });
        if again {
            continue;
        }
        match next {
            Some(next) => std::thread::park_timeout(next.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}
