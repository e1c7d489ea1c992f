//! The per-peer budget (`Configuration::max_operations_per_peer`) on real tcp;ofi_rxm endpoints,
//! against client processes that are stopped (SIGSTOP): one stalled peer costs only itself,
//! across every kind of operation, and the count belongs to the peer's incarnation, not its AV
//! index.
//!
//! Issue 40, item 1. Before the budget, a stopped client's `send_from`s took all 256 operation
//! slots and rxm's transmit queue (0 of 200 sends to healthy clients accepted), and a newcomer on
//! a reused index inherited its predecessor's count (0 of 20 sends accepted).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::{Duration, Instant};

use dma_libfabric::{Completion, Configuration, DmaError, LibfabricEndpoint, Operation};
use testkit::{PATIENCE, announced_peer, be_an_rma_peer, rma_tcp, spawn_child};

/// The bytes each stopped client registers, and the size of each RMA write to it.
const REGION: usize = 4096;

/// How long one post to a stopped peer retries: any answer is right (a stopped peer never
/// completes, so the budget runs out whatever the machine's load); short only to keep the test
/// quick.
const SHORT: Duration = Duration::from_millis(5);

/// Send one message to `client` and wait until its completion has been read: the connection is
/// up, and the client's provider acknowledged it (tcp transmits ask for `FI_TRANSMIT_COMPLETE`).
fn connect(server: &LibfabricEndpoint, client: u64, address: &[u8]) {
    let pinned = server.cache().pin();
    let peer = pinned.resolve(client, address).expect("resolve");
    server
        .send_within(peer, b"hello", PATIENCE)
        .expect("the first send");
    let deadline = Instant::now() + PATIENCE;
    while 0 < server.peer_operations_in_flight(peer) {
        assert!(Instant::now() < deadline, "the first send never completed");
        server.progress();
        std::thread::yield_now();
    }
}

/// What one stopped peer was fed, in the order of `kinds`, each kind until it was refused.
#[derive(Debug, Default)]
struct Fed {
    sends: usize,
    sends_from: usize,
    writes: usize,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Send,
    SendFrom,
    Write,
}

/// Feed the stopped client `client` each kind of operation in turn until the kind is refused
/// (`WouldBlock`), taking the completions that arrive meanwhile (writes complete once their bytes
/// are in the local socket, until it is full), so that only the stopped peer's own operations stay
/// in flight.
fn saturate(
    server: &LibfabricEndpoint,
    client: u64,
    address: &[u8],
    remote: dma_libfabric::RemoteRegion,
    source: &dma_libfabric::MemoryRegion<'_>,
    kinds: &[Kind],
    next_id: &mut u64,
) -> Fed {
    let pinned = server.cache().pin();
    let peer = pinned.resolve(client, address).expect("resolve");
    let lease = pinned.lease(peer).expect("a lease");
    let mut fed = Fed::default();
    let mut completions: Vec<Completion> = Vec::new();
    for &kind in kinds {
        let mut attempts = 0_u32;
        loop {
            attempts += 1;
            assert!(
                attempts < 100_000,
                "{kind:?} to a stopped peer was never refused: {fed:?}"
            );
            *next_id += 1;
            let segment = source.segment(0, REGION).expect("segment");
            let answer = match kind {
                Kind::Send => server.send_within(peer, &[7; 64], SHORT),
                Kind::SendFrom => server.send_from_within(lease.clone(), segment, *next_id, SHORT),
                Kind::Write => server.write_within(lease.clone(), segment, remote, *next_id, SHORT),
            };
            match answer {
                Ok(()) => match kind {
                    Kind::Send => fed.sends += 1,
                    Kind::SendFrom => fed.sends_from += 1,
                    Kind::Write => fed.writes += 1,
                },
                Err(DmaError::WouldBlock) => break,
                Err(other) => panic!("{kind:?} to a stopped peer: {other}"),
            }
            server.poll_completions(&mut completions).expect("poll");
        }
    }
    fed
}

