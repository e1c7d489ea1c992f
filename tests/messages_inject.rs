//! `inject_within`/`try_inject` (issue 43, item 4): a message at or under the provider's inject
//! size goes out with `fi_inject` (`fi_tinject` on a credited endpoint), holding no send slot and
//! no budget, while `send` of the same message still takes a slot until its completion is read,
//! and a message over the inject size is refused. Against a killed peer process: injects are
//! never counted and never reported (what libfabric's tcp does with an inject's failure), and a
//! peer marked by a failed send refuses injects at once. Real tcp;ofi_rxm endpoints on
//! 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Instant;

use dma_libfabric::{DmaError, LibfabricEndpoint};
use testkit::PATIENCE;

/// The largest message `try_inject` takes on `endpoint`.
fn inject_limit(endpoint: &LibfabricEndpoint) -> usize {
    let description = endpoint.describe();
    description.inject_size.min(description.max_send_size)
}

/// Drive `endpoint`'s progress until its sends in flight are `count`, failing past [`PATIENCE`]
/// (a bound against a hang, not a timing assertion).
fn progress_until_in_flight(endpoint: &LibfabricEndpoint, count: usize) {
    let deadline = Instant::now() + PATIENCE;
    while count != endpoint.sends_in_flight() {
        assert!(Instant::now() < deadline, "sends never completed");
        endpoint.progress();
        std::thread::yield_now();
    }
}

/// Fails if an injected message were changed or lost on a live connection, if an inject took a
/// send slot or the peer's budget, if `send` of a message of the same size stopped taking a slot
/// until its completion is read, or if a message over the inject size were injected.
#[test]
fn an_injected_message_arrives_intact_and_holds_no_slot_while_a_send_holds_one() {
    let receiver = testkit::tcp();
    let sender = testkit::tcp();
    let limit = inject_limit(&sender);
    assert!(0 < limit, "tcp;ofi_rxm has an inject size");
    let injected: Vec<u8> = (0..limit).map(|i| (i as u8) ^ 0x5a).collect();
    let sent = vec![0xc3; limit];
    let too_long = vec![7; limit + 1];
    let address = receiver.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| {
            (0..4)
                .map(|_| {
                    receiver
                        .receive(PATIENCE)
                        .expect("receive")
                        .expect("a message")
                })
                .collect::<Vec<_>>()
        });
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        // The connection and the peer's first grant, through a counted send.
        sender.send_within(peer, b"hello", PATIENCE).expect("hello");
        progress_until_in_flight(&sender, 0);

        // Nothing reads the sender's transmit queue between these calls: what is in flight is
        // what each call left.
        sender.send_within(peer, &sent, PATIENCE).expect("send");
        assert_eq!(1, sender.sends_in_flight(), "a send holds its slot");
        assert_eq!(1, sender.peer_operations_in_flight(peer), "and its budget");
        sender
            .inject_within(peer, &injected, PATIENCE)
            .expect("inject");
        assert_eq!(1, sender.sends_in_flight(), "an inject holds no slot");
        assert_eq!(1, sender.peer_operations_in_flight(peer), "nor any budget");

        let refused = sender.try_inject(peer, &too_long);
        assert!(
            matches!(&refused, Err(DmaError::InvalidArgument(text)) if text.contains("inject")),
            "{refused:?}"
        );
        // Over the inject size, `send` still takes it, through a slot.
        sender.send_within(peer, &too_long, PATIENCE).expect("send");
        assert_eq!(2, sender.sends_in_flight(), "the long message holds a slot");
        progress_until_in_flight(&sender, 0);
        while !receiving.is_finished() {
            sender.progress();
            std::thread::yield_now();
        }
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(
        vec![b"hello".to_vec(), sent, injected, too_long],
        received,
        "every message arrives intact, in order, and the refused inject is not among them"
    );
    assert_eq!(0, sender.failed_sends());
}

