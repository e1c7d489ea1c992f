//! Where the writer's state lives between holders of the writer role, and the background thread.
//!
//! [`WriterCell`] keeps the one [`Writer`] of a cache. Whoever holds the role
//! ([`crate::cache::role`]) has it, and nobody else: a caller whose miss won the role
//! ([`Serve::serve`]), or the process's background thread ([`super::background`], through
//! [`Tend::visit`]), which takes the same role for the work no caller brings (deferred removals as readers unpin and leases drop, failed
//! removals' retries, `quiesce`, eviction reports, waiters' deadlines).
//!
//! A holder that panics poisons the role for good and drops the writer's state: its inbox closes,
//! so every queued request is answered `Closed`, and so is every later call, as when the writer
//! thread died.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::rounds::Next;
use super::run::FIRST_TICK;
use super::{RoleMark, Serve, SharedState, Writer, signalled};
use crate::av::AvBackend;
use crate::cache::role::Take;
use crate::sync::Arc;

/// The writer's state, for whoever holds the role. See the module docs.
pub(crate) struct WriterCell<B> {
    pub(crate) shared: Arc<SharedState>,
    cache: u64,
    /// `None` once the writer has stopped or panicked (the role is poisoned then, so nobody
    /// looks again).
    writer: UnsafeCell<Option<Writer<B>>>,
    /// Whether a holder panicked: the cache's drop says so.
    panicked: AtomicBool,
}

// SAFETY: the writer's state is touched only by the holder of the role (`under_role`'s
// contract), and the role is taken with an Acquire compare-and-swap and given back with a Release
// swap (`Role::try_take`, `Role::release`): one holder at a time, each seeing everything the one
// before it wrote. So the state is never accessed from two threads at once, and moving it between
// threads in that way is what `Send` allows: the backend is `Send` (`AvBackend: Send`). The one
// field that is not `Send` is the epoch `LocalHandle`: crossbeam makes it `!Send` because its
// participant's fields are plain `Cell`s that must not be used from two threads at once, and
// guards must not outlive the handle's thread. Neither can happen here: access is serialised by
// the role as above, and every guard the writer takes (`advance`, `defer_retired`) is dropped
// before its method returns, inside the holder's round; the participant keeps no thread-local
// state (only the default collector's handle is thread-local, and the cache's collector is its
// own).
unsafe impl<B: AvBackend> Sync for WriterCell<B> {}
// SAFETY: as for `Sync`: the cell moves the writer between threads only through the role.
unsafe impl<B: AvBackend> Send for WriterCell<B> {}

impl<B: AvBackend> WriterCell<B> {
    pub(crate) fn new(writer: Writer<B>, shared: Arc<SharedState>, cache: u64) -> Self {
        Self {
            shared,
            cache,
            writer: UnsafeCell::new(Some(writer)),
            panicked: AtomicBool::new(false),
        }
    }

    /// Whether a holder panicked.
    pub(crate) fn panicked(&self) -> bool {
        self.panicked.load(Ordering::Relaxed)
    }

    /// Run `work` on the writer, marking this thread as its holder meanwhile; `None` if the
    /// writer is gone, or panicked in `work` (which poisons the role and drops the writer's
    /// state). The caller holds the role.
    fn under_role<T>(&self, work: impl FnOnce(&mut Writer<B>) -> T) -> Option<T> {
        let _mark = RoleMark::new(self.cache);
        // SAFETY: the caller holds the role (every caller of `under_role` took it and has not
        // released it), so no other thread touches the cell now; see the `Sync` impl.
        let slot = unsafe { &mut *self.writer.get() };
        let writer = slot.as_mut()?;
        match catch_unwind(AssertUnwindSafe(|| work(writer))) {
            Ok(value) => Some(value),
            Err(_) => {
                self.panicked.store(true, Ordering::Relaxed);
                tracing::error!(
                    "the address cache's writer panicked; its role is poisoned and every later call \
                     answers Closed"
                );
                // Dropping the writer closes its inbox and drops every unsent answer: each waiter
                // is told `Closed`. A drop that panics too is contained here.
                let gone = slot.take();
                let _ = catch_unwind(AssertUnwindSafe(move || drop(gone)));
                self.shared.doorbell.role.poison();
                // The background thread may be parked with nothing to wake it: it ends once it
                // sees the role poisoned.
                self.shared.doorbell.wake_background();
                None
            }
        }
    }

