//! The synchronisation primitives the cache's protocol is built from: std's, or loom's under
//! `--cfg dma_loom`, so the loom models in `loom_tests/` check the code that ships rather than a
//! copy of it.
//!
//! Under loom, crossbeam-epoch switches itself over too (`--cfg crossbeam_loom` with its `loom`
//! feature, which the manifest enables for that cfg), and the index becomes a locked map (see
//! `cache::index`), because papaya's reclamation keeps per-thread state loom cannot see.
//!
//! What stays on std under loom, on purpose: the statistics counters and the model AV's table
//! lock. Neither is part of the protocol's proof; both are touched in short sections with no
//! loom operation inside, so loom never switches threads while one is held.

#[cfg(not(dma_loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(dma_loom))]
pub(crate) use std::sync::atomic;
#[cfg(not(dma_loom))]
pub(crate) use std::sync::mpsc;
#[cfg(not(dma_loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};
#[cfg(not(dma_loom))]
pub(crate) use std::thread;

#[cfg(dma_loom)]
pub(crate) use loom::sync::Arc;
#[cfg(dma_loom)]
pub(crate) use loom::sync::atomic;
#[cfg(dma_loom)]
pub(crate) use loom::sync::mpsc;
#[cfg(dma_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
#[cfg(dma_loom)]
pub(crate) use loom::thread;

/// Why a [`Bounded::try_send`] did not send.
#[derive(Debug)]
pub(crate) enum TrySendError {
    /// The channel holds as many messages as it was made for. (Never under loom: unbounded.)
    #[cfg_attr(dma_loom, allow(dead_code))]
    Full,
    /// The receiver has gone.
    Disconnected,
}

/// The sending half of a bounded channel: `send` blocks while the channel is full.
///
/// Loom's channel has no bound, so under loom this is unbounded: the bound is backpressure, not
/// part of the protocol the models check.
pub(crate) struct Bounded<T> {
    #[cfg(not(dma_loom))]
    inner: std::sync::mpsc::SyncSender<T>,
    #[cfg(dma_loom)]
    inner: mpsc::Sender<T>,
}

/// A channel holding at most `bound` messages.
pub(crate) fn bounded<T>(bound: usize) -> (Bounded<T>, mpsc::Receiver<T>) {
    #[cfg(not(dma_loom))]
    let (inner, receiver) = std::sync::mpsc::sync_channel(bound);
    #[cfg(dma_loom)]
    let (inner, receiver) = {
        let _ = bound;
        mpsc::channel()
    };
    (Bounded { inner }, receiver)
}

impl<T> Clone for Bounded<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T> Bounded<T> {
    /// Send, waiting for room; an error means the receiver has gone. (std's `SendError` either
    /// way: loom's `Sender::send` returns it too, and its `mpsc` has no such type.)
    pub(crate) fn send(&self, value: T) -> Result<(), std::sync::mpsc::SendError<T>> {
        self.inner.send(value)
    }

    /// Send if there is room now.
    pub(crate) fn try_send(&self, value: T) -> Result<(), TrySendError> {
        #[cfg(not(dma_loom))]
        {
            self.inner.try_send(value).map_err(|error| match error {
                std::sync::mpsc::TrySendError::Full(_) => TrySendError::Full,
                std::sync::mpsc::TrySendError::Disconnected(_) => TrySendError::Disconnected,
            })
        }
        #[cfg(dma_loom)]
        {
            self.inner
                .send(value)
                .map_err(|_| TrySendError::Disconnected)
        }
    }
}

/// Lock `mutex`, carrying on through poisoning: every critical section here leaves its data
/// consistent before anything in it can panic.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for a mutex the loom models replace (`sync::Mutex`, loom's under `dma_loom`), so
/// code checked by the models carries on through poisoning the same way.
#[cfg(dma_loom)]
pub(crate) fn lock_modelled<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`lock`] for a mutex the loom models replace: outside loom, `sync::Mutex` is std's.
#[cfg(not(dma_loom))]
pub(crate) use lock as lock_modelled;

/// Receive from `receiver`: under loom it only parks.
#[cfg(dma_loom)]
pub(crate) fn recv_polling<T>(
    receiver: &mpsc::Receiver<T>,
    _spin: std::time::Duration,
    _timeout: std::time::Duration,
) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
    receiver
        .recv()
        .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
}

/// Receive from `receiver`, waiting until `deadline` at most.
#[cfg(not(dma_loom))]
pub(crate) fn recv_until<T>(
    receiver: &mpsc::Receiver<T>,
    deadline: std::time::Instant,
) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
    receiver.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
}

/// Receive from `receiver`: under loom time does not pass, so the deadline never comes.
#[cfg(dma_loom)]
pub(crate) fn recv_until<T>(
    receiver: &mpsc::Receiver<T>,
    _deadline: std::time::Instant,
) -> Result<T, std::sync::mpsc::RecvTimeoutError> {
    receiver
        .recv()
        .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected)
}

/// Receive from `receiver`, parking at once: loom has no time to spin for.
#[cfg(dma_loom)]
pub(crate) fn recv_spinning<T>(
    receiver: &mpsc::Receiver<T>,
    _spin: std::time::Duration,
) -> Result<T, std::sync::mpsc::RecvError> {
    receiver.recv()
}
