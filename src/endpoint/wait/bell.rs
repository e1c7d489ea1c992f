//! A bell that wakes a thread asleep in `poll(2)`, and that `poll`: written once for the
//! endpoint's waiters (the parent module) and the async face's driver standing by.
//!
//! # What it guarantees
//!
//! - **A ring is not lost.** [`Bell::ring`] adds to an `eventfd`'s counter, which stays readable
//!   until the [`poll`] that holds the bell drains it after waking: a ring made before that
//!   `poll` starts wakes it at once, one made during it wakes it then.
//! - **No thread blocks on the bell itself.** The `eventfd` is non-blocking: a full counter
//!   answers `EAGAIN` to a ring, and it still wakes the poller.
//! - **Bounded.** One descriptor a bell; a `poll` looks at most [`MOST_FDS`] descriptors, the
//!   bell included, in an array on the stack; descriptors past that are not looked at.
//! - **No bell, no failure.** Where the system gives no `eventfd`, a bell is silent, and its
//!   poller wakes by its timeout alone.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The most descriptors one [`poll`] looks at, its bell included.
pub(crate) const MOST_FDS: usize = 2 * super::MOST_SOURCES + 1;

// `Polled::readable` has a bit for each descriptor but the bell.
const _: () = assert!(MOST_FDS - 1 <= u32::BITS as usize);

/// A non-blocking `eventfd` to wake a thread in [`poll`] (module docs); `None` inside where the
/// system gave none.
#[derive(Debug)]
pub(crate) struct Bell(Option<OwnedFd>);

impl Bell {
    /// A new bell, silent if the system gives no `eventfd`.
    pub(crate) fn new() -> Self {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        Self((fd >= 0).then(|| {
            // SAFETY: `fd` was just opened and is owned by nothing else.
            unsafe { OwnedFd::from_raw_fd(fd) }
        }))
    }

    /// Wake the thread in a [`poll`] that holds this bell, or the next one to start.
    pub(crate) fn ring(&self) {
        if let Some(bell) = &self.0 {
            let one = 1_u64;
            // SAFETY: writing 8 bytes from a live u64 to our own eventfd; a full counter
            // (EAGAIN) already wakes the poller.
            let _ = unsafe { libc::write(bell.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    /// Reset the counter: the rings so far have been heard.
    fn drain(&self) {
        if let Some(bell) = &self.0 {
            let mut rung = 0_u64;
            // SAFETY: reading 8 bytes into a live u64 from our own non-blocking eventfd.
            let _ = unsafe { libc::read(bell.as_raw_fd(), (&raw mut rung).cast(), 8) };
        }
    }

    fn fd(&self) -> Option<RawFd> {
        self.0.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// What a [`poll`] saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Polled {
    /// `poll(2)`'s answer: how many descriptors had events, 0 at the timeout, -1 for an error
    /// or a signal (`EINTR`).
    pub(crate) answer: i32,
    /// Bit `i` set: `fds[i]` had an event (the bell is not among them).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(crate) readable: u32,
}

/// `poll(2)` for input on `fds` (the first `MOST_FDS - 1` of them) and on `bell`, for at most
/// `timeout` (zero looks and returns; any other is rounded up to a whole millisecond, and
/// saturates at `i32::MAX` ms), then drain the bell.
pub(crate) fn poll(
    fds: impl IntoIterator<Item = RawFd>,
    bell: Option<&Bell>,
    timeout: Duration,
) -> Polled {
    let mut set = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MOST_FDS];
    let mut watched = 0;
    for (slot, fd) in set[..MOST_FDS - 1].iter_mut().zip(fds) {
        *slot = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        watched += 1;
    }
    let mut count = watched;
    if let Some(fd) = bell.and_then(Bell::fd) {
        set[count] = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        count += 1;
    }
    let millis = millis(timeout);
    // SAFETY: `set` holds `count` initialised pollfds (at most its length), and lives across
    // the call.
    let answer = unsafe { libc::poll(set.as_mut_ptr(), count as libc::nfds_t, millis) };
    if let Some(bell) = bell {
        bell.drain();
    }
    let readable = set[..watched]
        .iter()
        .enumerate()
        .filter(|(_, fd)| 0 != fd.revents)
        .fold(0, |mask, (at, _)| mask | (1 << at));
    Polled { answer, readable }
}

/// `timeout` as `poll(2)`'s: zero stays zero, anything else is rounded up to a whole millisecond
/// (a sleep never shorter than asked), saturating at `i32::MAX`.
fn millis(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;

    #[test]
    fn a_ring_before_the_poll_wakes_it_and_is_drained() {
        let bell = Bell::new();
        bell.ring();
        let woken = poll([], Some(&bell), Duration::from_secs(60));
        assert_eq!(1, woken.answer, "the bell woke the poll");
        assert_eq!(0, woken.readable, "the bell is not among the descriptors");
        let after = poll([], Some(&bell), Duration::ZERO);
        assert_eq!(0, after.answer, "the ring was drained");
    }

    #[test]
    fn readable_descriptors_are_named_by_position() {
        let (mut quiet, mut loud) = ([0; 2], [0; 2]);
        // SAFETY: pipe writes two new descriptors into a live array of two.
        assert_eq!(0, unsafe { libc::pipe(quiet.as_mut_ptr()) });
        // SAFETY: as above.
        assert_eq!(0, unsafe { libc::pipe(loud.as_mut_ptr()) });
        let byte = 7_u8;
        // SAFETY: writing one byte from a live u8 to the pipe's write end.
        assert_eq!(1, unsafe {
            libc::write(loud[1], (&raw const byte).cast(), 1)
        });
        let polled = poll([quiet[0], loud[0]], None, Duration::ZERO);
        assert_eq!((1, 0b10), (polled.answer, polled.readable));
        for fd in quiet.into_iter().chain(loud) {
            // SAFETY: closing descriptors this test opened and uses no more.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn a_ring_from_another_thread_wakes_the_poll() {
        let bell = Bell::new();
        std::thread::scope(|scope| {
            scope.spawn(|| bell.ring());
            // A lost ring would sleep out the minute and answer 0.
            let woken = poll([], Some(&bell), Duration::from_secs(60));
            assert_eq!(1, woken.answer);
        });
    }

    #[test]
    fn descriptors_past_the_bound_are_not_looked_at() {
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two new descriptors into a live array of two.
        assert_eq!(0, unsafe { libc::pipe(pipe.as_mut_ptr()) });
        let byte = 7_u8;
        // SAFETY: writing one byte from a live u8 to the pipe's write end.
        assert_eq!(1, unsafe {
            libc::write(pipe[1], (&raw const byte).cast(), 1)
        });
        // A hostile count: the same readable descriptor, far more often than a poll holds.
        let bell = Bell::new();
        bell.ring();
        let polled = poll(
            std::iter::repeat_n(pipe[0], 10_000),
            Some(&bell),
            Duration::MAX,
        );
        let watched = MOST_FDS - 1;
        assert_eq!(
            watched as i32 + 1,
            polled.answer,
            "the bounded set and the bell"
        );
        assert_eq!((1_u32 << watched) - 1, polled.readable);
        for fd in pipe {
            // SAFETY: closing descriptors this test opened and uses no more.
            unsafe { libc::close(fd) };
        }
    }

    #[test]
    fn timeouts_round_up_and_saturate() {
        assert_eq!(0, millis(Duration::ZERO));
        assert_eq!(1, millis(Duration::from_nanos(1)));
        assert_eq!(2, millis(Duration::from_micros(1_500)));
        assert_eq!(i32::MAX, millis(Duration::MAX));
    }
}
