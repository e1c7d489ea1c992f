//! The per-peer budget: how many operations one peer incarnation may have in flight, across every
//! kind of operation the endpoint posts to a peer (copying sends, `send_from`, `write`, `read`,
//! `write_with_data`, `write_gather`, `read_scatter`, and the rail set's stripes, which are
//! `write`s and `read`s on each rail's endpoint).
//!
//! # Why
//!
//! The endpoint's slabs and the provider's transmit queue are shared by every peer. A peer that
//! stops reading (SIGSTOP, a full socket, a partition) completes nothing, so without a per-peer
//! cap its operations take every slot and every transmit credit, and the next post to a healthy
//! peer answers `WouldBlock`. The budget caps each peer at
//! [`Configuration::max_operations_per_peer`](crate::configuration::Configuration::max_operations_per_peer), so a
//! stalled peer costs the others at most that many slots.
//!
//! # Guarantees
//!
//! - **Per incarnation, not per index.** Each AV index carries an incarnation, bumped by every
//!   `fi_av_insert` that hands the index out (`av::unreachable`). A count is tagged with the
//!   incarnation it counts: a newcomer on a reused index starts with a full budget however many
//!   operations its predecessor left in flight, and a late completion of the predecessor's gives
//!   back nothing of the newcomer's.
//! - **Bounded.** A peer has at most `limit` operations in flight, except that the later parts of
//!   one transfer split into parts (a gather past the provider's iov limit, a transfer past its
//!   largest message) are always admitted once its first part was: a transfer is never cut in
//!   the middle. So a peer holds at most `limit - 1` plus the parts of its largest transfer.
//! - **No lock.** Taking and giving back are a compare-and-swap on the index's word; a peer that
//!   is out of budget changes nothing.
//! - Indices outside the AV's capacity (a raw send's, `FI_ADDR_UNSPEC`) are not counted.
//!
//! # Bounds
//!
//! One `AtomicU64` per AV entry, allocated at `open`: 32 KiB for the default 4,096 entries.

use std::sync::atomic::{AtomicU64, Ordering};

use dma_libfabric_sys as sys;

/// The low half of a word: the count.
const COUNT: u64 = u32::MAX as u64;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct PeerBudget {
    /// One word per AV index: the incarnation counted in the high 32 bits, its count in the low.
    words: Box<[AtomicU64]>,
    limit: u32,
}

impl PeerBudget {
    /// A budget of `limit` operations (at least 1) per peer, for indices `0..capacity`.
    pub(crate) fn new(capacity: usize, limit: usize) -> Self {
        Self {
            words: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            limit: u32::try_from(limit.max(1)).unwrap_or(u32::MAX),
        }
    }

    /// The most operations one peer may have in flight.
    pub(crate) fn limit(&self) -> usize {
        self.limit as usize
    }

