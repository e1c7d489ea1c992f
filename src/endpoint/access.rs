//! Who may touch a `Local` region's bytes now: this endpoint's operations, or the slices and
//! copies it lent out, never both; and which posters are waiting for the loans to end.
//!
//! One atomic word counts all three: loans (slices and copies) in the low 24 bits, posters
//! waiting in the next 8, operations holding the memory in the high 32. An operation adds itself
//! first and then looks at the loans' field of the value it replaced, backing out if it is not
//! zero; a loan is added by a compare-exchange only onto a value whose operations' and waiting
//! posters' fields are both zero. Every change is a read-modify-write of one location, so they
//! have one order: of a loan and an operation that start at once, the later one sees the earlier
//! one and backs out (both may fail; neither ever proceeds alongside the other). The adds and the
//! subtractions that end a hold or a loan are `AcqRel`/`Release`, and the adds that start one are
//! `AcqRel`, so whatever an operation did to the bytes (its completion read, then its hold
//! released) happens before a loan made after it, and a loan's reads happen before an operation
//! posted after it is returned.
//!
//! Fairness: a poster that finds loans out ([`AccessWord::lent`], or its first
//! [`AccessWord::try_hold`] backing out) announces itself ([`AccessWord::try_announce`], a
//! compare-exchange onto the waiting field) and retries its hold until they are returned. A loan
//! whose compare-exchange comes after the announcement in the word's order reads a non-zero
//! waiting field and is refused, so from the announcement on the loans only decrease: the poster
//! waits for the loans out when it announced, never for one made later, however many threads
//! keep borrowing. It withdraws ([`AccessWord::withdraw`]) once it holds the memory, or when its
//! patience runs out.
//!
//! Bounds: at most 2^24 - 1 loans, 2^8 - 1 announced posters and 2^32 - 1 operations at once.
//! Loans and announcements are compare-exchanges that refuse at their field's maximum, so neither
//! carries into the next field: a lend that would reach 2^24 is refused (slices forgotten with
//! `mem::forget` stay counted), and a poster that finds 255 announced waits unannounced (loans
//! are refused meanwhile anyway, and it announces itself as soon as there is room). Operations are
//! bounded by the slab ([`MAX_OPERATIONS`](super::rma::MAX_OPERATIONS) per endpoint sharing the
//! memory) and one transient add per thread in [`AccessWord::try_hold`].
//!
//! `loom_tests/tests/lent_or_held.rs` checks the protocol under loom (the atomics come from
//! `crate::sync`): a slice's reads and an operation's writes of one cell never overlap, and a
//! lend that comes after a poster's announcement is refused.

use crate::sync::atomic::{AtomicU64, Ordering};

/// One loan (a slice or a copy).
const SLICE: u64 = 1;
/// The loans' field.
const SLICES: u64 = WAITER - 1;
/// One poster waiting for the loans to end.
const WAITER: u64 = 1 << 24;
/// The waiting posters' field.
const WAITERS: u64 = OPERATION - WAITER;
/// One operation holding the memory.
const OPERATION: u64 = 1 << 32;
/// The operations' field.
const OPERATIONS: u64 = !(OPERATION - 1);

/// The access word of one `Local` region: see the [module docs](self).
#[derive(Debug)]
pub struct AccessWord(AtomicU64);

impl Default for AccessWord {
    fn default() -> Self {
        Self::new()
    }
}

impl AccessWord {
    /// Nothing lent, nothing held.
    pub fn new() -> Self {
        Self(AtomicU64::new(0))
    }

    /// Hold the memory for one operation, unless a slice or copy is lent: `false` then, and
    /// nothing changed. Announced posters do not keep it out (they are posters too).
    pub fn try_hold(&self) -> bool {
        if 0 != self.0.fetch_add(OPERATION, Ordering::AcqRel) & SLICES {
            self.0.fetch_sub(OPERATION, Ordering::Release);
            return false;
        }
        true
    }

    /// One more hold, for a caller that holds one already (so no slice can be lent).
    pub fn add_hold(&self) {
        self.0.fetch_add(OPERATION, Ordering::AcqRel);
    }

