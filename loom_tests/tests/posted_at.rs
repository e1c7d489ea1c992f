//! A slot's post record (`src/endpoint/in_flight.rs`, `PostedAt`): what `overdue_operations` and
//! `oldest_operation_age` read without a lock while the slot is reused. The record is a seqlock
//! on the post time: a scan reads the time, the other fields and the time again, with an acquire
//! fence before the second look, and a post writes the other fields after a release fence and the
//! time last. A scan racing a completion and the slot's next post gives one operation's fields,
//! whole, or nothing: never one operation's id with another's time. Fails under mutations O (the
//! second look removed), I (the post's release fence removed) and U (the scan's acquire fence
//! removed): `loom_tests/README.md`.
#![cfg(dma_loom)]

use dma_libfabric::{Operation, PostedAt};
use loom::sync::Arc;

#[test]
fn a_scan_racing_a_reuse_reads_one_operation_or_none() {
    loom::model(|| {
        let slot = Arc::new(PostedAt::default());
        slot.publish(10, 1, Operation::Write, 5, Some(1));
        // The first operation's completion is read, and the slot posted again.
        let reuse = {
            let slot = Arc::clone(&slot);
            loom::thread::spawn(move || {
                slot.clear();
                slot.publish(20, 2, Operation::Read, 6, Some(2));
            })
        };
        let seen = slot.read_id();
        reuse.join().expect("the reusing thread");
        assert!(
            matches!(seen, None | Some((1, 10)) | Some((2, 20))),
            "a scan mixed two operations: {seen:?}"
        );
        assert_eq!(
            Some((2, 20)),
            slot.read_id(),
            "the later post, once it is done"
        );
    });
}
