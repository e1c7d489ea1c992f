//! Completions reach the party that posted their operation, whoever reads the queue: a rail
//! set's stripes against application ids, against a thread reading one rail's queue, and a
//! waiter against everyone else's completions. Real tcp rails on 127.0.0.1 and 127.0.0.2
//! (tcp;ofi_rxm). Each test is one finding of issue 31's review of `6095657`, and fails there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::{Duration, Instant};

use dma_libfabric::{Completion, DmaError, MIN_STRIPE, RailSet};
use testkit::{PATIENCE, rma_rails, wait_for_rail_bytes, with_rails_progress};

fn addresses(rails: &RailSet) -> Vec<Vec<u8>> {
    rails.local_addresses()
}

fn slices(addresses: &[Vec<u8>]) -> Vec<&[u8]> {
    addresses.iter().map(Vec::as_slice).collect()
}

/// Poll `rails` until `done` says the completions seen so far are enough, for at most
/// [`PATIENCE`].
fn poll_until(rails: &RailSet, mut done: impl FnMut(&[Completion]) -> bool) -> Vec<Completion> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    while !done(&seen) {
        assert!(Instant::now() < deadline, "never came; seen {seen:?}");
        rails.poll_completions(&mut seen).expect("poll");
        std::thread::yield_now();
    }
    seen
}

/// A striped write to a peer that has stopped progressing stays in flight, however many
/// completions with the number its stripes once used as their tag (the set's third transfer: 2)
/// arrive from writes posted on the rails directly. On `6095657` the two direct writes with id 2
/// "completed" transfer 100 while both its stripes were still queued, and never surfaced
/// themselves.
#[test]
fn an_application_id_never_completes_a_striped_transfer() {
    let server = rma_rails(2);
    let stopped = rma_rails(2);
    let live = rma_rails(2);
    let len = 32 << 20; // two stripes of 16 MiB: more than loopback buffers without a reader
    assert!(len > 2 * MIN_STRIPE);
    let source = server.register(len).expect("server memory");
    let data: Vec<u8> = (0..len).map(|at| (at % 251) as u8 | 1).collect();
    source.write_bytes(0, &data).unwrap();
    let far = stopped.register(len).expect("stopped peer's memory");
    let stopped_addresses = addresses(&stopped);
    // Connect both rails while the peer still progresses (tcp;ofi_rxm answers -FI_EAGAIN to a
    // post to a peer that has not accepted the connection): two short writes, one per rail,
    // transfers 0 and 1; the striped one is transfer 2.
    with_rails_progress(&stopped, || {
        for id in [50, 51] {
            let lease = server.lease(1, &slices(&stopped_addresses)).unwrap();
            server
                .write(lease, source.segment(0, 64).unwrap(), far.remote(), id)
                .expect("posted");
            server.wait_for(id, PATIENCE).expect("connected");
        }
    });
    let lease = server.lease(1, &slices(&stopped_addresses)).unwrap();
    server
        .write(lease, source.segment(0, len).unwrap(), far.remote(), 100)
        .expect("posted");
    assert_eq!(1, server.striped_transfers());
    assert_eq!(1, server.transfers_in_flight());

    // Writes posted on each rail directly, with the application's id 2, to a live peer.
    let near = live.register(64).expect("live peer's memory");
    let live_addresses = addresses(&live);
    let small: Vec<_> = (0..2)
        .map(|rail| server.rail(rail).register(64).unwrap())
        .collect();
    with_rails_progress(&live, || {
        for (rail, region) in small.iter().enumerate() {
            let endpoint = server.rail(rail);
            let lease = endpoint.cache().lease(2, &live_addresses[rail]).unwrap();
            endpoint
                .write(
                    lease,
                    region.segment(0, 64).unwrap(),
                    near.remote().rail(rail),
                    2,
                )
                .expect("posted on the rail");
        }
        let seen = poll_until(&server, |seen| {
            assert!(
                seen.iter().all(|done| 100 != done.id),
                "transfer 100 reported complete while its target has not read a byte: {seen:?}"
            );
            2 == seen.iter().filter(|done| 2 == done.id).count()
        });
        assert!(seen.iter().all(|done| done.result.is_ok()), "{seen:?}");
    });
    assert_eq!(
        1,
        server.transfers_in_flight(),
        "the striped write is still in flight"
    );

    // Once the target progresses, the transfer completes, once, and its last bytes are there.
    with_rails_progress(&stopped, || {
        let done = server.wait_for(100, PATIENCE).expect("completed");
        assert_eq!((100, len, Ok(())), (done.id, done.len, done.result));
        wait_for_rail_bytes(&far, len - 4096, &data[len - 4096..]);
    });
    assert_eq!(0, server.transfers_in_flight());
    let mut more = Vec::new();
    server.poll_completions(&mut more).unwrap();
    assert!(more.is_empty(), "no phantom completions: {more:?}");
}

