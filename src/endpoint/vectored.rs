//! Scatter and gather (`fi_writemsg`, `fi_readmsg`) and writes that notify (`fi_writedata`):
//! how they are posted, as module functions on the endpoint; the calls a user makes are on the
//! RMA face (`rma`), the async face calls these functions with a sink of its own.
//!
//! # Scatter and gather
//!
//! [`LibfabricEndpoint::write_gather`] writes several local segments (pages of one region) into
//! one remote range, back to back; [`LibfabricEndpoint::read_scatter`] reads one remote range
//! into several local segments. Each message carries up to the provider's limit of pieces
//! (`tx_attr.iov_limit` and `tx_attr.rma_iov_limit`, the smaller, and at most [`MAX_PIECES`]):
//! a transfer of more pieces is split into several messages, posted in order, and joined into
//! one [`Completion`] with the caller's id and the whole length, carrying the
//! first part's error if any (as a rail set joins its stripes). One lease covers the whole
//! transfer (each part holds a clone of it until its completion has been read), and the region's
//! memory is held, as for a single write, until the last part's completion has been read.
//!
//! A part that fails to post after an earlier one was posted does not make the call fail: the
//! parts posted complete, and the joined completion carries the failure. A failure to post the
//! first part is the call's error, with nothing posted. Building the messages allocates
//! nothing (fixed arrays of [`MAX_PIECES`]); a split transfer allocates its join (one `Arc`).
//!
//! # Writes that notify
//!
//! [`LibfabricEndpoint::write_with_data`] is an `fi_writedata`: the target's receive queue gets a
//! completion carrying 64 bits of the initiator's choosing (as many as the provider's
//! `domain_attr.cq_data_size` allows) once the bytes have landed, so "your chunk has landed"
//! needs no second message. The target reads its receive queue in
//! [`try_receive`](LibfabricEndpoint::try_receive) and [`receive`](LibfabricEndpoint::receive)
//! (which a server's loop runs anyway), which set such completions aside as [`Notification`]s
//! for [`poll_notifications`](LibfabricEndpoint::poll_notifications). At most
//! [`Configuration::cq_size`](crate::configuration::Configuration::cq_size) notifications wait (the bound of
//! the receive queue they came from); past it the oldest is dropped and counted
//! ([`dropped_notifications`](LibfabricEndpoint::dropped_notifications)).

use super::credits::flow;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use super::LibfabricEndpoint;
use super::credits::What;
use super::deadline::Deadline;
#[cfg(doc)]
use super::engine::Completion;
use super::engine::{Join, JoinPart, Operation, Posted, Sink, Submission, Target};
use super::memory::{RemoteRegion, Segment};
use crate::cache::Lease;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// The most pieces one `fi_writemsg`/`fi_readmsg` carries, whatever the provider allows: the
/// size of the arrays a message is built in, on the stack.
pub const MAX_PIECES: usize = 16;

pub use super::rma::notifications::Notification;

/// `pieces` checked against this endpoint and `remote`, before anything is taken: the first
/// piece (whose region every piece shares) and the length of them all.
///
/// # Errors
/// As [`write_gather_within`](LibfabricEndpoint::write_gather_within)'s `InvalidArgument`s, but for the
/// lease's.
fn check_pieces<'a>(
    endpoint: &LibfabricEndpoint,
    pieces: &'a [Segment<'a>],
    remote: &RemoteRegion,
) -> Result<(&'a Segment<'a>, usize), DmaError> {
    endpoint.check_rma()?;
    let Some(first) = pieces.first() else {
        return Err(DmaError::InvalidArgument(
            "a scatter/gather transfer of no segments".into(),
        ));
    };
    if pieces
        .iter()
        .any(|piece| !Arc::ptr_eq(piece.region, first.region))
    {
        return Err(DmaError::InvalidArgument(
            "the segments of one scatter/gather transfer are of one region".into(),
        ));
    }
    endpoint.check_memory(first, "local")?;
    let total = pieces
        .iter()
        .try_fold(0_usize, |total, piece| total.checked_add(piece.len))
        .filter(|&total| total as u64 <= remote.len)
        .ok_or_else(|| {
            DmaError::InvalidArgument(format!(
                "the segments do not fit the {}-byte remote region together",
                remote.len
            ))
        })?;
    if remote.address.checked_add(remote.len).is_none() {
        return Err(DmaError::InvalidArgument(format!(
            "the remote region at {:#x} of {} bytes ends past 2^64",
            remote.address, remote.len
        )));
    }
    Ok((first, total))
}

/// A gather (`Write`) or scatter (`Read`) of `pieces`, whose completion goes to `sink`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn post_vectored(
    endpoint: &LibfabricEndpoint,
    operation: Operation,
    lease: Lease<'_>,
    pieces: &[Segment<'_>],
    remote: RemoteRegion,
    id: u64,
    timeout: Duration,
    sink: Sink,
) -> Result<(), DmaError> {
    let (first, total) = check_pieces(endpoint, pieces, &remote)?;
    // Checked before anything is posted: a split transfer's later parts need no check.
    endpoint.check_peer(lease.peer())?;
    // A region lending a slice is waited for within the patience (then Busy); what is left
    // of it bounds the rest.
    let deadline = Deadline::after(timeout);
    let first_hold = first.region.hold(deadline)?;
    let timeout = deadline.remaining().unwrap_or(timeout);
    let per_message = endpoint.pieces_per_message();
    let parts = pieces.len().div_ceil(per_message);
    if 1 == parts {
        let submission = Submission {
            operation,
            target: Target::Leased(lease),
            hold: first_hold,
            len: total,
            id,
            join: None,
            slot: None,
            sink,
        };
        let at = remote.address;
        return submit_message(endpoint, submission, pieces, at, remote.key, None, timeout)
            .map(drop);
    }
    // Every part's slot first, so that a part once posted is never left waiting for one.
    let mut slots = endpoint.reserve_slots(parts, timeout)?.into_iter();
    let join = Join::new(parts, id, operation, total);
    let mut at = remote.address;
    for (part, chunk) in pieces.chunks(per_message).enumerate() {
        let len: usize = chunk.iter().map(|piece| piece.len).sum();
        let submission = Submission {
            operation,
            target: Target::Leased(lease.clone()),
            hold: first_hold.another(),
            len,
            id,
            join: Some(JoinPart {
                join: Arc::clone(&join),
                unposted: parts - part,
                first: 0 == part,
            }),
            slot: slots.next(),
            sink: sink.clone(),
        };
        match submit_message(endpoint, submission, chunk, at, remote.key, None, timeout) {
            Ok(Posted::Posted) => at += len as u64,
            Ok(Posted::Abandoned) => break,
            Err(error) => {
                endpoint.release_slots(slots);
                return Err(error);
            }
        }
    }
    endpoint.release_slots(slots);
    Ok(())
}

