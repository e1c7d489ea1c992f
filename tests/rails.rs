//! Multi-rail on real tcp rails bound to 127.0.0.1, 127.0.0.2, ...: opening, resolving and
//! leasing on every rail, memory on every rail, striped RMA with one completion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, MIN_STRIPE, Operation, RailRemoteRegion, RailSet};
use testkit::{PATIENCE, rma_rails, wait_for_rail_bytes, with_rails_progress};

fn addresses(rails: &RailSet) -> Vec<Vec<u8>> {
    rails.local_addresses()
}

fn slices(addresses: &[Vec<u8>]) -> Vec<&[u8]> {
    addresses.iter().map(Vec::as_slice).collect()
}

/// A pattern that differs at every offset of a stripe, so a stripe landing at the wrong place
/// shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|at| (at as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

#[test]
fn a_striped_write_lands_whole_and_completes_once() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let len = 4 * MIN_STRIPE + 300;
    let target = client.register(len).expect("client memory");
    let source = server.register(len).expect("server memory");
    let data = pattern(len, 1);
    source.write_bytes(0, &data).unwrap();
    let addresses = addresses(&client);
    with_rails_progress(&client, || {
        let lease = server
            .lease(1, &slices(&addresses))
            .expect("leased on both rails");
        server
            .write(lease, source.segment(0, len).unwrap(), target.remote(), 7)
            .expect("posted");
        let done = server.wait_for(7, PATIENCE).expect("completed");
        assert_eq!(
            (7, Operation::Write, len, Ok(())),
            (done.id, done.operation, done.len, done.result)
        );
        wait_for_rail_bytes(&target, 0, &data);
    });
    let bytes = server.bytes_per_rail();
    assert_eq!(len as u64, bytes.iter().sum::<u64>());
    assert!(
        bytes.iter().all(|&rail| rail >= MIN_STRIPE as u64),
        "{bytes:?}"
    );
    assert_eq!(1, server.striped_transfers());
    assert_eq!(0, server.transfers_in_flight());
    let mut more = Vec::new();
    server.poll_completions(&mut more).unwrap();
    assert!(more.is_empty(), "one completion per transfer: {more:?}");
}

#[test]
fn a_striped_read_fetches_the_peers_memory() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let len = 3 * MIN_STRIPE;
    let exposed = client.register(len).unwrap();
    let data = pattern(len, 9);
    exposed.write_bytes(0, &data).unwrap();
    let into = server.register(len).unwrap();
    let addresses = addresses(&client);
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        server
            .read(lease, into.segment(0, len).unwrap(), exposed.remote(), 3)
            .unwrap();
        let done = server.wait_for(3, PATIENCE).expect("completed");
        assert_eq!((Operation::Read, Ok(())), (done.operation, done.result));
    });
    let mut read = vec![0; len];
    into.read_bytes(0, &mut read).unwrap();
    assert!(read == data, "the read fetched every stripe");
    assert_eq!(1, server.striped_transfers());
}

/// Two local rails, a peer with one: both local rails talk to the peer's rail 0, and the
/// write still lands whole.
#[test]
fn a_peer_with_fewer_rails_is_reached_from_every_local_rail() {
    let server = rma_rails(2);
    let client = rma_rails(1);
    let len = 2 * MIN_STRIPE + 1024;
    let target = client.register(len).unwrap();
    let source = server.register(len).unwrap();
    let data = pattern(len, 3);
    source.write_bytes(0, &data).unwrap();
    let addresses = addresses(&client);
    assert_eq!(1, addresses.len());
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        assert_eq!(1, lease.remote_rails());
        for rail in 0..2 {
            assert_eq!(
                Some(addresses[0][..16].to_vec()),
                server
                    .rail(rail)
                    .lookup(lease.rail(rail).fi_addr())
                    .unwrap()
            );
        }
        server
            .write(lease, source.segment(0, len).unwrap(), target.remote(), 1)
            .unwrap();
        assert_eq!(Ok(()), server.wait_for(1, PATIENCE).unwrap().result);
        wait_for_rail_bytes(&target, 0, &data);
    });
    assert!(server.bytes_per_rail().iter().all(|&bytes| bytes > 0));
}

