//! Waking a future from the reactor of the runtime that polls it, with no thread between the
//! descriptor and the future.
//!
//! # What it guarantees
//!
//! - **No wake-up slept through.** A future parks on its runtime's reactor only after its
//!   descriptors are registered for its waker *and* `fi_trywait` on the endpoint's queues has
//!   answered that nothing is left to read (the protocol of `endpoint::wait`'s module docs), its
//!   own or another future's with no descriptor readable since (`Registration::armed`):
//!   what arrives later makes a descriptor readable, which wakes it; what was there already is
//!   read first. A readiness is cleared only before the queues are read again, so none is lost
//!   between the read and the next registration (tokio clears only what it reported).
//! - **One future per event serves the others.** tokio wakes only the future that parked last
//!   on a registration (`poll_read_ready` keeps one waker), so a woken future reads both queues
//!   for everyone (the parent module's `Driver::serve`): completions reach their futures through
//!   their sinks, arrivals are set aside and the receivers woken. A future dropped while it was
//!   the one parked leaves the next event to the driver, which reads it after its grace.
//! - **Any runtime.** A registration belongs to one runtime (by its [`Id`]) and is used only
//!   by futures polled on that runtime, which is therefore running. Where there is no reactor
//!   to use (a future polled outside tokio, or on a runtime built without `enable_io`), there is
//!   no registration, and the future is woken by the driver's thread alone (the parent module's
//!   "The driver"), as it always is besides.
//! - **Bounded.** An `AsyncEndpoint` keeps at most [`MOST_RUNTIMES`] registrations, each at most
//!   two duplicated descriptors (one per completion queue) registered with one reactor; a
//!   runtime seen after that replaces the one seen longest ago (its futures keep theirs until
//!   they resolve). A runtime without IO is remembered as such, once: tokio answers the
//!   registration with a panic (caught here; tokio's panic hook prints its message, which says to
//!   call `enable_io`), and nothing is tried again on that runtime. A build with
//!   `panic = "abort"` cannot catch it: there, await the futures on runtimes with IO.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::runtime::{Handle, Id};

use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::wait::{Bell, poll};

/// The most runtimes whose reactors one `AsyncEndpoint` is registered with at a time.
pub(super) const MOST_RUNTIMES: usize = 4;

/// The registrations of one endpoint's descriptors, by runtime (module docs).
pub(super) struct Reactors {
    /// The endpoint's queues' wait descriptors (owned by its queues; duplicated to register).
    fds: Vec<RawFd>,
    /// The runtimes seen, oldest first; `None` for one without a reactor to use.
    seen: Mutex<VecDeque<(Id, Option<Arc<Registration>>)>>,
    /// The driver's own bell, in its standby `poll` set: rung to cut a standby short.
    bell: Bell,
}

impl Reactors {
    /// For `endpoint`, whose queues' descriptors are registered as runtimes poll its futures.
    pub(super) fn of(endpoint: &LibfabricEndpoint) -> Self {
        let mut fds: Vec<RawFd> = endpoint
            .wait_sources()
            .iter()
            .flat_map(|source| source.fds())
            .filter(|&fd| fd >= 0)
            .collect();
        fds.dedup();
        Self {
            fds,
            seen: Mutex::new(VecDeque::with_capacity(MOST_RUNTIMES)),
            bell: Bell::new(),
        }
    }

    /// The registration with the reactor of the runtime polling now, registered on its first
    /// use there; `None` outside tokio or on a runtime without IO. While a future holds it, the
    /// driver stands by ([`in_use`](Self::in_use)).
    pub(super) fn current(&self) -> Option<Arc<Registration>> {
        let id = Handle::try_current().ok()?.id();
        let mut seen = crate::sync::lock(&self.seen);
        match seen.iter().find(|(seen, _)| *seen == id) {
            Some((_, registration)) => registration.clone(),
            None => {
                let registration = self.register().map(Arc::new);
                if MOST_RUNTIMES <= seen.len() {
                    seen.pop_front();
                }
                seen.push_back((id, registration.clone()));
                registration
            }
        }
    }

    /// Cut the driver's standby short ([`stand_by`](Self::stand_by)).
    pub(super) fn ring(&self) {
        self.bell.ring();
    }

    /// The driver's sleep while futures are on reactors: `poll` on the queues' descriptors and
    /// the driver's bell (not the endpoint's, which its own waiters drain) for at most
    /// `timeout`; whether a queue's descriptor woke it.
    pub(super) fn stand_by(&self, timeout: std::time::Duration) -> bool {
        0 != poll(self.fds.iter().copied(), Some(&self.bell), timeout).readable
    }

