//! The writer role: which thread may act as the cache's writer now.
//!
//! The cache has one writer at a time, not one writer thread: the thread that calls
//! `fi_av_insert` and `fi_av_remove`, owns who holds what and changes the index is whichever
//! thread holds this role. A thread whose resolve missed queues its request, then tries to take
//! the role with one compare-and-swap; if it wins, it applies what is queued (its own request
//! among it) inline, publishes, answers, and releases the role. If the role is held, the holder
//! answers it: a holder looks at the inbox again after every release ([`Role::serve`]), so a
//! request queued while the role was held is never stranded. The process's background thread
//! takes the same role for the work no caller brings (deferred removals, retries, `quiesce`,
//! eviction reports); it never asks a holder to wake it: a holder is a caller that does that
//! work itself, and the background thread comes back at its timer.
//!
//! # Guarantees
//!
//! - **One holder at a time.** The role is taken by a compare-and-swap from free to held, and
//!   given back by a swap to free: two threads cannot both see it free and both take it.
//!   Everything the writer keeps (`writer::WriterCell`) is touched only by the holder, and the
//!   holder's `Acquire` take pairs with the previous holder's `Release` give-back, so each
//!   holder sees everything the one before it did.
//! - **No request stranded.** A requester counts its request as queued ([`Role::queue`]), issues a
//!   `SeqCst` fence and tries the role; a holder releases the role, issues a `SeqCst` fence and
//!   looks at that count. Of the two fences one comes first: either the requester's take finds
//!   the role free (and it serves itself), or the holder's look finds the request (and it serves
//!   again, or hands the rest to the background thread). Fences, not `SeqCst` accesses alone:
//!   that is the Dekker pattern as the memory model (and loom, which models `SeqCst` accesses as
//!   `AcqRel`) guarantees it; on x86 the fences cost little beside the locked instructions next
//!   to them. `loom_tests/tests/role.rs` checks both halves: mutations **K** (a release with no
//!   second look) and **H** (a role taken with a plain load and store) fail it.
//! - **Bounded service.** A holder serves at most [`Role::ROUNDS`] rounds in a row; whatever is
//!   queued after that is handed to the background thread (`wake`), so one unlucky caller does
//!   not serve a storm for ever.
//! - **The work goes to a thread that runs (issue 43, item 2).** A waiter for an answer polls
//!   for it ([`Role::begin_polling`]), and while it polls it takes queued work itself whenever it
//!   finds the role free ([`Role::poll`]). So a holder that has served one round leaves what is
//!   queued after it to a polling waiter instead of serving it too: a waiter is not kept waiting
//!   by a holder that is descheduled after its own round (on 2 cores, with more runnable threads
//!   than cores, a holder is preempted often), and does its own work while it runs. The waiter's
//!   side of it: before it stops polling and blocks, it uncounts itself, issues a `SeqCst` fence
//!   and looks at the queued count once more ([`Role::end_polling`]); the holder's side: it
//!   releases, issues its fence and reads the count of polling waiters. As for the second look,
//!   one fence comes first: either the holder sees the waiter gone (and serves on), or the waiter's
//!   last look finds the role free and the work queued (and serves it). A waiter's poll is bounded
//!   by its spin budget (`cache::doorbell`), so a holder descheduled *inside* its round still
//!   holds the waiters whose requests it took (as a mutex's holder holds its waiters), for at most
//!   a batch: the writer caps a batch by time (`writer::BATCH_TIME`). `loom_tests/tests/role.rs`
//!   checks it: mutation **M** (a waiter that stops polling without its last look) fails it.
//! - **Poison.** A holder that panics keeps the role for good ([`Role::poison`]): nobody takes it
//!   again, and the writer's state is dropped, so every request queued or sent later is answered
//!   `Closed`, as when the writer thread died.
//! - **Nothing on the hit path.** A hit never looks at the role.

use crate::sync::atomic::{AtomicU8, AtomicUsize, Ordering, fence};

/// A cache's writer, whatever its backend: what a caller that missed, or a waiter that polls and
/// finds the role free, serves through (`writer::WriterCell` implements it).
pub(crate) trait Serve: Send + Sync {
    /// Apply what is queued as the writer, if the role is free ([`Role::serve`] with the writer's
    /// round): return once nothing is queued, or the role is held by a thread that will look
    /// again, or the rest is left to a polling waiter or handed to the background thread.
    fn serve(&self);
}

