//! How the writer paces the work no caller brings, and what it tells waiters about itself.
//!
//! [`Pacing`] guarantees that while a deferral is out the epoch is moved on at most once a
//! [`FIRST_TICK`] by callers, and by the background thread at a tick that doubles up to
//! [`LAST_TICK`] only while readers hold the deferral up; that the background thread dozes at
//! most [`DOZE_MAX`] while callers do its work; and that a holder wakes it only for work it does
//! not know of. [`Announced`] guarantees that the doorbell's word is written only when the state
//! changes, with cost averages that a single preempted sample cannot push past
//! [`MAX_SPIN`].

use std::time::Duration;
#[cfg(not(dma_loom))]
use std::time::Instant;

#[cfg(not(dma_loom))]
use super::rounds::DOZE_MAX;
#[cfg(not(dma_loom))]
use super::run::{FIRST_TICK, LAST_TICK};
use crate::cache::doorbell::{Doorbell, MAX_SPIN, POLLING};

/// The background thread's timers: one job, to say when it must move the epoch on or look
/// again by itself. Invariant: `tick` stays within [`FIRST_TICK`]..=[`LAST_TICK`] and `doze`
/// within [`FIRST_TICK`]..=[`DOZE_MAX`]; `background_ticking` and `background_until` say how
/// the thread's last round parked, or, once a holder has woken it since, that it ticks and the
/// deadline it was woken for.
#[cfg(not(dma_loom))]
pub(super) struct Pacing {
    /// The background thread's epoch tick: the wait between advances while removals are
    /// pending, from [`FIRST_TICK`] doubling up to [`LAST_TICK`].
    pub(super) tick: Duration,
    /// `undeferred` at the last tick: a new deferral since is progress, and resets the tick.
    deferred_at_last_tick: u64,
    /// When the epoch was last moved on.
    last_advance: Instant,
    /// Whether the background thread, at its last round, waits with a tick (it moves the epoch
    /// on by itself), and the latest it wakes (`None`: only when rung). A holder that leaves it
    /// work it does not know of wakes it.
    background_ticking: bool,
    background_until: Option<Instant>,
    /// Rounds of callers that left work needing ticks while the background thread had a timer
    /// (a wake-up saved), and the count at the background thread's last round: if they differ,
    /// callers came meanwhile, and the background thread dozes on.
    wakes_saved: u64,
    saved_seen: u64,
    /// How long the background thread dozes while callers come, from [`FIRST_TICK`] up to
    /// [`DOZE_MAX`] (see [`Pacing::park_for`]).
    doze: Duration,
}

#[cfg(not(dma_loom))]
impl Pacing {
    pub(super) fn new() -> Self {
        Self {
            tick: FIRST_TICK,
            deferred_at_last_tick: u64::MAX,
            last_advance: Instant::now(),
            background_ticking: false,
            background_until: None,
            wakes_saved: 0,
            saved_seen: 0,
            doze: FIRST_TICK,
        }
    }

    /// Whether a [`FIRST_TICK`] has passed since the epoch was last moved on.
    pub(super) fn advance_due(&self) -> bool {
        self.last_advance.elapsed() >= FIRST_TICK
    }

    /// The epoch was moved on just now.
    pub(super) fn advanced(&mut self) {
        self.last_advance = Instant::now();
    }

    /// The background thread is about to move the epoch on, `undeferred` being the next ticket
    /// to defer and `idle` whether its round took no request. Back off only while readers hold
    /// the outstanding deferral up: a new deferral since the last round is progress.
    pub(super) fn back_off(&mut self, undeferred: u64, idle: bool) {
        let deferred = undeferred;
        if deferred != self.deferred_at_last_tick {
            self.tick = FIRST_TICK;
        } else if idle {
            self.tick = (self.tick * 2).min(LAST_TICK);
        }
        self.deferred_at_last_tick = deferred;
    }