    /// Take one operation of `fi_addr`'s budget for `incarnation`. `forced` (a later part of a
    /// transfer whose first part was admitted) takes it whatever is left. Returns whether it was
    /// taken; an index that is not counted always is.
    pub(crate) fn take(&self, fi_addr: sys::fi_addr_t, incarnation: u32, forced: bool) -> bool {
        let Some(word) = self.word(fi_addr) else {
            return true;
        };
        let tag = u64::from(incarnation) << 32;
        let mut current = word.load(Ordering::Acquire);
        loop {
            let next = if current & !COUNT != tag {
                // Another incarnation's count (the index was handed out anew): this one starts
                // from nothing.
                tag | 1
            } else {
                let count = current & COUNT;
                if (!forced && count >= u64::from(self.limit)) || count == COUNT {
                    return false;
                }
                current + 1
            };
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    /// Give back one operation [`take`](Self::take) took for `incarnation`: nothing when the
    /// index has been handed out anew since (its count is the newcomer's).
    pub(crate) fn give_back(&self, fi_addr: sys::fi_addr_t, incarnation: u32) {
        let Some(word) = self.word(fi_addr) else {
            return;
        };
        let tag = u64::from(incarnation) << 32;
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current & !COUNT != tag || current & COUNT == 0 {
                return;
            }
            match word.compare_exchange_weak(
                current,
                current - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// How many operations `fi_addr`'s `incarnation` has in flight.
    pub(crate) fn in_flight(&self, fi_addr: sys::fi_addr_t, incarnation: u32) -> usize {
        let tag = u64::from(incarnation) << 32;
        self.word(fi_addr)
            .map(|word| word.load(Ordering::Acquire))
            .filter(|word| word & !COUNT == tag)
            .map_or(0, |word| (word & COUNT) as usize)
    }

    fn word(&self, fi_addr: sys::fi_addr_t) -> Option<&AtomicU64> {
        self.words.get(usize::try_from(fi_addr).ok()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    #[test]
    fn a_peer_takes_its_limit_and_no_more_and_gets_it_back() {
        let budget = PeerBudget::new(4, 3);
        for _ in 0..3 {
            assert!(budget.take(1, 7, false));
        }
        assert!(!budget.take(1, 7, false), "past the limit");
        assert_eq!(3, budget.in_flight(1, 7));
        assert!(budget.take(2, 7, false), "another index is not affected");
        budget.give_back(1, 7);
        assert!(budget.take(1, 7, false), "one given back, one taken");
        assert!(!budget.take(1, 7, false));
    }

    #[test]
    fn a_new_incarnation_starts_full_and_the_old_ones_returns_are_ignored() {
        let budget = PeerBudget::new(4, 2);
        assert!(budget.take(0, 1, false));
        assert!(budget.take(0, 1, false));
        assert!(!budget.take(0, 1, false));
        // Index 0 handed out anew: incarnation 2 starts from nothing.
        assert!(budget.take(0, 2, false));
        assert!(budget.take(0, 2, false));
        assert!(!budget.take(0, 2, false));
        // The old incarnation's completions arrive late: they give back nothing of the new one's.
        budget.give_back(0, 1);
        budget.give_back(0, 1);
        assert_eq!(2, budget.in_flight(0, 2));
        assert!(!budget.take(0, 2, false));
        assert_eq!(0, budget.in_flight(0, 1));
    }

    #[test]
    fn forced_parts_pass_the_limit_and_uncounted_indices_always_pass() {
        let budget = PeerBudget::new(2, 1);
        assert!(budget.take(1, 0, false));
        assert!(!budget.take(1, 0, false));
        assert!(
            budget.take(1, 0, true),
            "a later part of an admitted transfer"
        );
        assert_eq!(2, budget.in_flight(1, 0));
        assert!(budget.take(2, 0, false), "past the capacity: not counted");
        assert!(budget.take(sys::FI_ADDR_UNSPEC, 0, false));
        budget.give_back(sys::FI_ADDR_UNSPEC, 0);
        budget.give_back(1, 0);
        budget.give_back(1, 0);
        budget.give_back(1, 0);
        assert_eq!(0, budget.in_flight(1, 0), "never below zero");
    }

    #[test]
    fn extreme_limits_are_clamped() {
        assert_eq!(1, PeerBudget::new(1, 0).limit());
        assert_eq!(u32::MAX as usize, PeerBudget::new(1, usize::MAX).limit());
        let budget = PeerBudget::new(1, usize::MAX);
        for _ in 0..1000 {
            assert!(budget.take(0, u32::MAX, false));
        }
        assert_eq!(1000, budget.in_flight(0, u32::MAX));
    }

    #[test]
    fn concurrent_takes_never_pass_the_limit() {
        let budget = std::sync::Arc::new(PeerBudget::new(1, 64));
        let taken: usize = (0..4)
            .map(|_| {
                let budget = std::sync::Arc::clone(&budget);
                std::thread::spawn(move || (0..1000).filter(|_| budget.take(0, 3, false)).count())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|thread| thread.join().unwrap())
            .sum();
        assert_eq!(64, taken);
        assert_eq!(64, budget.in_flight(0, 3));
    }
}
