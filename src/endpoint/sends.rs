//! Sends in flight: every message [`send`](super::LibfabricEndpoint::send) takes is copied into a
//! slot of the endpoint's own, posted with `fi_send` (never `fi_inject`, which asks for no
//! completion and so hides a failure), and counted until its completion has been read. Here too
//! are the posts themselves: `try_send` (a slot), and `try_inject`, the opt-in
//! [`inject_within`](super::LibfabricEndpoint::inject_within), which takes no slot: the
//! provider copies the message and reports nothing of it, on tcp (1.17 and 2.6.0) not even its
//! failure (the provider logs "inject transfer failed" and writes no error entry).
//!
//! # Bounds
//!
//! The slab's size, and so the memory sends hold whatever a peer does, is stated for users on
//! [`send_within`](super::LibfabricEndpoint::send_within) ("Bounded, and never lost without an
//! error"): as many slots as the transmit queue and its completion queue hold, at most
//! [`MAX_SENDS`], each of [`MAX_SEND_COPY`] bytes at most, in one zeroed allocation made at
//! `open`. What one peer may hold is its budget (`budget`), shared with the RMA operations.
//!
//! # Ownership of a slot
//!
//! As for receive slots and RMA operations: a slot on the free list is the list's; the thread
//! that pops it owns it until `fi_send` accepts it, then the provider does, then the one thread
//! whose `fi_cq_read` returned its completion, which puts it back on the free list. The context
//! is the slot's first field (`repr(C)`), so a completion names its slot by address.
//!
//! # Failures
//!
//! A completion with an error is counted, logged, and marks its peer unreachable when its code
//! says the peer is gone (`av::unreachable`); what a user sees of it is on
//! [`send_within`](super::LibfabricEndpoint::send_within).

use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::LibfabricEndpoint;
use super::budget::PeerBudget;
use super::credits::What;
use super::credits::flow;
use super::credits::wire::CONTROL_SIZE;
use super::error_entry::ErrorEntry;
use crate::av::fabric::HandedOut;
use crate::av::unreachable::says_peer_is_gone;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// The most sends one endpoint keeps in flight, whatever its transmit queue allows.
pub const MAX_SENDS: usize = 16_384;

/// The largest message [`send`](super::LibfabricEndpoint::send) copies, whatever
/// `receive_size` is: larger ones go from registered memory
/// ([`send_from`](super::LibfabricEndpoint::send_from)).
pub const MAX_SEND_COPY: usize = 64 << 10;

/// Sends discarded by endpoints dropped with sends still in flight, in this process.
pub(super) static DISCARDED: AtomicU64 = AtomicU64::new(0);

/// One send in flight: `repr(C)` with the context first, so the context pointer is the slot's.
#[repr(C)]
struct SendSlot {
    context: UnsafeCell<sys::fi_context2>,
    /// The peer it was posted to, and that index's incarnation then (see `unreachable`).
    fi_addr: AtomicU64,
    incarnation: AtomicU32,
    /// Whether the send took from its peer's budget (a control message of the credit protocol
    /// does not).
    counted: AtomicBool,
}

/// The slab of send slots and their buffers.
pub(super) struct Sends {
    slots: Box<[SendSlot]>,
    /// `slots.len()` buffers of `stride` bytes, slot `i`'s at `i * stride`.
    buffers: UnsafeCell<Box<[u8]>>,
    /// The largest message of the application's a slot takes.
    size: usize,
    /// A slot's bytes: `size`, and at least a control message's.
    stride: usize,
    free: Mutex<Vec<usize>>,
    /// Posted, completion not yet read.
    outstanding: AtomicUsize,
    /// What each peer incarnation has in flight, of sends and of the RMA operations that share
    /// the transmit queue (`rma::Operations` holds these sends and takes from the same budget).
    pub(super) budget: PeerBudget,
    /// Completed with an error.
    failed: AtomicU64,
    /// The AV's record, whose `unreachable` marks dead peers.
    peers: Arc<HandedOut>,
}

