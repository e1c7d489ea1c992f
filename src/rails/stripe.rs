//! Striping: how a transfer is cut across the rails, and how its stripes' completions become one.
//!
//! - A transfer under [`MIN_STRIPE`] goes whole to one rail, the next in a round-robin.
//! - A larger one is cut into `k` stripes, one per rail, `k` as many rails as there are and as
//!   the length allows with every stripe at least [`MIN_STRIPE`]: stripes are the length over
//!   `k` rounded up to [`STRIPE_ALIGN`] bytes, the last one taking what is left. The stripes
//!   start at the round-robin's rail, so short and long transfers spread alike.
//! - Every stripe of a transfer is posted under the same tag, one per rail, as an operation the
//!   rail set owns (see the endpoint's `completions` module, "Routing"): its completion comes
//!   back to the rail set's [`Transfers`] by the slot it was posted in, never by the number, so
//!   whichever thread reads a rail's queue hands it here, and no application id can be mistaken
//!   for a tag. The transfer's [`Completion`] is handed out once every posted stripe has
//!   completed, with the first stripe error if any.
//! - Completed transfers wait in a ready queue bounded by the transfers in flight; a waiter takes
//!   only its own (by id), so no waiter holds another's completion while it waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::endpoint::completions::CompletionOwner;
use crate::endpoint::wait::Waiter;
use crate::endpoint::{Completion, Operation};
use crate::error::DmaError;

/// The smallest stripe of a striped transfer: transfers under it go whole to one rail. 128 KiB,
/// as aws-ofi-nccl's scheduler and NIXL use.
pub const MIN_STRIPE: usize = 128 << 10;

/// Stripes start at multiples of this many bytes from the transfer's start.
pub const STRIPE_ALIGN: usize = 128;

/// One stripe: `len` bytes at `offset` of the transfer, on local rail `rail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stripe {
    pub(crate) rail: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// The stripes of a `len`-byte transfer over `rails` rails, the first on rail `first`.
pub(crate) fn plan(len: usize, rails: usize, first: usize) -> Vec<Stripe> {
    let rails = rails.max(1);
    let mut count = (len / MIN_STRIPE).clamp(1, rails);
    let size = loop {
        let size = len
            .div_ceil(count)
            .checked_next_multiple_of(STRIPE_ALIGN)
            .unwrap_or(len);
        // The last stripe takes what is left: fewer stripes if that is under the minimum.
        let last = len.saturating_sub(size * (count - 1));
        if count == 1 || (last >= MIN_STRIPE && size * (count - 1) < len) {
            break size;
        }
        count -= 1;
    };
    (0..count)
        .map(|stripe| {
            let offset = stripe * size;
            Stripe {
                rail: (first + stripe) % rails,
                offset,
                len: if stripe + 1 == count {
                    len - offset
                } else {
                    size
                },
            }
        })
        .collect()
}

/// One transfer whose stripes are in flight.
struct Transfer {
    id: u64,
    operation: Operation,
    len: usize,
    /// Stripes posted and not yet completed.
    remaining: usize,
    /// The first stripe error, if any.
    error: Option<DmaError>,
}

/// The transfers in flight, by tag, and the completions ready to hand out.
#[derive(Default)]
pub(crate) struct Transfers {
    next_tag: AtomicU64,
    /// The round-robin's next rail.
    next_rail: AtomicUsize,
    in_flight: Mutex<HashMap<u64, Transfer>>,
    ready: Mutex<VecDeque<Completion>>,
    /// Transfers cut into more than one stripe.
    striped: AtomicU64,
    /// The threads waiting for a transfer (`RailSet::wait_for`), rung when one is ready.
    pub(crate) waiter: Waiter,
}

impl Transfers {
    /// The rail the next transfer starts on.
    pub(crate) fn next_rail(&self, rails: usize) -> usize {
        self.next_rail.fetch_add(1, Ordering::Relaxed) % rails.max(1)
    }

    /// A new transfer of `stripes` stripes: its tag.
    pub(crate) fn begin(&self, id: u64, operation: Operation, len: usize, stripes: usize) -> u64 {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
        if stripes > 1 {
            self.striped.fetch_add(1, Ordering::Relaxed);
        }
        self.lock().insert(
            tag,
            Transfer {
                id,
                operation,
                len,
                remaining: stripes,
                error: None,
            },
        );
        tag
    }

