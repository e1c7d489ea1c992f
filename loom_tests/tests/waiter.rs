//! The completion waiters' hand-off (`src/endpoint/wait/handoff.rs`, as it ships): two threads
//! wait, each for its own completion, on one `Handoff` (one becomes the poller and sleeps on the
//! bell, the other follows on the condition variable, in whatever order loom picks), while a
//! third publishes each completion under the ready queue's lock and rings, as a thread that read
//! the queue and found another's completion does. Under loom nothing times out (loom's
//! `Condvar::wait_timeout` never does, and the model's bell blocks until rung), so a lost
//! wake-up is a deadlock: each waiter must return with its own completion.
//!
//! The second model, `a_post_answered_retry_is_attempted_again_without_a_ring`, checks the wait
//! through connection setup: a send whose post the provider refuses ("retry after progress")
//! while that very refusal's progress sets the connection up, so the next attempt goes through,
//! and nothing rings or wakes a descriptor for it (tcp;ofi_rxm's first send to a new peer). In
//! that model a sleep of at most `Handoff::RETRY_MOST` is a timer that fires, and a longer one
//! (the longest sleep, 1 s) never ends unless rung: a wait that sleeps long through the setup
//! deadlocks.
#![cfg(dma_loom)]

use std::time::Duration;

use dma_libfabric::{Deadline, Handoff};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Condvar, Mutex};

/// The model's `eventfd`: sticky (a ring before the sleep still wakes it), consumed by the sleep.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    changed: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.changed.notify_all();
    }

    /// The poller's `poll`: returns once rung, and only then (no timeout under loom).
    fn sleep(&self) {
        let mut rung = self.rung.lock().unwrap();
        while !*rung {
            rung = self.changed.wait(rung).unwrap();
        }
        *rung = false;
    }
}

#[test]
fn a_completion_handed_to_a_sleeping_waiter_wakes_it() {
    loom::model(|| {
        let handoff = Arc::new(Handoff::new());
        let bell = Arc::new(Bell::default());
        // The ready queue: completion `n` published for waiter `n`.
        let ready = Arc::new(Mutex::new([false; 2]));

        let waiters: Vec<_> = (0..2)
            .map(|me| {
                let (handoff, bell, ready) = (handoff.clone(), bell.clone(), ready.clone());
                loom::thread::spawn(move || {
                    handoff.wait(
                        Deadline::after(Duration::MAX),
                        || ready.lock().unwrap()[me].then_some(me),
                        |_bound| {
                            bell.sleep();
                            true
                        },
                    )
                })
            })
            .collect();

        for me in 0..2 {
            ready.lock().unwrap()[me] = true;
            handoff.ring(|| bell.ring());
        }
        for (me, waiter) in waiters.into_iter().enumerate() {
            assert_eq!(
                Some(me),
                waiter.join().unwrap(),
                "each waiter gets its own completion"
            );
        }
    });
}

/// The poller's sleep in the retry model: one no longer than the retry cap is a timer that
/// fires (it returns at once, woken by nothing); a longer one ends only when rung.
fn sleep_or_fire(bell: &Bell, bound: Duration) -> bool {
    if bound <= Handoff::RETRY_MOST {
        return false;
    }
    bell.sleep();
    true
}

#[test]
fn a_post_answered_retry_is_attempted_again_without_a_ring() {
    loom::model(|| {
        let handoff = Arc::new(Handoff::new());
        let bell = Arc::new(Bell::default());
        // Set up by the refused post's own progress, as rxm's connection is: nothing rings.
        let connected = Arc::new(AtomicBool::new(false));
        // The receiver's message: published, and rung for, once the send has gone through.
        let received = Arc::new(Mutex::new(false));

        let receiver = {
            let (handoff, bell, received) = (handoff.clone(), bell.clone(), received.clone());
            loom::thread::spawn(move || {
                handoff.wait(
                    Deadline::after(Duration::MAX),
                    || received.lock().unwrap().then_some("received"),
                    |bound| sleep_or_fire(&bell, bound),
                )
            })
        };
        let sender = {
            let (handoff, bell, connected) = (handoff.clone(), bell.clone(), connected.clone());
            loom::thread::spawn(move || {
                handoff.wait(
                    Deadline::after(Duration::MAX),
                    || {
                        if connected.load(Ordering::SeqCst) {
                            return Some("sent");
                        }
                        // The post is refused, and the refusal's progress connects.
                        connected.store(true, Ordering::SeqCst);
                        handoff.retry_soon();
                        None
                    },
                    |bound| sleep_or_fire(&bell, bound),
                )
            })
        };

        assert_eq!(
            Some("sent"),
            sender.join().unwrap(),
            "the send goes through"
        );
        *received.lock().unwrap() = true;
        handoff.ring(|| bell.ring());
        assert_eq!(Some("received"), receiver.join().unwrap());
    });
}