// SAFETY: a slot's context and buffer are touched only by the thread that owns the slot (module
// docs: the free list's mutex and the completion queue hand it over); the rest is atomics and a
// mutex.
unsafe impl Sync for Sends {}
// SAFETY: plain memory, atomics and an `Arc` of a `Sync` record.
unsafe impl Send for Sends {}

impl Sends {
    /// `count` slots (clamped to 1..=[`MAX_SENDS`]) of `size` bytes each, for an AV of
    /// `av_capacity` entries whose peers may each have `per_peer` operations in flight.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] naming the sizes when the buffers cannot be allocated.
    pub(super) fn new(
        count: usize,
        size: usize,
        av_capacity: usize,
        per_peer: usize,
        peers: Arc<HandedOut>,
    ) -> Result<Self, DmaError> {
        let count = count.clamp(1, MAX_SENDS);
        let size = size.clamp(1, MAX_SEND_COPY);
        let stride = size.max(CONTROL_SIZE);
        let buffers = count
            .checked_mul(stride)
            .and_then(super::receive::zeroed)
            .ok_or_else(|| {
                DmaError::InvalidArgument(format!(
                    "{count} send buffers of {size} bytes cannot be allocated: lower \
                     Configuration::tx_size or Configuration::receive_size"
                ))
            })?;
        Ok(Self {
            slots: (0..count)
                .map(|_| SendSlot {
                    context: UnsafeCell::new(sys::fi_context2::default()),
                    fi_addr: AtomicU64::new(0),
                    incarnation: AtomicU32::new(0),
                    counted: AtomicBool::new(true),
                })
                .collect(),
            buffers: UnsafeCell::new(buffers),
            size,
            stride,
            free: Mutex::new((0..count).rev().collect()),
            outstanding: AtomicUsize::new(0),
            budget: PeerBudget::new(av_capacity, per_peer),
            failed: AtomicU64::new(0),
            peers,
        })
    }

    /// The largest message a slot holds.
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// How many slots there are: the most sends in flight.
    pub(super) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Posted and not yet completed.
    pub(super) fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Completed with an error.
    pub(super) fn failures(&self) -> u64 {
        self.failed.load(Ordering::Acquire)
    }

    /// The code `fi_addr` was marked dead with, if it was.
    pub(super) fn dead(&self, fi_addr: sys::fi_addr_t) -> Option<u32> {
        self.peers.unreachable.dead(fi_addr)
    }

    /// Mark `fi_addr`'s current incarnation dead with `code`.
    pub(super) fn mark_dead(&self, fi_addr: sys::fi_addr_t, code: u32) {
        let incarnation = self.peers.unreachable.incarnation(fi_addr);
        self.peers.unreachable.mark(fi_addr, incarnation, code);
    }

    /// The most sends one peer may have in flight: its budget, within the slots.
    pub(super) fn peer_limit(&self) -> usize {
        self.budget.limit().min(self.slots.len())
    }

    /// A free slot holding a copy of `message` for `fi_addr`, ready to post: its buffer and
    /// context. `None` when every slot is in flight, or the peer has its budget in flight.
    /// `message` is at most [`size`](Self::size).
    pub(super) fn prepare(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
    ) -> Option<(usize, *mut c_void, *mut c_void)> {
        debug_assert!(message.len() <= self.size);
        let incarnation = self.peers.unreachable.incarnation(fi_addr);
        if !self.budget.take(fi_addr, incarnation, false) {
            return None;
        }
        let prepared = self.fill(fi_addr, incarnation, message, true);
        if prepared.is_none() {
            self.budget.give_back(fi_addr, incarnation);
        }
        prepared
    }