/// Post `chunk` (at most [`MAX_PIECES`] segments) as one message to `at` under `key`.
fn submit_message(
    endpoint: &LibfabricEndpoint,
    submission: Submission<'_>,
    chunk: &[Segment<'_>],
    at: u64,
    key: u64,
    data: Option<u64>,
    timeout: Duration,
) -> Result<Posted, DmaError> {
    let operation = submission.operation;
    let mut iov = [sys::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_PIECES];
    let mut desc = [std::ptr::null_mut::<c_void>(); MAX_PIECES];
    let mut rma_iov = [sys::fi_rma_iov::default(); MAX_PIECES];
    let mut address = at;
    for (index, piece) in chunk.iter().take(MAX_PIECES).enumerate() {
        iov[index] = sys::iovec {
            iov_base: piece.region.at(piece.offset).cast(),
            iov_len: piece.len,
        };
        desc[index] = piece.region.desc();
        rma_iov[index] = sys::fi_rma_iov {
            addr: address,
            len: piece.len,
            key,
        };
        address += piece.len as u64;
    }
    let count = chunk.len().min(MAX_PIECES);
    let ep = endpoint.handles.ep;
    let mut flags = match operation {
        Operation::Write => endpoint.operations.write_flags,
        _ => u64::from(sys::FI_COMPLETION),
    };
    if data.is_some() {
        flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
    }
    endpoint.submit(submission, timeout, &mut |fi_addr, context| {
        let message = sys::fi_msg_rma {
            msg_iov: iov.as_ptr(),
            desc: desc.as_mut_ptr(),
            iov_count: count,
            addr: fi_addr,
            rma_iov: rma_iov.as_ptr(),
            rma_iov_count: count,
            context,
            data: data.unwrap_or(0),
        };
        // SAFETY: the endpoint is open; each of the `count` pieces is a checked segment of
        // one registered region, which the slot's hold keeps registered and alive until the
        // completion has been read, with that region's descriptor; the arrays outlive the
        // call, which copies what it keeps; the context is the slot's. The remote
        // addresses and key are the peer's to check.
        unsafe {
            match operation {
                Operation::Write => sys::fi_writemsg(ep, &raw const message, flags),
                Operation::Read => sys::fi_readmsg(ep, &raw const message, flags),
                // Messages are posted by `rma::messages`, never here.
                Operation::Send | Operation::Receive => -(sys::FI_EINVAL as isize),
            }
        }
    })
}

/// [`write_with_data`](LibfabricEndpoint::write_with_data), retrying backpressure for at most `timeout`,
/// whose completion goes to `sink`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_with_data_to(
    endpoint: &LibfabricEndpoint,
    lease: Lease<'_>,
    source: Segment<'_>,
    target: RemoteRegion,
    data: u64,
    id: u64,
    timeout: Duration,
    sink: Sink,
) -> Result<(), DmaError> {
    endpoint.check_rma()?;
    // SAFETY: as in `pieces_per_message`.
    let width = unsafe { (*(*endpoint.handles.info).domain_attr).cq_data_size };
    if 0 == width {
        return Err(DmaError::Unsupported(format!(
            "{} carries no remote CQ data (domain_attr.cq_data_size is 0)",
            endpoint.describe().provider
        )));
    }
    if width < 8 && data >> (8 * width) != 0 {
        return Err(DmaError::InvalidArgument(format!(
            "{data:#x} is wider than the provider's {width}-byte remote CQ data"
        )));
    }
    endpoint.check_memory(&source, "local")?;
    if (source.len as u64) > target.len || target.address.checked_add(target.len).is_none() {
        return Err(DmaError::InvalidArgument(format!(
            "{} local bytes do not fit the {}-byte remote region at {:#x}, or its end \
             overflows",
            source.len, target.len, target.address
        )));
    }
    // A region lending a slice is waited for within the patience (then Busy).
    let deadline = Deadline::after(timeout);
    let hold = source.region.hold(deadline)?;
    // The target's notification credit next, within the same timeout; given back if
    // nothing is posted.
    let credit = flow::wait_for_credit(
        endpoint,
        lease.peer().fi_addr(),
        What::Notification,
        deadline,
    )?;
    let submission = Submission {
        operation: Operation::Write,
        target: Target::Leased(lease),
        hold,
        len: source.len,
        id,
        join: None,
        slot: None,
        sink,
    };
    let posted = submit_message(
        endpoint,
        submission,
        &[source],
        target.address,
        target.key,
        Some(data),
        deadline.remaining().unwrap_or(timeout),
    );
    if posted.is_err() {
        flow::give_back_credit(endpoint, credit);
    }
    posted.map(drop)
}