/// A thread that reads one rail's queue directly (a rail's own `poll_completions`) does not take
/// a striped transfer's stripes with it: they reach the transfer, which completes. On `6095657`
/// the rail polls handed out the stripes under their tag, and `wait_for` answered `WouldBlock`.
#[test]
fn reading_one_rails_queue_leaves_the_stripes_to_their_transfer() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let len = 4 * MIN_STRIPE;
    let source = server.register(len).expect("server memory");
    let data: Vec<u8> = (0..len).map(|at| (at % 241) as u8).collect();
    source.write_bytes(0, &data).unwrap();
    let target = client.register(len).expect("client memory");
    let client_addresses = addresses(&client);
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&client_addresses)).unwrap();
        server
            .write(lease, source.segment(0, len).unwrap(), target.remote(), 7)
            .expect("posted");
        let mut taken = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while (0..2).any(|rail| 0 < server.rail(rail).operations_in_flight()) {
            assert!(Instant::now() < deadline, "the stripes never completed");
            for rail in 0..2 {
                server.rail(rail).poll_completions(&mut taken).unwrap();
            }
        }
        assert!(
            taken.is_empty(),
            "a rail handed out the rail set's stripes: {taken:?}"
        );
        let done = server
            .wait_for(7, Duration::from_secs(5))
            .expect("the transfer's completion, read by the rail polls");
        assert_eq!((7, len, Ok(())), (done.id, done.len, done.result));
        wait_for_rail_bytes(&target, 0, &data);
    });
    assert_eq!(0, server.transfers_in_flight());
}

/// While one thread waits for a transfer that has not been posted, other threads' transfers
/// complete and are seen, by their own `wait_for` and by `poll_completions`. On `6095657` the
/// waiter held every other completion in a local list while it waited: 0 of 20 seen.
#[test]
fn a_waiter_holds_no_one_elses_completion() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let target = client.register(64 * 64).expect("client memory");
    let source = server.register(64).expect("server memory");
    source.write_bytes(0, &[9; 64]).unwrap();
    let client_addresses = addresses(&client);
    let write = |id: u64, slot: u64| {
        let lease = server.lease(1, &slices(&client_addresses)).unwrap();
        let remote = target.remote().slice(slot * 64, 64).unwrap();
        server
            .write(lease, source.segment(0, 64).unwrap(), remote, id)
            .expect("posted");
    };
    with_rails_progress(&client, || {
        let waiting = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            // Waits for id 1000, which is posted only once every check below has passed: it
            // is waiting all along.
            let waiter = scope.spawn(|| {
                waiting.wait();
                server.wait_for(1000, PATIENCE)
            });
            waiting.wait();
            for id in 0..20 {
                write(id, id);
                let done = server
                    .wait_for(id, Duration::from_secs(5))
                    .unwrap_or_else(|error| {
                        panic!("write {id} not seen while another waits: {error}")
                    });
                assert_eq!((id, Ok(())), (done.id, done.result));
            }
            write(20, 20);
            let seen = poll_until(&server, |seen| seen.iter().any(|done| 20 == done.id));
            assert_eq!(1, seen.len(), "{seen:?}");
            write(1000, 21);
            let done = waiter.join().unwrap().expect("the waiter's own transfer");
            assert_eq!(1000, done.id);
        });
    });
    assert_eq!(0, server.transfers_in_flight());
    let mut more = Vec::new();
    server.poll_completions(&mut more).unwrap();
    assert!(more.is_empty(), "{more:?}");
    assert!(matches!(
        server.wait_for(5, Duration::ZERO),
        Err(DmaError::WouldBlock)
    ));
}
