//! Striping: how a transfer is cut across the rails, and how its stripes' completions become one.
//!
//! - A transfer under [`MIN_STRIPE`] goes whole to one rail, the next in a round-robin.
//! - A larger one is cut into `k` stripes, one per rail, `k` as many rails as there are and as
//!   the length allows with every stripe at least [`MIN_STRIPE`]: stripes are the length over
//!   `k` rounded up to [`STRIPE_ALIGN`] bytes, the last one taking what is left. The stripes
//!   start at the round-robin's rail, so short and long transfers spread alike.
//! - Every stripe of a transfer is one part of the engine's one join (`endpoint::engine::Join`),
//!   posted on its rail with the rail set's [`Transfers`] as its sink: the stripe's completion is
//!   found by the slot it was posted in, never by the number, so whichever thread reads a rail's
//!   queue counts it, and no application id can be mistaken for the crate's. The transfer's
//!   [`Completion`] is handed to `Transfers` once every stripe has completed or been given up,
//!   with the first stripe error if any.
//! - Completed transfers wait in a ready queue bounded by the transfers in flight; a waiter takes
//!   only its own (by id), so no waiter holds another's completion while it waits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::endpoint::engine::{CompletionOwner, Join};
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

/// The transfers in flight, and the completions ready to hand out.
#[derive(Default)]
pub(crate) struct Transfers {
    /// The round-robin's next rail.
    next_rail: AtomicUsize,
    /// Transfers begun and not yet completed.
    in_flight: AtomicUsize,
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

    /// A new transfer of `stripes` stripes: the join its stripes are posted as parts of.
    pub(crate) fn begin(
        &self,
        id: u64,
        operation: Operation,
        len: usize,
        stripes: usize,
    ) -> Arc<Join> {
        if stripes > 1 {
            self.striped.fetch_add(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Join::new(stripes, id, operation, len)
    }

    /// Forget a transfer of `stripes` stripes none of which was posted.
    pub(crate) fn abandon(&self, stripes: usize) {
        if stripes > 1 {
            self.striped.fetch_sub(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// `unposted` stripes of `join` failed to post with `error`: count them as completed with
    /// it (the transfer completes now if its posted stripes are in).
    pub(crate) fn give_up(&self, join: &Join, unposted: usize, error: DmaError) {
        if let Some(completion) = join.finish(unposted, Err(error)) {
            self.completed(completion);
        }
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
        self.in_flight.load(Ordering::Acquire)
    }

    /// How many transfers were cut into more than one stripe.
    pub(crate) fn striped(&self) -> u64 {
        self.striped.load(Ordering::Relaxed)
    }

    fn ready_lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Completion>> {
        crate::sync::lock(&self.ready)
    }
}

impl CompletionOwner for Transfers {
    /// A transfer's joined completion, from whichever thread counted its last stripe: handed out,
    /// and its waiters woken.
    fn completed(&self, completion: Completion) {
        self.ready_lock().push_back(completion);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.waiter.ring();
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

    #[test]
    fn one_completion_once_every_stripe_is_in_with_the_first_error() {
        let transfers = Transfers::default();
        let join = transfers.begin(42, Operation::Write, 3 * MIN_STRIPE, 3);
        let mut out = Vec::new();
        let failed = DmaError::InvalidArgument("stripe".into());
        for result in [Ok(()), Err(failed.clone())] {
            assert!(
                join.finish(1, result).is_none(),
                "not before the last stripe"
            );
        }
        assert_eq!(1, transfers.in_flight());
        let done = join.finish(1, Ok(())).expect("the last stripe");
        transfers.completed(done);
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
    }

    #[test]
    fn stripes_never_posted_count_as_completed_with_their_error() {
        let transfers = Transfers::default();
        let mut out = Vec::new();
        // The posted stripe completes before the post of the others fails.
        let join = transfers.begin(1, Operation::Read, 4 * MIN_STRIPE, 4);
        assert!(join.finish(1, Ok(())).is_none());
        transfers.give_up(&join, 3, DmaError::WouldBlock);
        assert_eq!(1, transfers.take_ready(&mut out));
        assert_eq!(
            (1, Err(DmaError::WouldBlock)),
            (out[0].id, out[0].result.clone())
        );
        // Or after: the last posted stripe's completion hands it out.
        let join = transfers.begin(2, Operation::Read, 4 * MIN_STRIPE, 4);
        transfers.give_up(&join, 2, DmaError::WouldBlock);
        assert!(join.finish(1, Ok(())).is_none());
        assert_eq!(None, transfers.take(2));
        transfers.completed(join.finish(1, Ok(())).expect("the last stripe"));
        let done = transfers.take(2).expect("handed out");
        assert_eq!((2, Err(DmaError::WouldBlock)), (done.id, done.result));
        assert_eq!(0, transfers.in_flight());
        // A transfer none of whose stripes went is forgotten.
        let _join = transfers.begin(3, Operation::Write, 4 * MIN_STRIPE, 4);
        transfers.abandon(4);
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
