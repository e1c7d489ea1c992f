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
//!   it reads `waiting`, and, seeing a waiter, moves the generation on under the state lock and
//!   reads there whether a poller and followers are asleep: it wakes the poller (the bell) and
//!   notifies the condition variable only if one is (a follower counts itself in `followers` in
//!   the critical section in which it decides to sleep, so a follower the ringer reads as absent
//!   decides after the generation moved, and does not sleep);
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
//! **No sleep through connection setup.** Some progress is signalled by nothing a waiter sleeps
//! on: a post the provider answers "retry after progress" (`-FI_EAGAIN`; on tcp;ofi_rxm the first
//! post to a new peer, while rxm sets the connection up) may be taken by the very next attempt,
//! because that answer's own progress read the connection's last event, and nothing is left to
//! wake a descriptor or ring. A post that is answered so calls [`Handoff::retry_soon`]; a waiter
//! whose attempt saw it (the counter moved across the attempt) sleeps at most
//! [`Handoff::RETRY_FIRST`], doubling on each such sleep to at most [`Handoff::RETRY_MOST`]
//! (and back to the first after a sleep something woke), instead of the longest sleep: as the poller, in its `sleep` (which still wakes for the
//! descriptors); as a follower, in a nap of its own, since the poller may sleep long. An idle
//! wait sees no such answer and sleeps as before. The loom model `loom_tests/tests/waiter.rs`
//! (`a_post_answered_retry_is_attempted_again_without_a_ring`) treats a sleep of at most
//! `RETRY_MOST` as a timer that fires and a longer one as one that never ends unless rung, so a
//! wait that needs the retry and sleeps long instead deadlocks.
//!
//! # Bounds
//!
//! A counter, one lock, one condition variable: nothing grows with the number of waiters.

use std::sync::PoisonError;
use std::time::Duration;

use crate::endpoint::deadline::Deadline;
use crate::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use crate::sync::{Condvar, Mutex, MutexGuard};

use super::MOST_SLEEP;

#[derive(Debug, Default)]
struct State {
    /// Whether a waiter is the poller now.
    poller: bool,
    /// Moves on whenever the poller wakes or something a waiter may wait for is published.
    generation: u64,
    /// Waiters asleep on the condition variable now (followers): a ring or a poller's wake-up
    /// notifies it only when one is, since std's notify is a `futex` system call even when
    /// nobody waits, and the commonest ringer is a waiter reaping its own completions.
    followers: usize,
}

/// The threads waiting on one endpoint's (or one rail set's) completions, and the ringers that
/// wake them: see the module docs. (Public only for the loom models, under `--cfg dma_loom`.)
#[derive(Debug, Default)]
pub struct Handoff {
    waiting: AtomicUsize,
    state: Mutex<State>,
    changed: Condvar,
    /// Moves on at every post the provider answered "retry after progress" ([`Self::retry_soon`]).
    asked_to_retry: AtomicU64,
    /// Sleeps that lasted the whole of [`MOST_SLEEP`] with nothing waking them: statistics, not
    /// part of the protocol (std's atomic under loom too).
    ran_out: std::sync::atomic::AtomicU64,
    /// Notifications of the condition variable, for the unit tests.
    #[cfg(test)]
    notified: std::sync::atomic::AtomicU64,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    crate::sync::lock_modelled(state)
}

impl Handoff {
    /// The first sleep of a wait whose attempt a post's "retry after progress" answered.
    pub const RETRY_FIRST: Duration = Duration::from_millis(1);

    /// The longest sleep of a wait whose attempt a post's "retry after progress" answered: the
    /// most a retry waits past the progress that would let the post through (a connection set
    /// up), and, while the provider keeps answering so, at most one attempt each
    /// `RETRY_MOST`, about 63 a second.
    pub const RETRY_MOST: Duration = Duration::from_millis(16);

    /// A hand-off with no waiter.
    pub fn new() -> Self {
        Self::default()
    }

    /// A post was just answered "retry after progress" (`-FI_EAGAIN`): a waiter whose attempt
    /// this answered sleeps short (see the module docs). One atomic add.
    pub fn retry_soon(&self) {
        self.asked_to_retry.fetch_add(1, Ordering::SeqCst);
    }

    /// How many posts were answered "retry after progress" ([`retry_soon`](Self::retry_soon)).
    pub fn retries_asked(&self) -> u64 {
        self.asked_to_retry.load(Ordering::SeqCst)
    }