    /// Forget a transfer none of whose stripes was posted.
    pub(crate) fn abandon(&self, tag: u64, stripes: usize) {
        if stripes > 1 {
            self.striped.fetch_sub(1, Ordering::Relaxed);
        }
        self.lock().remove(&tag);
    }

    /// `unposted` stripes of transfer `tag` failed to post with `error`: count them as completed
    /// with it.
    pub(crate) fn unposted(&self, tag: u64, unposted: usize, error: DmaError) {
        let mut in_flight = self.lock();
        let done = match in_flight.get_mut(&tag) {
            Some(transfer) => {
                transfer.remaining = transfer.remaining.saturating_sub(unposted);
                transfer.error.get_or_insert(error);
                0 == transfer.remaining
            }
            None => false,
        };
        if done {
            if let Some(transfer) = in_flight.remove(&tag) {
                drop(in_flight);
                self.publish(finish(transfer));
            }
        }
    }

    /// Hand out a finished transfer's completion and wake its waiters.
    fn publish(&self, completion: Completion) {
        self.ready_lock().push_back(completion);
        self.waiter.ring();
    }

    /// Move every ready completion into `out`. Returns how many it added.
    pub(crate) fn take_ready(&self, out: &mut Vec<Completion>) -> usize {
        let mut ready = self.ready_lock();
        let count = ready.len();
        out.extend(ready.drain(..));
        count
    }

    /// The ready completion of the transfer posted with `id`, if any; the others stay.
    pub(crate) fn take(&self, id: u64) -> Option<Completion> {
        let mut ready = self.ready_lock();
        let position = ready.iter().position(|completion| completion.id == id)?;
        ready.remove(position)
    }

    /// How many transfers are in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().len()
    }

    /// How many transfers were cut into more than one stripe.
    pub(crate) fn striped(&self) -> u64 {
        self.striped.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Transfer>> {
        crate::sync::lock(&self.in_flight)
    }

    fn ready_lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Completion>> {
        crate::sync::lock(&self.ready)
    }
}

impl CompletionOwner for Transfers {
    /// A stripe's completion, its id the transfer's tag: the transfer's own completion is
    /// published once its last stripe is in.
    fn completed(&self, stripe: Completion) {
        let mut in_flight = self.lock();
        let Some(transfer) = in_flight.get_mut(&stripe.id) else {
            drop(in_flight);
            tracing::warn!(
                tag = stripe.id,
                "a stripe completion for no transfer in flight"
            );
            return;
        };
        transfer.remaining = transfer.remaining.saturating_sub(1);
        if let Err(error) = stripe.result {
            transfer.error.get_or_insert(error);
        }
        if 0 < transfer.remaining {
            return;
        }
        if let Some(transfer) = in_flight.remove(&stripe.id) {
            drop(in_flight);
            self.publish(finish(transfer));
        }
    }
}