#[test]
fn short_writes_go_round_robin_to_one_rail_each() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let target = client.register(8 << 10).unwrap();
    let source = server.register(8 << 10).unwrap();
    source.write_bytes(0, &pattern(8 << 10, 5)).unwrap();
    let addresses = addresses(&client);
    with_rails_progress(&client, || {
        for id in 0..4_u64 {
            let lease = server.lease(1, &slices(&addresses)).unwrap();
            let at = id as usize * 1024;
            let remote = target.remote().slice(at as u64, 1024).unwrap();
            server
                .write(lease, source.segment(at, 1024).unwrap(), remote, id)
                .unwrap();
        }
        for id in 0..4 {
            assert_eq!(Ok(()), server.wait_for(id, PATIENCE).unwrap().result);
        }
        wait_for_rail_bytes(&target, 0, &pattern(8 << 10, 5)[..4096]);
    });
    assert_eq!(vec![2048, 2048], server.bytes_per_rail());
    assert_eq!(0, server.striped_transfers());
}

/// A stripe that fails (a bad key on one rail: the target refuses a read) fails the transfer's
/// one completion, which comes only once every stripe is done; every rail's lease is dropped.
#[test]
fn a_failed_stripe_fails_the_one_completion() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let len = 2 * MIN_STRIPE;
    let exposed = client.register(len).unwrap();
    let into = server.register(len).unwrap();
    let good = exposed.remote();
    let mut bad_rail = good.rail(1);
    bad_rail.key ^= 0x5555;
    let bad = RailRemoteRegion::new(vec![good.rail(0), bad_rail]).unwrap();
    let addresses = addresses(&client);
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        server
            .read(lease, into.segment(0, len).unwrap(), bad, 11)
            .unwrap();
        let done = server.wait_for(11, PATIENCE).expect("completed");
        assert!(
            matches!(done.result, Err(DmaError::Fabric { .. })),
            "{done:?}"
        );
        assert_eq!(0, server.transfers_in_flight());
    });
    for rail in 0..2 {
        assert_eq!(0, server.rail(rail).cache().stats().leases, "rail {rail}");
        assert_eq!(0, server.rail(rail).operations_in_flight());
    }
    let mut more = Vec::new();
    server.poll_completions(&mut more).unwrap();
    assert!(more.is_empty(), "{more:?}");
}

#[test]
fn mismatched_shapes_are_refused_and_post_nothing() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let other = rma_rails(1);
    let target = client.register(1024).unwrap();
    let source = server.register(1024).unwrap();
    let foreign = other.register(1024).unwrap();
    let addresses = addresses(&client);
    let lease = || server.lease(1, &slices(&addresses)).unwrap();
    let one_rail = RailRemoteRegion::new(vec![target.remote().rail(0)]).unwrap();
    let refusals = [
        server.write(lease(), source.segment(0, 1024).unwrap(), one_rail, 1),
        server.write(
            lease(),
            foreign.segment(0, 1024).unwrap(),
            target.remote(),
            2,
        ),
        server.write(
            lease(),
            source.segment(0, 1024).unwrap(),
            target.remote().slice(0, 512).unwrap(),
            3,
        ),
    ];
    for refused in refusals {
        assert!(
            matches!(refused, Err(DmaError::InvalidArgument(_))),
            "{refused:?}"
        );
    }
    assert_eq!(0, server.transfers_in_flight());
    for rail in 0..2 {
        assert_eq!(0, server.rail(rail).cache().stats().leases);
        assert_eq!(0, server.rail(rail).operations_in_flight());
    }
    assert!(matches!(
        target.segment(1000, 100),
        Err(DmaError::InvalidArgument(_))
    ));
}

#[test]
fn bad_addresses_leave_every_rail_empty_and_release_empties_them_all() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let mut addresses = addresses(&client);
    let good = addresses.clone();
    addresses[1].pop();
    assert!(matches!(
        server.pin().resolve(1, &slices(&addresses)).map(|_| ()),
        Err(DmaError::InvalidAddress(_))
    ));
    assert!(matches!(
        server.lease(1, &[]).map(|_| ()),
        Err(DmaError::InvalidArgument(_))
    ));
    server.quiesce();
    for rail in 0..2 {
        assert_eq!(
            0,
            server.rail(rail).cache().stats().misses,
            "no rail was asked"
        );
    }
    for client_id in 0..3 {
        server.pin().resolve(client_id, &slices(&good)).unwrap();
    }
    for client_id in 0..3 {
        server.release(client_id);
    }
    server.quiesce();
    for rail in 0..2 {
        let stats = server.rail(rail).cache().stats();
        assert_eq!(
            (0, 1, 1),
            (stats.entries, stats.inserts, stats.removes),
            "rail {rail}"
        );
    }
}

