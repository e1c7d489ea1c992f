//! The rounds of whoever holds the writer role (see the `writer` module docs): a caller's, which
//! takes what readers and leases reported and one batch of queued requests, and the background
//! thread's, which adds the epoch ticks, the quiescers' rounds and how long to park.

use std::time::{Duration, Instant};

use super::run::{FIRST_TICK, LAST_TICK, STALLED_ROUNDS};
use super::{BATCH, Writer, averaged};
use crate::av::AvBackend;
use crate::cache::doorbell::{APPLYING, PARKED, POLLING};
use crate::cache::role::Role;

/// The longest the background thread dozes while callers hold the role (see
/// [`Writer::park_for`]): the most a report waits for it when the callers stop coming.
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
    /// Take up to one batch of queued requests; how many were taken, and whether one asked the
    /// writer to stop.
    fn take_batch(&mut self) -> (usize, bool) {
        let mut tick = self.tick;
        let mut taken = 0;
        let mut stop = false;
        while !stop && taken < BATCH {
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
        self.tick = tick;
        (taken, stop)
    }

    /// Stop: remove everything (the cache is being dropped).
    fn stop(&mut self) {
        self.finish_batch();
        self.shutdown();
        // Gone for good: a waiter still polling stops at once (its answer is sent, or `Closed`).
        self.set_state(PARKED);
    }

    /// One round of a caller that won the role: what the readers and leases reported, then one
    /// batch of queued requests (its own among them), published and answered, then an epoch
    /// advance if one is due. Whether the writer stopped. If the round left work only the
    /// background thread does (retries, quiescers, a waiter's deadline, or ticks while callers
    /// stop coming) that the background thread does not know of, it is woken.
    pub(crate) fn serve_round(&mut self) -> bool {
        let started = Instant::now();
        self.take_reports();
        let (taken, stop) = self.take_batch();
        self.finish_batch();
        if stop {
            self.stop();
            return true;
        }
        if taken != 0 {
            self.measured_batch(started.elapsed());
        }
        self.tick_if_due();
        self.answer_quiescers();
        self.hand_over();
        false
    }

    /// The background thread's epoch tick, done by a caller that holds the role: while a
    /// deferral is out, move the epoch on at most once a [`FIRST_TICK`], and take what that
    /// brought. So while callers come, the deferral returns without the background thread.
    fn tick_if_due(&mut self) {
        if self.in_flight.is_none() || self.last_advance.elapsed() < FIRST_TICK {
            return;
        }
        self.advance();
        self.last_advance = Instant::now();
        if self.collect() || !self.replies.is_empty() {
            self.finish_batch();
        }
    }

    /// Wake the background thread if this round left it work it does not know of: work that
    /// needs ticks while it parks with no timer (or one longer than [`LAST_TICK`]), or a waiter's
    /// deadline before it wakes. While it dozes (callers come), it wakes by itself: no wake-up
    /// per update.
    fn hand_over(&mut self) {
        let ticking = self.needs_ticks();
        let deadline = self.deadlines.first().map(|&(deadline, ..)| deadline);
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
            self.shared.doorbell.wake_background();
        }
    }

    /// Whether the background thread must move the epoch on, or retry, by itself.
    fn needs_ticks(&self) -> bool {
        self.in_flight.is_some()
            || !self.retries.is_empty()
            || !self.quiescing.is_empty()
            || !self.deferred_evictions.is_empty()
            || !self.unpublished.is_empty()
    }

    /// One round of the background thread, which holds the role: what the readers and leases
    /// reported, what is queued (up to [`Role::ROUNDS`] batches), an epoch advance when one is
    /// due, the quiescers; then how long to park. `woke`: how long the ring that woke it took.
    pub(crate) fn background_round(&mut self, woke: Option<Duration>) -> Next {
        // The doorbell's park published `POLLING` when the thread woke.
        self.state = POLLING;
        if let Some(woke) = woke {
            self.wake_ns = averaged(self.wake_ns, woke);
        }
        let removed = self.take_reports();
        let mut idle = true;
        for _ in 0..Role::ROUNDS {
            let started = Instant::now();
            self.set_state(APPLYING);
            let (taken, stop) = self.take_batch();
            if stop {
                self.stop();
                return Next::Stopped;
            }
            if taken == 0 {
                break;
            }
            idle = false;
            self.finish_batch();
            self.measured_batch(started.elapsed());
        }
        self.set_state(POLLING);
        // Move the epoch on so the outstanding deferral runs without reader traffic: when idle
        // (rung by a report, or the tick came), and, while one is out, between requests too, at
        // most once a tick.
        let due = self.in_flight.is_some() && self.last_advance.elapsed() >= FIRST_TICK;
        if idle || due {
            // Back off only while readers hold the outstanding deferral up: a new deferral since
            // the last round is progress.
            let deferred = self.undeferred;
            if deferred != self.deferred_at_last_tick {
                self.tick = FIRST_TICK;
            } else if idle {
                self.tick = (self.tick * 2).min(LAST_TICK);
            }
            self.deferred_at_last_tick = deferred;
            self.advance();
            self.last_advance = Instant::now();
            self.collect();
            self.round();
            self.finish_batch();
        }
        self.answer_quiescers();
        // Quiescing, the first rounds run back to back; once they suspect a pinned reader or a
        // lease, the thread sleeps between rounds so that reader gets the core to finish on.
        let hurry = !self.unpublished.is_empty()
            || self
                .quiescing
                .iter()
                .any(|quiescer| quiescer.stalled < STALLED_ROUNDS);
        let (timeout, dozing) = self.park_for(hurry, removed);
        Next::Wait {
            timeout,
            dozing,
            costs: (self.batch_ns, self.wake_ns),
        }
    }

    /// How long the background thread parks after a round (`None`: until rung), and whether it
    /// dozes. Removals awaiting only their leases need no ticks: the last lease rings. A waiter's
    /// deadline wakes the thread once, when it comes.
    ///
    /// If callers held the role since its last round and left work that needs ticks (each a
    /// wake-up this thread's timer saved), they take the reports and tick the epoch themselves
    /// (`serve_round`), so the thread dozes: it parks for [`Writer::doze`], doubled
    /// after every round in which the callers left it nothing to remove, halved when they did,
    /// between [`FIRST_TICK`] and [`DOZE_MAX`], whether work is pending or not. A dozing
    /// thread's holders do not wake it and a report does not ring it (see
    /// `Doorbell::ring_report`), so a steady stream of updates costs it about one wake-up a
    /// [`DOZE_MAX`], not one an update. Once a round finds no caller since the one before, it
    /// ticks (or parks until rung) as it did before the callers came.
    fn park_for(&mut self, hurry: bool, removed: bool) -> (Option<Duration>, bool) {
        let callers = self.saved_seen != self.wakes_saved;
        self.saved_seen = self.wakes_saved;
        let ticking = self.needs_ticks();
        let deadline = self.deadlines.first().map(|&(deadline, ..)| deadline);
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
