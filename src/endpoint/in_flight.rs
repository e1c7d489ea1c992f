//! How long the RMA operations in flight have been in flight: the oldest one's age, and the
//! operations older than a deadline.
//!
//! Why a server watches the ages, and what reading them guarantees, is on [`OverdueOperation`].
//! How: each slot of the operation slab carries its post time, id, operation, peer and client in
//! atomics of its own ([`PostedAt`]), written by the posting thread before the operation is
//! handed to the provider (the rest, then the time with `Release`) and cleared by the thread that
//! reads its completion, before the slot is free again. A reader reads the time, the rest, and
//! the time again, and skips the slot if the two times differ: a reuse in between changes the
//! time or clears it.

use crate::sync::atomic::{AtomicU8, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

#[cfg(doc)]
use super::LibfabricEndpoint;
use super::engine::Operation;
use dma_libfabric_sys as sys;

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
    /// The id it was posted with (for an operation of the async face or a rail set, the crate's
    /// own token: [`operation`](Self::operation), [`peer`](Self::peer) and
    /// [`client`](Self::client) say what it is).
    pub id: u64,
    /// How long it has been in flight.
    pub age: Duration,
    /// What was posted.
    pub operation: Operation,
    /// The peer's `fi_addr_t` it was posted against; `FI_ADDR_UNSPEC` for a
    /// [`receive_into`](LibfabricEndpoint::receive_into), which names no peer.
    pub peer: u64,
    /// The client its peer was resolved or leased for ([`Peer::client`](crate::cache::Peer::client));
    /// `None` for a receive.
    pub client: Option<u64>,
}

/// A slot's post time and what was posted, readable by any thread. (Public only for the loom
/// model `posted_at`, under `--cfg dma_loom`.)
#[derive(Debug, Default)]
pub struct PostedAt {
    /// Nanoseconds from the slab's `born` to the post, plus one; 0 while the slot is free.
    nanos: AtomicU64,
    id: AtomicU64,
    peer: AtomicU64,
    client: AtomicU64,
    /// The operation ([`Operation`]'s code), and [`HAS_CLIENT`] when `client` holds one.
    operation: AtomicU8,
}

/// In [`PostedAt::operation`]: the slot's `client` is one.
const HAS_CLIENT: u8 = 0x80;

/// What [`PostedAt::read`] gives: the operation's id, the nanoseconds from `born` to its post,
/// and what was posted.
struct Posted {
    id: u64,
    nanos: u64,
    operation: Operation,
    peer: u64,
    client: Option<u64>,
}

