//! The slab of RMA operations in flight (see the parent module's docs, "Operations in flight"):
//! what an operation is ([`Operation`]), what its completion says ([`Completion`]), what its slot
//! holds until that completion has been read ([`InFlight`]), and who receives it (the application,
//! or a [`CompletionOwner`]; a transfer posted in parts delivers one completion through its
//! [`Join`]).
//!
//! Its own room, below everything that posts or reaps: `rma` posts into it, `vectored` posts parts
//! of joined transfers into it, and `completions` reaps it, each importing it and not each other.
//!
//! # Bounds
//!
//! At most [`MAX_OPERATIONS`] slots, fewer where the transmit queue or the completion queue is
//! smaller; the ready queue holds only completions of slots not yet freed, so it is bounded by the
//! slab too.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::notifications::Notifications;
use crate::av::fabric::HandedOut;
use crate::cache::Lease;
use crate::configuration::WriteCompletion;
#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::in_flight::PostedAt;
use crate::endpoint::memory::pool::Pool;
use crate::endpoint::memory::registration::{Keys, OperationHold};
use crate::endpoint::sends::Sends;
use crate::endpoint::wait::{Source, Waiter};
use crate::error::DmaError;
use crate::sync::lock;
use dma_libfabric_sys as sys;

/// The most RMA operations one endpoint keeps in flight, whatever the transmit queue allows.
pub const MAX_OPERATIONS: usize = 4096;

/// How many completions one read of the queue takes.
pub(in crate::endpoint) const BATCH: usize = 16;

/// Which operation a completion is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// An `fi_write`: local memory into a peer's.
    Write,
    /// An `fi_read`: a peer's memory into local memory.
    Read,
    /// An `fi_send` of registered memory ([`LibfabricEndpoint::send_from`]).
    Send,
    /// An `fi_recv` into registered memory ([`LibfabricEndpoint::receive_into`]); its
    /// completion's `len` is the length received.
    Receive,
}

impl Operation {
    /// The libfabric call that posts it.
    pub fn call(self) -> &'static str {
        match self {
            Self::Write => "fi_write",
            Self::Read => "fi_read",
            Self::Send => "fi_send",
            Self::Receive => "fi_recv",
        }
    }
}

/// The completion of one RMA operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The id the caller chose when posting.
    pub id: u64,
    /// What was posted.
    pub operation: Operation,
    /// How many bytes were to be transferred; for a [`receive_into`](LibfabricEndpoint::receive_into),
    /// how many were received.
    pub len: usize,
    /// Who sent a [`receive_into`](LibfabricEndpoint::receive_into)'s message: the sender's index
    /// in this endpoint's address vector, as [`Received::sender`](crate::endpoint::Received::sender)
    /// says (on a credited endpoint the sender that proved its secret, on a plain one the index
    /// the provider names); `None` for every other operation.
    pub sender: Option<sys::fi_addr_t>,
    /// `Ok` when the transfer is complete: for a read, its bytes are here; for a write, the
    /// target holds them (under the default
    /// [`WriteCompletion::Delivered`](crate::configuration::WriteCompletion::Delivered); under
    /// `Local`, the provider has sent them, and on tcp they land when the target progresses); [`DmaError::PeerUnreachable`] naming the peer's `fi_addr_t` when the provider
    /// says its connection was refused, reset or lost (tcp's provider errors `ECONNREFUSED`,
    /// `ECONNRESET`, `ECONNABORTED`, `ENOTCONN`, `EPIPE`, `EHOSTDOWN`, `EHOSTUNREACH`,
    /// `ENETUNREACH`, `ESHUTDOWN`, `ETIMEDOUT`: the one list of `av::unreachable`); the
    /// error entry's detail otherwise ([`DmaError::Fabric`] naming the operation's call, whose
    /// `code` is the negative `FI_E*` error, `-FI_ECANCELED` for a cancelled one, and whose
    /// message has the provider's own text from `fi_cq_strerror`).
    pub result: Result<(), DmaError>,
}