    /// A free slot holding a copy of the control message `message` (at most
    /// [`CONTROL_SIZE`] bytes) for `fi_addr`, outside its budget: the credit protocol's own
    /// messages must go out while the application's wait for them. `None` when every slot is in
    /// flight.
    pub(super) fn prepare_control(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
    ) -> Option<(usize, *mut c_void, *mut c_void)> {
        debug_assert!(message.len() <= CONTROL_SIZE);
        let incarnation = self.peers.unreachable.incarnation(fi_addr);
        self.fill(fi_addr, incarnation, message, false)
    }

    /// Pop a free slot and copy `message` into it, for `fi_addr` of `incarnation`.
    fn fill(
        &self,
        fi_addr: sys::fi_addr_t,
        incarnation: u32,
        message: &[u8],
        counted: bool,
    ) -> Option<(usize, *mut c_void, *mut c_void)> {
        let index = crate::sync::lock(&self.free).pop()?;
        let slot = &self.slots[index];
        slot.fi_addr.store(fi_addr, Ordering::Relaxed);
        slot.incarnation.store(incarnation, Ordering::Relaxed);
        slot.counted.store(counted, Ordering::Relaxed);
        let len = message.len().min(self.stride);
        // SAFETY: the box is never replaced; the slot's range `index * stride ..` lies inside it
        // (`count * stride` bytes), and this thread owns the slot, so nothing else touches those
        // bytes; at most `stride` bytes are copied, from `message`, which does not overlap the
        // slab.
        let buffer = unsafe {
            let start = (*self.buffers.get()).as_mut_ptr().add(index * self.stride);
            std::ptr::copy_nonoverlapping(message.as_ptr(), start, len);
            start
        };
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        Some((index, buffer.cast(), slot.context.get().cast()))
    }

    /// Slot `index`, which [`prepare`](Self::prepare) gave and the provider refused, is free
    /// again.
    pub(super) fn unprepare(&self, index: usize) {
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.release(index);
    }

    /// Slot `index`, owned by the caller, is free again, and its peer has one send fewer.
    fn release(&self, index: usize) {
        let slot = &self.slots[index];
        if slot.counted.load(Ordering::Relaxed) {
            self.budget.give_back(
                slot.fi_addr.load(Ordering::Relaxed),
                slot.incarnation.load(Ordering::Relaxed),
            );
        }
        crate::sync::lock(&self.free).push(index);
    }

    /// The slot whose context is `context`, if it is one of ours: addresses only.
    fn index_of(&self, context: *mut c_void) -> Option<usize> {
        let start = self.slots.as_ptr() as usize;
        let offset = (context as usize).checked_sub(start)?;
        let size = std::mem::size_of::<SendSlot>();
        let index = offset / size;
        (0 == offset % size && index < self.slots.len()).then_some(index)
    }

    /// The successful completion of the transmit whose context is `context`, read by this
    /// thread: a send's frees its slot. Returns whether it was a send.
    pub(super) fn completed(&self, context: *mut c_void) -> bool {
        let Some(index) = self.index_of(context) else {
            return false;
        };
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.release(index);
        true
    }

    /// The error completion `entry` of a transmit that is not an RMA operation, read by this
    /// thread: a send's is counted, logged with its peer, marks the peer dead when its code (or
    /// the provider's, an errno on tcp: rxm reports a send on a dropped connection as
    /// `FI_ECANCELED` with `ENOTCONN`) says the peer is gone, and frees its slot. Anything else is
    /// logged. Returns whether it was a send.
    pub(super) fn failed(&self, entry: &ErrorEntry) -> bool {
        let error = entry.error("fi_send");
        let Some(index) = self.index_of(entry.op_context) else {
            tracing::warn!(%error, "transmit failed");
            return false;
        };
        let slot = &self.slots[index];
        let fi_addr = slot.fi_addr.load(Ordering::Relaxed);
        self.failed.fetch_add(1, Ordering::AcqRel);
        let gone = [entry.err, entry.prov_errno]
            .into_iter()
            .filter_map(|code| u32::try_from(code).ok())
            .find(|&code| says_peer_is_gone(code));
        let marked = gone.is_some_and(|code| {
            self.peers
                .unreachable
                .mark(fi_addr, slot.incarnation.load(Ordering::Relaxed), code)
        });
        tracing::warn!(
            peer = fi_addr,
            %error,
            marked_unreachable = marked,
            "a send failed: the message was not delivered"
        );
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        self.release(index);
        true
    }
}

