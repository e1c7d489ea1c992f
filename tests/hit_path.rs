//! A hit allocates nothing, with or without another thread churning. Its own test binary, because
//! it installs a counting allocator.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{efa, sockaddr, tcp};
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, DmaError, ModelAv};

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
    let cache = endpoint.cache();
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
    let cache = endpoint.cache();
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

/// `Pinned::probe` promises a hit's cost whatever it answers: no allocation on a hit, and none on
/// a `None` either (an unknown client, a registered client at another address, an address the
/// cache would refuse), with nothing queued for the writer.
#[test]
fn a_probe_allocates_nothing_and_queues_nothing_hit_or_miss() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let addresses = warmed(cache, (0..100).map(sockaddr).collect());
    let stranger = sockaddr(50_000);
    let pinned = cache.pin();
    let before_stats = cache.stats();
    let before = allocations();
    let (mut hits, mut nones) = (0_u32, 0_u32);
    for round in 0..10_000_usize {
        let client = round % addresses.len();
        let probed = match round % 4 {
            0 => pinned.probe(client as u64, &addresses[client]),
            1 => pinned.probe(u64::MAX - client as u64, &addresses[client]),
            2 => pinned.probe(client as u64, &stranger),
            _ => pinned.probe(client as u64, &addresses[client][..1]),
        };
        match probed {
            Some(peer) => {
                hits += 1;
                std::hint::black_box(peer.fi_addr());
            }
            None => nones += 1,
        }
    }
    let after = allocations();
    assert_eq!(
        before,
        after,
        "10,000 probes allocated {} times",
        after - before
    );
    assert_eq!((2_500, 7_500), (hits, nones), "a hit in four rounds");
    drop(pinned);
    cache.quiesce();
    let after_stats = cache.stats();
    assert_eq!(
        (
            before_stats.misses,
            before_stats.inserts,
            before_stats.entries
        ),
        (after_stats.misses, after_stats.inserts, after_stats.entries),
        "the probes queued nothing"
    );
}

/// Cycles of churn in [`a_hit_allocates_nothing_while_another_thread_churns`]: fewer than the 64
/// entries of a crossbeam bag, so the reader's own bag (which collects the queue nodes it pops)
/// never fills and crossbeam's node recycling cannot be what the count sees.
const BOUNDED_CHURN: u64 = 60;

/// Pin-and-hit rounds after the churn has stopped: enough for the reader's pins to collect (one
/// in 128 does) every bag the churn retired.
const ROUNDS_AFTER_CHURN: u64 = 200_000;

/// Another thread releases and re-resolves clients of its own, each time on an address it has
/// not used before: so each cycle is a miss, and retires the client's previous entry, whose
/// deferred closure a reader's `pin()` may run (crossbeam's collection).
fn churn<B: AvBackend>(cache: &AddressCache<B>, cycles: impl Iterator<Item = u64>) -> u64 {
    let mut done = 0;
    for cycle in cycles {
        let client = 1_000 + cycle % 8;
        cache.release(client);
        let address = sockaddr(100_000 + (cycle % 1_000_000) as u32);
        // Under load the removals of the entries this churn retires may lag behind it until
        // every slot awaits one (seen at a load average of 10 on 2 cores): wait for them then.
        while let Err(error) = cache.pin().resolve(client, &address) {
            assert!(
                matches!(error, DmaError::Capacity { .. }),
                "the churned client: {error:?}"
            );
            std::thread::yield_now();
        }
        done += 1;
    }
    done
}

/// The pin-and-hit rounds on `addresses` until `stop` says so (and at least `minimum`): the
/// allocations this thread made during them, and how many rounds it ran.
fn rounds<B: AvBackend>(
    cache: &AddressCache<B>,
    addresses: &[Vec<u8>],
    minimum: u64,
    stop: &dyn Fn() -> bool,
) -> (u64, u64) {
    let before = allocations();
    let mut round = 0_u64;
    while round < minimum || !stop() {
        let pinned = cache.pin();
        let client = round as usize % addresses.len();
        std::hint::black_box(
            pinned
                .resolve(client as u64, &addresses[client])
                .expect("a hit"),
        );
        drop(pinned);
        round += 1;
    }
    (allocations() - before, round)
}

/// Fresh caches the bounded-churn test runs on, one after the other: each cache has its own
/// collector, so the reader's bag starts empty on each, while a closure that allocates once in a
/// while (as a channel's `send` does, one block per 31 messages) is caught by one of them.
const CHURNED_CACHES: usize = 8;

#[test]
fn a_hit_allocates_nothing_while_another_thread_churns() {
    for _ in 0..CHURNED_CACHES {
        let av = ModelAv::new(AddressFormat::Opaque);
        let cache = AddressCache::with_backend(av.clone());
        let addresses = warmed(&cache, (0..100).map(sockaddr).collect());
        // The churned clients exist already, so each cycle retires an entry.
        churn(&cache, 999_000..999_008);
        let misses = cache.stats().misses;
        let churned = std::sync::atomic::AtomicBool::new(false);
        let (allocated, rounds_run) = std::thread::scope(|scope| {
            scope.spawn(|| {
                churn(&cache, 0..BOUNDED_CHURN);
                churned.store(true, std::sync::atomic::Ordering::Release);
            });
            let (during, first) = rounds(&cache, &addresses, 0, &|| {
                churned.load(std::sync::atomic::Ordering::Acquire)
            });
            let (after, second) = rounds(&cache, &addresses, ROUNDS_AFTER_CHURN, &|| true);
            (during + after, first + second)
        });
        assert_eq!(
            0, allocated,
            "{rounds_run} pin-and-hit rounds, during and after {BOUNDED_CHURN} churn cycles on \
             another thread, allocated {allocated} times on the reader"
        );
        cache.quiesce();
        assert_eq!(
            misses + BOUNDED_CHURN,
            cache.stats().misses,
            "each churn cycle was a miss, and retired an entry"
        );
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    }
}

