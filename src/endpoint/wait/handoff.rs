//! The waiters' hand-off, apart from the descriptors they sleep on: which waiter is the poller,
//! how the others follow it, and how a ringer reaches whichever is asleep. [`super::Waiter`]
//! wraps it with the `fi_trywait` protocol, `poll(2)` and the `eventfd` bell; here the poller's
//! sleep and its bell are closures, so the loom model (`loom_tests/tests/waiter.rs`) runs this
//! code as it ships, its `Mutex`, `Condvar` and counter from `crate::sync` (loom's under
//! `--cfg dma_loom`).
//!
//! # What it guarantees
//!
//! **No lost wake-up.** A waiter whose `attempt` found nothing sleeps only if nothing it waits
//! for can have been published since that attempt began without a ring reaching it:
//! - a waiter counts itself in `waiting` *before* its first attempt, and reads the generation
//!   *before* each attempt;
//! - a ringer publishes (under the publisher's own lock, which the attempt also takes) *before*
//!   it reads `waiting`, and, seeing a waiter, moves the generation on under the state lock and,
//!   if a poller is asleep, wakes it (the bell);
//! - a waiter decides to sleep under the state lock, and only if the generation is the one it
//!   read before its attempt: a ring that landed after the read makes it attempt again, and a
//!   ring after the decision finds it either on the condition variable (notified) or the poller
//!   (`poller` is set in the same critical section; the bell is sticky, an `eventfd` counter, so
//!   a ring before the poller's `poll` still wakes it).
//!
//! Either the attempt sees the publication (it took the publisher's lock after the publish), or
//! the ringer read `waiting` after the count and reaches the waiter. The shipped sleeps are
//! bounded all the same ([`super::MOST_SLEEP`]); under loom they are not (loom's `wait_timeout`
//! never times out, and the model's bell blocks until rung), so a lost wake-up is a deadlock.
//!
//! **One poller.** At most one waiter at a time sleeps on the descriptors (`poller`); the others
//! wait on the condition variable for the generation to move, which the poller does whenever it
//! wakes, so every waiter attempts again after every wake-up of the descriptors.
//!
//! # Bounds
//!
//! A counter, one lock, one condition variable: nothing grows with the number of waiters.

use std::sync::PoisonError;
use std::time::Duration;

use crate::endpoint::deadline::Deadline;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{Condvar, Mutex, MutexGuard};

use super::MOST_SLEEP;

#[derive(Debug, Default)]
struct State {
    /// Whether a waiter is the poller now.
    poller: bool,
    /// Moves on whenever the poller wakes or something a waiter may wait for is published.
    generation: u64,
}

/// The threads waiting on one endpoint's (or one rail set's) completions, and the ringers that
/// wake them: see the module docs. (Public only for the loom models, under `--cfg dma_loom`.)
#[derive(Debug, Default)]
pub struct Handoff {
    waiting: AtomicUsize,
    state: Mutex<State>,
    changed: Condvar,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    crate::sync::lock_modelled(state)
}

impl Handoff {
    /// A hand-off with no waiter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Something a waiter may wait for was just published (under a lock its `attempt` takes too):
    /// make every waiter attempt again, calling `wake_poller` if one sleeps as the poller (the
    /// shipped one writes the `eventfd` in its `poll` set). One atomic load when none waits.
    pub fn ring(&self, wake_poller: impl FnOnce()) {
        if 0 == self.waiting.load(Ordering::SeqCst) {
            return;
        }
        let mut state = lock(&self.state);
        state.generation = state.generation.wrapping_add(1);
        let poller = state.poller;
        drop(state);
        self.changed.notify_all();
        if poller {
            wake_poller();
        }
    }

    /// Call `attempt` until it answers `Some` or `deadline` passes. Between calls one waiter at a
    /// time, the poller, calls `sleep` with how long it may sleep (at most [`MOST_SLEEP`]); it
    /// must return when woken by `ring`'s `wake_poller` (even one that came before it began) or
    /// by the source of what `attempt` looks for. The others wait for the poller to wake.
    pub fn wait<T>(
        &self,
        deadline: Deadline,
        mut attempt: impl FnMut() -> Option<T>,
        mut sleep: impl FnMut(Duration),
    ) -> Option<T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.waiting);
        loop {
            let seen = lock(&self.state).generation;
            if let Some(found) = attempt() {
                return Some(found);
            }
            if deadline.passed() {
                return None;
            }
            let state = lock(&self.state);
            if state.generation != seen {
                continue;
            }
            let bound = deadline.remaining().unwrap_or(MOST_SLEEP).min(MOST_SLEEP);
            if state.poller {
                // One wait: a wake-up, spurious or not, or the bound sends it back to `attempt`.
                let _unused = self
                    .changed
                    .wait_timeout(state, bound)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            let mut state = state;
            state.poller = true;
            drop(state);
            sleep(bound);
            let mut state = lock(&self.state);
            state.poller = false;
            state.generation = state.generation.wrapping_add(1);
            drop(state);
            self.changed.notify_all();
        }
    }
}

/// Uncounts a waiter when its wait ends, however it ends.
struct Counted<'count>(&'count AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