fn finish(transfer: Transfer) -> Completion {
    Completion {
        id: transfer.id,
        operation: transfer.operation,
        len: transfer.len,
        sender: None,
        result: transfer.error.map_or(Ok(()), Err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(len: usize, rails: usize, first: usize) -> Vec<Stripe> {
        let stripes = plan(len, rails, first);
        assert!(!stripes.is_empty() && stripes.len() <= rails.max(1));
        let mut at = 0;
        for (index, stripe) in stripes.iter().enumerate() {
            assert_eq!(at, stripe.offset, "contiguous: {stripes:?}");
            assert_eq!(0, stripe.offset % STRIPE_ALIGN, "aligned: {stripes:?}");
            if stripes.len() > 1 {
                assert!(
                    stripe.len >= MIN_STRIPE,
                    "at least the minimum: {stripes:?}"
                );
            }
            assert_eq!((first + index) % rails.max(1), stripe.rail);
            at += stripe.len;
        }
        assert_eq!(len, at, "covers the transfer: {stripes:?}");
        stripes
    }

    fn stripe_done(tag: u64, result: Result<(), DmaError>) -> Completion {
        Completion {
            id: tag,
            operation: Operation::Write,
            len: MIN_STRIPE,
            sender: None,
            result,
        }
    }

    #[test]
    fn one_completion_once_every_stripe_is_in_with_the_first_error() {
        let transfers = Transfers::default();
        let tag = transfers.begin(42, Operation::Write, 3 * MIN_STRIPE, 3);
        let mut out = Vec::new();
        transfers.completed(stripe_done(tag, Ok(())));
        let failed = DmaError::InvalidArgument("stripe".into());
        transfers.completed(stripe_done(tag, Err(failed.clone())));
        assert_eq!(
            0,
            transfers.take_ready(&mut out),
            "not before the last stripe"
        );
        transfers.completed(stripe_done(tag, Ok(())));
        assert_eq!(None, transfers.take(41), "only by its own id");
        assert_eq!(1, transfers.take_ready(&mut out));
        assert_eq!(
            vec![Completion {
                id: 42,
                operation: Operation::Write,
                len: 3 * MIN_STRIPE,
                sender: None,
                result: Err(failed),
            }],
            out
        );
        assert_eq!(0, transfers.in_flight());
        // A stripe completion of no transfer is dropped, not handed out as the application's.
        transfers.completed(stripe_done(999, Ok(())));
        assert_eq!(0, transfers.take_ready(&mut out));
    }

    #[test]
    fn stripes_never_posted_count_as_completed_with_their_error() {
        let transfers = Transfers::default();
        let mut out = Vec::new();
        // The posted stripe completes before the post of the others fails.
        let tag = transfers.begin(1, Operation::Read, 4 * MIN_STRIPE, 4);
        transfers.completed(stripe_done(tag, Ok(())));
        transfers.unposted(tag, 3, DmaError::WouldBlock);
        assert_eq!(1, transfers.take_ready(&mut out));
        assert_eq!(
            (1, Err(DmaError::WouldBlock)),
            (out[0].id, out[0].result.clone())
        );
        // Or after: the last posted stripe's completion hands it out.
        out.clear();
        let tag = transfers.begin(2, Operation::Read, 4 * MIN_STRIPE, 4);
        transfers.unposted(tag, 2, DmaError::WouldBlock);
        assert_eq!(0, transfers.take_ready(&mut out));
        transfers.completed(stripe_done(tag, Ok(())));
        assert_eq!(0, transfers.take_ready(&mut out));
        transfers.completed(stripe_done(tag, Ok(())));
        assert_eq!(Some(2), transfers.take(2).map(|done| done.id));
        out.push(Completion {
            id: 2,
            operation: Operation::Read,
            len: 0,
            sender: None,
            result: Err(DmaError::WouldBlock),
        });
        assert_eq!(
            (2, Err(DmaError::WouldBlock)),
            (out[0].id, out[0].result.clone())
        );
        assert_eq!(0, transfers.in_flight());
        // A transfer none of whose stripes went is forgotten.
        let tag = transfers.begin(3, Operation::Write, 4 * MIN_STRIPE, 4);
        transfers.abandon(tag, 4);
        assert_eq!((0, 2), (transfers.in_flight(), transfers.striped()));
    }

    #[test]
    fn small_transfers_go_whole_to_one_rail() {
        assert_eq!(
            vec![Stripe {
                rail: 3,
                offset: 0,
                len: MIN_STRIPE - 1
            }],
            check(MIN_STRIPE - 1, 4, 3)
        );
        assert_eq!(1, check(1, 4, 0).len());
        assert_eq!(1, check(2 * MIN_STRIPE - 1, 4, 0).len());
    }

    #[test]
    fn large_transfers_are_cut_across_the_rails() {
        assert_eq!(2, check(2 * MIN_STRIPE, 4, 0).len());
        assert_eq!(4, check(64 << 20, 4, 1).len());
        assert_eq!(2, check(64 << 20, 2, 0).len());
        assert_eq!(1, check(64 << 20, 1, 0).len());
        // One more byte than two minimum stripes: rounding up would leave the last short.
        for len in [
            2 * MIN_STRIPE + 1,
            3 * MIN_STRIPE - 1,
            5 * MIN_STRIPE + 77,
            (1 << 30) + 3,
        ] {
            for rails in 1..=8 {
                check(len, rails, rails / 2);
            }
        }
    }
}