/// How many allocations 1,000,000 pin-and-hit rounds make on the reader while another thread
/// churns without pause. Recorded, not asserted zero: crossbeam's own recycling of its queue's
/// nodes (a reader that pops 64 bags pushes its own full bag, which allocates a node) may
/// allocate under unbounded churn. Run with `--nocapture` to see the figure.
#[test]
fn allocations_per_million_hits_under_unbounded_churn() {
    /// Release/resolve cycles the churning thread runs; the reader hits until they are done.
    const CYCLES: u64 = 20_000;
    let endpoint = tcp();
    let cache = endpoint.cache();
    let addresses = warmed(cache, (0..100).map(sockaddr).collect());
    churn(cache, 0..8);
    let finished = std::sync::atomic::AtomicBool::new(false);
    let ((allocated, rounds_run), cycles) = std::thread::scope(|scope| {
        let churner = scope.spawn(|| {
            // Set however the churn ends: a panicking churner must stop the reader too, or the
            // test hangs instead of failing.
            struct Finished<'a>(&'a std::sync::atomic::AtomicBool);
            impl Drop for Finished<'_> {
                fn drop(&mut self) {
                    self.0.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let _finished = Finished(&finished);
            churn(cache, 0..CYCLES)
        });
        let counted = rounds(cache, &addresses, 1, &|| {
            finished.load(std::sync::atomic::Ordering::Relaxed)
        });
        (counted, churner.join().expect("the churning thread"))
    });
    let stats = cache.stats();
    eprintln!(
        "allocations_per_million_hits_under_unbounded_churn: {allocated} allocations on the reader \
         in {rounds_run} pin-and-hit rounds ({:.2} per 1,000,000), while another thread ran \
         {cycles} release/resolve cycles ({} removals)",
        allocated as f64 * 1_000_000.0 / rounds_run.max(1) as f64,
        stats.removes
    );
    assert_eq!(CYCLES, cycles);
    assert!(rounds_run > 0, "the reader ran alongside");
}

/// Release/revive cycles the churner runs under the long pin of
/// [`hits_through_one_long_pin_allocate_nothing_while_the_index_changes`].
const REVIVES: u64 = 5_000;

/// The batched hit's path under churn: one pin, many hits, while another thread releases and
/// revives a client of its own, so the index changes between the hits and each hit that sees it
/// refreshes the pin's papaya guard (which may free retired nodes, but must not allocate). The
/// churn revives one entry, so the long pin holds back no AV removal and the AV never fills.
#[test]
fn hits_through_one_long_pin_allocate_nothing_while_the_index_changes() {
    let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    let addresses = warmed(&cache, (0..100).map(sockaddr).collect());
    let shared = sockaddr(9_999);
    cache
        .pin()
        .resolve(1_000, &shared)
        .expect("the churned entry");
    let churned = std::sync::atomic::AtomicBool::new(false);
    // Set once the reader has hit every address once: the churn starts then, so the reader runs
    // alongside it however the machine schedules the two (before, a loaded machine could run
    // every cycle before the reader's first hit).
    let reading = std::sync::atomic::AtomicBool::new(false);
    let pinned = cache.pin();
    let misses = cache.stats().misses;
    let (allocated, hits) = std::thread::scope(|scope| {
        let churner = scope.spawn(|| {
            testkit::wait_until("the reader's first hits", || {
                reading.load(std::sync::atomic::Ordering::Acquire)
            });
            for cycle in 0..REVIVES {
                let (gone, back) = if 0 == cycle % 2 {
                    (1_000, 1_001)
                } else {
                    (1_001, 1_000)
                };
                cache.release(gone);
                cache.pin().resolve(back, &shared).expect("revived");
            }
            churned.store(true, std::sync::atomic::Ordering::Release);
        });
        let before = allocations();
        let mut hits = 0_u64;
        while !churned.load(std::sync::atomic::Ordering::Acquire) && !churner.is_finished() {
            for (client, address) in addresses.iter().enumerate() {
                let peer = pinned.resolve(client as u64, address).expect("a hit");
                std::hint::black_box(peer.fi_addr());
                hits += 1;
            }
            reading.store(true, std::sync::atomic::Ordering::Release);
        }
        (allocations() - before, hits)
    });
    assert_eq!(
        0, allocated,
        "{hits} hits through one pin, while another thread ran {REVIVES} release/revive cycles, \
         allocated {allocated} times on the reader"
    );
    assert!(0 < hits, "the reader ran alongside");
    assert_eq!(
        misses + REVIVES,
        cache.stats().misses,
        "each revive was a miss"
    );
}
