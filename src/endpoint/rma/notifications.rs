//! Writes that notify, on the target's side: a peer's `fi_writedata` lands a completion carrying its
//! data in this endpoint's receive queue, which the receive path sets aside here as a
//! [`Notification`] for [`LibfabricEndpoint::poll_notifications`] (see `vectored`, "Writes that
//! notify", for the initiator's side).
//!
//! # Bounds
//!
//! At most [`Configuration::cq_size`](crate::configuration::Configuration::cq_size) notifications
//! wait (the bound of the receive queue they came from); past it the oldest is dropped and counted
//! ([`LibfabricEndpoint::dropped_notifications`]).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use dma_libfabric_sys as sys;

/// A peer's write that notified (`fi_writedata`), as the target's receive queue reported it.
/// (The entry's length is not kept: providers differ, and tcp reports 0; the data says what
/// landed, in the application's own terms.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Notification {
    /// The initiator's data.
    pub data: u64,
}

/// Notifications read from the receive queue, waiting for the application.
pub(in crate::endpoint) struct Notifications {
    /// Each with the writer the provider named (`FI_SOURCE`), whose notification credit the
    /// application's read of it pays back (`credits`).
    waiting: Mutex<VecDeque<(Notification, Option<sys::fi_addr_t>)>>,
    bound: usize,
    dropped: AtomicU64,
}

impl Notifications {
    /// At most `bound` waiting (at least one).
    pub(in crate::endpoint) fn new(bound: usize) -> Self {
        Self {
            waiting: Mutex::new(VecDeque::new()),
            bound: bound.max(1),
            dropped: AtomicU64::new(0),
        }
    }

    /// Set `entry` aside if it is a remote write's data, not a message: `true` if it was.
    pub(in crate::endpoint) fn accept(
        &self,
        entry: &sys::fi_cq_data_entry,
        sender: Option<sys::fi_addr_t>,
    ) -> bool {
        let data = u64::from(sys::FI_REMOTE_CQ_DATA);
        let received = u64::from(sys::FI_RECV);
        if 0 == entry.flags & data || 0 != entry.flags & received {
            return false;
        }
        let mut waiting = crate::sync::lock(&self.waiting);
        if waiting.len() == self.bound {
            waiting.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        waiting.push_back((Notification { data: entry.data }, sender));
        true
    }

    /// Every notification waiting, oldest first, each with the writer the provider named.
    pub(in crate::endpoint) fn take_all(&self) -> Vec<(Notification, Option<sys::fi_addr_t>)> {
        crate::sync::lock(&self.waiting).drain(..).collect()
    }

    /// The oldest notification waiting, with the writer the provider named.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(in crate::endpoint) fn take_oldest(
        &self,
    ) -> Option<(Notification, Option<sys::fi_addr_t>)> {
        crate::sync::lock(&self.waiting).pop_front()
    }

    /// How many were dropped, oldest first, for want of room.
    pub(in crate::endpoint) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;

    impl Notifications {
        fn accept_any(&self, entry: &sys::fi_cq_data_entry) -> bool {
            self.accept(entry, None)
        }
    }

    /// Notifications are bounded: past the bound the oldest goes, counted; message completions
    /// (`FI_RECV`) and entries without remote CQ data are not taken.
    #[test]
    fn notifications_are_bounded_and_only_remote_data_is_taken() {
        let notifications = Notifications::new(2);
        let entry = |flags: u64, data: u64| sys::fi_cq_data_entry {
            flags,
            data,
            ..Default::default()
        };
        let remote = u64::from(sys::FI_REMOTE_CQ_DATA | sys::FI_REMOTE_WRITE);
        assert!(!notifications.accept_any(&entry(u64::from(sys::FI_RECV | sys::FI_MSG), 1)));
        assert!(
            !notifications.accept_any(&entry(u64::from(sys::FI_RECV | sys::FI_REMOTE_CQ_DATA), 1))
        );
        for data in 1..=3 {
            assert!(notifications.accept_any(&entry(remote, data)));
        }
        let waiting: Vec<u64> = notifications
            .waiting
            .lock()
            .unwrap()
            .iter()
            .map(|(notification, _)| notification.data)
            .collect();
        assert_eq!(vec![2, 3], waiting, "the oldest dropped");
        assert_eq!(1, notifications.dropped.load(Ordering::Relaxed));
    }
}
