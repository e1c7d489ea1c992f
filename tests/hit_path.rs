//! A hit allocates nothing. Its own test binary, because it installs a counting allocator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{efa, sockaddr, tcp};
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, ModelAv};

/// Counts allocations made by the current thread only, so the writer thread's work (and the test
/// harness's) does not blur the count.
struct Counting;

std::thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread-local without a destructor, so touching it never allocates or
// re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: forwarded with the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from `System.alloc` with this layout.
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: as for `dealloc`, and `size` is the caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

/// Register client `i` on `addresses[i]`, so every later resolve of the pair is a hit.
fn warmed<B: AvBackend>(cache: &AddressCache<B>, addresses: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let pinned = cache.pin();
    for (client, address) in addresses.iter().enumerate() {
        let peer = pinned.resolve(client as u64, address).expect("warm up");
        // A thread's first lease of a cache makes room for its tally of leases held here, as its
        // first pin registers its epoch handle: once.
        drop(pinned.lease(peer).expect("warm up"));
    }
    addresses
}

#[test]
fn a_hit_on_the_real_av_allocates_nothing() {
    let endpoint = tcp();
    let cache = endpoint.peers();
    let addresses = warmed(cache, (0..100).map(sockaddr).collect());
    let pinned = cache.pin();
    let misses = cache.stats().misses;
    let before = allocations();
    let mut checksum = 0;
    for round in 0..10_000 {
        let client = round % addresses.len();
        let peer = pinned
            .resolve(client as u64, &addresses[client])
            .expect("a hit");
        checksum ^= peer.fi_addr();
    }
    let after = allocations();
    assert_eq!(
        before,
        after,
        "10,000 hits allocated {} times",
        after - before
    );
    assert_eq!(misses, cache.stats().misses, "all hits");
    std::hint::black_box(checksum);
}

#[test]
fn a_hit_on_efa_addresses_allocates_nothing() {
    let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Efa));
    let addresses = warmed(&cache, (0..100_u16).map(|qpn| efa(3, qpn, 7)).collect());
    let before = allocations();
    for round in 0..1_000 {
        // Single-shot: pin, resolve, unpin. The thread's epoch handle is registered already.
        let pinned = cache.pin();
        let client = round % addresses.len();
        std::hint::black_box(
            pinned
                .resolve(client as u64, &addresses[client])
                .expect("a hit"),
        );
    }
    let after = allocations();
    assert_eq!(
        before,
        after,
        "1,000 pin-resolve-unpin rounds allocated {} times",
        after - before
    );
}

#[test]
fn a_pin_resolve_lease_drop_round_allocates_nothing() {
    let endpoint = tcp();
    let cache = endpoint.peers();
    let addresses = warmed(cache, (0..100).map(sockaddr).collect());
    let before = allocations();
    for round in 0..1_000 {
        let pinned = cache.pin();
        let client = round % addresses.len();
        let peer = pinned
            .resolve(client as u64, &addresses[client])
            .expect("a hit");
        let lease = pinned.lease(peer).expect("a lease");
        drop(pinned);
        std::hint::black_box(lease.fi_addr());
        drop(lease);
    }
    let after = allocations();
    assert_eq!(
        before,
        after,
        "1,000 lease rounds allocated {} times",
        after - before
    );
    assert_eq!(0, cache.stats().leases);
}
