//! Fairness between slices and posts on the real tcp provider (issue 42, item 6): an operation
//! waiting for a `Local` region's slices gets in within its patience while other threads keep
//! borrowing, because borrowers that arrive after a waiting poster wait behind it (refused with
//! `Busy`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use dma_libfabric::{DmaError, Exposure, MemoryRegion, RegionSlice, StableBuffer};
use testkit::{PATIENCE, rma_tcp, wait_for_bytes, with_progress};

/// The region's length.
const LEN: usize = 4096;
/// How many writes are posted, each while a slice is lent.
const ROUNDS: u64 = 20;
/// How many threads borrow slices back to back, besides the holder.
const BORROWERS: usize = 2;
/// How many more slices the holder asks for once it has met the waiting poster, its own still
/// lent.
const BEHIND: u64 = 100;

/// Sets its flag when dropped, unwinding included.
struct SetOnDrop<'flag>(&'flag AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What a borrower saw.
#[derive(Debug, Default, Clone, Copy)]
struct Borrowed {
    lent: u64,
    refused: u64,
    /// The holder's: of its `BEHIND` borrows each round after meeting the poster, those lent.
    overtaken: u64,
}

/// One borrow: a slice, read once and given back at once.
fn borrow(region: &MemoryRegion<'_, impl StableBuffer>, seen: &mut Borrowed) -> bool {
    match region.as_slice() {
        Ok(slice) => {
            std::hint::black_box(slice[0]);
            seen.lent += 1;
            true
        }
        Err(DmaError::Busy) => {
            seen.refused += 1;
            false
        }
        Err(other) => panic!("only Busy may refuse a slice: {other:?}"),
    }
}

/// Each round the holder lends a slice, tells the poster to post, and keeps borrowing more
/// slices meanwhile: while its own slice is lent no operation can hold the region, so the first
/// `Busy` it meets is the poster announced and waiting (the proof that the poster waited, with
/// no clock: a poster that sees a loan announces itself before it tries to hold), then asks for
/// `BEHIND` more, each refused, since the announcement stands until the poster holds the region,
/// which it cannot while the holder's slice is lent. Only then does it return its slice.
fn hold_each_round(
    region: &MemoryRegion<'_, impl StableBuffer>,
    go: mpsc::Sender<u64>,
    posted: mpsc::Receiver<u64>,
    stop: &AtomicBool,
) -> Borrowed {
    let mut seen = Borrowed::default();
    for round in 0..ROUNDS {
        let held: RegionSlice<'_> = region.as_slice().expect("idle at a round's start");
        go.send(round).expect("the poster");
        while borrow(region, &mut seen) {
            if stop.load(Ordering::Acquire) {
                return seen;
            }
        }
        for _ in 0..BEHIND {
            if borrow(region, &mut seen) {
                seen.overtaken += 1;
            }
        }
        drop(held);
        if posted.recv() != Ok(round) {
            return seen;
        }
    }
    seen
}

/// Several threads keep borrowing slices of a `Local` region back to back while another posts
/// `ROUNDS` RMA writes from it with `testkit::PATIENCE`, each while a slice is lent: every post
/// is accepted and completes, and every round a borrower was refused while its post waited (the
/// holder's slice keeps operations out, so its `Busy` can only be the waiting poster's), and
/// none of the holder's later borrows overtook it. No clock decides anything. With the wait
/// removed (`Registration::hold` answering `Busy` as soon as a slice is lent, as before):
/// `round 0: the post answered Busy`. With `AccessWord::try_lend` ignoring the waiting posters:
/// the posts still got in (a waiting poster's own `try_hold` adds and backs out an operation,
/// which refuses a borrow for an instant, and the borrowers leave gaps), in 19 s to 52 s rather
/// than under 1 s, and the test fails on all 2,000 of the holder's later borrows overtaking the
/// poster.
#[test]
fn a_post_waiting_for_slices_gets_in_while_threads_keep_borrowing() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(LEN).expect("client memory");
    let address = client.local_address().expect("address");
    let region = server
        .register_buffer(vec![0x5a_u8; LEN], Exposure::Local)
        .expect("registered");
    let stop = AtomicBool::new(false);
    let (go, rounds) = mpsc::channel();
    let (posted, done) = mpsc::channel();

    let (holder, borrowers) = with_progress(&client, || {
        std::thread::scope(|scope| {
            let borrowers: Vec<_> = (0..BORROWERS)
                .map(|_| {
                    scope.spawn(|| {
                        let mut seen = Borrowed::default();
                        while !stop.load(Ordering::Acquire) {
                            borrow(&region, &mut seen);
                        }
                        seen
                    })
                })
                .collect();
            let holder = {
                let (region, stop) = (&region, &stop);
                scope.spawn(move || hold_each_round(region, go, done, stop))
            };
            // A failing poster (a panic) stops the others too, so the failure is reported.
            let _stop = SetOnDrop(&stop);
            for round in rounds.iter().take(ROUNDS as usize) {
                let lease = server.cache().lease(1, &address).expect("a lease");
                let source = region.segment(0, LEN).unwrap();
                match server.write_within(lease, source, target.remote(), round, PATIENCE) {
                    Ok(()) => {}
                    Err(error) => panic!("round {round}: the post answered {error:?}"),
                }
                let completion = server.wait_for(round, PATIENCE).expect("completed");
                assert_eq!(Ok(()), completion.result, "round {round}");
                posted.send(round).expect("the holder");
            }
            drop(posted);
            let holder = holder.join().expect("the holder");
            stop.store(true, Ordering::Release);
            let borrowers: Vec<Borrowed> = borrowers
                .into_iter()
                .map(|borrower| borrower.join().expect("a borrower"))
                .collect();
            (holder, borrowers)
        })
    });

    println!(
        "{ROUNDS} writes posted and completed; the holder, while each post waited: {holder:?}; \
         the borrowers: {borrowers:?}"
    );
    wait_for_bytes(&target, 0, &[0x5a; LEN]);
    assert_eq!(
        (ROUNDS * (1 + BEHIND), 0),
        (holder.refused, holder.overtaken),
        "each round the holder met the waiting poster, and no borrow overtook it: {holder:?}"
    );
    for borrower in &borrowers {
        assert!(0 < borrower.lent + borrower.refused, "{borrower:?}");
    }
}
