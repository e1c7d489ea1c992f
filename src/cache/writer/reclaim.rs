//! The writer's reclamation of retired entries: retiring an unlinked entry (its removal deferred
//! on the epoch collector), then, once every reader pinned at its unlink has gone, removing it
//! from the AV as soon as no lease holds it, retrying a failed `fi_av_remove` with a backoff,
//! and forgetting the entry once it is out (which lets in the incarnation parked behind it).
//!
//! [`Reclamation`] guarantees that at most one deferral is out on the collector, covering every
//! ticket retired before it (see "One deferral at a time" in the `writer` module docs), and that
//! every pending removal is found by its ticket, never by a scan: one step costs the same however
//! many removals wait.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Instant;

use crossbeam_epoch::LocalHandle;

use super::run::{FIRST_RETRY, LAST_RETRY};
use super::state::{Pending, Wait};
use super::tables::roomy;
use super::{SharedState, Writer};
use crate::av::AvBackend;
use crate::cache::index::RegistrationIndex;
use crate::sync::Arc;
use crate::sync::atomic::Ordering;
use dma_libfabric_sys::fi_addr_t;

/// Retired entries on their way out of the AV, and the epoch deferral that covers them: one job,
/// to remove an entry only once every reader pinned at its unlink has gone. Invariant: `pending`
/// holds tickets below `next_ticket`, at most `C` of them; `in_flight`, if a deferral is out,
/// covers tickets below `undeferred`, and at most one is out; `retries` holds exactly the
/// pending removals with a retry due, and `awaiting_leases` counts those whose last lease is
/// awaited.
pub(super) struct Reclamation {
    /// Retired entries awaiting `fi_av_remove`, by ticket (tickets grow, so the oldest is first).
    pub(super) pending: BTreeMap<u64, Pending>,
    /// Failed removals, by when their retry is due.
    pub(super) retries: BTreeSet<(Instant, u64)>,
    /// Pending removals whose readers are gone and whose last lease the writer awaits.
    pub(super) awaiting_leases: u64,
    /// The tickets the outstanding deferral covers, if one is out.
    pub(super) in_flight: Option<Range<u64>>,
    /// Tickets from here on have not been deferred yet.
    pub(super) undeferred: u64,
    /// How many deferrals have returned (their readers gone).
    pub(super) deferrals_returned: u64,
    /// Whether this batch retired an entry.
    pub(super) retired_in_batch: bool,
    /// Reused for lists of tickets and indices: at most the capacity.
    pub(super) scratch: Vec<u64>,
    pub(super) next_ticket: u64,
    /// This writer's handle on the cache's epoch collector: the deferral goes on it.
    epoch: LocalHandle,
}

impl Reclamation {
    pub(super) fn new(epoch: LocalHandle) -> Self {
        Self {
            pending: BTreeMap::new(),
            retries: BTreeSet::new(),
            awaiting_leases: 0,
            in_flight: None,
            undeferred: 0,
            deferrals_returned: 0,
            retired_in_batch: false,
            scratch: Vec::new(),
            next_ticket: 0,
            epoch,
        }
    }

    /// Pin, flush this thread's deferred closures to the collector, and let it collect.
    pub(super) fn advance(&self) {
        let guard = self.epoch.pin();
        guard.flush();
    }

