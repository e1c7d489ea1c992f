//! How long the RMA operations in flight have been in flight: the oldest one's age, and the
//! operations older than a deadline.
//!
//! Why a server watches the ages, and what reading them guarantees, is on [`OverdueOperation`].
//! How: each slot of the operation slab carries its post time and id in atomics of its own
//! ([`PostedAt`]), written by the posting thread before the operation is handed to the provider
//! (the id, then the time with `Release`) and cleared by the thread that reads its completion,
//! before the slot is free again. A reader reads the time, the id, and the time again, and skips
//! the slot if the two times differ: a reuse in between changes the time or clears it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::LibfabricEndpoint;

/// An RMA operation in flight for longer than a deadline
/// ([`LibfabricEndpoint::overdue_operations`]).
///
/// A [`Lease`](crate::cache::Lease) is held until its operation's completion has been read, and
/// the provider decides when that is. On tcp a peer that was killed answers with a reset within
/// milliseconds, but a peer that is unreachable (a partition, a host that died) answers nothing,
/// and an operation to it stays in flight until the kernel gives the connection up (tcp's
/// retransmission limit, `net.ipv4.tcp_retries2`: about 15 minutes by default); a peer that is
/// alive but stopped keeps its operations in flight for as long as it is stopped. So the age of
/// the operations in flight ([`overdue_operations`](LibfabricEndpoint::overdue_operations),
/// [`oldest_operation_age`](LibfabricEndpoint::oldest_operation_age)) is what a server watches to
/// learn that a peer has stopped answering.
///
/// # Guarantees
///
/// - Reading the ages takes no lock and never touches an operation's memory or lease: each
///   operation's post time and id are kept in atomics of their own, set before the operation is
///   handed to the provider and cleared by the thread that reads its completion.
/// - It is a snapshot: an operation that completes while the operations are scanned may be
///   reported, and one posted meanwhile may be missed. An id is reported with the age of the
///   operation it was posted with (a slot reused during the scan is skipped, not mixed up).
/// - Nothing here cancels or frees anything. An overdue operation still holds its lease, and so
///   its peer's AV entry, and its buffer: the provider may still touch them. What a server does
///   with an overdue operation is its own choice: stop posting to that peer and
///   [`release`](crate::cache::AddressCache::release) it, so that its entry goes as soon as the
///   provider completes what is in flight (`docs/faults.md` has how long that takes, per provider
///   and fault, and the knobs that bound it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverdueOperation {
    /// The id it was posted with.
    pub id: u64,
    /// How long it has been in flight.
    pub age: Duration,
}

/// A slot's post time and id, readable by any thread.
#[derive(Debug, Default)]
pub(super) struct PostedAt {
    /// Nanoseconds from the slab's `born` to the post, plus one; 0 while the slot is free.
    nanos: AtomicU64,
    id: AtomicU64,
}

impl PostedAt {
    /// The slot's operation `id` is handed to the provider now (called by its posting thread,
    /// which owns the slot).
    pub(super) fn set(&self, born: Instant, id: u64) {
        let nanos = u64::try_from(born.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.id.store(id, Ordering::Relaxed);
        // Release: a reader that sees the time sees the id stored before it.
        self.nanos.store(nanos + 1, Ordering::Release);
    }

    /// The slot's operation is over (completed, or never posted).
    pub(super) fn clear(&self) {
        self.nanos.store(0, Ordering::Release);
    }

    /// `(id, nanoseconds from born to the post)` of the operation in this slot, if any; `None`
    /// too when the slot was reused while it was read.
    fn read(&self) -> Option<(u64, u64)> {
        let before = self.nanos.load(Ordering::Acquire);
        if 0 == before {
            return None;
        }
        let id = self.id.load(Ordering::Relaxed);
        // A reuse in between changes the time (a later post), or clears it.
        (before == self.nanos.load(Ordering::Acquire)).then_some((id, before - 1))
    }
}

impl LibfabricEndpoint {
    /// How long the oldest RMA operation in flight has been in flight; `None` when none is. A
    /// snapshot, read without a lock (see [`OverdueOperation`] for what it guarantees).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration { rma: true, ..Configuration::default() }, None)?;
    /// assert_eq!(None, endpoint.oldest_operation_age());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn oldest_operation_age(&self) -> Option<Duration> {
        let operations = &self.operations;
        let now = operations.born.elapsed().as_nanos();
        operations
            .posted_at()
            .filter_map(PostedAt::read)
            .map(|(_, posted)| posted)
            .min()
            .map(|posted| {
                Duration::from_nanos(
                    u64::try_from(now.saturating_sub(u128::from(posted))).unwrap_or(u64::MAX),
                )
            })
    }

    /// Append to `out` every RMA operation that has been in flight for at least `deadline`, and
    /// return how many were appended. The operations stay in flight (this call only reports
    /// them): the caller decides what an overdue peer means to it. A snapshot, read without a
    /// lock; [`OverdueOperation`] says why a server watches it, and what it guarantees.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration { rma: true, ..Configuration::default() }, None)?;
    /// let mut overdue = Vec::new();
    /// endpoint.overdue_operations(Duration::from_secs(5), &mut overdue);
    /// for operation in &overdue {
    ///     println!("operation {} in flight for {:?}", operation.id, operation.age);
    /// }
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn overdue_operations(&self, deadline: Duration, out: &mut Vec<OverdueOperation>) -> usize {
        let operations = &self.operations;
        let now = operations.born.elapsed().as_nanos();
        let before = out.len();
        out.extend(
            operations
                .posted_at()
                .filter_map(PostedAt::read)
                .filter_map(|(id, posted)| {
                    let age = u64::try_from(now.saturating_sub(u128::from(posted))).ok()?;
                    let age = Duration::from_nanos(age);
                    (age >= deadline).then_some(OverdueOperation { id, age })
                }),
        );
        out.len() - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_slot_reads_nothing_and_a_posted_one_its_id() {
        let born = Instant::now();
        let slot = PostedAt::default();
        assert_eq!(None, slot.read());
        slot.set(born, 42);
        assert_eq!(Some(42), slot.read().map(|(id, _)| id));
        slot.clear();
        assert_eq!(None, slot.read());
    }
}
