//! The slab: every operation in flight has a slot, and each slot carries its lifecycle as a
//! [`Stage`]: free, reserved by a poster, posted (what must outlive the operation, [`InFlight`]),
//! delivering, or ready (its completion in the application's queue). The stages follow one owner
//! at a time: the free list hands a slot to the thread that pops it, `fi_*` to the provider, the
//! completion queue to the one thread whose read returned its context, and the ready queue to
//! the thread that takes its completion, which frees it. The slot's `fi_context2` is its first
//! field (`repr(C)`), so a completion names its slot by address.
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

use super::completion::{Completion, Operation};
use super::join::Join;
use super::sink::Sink;
use crate::av::fabric::HandedOut;
use crate::cache::Lease;
use crate::configuration::WriteCompletion;
use crate::endpoint::in_flight::PostedAt;
use crate::endpoint::memory::pool::Pool;
use crate::endpoint::memory::registration::{Keys, OperationHold};
use crate::endpoint::rma::notifications::Notifications;
use crate::endpoint::sends::Sends;
use crate::endpoint::wait::{Source, Waiter};
#[cfg(doc)]
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// The most RMA operations one endpoint keeps in flight, whatever the transmit queue allows.
pub const MAX_OPERATIONS: usize = 4096;

/// How many completions one read of the queue takes.
pub(in crate::endpoint) const BATCH: usize = 16;

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
    /// Where the completion goes (see `sink`).
    pub(in crate::endpoint) sink: Sink,
    /// The joined transfer (a scatter/gather split past the provider's limits, a rail set's
    /// stripes) this operation is one part of: only its last part to complete delivers.
    pub(in crate::endpoint) join: Option<Arc<Join>>,
}

/// Where a slot is in its life (module docs); each stage is owned by one thread at a time.
pub(in crate::endpoint) enum Stage {
    /// On the free list.
    Free,
    /// Taken off the free list by a poster, not yet filled.
    Reserved,
    /// Filled and handed to the provider (or about to be): what must outlive the operation.
    Posted(InFlight),
    /// Its completion has been read: the reading thread is delivering it.
    Delivering,
    /// Its completion waits in the application's ready queue, which frees the slot.
    Ready,
}

/// A slot of the slab: `repr(C)` with the context first, so the context pointer is the slot's.
#[repr(C)]
pub(in crate::endpoint) struct OperationSlot {
    pub(in crate::endpoint) context: UnsafeCell<sys::fi_context2>,
    pub(in crate::endpoint) stage: UnsafeCell<Stage>,
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
    /// How long a wait for a completion or a message calls its attempt back to back before it
    /// sleeps (`Configuration::spin_before_sleep`).
    pub(in crate::endpoint) spin_before_sleep: std::time::Duration,
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
                    stage: UnsafeCell::new(Stage::Free),
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
            spin_before_sleep: std::time::Duration::ZERO,
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
    pub(in crate::endpoint) fn close_abandoned_registrations(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Stage::Posted(operation) = slot.stage.get_mut() {
                operation.region.close_registration();
            }
        }
    }

    /// Drop what the operations still in flight hold: leases and memory. Only once the endpoint
    /// is closed and the provider can no longer touch them.
    pub(in crate::endpoint) fn forget_abandoned(&mut self) -> usize {
        let mut abandoned = 0;
        for slot in self.slots.iter_mut() {
            if let Stage::Posted(_) = std::mem::replace(slot.stage.get_mut(), Stage::Free) {
                abandoned += 1;
            }
            slot.posted_at.clear();
        }
        self.in_flight.store(0, Ordering::Release);
        abandoned
    }
}
