//! RMA: `fi_write` and `fi_read` against a [`Lease`], with completions any thread may reap.
//!
//! # Operations in flight
//!
//! Every operation takes a slot of a fixed slab, as large as the provider's transmit queue
//! (`tx_attr.size`) and the completion queue allow (so the queue cannot overrun), and at most
//! [`MAX_OPERATIONS`]. The slot's `fi_context2` is the operation's context, and the slot holds,
//! until the operation's completion has been read, the [`Lease`] it was posted against and a
//! clone of its local buffer's `Arc`. So neither the AV entry (`fi_av_remove` waits for the
//! lease) nor the memory (the `Arc`) can go while the provider may still use them. A slot is owned
//! by the posting thread until `fi_write`/`fi_read` accepts it, then by the provider, then by the
//! one thread whose `fi_cq_read` returned its completion: that thread drops the lease and the
//! buffer at once, and parks the [`Completion`] in a ready queue until the application takes it
//! ([`LibfabricEndpoint::poll_completions`], [`LibfabricEndpoint::wait_for`]); only then is the slot
//! free again. So the ready queue is bounded by the slab.
//!
//! # One transmit queue, two kinds of entries
//!
//! Sends complete into the transmit queue (each counted in its own slab, see `sends`); RMA
//! operations complete into the same queue (an endpoint binds one queue for transmits). Every read
//! of it, [`LibfabricEndpoint::progress`] included, goes through `Operations::reap`, which
//! recognises an RMA context by its address (inside the slab, on a slot boundary, as receive slots
//! are recognised) and hands it to its operation; anything else is a send's completion, handed to
//! the send slab (which logs an unknown context's error). Neither path can steal the other's completions.
//!
//! # Backpressure
//!
//! `-FI_EAGAIN` from the provider, and a full slab, are retried with progress until a bound
//! ([`LibfabricEndpoint::write_within`]; one second for [`LibfabricEndpoint::write`]), after which
//! the call answers [`DmaError::WouldBlock`] and nothing is in flight.
//!
//! # Drop
//!
//! Dropping the endpoint first drains its operations: it asks the provider to cancel each
//! (`fi_cancel`; rxm and tcp cancel only receives, so for RMA this mostly does nothing) and
//! drives progress until every completion has been read, for at most
//! [`LibfabricEndpoint::DRAIN_PATIENCE`]. Operations still in flight after that (a peer that
//! never progresses, a provider that dropped a transfer without a completion) are abandoned: their
//! registrations are closed, then the endpoint, which stops the provider touching their memory,
//! and only then are their buffers parked (freed once the domain has closed: see `memory`) and
//! their leases dropped, all before the address cache and the domain close.
//! [`LibfabricEndpoint::drain_operations`] does the first step on demand.
//!
//! # Lifetime erasure
//!
//! A `Lease<'cache>` borrows the endpoint's own cache; stored in a slot it is a `Lease<'static>`.
//! That is sound because (1) only leases of this endpoint's cache are accepted (checked with
//! [`AddressCache::owns`](crate::AddressCache::owns)), and (2) every slot is emptied, its lease
//! dropped, before the endpoint drops its cache (`LibfabricEndpoint::drop` drains and abandons
//! first), so no stored lease outlives the counters it points into.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::ffi::c_void;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::LibfabricEndpoint;
use super::in_flight::PostedAt;
use super::memory::{MemoryRegion, Pool, Registration, RemoteRegion, Segment};
use crate::cache::{Lease, Peer};
use crate::error::DmaError;
use crate::sys;

/// The most RMA operations one endpoint keeps in flight, whatever the transmit queue allows.
pub const MAX_OPERATIONS: usize = 4096;

/// How many completions one read of the queue takes.
const BATCH: usize = 16;

mod messages;

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
    /// How many bytes were to be transferred.
    pub len: usize,
    /// `Ok` when the transfer is complete (on tcp: sent; the bytes land when the target
    /// progresses); the error entry's detail otherwise ([`DmaError::Fabric`] naming the
    /// operation's call, whose `code` is the negative `FI_E*` error, `-FI_ECANCELED` for a
    /// cancelled one, and whose message has the provider's own text from `fi_cq_strerror`).
    pub result: Result<(), DmaError>,
}

