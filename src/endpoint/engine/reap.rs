//! The one reaper: every read of the transmit queue (and the receive queue's `receive_into`
//! completions) hands each completion to the operation whose slot its context names, and every
//! operation's completion reaches its sink one way (`deliver`).
//!
//! # Guarantees
//!
//! - **Each completion once, to its own sink.** The sink is found from the context the provider
//!   returns, which is the slot's own address (checked: inside the slab, on a slot boundary),
//!   never from the id: an application's id cannot collide with the crate's own operations, and
//!   whichever thread reads the queue (a `poll_completions`, a `progress`, a `wait_for`, a rail
//!   set's poll, a blocked `receive`) delivers each completion once.
//! - **Nothing outlives its completion.** The slot's lease and memory are dropped by the reading
//!   thread before the completion is delivered: an application holding a completion holds
//!   nothing of the provider's.
//! - **Sends are not stolen.** A context outside the slab is a send's (see `sends`), handed to
//!   the send slab, which frees its slot and logs an unknown context's error.
//! - **Bounded.** The ready queue holds only completions whose slots are not yet freed, so it is
//!   bounded by the slab; a waiter takes from it only the completion it waits for.

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::completion::{Completion, Operation};
use super::sink::Sink;
use super::slab::{BATCH, InFlight, Operations, Stage};
use crate::endpoint::deadline::Deadline;
use crate::error::DmaError;
use crate::sync::lock;
use dma_libfabric_sys as sys;

/// Why an operation failed, as read from its error entry.
pub(in crate::endpoint) enum Failure {
    /// The provider reported the peer's connection refused, reset or gone, with this provider
    /// error (an errno on tcp).
    PeerLost(DmaError, u32),
    /// Anything else.
    Other(DmaError),
}

/// An error's text without its call: what the provider said, for `PeerUnreachable`'s reason.
fn fabric_text(error: &DmaError) -> String {
    match error {
        DmaError::Fabric { code, message, .. } => format!("{message} (code {code})"),
        other => other.to_string(),
    }
}

impl Operations {
    /// Read every completion the transmit queue `cq` holds now, handing RMA completions to their
    /// operations (their leases and buffers are dropped here) and sends' to the send slab, and
    /// logging an error entry whose context is none of ours (rxm writes one with a null context
    /// for an internal failure; tcp writes none for an injected send, whose failure it only logs
    /// in libfabric's own log, so nothing of an inject ever reaches this).
    /// Drives the provider's progress. Returns how many entries were read.
    pub(crate) fn reap(&self, cq: *mut sys::fid_cq) -> usize {
        let mut total = 0;
        loop {
            let mut entries = [sys::fi_cq_data_entry::default(); BATCH];
            // SAFETY: the queue is open (the endpoint owns it for as long as `self` is used) and
            // `entries` has room for `BATCH` entries of the queue's format.
            let read = unsafe { sys::fi_cq_read(cq, entries.as_mut_ptr().cast(), BATCH) };
            let (taken, more) = self.take(cq, "fi_cq_read", read, &entries);
            total += taken;
            if !more {
                return total;
            }
        }
    }

    /// The blocking-read waiter's sleep (`wait::Waiting::BlockingRead`): `fi_cq_sread` on the
    /// transmit queue `cq` for at most `bound`, returning at the first completion (or a ring's
    /// `fi_cq_signal`), whose entries go to their owners as [`reap`](Self::reap)'s do.
    pub(crate) fn reap_blocking(&self, cq: *mut sys::fid_cq, bound: Duration) {
        let mut entries = [sys::fi_cq_data_entry::default(); BATCH];
        let millis = i32::try_from(bound.as_millis().max(1)).unwrap_or(i32::MAX);
        // SAFETY: as in `reap`; no condition (a null `cond` waits for one entry).
        let read = unsafe {
            sys::fi_cq_sread(
                cq,
                entries.as_mut_ptr().cast(),
                BATCH,
                std::ptr::null(),
                millis,
            )
        };
        let _ = self.take(cq, "fi_cq_sread", read, &entries);
    }

    /// Hand the entries a read of `cq` answered (`read`: a count, or a negative code) to their
    /// owners: how many were taken, and whether the queue may hold more.
    fn take(
        &self,
        cq: *mut sys::fid_cq,
        call: &'static str,
        read: isize,
        entries: &[sys::fi_cq_data_entry; BATCH],
    ) -> (usize, bool) {
        if read > 0 {
            let read = read.unsigned_abs().min(BATCH);
            for entry in &entries[..read] {
                self.complete(entry.op_context, Ok(()));
            }
            (read, read == BATCH)
        } else if read == -(sys::FI_EAVAIL as isize) {
            (usize::from(self.read_error(cq)), true)
        } else {
            if read != -(sys::FI_EAGAIN as isize) && read != -(sys::FI_ECANCELED as isize) {
                tracing::warn!(error = %DmaError::fabric(call, read as i64), "reading the transmit queue failed");
            }
            (0, false)
        }
    }