    /// A caller's round left work that needs ticks (`ticking`) and the first waiter's deadline
    /// (`deadline`): whether to wake the background thread, because it parks with no timer (or
    /// one longer than [`LAST_TICK`]) or wakes after that deadline. While it dozes (callers
    /// come), it wakes by itself: no wake-up per update.
    pub(super) fn hand_over(&mut self, ticking: bool, deadline: Option<Instant>) -> bool {
        let late = match (deadline, self.background_until) {
            (Some(deadline), Some(until)) => deadline < until,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if ticking && self.background_ticking {
            // A wake-up the background thread's timer saved: it dozes on while callers save it
            // these (see `park_for`).
            self.wakes_saved = self.wakes_saved.wrapping_add(1);
        }
        if ticking && !self.background_ticking || late {
            // Until its next round says otherwise, it is ticking: no second wake per miss.
            self.background_ticking = true;
            self.background_until = deadline;
            return true;
        }
        false
    }

    /// How long the background thread parks after a round (`None`: until rung), and whether it
    /// dozes, given whether it must hurry, whether the round `removed` anything, whether work
    /// left needs ticks (`ticking`) and the first waiter's `deadline`. Removals awaiting only
    /// their leases need no ticks: the last lease rings. A waiter's deadline wakes the thread
    /// once, when it comes.
    ///
    /// If callers held the role since its last round and left work that needs ticks (each a
    /// wake-up this thread's timer saved), they take the reports and tick the epoch themselves
    /// (`serve_round`), so the thread dozes: it parks for `doze`, doubled after every round in
    /// which the callers left it nothing to remove, halved when they did, between
    /// [`FIRST_TICK`] and [`DOZE_MAX`], whether work is pending or not. A dozing thread's
    /// holders do not wake it and a report does not ring it (see `Doorbell::ring_report`), so a
    /// steady stream of updates costs it about one wake-up a [`DOZE_MAX`], not one an update.
    /// Once a round finds no caller since the one before, it ticks (or parks until rung) as it
    /// did before the callers came.
    pub(super) fn park_for(
        &mut self,
        hurry: bool,
        removed: bool,
        ticking: bool,
        deadline: Option<Instant>,
    ) -> (Option<Duration>, bool) {
        let callers = self.saved_seen != self.wakes_saved;
        self.saved_seen = self.wakes_saved;
        let until_deadline =
            deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        let dozing = callers && !hurry;
        let timeout = if hurry {
            Some(Duration::ZERO)
        } else if dozing {
            self.doze = if removed {
                (self.doze / 2).max(FIRST_TICK)
            } else {
                (self.doze * 2).min(DOZE_MAX)
            };
            Some(until_deadline.map_or(self.doze, |until| until.min(self.doze)))
        } else {
            match until_deadline {
                Some(until) if ticking => Some(self.tick.min(until)),
                Some(until) => Some(until),
                None if ticking => Some(self.tick),
                None => None,
            }
        };
        self.background_ticking = timeout.is_some_and(|timeout| timeout <= LAST_TICK);
        self.background_until = timeout.and_then(|timeout| Instant::now().checked_add(timeout));
        (timeout, dozing)
    }
}

/// What the writer last published on its doorbell: one job, to let a waiter size its spin.
/// Invariant: `state` is what the doorbell's word holds ([`APPLYING`], [`POLLING`] or
/// [`PARKED`]), and each average is at most [`MAX_SPIN`] in nanoseconds.
///
/// [`APPLYING`]: crate::cache::doorbell::APPLYING
/// [`PARKED`]: crate::cache::doorbell::PARKED
pub(super) struct Announced {
    /// The state last published on the doorbell ([`APPLYING`], [`POLLING`] or [`PARKED`]).
    ///
    /// [`APPLYING`]: crate::cache::doorbell::APPLYING
    /// [`PARKED`]: crate::cache::doorbell::PARKED
    state: u64,
    /// The average wall time of a batch, from taking its first request to sending its answers,
    /// in nanoseconds: an exponential average over the last few batches, published with the state
    /// so that a waiter spins about as long as its answer takes (see [`crate::cache::doorbell`]).
    batch_ns: u64,
    /// The average time from a ring that unparked the writer to its running again, in
    /// nanoseconds, published likewise: how long a waiter polls through a pending wake-up.
    wake_ns: u64,
}

impl Announced {
    pub(super) fn new() -> Self {
        Self {
            state: POLLING,
            batch_ns: 0,
            wake_ns: 0,
        }
    }

    /// Publish `state` on `doorbell`, with the costs, if it is not what is published.
    pub(super) fn set(&mut self, doorbell: &Doorbell, state: u64) {
        if state != self.state {
            self.state = state;
            doorbell.publish(state, self.batch_ns, self.wake_ns);
        }
    }

    /// Fold one batch's wall time into its average.
    pub(super) fn measured_batch(&mut self, took: Duration) {
        self.batch_ns = averaged(self.batch_ns, took);
    }

    /// The background thread woke (the doorbell's park published `POLLING` then), the ring that
    /// woke it having taken `woke`, if measured.
    #[cfg(not(dma_loom))]
    pub(super) fn woke(&mut self, woke: Option<Duration>) {
        self.state = POLLING;
        if let Some(woke) = woke {
            self.wake_ns = averaged(self.wake_ns, woke);
        }
    }

    /// The batch and wake-up averages, as the doorbell publishes them.
    #[cfg(not(dma_loom))]
    pub(super) fn costs(&self) -> (u64, u64) {
        (self.batch_ns, self.wake_ns)
    }
}

/// `average` with `sample` folded in at a weight of 1/8 (a few samples move it), the sample
/// capped at [`MAX_SPIN`] (a longer one is a preemption, not the cost of the work, and no spin
/// lasts longer anyway); the sample alone if there is no average yet.
fn averaged(average: u64, sample: Duration) -> u64 {
    let sample = u64::try_from(sample.min(MAX_SPIN).as_nanos()).unwrap_or(u64::MAX);
    if average == 0 {
        sample
    } else {
        average - average / 8 + sample / 8
    }
}
