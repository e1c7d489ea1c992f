//! Messages from registered memory: [`LibfabricEndpoint::send_from`] sends a segment of a
//! registered region of any size (up to the provider's `max_msg_size`), with no copy, and
//! completes through [`poll_completions`](LibfabricEndpoint::poll_completions) and
//! [`wait_for`](LibfabricEndpoint::wait_for) like a write: it takes a slot of the operation slab,
//! which holds the lease and the region's memory until the completion has been read (the
//! parent module's "Operations in flight" applies unchanged). The calls a user makes are on the
//! message face (`messaging`); these module functions post them, with any sink.

use crate::endpoint::credits::flow;
use std::time::Duration;

use crate::cache::Lease;
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::credits::What;
use crate::endpoint::deadline::Deadline;
use crate::endpoint::engine::{Operation, Sink, Submission, Target};
use crate::endpoint::memory::Segment;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// [`send_from_within`](LibfabricEndpoint::send_from_within), whose completion goes to `sink`.
pub(crate) fn send_from_to(
    endpoint: &LibfabricEndpoint,
    lease: Lease<'_>,
    source: Segment<'_>,
    id: u64,
    timeout: Duration,
    sink: Sink,
) -> Result<(), DmaError> {
    endpoint.check_memory(&source, "source")?;
    endpoint.check_peer(lease.peer())?;
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
    let credit = flow::wait_for_credit(endpoint, fi_addr, What::Message(len), deadline)?;
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
    let posted = endpoint.submit(submission, timeout, &mut |fi_addr, context| {
        // SAFETY: the endpoint is open; `buffer` is `len` bytes inside a registered region
        // (checked by `Segment`) whose registration the slot holds until the completion has
        // been read, and `desc` is its descriptor; the context is the slot's, which lives as
        // long as the endpoint's handles; `fi_addr` is the lease's, held by the slot.
        unsafe {
            flow::post_send(
                endpoint,
                buffer.cast_const().cast(),
                len,
                desc,
                fi_addr,
                context,
            )
        }
    });
    if posted.is_err() {
        flow::give_back_credit(endpoint, credit);
    }
    posted.map(drop)
}

/// [`receive_into`](LibfabricEndpoint::receive_into), whose completion goes to `sink`.
pub(crate) fn receive_into_to(
    endpoint: &LibfabricEndpoint,
    destination: Segment<'_>,
    id: u64,
    sink: Sink,
) -> Result<(), DmaError> {
    endpoint.check_memory(&destination, "destination")?;
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
    endpoint
        .submit(submission, Duration::ZERO, &mut |_, context| {
            // SAFETY: the endpoint is open; `buffer` is `len` bytes inside a registered region
            // whose registration the slot holds until the completion has been read, `desc` is
            // its descriptor, and the context is the slot's, which lives as long as the handles.
            unsafe { flow::post_data_receive(endpoint, buffer.cast(), len, desc, context) }
        })
        .map(drop)
}

/// At drop, before the operations are drained: ask the provider to cancel every
/// `receive_into` still posted (a receive waits for a message that may never come; rxm and
/// tcp cancel receives) and read the receive queue until their completions are in, for at
/// most [`SEND_DRAIN_PATIENCE`](LibfabricEndpoint::SEND_DRAIN_PATIENCE). The drain that follows reads
/// only the transmit queue.
pub(in crate::endpoint) fn cancel_receives_into(endpoint: &LibfabricEndpoint) {
    if 0 == endpoint.operations.receives_into() {
        return;
    }
    for slot in endpoint.operations.slots.iter() {
        // SAFETY: the endpoint is open; fi_cancel only looks the context up among the
        // operations it holds, and a context it does not hold is -FI_ENOENT.
        let _ = unsafe {
            sys::fi_cancel(
                &raw mut (*endpoint.handles.ep).fid,
                slot.context.get().cast(),
            )
        };
    }
    // Sleeping between reads where the queues have a wait object (see `wait`).
    let _drained = endpoint.wait_until(
        Deadline::after(LibfabricEndpoint::SEND_DRAIN_PATIENCE),
        || {
            endpoint.progress();
            (0 == endpoint.operations.receives_into()).then_some(())
        },
    );
}
