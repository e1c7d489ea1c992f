//! The application's side of completions: `poll_completions` and `wait_for` take from the ready
//! queue the engine's reaper fills (see `engine`), `drain_operations` and `progress_sleeping`
//! drive it, and every wait for one sleeps (see `wait`). A waiter takes from the ready queue only
//! the completion it waits for, so no waiter holds another's completion while it waits. Beside
//! them, what a server watches: the ages of the operations in flight (`in_flight`'s scans) and
//! the peers' notifications.

use super::credits::flow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::LibfabricEndpoint;
use super::credits::What;
use super::deadline::Deadline;
use super::engine::Completion;
use super::in_flight::{self, OverdueOperation};
use super::rma::notifications::Notification;
use crate::error::DmaError;

impl LibfabricEndpoint {
    /// Reap the transmit queue and move every RMA completion that is ready into `out`: any thread
    /// may call it, and each completion is handed out once. Leases and buffers of the completed
    /// operations have been dropped by the time it returns. Returns how many it added.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a provider whose queue read fails for good.
    pub fn poll_completions(&self, out: &mut Vec<Completion>) -> Result<usize, DmaError> {
        self.progress();
        Ok(self.operations.take_all_ready(out))
    }

    /// Wait up to `timeout` for the completion of the operation posted with `id`, driving
    /// progress; other completions stay for [`poll_completions`](Self::poll_completions). For
    /// tests and simple callers: it scans the ready queue, so a completion another thread's
    /// `poll_completions` already took is not seen here. A completion an earlier read of the
    /// queues has already set aside (a batch's, waited for one by one) is answered at once,
    /// without driving progress. Any `Duration` is accepted: one too long for a deadline
    /// (`Duration::MAX`) waits until the completion arrives.
    ///
    /// # Errors
    /// [`DmaError::WouldBlock`] when it has not completed within `timeout` (it is still in
    /// flight).
    pub fn wait_for(&self, id: u64, timeout: Duration) -> Result<Completion, DmaError> {
        // Each progress pass reads both queues, and on tcp each read is the provider's whole
        // progress (an `epoll_wait`): not for a completion that is already here.
        if let Some(done) = self.operations.take_ready(id) {
            return Ok(done);
        }
        self.wait_until_spinning_first(Deadline::after(timeout), || {
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

    /// How long the oldest RMA operation in flight has been in flight; `None` when none is. A
    /// snapshot, read without a lock (see [`OverdueOperation`] for what it guarantees).
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration { rma: true, ..Configuration::default() }, None)?;
    /// assert_eq!(None, endpoint.oldest_operation_age());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn oldest_operation_age(&self) -> Option<Duration> {
        let operations = &self.operations;
        in_flight::oldest_age(operations.posted_at(), operations.born.elapsed())
    }

    /// Append to `out` every RMA operation that has been in flight for at least `deadline`, and
    /// return how many were appended. The operations stay in flight (this call only reports
    /// them): the caller decides what an overdue peer means to it. A snapshot, read without a
    /// lock; [`OverdueOperation`] says why a server watches it, and what it guarantees.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration { rma: true, ..Configuration::default() }, None)?;
    /// let mut overdue = Vec::new();
    /// endpoint.overdue_operations(Duration::from_secs(5), &mut overdue);
    /// for operation in &overdue {
    ///     println!(
    ///         "{:?} {} to client {:?} (peer {:#x}) in flight for {:?}",
    ///         operation.operation, operation.id, operation.client, operation.peer, operation.age
    ///     );
    /// }
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn overdue_operations(&self, deadline: Duration, out: &mut Vec<OverdueOperation>) -> usize {
        let operations = &self.operations;
        in_flight::overdue(
            operations.posted_at(),
            operations.born.elapsed(),
            deadline,
            out,
        )
    }

    /// Read the receive queue, then move every [`Notification`] that has arrived into `out`,
    /// oldest first. Returns how many it added.
    ///
    /// It delivers every notification whatever else the application's loop calls: it reads the
    /// receive queue itself (messages it meets there are set aside, in order, for the next
    /// [`try_receive`](Self::try_receive) or [`receive`](Self::receive), which also set aside
    /// the notifications they meet). A target loop of `poll_notifications` alone works, and so
    /// does one that also calls [`progress`](Self::progress) or `receive`.
    pub fn poll_notifications(&self, out: &mut Vec<Notification>) -> usize {
        self.reap_receive_queue();
        let taken = self.operations.notifications.take_all();
        let count = taken.len();
        for (notification, sender) in taken {
            // The application has it: its writer's notification credit is paid back.
            flow::consumed(self, None, sender, What::Notification);
            out.push(notification);
        }
        count
    }

    /// Read the receive queue unless [`progress`](Self::progress) does (on a credited
    /// endpoint): after a pass of `progress`, what makes it a pass over both queues, once each
    /// (the async face's passes).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(crate) fn reap_receive_queue_after_progress(&self) {
        if self.credits.is_none() {
            self.reap_receive_queue();
        }
    }

    /// The oldest notification that has arrived, the receive queue read first (the async face's
    /// `notification`).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(crate) fn next_notification(&self) -> Option<Notification> {
        self.reap_receive_queue();
        let (notification, sender) = self.operations.notifications.take_oldest()?;
        flow::consumed(self, None, sender, What::Notification);
        Some(notification)
    }

    /// How many notifications were dropped, oldest first, because
    /// [`Configuration::cq_size`](crate::configuration::Configuration::cq_size) were already waiting.
    pub fn dropped_notifications(&self) -> u64 {
        self.operations.notifications.dropped()
    }
}
