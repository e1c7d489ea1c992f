//! `Configuration::spin_before_sleep` on real tcp endpoints: a wait that spins first still ends
//! at its own timeout (even a spin of `Duration::MAX`), and still delivers what it waits for.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::{Arc, mpsc};
use std::time::Duration;

use dma_libfabric::{Configuration, LibfabricEndpoint};
use testkit::{FAILSAFE, PATIENCE};

fn spinning(spin: Duration) -> LibfabricEndpoint {
    let configuration = Configuration {
        spin_before_sleep: spin,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

#[test]
fn a_wait_that_spins_for_ever_still_ends_at_its_timeout() {
    let endpoint = Arc::new(spinning(Duration::MAX));
    let (done, finished) = mpsc::channel();
    // A thread of its own, not a scope: were the wait never to end, the test fails rather than
    // waits for it.
    let waiting = Arc::clone(&endpoint);
    std::thread::spawn(move || {
        let _ = done.send(waiting.receive(Duration::from_millis(20)));
    });
    // A hang detector, not a timing: only a wait that never ends reaches it.
    let answer = finished
        .recv_timeout(FAILSAFE)
        .expect("a receive that spins for ever never returned");
    assert_eq!(Ok(None), answer, "no message was sent");
}

#[test]
fn spinning_waits_deliver_what_they_wait_for() {
    let (sender, receiver) = (
        spinning(Duration::from_secs(1)),
        spinning(Duration::from_secs(1)),
    );
    let address = receiver.local_address().expect("address");
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            (0..100_u8)
                .map(|_| receiver.receive(PATIENCE).expect("receive"))
                .collect::<Vec<_>>()
        });
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        for n in 0..100_u8 {
            sender.send_within(peer, &[n; 64], PATIENCE).expect("send");
        }
        let received = reader.join().expect("reader");
        for (n, message) in (0..100_u8).zip(received) {
            assert_eq!(Some(vec![n; 64]), message, "message {n}");
        }
    });
}
