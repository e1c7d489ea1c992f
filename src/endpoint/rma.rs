//! The RMA face: `fi_write` and `fi_read` against a [`Lease`], gathers, scatters and writes that
//! notify (posted by `vectored`), each completing to any thread that reaps.
//!
//! # Operations in flight
//!
//! Every operation is posted by the engine's one submit path (see `engine`): a slot of the slab
//! holds, until the operation's completion has been read, the [`Lease`] it was posted against
//! and a hold on its local memory, so neither the AV entry (`fi_av_remove` waits for the lease)
//! nor the memory can go while the provider may still use them. Backpressure (the peer's budget,
//! a full slab, `-FI_EAGAIN`) is waited for until the call's timeout, then answered
//! [`DmaError::WouldBlock`] with nothing in flight; a peer an earlier completion reported gone is
//! refused at once with [`DmaError::PeerUnreachable`].
//!
//! # Drop
//!
//! What dropping the endpoint does with its operations in flight is on
//! [`LibfabricEndpoint::DRAIN_PATIENCE`], where a user reads it.
//!
#[cfg(doc)]
use self::notifications::Notification;
use super::vectored::{self, MAX_PIECES};
use std::time::Duration;

use super::LibfabricEndpoint;
use super::deadline::Deadline;
use super::engine::{JoinPart, Operation, Posted, Sink, Submission, Target};
use super::memory::{RemoteRegion, Segment};
use crate::cache::{Lease, Peer};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

mod calls;
pub(crate) mod messages;
pub(super) mod notifications;

pub(crate) use self::calls::{RmaCall, rma_calls};

impl LibfabricEndpoint {
    /// How long dropping an endpoint drives progress for its operations in flight before it
    /// abandons them.
    ///
    /// Dropping the endpoint first drains its operations: it asks the provider to cancel each
    /// (`fi_cancel`; rxm and tcp cancel only receives, so for RMA this mostly does nothing) and
    /// drives progress until every completion has been read, for at most
    /// this long. Operations still in flight after that (a peer that
    /// never progresses, a provider that dropped a transfer without a completion) are abandoned: their
    /// registrations are closed, then the endpoint, which stops the provider touching their memory,
    /// and only then are their buffers parked (freed once the domain has closed: see `memory`) and
    /// their leases dropped, all before the address cache and the domain close.
    /// [`LibfabricEndpoint::drain_operations`] does the first step on demand.
    pub const DRAIN_PATIENCE: Duration = Duration::from_secs(2);

    rma_calls! {
        lease: Lease<'_>, local: Segment<'_>, remote: RemoteRegion,
        patience: Duration::from_secs(1);
        /// `fi_write` of `source` into the peer's `target`, against `lease`, retrying backpressure
        /// for up to a second. The completion, with `id`, comes from
        /// [`poll_completions`](Self::poll_completions) or [`wait_for`](Self::wait_for); until it
        /// has been read the endpoint holds the lease and the source's memory.
        ///
        /// By default a write completes once the target holds its bytes
        /// ([`WriteCompletion::Delivered`](crate::configuration::WriteCompletion::Delivered)), so
        /// "done" may be told to the peer through any other channel.
        /// [`Configuration::write_completion`](crate::configuration::Configuration::write_completion)
        /// set to `Local` completes it once sent, faster on tcp, at the risk that a completed
        /// write's bytes are not there yet (and never arrive if the target stops or dies first).
        /// The peer's budget
        /// ([`Configuration::max_operations_per_peer`](crate::configuration::Configuration::max_operations_per_peer))
        /// counts the write until its completion is read.
        ///
        /// # Errors
        /// As [`write_within`](Self::write_within).
        fn write;
        /// [`write`](Self::write), retrying backpressure for at most `timeout`. Any `Duration` is
        /// accepted: one too long for a deadline (`Duration::MAX`) retries until the post is taken.
        ///
        /// # Errors
        /// [`DmaError::InvalidArgument`] (nothing posted) for an endpoint without RMA, a lease of
        /// another endpoint's cache, a segment of another endpoint's memory, or a target shorter
        /// than the source; [`DmaError::PeerUnreachable`] (nothing posted, at once) when an earlier
        /// operation's or send's completion reported the peer's connection gone, until its index is
        /// inserted anew; [`DmaError::WouldBlock`] when the provider, the slab or the peer's budget
        /// still pushed back after `timeout` (nothing posted); [`DmaError::Busy`] when a slice or
        /// copy of a [`Local`](crate::endpoint::Exposure::Local) region stayed lent for the
        /// whole `timeout` (the post waits for them, and refuses new ones meanwhile, so threads
        /// that keep borrowing cannot keep it out; nothing posted); [`DmaError::Fabric`] when
        /// `fi_write` failed.
        fn write_within;
        /// `fi_read` of the peer's `source` into `destination`, against `lease`; otherwise as
        /// [`write`](Self::write). Read the destination after the completion.
        ///
        /// # Errors
        /// As [`write_within`](Self::write_within).
        fn read;
        /// [`read`](Self::read), retrying backpressure for at most `timeout` (any `Duration`, as
        /// for [`write_within`](Self::write_within)).
        ///
        /// # Errors
        /// As [`write_within`](Self::write_within).
        fn read_within;
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
        self.check_peer(peer)?;
        let call = RmaCall {
            operation: Operation::Write,
            lease: Target::Unleased {
                fi_addr: peer.fi_addr(),
                client: peer.client(),
            },
            local: source,
            remote: target,
            id,
            timeout,
        };
        self.post(call, Sink::Application, None).map(drop)
    }

