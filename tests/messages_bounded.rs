//! The message path against a peer process that stops (SIGSTOP) or dies (SIGKILL), on real
//! tcp;ofi_rxm endpoints: sends are bounded by the transmit queue's depth whatever the peer does,
//! and none is lost without an error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;
use testkit::resident;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
use testkit::PATIENCE;
use tracing_subscriber::layer::SubscriberExt;

/// Held by each test for its run: the stopped-peer test measures this process's resident memory,
/// which the other test's endpoints (tens of MiB each with rxm's default pools) would inflate.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every `warn` event's fields, as `name=value` text, from the subscriber it is part of.
#[derive(Clone, Default)]
struct WarningCapture(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={value:?} ", field.name()));
            }
        }
        if tracing::Level::WARN == *event.metadata().level() {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().expect("capture").push(fields.0);
        }
    }
}

/// The transmit depth the tests ask for: small, so the bound shows within a few thousand sends.
const TX_SIZE: usize = 64;

fn sender() -> LibfabricEndpoint {
    let configuration = Configuration {
        tx_size: Some(TX_SIZE),
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
}

/// Send one message and wait until its completion has been read: the connection is up.
fn connect(endpoint: &LibfabricEndpoint, address: &[u8]) {
    let pinned = endpoint.cache().pin();
    let peer = pinned.resolve(1, address).expect("resolve");
    endpoint
        .send_within(peer, b"hello", PATIENCE)
        .expect("sent");
    let deadline = std::time::Instant::now() + PATIENCE;
    while 0 < endpoint.sends_in_flight() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first send never completed"
        );
        endpoint.progress();
        std::thread::yield_now();
    }
}

/// Item 1 of issue 33: a stopped peer met no backpressure (1,000,000 sends answered `Ok`, the
/// sender grew 430 MiB, and dropping it discarded them without a word). Now sends past the
/// transmit depth answer `WouldBlock` with nothing posted, within 4 × `tx_size` sends, memory stays
/// within 64 MiB, and the drop reports the discarded sends.
#[test]
fn a_stopped_peer_meets_backpressure_within_the_transmit_depth() {
    const NAME: &str = "a_stopped_peer_meets_backpressure_within_the_transmit_depth";
    let Some(child) = testkit::spawn_child(NAME) else {
        testkit::be_a_message_peer();
    };
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut child = testkit::PeerProcess(child);
    let (address, stdin) = testkit::announced_address(&mut child.0);
    let endpoint = sender();
    let depth = endpoint.describe().max_sends_in_flight;
    assert_eq!(
        TX_SIZE, depth,
        "the transmit queue's depth bounds sends in flight"
    );
    connect(&endpoint, &address);
    testkit::signal(&child.0, "-STOP");

    let before = resident();
    let pinned = endpoint.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let mut accepted = 0_usize;
    let refused = loop {
        if accepted % 64 == 0 {
            eprintln!(
                "{accepted} accepted, {} in flight",
                endpoint.sends_in_flight()
            );
        }
        match endpoint.send_within(peer, &[7; 64], Duration::from_millis(50)) {
            Ok(()) => accepted += 1,
            Err(error) => break error,
        }
        assert!(
            accepted <= 4 * depth,
            "{accepted} sends to a stopped peer answered Ok (transmit depth {depth})"
        );
    };
    assert_eq!(DmaError::WouldBlock, refused);
    assert!(endpoint.sends_in_flight() <= depth);
    // Nothing more is posted past the bound, however often it is asked.
    for _ in 0..10_000 {
        assert_eq!(Err(DmaError::WouldBlock), endpoint.try_send(peer, &[7; 64]));
    }
    let grown = resident().saturating_sub(before);
    assert!(grown <= 64 << 20, "the sender grew {grown} bytes");
    assert_eq!(
        endpoint.describe().max_sends_in_flight_per_peer,
        endpoint.sends_in_flight(),
        "the stopped peer holds its share, no more"
    );
    drop(pinned);

    // The stopped peer holds only its share of the slots: another peer is still served.
    let healthy = testkit::tcp();
    testkit::with_progress(&healthy, || {
        let pinned = endpoint.cache().pin();
        let other = pinned
            .resolve(2, &healthy.local_address().expect("address"))
            .expect("resolve");
        endpoint
            .send_within(other, b"still served", PATIENCE)
            .expect("a healthy peer is not blocked by a stopped one");
        let deadline = std::time::Instant::now() + PATIENCE;
        while endpoint.sends_in_flight() > endpoint.describe().max_sends_in_flight_per_peer {
            assert!(
                std::time::Instant::now() < deadline,
                "the healthy send never completed"
            );
            endpoint.progress();
        }
    });

    let in_flight = endpoint.sends_in_flight() as u64;
    assert!(0 < in_flight, "a stopped peer completes nothing");
    let discarded = LibfabricEndpoint::discarded_sends();
    // The drop runs on this thread: a subscriber of this thread's sees its warning.
    let warnings = WarningCapture::default();
    tracing::subscriber::with_default(
        tracing_subscriber::registry().with(warnings.clone()),
        || drop(endpoint),
    );
    assert!(
        LibfabricEndpoint::discarded_sends() >= discarded + in_flight,
        "the drop counted its {in_flight} sends in flight as discarded"
    );
    let said = warnings.0.lock().expect("captured").clone();
    let counted = format!("discarded={in_flight} ");
    assert!(
        said.iter().any(|warning| warning.contains(&counted)),
        "the drop logged its {in_flight} discarded sends at warn: {said:?}"
    );
    drop(stdin);
    drop(child);
}

