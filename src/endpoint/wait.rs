//! Sleeping until the completion queues have something: the `fi_trywait` protocol, and how many
//! threads share one queue's file descriptor.
//!
//! # Which queues sleep
//!
//! Where the provider offers a wait object (tcp and tcp;ofi_rxm, in libfabric 1.17 and 2.x) the
//! endpoint's completion queues are opened with `wait_obj = FI_WAIT_FD`, and
//! `fi_control(FI_GETWAIT)` gives each an epoll file descriptor that becomes readable when the
//! provider has something to do: bytes on a socket, a connection request. efa in 2.x takes
//! `FI_WAIT_FD` on RDM only with shm off and re-arms its completion channel only inside
//! `fi_cq_sread`, so its queues are opened with `FI_WAIT_UNSPEC` (which it promotes to an fd with
//! shm off, and serves in 1 ms polls with shm on) and a waiter sleeps in `fi_cq_sread` on the
//! transmit queue instead of `poll(2)` ([`Waiting::BlockingRead`], below). Everywhere else the
//! queues are opened with `FI_WAIT_NONE` and a wait polls: efa refuses every wait
//! object in 1.17. [`Configuration::busy_poll`] asks for the polling on every provider.
//! [`Waiting::choose`] is that choice, made from the provider's name and the runtime libfabric's
//! version, each polling case with its reason (logged when the endpoint opens); its unit tests pin
//! it, efa's cases included, since no efa device is here.
//!
//! The blocking read: the poller (below) calls `fi_cq_sread` on the transmit queue for at most
//! [`BLOCKING_SLICE`], and hands what it returns to the owners as any read of the queue does; a
//! ringer wakes it with `fi_cq_signal`. The slice bounds what the read does not see: an arrival on
//! the receive queue, or a ring that landed before the read began (if the provider's signal is
//! not sticky). A rail set of such endpoints, and the async API, do not sleep this way (the
//! rail set polls; `AsyncEndpoint::new` refuses them). The unit test runs it on tcp;ofi_rxm,
//! which serves `fi_cq_sread` too; on efa it has not run (no device here).

//! # The protocol (`fi_poll(3)`; fabtests `functional/msg_epoll.c`)
//!
//! Nothing inside libfabric moves data while the application sleeps: the kernel holds the socket
//! bytes, the descriptor wakes the application, and its next `fi_cq_read` (or rxm's `fi_trywait`,
//! which runs one progress pass) moves them. So a wait is a loop of: read the queues (the
//! caller's `attempt`, which drives progress and looks for what it waits for); `fi_trywait` on
//! both queues; only if it answers 0, `poll` the descriptors; then read again. A wake-up with no
//! completion is normal (a rendezvous, a connection set-up, a peer's RMA into this endpoint's
//! memory), and is answered by reading again.
//!
//! # Many waiters
//!
//! One descriptor wakes every thread that polls it, and a completion read by one thread may be
//! another's (an RMA completion waited for by `wait_for` on another thread). So one waiter at a
//! time, the poller, sleeps in `poll`; the others sleep on a condition variable and are woken
//! whenever the poller wakes, to read the queues themselves. A thread that hands a completion to
//! a possibly sleeping owner rings the [`Waiter`]: the followers' generation moves on, and an
//! `eventfd` in the poller's `poll` set wakes the poller. Ringing costs one atomic load when no
//! thread waits.
//!
//! Why no wake-up is lost: a waiter reads the generation *before* its attempt and sleeps only if
//! it is unchanged, under the state lock; a ringer publishes the completion (under the ready
//! queue's lock) *before* it reads the waiter count, and the waiter counts itself *before* its
//! attempt takes that lock. Either the attempt sees the completion, or the ringer sees the waiter
//! and moves the generation under the state lock, which the sleeper then sees or is woken by.
//! That hand-off is [`Handoff`] (`wait/handoff.rs`), apart from the descriptors, so that the
//! loom model `loom_tests/tests/waiter.rs` checks it as it ships. The poller's own `poll` is
//! bounded by [`MOST_SLEEP`] all the same, so a wake-up the provider fails to signal costs at
//! most that, never a hang.
//!
//! # Connection setup
//!
//! One kind of progress is signalled by nothing above. tcp;ofi_rxm answers the first posts to a
//! new peer `-FI_EAGAIN` while it sets the connection up, and its connection events come on its
//! own event queue, whose descriptor is in the completion queues' wait set (libfabric's
//! `rxm_ep_wait_fd_add`), so the peer's answer does wake the poller. But the attempt that then
//! reads that event (rxm reads its event queue inside the refused `fi_send`, or in the progress
//! after it) leaves nothing behind: the post would go through now, `fi_trywait` finds every
//! queue empty, and a poller would sleep its whole [`MOST_SLEEP`] before it posted again (the
//! figures: `docs/benchmarks.md`, "Connection setup"). So a post answered
//! `-FI_EAGAIN` calls [`Waiter::retry_soon`], and the wait it belongs to sleeps
//! [`Handoff::RETRY_FIRST`], doubling to at most [`Handoff::RETRY_MOST`], before it attempts
//! again; a wait with no such answer (an idle receive, a wait for a completion) sleeps up to
//! [`MOST_SLEEP`], so an idle endpoint wakes about once a second. The rail set's waits and
//! `progress_sleeping` post nothing and sleep the same way; an RMA post answered `-FI_EAGAIN` is
//! retried at once with progress (`rma`), without sleeping.
//!
//! # Bounds
//!
//! A `Waiter` holds one `eventfd`; `poll` is given at most 2 × [`MOST_SOURCES`] + 1
//! descriptors (two per source, at most [`MOST_SOURCES`] sources), on the stack.

