//! Striping: how a transfer is cut across the rails, and how its stripes' completions become one.
//!
//! - A transfer under [`MIN_STRIPE`] goes whole to one rail, the next in a round-robin.
//! - A larger one is cut into `k` stripes, one per rail, `k` as many rails as there are and as
//!   the length allows with every stripe at least [`MIN_STRIPE`]: stripes are the length over
//!   `k` rounded up to [`STRIPE_ALIGN`] bytes, the last one taking what is left. The stripes
//!   start at the round-robin's rail, so short and long transfers spread alike.
//! - Every stripe of a transfer is posted under the same tag (its endpoint's operation id), one
//!   per rail, so a rail's completion names its transfer. The transfer's [`Completion`] is handed
//!   out once every posted stripe has completed, with the first stripe error if any.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

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
                self.ready_lock().push_back(finish(transfer));
            }
        }
    }

    /// Account a rail's completion: the transfer's own, once its last stripe is in, goes to
    /// `out`; a completion of no transfer of ours (an operation posted on the rail's endpoint
    /// directly) goes to `out` unchanged. Returns how many it added.
    pub(crate) fn complete(&self, completion: Completion, out: &mut Vec<Completion>) -> usize {
        let mut in_flight = self.lock();
        let Some(transfer) = in_flight.get_mut(&completion.id) else {
            drop(in_flight);
            out.push(completion);
            return 1;
        };
        transfer.remaining = transfer.remaining.saturating_sub(1);
        if let Err(error) = completion.result {
            transfer.error.get_or_insert(error);
        }
        if 0 < transfer.remaining {
            return 0;
        }
        match in_flight.remove(&completion.id) {
            Some(transfer) => {
                drop(in_flight);
                out.push(finish(transfer));
                1
            }
            None => 0,
        }
    }

    /// Move the completions made ready by `unposted` into `out`.
    pub(crate) fn take_ready(&self, out: &mut Vec<Completion>) -> usize {
        let mut ready = self.ready_lock();
        let count = ready.len();
        out.extend(ready.drain(..));
        count
    }

    /// Hand back completions taken but not wanted (`wait_for`'s others), for the next poll.
    pub(crate) fn put_back(&self, completions: Vec<Completion>) {
        if !completions.is_empty() {
            self.ready_lock().extend(completions);
        }
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
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn ready_lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Completion>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn finish(transfer: Transfer) -> Completion {
    Completion {
        id: transfer.id,
        operation: transfer.operation,
        len: transfer.len,
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
            result,
        }
    }

    #[test]
    fn one_completion_once_every_stripe_is_in_with_the_first_error() {
        let transfers = Transfers::default();
        let tag = transfers.begin(42, Operation::Write, 3 * MIN_STRIPE, 3);
        let mut out = Vec::new();
        assert_eq!(0, transfers.complete(stripe_done(tag, Ok(())), &mut out));
        let failed = DmaError::InvalidArgument("stripe".into());
        assert_eq!(
            0,
            transfers.complete(stripe_done(tag, Err(failed.clone())), &mut out)
        );
        assert!(out.is_empty(), "not before the last stripe");
        assert_eq!(1, transfers.complete(stripe_done(tag, Ok(())), &mut out));
        assert_eq!(
            vec![Completion {
                id: 42,
                operation: Operation::Write,
                len: 3 * MIN_STRIPE,
                result: Err(failed),
            }],
            out
        );
        assert_eq!(0, transfers.in_flight());
        // A completion of no transfer passes through unchanged.
        assert_eq!(1, transfers.complete(stripe_done(999, Ok(())), &mut out));
        assert_eq!(999, out[1].id);
    }

    #[test]
    fn stripes_never_posted_count_as_completed_with_their_error() {
        let transfers = Transfers::default();
        let mut out = Vec::new();
        // The posted stripe completes before the post of the others fails.
        let tag = transfers.begin(1, Operation::Read, 4 * MIN_STRIPE, 4);
        transfers.complete(stripe_done(tag, Ok(())), &mut out);
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
        transfers.complete(stripe_done(tag, Ok(())), &mut out);
        assert!(out.is_empty());
        transfers.complete(stripe_done(tag, Ok(())), &mut out);
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