    /// If no deferral is out and tickets retired since the last one are still pending, defer one
    /// closure that covers them all, and hand it to the collector. See "One deferral at a time".
    /// The closure reports to `shared`, and rings nobody if it runs under cache `cache`'s role.
    pub(super) fn defer_retired(&mut self, shared: &Arc<SharedState>, cache: u64) {
        if self.in_flight.is_some()
            || (self.pending.range(self.undeferred..).next().is_none()
                && !shared.index.retired_uncovered())
        {
            return;
        }
        self.in_flight = Some(self.undeferred..self.next_ticket);
        self.undeferred = self.next_ticket;
        // A table the index replaced before this deferral is covered by it (`index::shrink`).
        shared.index.cover_retired();
        let shared = Arc::clone(shared);
        let guard = self.epoch.pin();
        guard.defer(move || {
            // Release: pairs with the writer's Acquire swap, after which it removes. A swap, not a
            // store: under loom a plain store from inside crossbeam's collection was not seen by
            // the writer's later swap (a model of `aba` failed that way), and an exchange costs the
            // same on this rare path.
            shared.readers_gone.swap(true, Ordering::AcqRel);
            // A report: while callers hold the role often enough that the background thread
            // dozes, the next holder takes it (see `Doorbell::ring_report`). Run by the role's
            // holder (its own advance), it rings nobody: the holder's `hand_over` still sees
            // the deferral out (only `collect` takes it back) and wakes the background thread
            // unless it ticks already.
            if !super::on_writer_of(cache) {
                shared.doorbell.ring_report();
            }
        });
        // The closure waits in this thread's bag until it is flushed; flush so that readers'
        // pins can collect it too.
        guard.flush();
    }

    /// Shrink the scratch list once it is well above what `pending` needs ([`roomy`]).
    pub(super) fn shrink(&mut self) {
        if roomy(self.scratch.capacity(), self.pending.len()) {
            self.scratch.shrink_to(2 * self.pending.len());
        }
    }

    /// The cache holds no entry: free what each table kept at its smallest size.
    pub(super) fn give_back(&mut self) {
        if self.scratch.capacity() > 0 {
            self.scratch = Vec::new();
        }
        // An emptied B-tree keeps its root leaf (808 B for `pending`): a fresh one holds none.
        self.pending = BTreeMap::new();
        if self.retries.is_empty() {
            self.retries = BTreeSet::new();
        }
    }
}

impl<B: AvBackend> Writer<B> {
    /// Defer the removal of the entry at `fi_addr`, which is no longer in the index.
    pub(super) fn retire(&mut self, fi_addr: fi_addr_t) {
        let ticket = self.reclaim.next_ticket;
        self.reclaim.next_ticket += 1;
        self.reclaim.pending.insert(
            ticket,
            Pending {
                fi_addr,
                wait: Wait::Readers,
                since: Instant::now(),
            },
        );
        if let Some(entry) = self.table.entry_mut(fi_addr) {
            entry.removal = ticket;
        }
        self.reclaim.retired_in_batch = true;
        // Deferred at the end of the batch, with every other ticket retired since the last
        // deferral (`defer_retired`).
    }

    /// Every reader that could have seen `ticket`'s entry has unpinned: remove it unless a lease
    /// still holds it.
    pub(super) fn readers_gone(&mut self, ticket: u64) {
        let Some(pending) = self.reclaim.pending.get_mut(&ticket) else {
            // Revived before its readers left; nothing to remove.
            return;
        };
        if Wait::Readers != pending.wait {
            return;
        }
        pending.wait = Wait::Held {
            retry_at: None,
            backoff: FIRST_RETRY,
            awaited: false,
        };
        self.try_remove(ticket, Instant::now());
    }