/// Item 3 of issue 33: sends to a killed peer answered `Ok` a million times, and every one was
/// lost without an error. Now at most the transmit depth answer `Ok`, each of those is reported
/// failed (counted, logged) since none can arrive, and once the provider has reported the peer
/// gone the next send answers `PeerUnreachable`.
#[test]
fn sends_to_a_killed_peer_are_reported_and_then_refused() {
    const NAME: &str = "sends_to_a_killed_peer_are_reported_and_then_refused";
    let Some(child) = testkit::spawn_child(NAME) else {
        testkit::be_a_message_peer();
    };
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut child = testkit::PeerProcess(child);
    let (address, stdin) = testkit::announced_address(&mut child.0);
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let endpoint = sender();
    let depth = endpoint.describe().max_sends_in_flight;
    connect(&endpoint, &address);
    child.0.kill().expect("kill the peer");
    child.0.wait().expect("reap the peer");
    drop(stdin);

    let pinned = endpoint.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let failed_before = endpoint.failed_sends();
    let mut accepted = 0_u64;
    let deadline = std::time::Instant::now() + PATIENCE;
    let refusal = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "never refused: {accepted} accepted, {} in flight, {} failed",
            endpoint.sends_in_flight(),
            endpoint.failed_sends()
        );
        match endpoint.try_send(peer, &[9; 64]) {
            Ok(()) => accepted += 1,
            Err(DmaError::WouldBlock) => {}
            Err(error) => break error,
        }
        endpoint.progress();
        assert!(
            accepted <= depth as u64,
            "{accepted} sends to a killed peer answered Ok (transmit depth {depth})"
        );
    };
    let DmaError::PeerUnreachable {
        peer: fi_addr,
        client,
        reason,
    } = &refusal
    else {
        panic!("expected PeerUnreachable, got {refusal}");
    };
    assert_eq!((peer.fi_addr(), Some(peer.client())), (*fi_addr, *client));
    eprintln!("refused after {accepted} sends: {reason}");
    // Every send that answered Ok completes, and since the peer is dead, with an error.
    while 0 < endpoint.sends_in_flight() {
        assert!(
            std::time::Instant::now() < deadline,
            "sends never completed"
        );
        endpoint.progress();
        std::thread::yield_now();
    }
    assert_eq!(
        accepted,
        endpoint.failed_sends() - failed_before,
        "each send that answered Ok was reported failed"
    );
    // And it stays refused, without posting.
    assert!(matches!(
        endpoint.try_send(peer, b"again"),
        Err(DmaError::PeerUnreachable { .. })
    ));
    assert_eq!(0, endpoint.sends_in_flight());
    let dead_index = peer.fi_addr();
    drop(pinned);

    // Released and removed, its index goes to the next peer resolved (FI_AV_TABLE hands out the
    // lowest free index): a live peer there is not refused for the dead one's sake.
    endpoint.cache().release(1);
    endpoint.cache().quiesce();
    let live = testkit::tcp();
    testkit::with_progress(&live, || {
        let pinned = endpoint.cache().pin();
        let newcomer = pinned
            .resolve(2, &live.local_address().expect("address"))
            .expect("resolve");
        assert_eq!(dead_index, newcomer.fi_addr(), "the index was reused");
        endpoint
            .send_within(newcomer, b"alive", PATIENCE)
            .expect("a new incarnation of the index is not refused");
    });
}