/// One operation in flight: what must outlive it.
struct InFlight {
    id: u64,
    operation: Operation,
    len: usize,
    /// Held for its `Drop`, which runs when the completion has been read. `None` only for
    /// [`LibfabricEndpoint::write_unleased`].
    #[allow(dead_code)]
    lease: Option<Lease<'static>>,
    region: Arc<Registration>,
}

/// A slot of the slab: `repr(C)` with the context first, so the context pointer is the slot's.
#[repr(C)]
struct OperationSlot {
    context: UnsafeCell<sys::fi_context2>,
    operation: UnsafeCell<Option<InFlight>>,
    /// When its operation was posted, for any thread to read (see `in_flight`).
    posted_at: PostedAt,
}

/// The slab of operation slots and the queues that hand them around.
pub(super) struct Operations {
    slots: Box<[OperationSlot]>,
    free: Mutex<Vec<usize>>,
    ready: Mutex<VecDeque<(usize, Completion)>>,
    /// Posted and not yet reaped.
    in_flight: AtomicUsize,
    /// The time every slot's `posted_at` counts from.
    pub(super) born: Instant,
    /// Where the provider does not choose keys (no `FI_MR_PROV_KEY`): each key requested is
    /// `keys.hash_one(counter)`, a SipHash of a counter under a key `std` drew from the
    /// operating system's random source (see `memory`, "Keys").
    keys: RandomState,
    /// The counter `keys` hashes: a new input for every key drawn.
    next_key: AtomicU64,
    /// Keys a test wants requested first, in order.
    #[cfg(test)]
    pub(super) forced_keys: Mutex<VecDeque<u64>>,
    /// The memory of dropped regions (see `memory`, "parking"): dropped with the slab, after the
    /// endpoint's handles have closed.
    pub(super) pool: Arc<Pool>,
    /// `domain_attr.mr_mode`.
    mr_mode: i32,
    enabled: bool,
    /// Sends in flight, whose completions share the transmit queue (see `sends`).
    pub(super) sends: super::sends::Sends,
    /// `receive_into`s posted and not completed: while any is, `progress` reads the receive
    /// queue too (see `messages`).
    receives_into: AtomicUsize,
}

