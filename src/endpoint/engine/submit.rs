//! The one submit path: every operation of the slab (a write, a read, a gather's part, a
//! stripe, a `send_from`, a `receive_into`) is posted by [`LibfabricEndpoint::submit`], under one
//! policy for what it checks, what it waits for and how long.
//!
//! # Guarantees
//!
//! - **One check of each side.** A lease or peer of another endpoint's cache is refused
//!   (`check_peer`), and so is memory of another endpoint (`check_memory`), before anything is
//!   taken; a peer an earlier completion reported gone is
//!   refused at once with [`DmaError::PeerUnreachable`].
//! - **One backpressure policy.** The peer's budget, a free slot and the provider's `-FI_EAGAIN`
//!   are each waited for with progress, asleep on the queues between attempts (`after_progress`,
//!   `wait_until`; see `wait`), until one deadline taken once at the start; after it the call
//!   answers [`DmaError::WouldBlock`] and nothing is in flight or held.
//! - **Nothing half done.** An operation that fails to post gives back its slot, its budget, its
//!   lease and its memory before the call returns; a later part of a joined transfer that fails
//!   counts the parts not posted into the join, so the transfer still completes once.
//!
//! # Lifetime erasure
//!
//! A `Lease<'cache>` borrows the endpoint's own cache; stored in a slot it is a `Lease<'static>`.
//! That is sound because (1) only leases of this endpoint's cache are accepted (`check_peer`),
//! and (2) every slot is emptied, its lease dropped, before the endpoint drops its cache
//! (`LibfabricEndpoint::drop` drains and abandons first), so no stored lease outlives the
//! counters it points into.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::completion::Operation;
use super::join::JoinPart;
use super::sink::Sink;
use super::slab::{InFlight, Stage};
use crate::cache::{Lease, Peer};
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::deadline::Deadline;
use crate::endpoint::memory::Segment;
use crate::endpoint::memory::registration::OperationHold;
use crate::error::DmaError;
use crate::sync::lock;
use dma_libfabric_sys as sys;

/// What [`LibfabricEndpoint::submit`] posts.
pub(in crate::endpoint) struct Submission<'lease> {
    pub(in crate::endpoint) operation: Operation,
    pub(in crate::endpoint) target: Target<'lease>,
    /// The local memory, held until the completion has been read.
    pub(in crate::endpoint) hold: OperationHold,
    /// The bytes transferred.
    pub(in crate::endpoint) len: usize,
    pub(in crate::endpoint) id: u64,
    /// The joined transfer this is a part of, if any.
    pub(in crate::endpoint) join: Option<JoinPart>,
    /// A slot [`LibfabricEndpoint::reserve_slots`] took for it, or `None` to take one.
    pub(in crate::endpoint) slot: Option<usize>,
    /// Where the completion goes (see `sink`).
    pub(in crate::endpoint) sink: Sink,
}

/// Whether [`LibfabricEndpoint::submit`] posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Posted {
    /// The provider took it.
    Posted,
    /// A later part of a joined transfer failed to post: the joined completion carries the
    /// error, and no more parts may be posted.
    Abandoned,
}

/// Whom an operation is posted to.
pub(in crate::endpoint) enum Target<'lease> {
    /// A peer held by a lease, which the slot keeps until the completion has been read.
    Leased(Lease<'lease>),
    /// The caller promised the entry outlives the operation.
    Unleased {
        /// The index posted against.
        fi_addr: sys::fi_addr_t,
        /// The client its peer was resolved for.
        client: u64,
    },
    /// No peer: a receive, which takes whoever sends first, and takes no peer's budget.
    Anyone,
}

