//! The writer's loop: waiting for requests (and publishing its state while it does), batches,
//! epoch advances, reclamation rounds, quiescers, the counters, and shutdown.

use std::time::{Duration, Instant};

#[cfg(not(dma_loom))]
use super::take_own_releases;
#[cfg(dma_loom)]
use super::{BATCH, Stopped};
use super::{Request, Writer};
use crate::av::AvBackend;
#[cfg(dma_loom)]
use crate::cache::doorbell::{APPLYING, PARKED, POLLING};
use crate::cache::index::RegistrationIndex;
use crate::error::DmaError;
use crate::sync::mpsc;
#[cfg(dma_loom)]
use crate::sync::{recv_polling, recv_spinning};
use dma_libfabric_sys::fi_addr_t;

/// How long the writer polls for the next request before it parks: long enough to stay awake
/// through a burst of misses, short enough not to hold a core when idle.
#[cfg_attr(not(dma_loom), allow(dead_code))] // the background thread parks at once
pub(super) const IDLE_SPIN: Duration = Duration::from_micros(30);

/// The shortest wait between epoch advances while removals are pending.
pub(super) const FIRST_TICK: Duration = Duration::from_micros(50);
/// The longest, reached by doubling while readers or leases hold everything up.
pub(super) const LAST_TICK: Duration = Duration::from_millis(10);
/// The first wait before a failed `fi_av_remove` is tried again; it doubles up to
/// [`LAST_RETRY`].
pub(super) const FIRST_RETRY: Duration = Duration::from_millis(1);
/// The longest wait between tries of a failing `fi_av_remove`.
pub(super) const LAST_RETRY: Duration = Duration::from_secs(1);
/// Epoch advances in a row that free nothing of a quiescer's removals before it starts to suspect
/// that the rest are held back by pinned readers or leases. With no reader pinned, two advances
/// expire every bag crossbeam holds, so four without progress cannot be a slow collector; they
/// are taken back to back, so a `quiesce` with nothing held back answers within microseconds.
///
/// Rounds alone are not enough: a thread that is briefly pinned (one finalizing its epoch handle
/// as it exits, or one running a deferred closure) and then preempted stops the epoch for a whole
/// time slice, which four back-to-back rounds do not outlast on a loaded machine. So after these
/// rounds the writer keeps advancing, sleeping between rounds, until the caller's patience
/// ([`crate::cache::AddressCache::quiesce_with_patience`]) has passed without progress.
pub(super) const STALLED_ROUNDS: u32 = 4;

/// How many times a holder looks for releases queued beside the full inbox by code it ran
/// before it gives the role back; past that (a hook that releases on every release's event),
/// what is left waits for this thread's next time in the role.
#[cfg(not(dma_loom))]
const OWN_RELEASE_PASSES: usize = 4;

/// A caller blocked in `quiesce`.
pub(super) struct Quiescer {
    reply: mpsc::Sender<()>,
    patience: Duration,
    /// The first ticket retired after the request: older ones are what it waits for.
    watermark: u64,
    /// How many of those were pending at the last round.
    waiting_on: usize,
    /// How many deferrals had returned at the last round: one returning is progress too, since a
    /// ticket retired while another deferral was out waits for that one first.
    deferrals_seen: u64,
    /// Rounds in a row in which none of them was removed.
    pub(super) stalled: u32,
    /// When one of them was last removed, or the request arrived.
    progress_at: Instant,
}

#[cfg(dma_loom)]
impl<B: AvBackend> Writer<B> {
    /// Serve requests until shutdown, then remove everything: under loom, the background thread
    /// holds the role for its whole life and waits on its inbox, as the writer thread always did
    /// (loom has no timed park); callers never serve inline there.
    pub(crate) fn run(mut self) {
        let mut tick = FIRST_TICK;
        let mut deferred_at_last_tick = u64::MAX;
        let mut last_advance = Instant::now();
        let mut last_request = Instant::now();
        loop {
            // Removals may have let parked incarnations in: publish them and answer their waiters
            // before waiting for the next request; then answer the waiters whose patience is out.
            self.take_reports();
            let Ok(request) = self.wait_for_request(tick, last_request) else {
                break;
            };
            let idle = request.is_none();
            if !idle {
                last_request = Instant::now();
            }
            if let Some(request) = request {
                if self.apply_loom_batch(request, &mut tick) {
                    break;
                }
            }
            // Move the epoch on so the outstanding deferral runs without reader traffic: when
            // idle, and, while one is out, between requests too, at most once a tick (loom has no
            // time, so there it advances only when idle).
            let due = self.reclaim.in_flight.is_some()
                && cfg!(not(dma_loom))
                && last_advance.elapsed() >= FIRST_TICK;
            if idle || due {
                // Back off only while readers hold the outstanding deferral up: a new deferral
                // since the last round is progress.
                let deferred = self.reclaim.undeferred;
                if deferred != deferred_at_last_tick {
                    tick = FIRST_TICK;
                } else if idle {
                    tick = (tick * 2).min(LAST_TICK);
                }
                deferred_at_last_tick = deferred;
                self.reclaim.advance();
                last_advance = Instant::now();
                self.collect();
                self.round();
                self.finish_batch();
            }
        }
        self.finish_batch();
        self.shutdown();
        // Gone for good: a waiter still polling stops at once (its answer is sent, or `Closed`).
        self.announced.set(&self.shared.doorbell, PARKED);
    }