impl PostedAt {
    /// The slot's operation `id` (an `operation` to `peer` for `client`) is handed to the
    /// provider now (called by its posting thread, which owns the slot).
    pub(super) fn set(
        &self,
        born: Instant,
        id: u64,
        operation: Operation,
        peer: sys::fi_addr_t,
        client: Option<u64>,
    ) {
        let nanos = u64::try_from(born.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.publish(nanos, id, operation, peer, client);
    }

    /// [`set`](Self::set) at `nanos` from the slab's birth. (Public only for the loom model.)
    pub fn publish(
        &self,
        nanos: u64,
        id: u64,
        operation: Operation,
        peer: sys::fi_addr_t,
        client: Option<u64>,
    ) {
        let code = match operation {
            Operation::Write => 0,
            Operation::Read => 1,
            Operation::Send => 2,
            Operation::Receive => 3,
        };
        // Release fence: a reader whose loads see any of the stores below sees, after its
        // acquire fence, this slot's `clear` (which happened before this post: the slot came
        // off the free list after it), so it does not mix them with the last operation's time.
        fence(Ordering::Release);
        self.id.store(id, Ordering::Relaxed);
        self.peer.store(peer, Ordering::Relaxed);
        self.client.store(client.unwrap_or(0), Ordering::Relaxed);
        let flag = if client.is_some() { HAS_CLIENT } else { 0 };
        self.operation.store(code | flag, Ordering::Relaxed);
        // Release: a reader that sees the time sees what was stored before it.
        self.nanos.store(nanos + 1, Ordering::Release);
    }

    /// The slot's operation is over (completed, or never posted).
    pub fn clear(&self) {
        self.nanos.store(0, Ordering::Release);
    }

    /// The id and post time of the operation in this slot, as [`read`](Self::read) gives them.
    /// (Public only for the loom model.)
    #[cfg(dma_loom)]
    pub fn read_id(&self) -> Option<(u64, u64)> {
        self.read().map(|posted| (posted.id, posted.nanos))
    }

    /// The operation in this slot, if any; `None` too when the slot was reused while it was
    /// read.
    fn read(&self) -> Option<Posted> {
        let before = self.nanos.load(Ordering::Acquire);
        if 0 == before {
            return None;
        }
        let id = self.id.load(Ordering::Relaxed);
        let peer = self.peer.load(Ordering::Relaxed);
        let client = self.client.load(Ordering::Relaxed);
        let code = self.operation.load(Ordering::Relaxed);
        // A reuse in between changes the time (a later post), or clears it. The fence pairs with
        // `set`'s: if a load above saw a later post's store, this load sees its `clear` or its
        // time (a seqlock's read).
        fence(Ordering::Acquire);
        if before != self.nanos.load(Ordering::Relaxed) {
            return None;
        }
        let operation = match code & !HAS_CLIENT {
            0 => Operation::Write,
            1 => Operation::Read,
            2 => Operation::Send,
            _ => Operation::Receive,
        };
        Some(Posted {
            id,
            nanos: before - 1,
            operation,
            peer,
            client: (0 != code & HAS_CLIENT).then_some(client),
        })
    }
}

/// How long the oldest operation of `posted` has been in flight, `elapsed` after the slab's birth
/// (the time every `PostedAt` counts from); `None` when none is.
pub(super) fn oldest_age<'slab>(
    posted: impl Iterator<Item = &'slab PostedAt>,
    elapsed: Duration,
) -> Option<Duration> {
    let now = elapsed.as_nanos();
    posted
        .filter_map(PostedAt::read)
        .map(|posted| posted.nanos)
        .min()
        .map(|posted| {
            Duration::from_nanos(
                u64::try_from(now.saturating_sub(u128::from(posted))).unwrap_or(u64::MAX),
            )
        })
}

/// Append to `out` every operation of `posted` in flight for at least `deadline`, `elapsed`
/// after the slab's birth; how many were appended.
pub(super) fn overdue<'slab>(
    posted: impl Iterator<Item = &'slab PostedAt>,
    elapsed: Duration,
    deadline: Duration,
    out: &mut Vec<OverdueOperation>,
) -> usize {
    let now = elapsed.as_nanos();
    let before = out.len();
    out.extend(posted.filter_map(PostedAt::read).filter_map(|posted| {
        let age = u64::try_from(now.saturating_sub(u128::from(posted.nanos))).ok()?;
        let age = Duration::from_nanos(age);
        (age >= deadline).then_some(OverdueOperation {
            id: posted.id,
            age,
            operation: posted.operation,
            peer: posted.peer,
            client: posted.client,
        })
    }));
    out.len() - before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_slot_reads_nothing_and_a_posted_one_what_was_posted() {
        let born = Instant::now();
        let slot = PostedAt::default();
        assert!(slot.read().is_none());
        for (operation, client) in [
            (Operation::Write, Some(u64::MAX)),
            (Operation::Read, Some(0)),
            (Operation::Send, Some(7)),
            (Operation::Receive, None),
        ] {
            slot.set(born, 42, operation, 9, client);
            let read = slot.read().expect("posted");
            assert_eq!(
                (42, operation, 9, client),
                (read.id, read.operation, read.peer, read.client)
            );
        }
        slot.clear();
        assert!(slot.read().is_none());
    }
}
