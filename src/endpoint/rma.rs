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
//! # Dead peers
//!
//! A completion whose provider error says the peer's connection is gone (see `completions`)
//! marks the peer's AV index, for the incarnation the operation was posted to, in the record the
//! sends share (`av::unreachable`); `submit`, which every post goes through, refuses a marked
//! index at once with [`DmaError::PeerUnreachable`], before taking a slot, until the index is
//! inserted anew.
//!
//! # Drop
//!
//! What dropping the endpoint does with its operations in flight is on
//! [`LibfabricEndpoint::DRAIN_PATIENCE`], where a user reads it.
//!
//! # Lifetime erasure
//!
//! A `Lease<'cache>` borrows the endpoint's own cache; stored in a slot it is a `Lease<'static>`.
//! That is sound because (1) only leases of this endpoint's cache are accepted (checked with
//! [`AddressCache::owns`](crate::cache::AddressCache::owns)), and (2) every slot is emptied, its lease
//! dropped, before the endpoint drops its cache (`LibfabricEndpoint::drop` drains and abandons
//! first), so no stored lease outlives the counters it points into.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use self::operations::{InFlight, JoinPart, Owner};
use super::LibfabricEndpoint;
use super::deadline::Deadline;
use super::memory::registration::OperationHold;
use super::memory::{RemoteRegion, Segment};
use crate::cache::{Lease, Peer};
use crate::error::DmaError;
use crate::sync::lock;
use dma_libfabric_sys as sys;

mod calls;
mod messages;
pub(super) mod notifications;
pub(super) mod operations;

pub(crate) use self::calls::{RmaCall, rma_calls};
pub(super) use self::operations::Operations;
pub use self::operations::{Completion, MAX_OPERATIONS, Operation};

/// What [`LibfabricEndpoint::submit`] posts.
pub(super) struct Submission<'lease> {
    pub(super) operation: Operation,
    pub(super) target: Target<'lease>,
    /// The local memory, held until the completion has been read.
    pub(super) hold: OperationHold,
    /// The bytes transferred.
    pub(super) len: usize,
    pub(super) id: u64,
    /// The joined transfer this is a part of, if any.
    pub(super) join: Option<JoinPart>,
    /// A slot [`LibfabricEndpoint::reserve_slots`] took for it, or `None` to take one.
    pub(super) slot: Option<usize>,
    /// Who receives the completion: the application when `None` (see `completions`, "Routing").
    pub(super) owner: Option<Owner>,
}

/// Whether [`LibfabricEndpoint::submit`] posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Posted {
    /// The provider took it.
    Posted,
    /// A later part of a joined transfer failed to post: the joined completion carries the
    /// error, and no more parts may be posted.
    Abandoned,
}

