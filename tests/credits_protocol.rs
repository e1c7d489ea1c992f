//! The credit protocol between endpoints that do not both speak it, on real tcp;ofi_rxm
//! endpoints: a plain peer's messages to a credited endpoint are counted and dropped (they would
//! otherwise wait in the provider's unexpected-message queue for ever, which nothing bounds), and
//! a credited sender never gets a grant from a plain receiver, so its send answers `WouldBlock`
//! and the plain receiver gets nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, PeerProtocol};
use testkit::{PATIENCE, wait_until};

fn open(peer_protocol: PeerProtocol) -> LibfabricEndpoint {
    let configuration = Configuration {
        peer_protocol,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

/// 500 plain messages to a credited endpoint that reads: each counted once, none delivered.
/// (A plain message longer than a stray receive, 88 bytes, is truncated, and tcp;ofi_rxm 1.17
/// resets the connection after a truncation: the plain sender's next sends answer
/// `PeerUnreachable`. Either way the credited endpoint holds nothing of it.)
#[test]
fn a_plain_peers_messages_are_counted_and_dropped() {
    const MESSAGES: u64 = 500;
    let receiver = open(PeerProtocol::Credited);
    let sender = open(PeerProtocol::Plain);
    let address = receiver.local_address().expect("address");
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let pinned = sender.cache().pin();
            let peer = pinned.resolve(1, &address).expect("resolve");
            for _ in 0..MESSAGES {
                sender
                    .send_within(peer, &[1; 64], PATIENCE)
                    .expect("a plain send");
            }
            wait_until("the plain sends complete", || {
                sender.progress();
                0 == sender.sends_in_flight()
            });
        });
        wait_until("every plain message counted", || {
            assert_eq!(None, receiver.try_receive().expect("receive"));
            MESSAGES <= receiver.credit_stats().stray_messages
        });
    });
    assert_eq!(MESSAGES, receiver.credit_stats().stray_messages);
    assert_eq!(0, receiver.credit_stats().introduced_senders);
}

/// A credited sender's introduction finds no answer at a plain receiver: the send waits its
/// patience and answers `WouldBlock`, with nothing delivered. (Any patience gives the same
/// answer: a plain endpoint never grants.)
#[test]
fn a_credited_sender_gets_nothing_through_to_a_plain_receiver() {
    let receiver = open(PeerProtocol::Plain);
    let sender = open(PeerProtocol::Credited);
    let address = receiver.local_address().expect("address");
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receiver.receive(Duration::from_millis(300)));
        assert_eq!(
            Err(DmaError::WouldBlock),
            sender.send_within(peer, b"hello", Duration::from_millis(200))
        );
        assert_eq!(None, receiving.join().expect("receiving").expect("receive"));
    });
    assert_eq!(0, sender.credit_stats().introduced_senders);
    assert_eq!(
        dma_libfabric::CreditStats::default(),
        receiver.credit_stats(),
        "a plain endpoint keeps no credits"
    );
}

/// A window with a zero field, or a memory limit below one window's cost, is refused at `open`
/// with an error naming the field; the largest values are accepted (their cost saturates, it
/// does not wrap), and nothing opens on a refusal.
#[test]
fn windows_and_limits_at_their_edges() {
    use dma_libfabric::ReceiveWindow;
    let window = ReceiveWindow::default();
    for (field, zero) in [
        (
            "messages",
            ReceiveWindow {
                messages: 0,
                ..window
            },
        ),
        ("bytes", ReceiveWindow { bytes: 0, ..window }),
        (
            "notifications",
            ReceiveWindow {
                notifications: 0,
                ..window
            },
        ),
    ] {
        let configuration = Configuration {
            receive_window: zero,
            ..Configuration::default()
        };
        match LibfabricEndpoint::open(&configuration, Some("127.0.0.1")) {
            Err(DmaError::InvalidArgument(reason)) => {
                assert!(reason.contains(field), "{field}: {reason}");
            }
            other => panic!("{field} 0 opened: {other:?}"),
        }
    }
    let too_small = Configuration {
        receive_memory_limit: window.cost() - 1,
        ..Configuration::default()
    };
    assert!(matches!(
        LibfabricEndpoint::open(&too_small, Some("127.0.0.1")),
        Err(DmaError::InvalidArgument(reason)) if reason.contains("receive_memory_limit")
    ));
    let largest = ReceiveWindow {
        messages: u32::MAX,
        bytes: u64::MAX,
        notifications: u32::MAX,
    };
    assert_eq!(u64::MAX, largest.cost(), "saturates");
    let configuration = Configuration {
        receive_window: largest,
        receive_memory_limit: u64::MAX,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("the largest window opens");
}