    /// Whether a future is on a reactor now (holds a registration from
    /// [`current`](Self::current)): while one is, its runtime's reactor watches the descriptors,
    /// and the driver need not.
    pub(super) fn in_use(&self) -> bool {
        crate::sync::lock(&self.seen)
            .iter()
            .filter_map(|(_, registration)| registration.as_ref())
            .any(|registration| 1 < Arc::strong_count(registration))
    }

    /// Duplicates of the descriptors, registered with the current runtime's reactor.
    fn register(&self) -> Option<Registration> {
        let mut registered = Vec::with_capacity(self.fds.len());
        for &fd in &self.fds {
            // SAFETY: `fd` is a queue's open descriptor (the endpoint outlives its
            // `AsyncEndpoint`s); F_DUPFD_CLOEXEC takes no pointers and answers a new descriptor,
            // or -1.
            let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if copy < 0 {
                tracing::debug!(
                    fd,
                    "dup of a queue's descriptor failed: woken by the driver"
                );
                return None;
            }
            // SAFETY: `copy` was just opened, and nothing else owns it.
            let owned = unsafe { OwnedFd::from_raw_fd(copy) };
            let attempt = std::panic::catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `owned` is an open descriptor that the `AsyncFd` owns, so it stays open
                // and the same for the `AsyncFd`'s whole life.
                unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
            }));
            match attempt {
                Ok(Ok(fd)) => registered.push(fd),
                Ok(Err(error)) => {
                    let error = error.into_parts().1;
                    tracing::debug!(
                        %error,
                        "registering a queue's descriptor failed: woken by the driver"
                    );
                    return None;
                }
                Err(_) => {
                    tracing::warn!(
                        "this runtime has no IO driver (Builder::enable_io): the async face's \
                         futures on it are woken by the driver's thread, one hand-off slower"
                    );
                    return None;
                }
            }
        }
        Some(Registration {
            fds: registered,
            armed: AtomicBool::new(false),
        })
    }
}

/// An endpoint's descriptors, registered with one runtime's reactor.
pub(super) struct Registration {
    fds: Vec<AsyncFd<OwnedFd>>,
    /// Set by a future whose `fi_trywait` found the queues empty, cleared by one that finds a
    /// descriptor readable: while it is set, no event has been seen since the queues were last
    /// found empty, so the next future to park may park without its own `fi_trywait` (whatever
    /// lands later makes a descriptor readable: the provider signals its wait set for every
    /// completion and every socket).
    armed: AtomicBool,
}

impl Registration {
    /// Park `context` on the descriptors until they may show something: `Ready` to read the
    /// queues again now (a descriptor was readable, or `fi_trywait` found something to read),
    /// `Pending` once the waker is registered and the queues were found empty (module docs).
    pub(super) fn poll_ready(
        &self,
        endpoint: &LibfabricEndpoint,
        context: &mut Context<'_>,
    ) -> Poll<()> {
        let mut ready = false;
        for fd in &self.fds {
            match fd.poll_read_ready(context) {
                // Cleared before the caller reads the queues: what lands after the guard was
                // made is not cleared, so the next poll sees it.
                Poll::Ready(Ok(mut guard)) => {
                    guard.clear_ready();
                    ready = true;
                }
                // The runtime is shutting down: its futures go with it; the driver still wakes
                // this one meanwhile.
                Poll::Ready(Err(_)) => return Poll::Pending,
                Poll::Pending => {}
            }
        }
        if ready {
            self.armed.store(false, Ordering::Release);
            return Poll::Ready(());
        }
        if self.armed.load(Ordering::Acquire) {
            // Armed: the arming future found every descriptor quiet, and none has been readable
            // to the reactor since, so whatever lands now makes a new edge that wakes us.
            return Poll::Pending;
        }
        let empty = endpoint
            .wait_sources()
            .iter()
            .all(crate::endpoint::wait::Source::may_sleep);
        // The reactor reports edges; a descriptor that is still readable (libfabric 2.x can leave
        // a socket's bytes for a later pass after `fi_trywait` answered 0) makes no new edge, so
        // the arming future looks at it level-triggered, as a sync waiter's `poll` does, before
        // anyone parks on it.
        if !empty || self.readable() {
            return Poll::Ready(());
        }
        self.armed.store(true, Ordering::Release);
        Poll::Pending
    }

