//! Who sent a message: `receive_from`'s `Received::sender` and `receive_into`'s
//! `Completion::sender`, on real tcp;ofi_rxm endpoints, mapped back to the clients through
//! `AddressCache::clients_at` (before, a receive said nothing of its sender, so every message had
//! to carry its own client id).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::collections::BTreeMap;

use dma_libfabric::{Configuration, LibfabricEndpoint, Operation, PeerProtocol, Received};
use testkit::PATIENCE;

fn endpoint(rma: bool) -> LibfabricEndpoint {
    let configuration = Configuration {
        rma,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

/// A tcp endpoint without the credit protocol: a sender stays out of the receiver's AV until
/// the receiver resolves it.
fn plain() -> LibfabricEndpoint {
    let configuration = Configuration {
        peer_protocol: PeerProtocol::Plain,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

/// `sender` sends each of `messages` to `receiver`'s address and progresses until every send
/// has completed (tcp moves bytes only when the sender progresses), each without an error.
fn send_all(sender: &LibfabricEndpoint, receiver: &[u8], messages: &[&[u8]]) {
    send_all_anyhow(sender, receiver, messages);
    assert_eq!(0, sender.failed_sends());
}

/// [`send_all`], whatever the sends' completions say.
fn send_all_anyhow(sender: &LibfabricEndpoint, receiver: &[u8], messages: &[&[u8]]) {
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, receiver).expect("resolve");
    for message in messages {
        sender.send_within(peer, message, PATIENCE).expect("sent");
    }
    let deadline = std::time::Instant::now() + PATIENCE;
    while 0 < sender.sends_in_flight() {
        assert!(
            std::time::Instant::now() < deadline,
            "sends never completed"
        );
        sender.progress();
        std::thread::yield_now();
    }
}

/// `count` messages received by `receiver` within the patience.
fn receive(receiver: &LibfabricEndpoint, count: usize) -> Vec<Received> {
    (0..count)
        .map(|_| {
            receiver
                .receive_from(PATIENCE)
                .expect("receive")
                .expect("a message in time")
        })
        .collect()
}

/// Two senders, three messages each, through the copying receive: every message names its
/// sender's index, and the cache names the clients registered on it (one for the first sender,
/// two for the second, whose address two clients resolved).
#[test]
fn each_message_names_its_sender_and_the_cache_its_clients() {
    let receiver = endpoint(false);
    assert!(
        receiver.describe().reports_senders,
        "tcp;ofi_rxm takes FI_SOURCE"
    );
    let first = endpoint(false);
    let second = endpoint(false);
    let pinned = receiver.cache().pin();
    let first_index = pinned
        .resolve(10, &first.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    let second_index = pinned
        .resolve(20, &second.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    assert_eq!(
        second_index,
        pinned
            .resolve(21, &second.local_address().expect("address"))
            .expect("resolve")
            .fi_addr()
    );
    assert_ne!(first_index, second_index);
    let address = receiver.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 6));
        scope.spawn(|| send_all(&first, &address, &[b"a0", b"a1", b"a2"]));
        scope.spawn(|| send_all(&second, &address, &[b"b0", b"b1", b"b2"]));
        receiving.join().expect("the receiving thread")
    });
    let mut by_sender: BTreeMap<Option<u64>, Vec<Vec<u8>>> = BTreeMap::new();
    for Received { message, sender } in received {
        by_sender.entry(sender).or_default().push(message);
    }
    assert_eq!(
        BTreeMap::from([
            (
                Some(first_index),
                vec![b"a0".to_vec(), b"a1".to_vec(), b"a2".to_vec()]
            ),
            (
                Some(second_index),
                vec![b"b0".to_vec(), b"b1".to_vec(), b"b2".to_vec()]
            ),
        ]),
        by_sender,
        "each message names the sender it came from, in order"
    );
    assert_eq!(vec![10], receiver.cache().clients_at(first_index));
    assert_eq!(vec![20, 21], receiver.cache().clients_at(second_index));
    drop(pinned);
    receiver.cache().release(21);
    receiver.cache().quiesce();
    assert_eq!(vec![20], receiver.cache().clients_at(second_index));
}

/// A plain sender whose address is not in the receiver's AV is named by nobody (`None`, not a
/// guess); once the receiver resolves it, that connection's next message names it.
#[test]
fn a_sender_outside_the_av_is_none_until_resolved() {
    let receiver = plain();
    let stranger = plain();
    let address = receiver.local_address().expect("address");
    let unnamed = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 1));
        send_all(&stranger, &address, &[b"who"]);
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(
        vec![Received {
            message: b"who".to_vec(),
            sender: None
        }],
        unnamed
    );
    assert!(receiver.cache().clients_at(0).is_empty());
    let pinned = receiver.cache().pin();
    let index = pinned
        .resolve(5, &stranger.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    let named = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 1));
        send_all(&stranger, &address, &[b"me"]);
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(Some(index), named[0].sender);
    assert_eq!(vec![5], receiver.cache().clients_at(index));
}

