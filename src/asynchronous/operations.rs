//! The async face's operations, with the sync face's names and arguments less `id` and patience
//! (see [`LibfabricEndpoint`]): each posts with the endpoint's own call, its completion delivered to
//! the future's own sink (`endpoint::engine`'s `Sink::Waker`), and resolves once the
//! completion has been read. Backpressure is retried for up to [`POST_PATIENCE`], the future
//! parked between the driver's passes (the parent module's "The driver").
//!
//! # Cancel safety
//!
//! Every future here may be dropped at any await point (the parent module's "Cancel safety"):
//! dropped before its post, nothing was posted; dropped after, the operation completes on its
//! own, its lease and memory held by the endpoint's slot until the completion is read. A receive
//! takes a message off the queue only in the poll that returns it.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use super::reactor::Registration;
use super::{AsyncEndpoint, Driver, POST_PATIENCE};
use crate::cache::{Lease, Peer};
use crate::endpoint::deadline::Deadline;
use crate::endpoint::engine::{Sink, WakerSink};
use crate::endpoint::rma::messages;
use crate::endpoint::vectored;
use crate::endpoint::{
    Completion, LibfabricEndpoint, Notification, Operation, Received, RemoteRegion, RmaCall,
    Segment,
};
use crate::error::DmaError;

