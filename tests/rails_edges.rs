//! A rail set at the edges of its API, as a hostile caller pushes on it: sizes at `usize::MAX`
//! and `u64::MAX`, `Duration::MAX`, too few and too many rails, and a blocking lease that would
//! wait on the calling thread's own lease or pin.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;

use dma_libfabric::{
    AddressCache, AddressFormat, Configuration, DmaError, MAX_RAILS, ModelAv, RailCaches,
    RailRemoteRegion, RailSet,
};
use testkit::{efa, rail_nodes, rma_rails, wait_for_rail_bytes, with_rails_progress};

fn slices(addresses: &[Vec<u8>]) -> Vec<&[u8]> {
    addresses.iter().map(Vec::as_slice).collect()
}

fn invalid<T: std::fmt::Debug>(result: Result<T, DmaError>) {
    assert!(
        matches!(result, Err(DmaError::InvalidArgument(_))),
        "{result:?}"
    );
}

#[test]
fn no_rails_and_too_many_rails_are_refused() {
    invalid(RailSet::open(&Configuration::default(), &[]));
    let nodes = rail_nodes(MAX_RAILS + 1);
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    invalid(RailSet::open(&Configuration::default(), &nodes));
    invalid(RailCaches::<ModelAv>::new(Vec::new()));
    let caches = (0..=MAX_RAILS)
        .map(|_| AddressCache::with_backend(ModelAv::new(AddressFormat::Efa)))
        .collect();
    invalid(RailCaches::new(caches));
}

#[test]
fn sizes_at_the_limits_are_refused_and_change_nothing() {
    let rails = rma_rails(2);
    invalid(rails.register(0));
    invalid(rails.register(usize::MAX));
    let region = rails.register(4096).unwrap();
    invalid(region.segment(usize::MAX, 1));
    invalid(region.segment(1, usize::MAX));
    invalid(region.segment(4096, 1));
    invalid(region.write_bytes(usize::MAX, b"x"));
    let mut out = [0u8; 2];
    invalid(region.read_bytes(4095, &mut out));
    let remote = region.remote();
    invalid(remote.slice(u64::MAX, 1));
    invalid(remote.slice(1, u64::MAX));
    assert!(RailRemoteRegion::from_bytes(&[]).is_err());
    let bytes = remote.to_bytes();
    assert!(RailRemoteRegion::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    assert_eq!(remote, RailRemoteRegion::from_bytes(&bytes).unwrap());
    for rail in 0..2 {
        assert_eq!(0, rails.rail(rail).operations_in_flight());
    }
}

#[test]
fn a_striped_write_with_no_deadline_completes() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let target = client.register(1 << 20).unwrap();
    let source = server.register(1 << 20).unwrap();
    source.write_bytes(0, &[7; 1 << 20]).unwrap();
    let addresses = client.local_addresses();
    with_rails_progress(&client, || {
        let lease = server.lease(1, &slices(&addresses)).unwrap();
        server
            .write_within(
                lease,
                source.segment(0, 1 << 20).unwrap(),
                target.remote(),
                9,
                Duration::MAX,
            )
            .unwrap();
        let completion = server.wait_for(9, Duration::MAX).unwrap();
        completion.result.unwrap();
        wait_for_rail_bytes(&target, (1 << 20) - 4, &[7; 4]);
    });
    server.release(1);
    server.quiesce();
    for rail in 0..2 {
        assert_eq!(0, server.rail(rail).cache().stats().entries);
    }
}

/// efa: a new incarnation with the old one's identity waits for the old one's leases. When the
/// only such lease is the calling thread's own, that wait ends at the patience with
/// `OutOfPatience`; when the caller holds a pin it is refused at once; the held lease stays good.
#[test]
fn a_blocking_lease_that_would_wait_on_its_own_lease_or_pin_ends_or_is_refused() {
    let avs: Vec<ModelAv> = (0..2).map(|_| ModelAv::new(AddressFormat::Efa)).collect();
    let rails = RailCaches::new(
        avs.iter()
            .map(|av| {
                AddressCache::with_backend(av.clone())
                    .with_patience(std::time::Duration::from_millis(100))
            })
            .collect(),
    )
    .unwrap();
    // Same GIDs and QPNs on both rails, a new queue key: the same identity, a new process.
    let old: Vec<Vec<u8>> = (0..2).map(|rail| efa(rail + 1, 7, 1)).collect();
    let new: Vec<Vec<u8>> = (0..2).map(|rail| efa(rail + 1, 7, 2)).collect();
    let held = rails.lease(1, &slices(&old)).unwrap();
    let before = held.rail(0).fi_addr();

    let waited = rails.lease(2, &slices(&new));
    assert!(
        matches!(waited, Err(DmaError::OutOfPatience { client: 2, .. })),
        "{waited:?}"
    );
    assert_eq!(Some(old[0].clone()), avs[0].lookup(before), "still held");
    drop(held);
    // The removal, no longer held, may still be on its way past the short patience on a loaded
    // machine: ask again while the answer says nothing holds it.
    let lease = testkit::once_admitted("the retry", || rails.lease(2, &slices(&new))).unwrap();
    assert_eq!(Some(new[1].clone()), avs[1].lookup(lease.rail(1).fi_addr()));
    drop(lease);

    // No lease this time: the old incarnation's removal waits for the readers pinned when it
    // was unlinked, and the caller is one of them.
    let third: Vec<Vec<u8>> = (0..2).map(|rail| efa(rail + 1, 7, 3)).collect();
    {
        let pinned = rails.pin();
        let peers = pinned.resolve(2, &slices(&new)).unwrap();
        invalid(rails.lease(3, &slices(&third)));
        assert_eq!(Some(new[0].clone()), avs[0].lookup(peers.rail(0).fi_addr()));
    }
    let lease = testkit::once_admitted("the lease once unpinned", || {
        rails.lease(3, &slices(&third))
    })
    .unwrap();
    assert_eq!(
        Some(third[0].clone()),
        avs[0].lookup(lease.rail(0).fi_addr())
    );
    drop(lease);
    for client in 1..=3 {
        rails.release(client);
    }
    // A quiesce waits for the background thread's answer at most the short patience: on a
    // loaded machine it may return before the removals ran, so wait for the AVs to empty.
    testkit::wait_until("every rail's AV empty", || {
        rails.quiesce();
        avs.iter().all(ModelAv::is_empty)
    });
    assert!(avs.iter().all(|av| av.violations().is_empty()));
}
