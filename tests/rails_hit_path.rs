//! A rail-set hit (pin every rail, resolve a client on all of them) allocates nothing. Its own
//! test binary, because it installs a counting allocator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{AddressCache, AddressFormat, ModelAv, RailCaches, RailSet};
use testkit::{CountingAllocator, allocations, efa, rma_rails};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

/// Resolve `clients` on every rail `rounds` times through `pin`, once warmed: the allocations
/// counted meanwhile.
fn hits<'r>(
    pin: impl Fn() -> dma_libfabric::RailPinned<'r>,
    lease: impl Fn(u64, &[&[u8]]),
    clients: &[Vec<&[u8]>],
) -> u64 {
    for (client, addresses) in clients.iter().enumerate() {
        pin().resolve(client as u64, addresses).expect("warm up");
        // A thread's first lease of a cache makes room for its tally of leases, once.
        lease(client as u64, addresses);
    }
    let before = allocations();
    let mut checksum = 0;
    for round in 0..10_000 {
        let client = round % clients.len();
        let pinned = pin();
        let peers = pinned.resolve(client as u64, &clients[client]).unwrap();
        checksum += peers.rail(peers.len() - 1).fi_addr();
    }
    assert!(0 < checksum || clients.len() == 1);
    allocations() - before
}

#[test]
fn a_hit_on_four_model_rails_allocates_nothing() {
    let rails = RailCaches::new(
        (0..4)
            .map(|_| AddressCache::with_backend(ModelAv::new(AddressFormat::Efa)))
            .collect(),
    )
    .unwrap();
    let addresses: Vec<Vec<Vec<u8>>> = (0..50_u8)
        .map(|client| (0..4).map(|rail| efa(client, rail, 1)).collect())
        .collect();
    let clients: Vec<Vec<&[u8]>> = addresses
        .iter()
        .map(|rails| rails.iter().map(Vec::as_slice).collect())
        .collect();
    let misses: u64 = (0..4).map(|rail| rails.rail(rail).stats().misses).sum();
    let allocated = hits(
        || rails.pin(),
        |client, addresses| drop(rails.lease(client, addresses).unwrap()),
        &clients,
    );
    assert_eq!(0, allocated, "a rail-set hit allocated");
    let after: u64 = (0..4).map(|rail| rails.rail(rail).stats().misses).sum();
    assert_eq!(misses + 4 * 50, after, "only the warm-up missed");
}

#[test]
fn a_hit_on_two_tcp_rails_allocates_nothing() {
    let server: RailSet = rma_rails(2);
    let client = rma_rails(2);
    let addresses = client.local_addresses();
    let clients = vec![addresses.iter().map(Vec::as_slice).collect::<Vec<&[u8]>>()];
    let allocated = hits(
        || server.pin(),
        |id, addresses| drop(server.lease(id, addresses).unwrap()),
        &clients,
    );
    assert_eq!(0, allocated, "a rail-set hit allocated");
}
