//! The writer's inbox, as senders see it: a bounded channel of requests, each counted as queued on
//! the writer role before it is sent, and a [`ReleaseQueue`] that queues releases without ever
//! waiting (for another cache's writer).
//!
//! Bounded by [`INBOX_BOUND`](super::AddressCache::INBOX_BOUND) requests; a sender that finds it
//! full waits for room or, for `try_*`, queues nothing.

use super::reply::Waiting;
use super::writer::{self, Request, SharedState};
use crate::sync::{Arc, Bounded, TrySendError};

/// The writer's inbox. Every request is counted as queued on the writer role before it is sent
/// (so a holder's second look finds it: see `role`); a request whose sender waits for its answer
/// is then served by the sender itself if the role is free ([`send_and_serve`](Self::send_and_serve)),
/// and any other rings the background thread's doorbell.
pub(super) struct Inbox {
    pub(super) channel: Bounded<Request>,
    pub(super) shared: Arc<SharedState>,
    /// The writer, for a sender that serves as it. `None` under loom, where the background
    /// thread alone is the writer (see `writer::run`).
    pub(super) writer: Option<std::sync::Arc<dyn writer::Serve>>,
}

impl Inbox {
    /// Count `request` as queued and send it, waiting for room; an error means the writer has
    /// stopped.
    pub(super) fn queue(
        &self,
        request: Request,
    ) -> Result<(), std::sync::mpsc::SendError<Request>> {
        #[cfg(not(dma_loom))]
        self.shared.doorbell.role.queue();
        let sent = self.channel.send(request);
        #[cfg(not(dma_loom))]
        if sent.is_err() {
            self.shared.doorbell.role.unqueue();
        }
        sent
    }

    /// Queue `request`, waiting for room, and ring the background thread; an error means the
    /// writer has stopped.
    pub(super) fn send(&self, request: Request) -> Result<(), std::sync::mpsc::SendError<Request>> {
        self.queue(request)?;
        self.shared.doorbell.ring();
        Ok(())
    }

    /// Queue `request`, waiting for room, then serve as the writer if the role is free: for a
    /// sender that waits for its answer. Without a writer to serve (loom), ring instead.
    pub(super) fn send_and_serve(
        &self,
        request: Request,
    ) -> Result<(), std::sync::mpsc::SendError<Request>> {
        match &self.writer {
            Some(writer) => {
                self.queue(request)?;
                writer.serve();
                Ok(())
            }
            None => self.send(request),
        }
    }

    /// Serve as the writer if the role is free, with or without anything queued: a round takes
    /// the readers' and leases' reports and answers the waiters whose deadline has passed. For a
    /// waiter whose deadline came while the background thread was busy elsewhere (it serves
    /// every cache in the process). Without a writer to serve (loom), nothing.
    pub(super) fn serve(&self) {
        if let Some(writer) = &self.writer {
            writer.serve();
        }
    }

    /// What a sender that waits for its answer waits on: the writer's doorbell, and the writer
    /// to serve when it finds the role free while it polls (see `reply::recv_adaptive`).
    pub(super) fn waiting(&self) -> Waiting<'_> {
        Waiting {
            doorbell: &self.shared.doorbell,
            writer: self.writer.as_deref(),
        }
    }

    /// A [`ReleaseQueue`] on this inbox, which does not keep the cache's shared state alive.
    pub(super) fn release_queue(&self) -> ReleaseQueue {
        ReleaseQueue {
            channel: self.channel.clone(),
            #[cfg(not(dma_loom))]
            shared: std::sync::Arc::downgrade(&self.shared),
        }
    }

    /// Queue `request` if there is room now, and ring the background thread.
    pub(super) fn try_send(&self, request: Request) -> Result<(), TrySendError> {
        #[cfg(not(dma_loom))]
        self.shared.doorbell.role.queue();
        let sent = self.channel.try_send(request);
        #[cfg(not(dma_loom))]
        if sent.is_err() {
            self.shared.doorbell.role.unqueue();
        }
        sent?;
        self.shared.doorbell.ring();
        Ok(())
    }
}

/// Queues releases in a cache's inbox without waiting: see
/// [`AddressCache::release_queue`](super::AddressCache::release_queue).
pub(crate) struct ReleaseQueue {
    channel: Bounded<Request>,
    /// For the doorbell; weak, so that no cycle of caches keeps one alive.
    #[cfg(not(dma_loom))]
    shared: std::sync::Weak<SharedState>,
}

impl ReleaseQueue {
    /// Queue `client`'s release if the inbox has room now: `false` if it is full (try again
    /// later). A cache that has stopped takes it: it holds nothing any more.
    pub(crate) fn try_release(&self, client: u64) -> bool {
        #[cfg(not(dma_loom))]
        let shared = self.shared.upgrade();
        #[cfg(not(dma_loom))]
        if let Some(shared) = &shared {
            shared.doorbell.role.queue();
        }
        let sent = self.channel.try_send(Request::Release { client });
        #[cfg(not(dma_loom))]
        if let Some(shared) = &shared {
            if sent.is_ok() {
                shared.doorbell.ring();
            } else {
                shared.doorbell.role.unqueue();
            }
        }
        match sent {
            Ok(()) => true,
            Err(TrySendError::Full) => false,
            Err(TrySendError::Disconnected) => true,
        }
    }
}
