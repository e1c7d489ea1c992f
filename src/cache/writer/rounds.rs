//! The rounds of whoever holds the writer role (see the `writer` module docs): a caller's, which
//! takes what readers and leases reported and one batch of queued requests, and the background
//! thread's, which adds the epoch ticks, the quiescers' rounds and how long to park.

use std::time::{Duration, Instant};

use super::run::STALLED_ROUNDS;
use super::{BATCH, BATCH_TIME, Writer};
use crate::av::AvBackend;
use crate::cache::doorbell::{APPLYING, PARKED, POLLING};
use crate::cache::role::Role;

/// The longest the background thread dozes while callers hold the role (see
/// [`Pacing::park_for`](super::pacing::Pacing::park_for)): the most a report waits for it when
/// the callers stop coming.
pub(crate) const DOZE_MAX: Duration = Duration::from_millis(2);

/// What a round of the background thread leaves it to do.
pub(crate) enum Next {
    /// Park until rung, or for `timeout` at most (`None`: until rung), publishing `costs` (the
    /// batch and wake-up averages) on the doorbell meanwhile.
    Wait {
        timeout: Option<Duration>,
        /// It parks while callers do its work ([`crate::cache::doorbell::DOZING`]).
        dozing: bool,
        costs: (u64, u64),
    },
    /// The cache asked the writer to stop, and everything has been removed.
    Stopped,
}

impl<B: AvBackend> Writer<B> {
    /// Take up to one batch of queued requests, for at most about [`BATCH_TIME`] once `started`;
    /// how many were taken, and whether one asked the writer to stop.
    fn take_batch(&mut self, started: Instant) -> (usize, bool) {
        let mut tick = self.pacing.tick;
        let mut taken = 0;
        let mut stop = false;
        while !stop && taken < BATCH {
            if taken != 0 && started.elapsed() >= BATCH_TIME {
                break;
            }
            match self.inbox.try_recv() {
                Ok(request) => {
                    self.shared.doorbell.role.unqueue();
                    stop = self.accept(request, &mut tick);
                    taken += 1;
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => stop = true,
            }
        }
        self.pacing.tick = tick;
        (taken, stop)
    }

    /// Stop: remove everything (the cache is being dropped).
    fn stop(&mut self) {
        self.finish_batch();
        self.shutdown();
        // Gone for good: a waiter still polling stops at once (its answer is sent, or `Closed`).
        self.announced.set(&self.shared.doorbell, PARKED);
    }

    /// One round of a caller that won the role: what the readers and leases reported, then one
    /// batch of queued requests (its own among them), published and answered, then an epoch
    /// advance if one is due. Whether the writer stopped. If the round left work only the
    /// background thread does (retries, quiescers, a waiter's deadline, or ticks while callers
    /// stop coming) that the background thread does not know of, it is woken.
    pub(crate) fn serve_round(&mut self) -> bool {
        let started = Instant::now();
        self.take_reports();
        let (taken, stop) = self.take_batch(started);
        self.finish_batch();
        if stop {
            self.stop();
            return true;
        }
        if taken != 0 {
            self.announced.measured_batch(started.elapsed());
        }
        self.tick_if_due();
        self.answer_quiescers();
        self.hand_over();
        false
    }

    /// The background thread's epoch tick, done by a caller that holds the role: while a
    /// deferral is out, move the epoch on at most once a
    /// [`FIRST_TICK`](super::run::FIRST_TICK), and take what that brought. So while callers
    /// come, the deferral returns without the background thread.
    fn tick_if_due(&mut self) {
        if self.reclaim.in_flight.is_none() || !self.pacing.advance_due() {
            return;
        }
        self.reclaim.advance();
        self.pacing.advanced();
        if self.collect() || !self.outbox.replies.is_empty() {
            self.finish_batch();
        }
    }

    /// Wake the background thread if this round left it work it does not know of (see
    /// [`Pacing::hand_over`](super::pacing::Pacing::hand_over)).
    fn hand_over(&mut self) {
        let ticking = self.needs_ticks();
        let deadline = self
            .parking
            .deadlines
            .first()
            .map(|&(deadline, ..)| deadline);
        if self.pacing.hand_over(ticking, deadline) {
            self.shared.doorbell.wake_background();
        }
    }

    /// Whether the background thread must move the epoch on, or retry, by itself.
    fn needs_ticks(&self) -> bool {
        self.reclaim.in_flight.is_some()
            || !self.reclaim.retries.is_empty()
            || !self.outbox.quiescing.is_empty()
            || !self.outbox.deferred_evictions.is_empty()
            || !self.parking.unpublished.is_empty()
    }

    /// One round of the background thread, which holds the role: what the readers and leases
    /// reported, what is queued (up to [`Role::ROUNDS`] batches), an epoch advance when one is
    /// due, the quiescers; then how long to park. `woke`: how long the ring that woke it took.
    pub(crate) fn background_round(&mut self, woke: Option<Duration>) -> Next {
        // The doorbell's park published `POLLING` when the thread woke.
        self.announced.woke(woke);
        let removed = self.take_reports();
        let mut idle = true;
        for _ in 0..Role::ROUNDS {
            let started = Instant::now();
            self.announced.set(&self.shared.doorbell, APPLYING);
            let (taken, stop) = self.take_batch(started);
            if stop {
                self.stop();
                return Next::Stopped;
            }
            if taken == 0 {
                break;
            }
            idle = false;
            self.finish_batch();
            self.announced.measured_batch(started.elapsed());
        }
        self.announced.set(&self.shared.doorbell, POLLING);
        // Move the epoch on so the outstanding deferral runs without reader traffic: when idle
        // (rung by a report, or the tick came), and, while one is out, between requests too, at
        // most once a tick.
        let due = self.reclaim.in_flight.is_some() && self.pacing.advance_due();
        if idle || due {
            // Back off only while readers hold the outstanding deferral up: a new deferral since
            // the last round is progress.
            self.pacing.back_off(self.reclaim.undeferred, idle);
            self.reclaim.advance();
            self.pacing.advanced();
            self.collect();
            self.round();
            self.finish_batch();
        }
        self.answer_quiescers();
        // Quiescing, the first rounds run back to back; once they suspect a pinned reader or a
        // lease, the thread sleeps between rounds so that reader gets the core to finish on.
        let hurry = !self.parking.unpublished.is_empty()
            || self
                .outbox
                .quiescing
                .iter()
                .any(|quiescer| quiescer.stalled < STALLED_ROUNDS);
        let ticking = self.needs_ticks();
        let deadline = self
            .parking
            .deadlines
            .first()
            .map(|&(deadline, ..)| deadline);
        let (timeout, dozing) = self.pacing.park_for(hurry, removed, ticking, deadline);
        Next::Wait {
            timeout,
            dozing,
            costs: self.announced.costs(),
        }
    }
}