    /// Whether a descriptor is readable now: one `poll(2)` with no timeout, level-triggered.
    fn readable(&self) -> bool {
        let fds = self.fds.iter().map(AsRawFd::as_raw_fd);
        0 < poll(fds, None, std::time::Duration::ZERO).answer
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::configuration::Configuration;

    /// A hang detector only: every wait below ends by an event long before it.
    const PATIENCE: Duration = Duration::from_secs(60);

    fn open() -> LibfabricEndpoint {
        LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).unwrap()
    }

    fn with_io() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// No driver at all: a future parked by `poll_ready` is woken by the descriptors alone when
    /// a peer's connection and message land, and once the queues are quiet it parks (answers
    /// `Pending`) rather than asking to look again for ever.
    #[test]
    fn a_parked_future_is_woken_by_the_descriptors_alone() {
        let receiver = open();
        let address = receiver.local_address().unwrap();
        let reactors = Reactors::of(&receiver);
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let sender = open();
                let pinned = sender.cache().pin();
                let peer = pinned.resolve(1, &address).unwrap();
                sender.send_within(peer, b"woken", PATIENCE).unwrap();
                while !done.load(Ordering::Acquire) {
                    sender.progress_sleeping(Duration::from_millis(10));
                }
            });
            // Set however this thread leaves (a failed assertion too), so the scope can end.
            let _release = Release(&done);
            with_io().block_on(async {
                let registration = reactors.current().expect("a runtime with IO registers");
                let receiving = async {
                    loop {
                        if let Some(message) = receiver.try_receive().unwrap() {
                            return message;
                        }
                        std::future::poll_fn(|context| registration.poll_ready(&receiver, context))
                            .await;
                        receiver.progress();
                        // Leaves the timeout its turn even if the wait above never parked.
                        tokio::task::yield_now().await;
                    }
                };
                let message = tokio::time::timeout(PATIENCE, receiving)
                    .await
                    .expect("woken by the descriptors");
                assert_eq!(b"woken".to_vec(), message);
                // Nothing more comes: the queues go quiet and the future parks. (While the
                // provider still has work, `fi_trywait` says so and the answer is to look again;
                // one that never parked would never leave this loop.)
                let parks = async {
                    loop {
                        let parked = std::future::poll_fn(|context| {
                            Poll::Ready(registration.poll_ready(&receiver, context).is_pending())
                        })
                        .await;
                        if parked {
                            return;
                        }
                        receiver.progress();
                        tokio::task::yield_now().await;
                    }
                };
                tokio::time::timeout(PATIENCE, parks)
                    .await
                    .expect("parks once the queues are quiet");
            });
        });
    }

    /// Sets its flag when dropped.
    struct Release<'flag>(&'flag AtomicBool);

    impl Drop for Release<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// A runtime built without `enable_io`: no registration (tokio's panic is caught, once), and
    /// the answer is remembered.
    #[test]
    fn a_runtime_without_io_has_no_registration() {
        let endpoint = open();
        let reactors = Reactors::of(&endpoint);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(reactors.current().is_none());
            assert!(reactors.current().is_none());
        });
        assert_eq!(1, crate::sync::lock(&reactors.seen).len());
        // Outside any runtime: none either, and nothing remembered.
        assert!(reactors.current().is_none());
        assert_eq!(1, crate::sync::lock(&reactors.seen).len());
    }

    /// However many runtimes poll, at most `MOST_RUNTIMES` registrations are kept; one held by a
    /// future outlives its eviction, and counts as in use until dropped.
    #[test]
    fn registrations_are_bounded_by_most_runtimes() {
        let endpoint = open();
        let reactors = Reactors::of(&endpoint);
        assert!(!reactors.in_use());
        let first = with_io();
        let held = first.block_on(async { reactors.current() }).unwrap();
        assert!(reactors.in_use());
        for _ in 0..3 * MOST_RUNTIMES {
            let runtime = with_io();
            assert!(runtime.block_on(async { reactors.current() }).is_some());
        }
        assert_eq!(MOST_RUNTIMES, crate::sync::lock(&reactors.seen).len());
        // Evicted, so no longer counted; its future's copy still works on its runtime.
        assert!(!reactors.in_use());
        assert!(
            first
                .block_on(async {
                    std::future::poll_fn(|context| Poll::Ready(held.poll_ready(&endpoint, context)))
                        .await
                })
                .is_pending()
        );
    }
}