    /// End one hold: the operation's completion has been read.
    pub fn release_hold(&self) {
        self.0.fetch_sub(OPERATION, Ordering::Release);
    }

    /// Lend one slice or copy, unless an operation holds the memory, a poster waits for it, or
    /// 2^24 - 1 loans are out: `false` then, and nothing changed.
    pub fn try_lend(&self) -> bool {
        // A compare-exchange rather than an add: the loans' field must never carry into the
        // waiting posters' (2^24 slices forgotten, `mem::forget`, would otherwise read as one).
        self.add_unless(SLICE, |word| {
            0 != word & (OPERATIONS | WAITERS) || SLICES == word & SLICES
        })
    }

    /// Return one loan.
    pub fn return_lend(&self) {
        self.0.fetch_sub(SLICE, Ordering::Release);
    }

    /// Announce a poster waiting for the loans to end: from now on, until
    /// [`withdraw`](Self::withdraw), every lend is refused. `false`, and nothing changed, when
    /// 255 posters are announced already (lends are refused while they are).
    pub fn try_announce(&self) -> bool {
        self.add_unless(WAITER, |word| WAITERS == word & WAITERS)
    }

    /// Add `unit` to the word by a compare-exchange, unless `refused` says no of the value it
    /// would replace: `false` then, and nothing changed.
    fn add_unless(&self, unit: u64, refused: impl Fn(u64) -> bool) -> bool {
        let mut current = self.0.load(Ordering::Acquire);
        loop {
            if refused(current) {
                return false;
            }
            match self.0.compare_exchange_weak(
                current,
                current + unit,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    /// Withdraw one announcement of [`try_announce`](Self::try_announce): the poster holds the
    /// memory now, or has given up.
    pub fn withdraw(&self) {
        self.0.fetch_sub(WAITER, Ordering::Release);
    }

    /// Whether a slice or copy is lent now (Acquire). A poster that sees one announces itself
    /// before its first [`try_hold`](Self::try_hold), whose add and back-out would otherwise
    /// refuse a lend for an instant before it announced.
    pub fn lent(&self) -> bool {
        0 != self.0.load(Ordering::Acquire) & SLICES
    }

    /// Whether an operation holds the memory now. When it answers `false`, every operation that
    /// held it before has been released, and what it did is visible (Acquire).
    pub fn held(&self) -> bool {
        0 != self.0.load(Ordering::Acquire) & OPERATIONS
    }
}

#[cfg(all(test, not(dma_loom)))]
mod tests {
    use super::*;

    /// The fields at their bounds: no count carries into the next field, whatever a hostile
    /// caller forgets.
    #[test]
    fn every_field_refuses_at_its_bound_and_never_carries() {
        // 2^24 - 1 loans (slices forgotten): the next is refused, and an operation still sees
        // them, not a waiting poster.
        let word = AccessWord(AtomicU64::new(SLICES));
        assert!(!word.try_lend(), "a loan past 2^24 - 1");
        assert_eq!(SLICES, word.0.load(Ordering::Relaxed), "nothing changed");
        assert!(word.lent() && !word.held());
        assert!(!word.try_hold(), "loans out keep an operation off");
        assert_eq!(SLICES, word.0.load(Ordering::Relaxed), "backed out");

        // 255 announced posters: the 256th is refused, and lends are refused while any is.
        let word = AccessWord::new();
        for _ in 0..255 {
            assert!(word.try_announce());
        }
        assert!(!word.try_announce(), "a 256th announcement");
        assert_eq!(WAITERS, word.0.load(Ordering::Relaxed), "nothing carried");
        assert!(!word.try_lend(), "a lend while posters wait");
        assert!(
            word.try_hold(),
            "announced posters do not keep an operation off"
        );
        word.release_hold();
        for _ in 0..255 {
            word.withdraw();
        }
        assert!(word.try_lend(), "lends again once every poster withdrew");
        word.return_lend();
        assert_eq!(0, word.0.load(Ordering::Relaxed));
    }
}