/// How RMA calls name their remote side.
pub(super) enum Target<'lease> {
    Leased(Lease<'lease>),
    /// The caller promised the entry outlives the operation.
    Unleased {
        /// The index posted against.
        fi_addr: sys::fi_addr_t,
        /// The client its peer was resolved for.
        client: u64,
    },
}

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
        if !self.peers.owns(peer) {
            return Err(DmaError::InvalidArgument(
                "the peer was resolved through another endpoint's cache".into(),
            ));
        }
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
        self.post(call, None)
    }

    /// `fi_write` or `fi_read` posted by the crate for itself (a rail set's stripe): its
    /// completion, with `token` as its id, goes to `owner` whichever thread reads it, never to
    /// the application's ready queue (see `completions`, "Routing").
    ///
    /// # Errors
    /// As [`write_within`](Self::write_within).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post_owned(
        &self,
        operation: Operation,
        lease: Lease<'_>,
        local: Segment<'_>,
        remote: RemoteRegion,
        token: u64,
        timeout: Duration,
        owner: Owner,
    ) -> Result<(), DmaError> {
        let call = RmaCall {
            operation,
            lease: Target::Leased(lease),
            local,
            remote,
            id: token,
            timeout,
        };
        self.post(call, Some(owner))
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
        self.post(call.map_lease(Target::Leased), None)
    }

    /// Post `call` against its target: whose completion goes to `owner`, or to the application's
    /// ready queue for `None` (see `completions`, "Routing"). Every RMA call but the vectored ones
    /// comes here.
    fn post(
        &self,
        call: RmaCall<Target<'_>, Segment<'_>, RemoteRegion>,
        owner: Option<Owner>,
    ) -> Result<(), DmaError> {
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
            join: None,
            slot: None,
            owner,
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
        .map(drop)
    }

    /// What [`post`](Self::post) checks before it takes anything: RMA is on, the local segment
    /// is this endpoint's memory and fits the remote region, and the remote region does not
    /// wrap past 2^64.
    fn check_transfer(&self, local: &Segment<'_>, remote: &RemoteRegion) -> Result<(), DmaError> {
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
        Ok(())
    }

    /// Take `count` free slots at once, for a transfer posted in parts, waiting up to `timeout`
    /// (driving progress) until that many are free. They are this thread's until each is
    /// submitted ([`Submission::slot`]) or [released](Self::release_slots).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for more than the slab holds; [`DmaError::WouldBlock`]
    /// when they were not free in time (none taken).
    pub(super) fn reserve_slots(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<usize>, DmaError> {
        if count > self.operations.slots.len() {
            return Err(DmaError::InvalidArgument(format!(
                "a transfer of {count} parts needs more than the {} operations this endpoint \
                 keeps in flight",
                self.operations.slots.len()
            )));
        }
        let take = || {
            let mut free = lock(&self.operations.free);
            let at = free.len().checked_sub(count)?;
            Some(free.split_off(at))
        };
        // Slots come free only as completions are read and taken: sleep for them.
        self.after_progress(Deadline::after(timeout), take)
            .ok_or(DmaError::WouldBlock)
    }

    /// Give back slots [`reserve_slots`](Self::reserve_slots) took and nothing was posted in.
    pub(super) fn release_slots(&self, slots: impl IntoIterator<Item = usize>) {
        lock(&self.operations.free).extend(slots);
    }

    /// Post one operation through a slot: the lease checked and stored, a slot taken (waiting
    /// up to `timeout`, driving progress), `issue` called with the peer's `fi_addr_t` and the
    /// slot's context until the provider takes it or `timeout` passes. `issue` must hand the
    /// provider only memory the submission's hold keeps alive.
    ///
    /// A part of a joined transfer (`submission.join`) that fails to post after an earlier part
    /// was posted is not an error here: the failure goes into the joined completion, whose
    /// remaining parts are given up ([`Posted::Abandoned`]), and the caller posts no more parts.
    pub(super) fn submit(
        &self,
        submission: Submission<'_>,
        timeout: Duration,
        issue: &mut dyn FnMut(sys::fi_addr_t, *mut c_void) -> isize,
    ) -> Result<Posted, DmaError> {
        let Submission {
            operation,
            target,
            hold,
            len,
            id,
            join,
            slot: reserved,
            owner,
        } = submission;
        let (fi_addr, client, lease) = self.stored_target(target)?;
        // A peer an earlier completion reported gone (this incarnation of its index): refused
        // at once, nothing posted, rather than retried into `WouldBlock` for the whole timeout.
        // A later part of a joined transfer is not checked: its first part was, for the same
        // peer, and a mark made since is met by the part's own completion.
        let later_part = join.as_ref().is_some_and(|part| !part.first);
        if let Some(code) = self.operations.peers.unreachable.dead(fi_addr) {
            if !later_part {
                if let Some(index) = reserved {
                    self.release_slots([index]);
                }
                return Err(super::sends::unreachable(fi_addr, Some(client), code));
            }
        }
        let incarnation = self.operations.peers.unreachable.incarnation(fi_addr);
        let deadline = Deadline::after(timeout);
        let index = self.admit(fi_addr, incarnation, later_part, reserved, deadline)?;
        let slot = &self.operations.slots[index];
        let part = join.as_ref().map(|part| Arc::clone(&part.join));
        // SAFETY: the slot came off the free list, so this thread owns it until it is posted.
        unsafe {
            *slot.operation.get() = Some(InFlight {
                id,
                operation,
                len,
                lease,
                region: hold,
                fi_addr,
                client: Some(client),
                incarnation,
                owner,
                join: part,
            });
        }
        slot.posted_at
            .set(self.operations.born, id, operation, fi_addr, Some(client));
        self.operations.in_flight.fetch_add(1, Ordering::AcqRel);
        // `-FI_EAGAIN` (a full transmit queue, a connection being set up) is retried after
        // progress, sleeping between attempts: short ones, since the post that was refused is
        // what the wait is for (see `wait`, `retry_soon`), not a spin.
        let again = -(sys::FI_EAGAIN as isize);
        let mut attempt = || {
            let code = issue(fi_addr, slot.context.get().cast());
            if code == again {
                self.operations.waiter.retry_soon();
                self.progress();
                return None;
            }
            Some(code)
        };
        let code = attempt()
            .or_else(|| self.wait_until(deadline, attempt))
            .unwrap_or(again);
        if 0 == code {
            return Ok(Posted::Posted);
        }
        // SAFETY: `issue` failed, so the provider did not take the slot: still this thread's.
        unsafe { self.unposted(index, code, operation, id, join) }
    }

    /// Take one of the peer's budget (see `budget`) and a slot for an operation to `fi_addr`'s
    /// `incarnation`, waiting until `deadline` for each: a peer with its budget in flight waits
    /// for one of its own completions, and never takes what other peers need. A later part of an
    /// admitted transfer is always admitted: a transfer is not cut in the middle. `reserved` is the
    /// slot [`reserve_slots`](Self::reserve_slots) took for it, if any; on an error it is given
    /// back, and nothing is held.
    ///
    /// # Errors
    /// [`DmaError::WouldBlock`] when the budget or a slot was not free by `deadline`.
    fn admit(
        &self,
        fi_addr: sys::fi_addr_t,
        incarnation: u32,
        later_part: bool,
        reserved: Option<usize>,
        deadline: Deadline,
    ) -> Result<usize, DmaError> {
        let budget = &self.operations.sends.budget;
        let admitted = || budget.take(fi_addr, incarnation, later_part).then_some(());
        if self.after_progress(deadline, admitted).is_none() {
            if let Some(index) = reserved {
                self.release_slots([index]);
            }
            return Err(DmaError::WouldBlock);
        }
        if let Some(index) = reserved {
            return Ok(index);
        }
        // A full slab frees a slot only when a completion is read and taken: sleep for it.
        let free = || lock(&self.operations.free).pop();
        self.after_progress(deadline, free).ok_or_else(|| {
            budget.give_back(fi_addr, incarnation);
            DmaError::WouldBlock
        })
    }

    /// Where an operation on `target` is posted, and the lease its slot keeps (`'static`: see
    /// the module docs, "Lifetime erasure").
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for a lease of another endpoint's cache.
    fn stored_target(
        &self,
        target: Target<'_>,
    ) -> Result<(sys::fi_addr_t, u64, Option<Lease<'static>>), DmaError> {
        match target {
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
                Ok((lease.fi_addr(), lease.client(), Some(lease)))
            }
            Target::Unleased { fi_addr, client } => Ok((fi_addr, client, None)),
        }
    }

    /// Empty slot `index`, whose post `issue` refused with `code`: its lease and buffer go now,
    /// and the slot goes back to the free list, or, for a later part of a joined transfer,
    /// carries the joined completion if this part was the last one outstanding.
    ///
    /// # Safety
    /// Slot `index` is this thread's: filled by `submit` and not taken by the provider.
    unsafe fn unposted(
        &self,
        index: usize,
        code: isize,
        operation: Operation,
        id: u64,
        join: Option<JoinPart>,
    ) -> Result<Posted, DmaError> {
        let slot = &self.operations.slots[index];
        // SAFETY: the slot is this thread's (the caller's promise).
        let owner = unsafe { (*slot.operation.get()).take() }.and_then(|operation| {
            self.operations
                .sends
                .budget
                .give_back(operation.fi_addr, operation.incarnation);
            operation.owner
        });
        slot.posted_at.clear();
        self.operations.in_flight.fetch_sub(1, Ordering::AcqRel);
        let error = if code == -(sys::FI_EAGAIN as isize) {
            DmaError::WouldBlock
        } else {
            DmaError::fabric(operation.call(), code as i64)
        };
        match join {
            Some(part) if !part.first => {
                part.join.record(Err(error));
                if part.join.finish(part.unposted) {
                    let completion = part.join.completion(id, operation);
                    match owner {
                        // The crate's own transfer: its party gets the completion, and the
                        // slot is free at once (see `completions`, "Routing").
                        Some(owner) => {
                            lock(&self.operations.free).push(index);
                            owner.completed(completion);
                        }
                        None => {
                            lock(&self.operations.ready).push_back((index, completion));
                            self.operations.waiter.ring();
                        }
                    }
                } else {
                    lock(&self.operations.free).push(index);
                }
                Ok(Posted::Abandoned)
            }
            _ => {
                lock(&self.operations.free).push(index);
                Err(error)
            }
        }
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
}
