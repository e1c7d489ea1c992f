//! Who may touch a `Local` region's bytes now: the holds of this endpoint's operations, the
//! slices lent out ([`MemoryRegion::as_slice`]), the copies (`read_bytes`) and the posters
//! waiting for them, all kept in the memory's access word (`access.rs`) on the registration that
//! owns the memory (its keeper).
//!
//! Fairness (`access.rs`): a post that finds slices or copies lent announces itself in the
//! access word and waits for them, within its patience, while new loans are refused, so threads
//! that keep borrowing cannot keep it out. See `hold`.

use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use super::MemoryRegion;
use super::registration::{OperationHold, Registration};
use crate::endpoint::access::AccessWord;
use crate::endpoint::deadline::Deadline;
use crate::error::DmaError;

/// How many times a waiting poster yields before it sleeps: a copy (`read_bytes`) ends within a
/// `memcpy`, so most waits end here.
const YIELDS: u32 = 64;
/// The first sleep after the yields, doubled each round up to [`LONGEST_SLEEP`].
const FIRST_SLEEP: Duration = Duration::from_micros(1);
/// The longest sleep of a waiting poster: how late, at most, it notices the last slice returned.
const LONGEST_SLEEP: Duration = Duration::from_millis(1);

impl Registration {
    /// Hold the memory for one operation, until the returned hold drops (when the operation's
    /// completion has been read).
    ///
    /// While slices ([`MemoryRegion::as_slice`]) or `read_bytes` copies are lent, the poster
    /// waits for them to be returned, until `deadline` (the operation's patience): it announces
    /// itself in the access word first, and while it waits new loans, slices and copies alike,
    /// are refused, so threads that keep borrowing cannot keep it out. It waits only for the
    /// loans out when it announced. It yields, then sleeps in doubling steps of at most a
    /// millisecond; it takes nothing else (no slot, no budget) while it waits.
    ///
    /// # Errors
    /// [`DmaError::Busy`] when a loan was still out at `deadline` (a slice the application kept,
    /// possibly on the posting thread itself): nothing is held then. A deadline already passed
    /// tries once.
    pub(crate) fn hold(self: &Arc<Self>, deadline: Deadline) -> Result<OperationHold, DmaError> {
        let counted = self.lends_slices();
        let access = &self.keeper().access;
        if counted && (access.lent() || !access.try_hold()) {
            wait_out_loans(access, deadline)?;
        }
        Ok(OperationHold {
            region: Arc::clone(self),
            counted,
        })
    }

    /// Lend one shared slice ([`MemoryRegion::as_slice`]): [`DmaError::Busy`] while an operation
    /// holds the memory or a poster waits for it.
    pub(crate) fn lend_slice(&self) -> Result<(), DmaError> {
        if self.keeper().access.try_lend() {
            Ok(())
        } else {
            Err(DmaError::Busy)
        }
    }

    /// Give back a slice lent by [`lend_slice`](Self::lend_slice).
    pub(crate) fn return_slice(&self) {
        self.keeper().access.return_lend();
    }

    /// Lend the memory for one copy (`read_bytes`): [`DmaError::Busy`] while an operation holds
    /// it or a poster waits for it.
    pub(crate) fn lend_copy(&self) -> Result<(), DmaError> {
        self.lend_slice()
    }

    /// Give back a loan of [`lend_copy`](Self::lend_copy).
    pub(crate) fn return_copy(&self) {
        self.keeper().access.return_lend();
    }

    /// Whether an operation holds the memory now (Acquire: when not, every completed
    /// operation's bytes are visible).
    pub(crate) fn operations_hold(&self) -> bool {
        self.keeper().access.held()
    }
}

/// Hold `access` once the loans out now are returned, refusing new loans meanwhile, until
/// `deadline`: `Busy` then, the announcement withdrawn and nothing held.
///
/// Bounded by the loans out at the announcement (see `access.rs`, "Fairness"); a poster that
/// found 255 announced already retries its announcement each round, and is kept out meanwhile
/// only by loans made before one of the others announced.
fn wait_out_loans(access: &AccessWord, deadline: Deadline) -> Result<(), DmaError> {
    struct Announced<'a>(&'a AccessWord, bool);
    impl Drop for Announced<'_> {
        fn drop(&mut self) {
            if self.1 {
                self.0.withdraw();
            }
        }
    }
    let mut announced = Announced(access, false);
    let mut round = 0_u32;
    let mut sleep = FIRST_SLEEP;
    loop {
        announced.1 = announced.1 || access.try_announce();
        if access.try_hold() {
            return Ok(());
        }
        if deadline.passed() {
            return Err(DmaError::Busy);
        }
        if round < YIELDS {
            round += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(deadline.remaining().map_or(sleep, |left| left.min(sleep)));
            sleep = (sleep * 2).min(LONGEST_SLEEP);
        }
    }
}