    /// The loom loop's wait for its next request: none if it must hurry (quiescing, or a
    /// waiter's deadline has come) or the tick came first; `Stopped` once the inbox closed.
    fn wait_for_request(
        &mut self,
        tick: Duration,
        last_request: Instant,
    ) -> Result<Option<Request>, Stopped> {
        // Quiescing, the first rounds run back to back; once they suspect a pinned reader or a
        // lease, the writer sleeps between rounds so that reader gets the core to finish on.
        let hurry = !self.parking.unpublished.is_empty()
            || self
                .outbox
                .quiescing
                .iter()
                .any(|quiescer| quiescer.stalled < STALLED_ROUNDS)
            || cfg!(dma_loom) && !self.outbox.quiescing.is_empty()
            // Under loom the writer blocks on its inbox, which has no timeout: a waiter whose
            // deadline has come is answered by the next round instead.
            || cfg!(dma_loom)
                && self
                    .parking
                    .deadlines
                    .first()
                    .is_some_and(|&(deadline, ..)| deadline <= Instant::now());
        if hurry {
            return match self.inbox.try_recv() {
                Ok(request) => Ok(Some(request)),
                Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(Stopped),
            };
        }
        // Removals awaiting only their leases need no ticks: the last lease rings. A waiter's
        // deadline wakes the writer once, when it comes.
        let ticking = self.reclaim.in_flight.is_some()
            || !self.reclaim.retries.is_empty()
            || !self.outbox.quiescing.is_empty()
            || !self.outbox.deferred_evictions.is_empty();
        if !ticking && self.parking.deadlines.is_empty() {
            return self.next_request(IDLE_SPIN, None);
        }
        let until_deadline = self
            .parking
            .deadlines
            .first()
            .map(|&(deadline, ..)| deadline.saturating_duration_since(Instant::now()));
        let tick_or_deadline = match until_deadline {
            Some(until) if ticking => tick.min(until),
            Some(until) => until,
            None => tick,
        };
        // Poll first, as when idle, for what is left of `IDLE_SPIN` since the last request: a
        // miss that finds the writer parked pays a wake-up, and while removals are pending (most
        // of the time under churn) that would be every miss. Polling longer than that, with no
        // traffic, only took the core from the readers whose pins move the epoch on (the
        // reclamation bench's delay went from 0.15 to 4 ms).
        let spin = IDLE_SPIN
            .saturating_sub(last_request.elapsed())
            .min(tick_or_deadline);
        self.next_request(spin, Some(tick_or_deadline))
    }

    /// Apply `request` and the rest of what is queued, as one batch; whether one asked the
    /// writer to stop.
    fn apply_loom_batch(&mut self, request: Request, tick: &mut Duration) -> bool {
        // Awake and applying: a waiter that reads this spins for its answer.
        let started = Instant::now();
        self.announced.set(&self.shared.doorbell, APPLYING);
        let mut stop = self.accept(request, tick);
        let mut taken = 1;
        while !stop && taken < BATCH {
            match self.inbox.try_recv() {
                Ok(request) => stop = self.accept(request, tick),
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => stop = true,
            }
            taken += 1;
        }
        self.finish_batch();
        self.announced.measured_batch(started.elapsed());
        self.announced.set(&self.shared.doorbell, POLLING);
        stop
    }

    /// The next request: under loom, waited for on the inbox alone (the models drive the writer
    /// with requests; loom has no timed park).
    #[cfg(dma_loom)]
    pub(super) fn next_request(
        &mut self,
        spin: Duration,
        timeout: Option<Duration>,
    ) -> Result<Option<Request>, Stopped> {
        // Blocking on the inbox is this writer's park: a waiter that reads `PARKED` stops
        // spinning, whichever way the race with this wait goes.
        self.announced.set(&self.shared.doorbell, PARKED);
        let received = match timeout {
            Some(timeout) => match recv_polling(&self.inbox, spin, timeout) {
                Ok(request) => Ok(Some(request)),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Stopped),
            },
            None => recv_spinning(&self.inbox, spin)
                .map(Some)
                .map_err(|_| Stopped),
        };
        self.announced.set(&self.shared.doorbell, POLLING);
        received
    }
}