/// One operation in flight: what must outlive it.
pub(in crate::endpoint) struct InFlight {
    pub(in crate::endpoint) id: u64,
    pub(in crate::endpoint) operation: Operation,
    pub(in crate::endpoint) len: usize,
    /// Held for its `Drop`, which runs when the completion has been read. `None` only for
    /// [`LibfabricEndpoint::write_unleased`].
    #[allow(dead_code)]
    pub(in crate::endpoint) lease: Option<Lease<'static>>,
    pub(in crate::endpoint) region: OperationHold,
    /// The peer it was posted to, for [`DmaError::PeerUnreachable`].
    pub(in crate::endpoint) fi_addr: sys::fi_addr_t,
    /// The client its peer was resolved for, for [`DmaError::PeerUnreachable`]; `None` for a
    /// post to a raw index.
    pub(in crate::endpoint) client: Option<u64>,
    /// `fi_addr`'s incarnation when it was posted: a connection-lost completion marks the peer
    /// dead only if the index still holds it (see `av::unreachable`).
    pub(in crate::endpoint) incarnation: u32,
    /// Who receives the completion: the application's ready queue when `None`, else the crate's
    /// own party that posted it (see `completions`, "Routing").
    pub(in crate::endpoint) owner: Option<Owner>,
    /// The joined transfer (a scatter/gather split past the provider's limits) this operation is
    /// one part of: only its last part to complete delivers a completion.
    pub(in crate::endpoint) join: Option<Arc<Join>>,
}

/// A slot of the slab: `repr(C)` with the context first, so the context pointer is the slot's.
#[repr(C)]
pub(in crate::endpoint) struct OperationSlot {
    pub(in crate::endpoint) context: UnsafeCell<sys::fi_context2>,
    pub(in crate::endpoint) operation: UnsafeCell<Option<InFlight>>,
    /// When its operation was posted, for any thread to read (see `in_flight`).
    pub(in crate::endpoint) posted_at: PostedAt,
}

/// The slab of operation slots and the queues that hand them around.
pub(in crate::endpoint) struct Operations {
    pub(in crate::endpoint) slots: Box<[OperationSlot]>,
    pub(in crate::endpoint) free: Mutex<Vec<usize>>,
    pub(in crate::endpoint) ready: Mutex<VecDeque<(usize, Completion)>>,
    /// Posted and not yet reaped.
    pub(in crate::endpoint) in_flight: AtomicUsize,
    /// The threads waiting for completions (see `wait`).
    pub(in crate::endpoint) waiter: Waiter,
    /// The completion queues' wait descriptors; `None` where the endpoint polls.
    source: Option<Source>,
    /// The time every slot's `posted_at` counts from.
    pub(in crate::endpoint) born: Instant,
    /// The keys registrations request where the provider does not choose them (see `memory`,
    /// "Keys").
    pub(in crate::endpoint) keys: Keys,
    /// The memory of dropped regions (see `memory`, "parking"): dropped with the slab, after the
    /// endpoint's handles have closed.
    pub(in crate::endpoint) pool: Arc<Pool>,
    /// `domain_attr.mr_mode`.
    pub(in crate::endpoint) mr_mode: i32,
    /// The flags every write is posted with (`Configuration::write_completion`).
    pub(in crate::endpoint) write_flags: u64,
    pub(in crate::endpoint) enabled: bool,
    /// Remote writes' data read from the receive queue (see `vectored`), at most `cq_size`.
    pub(in crate::endpoint) notifications: Notifications,
    /// Sends in flight, whose completions share the transmit queue (see `sends`).
    pub(in crate::endpoint) sends: Sends,
    /// `receive_into`s posted and not completed: while any is, `progress` reads the receive
    /// queue too (see `messages`).
    pub(in crate::endpoint) receives_into: AtomicUsize,
    /// The AV's record, whose `unreachable` marks the peers an operation's completion reported
    /// gone (see `completions`), and whose marks [`LibfabricEndpoint::submit`] refuses.
    pub(in crate::endpoint) peers: Arc<HandedOut>,
}

