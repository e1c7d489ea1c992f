//! Zero copy's soundness from safe code, on the real tcp provider: a safe read of a region never
//! copies bytes this endpoint's own operation is landing (issue 42, item 1).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dma_libfabric::{DmaError, Exposure};
use testkit::{PATIENCE, rma_tcp, with_progress};

/// The landing region's length: a read is many segments of the tcp stream, so a copy taken while
/// one lands is torn (issue 42 saw 48 B of one pattern and 65,488 B of the next).
const LEN: usize = 64 << 10;
/// How many reads the reader thread attempts at least.
const READS: u64 = 100_000;
/// How many RMA reads land into the region at least, alternating two patterns.
const LANDINGS: u64 = 1_000;

/// Sets its flag when dropped, unwinding included.
struct SetOnDrop<'flag>(&'flag AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What the reader saw.
#[derive(Debug, Default)]
struct Seen {
    attempted: u64,
    refused: u64,
    /// Whole copies of the initial zeroes, of pattern A, of pattern B.
    whole: [u64; 3],
    torn: u64,
}

/// A thread calls the safe `read_bytes` on a `Local` region over and over while this endpoint's
/// own RMA reads land 64 KiB into it, alternating two patterns: every copy is refused (`Busy`,
/// an operation holds the region) or one whole pattern; 0 torn. Fails if `read_bytes` stops
/// taking the region's exclusion (issue 42 measured 5,065 to 9,242 torn of 257,844 to 322,988
/// before). And every post gets in although the reader never stops copying (issue 42, item 6):
/// fails if a post answers `Busy` because a copy was running.
#[test]
fn read_bytes_never_copies_a_landing_read() {
    let server = rma_tcp();
    let client = rma_tcp();
    let patterns = client.register(2 * LEN).expect("client memory");
    patterns.write_bytes(0, &vec![0xa5; LEN]).expect("fits");
    patterns.write_bytes(LEN, &vec![0x5a; LEN]).expect("fits");
    let address = client.local_address().expect("address");
    let landing = server
        .register_buffer(vec![0_u8; LEN], Exposure::Local)
        .expect("registered");
    let wholes = [vec![0_u8; LEN], vec![0xa5; LEN], vec![0x5a; LEN]];
    let done = AtomicBool::new(false);

    let (seen, landed) = with_progress(&client, || {
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let mut seen = Seen::default();
                let mut out = vec![0_u8; LEN];
                while seen.attempted < READS || !done.load(Ordering::Acquire) {
                    seen.attempted += 1;
                    match landing.read_bytes(0, &mut out) {
                        Err(DmaError::Busy) => seen.refused += 1,
                        Err(other) => panic!("only Busy may refuse: {other:?}"),
                        Ok(()) => match wholes.iter().position(|whole| *whole == out) {
                            Some(which) => seen.whole[which] += 1,
                            None => seen.torn += 1,
                        },
                    }
                }
                seen
            });
            // A failing poster (a panic) stops the reader too, so the failure is reported.
            let _stop = SetOnDrop(&done);
            let deadline = Instant::now() + PATIENCE;
            let mut landed = 0_u64;
            while landed < LANDINGS || !reader.is_finished() {
                let source = patterns
                    .remote()
                    .slice((landed % 2) * LEN as u64, LEN as u64);
                let lease = server.cache().lease(1, &address).expect("a lease");
                match server.read(
                    lease,
                    landing.segment(0, LEN).unwrap(),
                    source.expect("in range"),
                    landed,
                ) {
                    // A post waits out the reader's copies rather than answer Busy.
                    Err(other) => panic!("posting failed: {other:?}"),
                    Ok(()) => {
                        let completion = server.wait_for(landed, PATIENCE).expect("completed");
                        assert_eq!(Ok(()), completion.result);
                        landed += 1;
                        if LANDINGS == landed {
                            done.store(true, Ordering::Release);
                        }
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "stuck after {landed} reads landed"
                );
                std::thread::yield_now();
            }
            (reader.join().expect("the reader"), landed)
        })
    });

    println!("{landed} RMA reads landed; the reader: {seen:?}");
    assert_eq!(0, seen.torn, "torn copies: {seen:?}");
    assert!(seen.attempted >= READS, "{seen:?}");
    assert!(
        0 < seen.refused,
        "a copy was attempted while a read was in flight: {seen:?}"
    );
    assert!(
        0 < seen.whole[1] + seen.whole[2],
        "copies between the reads saw the landed bytes: {seen:?}"
    );
}
