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
//! - **Poison.** A holder that panics keeps the role for good ([`Role::poison`]): nobody takes it
//!   again, and the writer's state is dropped, so every request queued or sent later is answered
//!   `Closed`, as when the writer thread died.
//! - **Nothing on the hit path.** A hit never looks at the role.

use crate::sync::atomic::{AtomicU8, AtomicUsize, Ordering, fence};

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
    /// The role is held by another thread, which looks at the inbox after it releases.
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

    /// Serve as the writer while the role is free and requests are queued: take the role, run
    /// `round` under it, release it, and look again. `round` answers `false` if it poisoned the
    /// role (it panicked). `wake` is called when the background thread must take over: requests
    /// are left after [`Role::ROUNDS`] rounds.
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
        }
        wake();
        Served::Elsewhere
    }
}
