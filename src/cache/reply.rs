//! How the writer's answer to a miss gets back to the thread that waits for it.
//!
//! Each thread keeps one channel for its answers and reuses it for every miss it sends, so a
//! blocking miss allocates no channel of its own. Every request carries an [`Answer`]: a clone of
//! the thread's sender and a ticket, unique on that thread, that the answer comes back with. The
//! waiting thread reads answers until its ticket's arrives, dropping any older one (the answer to
//! a `lease_within` that stopped waiting).
//!
//! # Guarantees
//!
//! - Every `Answer` sends exactly one message: its result, or, if it is dropped unsent (the writer
//!   stopped, or unwound), [`DmaError::Closed`]. So a waiter never waits for an answer that
//!   cannot come, although the channel it waits on outlives the writer.
//! - A waiter takes only its own ticket's answer.
//!
//! # Waiting
//!
//! A blocking round trip waits the way an adaptive mutex does: it polls for its answer only while
//! the writer is awake (or parked with a wake-up on its way), for the budget the writer's measured
//! costs give (two batches, plus the pending wake-up; between `doorbell::MIN_SPIN` and
//! `doorbell::MAX_SPIN`), and blocks on the channel at once when the writer is parked and nobody
//! has rung it (see [`super::doorbell`] for the state the writer publishes and why no wake-up is
//! lost whatever state the waiter reads). Each poll yields the core: on a machine with more
//! runnable threads than cores the writer may be waiting for this very core, and a busy spin
//! (`spin_loop`) there would hold it off, so a yielding poll never delays the answer it waits for
//! by taking the writer's core (figures under load, a yielding poll against a busy spin:
//! `docs/benchmarks.md`, "Figures moved out of the module docs").
//!
//! A waiter whose cache has callers that serve as the writer ([`Waiting::writer`]) is counted as
//! polling meanwhile, and whenever it finds the role free with requests queued it serves them
//! itself; before it blocks it takes the last look at the role (`Role::end_polling`). So the
//! requests queued after a holder's round go to a thread that runs (the guarantee "the work goes
//! to a thread that runs" in `super::role`).
//!
//! Under loom every round trip makes a channel of its own (a loom channel cannot outlive the
//! execution it was made in); the answers and tickets are the same, and the poll is a couple of
//! yielding tries while the writer is not parked.

use std::time::Instant;

use super::doorbell::{Doorbell, WriterState};
use super::role::Serve;
use crate::error::DmaError;
use crate::sync::{mpsc, recv_until};
use dma_libfabric_sys::fi_addr_t;

/// How long a waiter polls for its answer: until the writer's spin budget, read when the poll
/// starts, is spent (under loom, which has no time: [`Spin::LOOM_POLLS`] yielding polls).
struct Spin {
    #[cfg(not(dma_loom))]
    until: Option<Instant>,
    #[cfg(dma_loom)]
    polls: usize,
}

impl Spin {
    /// Under loom, enough polls for a model to interleave the writer's park between the waiter's
    /// reads of its state.
    #[cfg(dma_loom)]
    const LOOM_POLLS: usize = 2;

    fn new() -> Self {
        Self {
            #[cfg(not(dma_loom))]
            until: None,
            #[cfg(dma_loom)]
            polls: 0,
        }
    }

    /// Whether to poll once more, the writer being awake as `writer` says; pauses before it.
    fn again(&mut self, writer: WriterState) -> bool {
        #[cfg(not(dma_loom))]
        {
            let until = *self
                .until
                .get_or_insert_with(|| Instant::now() + writer.spin_budget());
            let again = Instant::now() < until;
            if again {
                // Yield rather than spin: the writer may share this core (more runnable threads
                // than cores), and a busy spin would hold it off the core it answers on.
                std::thread::yield_now();
            }
            again
        }
        #[cfg(dma_loom)]
        {
            let _ = writer;
            self.polls += 1;
            let again = self.polls <= Self::LOOM_POLLS;
            if again {
                crate::sync::thread::yield_now();
            }
            again
        }
    }
}