/// The error a send to `fi_addr` (for `client`, if a peer named one), marked dead with `code`,
/// answers.
pub(super) fn unreachable(fi_addr: sys::fi_addr_t, client: Option<u64>, code: u32) -> DmaError {
    DmaError::PeerUnreachable {
        peer: fi_addr,
        client,
        reason: format!(
            "the provider reported {} (error {code}) for an earlier transmit to it; it is \
             reachable again once resolved anew",
            crate::error::strerror(code.into())
        ),
    }
}

/// One attempt to send a copy of `message` to `fi_addr` through a send slot (what
/// [`try_send_raw`](LibfabricEndpoint::try_send_raw) does): the size, the peer's mark and its
/// credit checked, a slot filled and posted, and everything given back if the provider refuses.
///
/// # Safety
/// As [`send_raw`](LibfabricEndpoint::send_raw): `fi_addr` is a live entry of the endpoint's AV
/// for the whole call.
pub(super) unsafe fn try_send(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    message: &[u8],
) -> Result<(), DmaError> {
    let sends = &endpoint.operations.sends;
    if message.len() > sends.size() {
        return Err(DmaError::InvalidArgument(format!(
            "a {}-byte message exceeds the {} bytes send copies (Description::max_send_size): \
             send larger ones from registered memory with send_from",
            message.len(),
            sends.size()
        )));
    }
    if let Some(code) = sends.dead(fi_addr) {
        return Err(unreachable(fi_addr, None, code));
    }
    // Credit first (a credited endpoint's peer must have granted room for it); given back if
    // nothing is posted.
    let credit = flow::take_credit(endpoint, fi_addr, What::Message(message.len()))?;
    // Past the transmit queue's depth: nothing is posted.
    let Some((index, buffer, context)) = sends.prepare(fi_addr, message) else {
        flow::give_back_credit(endpoint, credit);
        return Err(DmaError::WouldBlock);
    };
    // SAFETY: the endpoint is open; the caller promises `fi_addr` is a live entry of this AV;
    // `buffer` is the slot's copy of `message`, which stays untouched until the slot's
    // completion is read (the slot is the provider's until then), and `context` is the slot's,
    // which lives as long as the endpoint's handles (the slab is dropped after them). No
    // descriptor: `open` refuses providers that require FI_MR_LOCAL.
    let code = unsafe {
        flow::post_send(
            endpoint,
            buffer.cast_const(),
            message.len(),
            std::ptr::null_mut(),
            fi_addr,
            context,
        )
    };
    if 0 == code {
        return Ok(());
    }
    // Not posted: the slot is still this thread's.
    sends.unprepare(index);
    flow::give_back_credit(endpoint, credit);
    Err(refused(endpoint, fi_addr, "fi_send", code))
}

/// The largest message [`try_inject`] takes on `endpoint`: the provider's inject size, within
/// what a receiver's buffer holds ([`Description::max_send_size`](super::Description::max_send_size)).
pub(super) fn inject_limit(endpoint: &LibfabricEndpoint) -> usize {
    endpoint
        .description
        .inject_size
        .min(endpoint.operations.sends.size())
}