impl AsyncEndpoint {
    /// `fi_write` of `source` into the peer's `target` against `lease`, resolving to its
    /// [`Completion`] once that has been read (its `id` is 0: the future is the handle): by
    /// default once the target holds the bytes
    /// ([`WriteCompletion`](crate::configuration::WriteCompletion)).
    ///
    /// # Cancel safety
    /// Cancel safe (module docs). The source's bytes are read by the provider until the
    /// completion: do not rewrite them in the meantime.
    ///
    /// # Deadlines
    /// None of its own: to a stopped or partitioned peer it stays pending until the peer moves,
    /// so bound it with `tokio::time::timeout` (dropping it then is safe), and find the peer with
    /// [`LibfabricEndpoint::overdue_operations`]. To a peer whose process died it resolves by
    /// itself, with the completion or [`DmaError::PeerUnreachable`] (the parent module's
    /// "Timeouts and faults").
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::write_within`], at the post (nothing posted); the completion's own
    /// error in [`Completion::result`].
    pub async fn write(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            let call = RmaCall {
                operation: Operation::Write,
                lease: lease.clone(),
                local: source,
                remote: target,
                id: 0,
                timeout: Duration::ZERO,
            };
            endpoint.post_for(call, sink, None).map(drop)
        })
        .await
    }

    /// `fi_read` of the peer's `source` into `destination` against `lease`; otherwise as
    /// [`write`](Self::write). Read the destination after the future resolves.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped read goes on writing into `destination`'s memory until its
    /// completion is read, which the endpoint keeps registered and allocated until then; what the
    /// destination holds meanwhile is unspecified.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn read(
        &self,
        lease: Lease<'_>,
        destination: Segment<'_>,
        source: RemoteRegion,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            let call = RmaCall {
                operation: Operation::Read,
                lease: lease.clone(),
                local: destination,
                remote: source,
                id: 0,
                timeout: Duration::ZERO,
            };
            endpoint.post_for(call, sink, None).map(drop)
        })
        .await
    }

    /// Send a copy of `message` (at most
    /// [`Description::max_send_size`](crate::endpoint::Description::max_send_size) bytes) to
    /// `peer`, as [`LibfabricEndpoint::send`]: it resolves once the message is copied into one of
    /// the endpoint's send slots and posted; the slot is counted until its completion is read.
    ///
    /// # Cancel safety
    /// Cancel safe: the message is sent exactly once if the future resolved `Ok`, and at most
    /// once if it was dropped (the provider copies it in one call; no await falls inside one).
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::send_within`].
    pub async fn send(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.retrying(|endpoint| endpoint.try_send(peer, message))
            .await
    }

    /// Send `source`, a segment of registered memory of any size, to the peer `lease` holds, as
    /// [`LibfabricEndpoint::send_from`]; it resolves to its [`Completion`] (an
    /// [`Operation::Send`]).
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::send_from_within`], at the post; the completion's own error in
    /// [`Completion::result`].
    pub async fn send_from(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            messages::send_from_to(endpoint, lease.clone(), source, 0, Duration::ZERO, sink)
        })
        .await
    }

    /// The next message received, into `destination` (registered memory, any size up to it), as
    /// [`LibfabricEndpoint::receive_into`]; it resolves to its [`Completion`] (an
    /// [`Operation::Receive`], whose `len` is the message's and whose `sender` names its sender
    /// where the provider does). Read the destination after the future resolves.
    ///
    /// # Cancel safety
    /// Cancel safe as a posted operation is: a receive dropped once posted stays posted, and the
    /// message it takes lands in `destination`, whose memory the endpoint keeps until then.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::receive_into`], at the post; the completion's own error (a message
    /// longer than the destination: `FI_ETRUNC`) in [`Completion::result`].
    pub async fn receive_into(&self, destination: Segment<'_>) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| messages::receive_into_to(endpoint, destination, 0, sink))
            .await
    }

    /// `fi_writedata` of `source` into the peer's `target` with `data`, as
    /// [`LibfabricEndpoint::write_with_data`]: the target gets a [`Notification`] carrying
    /// `data` once the bytes have landed; this resolves to the write's [`Completion`].
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::write_with_data`], at the post; the completion's own error in
    /// [`Completion::result`].
    pub async fn write_with_data(
        &self,
        lease: Lease<'_>,
        source: Segment<'_>,
        target: RemoteRegion,
        data: u64,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            vectored::write_with_data_to(
                endpoint,
                lease.clone(),
                source,
                target,
                data,
                0,
                Duration::ZERO,
                sink.clone(),
            )
        })
        .await
    }

    /// `sources` (segments of one region) written back to back into the peer's `target`, as
    /// [`LibfabricEndpoint::write_gather`]: one [`Completion`] for the whole gather, however
    /// many messages it takes.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::write_gather_within`], at the post; the completion's own error in
    /// [`Completion::result`].
    pub async fn write_gather(
        &self,
        lease: Lease<'_>,
        sources: &[Segment<'_>],
        target: RemoteRegion,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            vectored::post_vectored(
                endpoint,
                Operation::Write,
                lease.clone(),
                sources,
                target,
                0,
                Duration::ZERO,
                sink.clone(),
            )
        })
        .await
    }

    /// The peer's `source` read back to back into `destinations` (segments of one region), as
    /// [`LibfabricEndpoint::read_scatter`]: one [`Completion`] for the whole scatter.
    ///
    /// # Errors
    /// As [`write_gather`](Self::write_gather).
    pub async fn read_scatter(
        &self,
        lease: Lease<'_>,
        destinations: &[Segment<'_>],
        source: RemoteRegion,
    ) -> Result<Completion, DmaError> {
        self.posted(|endpoint, sink| {
            vectored::post_vectored(
                endpoint,
                Operation::Read,
                lease.clone(),
                destinations,
                source,
                0,
                Duration::ZERO,
                sink.clone(),
            )
        })
        .await
    }

    /// The next message received, waiting for one as long as it takes (wrap it in
    /// `tokio::time::timeout` to bound it).
    ///
    /// # Cancel safety
    /// Cancel safe: a message is taken off the queue only in the poll that returns it, so a
    /// dropped `receive` has taken none, and the next `receive` (or a sync one) gets it.
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::try_receive`].
    pub async fn receive(&self) -> Result<Vec<u8>, DmaError> {
        Ok(self.receive_from().await?.message)
    }

    /// The next message received and its sender, as [`LibfabricEndpoint::receive_from`];
    /// otherwise as [`receive`](Self::receive).
    ///
    /// # Errors
    /// As [`LibfabricEndpoint::try_receive_from`].
    pub async fn receive_from(&self) -> Result<Received, DmaError> {
        let shared = &self.shared;
        let (reactor, mut looks) = (shared.driver.reactors.current(), 0);
        loop {
            let notified = shared.driver.received.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the queue is read, so a message the driver sets aside after the
            // read wakes it.
            notified.as_mut().enable();
            if let Some(received) = shared.endpoint().try_receive_from()? {
                return Ok(received);
            }
            self.next_event(notified, reactor.as_deref(), &mut looks)
                .await;
        }
    }

    /// The next [`Notification`] (a peer's [`write_with_data`](LibfabricEndpoint::write_with_data)
    /// landed), oldest first, waiting for one as long as it takes.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification is taken only in the poll that returns it.
    pub async fn notification(&self) -> Notification {
        let shared = &self.shared;
        let (reactor, mut looks) = (shared.driver.reactors.current(), 0);
        loop {
            let notified = shared.driver.received.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(notification) = shared.endpoint().next_notification() {
                return notification;
            }
            self.next_event(notified, reactor.as_deref(), &mut looks)
                .await;
        }
    }

    /// Until the driver's next pass that read the receive queue (`received`, enabled before the
    /// caller looked), or, on a runtime with a reactor, until a queue's descriptor is readable:
    /// then the queues are read and served here ([`Driver::serve`]), and the caller looks again.
    /// Every [`LOOKS`]th call yields to the runtime first, so a queue that keeps having work is
    /// served between other tasks, not spun on.
    async fn next_event(
        &self,
        mut received: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        reactor: Option<&Registration>,
        looks: &mut usize,
    ) {
        *looks += 1;
        if 0 == *looks % LOOKS {
            tokio::task::yield_now().await;
        }
        let endpoint = self.shared.endpoint();
        std::future::poll_fn(|context| {
            if received.as_mut().poll(context).is_ready() {
                return Poll::Ready(());
            }
            let Some(reactor) = reactor else {
                return Poll::Pending;
            };
            let ready = reactor.poll_ready(endpoint, context);
            if ready.is_ready() {
                self.shared.driver.serve(endpoint);
            }
            ready
        })
        .await;
    }

    /// `attempt` until it answers other than [`DmaError::WouldBlock`], for up to
    /// [`POST_PATIENCE`]: the async face's one backpressure policy. Between attempts the future
    /// is parked until the driver's next pass (which sleeps on the endpoint's queues), never
    /// spinning; past the patience it answers `WouldBlock`, with nothing posted.
    async fn retrying<T>(
        &self,
        mut attempt: impl FnMut(&LibfabricEndpoint) -> Result<T, DmaError>,
    ) -> Result<T, DmaError> {
        let endpoint = self.shared.endpoint();
        let deadline = Deadline::after(POST_PATIENCE);
        let mut waiting = None;
        loop {
            match attempt(endpoint) {
                Err(DmaError::WouldBlock) if !deadline.passed() => {
                    let driver = &self.shared.driver;
                    waiting.get_or_insert_with(|| driver.start_waiting(endpoint));
                    driver.next_pass().await;
                }
                done => return done,
            }
        }
    }

    /// Post with `post` (given the endpoint and the future's sink, and no patience of its own),
    /// retrying backpressure as [`retrying`](Self::retrying) does; then resolve once the
    /// completion has been delivered to the sink.
    async fn posted(
        &self,
        mut post: impl FnMut(&LibfabricEndpoint, Sink) -> Result<(), DmaError>,
    ) -> Result<Completion, DmaError> {
        let state = Arc::new(WakerSink::default());
        // No await between the post and the slot's taking the lease: one synchronous call.
        self.retrying(|endpoint| post(endpoint, Sink::Waker(Arc::clone(&state))))
            .await?;
        Completed {
            pending: state,
            endpoint: self.shared.endpoint(),
            driver: &self.shared.driver,
            reactor: self.shared.driver.reactors.current(),
            read: false,
        }
        .await
    }
}

/// How many times one poll reads the queues and finds a descriptor ready again before it yields
/// to the runtime (a queue that keeps having work is served between other tasks, not spun on).
const LOOKS: usize = 4;

/// Resolves when the operation's completion has been delivered to its [`WakerSink`].
struct Completed<'endpoint> {
    pending: Arc<WakerSink>,
    endpoint: &'endpoint LibfabricEndpoint,
    driver: &'endpoint Driver,
    /// The polling runtime's reactor, which wakes the future when a queue's descriptor is
    /// readable; without one, the driver's thread reads the queue and the sink wakes it.
    reactor: Option<Arc<Registration>>,
    /// Whether its first poll has read the queue itself.
    read: bool,
}

impl Future for Completed<'_> {
    type Output = Result<Completion, DmaError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> Poll<Self::Output> {
        let this = &mut *self;
        if let Some(completion) = this.pending.take(context.waker()) {
            return Poll::Ready(Ok(completion));
        }
        // Without a reactor, on tcp a small write often completes as it is posted: one read of
        // the queue here saves the round trip through the driver's thread. (With one, its
        // wake-up is the future's own thread's: not worth a read of the queues per post.)
        if this.reactor.is_none() && !std::mem::replace(&mut this.read, true) {
            this.endpoint.progress();
            if let Some(completion) = this.pending.take(context.waker()) {
                return Poll::Ready(Ok(completion));
            }
        }
        // Without a reactor, the driver's thread reads the queue and the sink wakes the future.
        let Some(reactor) = &this.reactor else {
            return Poll::Pending;
        };
        for _ in 0..LOOKS {
            if reactor.poll_ready(this.endpoint, context).is_pending() {
                return Poll::Pending;
            }
            this.driver.serve(this.endpoint);
            if let Some(completion) = this.pending.take(context.waker()) {
                return Poll::Ready(Ok(completion));
            }
        }
        context.waker().wake_by_ref();
        Poll::Pending
    }
}
