//! Messages from registered memory: [`LibfabricEndpoint::send_from`] sends a segment of a
//! registered region of any size (up to the provider's `max_msg_size`), with no copy, and
//! completes through [`poll_completions`](LibfabricEndpoint::poll_completions) and
//! [`wait_for`](LibfabricEndpoint::wait_for) like a write: it takes a slot of the operation slab,
//! which holds the lease and the region's memory until the completion has been read (the
//! parent module's "Operations in flight" applies unchanged).

use std::time::Duration;

use crate::cache::Lease;
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::credits::What;
use crate::endpoint::deadline::Deadline;
use crate::endpoint::engine::{Operation, Sink, Submission, Target};
use crate::endpoint::memory::Segment;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

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
    ///     let lease = sender.cache().lease(1, &receiver.local_address()?)?;
    ///     sender.send_from_within(lease, region.segment(0, 4096)?, 42, Duration::from_secs(20))?;
    ///     assert_eq!(1, sender.cache().stats().leases, "held until the completion is read");
    ///     let completion = sender.wait_for(42, Duration::from_secs(20))?;
    ///     assert_eq!((Operation::Send, 4096, Ok(())), (completion.operation, completion.len, completion.result));
    ///     assert_eq!(0, sender.cache().stats().leases);
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
    /// the slab still pushed back after `timeout` (nothing posted); [`DmaError::Busy`] when a
    /// slice or copy of a `Local` source region stayed lent for the whole `timeout` (the post
    /// waits for them, refusing new ones meanwhile; nothing posted); [`DmaError::Fabric`] when
    /// `fi_send` failed (a message past the provider's `max_msg_size` included).
    pub fn send_from_within(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.send_from_to(lease, source, id, timeout, Sink::Application)
    }

    /// [`send_from_within`](Self::send_from_within), whose completion goes to `sink`.
    pub(crate) fn send_from_to(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        id: u64,
        timeout: Duration,
        sink: Sink,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        if source.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the source segment is memory of another endpoint".into(),
            ));
        }
        self.check_peer(lease.peer())?;
        // A peer reported gone is refused by `submit`, before anything is posted.
        // Before the slot: a region lending a slice is waited for within the patience (then
        // Busy), and nothing is taken meanwhile.
        let deadline = Deadline::after(timeout);
        let hold = source.region.hold(deadline)?;
        let buffer = source.region.at(source.offset);
        let desc = source.region.desc();
        let len = source.len;
        // The receiver's credit next, within the same timeout; given back if nothing is posted.
        let fi_addr = lease.peer().fi_addr();
        let credit = self.wait_for_credit(fi_addr, What::Message(len), deadline)?;
        let timeout = deadline.remaining().unwrap_or(timeout);
        let submission = Submission {
            operation: Operation::Send,
            target: Target::Leased(lease),
            hold,
            len,
            id,
            join: None,
            slot: None,
            sink,
        };
        let posted = self.submit(submission, timeout, &mut |fi_addr, context| {
            // SAFETY: the endpoint is open; `buffer` is `len` bytes inside a registered region
            // (checked by `Segment`) whose registration the slot holds until the completion has
            // been read, and `desc` is its descriptor; the context is the slot's, which lives as
            // long as the endpoint's handles; `fi_addr` is the lease's, held by the slot.
            unsafe { self.post_send(buffer.cast_const().cast(), len, desc, fi_addr, context) }
        });
        if posted.is_err() {
            self.give_back_credit(credit);
        }
        posted.map(drop)
    }
}

