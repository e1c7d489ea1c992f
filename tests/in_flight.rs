//! The age of RMA operations in flight (`oldest_operation_age`, `overdue_operations`) on the real
//! tcp provider: a write to a peer that stops progressing stays in flight and grows old, holding
//! its lease, and completes once the peer progresses again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;

use dma_libfabric::{
    Completion, LibfabricEndpoint, MemoryRegion, Operation, OverdueOperation, RemoteRegion,
};
use testkit::{PATIENCE, rma_tcp, with_progress};

/// Large enough that a few writes of it cannot all fit in loopback's socket buffers.
const CHUNK: usize = 16 << 20;
const WRITES: u64 = 4;

/// Post `WRITES` writes of `CHUNK` bytes to client 1 at `address`, ids 1 to `WRITES`, then drive
/// the server for a while; hands back the completions read meanwhile.
fn post_more_than_the_sockets_hold(
    server: &LibfabricEndpoint,
    address: &[u8],
    source: &MemoryRegion<'_>,
    target: RemoteRegion,
) -> Vec<Completion> {
    for id in 1..=WRITES {
        let lease = server.cache().lease(1, address).expect("a lease");
        server
            .write_within(
                lease,
                source.segment(0, CHUNK).expect("segment"),
                target.slice(0, CHUNK as u64).expect("slice"),
                id,
                PATIENCE,
            )
            .expect("posted");
    }
    let mut done = Vec::new();
    for _ in 0..1000 {
        server.poll_completions(&mut done).expect("poll");
    }
    done
}

#[test]
fn an_endpoint_with_nothing_in_flight_has_no_age_and_nothing_overdue() {
    let endpoint = rma_tcp();
    assert_eq!(None, endpoint.oldest_operation_age());
    let mut overdue = vec![OverdueOperation {
        id: 7,
        age: Duration::ZERO,
        operation: Operation::Write,
        peer: 0,
        client: Some(1),
    }];
    assert_eq!(0, endpoint.overdue_operations(Duration::ZERO, &mut overdue));
    assert_eq!(1, overdue.len(), "appends, never clears what was there");
}

#[test]
fn writes_to_a_peer_that_stops_progressing_grow_old_and_complete_once_it_progresses() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(CHUNK).expect("client memory");
    let source = server.register(CHUNK).expect("server memory");
    let address = client.local_address().expect("address");

    // Connect while the client progresses, so that what follows is only the data's wait.
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(
                lease,
                source.segment(0, 8).expect("segment"),
                target.remote().slice(0, 8).expect("slice"),
                100,
            )
            .expect("posted");
        server.wait_for(100, PATIENCE).expect("completed");
    });
    assert_eq!(None, server.oldest_operation_age());

    // The client stops progressing: its sockets fill, and the writes stay in flight.
    // What the sockets take completes, the rest cannot (the kernel's socket buffers are a few
    // MiB; the client reads nothing).
    let done = post_more_than_the_sockets_hold(&server, &address, &source, target.remote());
    let in_flight = server.operations_in_flight();
    assert!(in_flight > 0, "64 MiB cannot all be in loopback's sockets");
    let first = server
        .oldest_operation_age()
        .expect("something is in flight");
    let mut overdue = Vec::new();
    assert_eq!(
        in_flight,
        server.overdue_operations(Duration::ZERO, &mut overdue),
        "every operation in flight is at least zero old: {overdue:?}"
    );
    let pinned = server.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolved");
    for operation in &overdue {
        assert!((1..=WRITES).contains(&operation.id), "{operation:?}");
        assert!(operation.age <= server.oldest_operation_age().expect("still in flight"));
        let named = (operation.operation, operation.peer, operation.client);
        assert_eq!(
            (Operation::Write, peer.fi_addr(), Some(1)),
            named,
            "names what and whom"
        );
    }
    drop(pinned);
    let mut none = Vec::new();
    assert_eq!(
        0,
        server.overdue_operations(Duration::MAX, &mut none),
        "nothing is older than Duration::MAX"
    );
    server.progress();
    let later = server.oldest_operation_age().expect("still in flight");
    assert!(later >= first, "the oldest only grows while it waits");
    assert_eq!(
        in_flight as u64,
        server.cache().stats().leases,
        "each write in flight holds its lease"
    );

    // The client progresses again: every write completes and nothing is in flight any more.
    with_progress(&client, || {
        for id in 1..=WRITES {
            if done.iter().any(|completion| completion.id == id) {
                continue;
            }
            let completion = server.wait_for(id, PATIENCE).expect("completed");
            assert_eq!(Ok(()), completion.result);
        }
    });
    assert_eq!(None, server.oldest_operation_age());
    let mut overdue = Vec::new();
    assert_eq!(0, server.overdue_operations(Duration::ZERO, &mut overdue));
    assert_eq!(0, server.cache().stats().leases);
}

