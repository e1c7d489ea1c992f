//! The writer's doorbell: how the threads that hand the background writer thread work wake it
//! when it has parked, and how a thread waiting for the writer's answer learns whether the writer
//! is awake. It also carries the writer role ([`super::role`]): a waiter polls while some thread
//! holds it, since the holder answers within a batch.
//!
//! The background thread (one per process, shared by every cache: `writer::background`) parks
//! with `std::thread::park` (with a timeout while removals are pending), not on a channel, so
//! that every source of work can wake it the same way: a request no caller serves
//! (`try_resolve`, a rail set's queued release, `quiesce`), an epoch deferral whose readers have
//! gone, the last lease of an awaited removal, a role holder that hands it work. Each cache's
//! doorbell says whether the thread looks at that cache: a ringer unparks the thread only if it
//! announced that it stopped looking. A caller whose miss takes the role does not ring: it
//! applies its own request. The state word below is the background thread's alone; a caller that
//! holds the role never writes it (a `POLLING` written over the background thread's `PARKED`
//! would lose a wake-up).
//!
//! While callers hold the role often enough to do its routine work, the background thread dozes
//! ([`DOZING`]): it parks on a timer of at most `writer::rounds::DOZE_MAX`, a request
//! still rings it, and a report ([`Doorbell::ring_report`], the deferral's closure) does not:
//! the next holder takes the report, or the thread at its timer.
//!
//! # The writer's state
//!
//! One atomic word, written by the writer alone and never touched by a hit, says what the writer
//! is doing and what its work costs: [`APPLYING`] (awake, working through a batch of requests),
//! [`POLLING`] (awake, looking for work or moving the epoch on) or [`PARKED`] (asleep until
//! rung), and, in the bits above the state, what its recent batches took and how long it took to
//! get back on a CPU once rung, each an average in nanoseconds. A miss's waiter reads it to decide
//! how to wait for its answer, the way an adaptive mutex decides whether to spin for its owner:
//! while the writer is awake the answer is at most two batches away (the one being applied, then
//! the one with the waiter's request), so the waiter polls for that long
//! ([`WriterState::spin_budget`]); while the writer is parked and nobody has rung it, a poll would
//! only take the core the writer needs to wake on, and the waiter blocks at once.
//!
//! The one case in between: the writer is parked but has been rung and has not run yet (a ringer
//! that unparks it records when, in a second word, which the writer clears when it runs). The
//! waiter's own request usually did that ring, and the writer is on its way; blocking then would
//! make the answer pay a second wake-up, the waiter's, on top of the writer's. So a waiter polls
//! through a pending wake too, for what the writer's wake-ups have measured plus the two batches.
//!
//! # Guarantees
//!
//! - **No lost wake-up of the writer.** The writer announces that it parks (state [`PARKED`]),
//!   issues a `SeqCst` fence, and then looks for work once more before it parks; a ringer makes
//!   its work visible, issues a `SeqCst` fence, and then reads the state. Of two `SeqCst` fences
//!   one comes first, so either the writer's last look sees the work, or the ringer sees
//!   [`PARKED`] and unparks it (an unpark that comes before the park makes the park return at
//!   once). A report that finds it [`DOZING`] is not lost either: the doze is a timer, at the end
//!   of which the thread looks at the cache, and every holder before that takes the report.
//! - **No lost wake-up of a waiter, whatever state it reads.** A waiter's spin only polls its
//!   answer channel; however it ends (the answer came, the writer was seen parked, the budget ran
//!   out), the waiter then blocks on the channel itself, whose `recv` returns as soon as the
//!   answer is sent, before or after the block. The state is a hint for how long to poll: a stale
//!   one (the writer parked just after the waiter read [`APPLYING`]) costs at most the budget, a
//!   few microseconds, and never the answer. And the writer cannot sit parked on the waiter's
//!   request: the waiter rang after queueing it (the guarantee above).
//! - **The spin is bounded**: by twice the writer's measured batch cost (plus its measured
//!   wake-up, while one is pending), at least [`MIN_SPIN`] and at most [`MAX_SPIN`]; the waiter
//!   reads the state again on every poll and stops at once when it reads [`PARKED`] with no wake
//!   pending.
//! - **Lock-free and allocation-free to ring**: a fence, a load and, when the writer is parked,
//!   `Thread::unpark` (an atomic swap and a futex wake). So a deferred closure that runs inside a
//!   reader's `pin()`, and a lease's drop on a completion thread, may ring it.
//!
//! Under loom the writer waits on its inbox instead (loom has no timed park), publishing
//! [`PARKED`] before it does, and ringing does nothing: the models drive the writer with
//! requests, as they always have, and check a waiter's decision to spin against a writer that
//! parks meanwhile (`loom_tests/tests/adaptive_wait.rs`).