mod bell;
mod handoff;

use std::os::fd::RawFd;
use std::sync::OnceLock;
use std::time::Duration;

pub use self::handoff::Handoff;
use super::deadline::Deadline;
use dma_libfabric_sys as sys;

/// The longest one `poll` sleeps before the queues are read again, whatever the deadline.
pub(crate) const MOST_SLEEP: Duration = Duration::from_secs(1);

/// The most sources one wait sleeps on (a rail set's rails: at least
/// [`MAX_RAILS`](crate::rails::MAX_RAILS), checked where the rail set waits).
pub(crate) const MOST_SOURCES: usize = 8;

pub(crate) use self::bell::Bell;
#[cfg(feature = "tokio")]
pub(crate) use self::bell::poll;

/// How an endpoint's blocking waits wait for its completion queues, chosen by provider in
/// [`Waiting::choose`]: see the module docs, "Which queues sleep".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// Queues opened with `FI_WAIT_FD`: a waiter sleeps in `poll(2)` on their descriptors, with
    /// the `fi_trywait` protocol.
    Descriptors,
    /// Queues opened with `FI_WAIT_UNSPEC`: the poller sleeps in `fi_cq_sread` on the transmit
    /// queue, for at most [`BLOCKING_SLICE`] at a time, handing what it reads to its owners; a
    /// ringer wakes it with `fi_cq_signal`. What efa in libfabric 2.x needs.
    BlockingRead,
    /// Queues opened with `FI_WAIT_NONE`: a waiter reads, yields and reads again; why, for this
    /// provider.
    Polling(&'static str),
}

/// Why efa polls in libfabric 1.x.
const EFA_1: &str = "efa in libfabric 1.x refuses every wait object (fi_cq_open answers \
                     -FI_ENOSYS)";
/// Why a provider never measured here polls.
const UNMEASURED: &str = "no wait object has been measured to work with this provider";
/// Why a `busy_poll` endpoint polls.
const BUSY_POLL: &str = "Configuration::busy_poll asks for the spinning wait";

