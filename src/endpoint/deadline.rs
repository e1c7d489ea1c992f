//! When a bounded wait gives up: one rule for every timeout the endpoint takes.
//!
//! A timeout of any [`Duration`] is accepted. `Instant::now() + timeout` panics when the sum
//! does not fit an `Instant` (`Duration::MAX` does not), so the deadline is
//! `Instant::now().checked_add(timeout)`, and a timeout too long to be represented means no
//! deadline at all: the call waits as long as it takes, bounded only by its own completion
//! (`Duration::MAX` is "wait for ever" in that sense, not an error).

use std::time::{Duration, Instant};

/// The moment a bounded wait gives up, or none for a timeout past what an `Instant` can hold.
/// (Public only for the loom models, under `--cfg dma_loom`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now; no deadline when `now + timeout` overflows.
    pub fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    /// Whether the deadline has passed (never, without one).
    pub(crate) fn passed(self) -> bool {
        self.0.is_some_and(|deadline| Instant::now() >= deadline)
    }

    /// How long until the deadline (zero once it has passed); `None` without one.
    pub(crate) fn remaining(self) -> Option<Duration> {
        self.0
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_past_what_an_instant_holds_is_no_deadline() {
        let forever = Deadline::after(Duration::MAX);
        assert_eq!(Deadline(None), forever);
        assert!(!forever.passed());
        assert_eq!(None, forever.remaining());
    }

    #[test]
    fn a_zero_timeout_has_passed_at_once() {
        assert!(Deadline::after(Duration::ZERO).passed());
        assert_eq!(
            Some(Duration::ZERO),
            Deadline::after(Duration::ZERO).remaining()
        );
    }
}
