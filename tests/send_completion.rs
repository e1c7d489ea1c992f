//! `Configuration::send_completion` on real tcp endpoints: with the default
//! (`SendCompletion::Acknowledged`) a peer that does not progress never acknowledges, so it holds
//! its budget of sends and the next is refused; with `SendCompletion::Local` the same sends
//! complete once in the socket, and the messages still arrive once the peer progresses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Instant;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, PeerProtocol, SendCompletion};
use testkit::PATIENCE;

/// The sender's budget per peer: small, so that sends past it show whether completions came.
const BUDGET: usize = 4;
/// Sends to the idle peer: many times the budget, few enough for the kernel's socket buffers.
const SENDS: usize = 16 * BUDGET;

/// A plain endpoint (no credits, so only the budget bounds what a sender may post) whose sends
/// complete as `sends` says.
fn endpoint(sends: SendCompletion) -> LibfabricEndpoint {
    let configuration = Configuration {
        send_completion: sends,
        peer_protocol: PeerProtocol::Plain,
        max_operations_per_peer: BUDGET,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

/// A sender and a receiver, connected by one message the receiver has read (rxm's connection
/// set-up needs both sides' progress); the receiver then does nothing until told.
fn connected(sends: SendCompletion) -> (LibfabricEndpoint, LibfabricEndpoint, Vec<u8>) {
    let (sender, receiver) = (endpoint(sends), endpoint(sends));
    let address = receiver.local_address().expect("address");
    std::thread::scope(|scope| {
        let reader = scope.spawn(|| receiver.receive(PATIENCE));
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        sender.send_within(peer, b"hello", PATIENCE).expect("send");
        let hello = reader.join().expect("reader").expect("receive");
        assert_eq!(Some(b"hello".to_vec()), hello);
    });
    let deadline = Instant::now() + PATIENCE;
    while 0 < sender.sends_in_flight() {
        // The hello's acknowledgement came while the receiver progressed; only the sender's
        // progress is left to read it.
        sender.progress();
        assert!(Instant::now() < deadline, "the hello never completed");
    }
    (sender, receiver, address)
}

#[test]
fn acknowledged_sends_to_a_peer_that_does_not_progress_hold_its_budget() {
    let (sender, _receiver, address) = connected(SendCompletion::Acknowledged);
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    for _ in 0..BUDGET {
        sender.try_send(peer, &[7; 64]).expect("within the budget");
    }
    // No acknowledgement can come: the receiver does not progress. However long the sender
    // progresses, the budget stays spent.
    for _ in 0..1_000 {
        sender.progress();
        assert_eq!(Err(DmaError::WouldBlock), sender.try_send(peer, &[7; 64]));
    }
    assert_eq!(BUDGET, sender.sends_in_flight());
}

#[test]
fn local_sends_complete_while_the_peer_does_not_progress_and_still_arrive() {
    let (sender, receiver, address) = connected(SendCompletion::Local);
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let deadline = Instant::now() + PATIENCE;
    for sent in 0..SENDS {
        // Each send waits only for the sender's own completions: a budget of `BUDGET` lets
        // `SENDS` through only if sends complete without the receiver.
        let message = [u8::try_from(sent).expect("few sends"); 64];
        loop {
            match sender.try_send(peer, &message) {
                Ok(()) => break,
                Err(DmaError::WouldBlock) => sender.progress(),
                Err(other) => panic!("send {sent}: {other}"),
            }
            assert!(
                Instant::now() < deadline,
                "send {sent} never admitted: the budget's sends never completed locally"
            );
        }
    }
    while 0 < sender.sends_in_flight() {
        sender.progress();
        assert!(Instant::now() < deadline, "the last sends never completed");
    }
    // Completed locally, and nothing lost on the way to a live peer: each arrives, in order.
    for sent in 0..SENDS {
        let message = receiver
            .receive(PATIENCE)
            .expect("receive")
            .expect("a message");
        assert_eq!(vec![u8::try_from(sent).expect("few sends"); 64], message);
    }
}