// SAFETY: a slot's cells are touched only by the one thread that owns the slot at the time
// (module docs: the free list, the provider and the completion queue hand it over, each a
// synchronising hand-off); everything else is a mutex or an atomic.
unsafe impl Sync for Operations {}
// SAFETY: the slab owns plain memory and `Send` leases and `Arc`s.
unsafe impl Send for Operations {}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Operations {
    /// The slab for an endpoint opened with `info`: none unless `enabled` (the configuration
    /// asked for RMA), else as many slots as the transmit queue and the completion queue hold.
    ///
    /// # Safety
    /// `info` is the non-null `fi_info` the endpoint was opened with.
    pub(super) unsafe fn new(
        info: *const sys::fi_info,
        enabled: bool,
        cq_size: usize,
        sends: super::sends::Sends,
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
            born: Instant::now(),
            keys: RandomState::new(),
            next_key: AtomicU64::new(0),
            #[cfg(test)]
            forced_keys: Mutex::new(VecDeque::new()),
            pool: Arc::new(Pool::default()),
            mr_mode,
            enabled,
            sends,
            receives_into: AtomicUsize::new(0),
        }
    }

    /// A fresh random key to request (never `FI_KEY_NOTAVAIL`, `u64::MAX`).
    pub(super) fn draw_key(&self) -> u64 {
        #[cfg(test)]
        if let Some(key) = lock(&self.forced_keys).pop_front() {
            return key;
        }
        loop {
            let key = self
                .keys
                .hash_one(self.next_key.fetch_add(1, Ordering::Relaxed));
            if u64::MAX != key {
                return key;
            }
        }
    }

    /// Every slot's post time (`in_flight`).
    pub(super) fn posted_at(&self) -> impl Iterator<Item = &PostedAt> {
        self.slots.iter().map(|slot| &slot.posted_at)
    }

    /// The slot whose context is `context`, if it is one of ours: addresses only, nothing is
    /// dereferenced.
    fn index_of(&self, context: *mut c_void) -> Option<usize> {
        let start = self.slots.as_ptr() as usize;
        let offset = (context as usize).checked_sub(start)?;
        let size = std::mem::size_of::<OperationSlot>();
        let index = offset / size;
        (0 == offset % size && index < self.slots.len()).then_some(index)
    }

    /// Read every completion the transmit queue `cq` holds now, handing RMA completions to their
    /// operations (their leases and buffers are dropped here) and sends' to the send slab.
    /// Drives the provider's progress. Returns how many entries were read.
    pub(super) fn reap(&self, cq: *mut sys::fid_cq) -> usize {
        let mut total = 0;
        loop {
            let mut entries = [sys::fi_cq_data_entry::default(); BATCH];
            // SAFETY: the queue is open (the endpoint owns it for as long as `self` is used) and
            // `entries` has room for `BATCH` entries of the queue's format.
            let read = unsafe { sys::fi_cq_read(cq, entries.as_mut_ptr().cast(), BATCH) };
            if read > 0 {
                let read = read.unsigned_abs();
                total += read;
                for entry in &entries[..read.min(BATCH)] {
                    self.complete(entry.op_context, Ok(()));
                }
                if read < BATCH {
                    return total;
                }
            } else if read == -(sys::FI_EAVAIL as isize) {
                total += usize::from(self.read_error(cq));
            } else {
                if read != -(sys::FI_EAGAIN as isize) {
                    tracing::warn!(error = %DmaError::fabric("fi_cq_read", read as i64), "reading the transmit queue failed");
                }
                return total;
            }
        }
    }

    /// Read one error entry into a buffer of this call's own; `false` if another thread took it.
    fn read_error(&self, cq: *mut sys::fid_cq) -> bool {
        let Ok(Some(entry)) = super::read_error_entry(cq) else {
            return false;
        };
        if self.index_of(entry.op_context).is_some() {
            self.complete(entry.op_context, Err(entry.error("fi_cq_readerr")));
        } else {
            // A send's (see `sends`), or an unknown context's, logged there.
            self.sends.failed(&entry);
        }
        true
    }

    /// The completion of the operation whose context is `context`, if it is one of ours.
    fn complete(&self, context: *mut c_void, result: Result<(), DmaError>) {
        let Some(index) = self.index_of(context) else {
            // A send's (see `sends`); errors come through `read_error`.
            self.sends.completed(context);
            return;
        };
        // SAFETY: this thread read the slot's completion, so it owns the slot (module docs).
        let Some(operation) = (unsafe { &mut *self.slots[index].operation.get() }).take() else {
            tracing::warn!(
                index,
                "a completion for an operation slot that holds nothing"
            );
            return;
        };
        self.slots[index].posted_at.clear();
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        // Name the operation that failed rather than the queue read that reported it.
        let result = result.map_err(|error| match error {
            DmaError::Fabric { code, message, .. } => DmaError::Fabric {
                call: operation.operation.call(),
                code,
                message,
            },
            other => other,
        });
        let completion = Completion {
            id: operation.id,
            operation: operation.operation,
            len: operation.len,
            result,
        };
        // The completion has been read: the lease and the buffer may go.
        drop(operation);
        lock(&self.ready).push_back((index, completion));
    }

    /// Move every ready completion to `out`, freeing their slots.
    fn deliver(&self, out: &mut Vec<Completion>) -> usize {
        let ready: Vec<_> = lock(&self.ready).drain(..).collect();
        let count = ready.len();
        let mut free = Vec::with_capacity(count);
        for (index, completion) in ready {
            out.push(completion);
            free.push(index);
        }
        lock(&self.free).extend(free);
        count
    }

    /// The ready completion with `id`, if any, freeing its slot.
    fn take_ready(&self, id: u64) -> Option<Completion> {
        let mut ready = lock(&self.ready);
        let position = ready
            .iter()
            .position(|(_, completion)| completion.id == id)?;
        let (index, completion) = ready.remove(position)?;
        drop(ready);
        lock(&self.free).push(index);
        Some(completion)
    }

    /// Ask the provider to cancel every operation in flight, then drive progress until none is
    /// or `patience` has passed. Returns how many are still in flight.
    ///
    /// # Safety
    /// `ep` and `cq` are the endpoint and transmit queue the operations were posted on, open.
    unsafe fn drain(
        &self,
        ep: *mut sys::fid_ep,
        cq: *mut sys::fid_cq,
        patience: Duration,
    ) -> usize {
        if 0 == self.in_flight.load(Ordering::Acquire) {
            return 0;
        }
        for slot in self.slots.iter() {
            // SAFETY: the endpoint is open; fi_cancel only looks the context up among the
            // operations it holds, and a context it does not hold is -FI_ENOENT.
            let _ = unsafe { sys::fi_cancel(&raw mut (*ep).fid, slot.context.get().cast()) };
        }
        let deadline = super::deadline::Deadline::after(patience);
        loop {
            self.reap(cq);
            let left = self.in_flight.load(Ordering::Acquire);
            if 0 == left || deadline.passed() {
                return left;
            }
            std::thread::yield_now();
        }
    }

    /// Close the registrations of the operations still in flight. Their memory stays allocated.
    fn close_abandoned_registrations(&mut self) {
        for slot in self.slots.iter_mut() {
            if let Some(operation) = slot.operation.get_mut() {
                operation.region.close_registration();
            }
        }
    }

    /// Drop what the operations still in flight hold: leases and memory. Only once the endpoint
    /// is closed and the provider can no longer touch them.
    fn forget_abandoned(&mut self) -> usize {
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

/// How RMA calls name their remote side.
enum Target<'lease> {
    Leased(Lease<'lease>),
    /// The caller promised the entry outlives the operation.
    Unleased(sys::fi_addr_t),
}

impl LibfabricEndpoint {
    /// How long dropping an endpoint drives progress for its operations in flight before it
    /// abandons them (see the `rma` module docs).
    pub const DRAIN_PATIENCE: Duration = Duration::from_secs(2);

    /// Register `len` bytes of fresh zeroed memory for RMA, honouring the provider's
    /// memory-registration mode (see [`MemoryRegion`]). Where the provider does not choose keys,
    /// the key is a fresh random 64-bit number. The memory comes from the endpoint's parked
    /// memory when a buffer of its size class is past its quarantine, else from the allocator.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the endpoint was opened without
    /// [`Configuration::rma`](crate::Configuration::rma), for `len` 0 or above
    /// [`MAX_REGION_LEN`](crate::endpoint::memory::MAX_REGION_LEN) (naming both), when the
    /// system cannot allocate `len` bytes, or for a provider that asks for `FI_MR_RAW`;
    /// [`DmaError::Fabric`] when `fi_mr_reg` (after
    /// [`KEY_ATTEMPTS`](crate::endpoint::memory::KEY_ATTEMPTS) keys already in use),
    /// `fi_mr_bind` or `fi_mr_enable` fails. Nothing is left registered on an error.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let Err(DmaError::InvalidArgument(reason)) = endpoint.register(1 << 44) else {
    ///     panic!("16 TiB is above the bound");
    /// };
    /// assert!(reason.contains("17592186044416"), "{reason}");
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn register(&self, len: usize) -> Result<MemoryRegion<'_>, DmaError> {
        self.check_rma()?;
        // SAFETY: the domain and the endpoint are open, and stay open until every registration
        // is dropped: a `MemoryRegion` borrows this endpoint (or holds an `Arc` of it), and the
        // clones held by operations are dropped by `Drop` before the handles close. The pool is
        // the slab's, which is dropped after the handles close.
        let registration = unsafe {
            Registration::new(
                self.handles.domain,
                self.handles.ep,
                self.operations.mr_mode,
                len,
                &self.operations.pool,
                &mut || self.operations.draw_key(),
            )
        }?;
        Ok(MemoryRegion::new(registration))
    }

    /// `primary`'s memory (a region of another endpoint) registered in this endpoint's domain
    /// too: for a rail set, whose region is one buffer registered on every rail. The new region
    /// holds `primary`'s registration, so the memory lives until both are dropped (and is parked
    /// by `primary`'s endpoint).
    ///
    /// # Safety
    /// `primary`'s endpoint outlives this one: its pool frees the memory only once it has closed,
    /// and a peer's transfer admitted under the new registration may reach the memory until this
    /// endpoint's domain closes.
    pub(crate) unsafe fn register_alias(
        &self,
        primary: &MemoryRegion<'_>,
    ) -> Result<MemoryRegion<'_>, DmaError> {
        self.check_rma()?;
        // SAFETY: this endpoint's domain and endpoint are open and stay open until every
        // registration of theirs is dropped (as in `register`); `primary`'s endpoint outlives
        // this one (the caller's promise).
        let registration = unsafe {
            Registration::alias(
                &primary.inner,
                self.handles.domain,
                self.handles.ep,
                self.operations.mr_mode,
                &self.operations.pool,
                &mut || self.operations.draw_key(),
            )
        }?;
        Ok(MemoryRegion::new(registration))
    }

    /// How many bytes of dropped regions' memory the endpoint holds now: memory a peer's
    /// transfer admitted before the drop may still reach, so it is freed only when the endpoint
    /// drops, and reused meanwhile by later registrations of the same size class (see the
    /// [`memory`](crate::endpoint::memory) module docs, "parking"). Bounded by the peak of
    /// registered memory, plus the quarantine of each size class.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// assert_eq!(0, endpoint.parked_memory());
    /// drop(endpoint.register(1 << 20)?);
    /// assert_eq!(1 << 20, endpoint.parked_memory(), "parked, not freed");
    /// for _ in 0..100 {
    ///     drop(endpoint.register(1 << 20)?); // reuses parked memory past the quarantine
    /// }
    /// assert!(endpoint.parked_memory() <= 4 << 20, "{}", endpoint.parked_memory());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn parked_memory(&self) -> usize {
        self.operations.pool.parked()
    }

    /// [`register`](Self::register) for an endpoint shared through an `Arc`: the region keeps
    /// the endpoint alive rather than borrowing it, so it can be stored beside it (a client that
    /// advertises its memory for as long as it lives).
    ///
    /// # Errors
    /// As `register`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, MemoryRegion};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = Arc::new(LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?);
    /// let region: MemoryRegion<'static> = endpoint.register_shared(64)?;
    /// drop(endpoint); // the region still holds it
    /// assert_eq!(64, region.len());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register_shared(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<MemoryRegion<'static>, DmaError> {
        Ok(self.register(len)?.owned_by(Arc::clone(self)))
    }

    /// `fi_write` of `source` into the peer's `target`, against `lease`, retrying backpressure
    /// for up to a second. The completion, with `id`, comes from
    /// [`poll_completions`](Self::poll_completions) or [`wait_for`](Self::wait_for); until it
    /// has been read the endpoint holds the lease and the source's memory.
    ///
    /// # Errors
    /// As [`write_within`](Self::write_within).
    pub fn write(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        id: u64,
    ) -> Result<(), DmaError> {
        self.write_within(lease, source, target, id, Duration::from_secs(1))
    }

    /// [`write`](Self::write), retrying backpressure for at most `timeout`. Any `Duration` is
    /// accepted: one too long for a deadline (`Duration::MAX`) retries until the post is taken.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA, a lease of
    /// another endpoint's cache, a segment of another endpoint's memory, or a target shorter than
    /// the source; [`DmaError::WouldBlock`] when the provider or the slab still pushed back after
    /// `timeout` (nothing posted); [`DmaError::Fabric`] when `fi_write` failed.
    pub fn write_within(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.post(
            Operation::Write,
            Target::Leased(lease),
            source,
            target,
            id,
            timeout,
        )
    }

    /// `fi_read` of the peer's `source` into `destination`, against `lease`; otherwise as
    /// [`write`](Self::write). Read the destination after the completion.
    ///
    /// # Errors
    /// As [`write_within`](Self::write_within).
    pub fn read(
        &self,
        lease: Lease<'_>,
        destination: Segment<'_>,
        source: RemoteRegion,
        id: u64,
    ) -> Result<(), DmaError> {
        self.read_within(lease, destination, source, id, Duration::from_secs(1))
    }

    /// [`read`](Self::read), retrying backpressure for at most `timeout` (any `Duration`, as for
    /// [`write_within`](Self::write_within)).
    ///
    /// # Errors
    /// As [`write_within`](Self::write_within).
    pub fn read_within(
        &self,
        lease: Lease<'_>,
        destination: Segment<'_>,
        source: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.post(
            Operation::Read,
            Target::Leased(lease),
            destination,
            source,
            id,
            timeout,
        )
    }

    /// [`write_within`](Self::write_within) against a [`Peer`] with no lease: nothing holds the
    /// entry's `fi_av_remove` back while the write is in flight. For measuring what leases
    /// prevent (the churn demo's `--no-leases`), not for use.
    ///
    /// # Safety
    /// The caller guarantees that `peer`'s entry stays in the address vector until this write's
    /// completion has been read; fi_av(3) leaves an operation in flight on a removed address
    /// undefined, and providers free it without a completion or cancel it.
    ///
    /// # Errors
    /// As `write_within`.
    pub unsafe fn write_unleased(
        &self,
        peer: Peer<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        if !self.peers.owns(peer) {
            return Err(DmaError::InvalidArgument(
                "the peer was resolved through another endpoint's cache".into(),
            ));
        }
        self.post(
            Operation::Write,
            Target::Unleased(peer.fi_addr()),
            source,
            target,
            id,
            timeout,
        )
    }

    fn check_rma(&self) -> Result<(), DmaError> {
        if self.operations.enabled {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(
                "the endpoint was opened without Configuration::rma".into(),
            ))
        }
    }

    fn post(
        &self,
        operation: Operation,
        target: Target<'_>,
        local: Segment<'_>,
        remote: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        if local.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the local segment is memory of another endpoint".into(),
            ));
        }
        if (local.len as u64) > remote.len {
            return Err(DmaError::InvalidArgument(format!(
                "{} local bytes do not fit the {}-byte remote region",
                local.len, remote.len
            )));
        }
        // A descriptor built by hand (its fields are public) skips `from_bytes`'s check: one whose
        // end wraps past 2^64 is what libfabric's unchecked `ofi_mr_map_verify` lets through.
        if remote.address.checked_add(remote.len).is_none() {
            return Err(DmaError::InvalidArgument(format!(
                "the remote region at {:#x} of {} bytes ends past 2^64",
                remote.address, remote.len
            )));
        }
        let (fi_addr, lease) = match target {
            Target::Leased(lease) => {
                if !self.peers.owns(lease.peer()) {
                    return Err(DmaError::InvalidArgument(
                        "the lease is on another endpoint's cache".into(),
                    ));
                }
                // SAFETY: the lease is of this endpoint's own cache (checked just above), and
                // every stored lease is dropped before the endpoint drops that cache (module
                // docs, "Lifetime erasure"), so the counter it points into outlives it.
                let lease = unsafe { std::mem::transmute::<Lease<'_>, Lease<'static>>(lease) };
                (lease.fi_addr(), Some(lease))
            }
            Target::Unleased(fi_addr) => (fi_addr, None),
        };
        let deadline = super::deadline::Deadline::after(timeout);
        let index = loop {
            if let Some(index) = lock(&self.operations.free).pop() {
                break index;
            }
            if deadline.passed() {
                return Err(DmaError::WouldBlock);
            }
            self.progress();
            std::thread::yield_now();
        };
        let slot = &self.operations.slots[index];
        let buffer = local.region.at(local.offset);
        let desc = local.region.desc();
        // SAFETY: the slot came off the free list, so this thread owns it until it is posted.
        unsafe {
            *slot.operation.get() = Some(InFlight {
                id,
                operation,
                len: local.len,
                lease,
                region: Arc::clone(local.region),
            });
        }
        slot.posted_at.set(self.operations.born, id);
        self.operations.in_flight.fetch_add(1, Ordering::AcqRel);
        loop {
            // SAFETY: the endpoint is open; `buffer` is `local.len` bytes inside a registered
            // region (checked by `Segment`) whose `Arc` the slot holds until the completion has
            // been read, and `desc` is that region's descriptor; the context is the slot's, which
            // lives in the slab for as long as the endpoint (the slab is dropped after the
            // handles close). The remote address and key are the peer's to check.
            let code = unsafe {
                match operation {
                    Operation::Write => sys::fi_write(
                        self.handles.ep,
                        buffer.cast_const().cast(),
                        local.len,
                        desc,
                        fi_addr,
                        remote.address,
                        remote.key,
                        slot.context.get().cast(),
                    ),
                    Operation::Read => sys::fi_read(
                        self.handles.ep,
                        buffer.cast(),
                        local.len,
                        desc,
                        fi_addr,
                        remote.address,
                        remote.key,
                        slot.context.get().cast(),
                    ),
                    // `send_from` and `receive_into` post through `messages`, never here.
                    Operation::Send | Operation::Receive => -(sys::FI_EINVAL as isize),
                }
            };
            if 0 == code {
                return Ok(());
            }
            let retry = code == -(sys::FI_EAGAIN as isize) && !deadline.passed();
            if !retry {
                // Not posted: the slot is still this thread's. Its lease and buffer go now.
                // SAFETY: as above, the provider did not take the slot.
                drop(unsafe { (*slot.operation.get()).take() });
                slot.posted_at.clear();
                self.operations.in_flight.fetch_sub(1, Ordering::AcqRel);
                lock(&self.operations.free).push(index);
                return Err(if code == -(sys::FI_EAGAIN as isize) {
                    DmaError::WouldBlock
                } else {
                    DmaError::fabric(operation.call(), code as i64)
                });
            }
            self.progress();
            std::thread::yield_now();
        }
    }

    /// Reap the transmit queue and move every RMA completion that is ready into `out`: any thread
    /// may call it, and each completion is handed out once. Leases and buffers of the completed
    /// operations have been dropped by the time it returns. Returns how many it added.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a provider whose queue read fails for good.
    pub fn poll_completions(&self, out: &mut Vec<Completion>) -> Result<usize, DmaError> {
        self.progress();
        Ok(self.operations.deliver(out))
    }

    /// Wait up to `timeout` for the completion of the operation posted with `id`, driving
    /// progress; other completions stay for [`poll_completions`](Self::poll_completions). For
    /// tests and simple callers: it scans the ready queue, so a completion another thread's
    /// `poll_completions` already took is not seen here. Any `Duration` is accepted: one too
    /// long for a deadline (`Duration::MAX`) waits until the completion arrives.
    ///
    /// # Errors
    /// [`DmaError::WouldBlock`] when it has not completed within `timeout` (it is still in
    /// flight).
    pub fn wait_for(&self, id: u64, timeout: Duration) -> Result<Completion, DmaError> {
        let deadline = super::deadline::Deadline::after(timeout);
        loop {
            self.progress();
            if let Some(completion) = self.operations.take_ready(id) {
                return Ok(completion);
            }
            if deadline.passed() {
                return Err(DmaError::WouldBlock);
            }
            std::thread::yield_now();
        }
    }

    /// The provider's memory-registration mode (`domain_attr.mr_mode`: `FI_MR_VIRT_ADDR`,
    /// `FI_MR_PROV_KEY`, ...), which [`register`](Self::register) honours.
    pub fn mr_mode(&self) -> i32 {
        self.operations.mr_mode
    }

    /// How many RMA operations are in flight: posted, completion not yet read.
    pub fn operations_in_flight(&self) -> usize {
        self.operations.in_flight.load(Ordering::Acquire)
    }

    /// Ask the provider to cancel every RMA operation in flight, and drive progress until each
    /// has completed (cancelled ones with `FI_ECANCELED`) or `patience` has passed; their
    /// completions are then ready for [`poll_completions`](Self::poll_completions). Returns how
    /// many are still in flight. Dropping the endpoint does this with
    /// [`DRAIN_PATIENCE`](Self::DRAIN_PATIENCE). Any `Duration` is accepted: one too long for a
    /// deadline (`Duration::MAX`) drives progress until every operation has completed.
    pub fn drain_operations(&self, patience: Duration) -> usize {
        // SAFETY: the endpoint and its transmit queue are open while `&self` lives.
        unsafe {
            self.operations
                .drain(self.handles.ep, self.handles.tx_cq, patience)
        }
    }

    /// Drain, and abandon what did not complete: called by `Drop` before the cache goes.
    pub(super) fn shut_down_operations(&mut self) {
        let left = self.drain_operations(Self::DRAIN_PATIENCE);
        if 0 == left {
            return;
        }
        // Registrations first (FI_MR_ENDPOINT asks for them to close before the endpoint), then
        // the endpoint, which stops the provider touching the memory, then the memory and leases.
        self.operations.close_abandoned_registrations();
        self.handles.close_endpoint();
        let abandoned = self.operations.forget_abandoned();
        tracing::warn!(
            abandoned,
            "RMA operations still in flight when the endpoint closed were abandoned"
        );
    }
}