    /// How many sleeps of this hand-off's waiters, poller's or follower's, lasted the whole of
    /// [`MOST_SLEEP`] without a wake-up.
    pub fn sleeps_run_out(&self) -> u64 {
        self.ran_out.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Something a waiter may wait for was just published (under a lock its `attempt` takes too):
    /// make every waiter attempt again, calling `wake_poller` if one sleeps as the poller (the
    /// shipped one writes the `eventfd` in its `poll` set). One atomic load when none waits, and
    /// no system call when only the ringer itself waits (a waiter reaping its own completions).
    pub fn ring(&self, wake_poller: impl FnOnce()) {
        if 0 == self.waiting.load(Ordering::SeqCst) {
            return;
        }
        let mut state = lock(&self.state);
        state.generation = state.generation.wrapping_add(1);
        let (poller, followers) = (state.poller, state.followers);
        drop(state);
        // A follower counts itself under this lock before it sleeps, and one that counts itself
        // after it sees the generation moved and does not sleep.
        if 0 < followers {
            self.notify_followers();
        }
        if poller {
            wake_poller();
        }
    }

    /// Call `attempt` until it answers `Some` or `deadline` passes. Between calls one waiter at a
    /// time, the poller, calls `sleep` with how long it may sleep (at most [`MOST_SLEEP`]); it
    /// must return when woken by `ring`'s `wake_poller` (even one that came before it began) or
    /// by the source of what `attempt` looks for, and answer whether something woke it before
    /// that bound. The others wait for the poller to wake. A waiter whose attempt was answered
    /// "retry after progress" ([`retry_soon`](Self::retry_soon)) sleeps at most
    /// [`RETRY_MOST`](Self::RETRY_MOST) instead, poller or not.
    pub fn wait<T>(
        &self,
        deadline: Deadline,
        mut attempt: impl FnMut() -> Option<T>,
        mut sleep: impl FnMut(Duration) -> bool,
    ) -> Option<T> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.waiting);
        let mut retry = Self::RETRY_FIRST;
        loop {
            let seen = lock(&self.state).generation;
            let asked = self.asked_to_retry.load(Ordering::SeqCst);
            if let Some(found) = attempt() {
                return Some(found);
            }
            if deadline.passed() {
                return None;
            }
            // A post of this attempt (or another thread's, meanwhile) was answered "retry after
            // progress": what lets it through may signal nothing this wait sleeps on.
            let retrying = self.asked_to_retry.load(Ordering::SeqCst) != asked;
            let longest = if retrying { retry } else { MOST_SLEEP };
            let bound = deadline.remaining().unwrap_or(longest).min(longest);
            let state = lock(&self.state);
            if state.generation != seen {
                continue;
            }
            if retrying {
                retry = retry.saturating_mul(2).min(Self::RETRY_MOST);
            } else {
                retry = Self::RETRY_FIRST;
            }
            if state.poller {
                if retrying {
                    // The poller may sleep long: nap on this thread's own short clock.
                    drop(state);
                    nap(bound);
                    continue;
                }
                // One wait: a wake-up, spurious or not, or the bound sends it back to `attempt`.
                let mut state = state;
                state.followers += 1;
                let (mut state, waited) = self
                    .changed
                    .wait_timeout(state, bound)
                    .unwrap_or_else(PoisonError::into_inner);
                state.followers -= 1;
                drop(state);
                self.count_run_out(bound, !waited.timed_out());
                continue;
            }
            let mut state = state;
            state.poller = true;
            drop(state);
            let woken = sleep(bound);
            self.count_run_out(bound, woken);
            if woken {
                // Progress came (the peer's answer to a connection request, say): what the post
                // waits for may be done by the next attempt's own progress, so retry soon again.
                retry = Self::RETRY_FIRST;
            }
            let mut state = lock(&self.state);
            state.poller = false;
            state.generation = state.generation.wrapping_add(1);
            let followers = state.followers;
            drop(state);
            if 0 < followers {
                self.notify_followers();
            }
        }
    }

    /// How many times a ring or a poller's wake-up notified the followers' condition variable
    /// (a `futex` system call each): only when a follower was asleep on it.
    #[cfg(test)]
    fn notifications(&self) -> u64 {
        self.notified.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn notify_followers(&self) {
        #[cfg(test)]
        self.notified
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.changed.notify_all();
    }

    /// Count a sleep bounded by `bound` that nothing woke, if it was the longest sleep.
    fn count_run_out(&self, bound: Duration, woken: bool) {
        if !woken && bound >= MOST_SLEEP {
            self.ran_out
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// A follower's sleep while its post waits for progress: `bound` on this thread's own clock
/// (under loom, a yield: a timer that fires).
fn nap(bound: Duration) {
    #[cfg(not(dma_loom))]
    std::thread::sleep(bound);
    #[cfg(dma_loom)]
    {
        let _ = bound;
        loom::thread::yield_now();
    }
}

/// Uncounts a waiter when its wait ends, however it ends.
struct Counted<'count>(&'count AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(dma_loom)))]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking
mod tests {
    use std::cell::Cell;
    use std::sync::mpsc;