/// A peer process with writes in flight to it is killed: the kernel resets its connections, the
/// writes complete (ok or with an error), their leases come back, and the peer's entry is
/// removed once the server releases it.
#[test]
fn writes_to_a_killed_peer_process_complete_and_its_entry_goes() {
    const NAME: &str = "writes_to_a_killed_peer_process_complete_and_its_entry_goes";
    let Some(mut child) = testkit::spawn_child(NAME) else {
        // The peer: progresses (so the server can connect) until the parent says "hold", then
        // never again, until killed (or its stdin closes).
        testkit::be_an_rma_peer(CHUNK)
    };
    let (address, region) = testkit::announced_peer(&mut child);

    let server = rma_tcp();
    let source = server.register(CHUNK).expect("server memory");
    // Connect while the peer progresses, then tell it to stop.
    let lease = server.cache().lease(1, &address).expect("a lease");
    server
        .write(
            lease,
            source.segment(0, 8).expect("segment"),
            region.slice(0, 8).expect("slice"),
            100,
        )
        .expect("posted");
    server.wait_for(100, PATIENCE).expect("completed");
    let mut stdin = child.stdin.take().expect("piped");
    std::io::Write::write_all(&mut stdin, b"h").expect("tell the peer to hold");
    let done = post_more_than_the_sockets_hold(&server, &address, &source, region);
    assert!(
        server.operations_in_flight() > 0,
        "a peer that does not progress cannot take 64 MiB"
    );
    assert!(server.oldest_operation_age().is_some());

    child.kill().expect("kill the peer");
    drop(stdin);
    child.wait().expect("reap the peer");
    for id in 1..=WRITES {
        if done.iter().any(|completion| completion.id == id) {
            continue;
        }
        // Ok (it was in the socket) or an error (reset, broken pipe, cancelled): either way it
        // completes, bounded by the test's patience, not tcp's retransmissions.
        server
            .wait_for(id, PATIENCE)
            .expect("completed after the kill");
    }
    assert_eq!(None, server.oldest_operation_age());
    assert_eq!(0, server.cache().stats().leases, "every lease came back");
    server.cache().release(1);
    server.cache().quiesce_with_patience(PATIENCE);
    let stats = server.cache().stats();
    assert_eq!(0, stats.entries, "the killed peer's entry is gone");
    assert_eq!(stats.inserts, stats.removes, "and removed from the AV");
}

/// The scan against the slots' reuse (the post records are a seqlock): a thread scans
/// `overdue_operations(Duration::ZERO)` while another posts writes for clients 1 and 2 (one peer,
/// ids carrying their client) and reaps their completions, so slots are cleared and refilled
/// under the scan. Every record read is one operation's: its id, client, peer and operation
/// agree, never one post's id with another's client. It runs until the scanner has checked
/// 20,000 records, however long that takes. Its reach is limited: with the seqlock's second
/// time check removed it still passed (one run), the window between a slot's clear and refill
/// being nanoseconds wide; it guards the scan against a hang, a panic or a gross mix-up, and a
/// loom model of `PostedAt` would be what fails on that mutation.
#[test]
fn a_scan_racing_reused_slots_never_mixes_two_operations() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const CHECKED: u64 = 20_000;
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(4096).expect("client memory");
    let source = server.register(4096).expect("server memory");
    let address = client.local_address().expect("address");
    let fi_addr = server
        .cache()
        .lease(1, &address)
        .expect("a lease")
        .fi_addr();
    let (checked, done) = (AtomicU64::new(0), AtomicBool::new(false));
    with_progress(&client, || {
        std::thread::scope(|scope| {
            let scanner = scope.spawn(|| {
                let mut overdue = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    overdue.clear();
                    server.overdue_operations(Duration::ZERO, &mut overdue);
                    for record in &overdue {
                        let named = (record.operation, record.peer, record.client);
                        let posted = (Operation::Write, fi_addr, Some(record.id >> 32));
                        assert_eq!(posted, named, "a record of two operations: {record:?}");
                    }
                    checked.fetch_add(overdue.len() as u64, Ordering::Relaxed);
                }
            });
            let mut completions = Vec::new();
            let mut id = 0_u64;
            testkit::wait_until("the scanner to check its records", || {
                id += 1;
                let client_id = 1 + id % 2;
                let lease = server.cache().lease(client_id, &address).expect("a lease");
                server
                    .write_within(
                        lease,
                        source.segment(0, 64).expect("segment"),
                        target.remote().slice(0, 64).expect("slice"),
                        (client_id << 32) | id,
                        PATIENCE,
                    )
                    .expect("posted");
                server.poll_completions(&mut completions).expect("poll");
                completions.clear();
                // A scanner that failed has said why: stop posting.
                CHECKED <= checked.load(Ordering::Relaxed) || scanner.is_finished()
            });
            done.store(true, Ordering::Relaxed);
        });
    });
}