impl Waiting {
    /// The choice for `provider` (as `fi_getinfo` names it) under the runtime libfabric's API
    /// version `(major, minor)` ([`runtime_version`](crate::configuration::runtime_version)):
    /// descriptors for tcp and tcp;ofi_rxm (measured on 1.17 and 2.6.0), unless `busy_poll`; a
    /// blocking read for efa in 2.x (read from its source: 2.x takes `FI_WAIT_FD` on RDM only with
    /// shm off, promotes `FI_WAIT_UNSPEC` to it then, and re-arms its completion channel only
    /// inside `fi_cq_sread`); polling, with its reason, everywhere else.
    pub(crate) fn choose(provider: &str, (major, _minor): (u32, u32), busy_poll: bool) -> Self {
        #[cfg(test)]
        if let Some(forced) = FORCED.get() {
            return forced;
        }
        if busy_poll {
            return Self::Polling(BUSY_POLL);
        }
        match provider {
            "tcp" | "tcp;ofi_rxm" => Self::Descriptors,
            "efa" if major < 2 => Self::Polling(EFA_1),
            "efa" => Self::BlockingRead,
            _ => Self::Polling(UNMEASURED),
        }
    }

    /// The wait object the completion queues are opened with.
    pub(crate) fn wait_object(self) -> sys::fi_wait_obj {
        match self {
            Self::Descriptors => sys::FI_WAIT_FD,
            Self::BlockingRead => sys::FI_WAIT_UNSPEC,
            Self::Polling(_) => sys::FI_WAIT_NONE,
        }
    }

    /// Make every endpoint this thread opens wait as `waiting` says, whatever its provider (`None`:
    /// choose again): so the unit tests run the blocking-read waiter on tcp, where it works too.
    #[cfg(test)]
    pub(crate) fn force(waiting: Option<Self>) {
        FORCED.set(waiting);
    }
}

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<Waiting>> = const { std::cell::Cell::new(None) };
}

/// The longest one `fi_cq_sread` of the blocking-read waiter lasts: it returns for a transmit
/// completion or a ring, not for an arrival on the receive queue, so a thread waiting for a
/// message sees it within this (one wake-up a slice while idle, 100 a second).
pub(crate) const BLOCKING_SLICE: Duration = Duration::from_millis(10);

/// One endpoint's completion queues opened with a wait object: what a waiter sleeps on, their
/// descriptors (`FI_WAIT_FD`) or a blocking read of the transmit queue (`FI_WAIT_UNSPEC`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source {
    fabric: *mut sys::fid_fabric,
    cqs: [*mut sys::fid_cq; 2],
    /// -1 for a source read blocking.
    fds: [RawFd; 2],
    /// Whether a waiter sleeps in `fi_cq_sread` on the transmit queue rather than on `fds`.
    blocking: bool,
}

// SAFETY: the pointers are the endpoint's open fabric and queues, which libfabric lets any thread
// use (the domain is FI_THREAD_SAFE); a `Source` is used only while its endpoint is open.
unsafe impl Send for Source {}
// SAFETY: as for `Send`.
unsafe impl Sync for Source {}

impl Source {
    /// The wait descriptors of `cqs`, both opened with `FI_WAIT_FD` in `fabric`; `None` when the
    /// provider gives none (then the endpoint polls).
    ///
    /// # Safety
    /// `fabric` and `cqs` are open, and stay open for as long as the `Source` is used.
    pub(crate) unsafe fn of(
        fabric: *mut sys::fid_fabric,
        cqs: [*mut sys::fid_cq; 2],
    ) -> Option<Self> {
        let mut fds = [-1; 2];
        for (cq, fd) in cqs.iter().zip(&mut fds) {
            // SAFETY: the queue is open (the caller's promise); FI_GETWAIT writes one int.
            let code = unsafe {
                sys::fi_control(
                    &raw mut (**cq).fid,
                    sys::FI_GETWAIT as i32,
                    std::ptr::from_mut(fd).cast(),
                )
            };
            if 0 != code || *fd < 0 {
                tracing::debug!(code, "no wait descriptor for a completion queue: polling");
                return None;
            }
        }
        Some(Self {
            fabric,
            cqs,
            fds,
            blocking: false,
        })
    }