/// Who a waiter waits on: the writer's doorbell (its state and its role), and the writer itself
/// where callers serve as it (`None` under loom, and in tests of the wait alone), so that a
/// waiter that finds the role free with work queued serves it instead of waiting for a holder
/// that may be descheduled (see the guarantee "the work goes to a thread that runs" in [`super::role`]).
#[derive(Clone, Copy)]
pub(crate) struct Waiting<'a> {
    pub(crate) doorbell: &'a Doorbell,
    pub(crate) writer: Option<&'a dyn Serve>,
}

impl<'a> Waiting<'a> {
    /// Waiting on `doorbell` alone: nothing to serve.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn on(doorbell: &'a Doorbell) -> Self {
        Self {
            doorbell,
            writer: None,
        }
    }
}

/// Receive `receiver`'s next message: poll for it while the writer (whose state `doorbell`
/// publishes) is awake and its spin budget lasts, serving queued work whenever the role is free;
/// then, or at once if the writer is parked, take the last look at the role and block on the
/// channel. The state only decides how long to poll: the blocking `recv` at the end is what
/// waits, so no state read, stale or not, can lose the answer.
pub(crate) fn recv_adaptive<T>(
    receiver: &mpsc::Receiver<T>,
    waiting: Waiting<'_>,
) -> Result<T, std::sync::mpsc::RecvError> {
    let Waiting { doorbell, writer } = waiting;
    let role = &doorbell.role;
    if writer.is_some() {
        role.begin_polling();
    }
    let serve = || {
        if let Some(writer) = writer {
            writer.serve();
        }
    };
    let mut spin = Spin::new();
    let received = loop {
        match receiver.try_recv() {
            Ok(value) => break Some(Ok(value)),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                break Some(Err(std::sync::mpsc::RecvError));
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
        }
        // The role is free and work is queued (a holder left it to the pollers, or this answer
        // is queued behind a holder that has gone): serve it. The spin's budget and yield below
        // still bound the poll (a request counted and not yet sent is served by its sender).
        if writer.is_some() {
            role.poll(serve);
        }
        let state = doorbell.writer_state();
        if !state.awake() || !spin.again(state) {
            break None;
        }
    };
    if writer.is_some() {
        role.end_polling(serve);
    }
    match received {
        Some(received) => received,
        None => receiver.recv(),
    }
}

/// An answer with the ticket it belongs to.
type Tagged = (u64, Result<fi_addr_t, DmaError>);

/// Where the writer sends one answer. Sends `Closed` if dropped unsent.
pub(crate) struct Answer {
    sender: Option<mpsc::Sender<Tagged>>,
    ticket: u64,
}

impl Answer {
    /// Send `result` to the waiting thread. A thread that stopped waiting drops it unread.
    pub(crate) fn send(mut self, result: Result<fi_addr_t, DmaError>) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send((self.ticket, result));
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send((self.ticket, Err(DmaError::Closed)));
        }
    }
}

/// What came of a round trip.
pub(crate) enum Outcome {
    /// The writer's answer (`Closed` if the writer stopped first).
    Answered(Result<fi_addr_t, DmaError>),
    /// The deadline passed first; the request may still be applied.
    TimedOut,
}

/// One thread's answer channel.
struct Channel {
    sender: mpsc::Sender<Tagged>,
    receiver: mpsc::Receiver<Tagged>,
    next_ticket: u64,
}

impl Channel {
    fn new() -> Self {
        let (sender, receiver) = mpsc::channel();
        Self {
            sender,
            receiver,
            next_ticket: 0,
        }
    }