    /// Remove `ticket`'s entry unless a lease holds it (then await the last one's report) or a
    /// retry is due later; let in the incarnation parked behind it. Whether it is gone from
    /// `pending`.
    pub(super) fn try_remove(&mut self, ticket: u64, now: Instant) -> bool {
        let Some(pending) = self.reclaim.pending.get_mut(&ticket) else {
            return true;
        };
        let Wait::Held {
            retry_at,
            backoff,
            awaited,
        } = pending.wait
        else {
            return false;
        };
        if retry_at.is_some() {
            return false;
        }
        let fi_addr = pending.fi_addr;
        if self.shared.leases.await_release(fi_addr) {
            if !awaited {
                pending.wait = Wait::Held {
                    retry_at,
                    backoff,
                    awaited: true,
                };
                self.reclaim.awaiting_leases += 1;
            }
            return false;
        }
        if awaited {
            self.reclaim.awaiting_leases -= 1;
        }
        self.stats.removes += 1;
        if let Err(error) = self.table.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            let at = now + backoff;
            pending.wait = Wait::Held {
                retry_at: Some(at),
                backoff: (backoff * 2).min(LAST_RETRY),
                awaited: false,
            };
            self.reclaim.retries.insert((at, ticket));
            tracing::warn!(op = "remove_failed", fi_addr, %error, retry_in = ?backoff, "fi_av_remove failed; the entry stays counted and its identity blocked until a retry succeeds");
            return false;
        }
        tracing::debug!(op = "remove", fi_addr, "fi_av_remove");
        self.shared.leases.stop_awaiting(fi_addr);
        self.reclaim.pending.remove(&ticket);
        self.table.forget(fi_addr);
        if let Some(parked) = self.parking.parked.remove(&fi_addr) {
            self.admit(fi_addr, *parked);
        }
        true
    }

    /// Take what the readers and leases reported: the outstanding deferral's tickets, whose
    /// readers have gone, and awaited removals whose last lease was dropped; retry the failed
    /// removals that are due. Whether anything was removed. Costs nothing per removal that is
    /// still waiting.
    pub(super) fn collect(&mut self) -> bool {
        let removes = self.stats.removes;
        let mut scratch = std::mem::take(&mut self.reclaim.scratch);
        // Acquire: pairs with the closure's Release; the closure ran after every reader pinned
        // at the deferral unpinned.
        if self.shared.readers_gone.swap(false, Ordering::Acquire) {
            if let Some(range) = self.reclaim.in_flight.take() {
                self.reclaim.deferrals_returned += 1;
                self.index_readers_gone();
                scratch.clear();
                scratch.extend(self.reclaim.pending.range(range).map(|(&ticket, _)| ticket));
                for &ticket in &scratch {
                    self.readers_gone(ticket);
                }
            }
        }
        scratch.clear();
        self.shared
            .leases
            .take_released(|fi_addr| scratch.push(fi_addr));
        for &fi_addr in &scratch {
            // A report for an entry revived (or already removed) since is stale.
            let ticket = self
                .table
                .entry(fi_addr)
                .filter(|entry| !entry.is_live())
                .map(|entry| entry.removal);
            if let Some(ticket) = ticket {
                self.lease_released(ticket);
            }
        }
        scratch.clear();
        self.reclaim.scratch = scratch;
        if let Some(&(first, _)) = self.reclaim.retries.first() {
            let now = Instant::now();
            if first <= now || cfg!(dma_loom) {
                while let Some(&(at, ticket)) = self.reclaim.retries.first() {
                    if now < at && cfg!(not(dma_loom)) {
                        break;
                    }
                    self.reclaim.retries.pop_first();
                    if let Some(Pending {
                        wait: Wait::Held { retry_at, .. },
                        ..
                    }) = self.reclaim.pending.get_mut(&ticket)
                    {
                        *retry_at = None;
                    }
                    self.try_remove(ticket, now);
                }
            }
        }
        self.reclaim.defer_retired(&self.shared, self.cache);
        removes != self.stats.removes
    }

    /// The last lease of `ticket`'s entry was dropped: remove it if it was awaited.
    pub(super) fn lease_released(&mut self, ticket: u64) {
        let awaited = matches!(
            self.reclaim.pending.get(&ticket),
            Some(Pending {
                wait: Wait::Held { awaited: true, .. },
                ..
            })
        );
        if awaited {
            self.try_remove(ticket, Instant::now());
        }
    }

    /// The outstanding deferral has returned: a table the index replaced before it was deferred
    /// has no reader left, so it is freed; and if the table now in use has emptied well below
    /// what it grew to meanwhile, it is replaced in turn (the next deferral covers it).
    pub(super) fn index_readers_gone(&mut self) {
        self.shared.index.readers_gone();
        self.shared.index.shrink();
    }
}