    /// Queues a waiter sleeps on by `fi_cq_sread` of the transmit queue ([`Waiting::BlockingRead`]).
    ///
    /// # Safety
    /// As [`of`](Self::of): `fabric` and `cqs` are open, with a wait object, and stay open for as
    /// long as the `Source` is used.
    pub(crate) unsafe fn blocking(
        fabric: *mut sys::fid_fabric,
        cqs: [*mut sys::fid_cq; 2],
    ) -> Self {
        Self {
            fabric,
            cqs,
            fds: [-1; 2],
            blocking: true,
        }
    }

    /// Whether a waiter sleeps in `fi_cq_sread` on this source's transmit queue (no descriptors).
    pub(crate) fn reads_blocking(&self) -> bool {
        self.blocking
    }

    /// Wake a thread in `fi_cq_sread` on the transmit queue.
    fn signal(&self) {
        // SAFETY: the queue is open (`blocking`'s promise).
        let code = unsafe { sys::fi_cq_signal(self.cqs[0]) };
        if 0 != code {
            tracing::debug!(
                code,
                "fi_cq_signal failed: the reader wakes within its slice"
            );
        }
    }

    /// The queues' wait descriptors (epoll descriptors on tcp), which the async face registers
    /// with a runtime's reactor; `-1` each for a source read blocking.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(crate) fn fds(&self) -> [RawFd; 2] {
        self.fds
    }

    /// `fi_trywait` on both queues: whether the caller may block on the descriptors now (the
    /// module docs' protocol: when it answers `false`, read the queues again first).
    pub(crate) fn may_sleep(&self) -> bool {
        self.may_sleep_on(&self.cqs)
    }

    fn may_sleep_on(&self, cqs: &[*mut sys::fid_cq]) -> bool {
        let mut fids = [std::ptr::null_mut(); 2];
        for (fid, cq) in fids.iter_mut().zip(cqs) {
            // SAFETY: the queues are open (`of`'s promise).
            *fid = unsafe { &raw mut (**cq).fid };
        }
        let count = cqs.len().min(2) as i32;
        // SAFETY: the fabric and the queues are open; `fids` holds `count` valid fids.
        let code = unsafe { sys::fi_trywait(self.fabric, fids.as_mut_ptr(), count) };
        if 0 != code && code != -(sys::FI_EAGAIN as i32) {
            tracing::debug!(
                code,
                "fi_trywait failed: reading again rather than sleeping"
            );
        }
        0 == code
    }
}

/// The threads waiting on one endpoint's (or one rail set's) completions: see the module docs.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// Who polls, who follows, and how a ringer reaches them (`handoff`, checked by loom).
    handoff: Handoff,
    /// In the poller's `poll` set, rung to wake it; silent if the system gave no `eventfd` (the
    /// poller then wakes by itself within [`MOST_SLEEP`]).
    bell: Bell,
    /// The blocking-read source a poller may sleep in, signalled to wake it: set by the first
    /// blocking wait, before it can become the poller.
    reading: OnceLock<Source>,
}

impl Default for Waiter {
    fn default() -> Self {
        Self {
            handoff: Handoff::new(),
            bell: Bell::new(),
            reading: OnceLock::new(),
        }
    }
}

impl Waiter {
    /// Something a waiter may be waiting for was just published (a completion in a ready queue):
    /// wake the waiters to look. One atomic load when none waits.
    pub(crate) fn ring(&self) {
        self.handoff.ring(|| {
            self.bell.ring();
            if let Some(source) = self.reading.get() {
                source.signal();
            }
        });
    }

    /// A post was just answered "retry after progress" (`-FI_EAGAIN`, as tcp;ofi_rxm answers the
    /// first posts to a peer while it sets the connection up): the wait whose attempt posted it
    /// sleeps at most [`Handoff::RETRY_MOST`] before it attempts again, rather than until a
    /// descriptor or a ring wakes it, since what lets the post through may signal neither (see
    /// `wait/handoff.rs`, "No sleep through connection setup"). One atomic add.
    pub(crate) fn retry_soon(&self) {
        self.handoff.retry_soon();
    }