impl<B: AvBackend> Writer<B> {
    /// Take one request of a batch; whether it asks the writer to stop.
    pub(super) fn accept(&mut self, request: Request, tick: &mut Duration) -> bool {
        match request {
            Request::Shutdown => return true,
            Request::Quiesce { reply, patience } => {
                self.outbox.quiescing.push(Quiescer {
                    reply,
                    patience,
                    watermark: self.reclaim.next_ticket,
                    waiting_on: usize::MAX,
                    deferrals_seen: self.reclaim.deferrals_returned,
                    stalled: 0,
                    progress_at: Instant::now(),
                });
                *tick = FIRST_TICK;
            }
            request => {
                let retired = self.reclaim.next_ticket;
                self.apply(request);
                // A new removal waits for epoch advances: start them at the shortest tick again,
                // whatever the backoff had grown to while older removals were held.
                if retired != self.reclaim.next_ticket {
                    *tick = FIRST_TICK;
                }
            }
        }
        false
    }

    /// End a batch: hand its retirements to the collector, publish the counters, then answer.
    pub(super) fn finish_batch(&mut self) {
        self.own_releases();
        if std::mem::take(&mut self.reclaim.retired_in_batch) && self.reclaim.in_flight.is_some() {
            // The new tickets wait for the deferral that is out: move the epoch on for it, as a
            // deferral of their own would have (one pin and flush a batch, no bag).
            self.reclaim.advance();
        }
        self.reclaim.defer_retired(&self.shared, self.cache);
        // Counters first, so a caller reading them after its reply sees its request.
        self.publish_stats();
        self.outbox.send();
    }

    /// Answer every waiter whose deadline has passed and whose incarnation is not in the AV:
    /// [`DmaError::OutOfPatience`], naming the old incarnation's leases and how long it has been
    /// waiting for removal. Each waiter is answered once, here or by its admission, never both:
    /// both run on this thread and take the waiter out of its parked incarnation.
    ///
    /// Before it gives up on a waiter, the writer tries the old incarnation's removal once more:
    /// a last lease dropped whose report has not been read yet ends the wait with the entry, so
    /// the error is never given for a wait that could end now.
    pub(super) fn expire_waiters(&mut self) {
        // No waiter: no clock read (this runs in every round, a caller's miss included).
        if self.parking.deadlines.is_empty() {
            return;
        }
        let now = Instant::now();
        while let Some(&key) = self.parking.deadlines.first() {
            let (deadline, client, at) = key;
            if now < deadline {
                break;
            }
            let removal = self
                .table
                .entry(at)
                .filter(|entry| !entry.is_live())
                .map(|entry| entry.removal);
            // The count the decision rests on, and the one the error reports: read once, so a
            // drop after it neither hides a wait that could end nor makes the error name none.
            let leases = self.shared.leases.count(at);
            if let Some(ticket) = removal.filter(|_| leases == 0) {
                // No lease left: admits the parked incarnation if its readers are gone too,
                // answering its waiters.
                self.try_remove(ticket, now);
            }
            if self.parking.deadlines.first() != Some(&key) {
                continue;
            }
            self.parking.deadlines.pop_first();
            let Some(waiter) = self
                .parking
                .parked
                .get_mut(&at)
                .and_then(|parked| parked.waiters.remove(&client))
            else {
                continue;
            };
            let held_for = removal
                .and_then(|ticket| self.reclaim.pending.get(&ticket))
                .map_or(Duration::ZERO, |pending| {
                    now.saturating_duration_since(pending.since)
                });
            tracing::warn!(
                op = "out_of_patience",
                client,
                leases,
                ?held_for,
                "a blocking lease waited out the cache's patience for an old incarnation's removal"
            );
            self.outbox.replies.push((
                waiter.answer,
                Err(DmaError::OutOfPatience {
                    client,
                    leases,
                    held_for,
                }),
            ));
        }
    }

    /// What the reports of readers and leases brought: removals, waiters out of patience, the
    /// eviction hook's leftovers; and the next slice of an admission's registrations. Whether
    /// anything was removed.
    pub(super) fn take_reports(&mut self) -> bool {
        let removed = self.collect();
        self.expire_waiters();
        self.outbox.retry_evictions(&self.shared);
        // An admission's registrations not yet published, a slice a round (see `apply`).
        self.parking
            .publish_admitted(&self.table, &self.shared.index);
        if removed || !self.outbox.replies.is_empty() {
            self.finish_batch();
        }
        self.answer_quiescers();
        removed
    }