#[test]
fn a_remote_region_round_trips_and_bad_bytes_are_refused() {
    let rails = rma_rails(2);
    let region = rails.register(4096).unwrap();
    let remote = region.remote();
    assert_eq!((2, 4096), (remote.len(), remote.region_len()));
    assert_eq!(
        remote,
        RailRemoteRegion::from_bytes(&remote.to_bytes()).unwrap()
    );
    let bytes = remote.to_bytes();
    for bad in [
        &bytes[..3],
        &bytes[..bytes.len() - 1],
        &[0, 0, 0, 0][..],
        &[9, 0, 0, 0][..],
    ] {
        assert!(matches!(
            RailRemoteRegion::from_bytes(bad),
            Err(DmaError::InvalidArgument(_))
        ));
    }
    let mut uneven = remote.rail(1);
    uneven.len = 64;
    assert!(RailRemoteRegion::new(vec![remote.rail(0), uneven]).is_err());
    assert!(RailSet::open(&Configuration::default(), &["127.0.0.1"; 9]).is_err());
}

/// Dropping a rail set whose striped read is still in flight (the target stopped progressing)
/// drains or abandons every rail's stripe: the other rails close before rail 0, whose buffer
/// their registrations of the region share, so no rail frees memory another may still reach.
#[test]
fn dropping_a_rail_set_with_stripes_in_flight_abandons_them_in_order() {
    let client = rma_rails(2);
    let exposed = client.register(2 * MIN_STRIPE).unwrap();
    let addresses = addresses(&client);
    {
        let server = rma_rails(2);
        let landing = server.register(2 * MIN_STRIPE).unwrap();
        // Connect both rails (one short write each, round-robin) while the client progresses.
        with_rails_progress(&client, || {
            for id in 0..2 {
                let lease = server.lease(1, &slices(&addresses)).unwrap();
                let remote = exposed.remote().slice(0, 64).unwrap();
                server
                    .write(lease, landing.segment(0, 64).unwrap(), remote, id)
                    .unwrap();
                assert_eq!(Ok(()), server.wait_for(id, PATIENCE).unwrap().result);
            }
        });
        assert!(server.bytes_per_rail().iter().all(|&bytes| 64 == bytes));
        // The client no longer progresses: the read's stripes stay in flight.
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        server
            .read(
                lease,
                landing.segment(0, 2 * MIN_STRIPE).unwrap(),
                exposed.remote(),
                9,
            )
            .unwrap();
        drop(landing);
        let in_flight: usize = (0..2)
            .map(|rail| server.rail(rail).operations_in_flight())
            .sum();
        assert_eq!(2, in_flight, "one stripe a rail");
        assert_eq!(1, server.transfers_in_flight());
    }
    // The client is untouched, and a new server reaches it.
    let server = rma_rails(2);
    let landing = server.register(64).unwrap();
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        server
            .read(
                lease,
                landing.segment(0, 64).unwrap(),
                exposed.remote().slice(0, 64).unwrap(),
                1,
            )
            .unwrap();
        assert_eq!(Ok(()), server.wait_for(1, PATIENCE).unwrap().result);
    });
}

/// The names renamed in 0.2.0 (`CHANGELOG.md`, "Deprecated") still work for one release: the
/// alias `RailsPinned` is the type `RailSet::pin` returns, and `peers()` is the endpoint's
/// `cache()`, the very same cache.
#[test]
#[allow(deprecated)]
fn the_deprecated_names_still_name_the_same_things() {
    let rails = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"]).unwrap();
    let client = RailSet::open(&Configuration::default(), &["127.0.0.1", "127.0.0.2"]).unwrap();
    let addresses = addresses(&client);
    let pinned: dma_libfabric::RailsPinned<'_> = rails.pin();
    let peers = pinned.resolve(3, &slices(&addresses)).unwrap();
    let endpoint = rails.rail(1);
    assert!(std::ptr::eq(endpoint.peers(), endpoint.cache()));
    assert_eq!(1, endpoint.peers().stats().entries);
    assert_eq!(
        Some(&addresses[1][..16]),
        endpoint.lookup(peers.rail(1).fi_addr()).unwrap().as_deref(),
        "the provider's address, without the seal"
    );
}