    /// How many posts were answered "retry after progress" ([`retry_soon`](Self::retry_soon)).
    #[cfg_attr(not(feature = "model"), allow(dead_code))] // the tests' counter
    pub(crate) fn retries_asked(&self) -> u64 {
        self.handoff.retries_asked()
    }

    /// How many sleeps of these waits lasted the whole of [`MOST_SLEEP`] with nothing waking
    /// them.
    #[cfg_attr(not(feature = "model"), allow(dead_code))] // the tests' counter
    pub(crate) fn sleeps_run_out(&self) -> u64 {
        self.handoff.sleeps_run_out()
    }

    /// Call `attempt` until it answers `Some` or `deadline` passes, sleeping on `sources`'
    /// descriptors between calls (see the module docs); with no sources (a provider without a
    /// wait object, [`Configuration::busy_poll`](crate::configuration::Configuration::busy_poll)), yielding
    /// between calls instead. `attempt` must read the queues (drive progress) itself.
    pub(crate) fn wait<T>(
        &self,
        sources: &[Source],
        deadline: Deadline,
        attempt: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        if sources.is_empty()
            || sources.len() > MOST_SOURCES
            || sources.iter().any(Source::reads_blocking)
        {
            return spin(deadline, attempt);
        }
        self.handoff.wait(deadline, attempt, |sleep| {
            // A queue with something to read is a wake-up already: no sleep.
            !sources.iter().all(Source::may_sleep) || self.poll(sources, sleep)
        })
    }

    /// As [`wait`](Self::wait), and where the one source is read blocking
    /// ([`Waiting::BlockingRead`]), the poller sleeps in `read` instead: `read(cq, bound)` must
    /// block in `fi_cq_sread` on `cq`, the source's transmit queue, for at most `bound` (at most
    /// [`BLOCKING_SLICE`]) and hand what it reads to its owners.
    pub(crate) fn wait_reading<T>(
        &self,
        sources: &[Source],
        deadline: Deadline,
        attempt: impl FnMut() -> Option<T>,
        mut read: impl FnMut(*mut sys::fid_cq, Duration),
    ) -> Option<T> {
        match sources {
            [source] if source.reads_blocking() => {
                // Set before this thread can become the poller (the hand-off's lock orders it
                // before any ringer's look at the poller).
                let _ = self.reading.get_or_init(|| *source);
                self.handoff.wait(deadline, attempt, |bound| {
                    read(source.cqs[0], bound.min(BLOCKING_SLICE));
                    // Never the longest sleep: a slice is far shorter.
                    true
                })
            }
            _ => self.wait(sources, deadline, attempt),
        }
    }

    /// Block in `poll` on every source's descriptors and the bell for at most `sleep`: whether a
    /// descriptor woke it (rather than the bound).
    fn poll(&self, sources: &[Source], sleep: Duration) -> bool {
        let fds = sources.iter().flat_map(|source| source.fds);
        // A signal (-1, EINTR) is a wake-up too: only a timeout is not.
        0 != bell::poll(fds, Some(&self.bell), sleep).answer
    }
}