    /// Read one error entry into a buffer of this call's own; `false` if another thread took it.
    fn read_error(&self, cq: *mut sys::fid_cq) -> bool {
        let Ok(Some(entry)) = crate::endpoint::read_error_entry(cq) else {
            return false;
        };
        if self.index_of(entry.op_context).is_some() {
            let error = entry.error("fi_cq_readerr");
            let error = if u32::try_from(entry.prov_errno)
                .is_ok_and(crate::av::unreachable::says_peer_is_gone)
            {
                Failure::PeerLost(error, entry.prov_errno.unsigned_abs())
            } else {
                Failure::Other(error)
            };
            self.complete(entry.op_context, Err(error));
        } else {
            // A send's (see `sends`), or an unknown context's, logged there. A send's slot is
            // free now, which a sender may be sleeping for.
            if self.sends.failed(&entry) {
                self.waiter.ring();
            }
        }
        true
    }

    /// The completion of the operation whose context is `context`, if it is one of ours.
    pub(in crate::endpoint) fn complete(&self, context: *mut c_void, result: Result<(), Failure>) {
        let Some(index) = self.index_of(context) else {
            match result {
                // A send's (see `sends`): its slot is free, which a sender may be sleeping for.
                Ok(()) => {
                    if self.sends.completed(context) {
                        self.waiter.ring();
                    }
                }
                Err(Failure::Other(error) | Failure::PeerLost(error, _)) => {
                    tracing::warn!(%error, "transmit failed");
                }
            }
            return;
        };
        // SAFETY: this thread read the slot's completion, so it owns the slot (`slab`).
        let stage = unsafe { &mut *self.slots[index].stage.get() };
        let operation = match std::mem::replace(stage, Stage::Delivering) {
            Stage::Posted(operation) => operation,
            other => {
                *stage = other;
                tracing::warn!(
                    index,
                    "a completion for an operation slot that holds nothing"
                );
                return;
            }
        };
        self.slots[index].posted_at.clear();
        // The provider is done with it: its peer may post one more (see `budget`). A receive
        // took none (it is posted to no peer; its `fi_addr` names the sender now).
        if Operation::Receive != operation.operation {
            self.sends
                .budget
                .give_back(operation.fi_addr, operation.incarnation);
        }
        let result = result.map_err(|failure| self.failure(&operation, failure));
        let completion = match &operation.join {
            None => Some(Completion {
                id: operation.id,
                operation: operation.operation,
                len: operation.len,
                sender: operation.sender(),
                result,
            }),
            // Another part still in flight delivers the joined completion.
            Some(join) => join.finish(1, result),
        };
        let sink = operation.sink.clone();
        // The completion has been read: the lease and the buffer may go, before the operation
        // stops counting as in flight, so whoever sees the count reach 0 sees no lease of it.
        drop(operation);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        match completion {
            Some(completion) => self.deliver(index, &sink, completion),
            None => self.free_slot(index),
        }
    }

    /// What `operation`'s error entry says, naming the operation's call rather than the queue
    /// read that reported it. A lost peer is marked, so the next post to it is refused at once
    /// (if its index still holds the incarnation this operation was posted to: see
    /// `av::unreachable`).
    fn failure(&self, operation: &InFlight, failure: Failure) -> DmaError {
        let call = operation.operation.call();
        match failure {
            Failure::PeerLost(error, code) => {
                let marked =
                    self.peers
                        .unreachable
                        .mark(operation.fi_addr, operation.incarnation, code);
                tracing::debug!(
                    peer = operation.fi_addr,
                    marked_unreachable = marked,
                    "an operation's completion says its peer is gone"
                );
                DmaError::PeerUnreachable {
                    peer: operation.fi_addr,
                    client: operation.client,
                    reason: format!("{call}: {}", fabric_text(&error)),
                }
            }
            Failure::Other(DmaError::Fabric { code, message, .. }) => DmaError::Fabric {
                call,
                code,
                message,
            },
            Failure::Other(other) => other,
        }
    }