impl LibfabricEndpoint {
    /// Post a receive into `destination`, registered memory of this endpoint: the next message
    /// to arrive that no earlier-posted receive takes lands there, with no copy. Receives match
    /// in the order they were posted, the endpoint's own buffers (posted at `open` and again after
    /// each message) included. The completion, with `id`, [`Operation::Receive`] and `len` the
    /// length received, comes from [`poll_completions`](Self::poll_completions) or
    /// [`wait_for`](Self::wait_for) (or is set aside by [`try_receive`](Self::try_receive) for
    /// them); until then the endpoint holds the destination's memory. A message longer than
    /// `destination` completes with `-FI_ETRUNC`. The completion's
    /// [`sender`](super::Completion::sender) names who sent the message where the provider says
    /// (tcp;ofi_rxm, for a sender in this endpoint's AV: see
    /// [`receive_from`](Self::receive_from)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, Operation};
    ///
    /// let configuration = Configuration { rma: true, receive_buffers: 1, ..Configuration::default() };
    /// let receiver = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let sender = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let landing = receiver.register(64 << 10)?;
    /// receiver.receive_into(landing.segment(0, 64 << 10)?, 9)?;
    /// let source = sender.register(10_000)?;
    /// source.write_bytes(0, &[4; 10_000])?;
    /// std::thread::scope(|scope| {
    ///     // The endpoint's own buffer takes the first message; `landing` the second.
    ///     let receiving = scope.spawn(|| {
    ///         let first = receiver.receive(Duration::from_secs(20));
    ///         (first, receiver.wait_for(9, Duration::from_secs(20)))
    ///     });
    ///     let pinned = sender.cache().pin();
    ///     let peer = pinned.resolve(1, &receiver.local_address()?)?;
    ///     sender.send_within(peer, b"first", Duration::from_secs(20))?;
    ///     drop(pinned);
    ///     let lease = sender.cache().lease(1, &receiver.local_address()?)?;
    ///     sender.send_from_within(lease, source.segment(0, 10_000)?, 1, Duration::from_secs(20))?;
    ///     sender.wait_for(1, Duration::from_secs(20))?;
    ///     let (first, landed) = receiving.join().expect("the receiving thread");
    ///     assert_eq!(Some(b"first".to_vec()), first?);
    ///     let landed = landed?;
    ///     assert_eq!((Operation::Receive, 10_000, Ok(())), (landed.operation, landed.len, landed.result));
    ///     let mut bytes = vec![0; 10_000];
    ///     landing.read_bytes(0, &mut bytes)?;
    ///     assert_eq!(vec![4; 10_000], bytes);
    ///     Ok::<(), dma_libfabric::DmaError>(())
    /// })?;
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA or a segment of
    /// another endpoint's memory; [`DmaError::WouldBlock`] when every operation slot is in flight
    /// or the provider asks to retry (nothing posted); [`DmaError::Busy`], at once, while a
    /// slice or copy of a `Local` destination region is lent (a receive has no patience to wait
    /// for it; nothing posted); [`DmaError::Fabric`] when `fi_recv` failed.
    pub fn receive_into(&self, destination: Segment<'_>, id: u64) -> Result<(), DmaError> {
        self.receive_into_to(destination, id, Sink::Application)
    }

    /// [`receive_into`](Self::receive_into), whose completion goes to `sink`.
    pub(crate) fn receive_into_to(
        &self,
        destination: Segment<'_>,
        id: u64,
        sink: Sink,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        if destination.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the destination segment is memory of another endpoint".into(),
            ));
        }
        // Before the slot: a region lending a slice answers Busy at once (a receive has no
        // patience: it answers WouldBlock at once for want of a slot too), and nothing is taken.
        let hold = destination.region.hold(Deadline::after(Duration::ZERO))?;
        let buffer = destination.region.at(destination.offset);
        let desc = destination.region.desc();
        let len = destination.len;
        let submission = Submission {
            operation: Operation::Receive,
            target: Target::Anyone,
            hold,
            len,
            id,
            join: None,
            slot: None,
            sink,
        };
        self.submit(submission, Duration::ZERO, &mut |_, context| {
            // SAFETY: the endpoint is open; `buffer` is `len` bytes inside a registered region
            // whose registration the slot holds until the completion has been read, `desc` is
            // its descriptor, and the context is the slot's, which lives as long as the handles.
            unsafe { self.post_data_receive(buffer.cast(), len, desc, context) }
        })
        .map(drop)
    }
}

impl LibfabricEndpoint {
    /// At drop, before the operations are drained: ask the provider to cancel every
    /// `receive_into` still posted (a receive waits for a message that may never come; rxm and
    /// tcp cancel receives) and read the receive queue until their completions are in, for at
    /// most [`SEND_DRAIN_PATIENCE`](Self::SEND_DRAIN_PATIENCE). The drain that follows reads
    /// only the transmit queue.
    pub(in crate::endpoint) fn cancel_receives_into(&self) {
        if 0 == self.operations.receives_into() {
            return;
        }
        for slot in self.operations.slots.iter() {
            // SAFETY: the endpoint is open; fi_cancel only looks the context up among the
            // operations it holds, and a context it does not hold is -FI_ENOENT.
            let _ = unsafe {
                sys::fi_cancel(&raw mut (*self.handles.ep).fid, slot.context.get().cast())
            };
        }
        // Sleeping between reads where the queues have a wait object (see `wait`).
        let _drained = self.wait_until(Deadline::after(Self::SEND_DRAIN_PATIENCE), || {
            self.progress();
            (0 == self.operations.receives_into()).then_some(())
        });
    }
}