/// One attempt to inject `message` to `fi_addr` (what
/// [`try_inject`](LibfabricEndpoint::try_inject) does): the size, the peer's mark and its credit
/// checked as for a send, then `fi_inject` (`fi_tinject` with the data tag on a credited
/// endpoint), which copies the message before it returns and asks for no completion. No slot is
/// taken and nothing is counted: the provider holds the message, and reports nothing of it.
///
/// # Safety
/// As [`send_raw`](LibfabricEndpoint::send_raw).
pub(super) unsafe fn try_inject(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    message: &[u8],
) -> Result<(), DmaError> {
    let limit = inject_limit(endpoint);
    if message.len() > limit {
        return Err(DmaError::InvalidArgument(format!(
            "a {}-byte message exceeds the {limit} bytes this endpoint injects \
             (Description::inject_size, within max_send_size): send it with send",
            message.len()
        )));
    }
    let sends = &endpoint.operations.sends;
    if let Some(code) = sends.dead(fi_addr) {
        return Err(unreachable(fi_addr, None, code));
    }
    let credit = flow::take_credit(endpoint, fi_addr, What::Message(message.len()))?;
    // SAFETY: the endpoint is open and the caller promises `fi_addr` is a live entry of its AV;
    // `message` is readable for the call, and an inject has copied it when it returns.
    let code = unsafe { post_inject(endpoint, message, fi_addr) };
    if 0 == code {
        return Ok(());
    }
    flow::give_back_credit(endpoint, credit);
    Err(refused(endpoint, fi_addr, "fi_inject", code))
}

/// `fi_inject` of `message` to `fi_addr`, or `fi_tinject` with the data tag where `endpoint` is
/// credited (as [`flow::post_send`] chooses `fi_tsend`). `fi_tinject` is a `static inline` call
/// through the endpoint's tagged operations, which this makes itself (the bindings have no shim
/// for it); a provider without one answers `-FI_ENOSYS`.
///
/// # Safety
/// The endpoint is open and `fi_addr` a live entry of its AV.
unsafe fn post_inject(
    endpoint: &LibfabricEndpoint,
    message: &[u8],
    fi_addr: sys::fi_addr_t,
) -> isize {
    let ep = endpoint.handles.ep;
    let buffer = message.as_ptr().cast::<c_void>();
    let Some(tag) = flow::data_tag(endpoint) else {
        // SAFETY: the caller's promises are `fi_inject`'s; `buffer` is `message.len()` readable
        // bytes, copied before the call returns.
        return unsafe { sys::fi_inject(ep, buffer, message.len(), fi_addr) };
    };
    // SAFETY: `ep` is the open endpoint, whose `tagged` operations table the provider filled
    // at `fi_endpoint` (a credited endpoint asks for FI_TAGGED) and keeps until the close;
    // reading its `inject` entry is what `fi_tinject` does.
    let inject = unsafe { (*ep).tagged.as_ref().and_then(|tagged| tagged.inject) };
    let Some(inject) = inject else {
        return -(sys::FI_ENOSYS as isize);
    };
    // SAFETY: as `fi_tinject`: the endpoint is open, `fi_addr` live (the caller's promise) and
    // `buffer` `message.len()` readable bytes, copied before the call returns.
    unsafe { inject(ep, buffer, message.len(), fi_addr, tag) }
}

/// What a post the provider refused with `code` (negative) answers, for `call`: `WouldBlock`
/// for `-FI_EAGAIN` (with a short nap for the waiters: nothing may signal when it would go
/// through, a connection being set up), `PeerUnreachable` (the peer marked) when the code says
/// the peer is gone, the fabric error otherwise.
fn refused(
    endpoint: &LibfabricEndpoint,
    fi_addr: sys::fi_addr_t,
    call: &'static str,
    code: isize,
) -> DmaError {
    if code == -(sys::FI_EAGAIN as isize) {
        endpoint.operations.waiter.retry_soon();
        return DmaError::WouldBlock;
    }
    let positive = u32::try_from(code.unsigned_abs()).unwrap_or(0);
    if says_peer_is_gone(positive) {
        endpoint.operations.sends.mark_dead(fi_addr, positive);
        return unreachable(fi_addr, None, positive);
    }
    DmaError::fabric(call, code as i64)
}