#[cfg(not(dma_loom))]
use std::sync::OnceLock;
use std::time::Duration;

use super::role::Role;
#[cfg(not(dma_loom))]
use crate::sync::atomic::fence;
use crate::sync::atomic::{AtomicU64, Ordering};

/// The writer is awake and applying a batch of requests.
pub(crate) const APPLYING: u64 = 0;
/// The writer is awake, between batches: looking for the next request, or moving the epoch on.
pub(crate) const POLLING: u64 = 1;
/// The writer is parked (or about to park) until it is rung.
pub(crate) const PARKED: u64 = 2;
/// The background thread is parked (or about to park) with a timer, while callers that hold the
/// role do its work: a ring for a request wakes it, a report ([`Doorbell::ring_report`]) does
/// not, since the next holder or the timer takes it.
pub(crate) const DOZING: u64 = 3;
/// The state's bits in the word; the batch cost sits above them, then the wake-up cost.
const STATE_BITS: u32 = 2;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// The bits of each cost, in nanoseconds: up to about 2 s, far past [`MAX_SPIN`].
const COST_BITS: u32 = 31;
const COST_MASK: u64 = (1 << COST_BITS) - 1;

/// The shortest poll a waiter allows an awake writer: what the hand-off itself costs, which the
/// writer's batch cost leaves out (the writer noticing the request between its yields, and the
/// answer reaching the waiter). A floor below that hand-off makes a waiter give up just before
/// its answer and pay a wake-up on top of it, so the floor is set well above it: a waiter always
/// polls an awake writer at least this long (figures:
/// `docs/benchmarks.md`, "Figures moved out of the module docs").
#[cfg_attr(dma_loom, allow(dead_code))] // read by the spin budget, which loom has no time for
pub(crate) const MIN_SPIN: Duration = Duration::from_micros(20);
/// The longest: beyond it a slow backend's batch is cheaper to sleep through than to spin
/// through, and a writer preempted while it applies costs the waiter no more than this.
pub(crate) const MAX_SPIN: Duration = Duration::from_micros(50);

/// One reading of the writer's state word, and whether a wake-up was pending.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriterState {
    word: u64,
    waking: bool,
    /// Some thread held the writer role (a caller serving inline, or the background thread).
    serving: bool,
}

impl WriterState {
    /// [`APPLYING`], [`POLLING`] or [`PARKED`].
    pub(crate) fn state(self) -> u64 {
        self.word & STATE_MASK
    }

    /// Whether the background thread was parked ([`PARKED`] or [`DOZING`]).
    pub(crate) fn parked(self) -> bool {
        matches!(self.state(), PARKED | DOZING)
    }

    /// Whether the writer was awake, or parked with a wake-up on its way: a waiter may poll.
    pub(crate) fn awake(self) -> bool {
        !self.parked() || self.waking || self.serving
    }

    /// The writer's recent batches' average cost, in nanoseconds (0 before the first).
    #[cfg_attr(dma_loom, allow(dead_code))] // read by the spin budget, which loom has no time for
    pub(crate) fn batch_ns(self) -> u64 {
        (self.word >> STATE_BITS) & COST_MASK
    }

    /// How long the writer's recent wake-ups took, from the ring that unparked it to its running,
    /// on average in nanoseconds (0 before the first).
    #[cfg_attr(dma_loom, allow(dead_code))] // as batch_ns
    pub(crate) fn wake_ns(self) -> u64 {
        (self.word >> (STATE_BITS + COST_BITS)) & COST_MASK
    }

    /// How long a waiter polls for its answer while the writer is awake: two batches (the one in
    /// progress, then the one with its request), and the writer's wake-up if one is pending,
    /// within [`MIN_SPIN`] and [`MAX_SPIN`].
    #[cfg(not(dma_loom))]
    pub(crate) fn spin_budget(self) -> Duration {
        let wake = if self.parked() { self.wake_ns() } else { 0 };
        Duration::from_nanos(self.batch_ns() * 2 + wake).clamp(MIN_SPIN, MAX_SPIN)
    }
}

