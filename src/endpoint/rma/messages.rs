//! Messages from registered memory: [`LibfabricEndpoint::send_from`] sends a segment of a
//! registered region of any size (up to the provider's `max_msg_size`), with no copy, and
//! completes through [`poll_completions`](LibfabricEndpoint::poll_completions) and
//! [`wait_for`](LibfabricEndpoint::wait_for) like a write: it takes a slot of the operation slab,
//! which holds the lease and the region's memory until the completion has been read (the
//! parent module's "Operations in flight" applies unchanged).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{InFlight, Operation, lock};
use crate::cache::Lease;
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::deadline::Deadline;
use crate::endpoint::memory::Segment;
use crate::error::DmaError;
use crate::sys;

impl LibfabricEndpoint {
    /// `fi_send` of `source` to the lease's peer, from the registered memory itself (no copy),
    /// retrying backpressure for up to a second. The message is received like any other (by
    /// [`receive`](Self::receive), into a buffer of `receive_size`: a longer one is a truncation
    /// error there). The completion, with `id` and [`Operation::Send`], comes from
    /// [`poll_completions`](Self::poll_completions) or [`wait_for`](Self::wait_for); until it has
    /// been read the endpoint holds the lease and the source's memory. On tcp the completion
    /// means the peer's provider has the message (`FI_TRANSMIT_COMPLETE`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, Operation};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let sender = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let receiver = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let region = sender.register(4096)?;
    /// region.write_bytes(0, &[7; 4096])?;
    /// let message = std::thread::scope(|scope| {
    ///     // The receiver progresses inside `receive`: rxm connects on the first send.
    ///     let receiving = scope.spawn(|| receiver.receive(Duration::from_secs(20)));
    ///     let lease = sender.peers().lease(1, &receiver.local_address()?)?;
    ///     sender.send_from_within(lease, region.segment(0, 4096)?, 42, Duration::from_secs(20))?;
    ///     assert_eq!(1, sender.peers().stats().leases, "held until the completion is read");
    ///     let completion = sender.wait_for(42, Duration::from_secs(20))?;
    ///     assert_eq!((Operation::Send, 4096, Ok(())), (completion.operation, completion.len, completion.result));
    ///     assert_eq!(0, sender.peers().stats().leases);
    ///     receiving.join().expect("the receiving thread")
    /// })?;
    /// assert_eq!(Some(vec![7; 4096]), message);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// As [`send_from_within`](Self::send_from_within).
    pub fn send_from(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
    ) -> Result<(), DmaError> {
        self.send_from_within(lease, source, id, Duration::from_secs(1))
    }

    /// [`send_from`](Self::send_from), retrying backpressure for at most `timeout` (any
    /// `Duration`: one too long for a deadline, `Duration::MAX`, retries until the post is taken).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA, a lease of
    /// another endpoint's cache or a segment of another endpoint's memory;
    /// [`DmaError::PeerUnreachable`] when the provider has reported the peer gone (an earlier
    /// send's completion, see [`send`](Self::send)); [`DmaError::WouldBlock`] when the provider or
    /// the slab still pushed back after `timeout` (nothing posted); [`DmaError::Fabric`] when
    /// `fi_send` failed (a message past the provider's `max_msg_size` included).
    pub fn send_from_within(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        if source.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the source segment is memory of another endpoint".into(),
            ));
        }
        if !self.peers.owns(lease.peer()) {
            return Err(DmaError::InvalidArgument(
                "the lease is on another endpoint's cache".into(),
            ));
        }
        let fi_addr = lease.fi_addr();
        if let Some(code) = self.operations.sends.dead(fi_addr) {
            return Err(crate::endpoint::sends::unreachable(fi_addr, code));
        }
        // SAFETY: the lease is of this endpoint's own cache (checked just above), and every
        // stored lease is dropped before the endpoint drops that cache (the parent module's
        // "Lifetime erasure"), so the counter it points into outlives it.
        let lease = unsafe { std::mem::transmute::<Lease<'_>, Lease<'static>>(lease) };
        let operations = &self.operations;
        let deadline = Deadline::after(timeout);
        let index = loop {
            if let Some(index) = lock(&operations.free).pop() {
                break index;
            }
            if deadline.passed() {
                return Err(DmaError::WouldBlock);
            }
            self.progress();
            std::thread::yield_now();
        };
        let slot = &operations.slots[index];
        let buffer = source.region.at(source.offset);
        let desc = source.region.desc();
        // SAFETY: the slot came off the free list, so this thread owns it until it is posted.
        unsafe {
            *slot.operation.get() = Some(InFlight {
                id,
                operation: Operation::Send,
                len: source.len,
                lease: Some(lease),
                region: Arc::clone(source.region),
            });
        }
        slot.posted_at.set(operations.born, id);
        operations.in_flight.fetch_add(1, Ordering::AcqRel);
        loop {
            // SAFETY: the endpoint is open; `buffer` is `source.len` bytes inside a registered
            // region (checked by `Segment`) whose `Arc` the slot holds until the completion has
            // been read, and `desc` is its descriptor; the context is the slot's, which lives as
            // long as the endpoint's handles; `fi_addr` is the lease's, held by the slot.
            let code = unsafe {
                sys::fi_send(
                    self.handles.ep,
                    buffer.cast_const().cast(),
                    source.len,
                    desc,
                    fi_addr,
                    slot.context.get().cast(),
                )
            };
            if 0 == code {
                return Ok(());
            }
            if code != -(sys::FI_EAGAIN as isize) || deadline.passed() {
                // Not posted: the slot is still this thread's; its lease and buffer go now.
                // SAFETY: as above, the provider did not take the slot.
                drop(unsafe { (*slot.operation.get()).take() });
                slot.posted_at.clear();
                operations.in_flight.fetch_sub(1, Ordering::AcqRel);
                lock(&operations.free).push(index);
                return Err(if code == -(sys::FI_EAGAIN as isize) {
                    DmaError::WouldBlock
                } else {
                    DmaError::fabric("fi_send", code as i64)
                });
            }
            self.progress();
            std::thread::yield_now();
        }
    }
}