/// `receive_into`'s completion names the sender; every other operation's names none.
#[test]
fn a_receive_into_completion_names_its_sender() {
    let receiver = endpoint(true);
    let sender = endpoint(true);
    let landing = receiver.register(4096).expect("registered");
    let pinned = receiver.cache().pin();
    let index = pinned
        .resolve(3, &sender.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    let address = receiver.local_address().expect("address");
    // The endpoint's own buffers take messages first: fill every one, so the last message lands
    // in `landing`.
    let buffers = Configuration::default().receive_buffers;
    receiver
        .receive_into(landing.segment(0, 64).expect("segment"), 9)
        .expect("posted");
    let messages: Vec<Vec<u8>> = (0..=buffers).map(|at| vec![at as u8; 8]).collect();
    let borrowed: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    let (copied, landed) = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| {
            let landed = receiver.wait_for(9, PATIENCE).expect("completed");
            (receive(&receiver, buffers), landed)
        });
        send_all(&sender, &address, &borrowed);
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(
        (Operation::Receive, 8, Some(index), Ok(())),
        (landed.operation, landed.len, landed.sender, landed.result)
    );
    assert!(copied.iter().all(|received| Some(index) == received.sender));
    let source = sender.register(8).expect("registered");
    let lease = sender.cache().lease(1, &address).expect("a lease");
    sender
        .send_from_within(lease, source.segment(0, 8).expect("segment"), 4, PATIENCE)
        .expect("posted");
    let sent = std::thread::scope(|scope| {
        scope.spawn(|| receive(&receiver, 1));
        sender.wait_for(4, PATIENCE).expect("completed")
    });
    assert_eq!((Operation::Send, None), (sent.operation, sent.sender));
}

/// The documented limit, held: once every client of a sender is released and its entry removed,
/// rxm still reports the removed index for that sender's open connection, and `FI_AV_TABLE` has
/// already handed the index to the next peer, so a late message names the newcomer's clients.
/// (rxm keeps the connection and its peer's index past `fi_av_remove`; see `senders`.) If a
/// libfabric release stops doing this, this test fails and the docs must say so.
#[test]
fn a_late_message_from_a_removed_sender_names_whoever_holds_its_index_now() {
    late_message_names_the_index_holder(&plain);
}

/// A credited sender introduces itself, so the receiver has it in its AV from its first message
/// on, under a client of the endpoint's own that `clients_at` leaves out: the message names an
/// index, and no client of the application's.
#[test]
fn a_credited_sender_is_named_by_its_introduction_and_by_no_client() {
    let receiver = endpoint(false);
    let stranger = endpoint(false);
    let address = receiver.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 1));
        send_all(&stranger, &address, &[b"who"]);
        receiving.join().expect("the receiving thread")
    });
    let index = received[0].sender.expect("named by its introduction");
    assert!(receiver.cache().clients_at(index).is_empty());
    assert_eq!(1, receiver.cache().stats().entries);
}

/// Index reuse at the default configuration (issue 40, item 4; the plain endpoint's outcome is
/// the test above): a credited sender is named by the secret in its messages' tags, and its
/// introduction holds its entry, so releasing the application's client does not hand its index
/// to the next peer. The newcomer lands on another index, and 100 late messages of the leaving
/// sender name its own index, where neither the newcomer's client nor the released one is.
#[test]
fn at_the_default_late_messages_of_a_released_sender_name_neither_client() {
    let (receiver, leaving, newcomer) = (endpoint(false), endpoint(false), endpoint(false));
    let (address, index) = leaving_said_hello(&receiver, &leaving);
    receiver.cache().release(1);
    receiver.cache().quiesce();
    let pinned = receiver.cache().pin();
    let newcomers = pinned
        .resolve(2, &newcomer.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    drop(pinned);
    assert_ne!(
        index, newcomers,
        "the leaving sender's introduction holds its index"
    );
    let late: Vec<&[u8]> = vec![b"late"; 100];
    let received = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, late.len()));
        send_all(&leaving, &address, &late);
        receiving.join().expect("the receiving thread")
    });
    let attributed = |client: u64| {
        received
            .iter()
            .filter(|message| {
                message
                    .sender
                    .is_some_and(|sender| receiver.cache().clients_at(sender).contains(&client))
            })
            .count()
    };
    assert_eq!(0, attributed(2), "attributed to the newcomer");
    assert_eq!(0, attributed(1), "attributed to the released client");
    assert!(
        received
            .iter()
            .all(|message| message.sender.is_some() && message.sender != Some(newcomers)),
        "every late message names the leaving sender: {:?}",
        received
            .iter()
            .map(|message| message.sender)
            .collect::<Vec<_>>()
    );
}