/// Four clients are stopped, and each is fed copying sends, `send_from`s and RMA writes until
/// backpressure. Every send to a healthy client is still accepted, and it receives every message;
/// its `send_from`s and writes go through too. No stopped peer holds more than its budget.
#[test]
fn stopped_peers_fed_every_kind_of_operation_leave_healthy_peers_served() {
    const NAME: &str = "stopped_peers_fed_every_kind_of_operation_leave_healthy_peers_served";
    const STOPPED: u64 = 4;
    const MESSAGES: usize = 200;
    let mut clients = Vec::new();
    for _ in 0..STOPPED {
        match spawn_child(NAME) {
            Some(child) => clients.push(testkit::PeerProcess(child)),
            None => be_an_rma_peer(REGION),
        }
    }
    let server = rma_tcp();
    let budget = server.describe().max_operations_per_peer;
    assert_eq!(Configuration::DEFAULT_MAX_OPERATIONS_PER_PEER, budget);
    let source = server.register(REGION).expect("server memory");
    let mut stopped = Vec::new();
    for (client, process) in (1..).zip(clients.iter_mut()) {
        let (address, remote) = announced_peer(&mut process.0);
        connect(&server, client, &address);
        testkit::signal(&process.0, "-STOP");
        stopped.push((client, address, remote));
    }

    let orders: [&[Kind]; 4] = [
        &[Kind::Send, Kind::SendFrom, Kind::Write],
        &[Kind::SendFrom, Kind::Write, Kind::Send],
        &[Kind::Write, Kind::Send, Kind::SendFrom],
        &[Kind::Write, Kind::SendFrom, Kind::Send],
    ];
    let mut next_id = 0;
    for ((client, address, remote), kinds) in stopped.iter().zip(orders) {
        let fed = saturate(
            &server,
            *client,
            address,
            *remote,
            &source,
            kinds,
            &mut next_id,
        );
        let pinned = server.cache().pin();
        let peer = pinned.resolve(*client, address).expect("resolve");
        let held = server.peer_operations_in_flight(peer);
        eprintln!("client {client}: fed {fed:?}, {held} in flight");
        assert!(
            held <= budget,
            "client {client} holds {held} operations, past its budget of {budget}: {fed:?}"
        );
        // Sends and `send_from`s to a stopped peer never complete (tcp acknowledges a transmit
        // from the peer's provider): the first kind fed fills the budget exactly, unless it is
        // writes, which complete while the socket takes them.
        if !matches!(kinds[0], Kind::Write) {
            assert_eq!(budget, held, "client {client}: {fed:?}");
        }
        match kinds[0] {
            Kind::Send => assert_eq!(budget, fed.sends),
            Kind::SendFrom => assert_eq!(budget, fed.sends_from),
            Kind::Write => assert!(0 < fed.writes),
        }
    }

    // A healthy client, in this process, reads everything it is sent.
    let healthy = rma_tcp();
    let healthy_address = healthy.local_address().expect("address");
    let landing = healthy.register(REGION).expect("healthy memory");
    let done = std::sync::atomic::AtomicBool::new(false);
    let received = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut received = Vec::new();
            let deadline = Instant::now() + PATIENCE;
            while received.len() < MESSAGES + 1 && Instant::now() < deadline {
                healthy.progress();
                if let Some(message) = healthy.try_receive().expect("receive") {
                    received.push(message);
                }
            }
            // Keep progressing (the writes land only while the target does) until the server
            // has checked them.
            while !done.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                healthy.progress();
                std::thread::yield_now();
            }
            received
        });
        let pinned = server.cache().pin();
        let peer = pinned.resolve(100, &healthy_address).expect("resolve");
        for sequence in 0..MESSAGES {
            server
                .send_within(peer, &(sequence as u64).to_le_bytes(), PATIENCE)
                .unwrap_or_else(|error| {
                    panic!("send {sequence} to the healthy client refused: {error}")
                });
        }
        let lease = pinned.lease(peer).expect("a lease");
        source.write_bytes(0, &[0x5a; REGION]).expect("fits");
        next_id += 1;
        let write_id = next_id;
        server
            .write_within(
                lease.clone(),
                source.segment(0, REGION).expect("segment"),
                landing.remote(),
                write_id,
                PATIENCE,
            )
            .expect("a write to the healthy client");
        assert_eq!(
            Ok(()),
            server
                .wait_for(write_id, PATIENCE)
                .expect("completed")
                .result
        );
        next_id += 1;
        server
            .send_from_within(
                lease,
                source.segment(0, 16).expect("segment"),
                next_id,
                PATIENCE,
            )
            .expect("a send_from to the healthy client");
        assert_eq!(
            Ok(()),
            server
                .wait_for(next_id, PATIENCE)
                .expect("completed")
                .result
        );
        testkit::wait_for_bytes(&landing, 0, &[0x5a; REGION]);
        done.store(true, std::sync::atomic::Ordering::Release);
        reader.join().expect("the healthy reader")
    });
    assert_eq!(
        MESSAGES + 1,
        received.len(),
        "the healthy client got everything"
    );
    for (sequence, message) in received[..MESSAGES].iter().enumerate() {
        assert_eq!(&(sequence as u64).to_le_bytes()[..], &message[..]);
    }
    assert_eq!(&[0x5a; 16][..], &received[MESSAGES][..]);
    drop(clients);
}

