//! The completion waiters' hand-off (`src/endpoint/wait/handoff.rs`, as it ships): two threads
//! wait, each for its own completion, on one `Handoff` (one becomes the poller and sleeps on the
//! bell, the other follows on the condition variable, in whatever order loom picks), while a
//! third publishes each completion under the ready queue's lock and rings, as a thread that read
//! the queue and found another's completion does. Under loom nothing times out (loom's
//! `Condvar::wait_timeout` never does, and the model's bell blocks until rung), so a lost
//! wake-up is a deadlock: each waiter must return with its own completion.
#![cfg(dma_loom)]

use std::time::Duration;

use dma_libfabric::{Deadline, Handoff};
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
                        |_bound| bell.sleep(),
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