/// See the module docs.
pub(crate) struct Doorbell {
    /// Who may act as the writer now (see [`super::role`]): a waiter polls while it is held.
    pub(crate) role: Role,
    /// The writer's state and costs (see the module docs). Written by the writer only.
    word: AtomicU64,
    /// When a ringer last unparked the writer, in nanoseconds since `origin` (at least 1), or 0
    /// once the writer has run since: a wake-up is pending while it is not 0. Written by a ringer
    /// that unparks (rare: the writer was parked) and cleared by the writer.
    #[cfg(not(dma_loom))]
    rung_at: AtomicU64,
    #[cfg(not(dma_loom))]
    origin: std::time::Instant,
    #[cfg(not(dma_loom))]
    writer: OnceLock<std::thread::Thread>,
    /// A role holder (or the cache's drop) handed the background thread work it does not know
    /// of ([`wake_background`](Self::wake_background)): its next pass visits this cache whatever
    /// the cache's timer says. Cleared when the visit starts ([`woken`](Self::woken)).
    #[cfg(not(dma_loom))]
    handed: std::sync::atomic::AtomicBool,
}

impl Default for Doorbell {
    fn default() -> Self {
        Self {
            role: Role::new(),
            word: AtomicU64::new(POLLING),
            #[cfg(not(dma_loom))]
            rung_at: AtomicU64::new(0),
            #[cfg(not(dma_loom))]
            origin: std::time::Instant::now(),
            #[cfg(not(dma_loom))]
            writer: OnceLock::new(),
            #[cfg(not(dma_loom))]
            handed: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Doorbell {
    /// Wake the writer if it is parked ([`PARKED`] or [`DOZING`]): for a request that no caller
    /// serves. Call after making the work visible.
    #[inline]
    pub(crate) fn ring(&self) {
        #[cfg(not(dma_loom))]
        {
            fence(Ordering::SeqCst);
            if self.writer_state().parked() {
                self.unpark_writer();
            }
        }
    }

    /// Wake the background thread for a report (the epoch deferral's readers have gone) if it is
    /// parked without a timer ([`PARKED`]); while it dozes ([`DOZING`]), callers hold the role
    /// often enough that the next holder takes the report (`Writer::take_reports`), or the
    /// background thread does at its timer, at most `writer::rounds::DOZE_MAX` later. So a
    /// steady stream of updates does not unpark the background thread once per update. Call
    /// after making the report visible.
    #[inline]
    pub(crate) fn ring_report(&self) {
        #[cfg(not(dma_loom))]
        {
            fence(Ordering::SeqCst);
            if self.writer_state().state() == PARKED {
                self.unpark_writer();
            }
        }
    }

    /// Unpark the background thread, recording when (a wake-up is pending until it runs).
    #[cfg(not(dma_loom))]
    fn unpark_writer(&self) {
        if let Some(writer) = self.writer.get() {
            self.rung_at.store(self.now_ns().max(1), Ordering::Relaxed);
            writer.unpark();
        }
    }

    /// Nanoseconds since `origin`.
    #[cfg(not(dma_loom))]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// What the writer is doing, as it last published it, and whether a wake-up is pending.
    #[inline]
    pub(crate) fn writer_state(&self) -> WriterState {
        WriterState {
            word: self.word.load(Ordering::Relaxed),
            #[cfg(not(dma_loom))]
            waking: self.rung_at.load(Ordering::Relaxed) != 0,
            #[cfg(dma_loom)]
            waking: false,
            // Under loom the background thread holds the role for good (see `writer::cell`).
            #[cfg(not(dma_loom))]
            serving: self.role.held(),
            #[cfg(dma_loom)]
            serving: false,
        }
    }

    /// Wake the background thread whatever state it published: the role's holder hands it work
    /// (it asked for the role, or requests are left after the holder's rounds). A spurious
    /// unpark costs the background thread one look.
    pub(crate) fn wake_background(&self) {
        #[cfg(not(dma_loom))]
        {
            // Release: the visit that clears it (Acquire) sees the holder's work. The thread is
            // shared, so the flag says which cache the unpark is for.
            self.handed.store(true, Ordering::Release);
            if let Some(writer) = self.writer.get() {
                writer.unpark();
            }
        }
    }

    /// Whether a holder handed the background thread work since its last visit here.
    #[cfg(not(dma_loom))]
    pub(crate) fn handed(&self) -> bool {
        self.handed.load(Ordering::Acquire)
    }

    /// Publish the writer's `state` with its batch cost `batch_ns` and wake-up cost `wake_ns`.
    /// Writer only. Relaxed: the word orders nothing else (the park's fence is issued by
    /// [`park`](Self::park)).
    #[inline]
    pub(crate) fn publish(&self, state: u64, batch_ns: u64, wake_ns: u64) {
        let word = (wake_ns.min(COST_MASK) << (STATE_BITS + COST_BITS))
            | (batch_ns.min(COST_MASK) << STATE_BITS)
            | (state & STATE_MASK);
        self.word.store(word, Ordering::Relaxed);
    }

    /// Record `thread` as the background thread to unpark: the process's shared one
    /// (`writer::background`). Once, before the cache's first park.
    #[cfg(not(dma_loom))]
    pub(crate) fn answer_at(&self, thread: std::thread::Thread) {
        let _ = self.writer.set(thread);
    }

    /// Announce that the background thread stops looking at this cache: publish [`PARKED`]
    /// ([`DOZING`] if `dozing`) with the costs, then a `SeqCst` fence, after which the caller
    /// takes its last look for work (a ringer that made work visible before that look is seen
    /// by it; one after it reads the state and unparks the thread). Background thread only.
    #[cfg(not(dma_loom))]
    pub(crate) fn announce_park(&self, dozing: bool, (batch_ns, wake_ns): (u64, u64)) {
        let parked = if dozing { DOZING } else { PARKED };
        self.publish(parked, batch_ns, wake_ns);
        fence(Ordering::SeqCst);
    }

    /// The background thread looks at this cache again: publish [`POLLING`] with the costs
    /// `costs` returns once it is given how long the ring that woke it took to get it running,
    /// if a ring did. Background thread only.
    #[cfg(not(dma_loom))]
    pub(crate) fn woken(&self, costs: impl FnOnce(Option<Duration>) -> (u64, u64)) {
        self.handed.store(false, Ordering::Relaxed);
        // The holder's work is what the round reads under the role, whose take is Acquire.
        fence(Ordering::Acquire);
        let rung_at = self.rung_at.swap(0, Ordering::Relaxed);
        let woke =
            (rung_at != 0).then(|| Duration::from_nanos(self.now_ns().saturating_sub(rung_at)));
        let (batch_ns, wake_ns) = costs(woke);
        self.publish(POLLING, batch_ns, wake_ns);
    }

    /// Park the calling thread as the background thread of this cache alone until it is rung,
    /// `timeout` passes (`None`: no timeout), or a spurious wake-up, unless `ready` (its last
    /// look for work) finds something: [`announce_park`](Self::announce_park), the look, the
    /// park, then [`woken`](Self::woken).
    #[cfg(all(test, not(dma_loom)))]
    pub(crate) fn park(
        &self,
        ready: impl FnOnce() -> bool,
        timeout: Option<Duration>,
        costs: (u64, u64),
        woke_costs: impl FnOnce(Option<Duration>) -> (u64, u64),
    ) {
        self.announce_park(false, costs);
        if !ready() {
            match timeout {
                Some(timeout) => std::thread::park_timeout(timeout),
                None => std::thread::park(),
            }
        }
        self.woken(woke_costs);
    }
}

#[cfg(all(test, not(dma_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_ring_that_unparks_the_writer_shows_a_wake_up_pending_and_the_writer_measures_it() {
        let doorbell = std::sync::Arc::new(Doorbell::default());
        let writer = {
            let doorbell = std::sync::Arc::clone(&doorbell);
            std::thread::spawn(move || {
                doorbell.answer_at(std::thread::current());
                let mut woke = None;
                // Parks until rung (a spurious wake-up or the generous timeout ends it too, and
                // then the assertion on `woke` below fails rather than the test hanging).
                doorbell.park(
                    || false,
                    Some(Duration::from_secs(60)),
                    (1_000, 0),
                    |measured| {
                        woke = measured;
                        (1_000, 2_000)
                    },
                );
                woke
            })
        };
        // The writer publishes `PARKED` before it parks; wait for that.
        while doorbell.writer_state().state() != PARKED {
            std::thread::yield_now();
        }
        let parked = doorbell.writer_state();
        assert!(!parked.awake(), "parked, and nobody rang");
        assert_eq!(1_000, parked.batch_ns());
        doorbell.ring();
        assert!(
            doorbell.writer_state().awake(),
            "rung: a wake-up is pending, or the writer already runs"
        );
        let woke = writer.join().ok().flatten();
        assert!(woke.is_some(), "the writer saw the ring that woke it");
        let after = doorbell.writer_state();
        assert_eq!(
            (POLLING, 1_000, 2_000),
            (after.state(), after.batch_ns(), after.wake_ns())
        );
        assert!(after.awake());
    }
}
