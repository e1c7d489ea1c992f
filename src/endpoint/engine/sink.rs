//! Where a completion goes: one [`Sink`] per operation, chosen when it is posted, and one way to
//! deliver to it (`Operations::deliver`, in `reap`).
//!
//! - [`Sink::Application`]: the endpoint's ready queue, for `poll_completions` and `wait_for`.
//!   The completion keeps its slot until the application takes it, so the queue is bounded by
//!   the slab.
//! - [`Sink::Waker`]: one future's [`WakerSink`] (the async face). The slot is freed at once and
//!   the completion waits in the sink, which holds at most one.
//! - [`Sink::Owner`]: a party of the crate above the endpoint (a rail set's transfers), which
//!   bounds what it keeps by what it has in flight.
//!
//! A transfer in parts (`join`) delivers to its sink once, when its last part is in. The sink is
//! found from the slot the provider's context names, never from the id, so an application's ids
//! cannot collide with the crate's own.

use std::sync::{Arc, Mutex};
use std::task::Waker;

use super::completion::Completion;
use crate::sync::lock;

/// Who receives the completions of the operations a party above the endpoint posts.
pub(crate) trait CompletionOwner: Send + Sync {
    /// An operation posted for this owner has completed; its lease and buffer have been dropped
    /// and its slot freed. Called by whichever thread read the completion, with no lock of the
    /// endpoint held.
    fn completed(&self, completion: Completion);
}

/// An owner shared with the slots of its operations in flight.
pub(crate) type Owner = Arc<dyn CompletionOwner>;

/// Where an operation's completion goes (module docs).
#[derive(Clone)]
pub(crate) enum Sink {
    /// The application's ready queue.
    Application,
    /// One future's slot.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    Waker(Arc<WakerSink>),
    /// A party of the crate above the endpoint.
    Owner(Owner),
}

/// One operation's completion, shared by the slot that delivers it and the future that awaits
/// it: at most one completion and one waker.
#[derive(Default)]
pub(crate) struct WakerSink {
    state: Mutex<(Option<Completion>, Option<Waker>)>,
}

impl WakerSink {
    /// Keep `completion` and wake the future's task, if it has polled.
    pub(crate) fn deliver(&self, completion: Completion) {
        let mut state = lock(&self.state);
        state.0 = Some(completion);
        let waker = state.1.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The completion, if it has been delivered; else `waker` is kept, to be woken when it is.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // the async face's
    pub(crate) fn take(&self, waker: &Waker) -> Option<Completion> {
        let mut state = lock(&self.state);
        let completion = state.0.take();
        if completion.is_none() {
            match &mut state.1 {
                Some(kept) => kept.clone_from(waker),
                none => *none = Some(waker.clone()),
            }
        }
        completion
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;
    use crate::endpoint::Operation;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker kept before the delivery is woken once by it; the completion is then taken once.
    #[test]
    fn a_waker_sink_wakes_its_task_and_hands_the_completion_out_once() {
        let sink = WakerSink::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&count));
        assert!(sink.take(&waker).is_none());
        sink.deliver(Completion {
            id: 3,
            operation: Operation::Write,
            len: 8,
            sender: None,
            result: Ok(()),
        });
        assert_eq!(1, count.0.load(Ordering::SeqCst));
        assert_eq!(3, sink.take(&waker).expect("delivered").id);
        assert!(sink.take(&waker).is_none(), "handed out once");
        assert_eq!(1, count.0.load(Ordering::SeqCst));
    }
}