// SAFETY: a slot's cells are touched only by the one thread that owns the slot at the time
// (module docs: the free list, the provider and the completion queue hand it over, each a
// synchronising hand-off); everything else is a mutex or an atomic.
unsafe impl Sync for Operations {}
// SAFETY: the slab owns plain memory and `Send` leases and `Arc`s.
unsafe impl Send for Operations {}

impl Operations {
    /// The slab for an endpoint opened with `info`: none unless `enabled` (the configuration
    /// asked for RMA), else as many slots as the transmit queue and the completion queue hold.
    ///
    /// # Safety
    /// `info` is the non-null `fi_info` the endpoint was opened with, `source` the wait
    /// descriptors of its queues, if they have any, `sends` the send slab sharing its
    /// transmit queue, and `peers` the record of its AV.
    pub(in crate::endpoint) unsafe fn new(
        info: *const sys::fi_info,
        enabled: bool,
        cq_size: usize,
        source: Option<Source>,
        sends: Sends,
        peers: Arc<HandedOut>,
    ) -> Self {
        // SAFETY: fi_getinfo fills every attribute pointer of the entries it returns.
        let (mr_mode, tx_size) =
            unsafe { ((*(*info).domain_attr).mr_mode, (*(*info).tx_attr).size) };
        let count = if enabled {
            tx_size.min(cq_size).clamp(1, MAX_OPERATIONS)
        } else {
            0
        };
        Self {
            slots: (0..count)
                .map(|_| OperationSlot {
                    context: UnsafeCell::new(sys::fi_context2::default()),
                    operation: UnsafeCell::new(None),
                    posted_at: PostedAt::default(),
                })
                .collect(),
            free: Mutex::new((0..count).rev().collect()),
            ready: Mutex::new(VecDeque::new()),
            in_flight: AtomicUsize::new(0),
            waiter: Waiter::default(),
            source,
            born: Instant::now(),
            keys: Keys::new(),
            pool: Arc::new(Pool::default()),
            mr_mode,
            write_flags: WriteCompletion::default().flags(),
            enabled,
            notifications: Notifications::new(cq_size),
            sends,
            receives_into: AtomicUsize::new(0),
            peers,
        }
    }

    /// Every slot's post time (`in_flight`).
    pub(in crate::endpoint) fn posted_at(&self) -> impl Iterator<Item = &PostedAt> {
        self.slots.iter().map(|slot| &slot.posted_at)
    }

    /// What a wait sleeps on: nothing where the endpoint polls.
    pub(in crate::endpoint) fn sources(&self) -> &[Source] {
        self.source.as_slice()
    }

    /// The slot whose context is `context`, if it is one of ours: addresses only, nothing is
    /// dereferenced.
    pub(in crate::endpoint) fn index_of(&self, context: *mut c_void) -> Option<usize> {
        let start = self.slots.as_ptr() as usize;
        let offset = (context as usize).checked_sub(start)?;
        let size = std::mem::size_of::<OperationSlot>();
        let index = offset / size;
        (0 == offset % size && index < self.slots.len()).then_some(index)
    }

    /// Close the registrations of the operations still in flight. Their memory stays allocated.
    pub(super) fn close_abandoned_registrations(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Some(operation) = slot.operation.get_mut() {
                operation.region.close_registration();
            }
        }
    }

    /// Drop what the operations still in flight hold: leases and memory. Only once the endpoint
    /// is closed and the provider can no longer touch them.
    pub(super) fn forget_abandoned(&mut self) -> usize {
        let mut abandoned = 0;
        for slot in self.slots.iter_mut() {
            if slot.operation.get_mut().take().is_some() {
                abandoned += 1;
            }
            slot.posted_at.clear();
        }
        self.in_flight.store(0, Ordering::Release);
        abandoned
    }
}