    /// The one way a completion reaches its sink (see `sink`), from the thread that owns slot
    /// `index` (emptied, its lease and buffer dropped): the application's completion keeps the
    /// slot until it is taken; every other sink's frees it first.
    pub(in crate::endpoint) fn deliver(&self, index: usize, sink: &Sink, completion: Completion) {
        match sink {
            Sink::Application => {
                // SAFETY: the caller owns the slot; the ready queue takes it over.
                unsafe { *self.slots[index].stage.get() = Stage::Ready };
                lock(&self.ready).push_back((index, completion));
                self.waiter.ring();
            }
            Sink::Waker(sink) => {
                self.free_slot(index);
                sink.deliver(completion);
            }
            Sink::Owner(owner) => {
                self.free_slot(index);
                owner.completed(completion);
            }
        }
    }

    /// Put slot `index`, owned by this thread and holding nothing, back on the free list.
    pub(in crate::endpoint) fn free_slot(&self, index: usize) {
        self.free_slots([index]);
    }

    /// Put `indices`, slots owned by this thread and holding nothing, back on the free list, under
    /// one lock of it.
    pub(in crate::endpoint) fn free_slots(&self, indices: impl IntoIterator<Item = usize>) {
        let mut free = lock(&self.free);
        for index in indices {
            // SAFETY: the caller owns the slot; the free list takes it over with this push.
            unsafe { *self.slots[index].stage.get() = Stage::Free };
            free.push(index);
        }
    }

    /// Move every ready completion to `out`, freeing their slots.
    pub(in crate::endpoint) fn take_all_ready(&self, out: &mut Vec<Completion>) -> usize {
        let ready: Vec<_> = lock(&self.ready).drain(..).collect();
        let count = ready.len();
        let mut indices = Vec::with_capacity(count);
        for (index, completion) in ready {
            out.push(completion);
            indices.push(index);
        }
        self.free_slots(indices);
        count
    }

    /// The ready completion with `id`, if any, freeing its slot.
    pub(in crate::endpoint) fn take_ready(&self, id: u64) -> Option<Completion> {
        let mut ready = lock(&self.ready);
        let position = ready
            .iter()
            .position(|(_, completion)| completion.id == id)?;
        let (index, completion) = ready.remove(position)?;
        drop(ready);
        self.free_slot(index);
        Some(completion)
    }

    /// Ask the provider to cancel every operation in flight, then drive progress until none is
    /// or `patience` has passed. Returns how many are still in flight.
    ///
    /// # Safety
    /// `ep` and `cq` are the endpoint and transmit queue the operations were posted on, open.
    pub(in crate::endpoint) unsafe fn drain(
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
        let deadline = Deadline::after(patience);
        self.waiter
            .wait(self.sources(), deadline, || {
                self.reap(cq);
                (0 == self.in_flight.load(Ordering::Acquire)).then_some(())
            })
            .map_or_else(|| self.in_flight.load(Ordering::Acquire), |()| 0)
    }
}

impl Operations {
    /// Whether `context` is one of the slab's operations (a `receive_into` when read from the
    /// receive queue).
    pub(in crate::endpoint) fn owns(&self, context: *mut c_void) -> bool {
        self.index_of(context).is_some()
    }

    /// How many `receive_into`s are posted and not yet completed.
    pub(in crate::endpoint) fn receives_into(&self) -> usize {
        self.receives_into.load(Ordering::Acquire)
    }

    /// The completion of the `receive_into` whose context is `context`, read from the receive
    /// queue by this thread: `received` bytes, or `result`'s error.
    pub(in crate::endpoint) fn complete_receive(
        &self,
        context: *mut c_void,
        received: usize,
        sender: Option<sys::fi_addr_t>,
        result: Result<(), DmaError>,
    ) {
        let Some(index) = self.index_of(context) else {
            return;
        };
        // SAFETY: this thread read the slot's completion, so it owns the slot (`slab`).
        if let Stage::Posted(operation) = unsafe { &mut *self.slots[index].stage.get() } {
            if Operation::Receive == operation.operation {
                operation.len = received;
                // A receive is posted to no peer: its `fi_addr` now names the sender, for
                // `InFlight::sender` (a receive's failure marks no peer, see `complete`).
                operation.fi_addr = sender.unwrap_or(sys::FI_ADDR_NOTAVAIL);
                self.receives_into.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.complete(context, result.map_err(Failure::Other));
    }
}

impl InFlight {
    /// The sender a completed `receive_into` names, for [`Completion::sender`]: `None` for every
    /// other operation, and for a receive whose provider named no sender.
    pub(in crate::endpoint) fn sender(&self) -> Option<sys::fi_addr_t> {
        match self.operation {
            Operation::Receive => crate::endpoint::senders::named(self.fi_addr),
            _ => None,
        }
    }
}
