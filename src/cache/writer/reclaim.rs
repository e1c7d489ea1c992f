//! The writer's reclamation of retired entries: retiring an unlinked entry (its removal deferred
//! on the epoch collector), then, once every reader pinned at its unlink has gone, removing it
//! from the AV as soon as no lease holds it, retrying a failed `fi_av_remove` with a backoff,
//! and forgetting the entry once it is out (which lets in the incarnation parked behind it).
//!
//! Every pending removal is found by its ticket, never by a scan: one step costs the same however
//! many removals wait.

use std::hash::BuildHasher;
use std::time::Instant;

use super::Writer;
use super::run::{FIRST_RETRY, LAST_RETRY};
use super::state::{Pending, Wait};
use crate::av::AvBackend;
use crate::cache::index::RegistrationIndex;
use dma_libfabric_sys::fi_addr_t;

impl<B: AvBackend> Writer<B> {
    /// Defer the removal of the entry at `fi_addr`, which is no longer in the index.
    pub(super) fn retire(&mut self, fi_addr: fi_addr_t) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.pending.insert(
            ticket,
            Pending {
                fi_addr,
                wait: Wait::Readers,
                since: Instant::now(),
            },
        );
        if let Some(entry) = self.entry_mut(fi_addr) {
            entry.removal = ticket;
        }
        self.retired_in_batch = true;
        // Deferred at the end of the batch, with every other ticket retired since the last
        // deferral (`defer_retired`).
    }

    /// Every reader that could have seen `ticket`'s entry has unpinned: remove it unless a lease
    /// still holds it.
    pub(super) fn readers_gone(&mut self, ticket: u64) {
        let Some(pending) = self.pending.get_mut(&ticket) else {
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
        let Some(pending) = self.pending.get_mut(&ticket) else {
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
                self.awaiting_leases += 1;
            }
            return false;
        }
        if awaited {
            self.awaiting_leases -= 1;
        }
        self.stats.removes += 1;
        if let Err(error) = self.backend.remove(fi_addr) {
            self.stats.failed_removes += 1;
            let at = now + backoff;
            pending.wait = Wait::Held {
                retry_at: Some(at),
                backoff: (backoff * 2).min(LAST_RETRY),
                awaited: false,
            };
            self.retries.insert((at, ticket));
            tracing::warn!(op = "remove_failed", fi_addr, %error, retry_in = ?backoff, "fi_av_remove failed; the entry stays counted and its identity blocked until a retry succeeds");
            return false;
        }
        tracing::debug!(op = "remove", fi_addr, "fi_av_remove");
        self.shared.leases.stop_awaiting(fi_addr);
        self.pending.remove(&ticket);
        self.forget(fi_addr);
        if let Some(parked) = self.parked.remove(&fi_addr) {
            self.admit(fi_addr, *parked);
        }
        true
    }

    /// Drop the entry at `fi_addr`, removed from the AV, and its identity's slot.
    pub(super) fn forget(&mut self, fi_addr: fi_addr_t) {
        let Some(entry) = usize::try_from(fi_addr)
            .ok()
            .and_then(|index| self.entries.get_mut(index))
            .and_then(Option::take)
        else {
            return;
        };
        let hash = self.hasher.hash_one(entry.address.identity());
        if let Ok(slot) = self.slots.find_entry(hash, |&held| held == fi_addr) {
            slot.remove();
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
