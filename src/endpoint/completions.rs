//! Completions: every read of the transmit queue hands each completion to the party that
//! posted its operation, and every wait for one sleeps (see `wait`).
//!
//! # Routing
//!
//! An operation's slot (see `rma`) records who owns its completion: the application, for
//! [`LibfabricEndpoint::write`] and friends, whose completions go to the endpoint's ready queue
//! for [`poll_completions`](LibfabricEndpoint::poll_completions) and
//! [`wait_for`](LibfabricEndpoint::wait_for); or a [`CompletionOwner`] the crate posted it for (a
//! rail set's stripe), which receives it directly. The owner is found from the context the
//! provider returns, which is the slot's own address, never from the id: so an application id
//! can never collide with an internal operation, whatever numbers either picks, and whichever
//! thread reads the queue (a `poll_completions`, a `progress`, a `wait_for`, a rail set's poll, a
//! blocked `receive`) delivers each completion to its owner, once. A waiter takes from the ready
//! queue only the completion it waits for, so no waiter holds another's completion while it
//! waits.
//!
//! # Bounds
//!
//! The ready queue holds only completions of slots not yet freed, so it is bounded by the slab
//! ([`MAX_OPERATIONS`](super::MAX_OPERATIONS)); an owner's completions are its own to bound (a
//! rail set's by its transfers in flight).

use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::LibfabricEndpoint;
use super::deadline::Deadline;
use super::rma::operations::{BATCH, Completion, Operation, Operations};
use crate::error::DmaError;
use crate::sync::lock;
use dma_libfabric_sys as sys;

/// Who receives the crate's own completions (defined beside the slots that hold them).
pub(crate) use super::rma::operations::{CompletionOwner, Owner};

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
    /// operations (their leases and buffers are dropped here) and logging injected sends' errors.
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
        let Ok(Some(entry)) = super::read_error_entry(cq) else {
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
        // The provider is done with it: its peer may post one more (see `budget`). A receive
        // took none (it is posted to no peer; its `fi_addr` names the sender now).
        if Operation::Receive != operation.operation {
            self.sends
                .budget
                .give_back(operation.fi_addr, operation.incarnation);
        }
        // Name the operation that failed rather than the queue read that reported it.
        let call = operation.operation.call();
        let result = result.map_err(|failure| match failure {
            // The provider says the peer's connection is gone: the distinct error, naming it, and
            // the peer is marked so the next post to it is refused at once (if its index still
            // holds the incarnation this operation was posted to: see `av::unreachable`).
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
        });
        let completion = match &operation.join {
            None => Completion {
                id: operation.id,
                operation: operation.operation,
                len: operation.len,
                sender: operation.sender(),
                result,
            },
            Some(join) => {
                join.record(result);
                if !join.finish(1) {
                    // Another part is still in flight: it delivers the joined completion.
                    drop(operation);
                    lock(&self.free).push(index);
                    return;
                }
                join.completion(operation.id, operation.operation)
            }
        };
        let owner = operation.owner.clone();
        // The completion has been read: the lease and the buffer may go.
        drop(operation);
        match owner {
            // The crate's own operation (a stripe): its slot is free at once, and the completion
            // goes to the party that posted it, never to the application's queue.
            Some(owner) => {
                lock(&self.free).push(index);
                owner.completed(completion);
            }
            None => {
                lock(&self.ready).push_back((index, completion));
                self.waiter.ring();
            }
        }
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
        let deadline = Deadline::after(patience);
        self.waiter
            .wait(self.sources(), deadline, || {
                self.reap(cq);
                (0 == self.in_flight.load(Ordering::Acquire)).then_some(())
            })
            .map_or_else(|| self.in_flight.load(Ordering::Acquire), |()| 0)
    }
}

impl LibfabricEndpoint {
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
        self.wait_until(Deadline::after(timeout), || {
            self.progress();
            self.operations.take_ready(id)
        })
        .ok_or(DmaError::WouldBlock)
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

    /// How many posts of this endpoint the provider answered "retry after progress"
    /// (`-FI_EAGAIN`, as tcp;ofi_rxm answers the first sends to a new peer while it connects):
    /// each makes the wait it belongs to sleep short (see `wait`, "Connection setup"). For tests
    /// of that wait. Not part of the API (feature `model`).
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub fn posts_asked_to_retry(&self) -> u64 {
        self.operations.waiter.retries_asked()
    }

    /// How many sleeps of this endpoint's blocking waits lasted their whole longest sleep (1 s)
    /// with nothing waking them: a wait that slept through what it waited for counts one. For
    /// tests of that wait. Not part of the API (feature `model`).
    #[cfg(feature = "model")]
    #[doc(hidden)]
    pub fn sleeps_run_out(&self) -> u64 {
        self.operations.waiter.sleeps_run_out()
    }

    /// `attempt` now, and while it answers `None`, again after each progress pass, sleeping
    /// between passes until `deadline`: the wait of a post for what only a completion read frees
    /// (a slot, the peer's budget).
    pub(super) fn after_progress<T>(
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

    /// Wake the thread sleeping in a wait of this endpoint (the async driver's stop and
    /// backpressure use it): one `eventfd` write, or nothing when none sleeps.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async driver's
    pub(crate) fn wake_sleepers(&self) {
        self.operations.waiter.ring();
    }

    /// What a wait on this endpoint's queues sleeps on: empty where the endpoint polls.
    pub(crate) fn wait_sources(&self) -> &[super::wait::Source] {
        self.operations.sources()
    }

    /// Call `attempt` until it answers, sleeping on the completion queues' descriptors between
    /// calls where the provider offers them (see `wait`), or until `deadline`.
    pub(super) fn wait_until<T>(
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

    /// Sleep until the endpoint's completion queues have something to do, or `timeout` passes,
    /// then drive progress: what a thread that only serves peers' RMA into this endpoint's
    /// memory calls in a loop, instead of spinning on [`progress`](Self::progress). Nothing moves
    /// while no thread reads the queues (libfabric has no progress thread of its own here), so
    /// some thread must wait on every endpoint that is an RMA target. A wake-up may bring no
    /// completion (a rendezvous, a peer's RMA landing): it is answered by the progress itself.
    /// Where the provider has no wait object, or with
    /// [`Configuration::busy_poll`](crate::configuration::Configuration::busy_poll), this drives progress once
    /// and returns at once. Any `Duration` is accepted (`Duration::MAX`: until a wake-up).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// // Nothing to do: sleeps (on tcp) for up to the timeout, using no CPU meanwhile.
    /// endpoint.progress_sleeping(Duration::from_millis(10));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn progress_sleeping(&self, timeout: Duration) {
        if self.operations.sources().is_empty() {
            self.progress();
            return;
        }
        let mut first = true;
        // The first attempt only reads; the next runs after a wake-up or the timeout.
        let _woken = self.wait_until(Deadline::after(timeout), || {
            self.progress();
            (!std::mem::take(&mut first)).then_some(())
        });
    }
}