    fn round_trip(
        &mut self,
        ask: impl FnOnce(Answer) -> Result<(), DmaError>,
        deadline: Option<Instant>,
        writer: Waiting<'_>,
        mut nudge: Option<Nudge<'_>>,
    ) -> Outcome {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let answer = Answer {
            sender: Some(self.sender.clone()),
            ticket,
        };
        if let Err(error) = ask(answer) {
            // The unsent answer's `Closed` stays in the channel; the next round trip drops it.
            return Outcome::Answered(Err(error));
        }
        loop {
            let received = match (deadline, nudge.as_ref()) {
                (None, _) => recv_adaptive(&self.receiver, writer)
                    .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
                (Some(deadline), Some(&(at, _))) if at < deadline => {
                    match recv_until(&self.receiver, at) {
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            // Once: then wait for the answer until the deadline.
                            if let Some((_, poke)) = nudge.take() {
                                poke();
                            }
                            continue;
                        }
                        received => received,
                    }
                }
                (Some(deadline), _) => recv_until(&self.receiver, deadline),
            };
            match received {
                Ok((answered, result)) if answered == ticket => return Outcome::Answered(result),
                // An answer to an earlier request that stopped waiting.
                Ok(_) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Outcome::TimedOut,
                // This channel holds a sender of its own, so this does not happen.
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Outcome::Answered(Err(DmaError::Closed));
                }
            }
        }
    }
}

#[cfg(not(dma_loom))]
std::thread_local! {
    static CHANNEL: std::cell::RefCell<Option<Channel>> = const { std::cell::RefCell::new(None) };
}

/// What a waiter with a deadline does once, at the instant given, if no answer has come by then.
pub(crate) type Nudge<'a> = (Instant, &'a dyn Fn());

/// Send a request with `ask`, which puts the [`Answer`] it is given into the request, and wait
/// for the answer, until `deadline` if there is one (without one, waiting as the module docs
/// say, on the state `writer` publishes). An error from `ask` is the outcome.
pub(crate) fn round_trip(
    ask: impl FnOnce(Answer) -> Result<(), DmaError>,
    deadline: Option<Instant>,
    writer: Waiting<'_>,
) -> Outcome {
    round_trip_nudging(ask, deadline, writer, None)
}