/// Who receives the completions of the operations the crate posts for itself.
pub(crate) trait CompletionOwner: Send + Sync {
    /// The operation posted with `completion.id` as its token has completed; its lease and
    /// buffer have been dropped and its slot freed. Called by whichever thread read the
    /// completion, with no lock of the endpoint held.
    fn completed(&self, completion: Completion);
}

/// An owner shared with the slots of its operations in flight.
pub(crate) type Owner = Arc<dyn CompletionOwner>;
/// A transfer split into parts: the last part to complete delivers its completion.
pub(in crate::endpoint) struct Join {
    /// Parts not yet completed (or given up).
    remaining: AtomicUsize,
    /// The whole transfer's length.
    len: usize,
    /// The first part's error.
    error: Mutex<Option<DmaError>>,
}

impl Join {
    pub(in crate::endpoint) fn new(parts: usize, len: usize) -> Arc<Self> {
        Arc::new(Self {
            remaining: AtomicUsize::new(parts),
            len,
            error: Mutex::new(None),
        })
    }

    /// Keep the first error.
    pub(in crate::endpoint) fn record(&self, result: Result<(), DmaError>) {
        if let Err(error) = result {
            let mut first = lock(&self.error);
            first.get_or_insert(error);
        }
    }

    /// Count `parts` parts done: `true` for the one caller that counts the last.
    pub(in crate::endpoint) fn finish(&self, parts: usize) -> bool {
        // AcqRel: every part's `record` happens before the last one's `completion`.
        parts == self.remaining.fetch_sub(parts, Ordering::AcqRel)
    }

    /// The joined completion: for the caller `finish` answered `true`.
    pub(in crate::endpoint) fn completion(&self, id: u64, operation: Operation) -> Completion {
        let error = lock(&self.error).take();
        Completion {
            id,
            operation,
            len: self.len,
            sender: None,
            result: error.map_or(Ok(()), Err),
        }
    }
}

/// One part of a joined transfer, as [`LibfabricEndpoint::submit`] posts it.
pub(in crate::endpoint) struct JoinPart {
    pub(in crate::endpoint) join: Arc<Join>,
    /// This part and those after it: what is given up if this one fails to post.
    pub(in crate::endpoint) unposted: usize,
    /// Whether no part was posted before this one.
    pub(in crate::endpoint) first: bool,
}
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;

    /// Three parts, the third given up when it failed to post (after the first two were posted):
    /// whichever counts last, the posting thread giving up or the last part completing, delivers
    /// one completion, with the whole length and the first error.
    #[test]
    fn a_join_delivers_once_with_the_first_error_whoever_counts_last() {
        let failed = || DmaError::fabric("fi_write", -i64::from(sys::FI_EIO));
        // The parts complete first, then the poster gives the third up.
        let join = Join::new(3, 300);
        join.record(Ok(()));
        assert!(!join.finish(1));
        join.record(Ok(()));
        assert!(!join.finish(1));
        join.record(Err(failed()));
        assert!(join.finish(1), "the poster counts last: it delivers");
        let completion = join.completion(9, Operation::Write);
        assert_eq!((9, 300), (completion.id, completion.len));
        assert!(completion.result.is_err());

        // The poster gives up the last two parts first; the one posted part delivers.
        let join = Join::new(3, 300);
        join.record(Err(failed()));
        assert!(!join.finish(2));
        join.record(Err(DmaError::WouldBlock)); // a later error is not the one reported
        assert!(join.finish(1));
        let completion = join.completion(9, Operation::Read);
        assert!(matches!(completion.result, Err(DmaError::Fabric { .. })));

        // Every part fine: Ok.
        let join = Join::new(2, 8);
        join.record(Ok(()));
        assert!(!join.finish(1));
        join.record(Ok(()));
        assert!(join.finish(1));
        assert_eq!(Ok(()), join.completion(1, Operation::Write).result);
    }
}