    /// The writer stopped (the cache's drop asked it to, and it removed everything): drop its
    /// state and keep the role for good. The caller holds the role.
    fn close(&self) {
        // SAFETY: as in `under_role`: the caller holds the role.
        let gone = unsafe { &mut *self.writer.get() }.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(gone)));
        self.shared.doorbell.role.poison();
        self.shared.doorbell.wake_background();
    }
}

impl<B: AvBackend> Serve for WriterCell<B> {
    fn serve(&self) {
        let doorbell = &self.shared.doorbell;
        doorbell.role.serve(
            || match self.under_role(Writer::serve_round) {
                Some(false) => true,
                Some(true) => {
                    self.close();
                    false
                }
                None => false,
            },
            || doorbell.wake_background(),
        );
    }
}

/// What the shared background thread keeps for one cache between its visits: how the last round
/// said to park, the costs it published, and how long the ring that woke it took.
#[derive(Default)]
pub(crate) struct Visits {
    woke: Option<Duration>,
    parking: (Option<Duration>, bool),
    costs: (u64, u64),
}

/// What a visit leaves the shared background thread to do for the cache.
pub(crate) enum After {
    /// Visit again when rung, or at the instant (`None`: only when rung).
    Park(Option<Instant>),
    /// Visit again at once: requests are queued, or the round asked to hurry.
    Again,
    /// The writer stopped or panicked: forget the cache.
    Gone,
}

/// A cache as the shared background thread tends it (see `writer::background`).
pub(crate) trait Tend: Send + Sync {
    /// Whether work has come for the background thread: a request queued while nobody holds the
    /// role, a report of the readers or a lease, or work a holder handed it.
    fn ready(&self) -> bool;
    /// Take the role for one background round ([`Writer::background_round`]) and announce how
    /// long to park.
    fn visit(&self, visits: &mut Visits) -> After;
    /// Record `thread` as the one to unpark.
    fn answer_at(&self, thread: std::thread::Thread);
}

impl<B: AvBackend> Tend for WriterCell<B> {
    fn ready(&self) -> bool {
        let role = &self.shared.doorbell.role;
        (role.has_queued() && !role.held())
            || signalled(&self.shared)
            || self.shared.doorbell.handed()
    }

    fn visit(&self, visits: &mut Visits) -> After {
        let doorbell = &self.shared.doorbell;
        let role = &doorbell.role;
        doorbell.woken(|measured| {
            visits.woke = visits.woke.or(measured);
            visits.costs
        });
        match role.try_take() {
            Take::Taken => {}
            Take::Poisoned => return After::Gone,
            // A caller holds the role and serves: it takes the reports and ticks the epoch, and
            // looks at the inbox again when it releases, so this thread comes back at its timer
            // (its doze) or, if it had none, a tick later. Its release unparks nobody.
            Take::Held => {
                let (timeout, dozing) = visits.parking;
                let again = match timeout {
                    Some(timeout) if dozing => timeout,
                    _ => FIRST_TICK,
                };
                doorbell.announce_park(dozing, visits.costs);
                return After::Park(Instant::now().checked_add(again));
            }
        }
        let next = self.under_role(|writer| writer.background_round(visits.woke.take()));
        let (timeout, dozing) = match next {
            Some(Next::Wait {
                timeout,
                dozing,
                costs,
            }) => {
                visits.costs = costs;
                (timeout, dozing)
            }
            Some(Next::Stopped) => {
                self.close();
                return After::Gone;
            }
            // Poisoned: the role stays held for good.
            None => return After::Gone,
        };
        visits.parking = (timeout, dozing);
        role.release();
        // The second look (see `role`): a caller that found the role held left its request here.
        std::sync::atomic::fence(Ordering::SeqCst);
        if role.has_queued() || timeout == Some(Duration::ZERO) {
            return After::Again;
        }
        // The last look before parking: a ringer after it reads the state announced here.
        doorbell.announce_park(dozing && timeout.is_some(), visits.costs);
        if self.ready() {
            return After::Again;
        }
        // A timeout past what an `Instant` holds (none is: the longest is the cache's patience,
        // at most an hour) parks until rung rather than panic on the shared thread.
        After::Park(timeout.and_then(|timeout| Instant::now().checked_add(timeout)))
    }

    fn answer_at(&self, thread: std::thread::Thread) {
        self.shared.doorbell.answer_at(thread);
    }
}