/// [`round_trip`], and if no answer has come by the nudge's instant (before `deadline`), run the
/// nudge once and go on waiting until `deadline`. Under loom, where time does not pass, the
/// nudge never runs.
pub(crate) fn round_trip_nudging(
    ask: impl FnOnce(Answer) -> Result<(), DmaError>,
    deadline: Option<Instant>,
    writer: Waiting<'_>,
    nudge: Option<Nudge<'_>>,
) -> Outcome {
    let mut ask = Some(ask);
    #[cfg(not(dma_loom))]
    {
        let reused = CHANNEL.try_with(|cell| {
            // Borrowed already only if a round trip re-entered this one (it does not); in use or
            // not, a fresh channel below serves.
            let mut slot = cell.try_borrow_mut().ok()?;
            let ask = ask.take()?;
            Some(
                slot.get_or_insert_with(Channel::new)
                    .round_trip(ask, deadline, writer, nudge),
            )
        });
        if let Ok(Some(outcome)) = reused {
            return outcome;
        }
    }
    // Under loom, or while the thread's storage is torn down: a channel for this round trip.
    match ask.take() {
        Some(ask) => Channel::new().round_trip(ask, deadline, writer, nudge),
        None => Outcome::Answered(Err(DmaError::Closed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a round trip whose request is answered `Ok(fi_addr)` at once gets that answer.
    fn answered_at_once(fi_addr: fi_addr_t) -> bool {
        let outcome = round_trip(
            |answer| {
                answer.send(Ok(fi_addr));
                Ok(())
            },
            None,
            Waiting::on(&Doorbell::default()),
        );
        matches!(outcome, Outcome::Answered(Ok(answered)) if answered == fi_addr)
    }

    #[test]
    fn an_answer_dropped_unsent_tells_its_waiter_closed() {
        let outcome = round_trip(
            |answer| {
                std::thread::spawn(move || drop(answer));
                Ok(())
            },
            None,
            Waiting::on(&Doorbell::default()),
        );
        assert!(matches!(outcome, Outcome::Answered(Err(DmaError::Closed))));
    }

    #[test]
    fn a_late_answer_to_an_abandoned_request_is_not_taken_for_the_next() {
        let (keep, kept) = std::sync::mpsc::channel();
        let deadline = Instant::now();
        let outcome = round_trip(
            |answer| {
                keep.send(answer).map_err(|_| DmaError::Closed)?;
                Ok(())
            },
            Some(deadline),
            Waiting::on(&Doorbell::default()),
        );
        assert!(matches!(outcome, Outcome::TimedOut));
        // The abandoned request is answered now, on the same thread's channel.
        let late = kept.recv().map_err(|_| DmaError::Closed);
        assert!(late.is_ok());
        if let Ok(late) = late {
            late.send(Ok(1));
        }
        assert!(answered_at_once(2));
    }

    #[test]
    fn an_error_from_asking_is_the_outcome() {
        let outcome = round_trip(
            |_answer| Err(DmaError::Closed),
            None,
            Waiting::on(&Doorbell::default()),
        );
        assert!(matches!(outcome, Outcome::Answered(Err(DmaError::Closed))));
        // The unsent answer's `Closed` does not answer the next round trip.
        assert!(answered_at_once(3));
    }

    #[test]
    fn a_waiter_on_a_parked_writer_blocks_until_its_answer_comes() {
        let doorbell = Doorbell::default();
        doorbell.publish(super::super::doorbell::PARKED, 1_000, 0);
        let (sender, receiver) = mpsc::channel();
        let answering = std::thread::spawn(move || sender.send(7_u64));
        assert_eq!(Ok(7), recv_adaptive(&receiver, Waiting::on(&doorbell)));
        assert!(answering.join().is_ok_and(|sent| sent.is_ok()));
    }

    #[test]
    fn a_waiter_on_an_awake_writer_still_blocks_once_its_budget_is_spent() {
        let doorbell = Doorbell::default();
        // Awake for ever, as far as the waiter can tell: its spin ends with the budget.
        doorbell.publish(super::super::doorbell::APPLYING, u64::MAX, 0);
        let (sender, receiver) = mpsc::channel();
        let (started, start) = mpsc::channel::<()>();
        let answering = std::thread::spawn(move || {
            // Sent only once the waiter has started waiting, so it may have to block.
            let _ = start.recv();
            sender.send(9_u64)
        });
        let _ = started.send(());
        assert_eq!(Ok(9), recv_adaptive(&receiver, Waiting::on(&doorbell)));
        assert!(answering.join().is_ok_and(|sent| sent.is_ok()));
    }

    #[test]
    fn the_spin_budget_is_two_batches_within_its_bounds() {
        use super::super::doorbell::{APPLYING, MAX_SPIN, MIN_SPIN, PARKED};
        let doorbell = Doorbell::default();
        doorbell.publish(APPLYING, 13_000, 500);
        let state = doorbell.writer_state();
        assert!(state.awake());
        assert_eq!(13_000, state.batch_ns());
        assert_eq!(std::time::Duration::from_micros(26), state.spin_budget());
        doorbell.publish(APPLYING, 0, 0);
        assert_eq!(MIN_SPIN, doorbell.writer_state().spin_budget());
        doorbell.publish(APPLYING, u64::MAX, u64::MAX);
        assert_eq!(MAX_SPIN, doorbell.writer_state().spin_budget());
        assert_eq!(
            500,
            state.wake_ns(),
            "an awake writer's budget leaves its wake-up out"
        );
        doorbell.publish(PARKED, 13_000, 500);
        let parked = doorbell.writer_state();
        assert!(!parked.awake(), "parked, and nobody rang");
        assert_eq!((13_000, 500), (parked.batch_ns(), parked.wake_ns()));
        assert_eq!(
            std::time::Duration::from_nanos(26_500),
            parked.spin_budget()
        );
    }
}
