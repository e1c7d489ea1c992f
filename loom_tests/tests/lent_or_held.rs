//! A `Local` region's access word (`src/endpoint/access.rs`): a slice lent and an operation
//! holding the memory never overlap, and what an operation wrote is what a slice lent after it
//! reads; and a poster waiting for the loans to end is never overtaken by a lend made after it
//! announced itself (fairness). The region's bytes are a loom `UnsafeCell`: loom fails the model
//! on any read that overlaps a write, or that does not happen after it.
#![cfg(dma_loom)]

use dma_libfabric::AccessWord;
use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};

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

#[test]
fn a_lend_after_a_posters_announcement_waits_behind_it() {
    loom::model(|| {
        let word = Arc::new(AccessWord::new());
        let bytes = Arc::new(UnsafeCell::new(0_u8));
        let announced = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        // A slice lent before the poster arrives: the poster must wait for it.
        assert!(word.try_lend());
        // The poster (`Registration::hold`, `loans::wait_out_loans`): finding a loan out, it
        // announces itself, retries its hold until the loans are returned and withdraws; then
        // it writes, and its completion is read.
        let poster = {
            let (word, bytes) = (Arc::clone(&word), Arc::clone(&bytes));
            let (announced, done) = (Arc::clone(&announced), Arc::clone(&done));
            loom::thread::spawn(move || {
                if word.lent() || !word.try_hold() {
                    assert!(word.try_announce());
                    announced.store(true, Ordering::Release);
                    while !word.try_hold() {
                        loom::thread::yield_now();
                    }
                    word.withdraw();
                }
                // SAFETY: the hold keeps loans out (what the model checks).
                bytes.with_mut(|byte| unsafe { *byte = 7 });
                done.store(true, Ordering::Release);
                word.release_hold();
            })
        };
        // The borrower keeps borrowing: returns its slice and lends again, twice. A lend made
        // after it saw the announcement gets in only once the poster is done.
        word.return_lend();
        for _ in 0..2 {
            let saw = announced.load(Ordering::Acquire);
            if word.try_lend() {
                assert!(
                    !saw || done.load(Ordering::Acquire),
                    "a lend made after the poster announced itself got in while it waited"
                );
                // SAFETY: the loan keeps operations out (what the model checks).
                let seen = bytes.with(|byte| unsafe { *byte });
                assert!(0 == seen || 7 == seen);
                word.return_lend();
            }
        }
        poster.join().expect("the poster thread");
        assert!(!word.held());
        assert!(word.try_lend(), "the announcement was withdrawn");
        word.return_lend();
    });
}

#[test]
fn a_poster_out_of_patience_withdraws_and_lends_resume() {
    loom::model(|| {
        let word = Arc::new(AccessWord::new());
        assert!(word.try_lend());
        // A poster whose patience runs out after one more try: it withdraws, holding nothing.
        let poster = {
            let word = Arc::clone(&word);
            loom::thread::spawn(move || {
                assert!(word.try_announce());
                let held = word.try_hold();
                word.withdraw();
                if held {
                    word.release_hold();
                }
                held
            })
        };
        word.return_lend();
        let lent = word.try_lend();
        if lent {
            word.return_lend();
        }
        poster.join().expect("the poster thread");
        assert!(!word.held());
        assert!(word.try_lend(), "nothing waits or holds: lends resume");
        word.return_lend();
    });
}
