//! A `Local` region's access word (`src/endpoint/access.rs`): a slice lent and an operation
//! holding the memory never overlap, and what an operation wrote is what a slice lent after it
//! reads. The region's bytes are a loom `UnsafeCell`: loom fails the model on any read that
//! overlaps a write, or that does not happen after it.
#![cfg(dma_loom)]

use dma_libfabric::AccessWord;
use loom::cell::UnsafeCell;
use loom::sync::Arc;

#[test]
fn a_slice_and_an_operation_never_touch_the_bytes_at_once() {
    loom::model(|| {
        let word = Arc::new(AccessWord::new());
        let bytes = Arc::new(UnsafeCell::new(0_u8));

        // The operation: posted if no slice is lent, writes (the provider landing a read), and
        // its hold goes when its completion has been read.
        let operation = {
            let (word, bytes) = (Arc::clone(&word), Arc::clone(&bytes));
            loom::thread::spawn(move || {
                if word.try_hold() {
                    // SAFETY: the hold keeps slices out (what the model checks).
                    bytes.with_mut(|byte| unsafe { *byte = 7 });
                    word.release_hold();
                    true
                } else {
                    false
                }
            })
        };
        // A slice, lent if no operation holds the memory, read, and returned.
        let seen = if word.try_lend() {
            // SAFETY: the loan keeps operations out (what the model checks).
            let seen = bytes.with(|byte| unsafe { *byte });
            word.return_lend();
            Some(seen)
        } else {
            None
        };
        let posted = operation.join().expect("the operation thread");
        // Once both are done, a slice sees the operation's byte, if it ran.
        assert!(!word.held());
        assert!(word.try_lend(), "nothing holds the memory");
        // SAFETY: lent, so nothing holds the memory.
        let after = bytes.with(|byte| unsafe { *byte });
        word.return_lend();
        assert_eq!(if posted { 7 } else { 0 }, after);
        assert!(matches!(seen, None | Some(0) | Some(7)));
    });
}

#[test]
fn an_as_mut_slice_after_held_reads_false_sees_the_operations_bytes() {
    loom::model(|| {
        let word = Arc::new(AccessWord::new());
        let bytes = Arc::new(UnsafeCell::new(0_u8));
        assert!(word.try_hold());
        let completion = {
            let (word, bytes) = (Arc::clone(&word), Arc::clone(&bytes));
            loom::thread::spawn(move || {
                // SAFETY: held.
                bytes.with_mut(|byte| unsafe { *byte = 9 });
                word.release_hold();
            })
        };
        // `as_mut_slice`: `&mut self` keeps new operations out; it proceeds once none holds.
        if !word.held() {
            // SAFETY: nothing holds the memory, and `&mut self` keeps new holds out.
            let seen = bytes.with_mut(|byte| unsafe { *byte });
            assert_eq!(9, seen, "the operation's write happens before");
        }
        completion.join().expect("the completion thread");
    });
}