/// A peer process that is SIGKILLed after the connection is up, and the sender's endpoint.
fn killed_peer(name: &str) -> Option<(LibfabricEndpoint, Vec<u8>)> {
    let child = testkit::spawn_child(name)?;
    let mut child = testkit::PeerProcess(child);
    let (address, stdin) = testkit::announced_address(&mut child.0);
    let sender = testkit::tcp();
    {
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        sender.send_within(peer, b"hello", PATIENCE).expect("hello");
    }
    progress_until_in_flight(&sender, 0);
    child.0.kill().expect("kill the peer");
    child.0.wait().expect("reap the peer");
    drop(stdin);
    Some((sender, address))
}

/// What libfabric's tcp does with an inject whose connection is gone: it logs it and reports
/// nothing (1.17 and 2.6.0), so injects to a killed peer answer `Ok` until the provider has seen
/// the connection go, then `WouldBlock` (rxm connects again and is refused); none is counted in
/// flight or failed. Fails if an inject to a dead peer were counted, or held a slot; if libfabric
/// starts reporting such failures, the docs of `inject_within` must say so.
#[test]
fn injects_to_a_killed_peer_are_neither_counted_nor_reported() {
    const NAME: &str = "injects_to_a_killed_peer_are_neither_counted_nor_reported";
    let Some((sender, address)) = killed_peer(NAME) else {
        testkit::be_a_message_peer();
    };
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let limit = inject_limit(&sender);
    let mut accepted = 0_u32;
    let deadline = Instant::now() + PATIENCE;
    // Until the provider (or the peer's exhausted credit) pushes back: an event, bounded by
    // PATIENCE against a hang.
    let pushed_back = loop {
        assert!(
            Instant::now() < deadline,
            "{accepted} injects, never refused"
        );
        match sender.try_inject(peer, &vec![9; limit]) {
            Ok(()) => accepted += 1,
            Err(error) => break error,
        }
        sender.progress();
        assert_eq!(0, sender.sends_in_flight(), "an inject holds no slot");
    };
    eprintln!("{accepted} injects answered Ok after the kill, then: {pushed_back}");
    assert!(
        matches!(
            pushed_back,
            DmaError::WouldBlock | DmaError::PeerUnreachable { .. }
        ),
        "{pushed_back:?}"
    );
    for _ in 0..100 {
        sender.progress();
    }
    assert_eq!(
        0,
        sender.failed_sends(),
        "an inject's failure is not counted"
    );
    assert_eq!(0, sender.sends_in_flight());
}

/// A peer that a failed send marked unreachable refuses an inject at once, as it refuses a send:
/// the mark is the endpoint's, whichever call meets it. Fails if an inject were posted to a
/// peer known dead.
#[test]
fn a_peer_marked_by_a_failed_send_refuses_injects_at_once() {
    const NAME: &str = "a_peer_marked_by_a_failed_send_refuses_injects_at_once";
    let Some((sender, address)) = killed_peer(NAME) else {
        testkit::be_a_message_peer();
    };
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    // Counted sends until one's failure marks the peer (as `messages_bounded` shows).
    let deadline = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < deadline, "the peer was never marked");
        match sender.try_send(peer, &[9; 64]) {
            Ok(()) | Err(DmaError::WouldBlock) => {}
            Err(DmaError::PeerUnreachable { .. }) => break,
            Err(other) => panic!("{other}"),
        }
        sender.progress();
    }
    let failed = sender.failed_sends();
    let refused = sender.try_inject(peer, b"x");
    let Err(DmaError::PeerUnreachable {
        peer: index,
        client,
        ..
    }) = refused
    else {
        panic!("expected PeerUnreachable, got {refused:?}");
    };
    assert_eq!((peer.fi_addr(), Some(1)), (index, client));
    assert_eq!(failed, sender.failed_sends(), "nothing was posted");
    assert_eq!(0, sender.peer_operations_in_flight(peer));
}