/// The role is held.
const HELD: u8 = 1;
/// A holder panicked: the role is never taken again.
const POISONED: u8 = 4;

/// What [`Role::try_take`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// The caller holds the role now.
    Taken,
    /// Another thread holds it.
    Held,
    /// A holder panicked: the writer is gone.
    Poisoned,
}

/// How a [`Role::serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Nothing is queued: every request queued before the call has been applied, or is in the
    /// hands of the thread that holds the role now.
    Done,
    /// The role is held by another thread, which looks at the inbox after it releases; or the
    /// rest was left to a waiter that polls (it serves it once it finds the role free, or before
    /// it stops polling); or it was handed to the background thread.
    Elsewhere,
    /// The writer is gone.
    Poisoned,
}

/// The role word and the count of queued requests. See the module docs.
#[derive(Debug, Default)]
pub struct Role {
    word: AtomicU8,
    /// Requests counted as queued and not yet taken by a holder: never below the channel's
    /// length (a request is counted before it is sent).
    queued: AtomicUsize,
    /// Waiters polling for their answer now, each of which serves whatever is queued when it
    /// finds the role free, and looks once more before it stops ([`Role::end_polling`]).
    polling: AtomicUsize,
}

impl Role {
    /// The most rounds a holder serves in a row before it hands what is left to the background
    /// thread.
    pub const ROUNDS: usize = 4;

    /// A free role with nothing queued.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take the role if it is free: one compare-and-swap.
    #[inline]
    pub fn try_take(&self) -> Take {
        // SeqCst: the take is one half of the no-stranding argument (see the module docs); its
        // Acquire half makes the previous holder's writes visible.
        match self
            .word
            .compare_exchange(0, HELD, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => Take::Taken,
            Err(word) if word & POISONED != 0 => Take::Poisoned,
            Err(_) => Take::Held,
        }
    }

    /// Give the role back.
    #[inline]
    pub fn release(&self) {
        // SeqCst: its Release half publishes the holder's writes to the next holder; see the
        // module docs for the total order.
        self.word.swap(0, Ordering::SeqCst);
    }

    /// The holder panicked: keep the role for good.
    pub fn poison(&self) {
        self.word.fetch_or(POISONED | HELD, Ordering::SeqCst);
    }

    /// Whether a holder panicked.
    pub fn poisoned(&self) -> bool {
        self.word.load(Ordering::SeqCst) & POISONED != 0
    }

    /// Whether some thread holds the role now: a hint for a waiter's spin, nothing more.
    #[inline]
    pub fn held(&self) -> bool {
        self.word.load(Ordering::Relaxed) & HELD != 0
    }