    use super::*;

    /// A waiter that reaps its own completions rings for each (as `send_within` waiting for its
    /// budget does): with nobody else waiting, no ring notifies the condition variable.
    #[test]
    fn a_waiter_ringing_for_itself_notifies_nobody() {
        let handoff = Handoff::new();
        let rings = Cell::new(0);
        let found = handoff.wait(
            Deadline::after(Duration::MAX),
            || {
                handoff.ring(|| panic!("no poller sleeps"));
                rings.set(rings.get() + 1);
                (rings.get() == 1_000).then_some(())
            },
            |_| panic!("the attempt answers before any sleep: {}", rings.get()),
        );
        // The sleep closure is never called: every attempt but the last saw its own ring move
        // the generation, so it attempted again at once.
        assert_eq!(Some(()), found);
        assert_eq!(0, handoff.notifications());
    }

    /// A follower asleep on the condition variable is notified by a ring (the no-lost-wake-up
    /// half of the same rule; the loom model `waiter` checks it in every interleaving). A
    /// follower whose longest sleep ran out before the ring (this thread descheduled for a
    /// second) would find the publication without a notification: such a round says nothing,
    /// and the test tries again, at most five rounds.
    #[test]
    fn a_ring_notifies_a_follower_asleep() {
        for _ in 0..5 {
            let handoff = Handoff::new();
            ring_a_sleeping_follower(&handoff);
            if 0 == handoff.sleeps_run_out() {
                assert!(0 < handoff.notifications(), "the follower was not notified");
                return;
            }
        }
        panic!("in five rounds the follower slept its longest sleep out: never notified");
    }

    /// A poller asleep until rung, a follower asleep behind it, then a publication and a ring.
    fn ring_a_sleeping_follower(handoff: &Handoff) {
        let ready = &Mutex::new(false);
        let (asleep, poller_asleep) = mpsc::channel::<()>();
        let (wake, poller_woken) = mpsc::channel::<()>();
        std::thread::scope(|scope| {
            // The poller: sleeps until rung, so the second waiter must follow it.
            let poller = scope.spawn(move || {
                let slept = Cell::new(false);
                handoff.wait(
                    Deadline::after(Duration::MAX),
                    || (slept.get() && *lock_ready(ready)).then_some(()),
                    |_| {
                        slept.set(true);
                        asleep.send(()).unwrap();
                        poller_woken.recv().unwrap();
                        true
                    },
                )
            });
            poller_asleep.recv().unwrap();
            let follower = scope.spawn(move || {
                handoff.wait(
                    Deadline::after(Duration::MAX),
                    || lock_ready(ready).then_some(()),
                    |_| panic!("the poller sleeps already"),
                )
            });
            // A hang detector, not a timing verdict: the follower counts itself as it sleeps.
            // Past it, both waiters are still let go (published for, and the poller rung), so
            // the test fails rather than hangs in the scope's join.
            let hang = std::time::Instant::now() + Duration::from_secs(60);
            let mut counted = true;
            while 0 == lock(&handoff.state).followers {
                if std::time::Instant::now() >= hang {
                    counted = false;
                    break;
                }
                std::thread::yield_now();
            }
            *lock_ready(ready) = true;
            handoff.ring(|| wake.send(()).unwrap());
            assert_eq!(Some(()), follower.join().unwrap());
            assert_eq!(Some(()), poller.join().unwrap());
            assert!(counted, "the follower never counted itself asleep");
        });
    }

    fn lock_ready(ready: &Mutex<bool>) -> MutexGuard<'_, bool> {
        ready.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
