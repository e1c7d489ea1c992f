//! The one join: a transfer posted in parts delivers one [`Completion`], once, when its last part
//! is in. A gather or scatter split past the provider's limits posts its parts on one endpoint;
//! a rail set's transfer posts its stripes on several, each part in its own endpoint's slab.
//! Either way every part's slot holds the same [`Join`], and whichever thread counts the last
//! part (the reader of its completion, or the poster that gave the remaining parts up) takes the
//! joined completion and hands it to the transfer's sink.
//!
//! # Guarantees
//!
//! - **Once.** `finish` subtracts from one counter with `AcqRel`: exactly one caller sees it
//!   reach zero, and every part's outcome recorded before is visible to it.
//! - **The first error.** The joined completion carries the first error recorded, whichever part
//!   it came from; a part never posted counts as completed with its post's error.
//! - **The whole length.** The completion names the transfer's id, operation and total length,
//!   whatever the parts were.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::completion::{Completion, Operation};
use crate::error::DmaError;
use crate::sync::lock;

/// A transfer split into parts: the last part to complete delivers its completion.
pub(crate) struct Join {
    /// Parts not yet completed (or given up).
    remaining: AtomicUsize,
    /// The transfer's id, as its caller chose it.
    id: u64,
    /// What the transfer is.
    operation: Operation,
    /// The whole transfer's length.
    len: usize,
    /// The first part's error.
    error: Mutex<Option<DmaError>>,
}

impl Join {
    /// A transfer of `parts` parts, `len` bytes in all, whose completion carries `id`.
    pub(crate) fn new(parts: usize, id: u64, operation: Operation, len: usize) -> Arc<Self> {
        Arc::new(Self {
            remaining: AtomicUsize::new(parts),
            id,
            operation,
            len,
            error: Mutex::new(None),
        })
    }

    /// Count `parts` parts done with `result` (one completed part, or the parts given up when
    /// one failed to post): the joined completion for the one caller that counts the last.
    pub(crate) fn finish(&self, parts: usize, result: Result<(), DmaError>) -> Option<Completion> {
        if let Err(error) = result {
            lock(&self.error).get_or_insert(error);
        }
        // AcqRel: every part's error, recorded above, happens before the last one's read of it.
        if parts != self.remaining.fetch_sub(parts, Ordering::AcqRel) {
            return None;
        }
        let error = lock(&self.error).take();
        Some(Completion {
            id: self.id,
            operation: self.operation,
            len: self.len,
            sender: None,
            result: error.map_or(Ok(()), Err),
        })
    }
}

/// One part of a joined transfer, as the engine's submit path posts it.
pub(crate) struct JoinPart {
    pub(crate) join: Arc<Join>,
    /// This part and those after it: what is given up if this one fails to post.
    pub(crate) unposted: usize,
    /// Whether no part was posted before this one: its failure to post is the caller's error,
    /// and the transfer is dropped with nothing delivered.
    pub(crate) first: bool,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;
    use dma_libfabric_sys as sys;

    /// Three parts, the third given up when it failed to post (after the first two were posted):
    /// whichever counts last, the posting thread giving up or the last part completing, delivers
    /// one completion, with the whole length and the first error.
    #[test]
    fn a_join_delivers_once_with_the_first_error_whoever_counts_last() {
        let failed = || DmaError::fabric("fi_write", -i64::from(sys::FI_EIO));
        // The parts complete first, then the poster gives the third up.
        let join = Join::new(3, 9, Operation::Write, 300);
        assert!(join.finish(1, Ok(())).is_none());
        assert!(join.finish(1, Ok(())).is_none());
        let completion = join
            .finish(1, Err(failed()))
            .expect("the poster counts last");
        assert_eq!((9, 300), (completion.id, completion.len));
        assert!(completion.result.is_err());

        // The poster gives up the last two parts first; the one posted part delivers.
        let join = Join::new(3, 9, Operation::Read, 300);
        assert!(join.finish(2, Err(failed())).is_none());
        // A later error is not the one reported.
        let completion = join.finish(1, Err(DmaError::WouldBlock)).expect("last");
        assert!(matches!(completion.result, Err(DmaError::Fabric { .. })));
        assert_eq!(Operation::Read, completion.operation);

        // Every part fine: Ok, once.
        let join = Join::new(2, 1, Operation::Write, 8);
        assert!(join.finish(1, Ok(())).is_none());
        assert_eq!(Ok(()), join.finish(1, Ok(())).expect("last").result);
    }

    /// Parts counted from several threads at once: exactly one of them takes the completion.
    #[test]
    fn racing_parts_deliver_exactly_once() {
        for _ in 0..200 {
            let join = Join::new(4, 7, Operation::Write, 4);
            let delivered: usize = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..4)
                    .map(|_| scope.spawn(|| usize::from(join.finish(1, Ok(())).is_some())))
                    .collect();
                handles
                    .into_iter()
                    .map(|handle| handle.join().unwrap())
                    .sum()
            });
            assert_eq!(1, delivered);
        }
    }
}
