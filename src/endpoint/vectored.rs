//! Scatter and gather (`fi_writemsg`, `fi_readmsg`) and writes that notify (`fi_writedata`).
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

impl LibfabricEndpoint {
    /// `fi_writemsg` of `sources` (segments of one region), back to back, into the peer's
    /// `target`, against `lease`, retrying backpressure for up to a second; split past the
    /// provider's limit of pieces and joined into one completion with `id` (see
    /// `src/endpoint/vectored.rs`, "Scatter and gather").
    ///
    /// # Errors
    /// As [`write_gather_within`](Self::write_gather_within).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    /// # use std::time::Duration;
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let (server, client) = (
    ///     LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?,
    ///     LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?,
    /// );
    /// let mut pages = vec![0_u8; 4 * 4096];
    /// for (page, chunk) in pages.chunks_mut(4096).enumerate() {
    ///     chunk.fill(page as u8);
    /// }
    /// let pool = server.register_buffer(pages, Exposure::Local)?;
    /// let target = client.register(2 * 4096)?;
    /// let address = client.local_address()?;
    /// let done = std::sync::atomic::AtomicBool::new(false);
    /// std::thread::scope(|scope| {
    ///     // The target lands the bytes as it progresses (tcp progresses manually).
    ///     scope.spawn(|| while !done.load(std::sync::atomic::Ordering::Acquire) {
    ///         client.progress();
    ///     });
    ///     let lease = server.cache().lease(1, &address)?;
    ///     // Pages 3 and 1, in that order, into the peer's two pages: one message, no copy.
    ///     let pieces = [pool.segment(3 * 4096, 4096)?, pool.segment(4096, 4096)?];
    ///     server.write_gather(lease, &pieces, target.remote(), 7)?;
    ///     let completion = server.wait_for(7, Duration::from_secs(20));
    ///     let mut last = [0];
    ///     while completion.is_ok() && { target.read_bytes(2 * 4096 - 1, &mut last)?; 1 != last[0] } {}
    ///     done.store(true, std::sync::atomic::Ordering::Release);
    ///     let completion = completion?;
    ///     assert_eq!((2 * 4096, Ok(())), (completion.len, completion.result));
    ///     Ok::<(), dma_libfabric::DmaError>(())
    /// })?;
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn write_gather(
        &self,
        lease: Lease<'_>,
        sources: &[Segment<'_>],
        target: RemoteRegion,
        id: u64,
    ) -> Result<(), DmaError> {
        self.write_gather_within(lease, sources, target, id, Duration::from_secs(1))
    }

    /// [`write_gather`](Self::write_gather), retrying backpressure for at most `timeout` (any
    /// `Duration`).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA, no sources,
    /// sources of more than one region or of another endpoint's memory, a lease of another
    /// endpoint's cache, sources longer together than the target, or a target whose end
    /// overflows; [`DmaError::Busy`] when a slice of the region stayed lent for the whole
    /// `timeout` (the post waits for slices lent, refusing new ones meanwhile);
    /// [`DmaError::WouldBlock`] or [`DmaError::Fabric`] when the first message could not be
    /// posted (nothing posted). A later message that fails to post fails the joined completion
    /// instead.
    pub fn write_gather_within(
        &self,
        lease: Lease<'_>,
        sources: &[Segment<'_>],
        target: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.post_vectored(
            Operation::Write,
            lease,
            sources,
            target,
            id,
            timeout,
            Sink::Application,
        )
    }

    /// `fi_readmsg` of the peer's `source` into `destinations` (segments of one region), back to
    /// back; otherwise as [`write_gather`](Self::write_gather).
    ///
    /// # Errors
    /// As [`write_gather_within`](Self::write_gather_within).
    pub fn read_scatter(
        &self,
        lease: Lease<'_>,
        destinations: &[Segment<'_>],
        source: RemoteRegion,
        id: u64,
    ) -> Result<(), DmaError> {
        self.read_scatter_within(lease, destinations, source, id, Duration::from_secs(1))
    }

    /// [`read_scatter`](Self::read_scatter), retrying backpressure for at most `timeout`.
    ///
    /// # Errors
    /// As [`write_gather_within`](Self::write_gather_within).
    pub fn read_scatter_within(
        &self,
        lease: Lease<'_>,
        destinations: &[Segment<'_>],
        source: RemoteRegion,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.post_vectored(
            Operation::Read,
            lease,
            destinations,
            source,
            id,
            timeout,
            Sink::Application,
        )
    }

    /// How many pieces one message carries here: the provider's `tx_attr.iov_limit` and
    /// `rma_iov_limit`, the smaller, and at most [`MAX_PIECES`].
    pub fn pieces_per_message(&self) -> usize {
        // SAFETY: the endpoint was opened from `info`, which it frees only when it drops;
        // fi_getinfo fills every attribute pointer.
        let (iov, rma_iov) = unsafe {
            let tx = (*self.handles.info).tx_attr;
            ((*tx).iov_limit, (*tx).rma_iov_limit)
        };
        iov.min(rma_iov).clamp(1, MAX_PIECES)
    }

    /// `pieces` checked against this endpoint and `remote`, before anything is taken: the first
    /// piece (whose region every piece shares) and the length of them all.
    ///
    /// # Errors
    /// As [`write_gather_within`](Self::write_gather_within)'s `InvalidArgument`s, but for the
    /// lease's.
    fn check_pieces<'a>(
        &self,
        pieces: &'a [Segment<'a>],
        remote: &RemoteRegion,
    ) -> Result<(&'a Segment<'a>, usize), DmaError> {
        self.check_rma()?;
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
        if first.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the local segments are memory of another endpoint".into(),
            ));
        }
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
        &self,
        operation: Operation,
        lease: Lease<'_>,
        pieces: &[Segment<'_>],
        remote: RemoteRegion,
        id: u64,
        timeout: Duration,
        sink: Sink,
    ) -> Result<(), DmaError> {
        let (first, total) = self.check_pieces(pieces, &remote)?;
        // Checked before anything is posted: a split transfer's later parts need no check.
        self.check_peer(lease.peer())?;
        // A region lending a slice is waited for within the patience (then Busy); what is left
        // of it bounds the rest.
        let deadline = Deadline::after(timeout);
        let first_hold = first.region.hold(deadline)?;
        let timeout = deadline.remaining().unwrap_or(timeout);
        let per_message = self.pieces_per_message();
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
            return self
                .submit_message(submission, pieces, at, remote.key, None, timeout)
                .map(drop);
        }
        // Every part's slot first, so that a part once posted is never left waiting for one.
        let mut slots = self.reserve_slots(parts, timeout)?.into_iter();
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
            match self.submit_message(submission, chunk, at, remote.key, None, timeout) {
                Ok(Posted::Posted) => at += len as u64,
                Ok(Posted::Abandoned) => break,
                Err(error) => {
                    self.release_slots(slots);
                    return Err(error);
                }
            }
        }
        self.release_slots(slots);
        Ok(())
    }

    /// Post `chunk` (at most [`MAX_PIECES`] segments) as one message to `at` under `key`.
    fn submit_message(
        &self,
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
        let ep = self.handles.ep;
        let mut flags = match operation {
            Operation::Write => self.operations.write_flags,
            _ => u64::from(sys::FI_COMPLETION),
        };
        if data.is_some() {
            flags |= u64::from(sys::FI_REMOTE_CQ_DATA);
        }
        self.submit(submission, timeout, &mut |fi_addr, context| {
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

    /// `fi_writedata` of `source` into the peer's `target` with `data`, against `lease`,
    /// retrying backpressure for up to a second: the target is told, with a
    /// [`Notification`] carrying `data`, once the bytes have landed. The completion, with `id`,
    /// is an [`Operation::Write`] as for [`write`](Self::write).
    ///
    /// # Errors
    /// [`DmaError::Unsupported`] for a provider without remote CQ data
    /// (`domain_attr.cq_data_size` 0), and [`DmaError::InvalidArgument`] for `data` wider than
    /// it carries; otherwise as [`write_within`](Self::write_within). Nothing is posted on an
    /// error.
    pub fn write_with_data(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        data: u64,
        id: u64,
    ) -> Result<(), DmaError> {
        self.write_with_data_to(
            lease,
            source,
            target,
            data,
            id,
            Duration::from_secs(1),
            Sink::Application,
        )
    }

    /// [`write_with_data`](Self::write_with_data), retrying backpressure, and waiting for the
    /// target's notification credit, for at most `timeout` (any `Duration`: `Duration::ZERO`
    /// tries once; one too long for a deadline, `Duration::MAX`, waits until the post is taken).
    ///
    /// On a credited endpoint ([`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited))
    /// a target grants each writer a window of notifications
    /// ([`ReceiveWindow::notifications`](crate::configuration::ReceiveWindow::notifications)) and
    /// grants again as its application polls them, so a target that stops polling makes its
    /// writers wait and then answers [`DmaError::WouldBlock`]; it never drops one.
    ///
    /// # Errors
    /// As [`write_with_data`](Self::write_with_data).
    pub fn write_with_data_within(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        data: u64,
        id: u64,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.write_with_data_to(lease, source, target, data, id, timeout, Sink::Application)
    }

    /// [`write_with_data`](Self::write_with_data), retrying backpressure for at most `timeout`,
    /// whose completion goes to `sink`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_with_data_to(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        data: u64,
        id: u64,
        timeout: Duration,
        sink: Sink,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        // SAFETY: as in `pieces_per_message`.
        let width = unsafe { (*(*self.handles.info).domain_attr).cq_data_size };
        if 0 == width {
            return Err(DmaError::Unsupported(format!(
                "{} carries no remote CQ data (domain_attr.cq_data_size is 0)",
                self.describe().provider
            )));
        }
        if width < 8 && data >> (8 * width) != 0 {
            return Err(DmaError::InvalidArgument(format!(
                "{data:#x} is wider than the provider's {width}-byte remote CQ data"
            )));
        }
        if source.region.domain() != self.handles.domain {
            return Err(DmaError::InvalidArgument(
                "the local segment is memory of another endpoint".into(),
            ));
        }
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
        let credit = self.wait_for_credit(lease.peer().fi_addr(), What::Notification, deadline)?;
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
        let posted = self.submit_message(
            submission,
            &[source],
            target.address,
            target.key,
            Some(data),
            deadline.remaining().unwrap_or(timeout),
        );
        if posted.is_err() {
            self.give_back_credit(credit);
        }
        posted.map(drop)
    }
}