/// The same on libfabric 2.x's native tcp (1.x has none).
#[test]
fn on_native_tcp_too_a_late_message_names_whoever_holds_the_index_now() {
    let configuration = Configuration {
        providers: vec![dma_libfabric::Provider::TcpNative],
        peer_protocol: PeerProtocol::Plain,
        ..Configuration::default()
    };
    if dma_libfabric::runtime_version().0 < 2 {
        assert!(LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).is_err());
        return;
    }
    late_message_names_the_index_holder(&|| {
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("native tcp")
    });
}

/// `receiver` resolves `leaving` as client 1 and receives its "hello", named by the index it was
/// resolved at: the receiver's address and that index.
fn leaving_said_hello(receiver: &LibfabricEndpoint, leaving: &LibfabricEndpoint) -> (Vec<u8>, u64) {
    let address = receiver.local_address().expect("address");
    let pinned = receiver.cache().pin();
    let index = pinned
        .resolve(1, &leaving.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    drop(pinned);
    let first = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(receiver, 1));
        send_all(leaving, &address, &[b"hello"]);
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(Some(index), first[0].sender, "named by the client's index");
    (address, index)
}

fn late_message_names_the_index_holder(open: &dyn Fn() -> LibfabricEndpoint) {
    let (receiver, leaving, newcomer) = (open(), open(), open());
    let (address, index) = leaving_said_hello(&receiver, &leaving);
    receiver.cache().release(1);
    receiver.cache().quiesce();
    assert_eq!(0, receiver.cache().stats().entries, "removed from the AV");
    let pinned = receiver.cache().pin();
    let reused = pinned
        .resolve(2, &newcomer.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    assert_eq!(
        index, reused,
        "FI_AV_TABLE hands the lowest free index out again"
    );
    let late = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 1));
        send_all(&leaving, &address, &[b"late"]);
        receiving.join().expect("the receiving thread")
    });
    assert_eq!(
        vec![Received {
            message: b"late".to_vec(),
            sender: Some(index)
        }],
        late
    );
    assert_eq!(
        vec![2],
        receiver.cache().clients_at(index),
        "the newcomer's"
    );
}

/// The edges: nothing arrived is `None` at once (also with a zero timeout), indices that name
/// nobody have no clients, and a truncated message is the same error through `receive_from` as
/// through `receive`, never a message cut short with a sender.
#[test]
fn nothing_nobody_and_truncation_through_receive_from() {
    let configuration = Configuration {
        receive_size: 16,
        ..Configuration::default()
    };
    let receiver =
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint");
    assert_eq!(None, receiver.try_receive_from().expect("an idle endpoint"));
    assert_eq!(
        None,
        receiver
            .receive_from(std::time::Duration::ZERO)
            .expect("an idle endpoint")
    );
    for nobody in [
        dma_libfabric::sys::FI_ADDR_NOTAVAIL,
        dma_libfabric::sys::FI_ADDR_UNSPEC,
        u64::MAX - 1,
        0,
    ] {
        assert!(receiver.cache().clients_at(nobody).is_empty(), "{nobody}");
    }
    let sender = endpoint(false);
    let address = receiver.local_address().expect("address");
    let answer = std::thread::scope(|scope| {
        // rxm may fail the send too (1.17 closes the connection after a truncation).
        scope.spawn(|| send_all_anyhow(&sender, &address, &[&[4; 32]]));
        receiver.receive_from(PATIENCE)
    });
    assert!(
        matches!(&answer, Err(dma_libfabric::DmaError::Fabric { code, .. })
            if *code == -i64::from(dma_libfabric::sys::FI_ETRUNC)),
        "{answer:?}"
    );
}

/// libfabric 2.x's native tcp reliable-datagram endpoint names senders too (`FI_SOURCE` on its
/// shared receive context); 1.x has no such endpoint (`tests/providers.rs` holds its refusal).
#[test]
fn native_tcp_on_2x_names_its_senders_too() {
    let configuration = Configuration {
        providers: vec![dma_libfabric::Provider::TcpNative],
        peer_protocol: PeerProtocol::Plain,
        ..Configuration::default()
    };
    let (major, _) = dma_libfabric::runtime_version();
    if major < 2 {
        assert!(LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).is_err());
        return;
    }
    let open = || LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("native tcp");
    let (receiver, known, stranger) = (open(), open(), open());
    assert!(receiver.describe().reports_senders);
    let pinned = receiver.cache().pin();
    let index = pinned
        .resolve(4, &known.local_address().expect("address"))
        .expect("resolve")
        .fi_addr();
    let address = receiver.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let receiving = scope.spawn(|| receive(&receiver, 2));
        send_all(&known, &address, &[b"known"]);
        send_all(&stranger, &address, &[b"stranger"]);
        receiving.join().expect("the receiving thread")
    });
    let mut received: Vec<(Vec<u8>, Option<u64>)> = received
        .into_iter()
        .map(|Received { message, sender }| (message, sender))
        .collect();
    received.sort();
    assert_eq!(
        vec![
            (b"known".to_vec(), Some(index)),
            (b"stranger".to_vec(), None)
        ],
        received
    );
}
