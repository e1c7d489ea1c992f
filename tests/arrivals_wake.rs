//! An arrival another thread takes off the receive queue wakes the thread asleep for it, on real
//! tcp;ofi_rxm endpoints on 127.0.0.1.
//!
//! A credited endpoint's `progress` reads the receive queue (grants and introductions come
//! through it) and sets the messages it meets aside for `receive`. A thread asleep in `receive`
//! sleeps on the queues' descriptors, which no longer show an arrival another thread read:
//! before, it slept its whole longest sleep (1 s) with the message set aside beside it. Through
//! the async face this stalled about one round trip in twenty for a second (the driver asleep,
//! a send looking for a grant reading the queue), so 2,000 round trips took 40 to 150 s
//! (`tests/tokio_echo.rs`). Now whatever reads the receive queue rings the endpoint's bell
//! (`reap_receive_queue`).
//!
//! The assertion is on the wait's own counter, not on time: how many of the receiver's sleeps
//! lasted their whole longest sleep with nothing waking them
//! (`LibfabricEndpoint::sleeps_run_out`, feature `model`), while a message it waits for was sent
//! at once and another thread kept reading the queue. Whether that thread or the receiver reads
//! the arrival first is up to the scheduler, so one round need not show the bug; two hundred
//! rounds showed it 2 and 9 times in two runs before the fix (`receiving.rs` without the ring).
#![cfg(feature = "model")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};

use testkit::{PATIENCE, tcp};

#[test]
fn a_message_another_thread_reads_wakes_its_sleeping_receiver() {
    const ROUNDS: u32 = 200;
    let (receiver, sender) = (tcp(), tcp());
    let address = receiver.local_address().unwrap();
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).unwrap();
    // The connection and the credit protocol's introduction first, the receiver driving its
    // side (its grant answers the introduction).
    std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receiver.receive(PATIENCE).unwrap());
        sender.send_within(peer, b"hello", PATIENCE).unwrap();
        assert_eq!(Some(b"hello".to_vec()), receiving.join().unwrap());
    });
    let mut slept_through = 0;
    for round in 0..ROUNDS {
        let message = round.to_le_bytes();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let receiving = scope.spawn(|| {
                let before = receiver.sleeps_run_out();
                let received = receiver.receive(PATIENCE).unwrap();
                (received, receiver.sleeps_run_out() - before)
            });
            // Another reader of the same endpoint's queues, as fast as it can.
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    receiver.progress();
                }
            });
            sender.send_within(peer, &message, PATIENCE).unwrap();
            let (received, run_out) = receiving.join().unwrap();
            stop.store(true, Ordering::Relaxed);
            assert_eq!(Some(message.to_vec()), received, "round {round}");
            slept_through += run_out;
        });
    }
    assert_eq!(
        0, slept_through,
        "the receiver slept its whole second {slept_through} times in {ROUNDS} rounds with its \
         message set aside by another thread"
    );
}