/// A client stopped with its whole budget of sends in flight is released; the next client lands
/// on its AV index and starts with a full budget (the count is the incarnation's), and every one
/// of its sends arrives.
#[test]
fn a_newcomer_on_a_reused_index_starts_with_a_full_budget() {
    const NAME: &str = "a_newcomer_on_a_reused_index_starts_with_a_full_budget";
    const SENDS: usize = 20;
    let Some(child) = spawn_child(NAME) else {
        be_an_rma_peer(REGION);
    };
    let mut process = testkit::PeerProcess(child);
    let (address, _) = announced_peer(&mut process.0);
    let server = rma_tcp();
    let budget = server.describe().max_operations_per_peer;
    connect(&server, 1, &address);
    testkit::signal(&process.0, "-STOP");
    let stale_index = {
        let pinned = server.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        let mut accepted = 0;
        while let Ok(()) = server.send_within(peer, &[1; 64], SHORT) {
            accepted += 1;
            assert!(accepted <= budget, "past the budget");
        }
        assert_eq!(budget, accepted);
        assert_eq!(budget, server.peer_operations_in_flight(peer));
        peer.fi_addr()
    };
    server.cache().release(1);
    server.cache().quiesce();

    let newcomer = testkit::tcp();
    let newcomer_address = newcomer.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut received = Vec::new();
            let deadline = Instant::now() + PATIENCE;
            while received.len() < SENDS && Instant::now() < deadline {
                if let Some(message) = newcomer
                    .receive(Duration::from_millis(100))
                    .expect("receive")
                {
                    received.push(message);
                }
            }
            received
        });
        let pinned = server.cache().pin();
        let peer = pinned.resolve(2, &newcomer_address).expect("resolve");
        assert_eq!(
            stale_index,
            peer.fi_addr(),
            "the newcomer is on the released client's index"
        );
        assert_eq!(0, server.peer_operations_in_flight(peer));
        for sequence in 0..SENDS {
            server
                .send_within(peer, &[sequence as u8; 8], PATIENCE)
                .unwrap_or_else(|error| panic!("send {sequence} to the newcomer: {error}"));
        }
        reader.join().expect("the newcomer's reader")
    });
    assert_eq!(SENDS, received.len());
    for (sequence, message) in received.iter().enumerate() {
        assert_eq!(vec![sequence as u8; 8], *message);
    }
    drop(process);
}

/// The setting is validated, and the description reports it.
#[test]
fn the_budget_is_configurable_and_zero_is_refused() {
    let refused = Configuration {
        max_operations_per_peer: 0,
        ..Configuration::default()
    };
    let Err(error) = LibfabricEndpoint::open(&refused, Some("127.0.0.1")) else {
        panic!("a budget of 0 is refused");
    };
    assert!(
        error.to_string().contains("max_operations_per_peer"),
        "{error}"
    );
    let one = Configuration {
        max_operations_per_peer: 1,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&one, Some("127.0.0.1")).expect("open");
    assert_eq!(1, endpoint.describe().max_operations_per_peer);
    assert_eq!(1, endpoint.describe().max_sends_in_flight_per_peer);
    let huge = Configuration {
        max_operations_per_peer: usize::MAX,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&huge, Some("127.0.0.1")).expect("open");
    assert_eq!(
        endpoint.describe().max_sends_in_flight,
        endpoint.describe().max_sends_in_flight_per_peer,
        "a budget past the slab is the slab"
    );
}

/// A transfer split into parts is never cut by the budget: with a budget of 1, a gather of four
/// messages' worth of pieces to a peer that is not progressing has all four parts in flight at
/// once (its later parts are admitted past the budget once its first was), and once the peer
/// progresses it completes whole, as one completion, with every byte in place. (With later parts
/// held to the budget, only the first would be in flight and the rest would wait their patience.)
#[test]
fn a_transfer_in_parts_is_not_cut_by_a_budget_of_one() {
    let configuration = Configuration {
        rma: true,
        max_operations_per_peer: 1,
        ..Configuration::default()
    };
    let server = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("server");
    let client = rma_tcp();
    let piece = 4096;
    let parts = 4;
    let pieces = parts * server.pieces_per_message();
    let source = server.register(pieces * piece).expect("server memory");
    for at in 0..pieces {
        source
            .write_bytes(at * piece, &vec![at as u8 | 1; piece])
            .expect("fits");
    }
    let target = client.register(pieces * piece).expect("client memory");
    let address = client.local_address().expect("address");
    let pinned = server.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    // Connected, while the client progresses: then it stops.
    testkit::with_progress(&client, || {
        let lease = pinned.lease(peer).expect("a lease");
        server
            .write_within(
                lease,
                source.segment(0, 8).expect("segment"),
                target.remote(),
                4,
                PATIENCE,
            )
            .expect("the first write");
        assert_eq!(
            Ok(()),
            server.wait_for(4, PATIENCE).expect("completed").result
        );
    });
    let sources: Vec<_> = (0..pieces)
        .map(|at| source.segment(at * piece, piece).expect("segment"))
        .collect();
    server
        .write_gather_within(
            pinned.lease(peer).expect("a lease"),
            &sources,
            target.remote(),
            5,
            SHORT,
        )
        .expect("the gather is posted whole");
    assert_eq!(
        parts,
        server.peer_operations_in_flight(peer),
        "every part in flight at once, past the budget of 1"
    );
    let done = testkit::with_progress(&client, || {
        server.wait_for(5, PATIENCE).expect("one completion")
    });
    assert_eq!(
        (Operation::Write, pieces * piece, Ok(())),
        (done.operation, done.len, done.result)
    );
    assert_eq!(0, server.peer_operations_in_flight(peer));
    let mut landed = vec![0; pieces * piece];
    target.read_bytes(0, &mut landed).expect("read");
    for (at, chunk) in landed.chunks(piece).enumerate() {
        assert!(chunk.iter().all(|&byte| byte == at as u8 | 1), "piece {at}");
    }
    drop(pinned);
}