/// The polling wait: `attempt` until it answers or the deadline passes, yielding in between.
fn spin<T>(deadline: Deadline, mut attempt: impl FnMut() -> Option<T>) -> Option<T> {
    loop {
        if let Some(found) = attempt() {
            return Some(found);
        }
        if deadline.passed() {
            return None;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::configuration::Configuration;
    use crate::endpoint::LibfabricEndpoint;

    /// Two RMA endpoints on 127.0.0.1 whose waits sleep in `fi_cq_sread` (tcp;ofi_rxm has it
    /// too), as efa's do in libfabric 2.x: the blocking-read path runs here, not only on efa.
    fn reading_blocking() -> (LibfabricEndpoint, LibfabricEndpoint) {
        Waiting::force(Some(Waiting::BlockingRead));
        let configuration = Configuration {
            rma: true,
            ..Configuration::default()
        };
        let open = || LibfabricEndpoint::open(&configuration, Some("127.0.0.1"));
        let pair = (open(), open());
        Waiting::force(None);
        (pair.0.unwrap(), pair.1.unwrap())
    }

    fn thread_cpu() -> Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a live timespec for the call to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) };
        Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
    }

    /// The blocking-read waiter (efa's in 2.x), run on tcp: four threads each wait for their own
    /// write at once (one reads in `fi_cq_sread` and hands the others' completions on, ringing
    /// them; the others follow), every write completes to its own waiter, and a wait with nothing
    /// coming sleeps. Fails if the reader kept others' completions, if a ring did not reach a
    /// follower, or if the wait spun.
    #[test]
    fn the_blocking_read_waiter_completes_each_waiters_write_and_sleeps() {
        let (server, client) = reading_blocking();
        assert!(
            server
                .wait_sources()
                .first()
                .is_some_and(Source::reads_blocking)
        );
        let len = 1 << 20;
        let source = server.register(len).unwrap();
        source.write_bytes(0, &vec![3; len]).unwrap();
        let target = client.register(4 * len).unwrap();
        let address = client.local_address().unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    client.progress_sleeping(Duration::from_millis(20));
                }
            });
            let waiters: Vec<_> = (0..4_u64)
                .map(|id| {
                    let (server, source, target, address) = (&server, &source, &target, &address);
                    scope.spawn(move || {
                        let lease = server.cache().lease(1, address).unwrap();
                        let remote = target.remote().slice(id * len as u64, len as u64).unwrap();
                        let segment = source.segment(0, len).unwrap();
                        server.write(lease, segment, remote, id).unwrap();
                        server.wait_for(id, Duration::from_secs(20)).unwrap()
                    })
                })
                .collect();
            for (id, waiter) in waiters.into_iter().enumerate() {
                let done = waiter.join().unwrap();
                assert_eq!((id as u64, Ok(())), (done.id, done.result));
            }
            stop.store(true, Ordering::Release);
        });
        assert_eq!(0, server.operations_in_flight());
        let (wall, cpu) = (Instant::now(), thread_cpu());
        assert_eq!(None, server.receive(Duration::from_millis(300)).unwrap());
        let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
        assert!(
            cpu * 10 < wall,
            "receive used {cpu:?} over {wall:?}: it spins"
        );
    }

    const V1_17: (u32, u32) = (1, 17);
    const V2_6: (u32, u32) = (2, 6);

    #[test]
    fn tcp_sleeps_on_descriptors_on_both_versions_unless_busy_poll() {
        for provider in ["tcp", "tcp;ofi_rxm"] {
            for version in [V1_17, V2_6] {
                let waiting = Waiting::choose(provider, version, false);
                assert_eq!(Waiting::Descriptors, waiting);
                assert_eq!(sys::FI_WAIT_FD, waiting.wait_object());
                let spinning = Waiting::choose(provider, version, true);
                assert_eq!(Waiting::Polling(BUSY_POLL), spinning);
                assert_eq!(sys::FI_WAIT_NONE, spinning.wait_object());
            }
        }
    }

    #[test]
    fn efa_reads_blocking_on_2_x_and_polls_with_its_reason_on_1_x() {
        let Waiting::Polling(old) = Waiting::choose("efa", V1_17, false) else {
            panic!("efa 1.17 must poll");
        };
        assert!(old.contains("refuses every wait object"), "{old}");
        let new = Waiting::choose("efa", V2_6, false);
        assert_eq!(Waiting::BlockingRead, new, "efa 2.x sleeps in fi_cq_sread");
        assert_eq!(
            sys::FI_WAIT_UNSPEC,
            new.wait_object(),
            "FI_WAIT_FD fails with shm on"
        );
        assert_eq!(
            Waiting::Polling(BUSY_POLL),
            Waiting::choose("efa", V2_6, true)
        );
    }

    #[test]
    fn an_unmeasured_provider_polls() {
        for provider in ["verbs;ofi_rxm", "shm", "", "tcp;ofi_rxd", "TCP"] {
            assert_eq!(
                Waiting::Polling(UNMEASURED),
                Waiting::choose(provider, V2_6, false),
                "{provider:?}"
            );
        }
    }
}
