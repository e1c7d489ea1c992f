//! The writer role (`src/cache/role.rs`): two threads whose misses queue a request and then try
//! to serve, and the background thread with a lease drop's report to take, race for the role.
//! Checked: one holder at a time (the writer's state is a loom `UnsafeCell`, so two holders at
//! once fail the model), and no request stranded (once every thread is done, every request has
//! been applied exactly once and nothing is counted as queued).
//!
//! Mutations it kills (see the README): **K**, a release without the second look at the inbox,
//! and **H**, the role taken with a plain load and store.
//!
//! The second model (issue 43, item 2): a holder leaves what is queued after its round to a waiter
//! that polls for its answer, and the waiter serves it when it finds the role free, or at its last
//! look before it stops polling. Checked: no request stranded, however the holder's release and
//! the waiter's polls interleave. Mutation **M** (the waiter stops polling without its last look)
//! fails it.
#![cfg(dma_loom)]

use dma_libfabric::{Role, Served};
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};

/// What the threads share: the role, the inbox, a lease drop's report, and the writer's state
/// (the requests applied, in order, and whether the report was taken).
struct Model {
    role: Role,
    inbox: Mutex<Vec<u32>>,
    reported: AtomicBool,
    /// A holder handed the rest to the background thread (`Role::serve`'s `wake`): the real
    /// thread is unparked and serves again; the model does that once every thread is done.
    woken: AtomicBool,
    applied: UnsafeCell<Vec<u32>>,
    reports_taken: UnsafeCell<u32>,
}

impl Model {
    /// One round under the role: take the report, then everything queued.
    fn round(&self) -> bool {
        if self.reported.swap(false, Ordering::AcqRel) {
            // SAFETY: under the role (what the model checks).
            self.reports_taken.with_mut(|taken| unsafe { *taken += 1 });
        }
        let queued: Vec<u32> = std::mem::take(&mut *self.inbox.lock().expect("inbox"));
        for request in queued {
            self.role.unqueue();
            // SAFETY: under the role (what the model checks).
            self.applied
                .with_mut(|applied| unsafe { (*applied).push(request) });
        }
        true
    }

    /// A miss: count the request, queue it, then serve if the role is free.
    fn miss(&self, request: u32) -> Served {
        self.role.queue();
        self.inbox.lock().expect("inbox").push(request);
        self.role.serve(|| self.round(), || self.wake())
    }

    /// What `wake` does in the model: note that the background thread must serve again.
    fn wake(&self) {
        self.woken.store(true, Ordering::Release);
    }

    /// Serve as a caller does: rounds while the role is free, then leave.
    fn serve(&self) {
        let served = self.role.serve(|| self.round(), || self.wake());
        assert_ne!(Served::Poisoned, served);
    }

    /// Wait for an answer as `reply::recv_adaptive` does: poll a bounded number of times,
    /// serving whenever the role is free with work queued, then the last look; the block on the
    /// answer channel that follows is not modelled (the check after the join is that nothing is
    /// left for it to wait for).
    fn wait(&self) {
        self.role.begin_polling();
        for _ in 0..POLLS {
            if !self.role.poll(|| self.serve()) {
                loom::thread::yield_now();
            }
        }
        self.role.end_polling(|| self.serve());
    }

    /// After every thread is done: the background thread's round if a holder woke it, then no
    /// request stranded, each applied once.
    fn check(&self, requests: &[u32]) {
        if self.woken.load(Ordering::Acquire) {
            assert_eq!(Served::Done, self.role.serve(|| self.round(), || {}));
        }
        assert!(
            !self.role.has_queued(),
            "a request is counted but nobody applies it"
        );
        assert!(
            self.inbox.lock().expect("inbox").is_empty(),
            "a stranded request"
        );
        // SAFETY: every thread has been joined.
        let mut applied = self.applied.with(|applied| unsafe { (*applied).clone() });
        applied.sort_unstable();
        assert_eq!(requests, &applied[..]);
    }

    fn new() -> Self {
        Self {
            role: Role::new(),
            inbox: Mutex::new(Vec::new()),
            reported: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            applied: UnsafeCell::new(Vec::new()),
            reports_taken: UnsafeCell::new(0),
        }
    }
}

/// How many times a waiter polls before its last look: enough for a poll to land before and
/// after a holder's release.
const POLLS: usize = 2;

/// The holder's request is one nobody waits for (a `release`): once it leaves, only the polling
/// waiter can serve what it left.
#[test]
fn a_holder_leaves_queued_work_to_a_polling_waiter_which_serves_it() {
    loom::model(|| {
        let model = Arc::new(Model::new());
        let second = {
            let model = Arc::clone(&model);
            loom::thread::spawn(move || {
                let _ = model.miss(2);
                model.wait();
            })
        };
        let _ = model.miss(1);
        second.join().expect("the second thread");
        model.check(&[1, 2]);
    });
}

/// Both threads wait for their answers, and each may hold the role while the other polls.
#[test]
fn two_polling_waiters_each_serve_or_are_served() {
    loom::model(|| {
        let model = Arc::new(Model::new());
        let second = {
            let model = Arc::clone(&model);
            loom::thread::spawn(move || {
                let _ = model.miss(2);
                model.wait();
            })
        };
        let _ = model.miss(1);
        model.wait();
        second.join().expect("the second thread");
        model.check(&[1, 2]);
    });
}

#[test]
fn two_missing_threads_and_the_background_thread_race_for_the_role() {
    loom::model(|| {
        let model = Arc::new(Model {
            role: Role::new(),
            inbox: Mutex::new(Vec::new()),
            reported: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            applied: UnsafeCell::new(Vec::new()),
            reports_taken: UnsafeCell::new(0),
        });
        // The second missing thread also drops a lease on the way out: a report for the writer.
        let second = {
            let model = Arc::clone(&model);
            loom::thread::spawn(move || {
                let served = model.miss(2);
                model.reported.store(true, Ordering::Release);
                served
            })
        };
        // The background thread, rung by that drop or by nothing: one round if the role is free.
        let background = {
            let model = Arc::clone(&model);
            loom::thread::spawn(move || model.role.serve(|| model.round(), || model.wake()))
        };
        let first = model.miss(1);
        let second = second.join().expect("the second thread");
        let _ = background.join().expect("the background thread");
        assert_ne!(Served::Poisoned, first);
        assert_ne!(Served::Poisoned, second);
        // A holder that served its rounds and left requests counted woke the background thread,
        // which serves again once it runs (here, now that every thread is done); then no request
        // is stranded: both applied, once each, and nothing counted as queued.
        model.check(&[1, 2]);
        // The role is free again.
        assert_eq!(dma_libfabric::Take::Taken, model.role.try_take());
        model.role.release();
        // The report was taken at most once; if nobody took it, the drop's ring would wake the
        // background thread (not modelled here).
        // SAFETY: every thread has been joined.
        let taken = model.reports_taken.with(|taken| unsafe { *taken });
        assert!(taken <= 1);
    });
}