    /// One round for the quiescers: count what each still waits for, note progress or a stall.
    pub(super) fn round(&mut self) {
        for quiescer in &mut self.outbox.quiescing {
            let waiting_on = self.reclaim.pending.range(..quiescer.watermark).count();
            // Publishing an admission's slices is progress too.
            if waiting_on < quiescer.waiting_on
                || self.reclaim.deferrals_returned != quiescer.deferrals_seen
                || !self.parking.unpublished.is_empty()
            {
                quiescer.deferrals_seen = self.reclaim.deferrals_returned;
                quiescer.stalled = 0;
                quiescer.progress_at = Instant::now();
            } else {
                quiescer.stalled = quiescer.stalled.saturating_add(1);
            }
            quiescer.waiting_on = waiting_on;
        }
    }

    /// Answer every quiescer that has nothing left to wait for: no removal retired before it
    /// pending, or those left stalled for longer than its patience. Under loom time does not
    /// pass, so rounds decide.
    pub(super) fn answer_quiescers(&mut self) {
        if self.outbox.quiescing.is_empty() {
            return;
        }
        let oldest = self.reclaim.pending.keys().next().copied();
        let mut answered = false;
        let mut index = 0;
        while index < self.outbox.quiescing.len() {
            let quiescer = &self.outbox.quiescing[index];
            let done = oldest.is_none_or(|oldest| quiescer.watermark <= oldest)
                && self.parking.unpublished.is_empty()
                && !self.shared.index.holds_retired();
            let gave_up = quiescer.stalled >= STALLED_ROUNDS
                && (cfg!(dma_loom) || quiescer.progress_at.elapsed() >= quiescer.patience);
            if done || gave_up {
                if !answered {
                    self.publish_stats();
                    answered = true;
                }
                let quiescer = self.outbox.quiescing.swap_remove(index);
                // The caller may have gone; nothing to do about that.
                let _ = quiescer.reply.send(());
            } else {
                index += 1;
            }
        }
    }

    /// Apply the releases that code under the role, on this thread, queued while the inbox was
    /// full. Releases that code queues while these are applied (a hook that reacts to their
    /// events) are taken too, up to [`OWN_RELEASE_PASSES`] passes.
    pub(super) fn own_releases(&mut self) {
        #[cfg(not(dma_loom))]
        for _ in 0..OWN_RELEASE_PASSES {
            let released = take_own_releases(self.cache);
            if released.is_empty() {
                break;
            }
            for client in released {
                self.apply(Request::Release { client });
            }
        }
    }

    /// Publish the counters: O(1), and the tables' shrink checks.
    pub(super) fn publish_stats(&mut self) {
        self.stats.pending_removals = self.reclaim.pending.len() as u64;
        self.stats.removals_awaiting_leases = self.reclaim.awaiting_leases;
        self.shared.counters.publish(&self.stats);
        self.shrink();
    }

    /// No reader and no lease can exist any more (the cache is being dropped, and every `Pinned`
    /// and every `Lease` borrows it), so everything is removed now, pending removals first.
    pub(super) fn shutdown(&mut self) {
        let pending = std::mem::take(&mut self.reclaim.pending);
        self.reclaim.retries.clear();
        self.reclaim.awaiting_leases = 0;
        for (_, pending) in pending {
            self.remove_at_shutdown(pending.fi_addr);
            self.table.forget(pending.fi_addr);
        }
        for fi_addr in 0..self.table.entries.len() as fi_addr_t {
            let Some(entry) = self.table.entry_mut(fi_addr) else {
                continue;
            };
            let holders = std::mem::take(&mut entry.holders);
            for client in holders.to_vec() {
                self.unregister(client);
            }
            self.stats.entries -= 1;
            self.remove_at_shutdown(fi_addr);
            self.table.forget(fi_addr);
        }
        // Waiters on a parked incarnation are told `Closed` when their senders drop with it.
        self.parking.clear();
        for quiescer in self.outbox.quiescing.drain(..) {
            let _ = quiescer.reply.send(());
        }
        self.publish_stats();
        tracing::debug!(
            inserts = self.stats.inserts,
            removes = self.stats.removes,
            failed_removes = self.stats.failed_removes,
            "address cache writer stopped"
        );
    }

    /// `fi_av_remove` at shutdown, tried a few times: there is no later to retry in.
    pub(super) fn remove_at_shutdown(&mut self, fi_addr: fi_addr_t) {
        for attempt in 1..=3 {
            self.stats.removes += 1;
            match self.table.backend.remove(fi_addr) {
                Ok(()) => return,
                Err(error) => {
                    self.stats.failed_removes += 1;
                    tracing::error!(op = "remove_failed", fi_addr, attempt, %error, "fi_av_remove failed at shutdown");
                }
            }
        }
    }
}