    /// Count one request as queued: before it is sent.
    #[inline]
    pub fn queue(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// Uncount a request: it was not sent after all, or a holder took it from the inbox.
    #[inline]
    pub fn unqueue(&self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether a request is counted as queued.
    #[inline]
    pub fn has_queued(&self) -> bool {
        self.queued.load(Ordering::SeqCst) != 0
    }

    /// Count the caller as a waiter polling for its answer: until its
    /// [`end_polling`](Self::end_polling), a holder may leave queued work to it, and it calls
    /// [`poll`](Self::poll) between its looks at its answer.
    #[inline]
    pub fn begin_polling(&self) {
        self.polling.fetch_add(1, Ordering::SeqCst);
    }

    /// A polling waiter's look at the role: if it is free and requests are queued, serve them
    /// (`serve` is [`serve`](Self::serve) with the writer's round), uncounted as a poller while
    /// it holds the role. Whether it served.
    #[inline]
    pub fn poll(&self, serve: impl FnOnce()) -> bool {
        if self.held() || !self.has_queued() {
            return false;
        }
        self.polling.fetch_sub(1, Ordering::SeqCst);
        serve();
        self.polling.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// Stop polling (the answer came, or the waiter blocks now): uncount the caller, then the last
    /// look, which serves whatever a holder left to the polling waiters (see the module docs).
    #[inline]
    pub fn end_polling(&self, serve: impl FnOnce()) {
        self.polling.fetch_sub(1, Ordering::SeqCst);
        // The waiter's half: its uncount before its look; the holder's, its release before its
        // read of `polling` (in `serve`).
        fence(Ordering::SeqCst);
        if self.has_queued() {
            serve();
        }
    }

    /// Whether a waiter polls now, which serves what is queued once it finds the role free.
    #[inline]
    fn polled(&self) -> bool {
        self.polling.load(Ordering::SeqCst) != 0
    }

    /// Serve as the writer while the role is free and requests are queued: take the role, run
    /// `round` under it, release it, and look again. `round` answers `false` if it poisoned the
    /// role (it panicked). After a round, what is queued is left to a waiter that polls, if one
    /// does (see the module docs). `wake` is called when the background thread must take over:
    /// requests are left after [`Role::ROUNDS`] rounds and no waiter polls.
    pub fn serve(&self, mut round: impl FnMut() -> bool, wake: impl Fn()) -> Served {
        // The requester's half of the second-look argument: its count (`queue`) before its take.
        fence(Ordering::SeqCst);
        for _ in 0..Self::ROUNDS {
            match self.try_take() {
                Take::Taken => {}
                Take::Held => return Served::Elsewhere,
                Take::Poisoned => return Served::Poisoned,
            }
            if !round() {
                return Served::Poisoned;
            }
            self.release();
            // The second look: a request queued while the role was held finds it free, or is
            // found here (the holder's half: its release before its look).
            fence(Ordering::SeqCst);
            if !self.has_queued() {
                return Served::Done;
            }
            // Hand the rest over to a thread that runs: a polling waiter takes it when it finds
            // the role free, or at its last look.
            if self.polled() {
                return Served::Elsewhere;
            }
        }
        wake();
        Served::Elsewhere
    }
}

#[cfg(all(test, not(dma_loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_holder_leaves_what_is_queued_after_its_round_to_a_polling_waiter() {
        let role = Role::new();
        role.queue();
        // A waiter polls for its answer meanwhile.
        role.begin_polling();
        let rounds = Cell::new(0);
        let woken = Cell::new(false);
        let served = role.serve(
            || {
                rounds.set(rounds.get() + 1);
                // The holder takes the first request; a second is queued during its round.
                role.unqueue();
                role.queue();
                true
            },
            || woken.set(true),
        );
        assert_eq!(Served::Elsewhere, served);
        assert_eq!(
            1,
            rounds.get(),
            "one round, then the rest left to the waiter"
        );
        assert!(
            !woken.get(),
            "a polling waiter takes it: no background thread"
        );
        assert!(role.has_queued() && !role.held());
        // The waiter finds the role free with work queued and serves it.
        let served_by_waiter = Cell::new(false);
        assert!(role.poll(|| {
            let served = role.serve(
                || {
                    role.unqueue();
                    true
                },
                || {},
            );
            served_by_waiter.set(served == Served::Done);
        }));
        assert!(served_by_waiter.get());
        assert!(!role.has_queued());
        role.end_polling(|| panic!("nothing is queued: the last look serves nothing"));
    }

    #[test]
    fn a_waiter_that_stops_polling_serves_what_a_holder_left_it() {
        let role = Role::new();
        role.begin_polling();
        // A holder left a request queued to the waiter (it saw it polling) and gave the role back.
        role.queue();
        let served = Cell::new(false);
        role.end_polling(|| {
            let _ = role.serve(
                || {
                    role.unqueue();
                    served.set(true);
                    true
                },
                || {},
            );
        });
        assert!(served.get(), "the last look served the request");
        assert!(!role.has_queued());
    }

    #[test]
    fn with_no_waiter_polling_a_holder_serves_its_rounds_then_wakes_the_background_thread() {
        let role = Role::new();
        role.queue();
        let rounds = Cell::new(0);
        let woken = Cell::new(false);
        let served = role.serve(
            || {
                // Each round takes one request, and another comes meanwhile.
                rounds.set(rounds.get() + 1);
                true
            },
            || woken.set(true),
        );
        assert_eq!(Served::Elsewhere, served);
        assert_eq!(Role::ROUNDS, rounds.get());
        assert!(woken.get());
    }

    #[test]
    fn a_poll_while_the_role_is_held_serves_nothing() {
        let role = Role::new();
        role.queue();
        role.begin_polling();
        assert_eq!(Take::Taken, role.try_take());
        assert!(!role.poll(|| panic!("the role is held")));
        role.release();
        role.end_polling(|| {
            let _ = role.serve(
                || {
                    role.unqueue();
                    true
                },
                || {},
            );
        });
        assert!(!role.has_queued());
    }
}