    /// `fi_write` or `fi_read` posted by the crate for itself (a rail set's stripe, an async
    /// future's operation): its completion goes to `sink` whichever thread reads it, never to
    /// the application's ready queue (see `engine::sink`); as one part of `join`, if given.
    ///
    /// # Errors
    /// As [`write_within`](Self::write_within); a later part of a join that fails to post is
    /// [`Posted::Abandoned`] instead, its error in the joined completion.
    pub(crate) fn post_for(
        &self,
        call: RmaCall<Lease<'_>, Segment<'_>, RemoteRegion>,
        sink: Sink,
        join: Option<JoinPart>,
    ) -> Result<Posted, DmaError> {
        self.post(call.map_lease(Target::Leased), sink, join)
    }

    pub(super) fn check_rma(&self) -> Result<(), DmaError> {
        if self.operations.enabled {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(
                "the endpoint was opened without Configuration::rma".into(),
            ))
        }
    }

    /// The one path of [`write_within`](Self::write_within) and [`read_within`](Self::read_within)
    /// (see `rma_calls!`): the application's operation, against a lease.
    fn transfer(
        &self,
        call: RmaCall<Lease<'_>, Segment<'_>, RemoteRegion>,
    ) -> Result<(), DmaError> {
        self.post(call.map_lease(Target::Leased), Sink::Application, None)
            .map(drop)
    }

    /// Post `call` against its target, its completion to `sink`, as a part of `join` if given.
    /// Every RMA call but the vectored ones comes here.
    fn post(
        &self,
        call: RmaCall<Target<'_>, Segment<'_>, RemoteRegion>,
        sink: Sink,
        join: Option<JoinPart>,
    ) -> Result<Posted, DmaError> {
        let RmaCall {
            operation,
            lease: target,
            local,
            remote,
            id,
            timeout,
        } = call;
        self.check_transfer(&local, &remote)?;
        // Before the slot: a region lending a slice is waited for within the patience (then
        // Busy), and nothing is taken meanwhile.
        let deadline = Deadline::after(timeout);
        let hold = local.region.hold(deadline)?;
        let timeout = deadline.remaining().unwrap_or(timeout);
        let buffer = local.region.at(local.offset);
        let desc = local.region.desc();
        let submission = Submission {
            operation,
            target,
            hold,
            len: local.len,
            id,
            join,
            slot: None,
            sink,
        };
        let ep = self.handles.ep;
        let write_flags = self.operations.write_flags;
        self.submit(submission, timeout, &mut |fi_addr, context| {
            // SAFETY: the endpoint is open; `buffer` is `local.len` bytes inside a registered
            // region (checked by `Segment`) whose registration the slot holds until the
            // completion has been read, and `desc` is that region's descriptor; the context is
            // the slot's, which lives in the slab for as long as the endpoint (the slab is
            // dropped after the handles close). The remote address and key are the peer's to
            // check.
            unsafe {
                match operation {
                    // `fi_writemsg` with explicit flags, not `fi_write`: the configuration's
                    // `write_completion` chooses between the target's acknowledgement
                    // (`FI_DELIVERY_COMPLETE`) and the local completion.
                    Operation::Write => {
                        let piece = sys::iovec {
                            iov_base: buffer.cast(),
                            iov_len: local.len,
                        };
                        let mut desc = desc;
                        let target = sys::fi_rma_iov {
                            addr: remote.address,
                            len: local.len,
                            key: remote.key,
                        };
                        let message = sys::fi_msg_rma {
                            msg_iov: &raw const piece,
                            desc: &raw mut desc,
                            iov_count: 1,
                            addr: fi_addr,
                            rma_iov: &raw const target,
                            rma_iov_count: 1,
                            context,
                            data: 0,
                        };
                        sys::fi_writemsg(ep, &raw const message, write_flags)
                    }
                    Operation::Read => sys::fi_read(
                        ep,
                        buffer.cast(),
                        local.len,
                        desc,
                        fi_addr,
                        remote.address,
                        remote.key,
                        context,
                    ),
                    // `send_from` and `receive_into` post through `messages`, never here.
                    Operation::Send | Operation::Receive => -(sys::FI_EINVAL as isize),
                }
            }
        })
    }

    /// What [`post`](Self::post) checks before it takes anything: RMA is on, the local segment
    /// is this endpoint's memory and fits the remote region, and the remote region does not
    /// wrap past 2^64.
    fn check_transfer(&self, local: &Segment<'_>, remote: &RemoteRegion) -> Result<(), DmaError> {
        self.check_memory(local, "local")?;
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
        Ok(())
    }

    /// The provider's memory-registration mode (`domain_attr.mr_mode`: `FI_MR_VIRT_ADDR`,
    /// `FI_MR_PROV_KEY`, ...), which [`register`](Self::register) honours.
    pub fn mr_mode(&self) -> i32 {
        self.operations.mr_mode
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
        vectored::post_vectored(
            self,
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
        vectored::post_vectored(
            self,
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
        vectored::write_with_data_to(
            self,
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
        vectored::write_with_data_to(
            self,
            lease,
            source,
            target,
            data,
            id,
            timeout,
            Sink::Application,
        )
    }
}