impl LibfabricEndpoint {
    /// The one check that `peer` (or a lease's peer) was resolved by this endpoint's own cache:
    /// its index means nothing in another endpoint's address vector.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] naming the index, for a peer of another cache.
    pub(in crate::endpoint) fn check_peer(&self, peer: Peer<'_>) -> Result<(), DmaError> {
        if self.peers.owns(peer) {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "peer {} was resolved by another cache than this endpoint's: its index means \
                 nothing in this endpoint's address vector",
                peer.fi_addr()
            )))
        }
    }

    /// The one check that local memory may be posted from: RMA is on, and `segment` is memory
    /// of this endpoint's domain (a key of another domain means nothing to this provider).
    /// `role` names it in the error (`source`, `destination`, `local`).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an endpoint without RMA or memory of another endpoint.
    pub(in crate::endpoint) fn check_memory(
        &self,
        segment: &Segment<'_>,
        role: &str,
    ) -> Result<(), DmaError> {
        self.check_rma()?;
        if segment.region.domain() == self.handles.domain {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "the {role} segment is memory of another endpoint"
            )))
        }
    }

    /// Take `count` free slots at once, for a transfer posted in parts, waiting up to `timeout`
    /// (driving progress) until that many are free. They are this thread's until each is
    /// submitted ([`Submission::slot`]) or [released](Self::release_slots).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for more than the slab holds; [`DmaError::WouldBlock`]
    /// when they were not free in time (none taken).
    pub(in crate::endpoint) fn reserve_slots(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<usize>, DmaError> {
        let operations = &self.operations;
        if count > operations.slots.len() {
            return Err(DmaError::InvalidArgument(format!(
                "a transfer of {count} parts needs more than the {} operations this endpoint \
                 keeps in flight",
                operations.slots.len()
            )));
        }
        let take = || {
            let mut free = lock(&operations.free);
            let at = free.len().checked_sub(count)?;
            Some(free.split_off(at))
        };
        // Slots come free only as completions are read and taken: sleep for them.
        let slots = self
            .after_progress(Deadline::after(timeout), take)
            .ok_or(DmaError::WouldBlock)?;
        for &index in &slots {
            // SAFETY: the slot came off the free list: this thread's.
            unsafe { *operations.slots[index].stage.get() = Stage::Reserved };
        }
        Ok(slots)
    }

    /// Give back slots [`reserve_slots`](Self::reserve_slots) took and nothing was posted in.
    pub(in crate::endpoint) fn release_slots(&self, slots: impl IntoIterator<Item = usize>) {
        self.operations.free_slots(slots);
    }

    /// Post one operation through a slot: the target checked and stored, the peer's budget and
    /// a slot taken (waiting up to `timeout`, driving progress), `issue` called with the peer's
    /// `fi_addr_t` and the slot's context until the provider takes it or `timeout` passes.
    /// `issue` must hand the provider only memory the submission's hold keeps alive.
    ///
    /// A part of a joined transfer (`submission.join`) that fails to post after an earlier part
    /// was posted is not an error here: the failure goes into the joined completion, whose
    /// remaining parts are given up ([`Posted::Abandoned`]), and the caller posts no more parts.
    ///
    /// # Errors
    /// As the module docs say: [`DmaError::InvalidArgument`], [`DmaError::PeerUnreachable`],
    /// [`DmaError::WouldBlock`], or [`DmaError::Fabric`] naming the operation's call; nothing is
    /// posted or held after any of them.
    pub(in crate::endpoint) fn submit(
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
            sink,
        } = submission;
        let (fi_addr, client, lease) = match self.stored_target(target) {
            Ok(stored) => stored,
            Err(error) => {
                self.release_slots(reserved);
                return Err(error);
            }
        };
        let deadline = Deadline::after(timeout);
        let later_part = join.as_ref().is_some_and(|part| !part.first);
        let (index, incarnation) = match client {
            None => (self.free_slot_within(reserved, deadline)?, 0),
            Some(client) => self.admit(fi_addr, client, later_part, reserved, deadline)?,
        };
        let slot = &self.operations.slots[index];
        let part = join.as_ref().map(|part| std::sync::Arc::clone(&part.join));
        // SAFETY: the slot came off the free list, so this thread owns it until it is posted.
        unsafe {
            *slot.stage.get() = Stage::Posted(InFlight {
                id,
                operation,
                len,
                lease,
                region: hold,
                fi_addr,
                client,
                incarnation,
                sink,
                join: part,
            });
        }
        slot.posted_at
            .set(self.operations.born, id, operation, fi_addr, client);
        self.operations.in_flight.fetch_add(1, Ordering::AcqRel);
        if Operation::Receive == operation {
            self.operations.receives_into.fetch_add(1, Ordering::AcqRel);
        }
        // `-FI_EAGAIN` (a full transmit queue, a connection being set up) is retried after
        // progress, sleeping between attempts: short ones, since the post that was refused is
        // what the wait is for (see `wait`, `retry_soon`), not a spin.
        let again = -(sys::FI_EAGAIN as isize);
        let code = self
            .retry_until(deadline, || {
                let code = issue(fi_addr, slot.context.get().cast());
                if code == again {
                    self.operations.waiter.retry_soon();
                    return Err(DmaError::WouldBlock);
                }
                Ok(code)
            })
            .unwrap_or(again);
        if 0 == code {
            return Ok(Posted::Posted);
        }
        // SAFETY: `issue` failed, so the provider did not take the slot: still this thread's.
        unsafe { self.unposted(index, code, operation, join) }
    }

    /// A slot for an operation to no peer: `reserved`, or one off the free list, waiting until
    /// `deadline`.
    ///
    /// # Errors
    /// [`DmaError::WouldBlock`] when no slot was free by `deadline`.
    fn free_slot_within(
        &self,
        reserved: Option<usize>,
        deadline: Deadline,
    ) -> Result<usize, DmaError> {
        if let Some(index) = reserved {
            return Ok(index);
        }
        // A full slab frees a slot only when a completion is read and taken: sleep for it.
        let free = || lock(&self.operations.free).pop();
        self.after_progress(deadline, free)
            .ok_or(DmaError::WouldBlock)
    }

    /// Take one of the peer's budget (see `budget`) and a slot for an operation to `fi_addr`,
    /// waiting until `deadline` for each: a peer with its budget in flight waits for one of its
    /// own completions, and never takes what other peers need. A later part of an admitted
    /// transfer is always admitted: a transfer is not cut in the middle. A peer an earlier
    /// completion reported gone (this incarnation of its index) is refused at once, nothing
    /// posted, rather than retried into `WouldBlock` for the whole timeout; a later part is not
    /// checked (its first part was, for the same peer, and a mark made since is met by the part's
    /// own completion). `reserved` is the slot [`reserve_slots`](Self::reserve_slots) took for
    /// it, if any; on an error it is given back, and nothing is held. Returns the slot and the
    /// incarnation the budget was taken from.
    ///
    /// # Errors
    /// [`DmaError::PeerUnreachable`] for a peer reported gone; [`DmaError::WouldBlock`] when the
    /// budget or a slot was not free by `deadline`.
    fn admit(
        &self,
        fi_addr: sys::fi_addr_t,
        client: u64,
        later_part: bool,
        reserved: Option<usize>,
        deadline: Deadline,
    ) -> Result<(usize, u32), DmaError> {
        let unreachable = &self.operations.peers.unreachable;
        if let Some(code) = unreachable.dead(fi_addr).filter(|_| !later_part) {
            self.release_slots(reserved);
            return Err(crate::endpoint::sends::unreachable(
                fi_addr,
                Some(client),
                code,
            ));
        }
        let incarnation = unreachable.incarnation(fi_addr);
        let budget = &self.operations.sends.budget;
        let admitted = || budget.take(fi_addr, incarnation, later_part).then_some(());
        if self.after_progress(deadline, admitted).is_none() {
            self.release_slots(reserved);
            return Err(DmaError::WouldBlock);
        }
        match self.free_slot_within(reserved, deadline) {
            Ok(index) => Ok((index, incarnation)),
            Err(error) => {
                budget.give_back(fi_addr, incarnation);
                Err(error)
            }
        }
    }

    /// Where an operation on `target` is posted, the client it was resolved for, and the lease
    /// its slot keeps (`'static`: see the module docs, "Lifetime erasure").
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for a lease of another endpoint's cache.
    fn stored_target(
        &self,
        target: Target<'_>,
    ) -> Result<(sys::fi_addr_t, Option<u64>, Option<Lease<'static>>), DmaError> {
        match target {
            Target::Leased(lease) => {
                self.check_peer(lease.peer())?;
                // SAFETY: the lease is of this endpoint's own cache (checked just above), and
                // every stored lease is dropped before the endpoint drops that cache (module
                // docs, "Lifetime erasure"), so the counter it points into outlives it.
                let lease = unsafe { std::mem::transmute::<Lease<'_>, Lease<'static>>(lease) };
                Ok((lease.fi_addr(), Some(lease.client()), Some(lease)))
            }
            Target::Unleased { fi_addr, client } => Ok((fi_addr, Some(client), None)),
            Target::Anyone => Ok((sys::FI_ADDR_UNSPEC, None, None)),
        }
    }

    /// Empty slot `index`, whose post `issue` refused with `code`: its lease and buffer go now,
    /// and the slot goes back to the free list, or, for a later part of a joined transfer,
    /// carries the joined completion to its sink if this part was the last one outstanding.
    ///
    /// # Safety
    /// Slot `index` is this thread's: filled by `submit` and not taken by the provider.
    unsafe fn unposted(
        &self,
        index: usize,
        code: isize,
        operation: Operation,
        join: Option<JoinPart>,
    ) -> Result<Posted, DmaError> {
        let operations = &self.operations;
        let slot = &operations.slots[index];
        // SAFETY: the slot is this thread's (the caller's promise).
        let stage = unsafe { std::mem::replace(&mut *slot.stage.get(), Stage::Delivering) };
        slot.posted_at.clear();
        operations.in_flight.fetch_sub(1, Ordering::AcqRel);
        if Operation::Receive == operation {
            operations.receives_into.fetch_sub(1, Ordering::AcqRel);
        }
        let error = if code == -(sys::FI_EAGAIN as isize) {
            DmaError::WouldBlock
        } else {
            DmaError::fabric(operation.call(), code as i64)
        };
        // `submit` filled the slot, and no other thread owns it: always `Posted`.
        let Stage::Posted(posted) = stage else {
            tracing::warn!(index, "a slot whose post failed held no operation");
            operations.free_slot(index);
            return Err(error);
        };
        if posted.client.is_some() {
            let budget = &operations.sends.budget;
            budget.give_back(posted.fi_addr, posted.incarnation);
        }
        let sink = posted.sink.clone();
        // Its lease and memory go now.
        drop(posted);
        match join {
            Some(part) if !part.first => {
                match part.join.finish(part.unposted, Err(error)) {
                    Some(completion) => operations.deliver(index, &sink, completion),
                    None => operations.free_slot(index),
                }
                Ok(Posted::Abandoned)
            }
            _ => {
                operations.free_slot(index);
                Err(error)
            }
        }
    }

    /// The one backpressure policy: `attempt` now, and while it answers
    /// [`DmaError::WouldBlock`], again after each progress pass, sleeping on the queues between
    /// passes (see `wait`) until `deadline`; `WouldBlock` after it. Every post that can be pushed
    /// back (an operation's `-FI_EAGAIN`, a copied send's full slab or missing credit, a receive
    /// buffer's re-post at `open`) waits through it.
    ///
    /// # Errors
    /// `attempt`'s own, or [`DmaError::WouldBlock`] once `deadline` has passed.
    pub(in crate::endpoint) fn retry_until<T>(
        &self,
        deadline: Deadline,
        mut attempt: impl FnMut() -> Result<T, DmaError>,
    ) -> Result<T, DmaError> {
        let once = || match attempt() {
            Err(DmaError::WouldBlock) => None,
            answer => Some(answer),
        };
        self.after_progress(deadline, once)
            .unwrap_or(Err(DmaError::WouldBlock))
    }

    /// `attempt` now, and while it answers `None`, again after each progress pass, sleeping
    /// between passes until `deadline`: the wait of a post for what only a completion read frees
    /// (a slot, the peer's budget).
    pub(in crate::endpoint) fn after_progress<T>(
        &self,
        deadline: Deadline,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        attempt().or_else(|| {
            self.wait_until(deadline, || {
                self.progress();
                attempt()
            })
        })
    }

    /// Call `attempt` until it answers, sleeping on the completion queues' descriptors between
    /// calls where the provider offers them (see `wait`), or until `deadline`.
    pub(in crate::endpoint) fn wait_until<T>(
        &self,
        deadline: Deadline,
        attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        self.operations.waiter.wait_reading(
            self.operations.sources(),
            deadline,
            attempt,
            |cq, bound| self.operations.reap_blocking(cq, bound),
        )
    }

    /// [`wait_until`](Self::wait_until), after calling `attempt` back to back for up to
    /// `Configuration::spin_before_sleep` (and never past `deadline`) on an endpoint whose waits
    /// sleep: for the waits of one result (`wait_for`, `receive`), where the answer is often
    /// microseconds away and a sleep's wake-up costs tens of them. Not for `progress_sleeping`,
    /// whose second attempt always answers: spinning there would never sleep.
    pub(in crate::endpoint) fn wait_until_spinning_first<T>(
        &self,
        deadline: Deadline,
        mut attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let spin = self.operations.spin_before_sleep;
        if !spin.is_zero() && !self.operations.sources().is_empty() {
            // A spin too long for an instant (`Duration::MAX`) never passes: the wait's own
            // deadline ends it.
            let spinning = Deadline::after(spin);
            loop {
                if let Some(found) = attempt() {
                    return Some(found);
                }
                if deadline.passed() || spinning.passed() {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        self.wait_until(deadline, attempt)
    }
}
