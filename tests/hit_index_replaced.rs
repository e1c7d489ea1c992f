//! The index the writer replaces (issue 29, "after every client is released ... within 16 B a
//! former entry"): once the registrations have emptied to an eighth of what the table grew to,
//! the writer builds a fresh table, publishes it and frees the old one after its readers have
//! unpinned. These tests attack that hand-over: readers that hit while tables are replaced under
//! them must always find the entry they were registered on, never miss, and a pin that probed
//! the old table keeps it (and holds back the next replacement) until it drops.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use testkit::sockaddr;

/// The AV's capacity, which every table is built for at least: well under the registrations of
/// a round, so each round grows the table past it.
const CAPACITY: usize = 64;
/// Clients that stay registered throughout, each on an address of its own.
const STABLE: u64 = 8;
/// Clients a round registers on the stable addresses and then releases: enough to grow the table
/// to about 16 times its first size.
const PER_ROUND: u64 = 1_000;

/// The stable clients' addresses and the entries they resolved to, client `n` at `n`.
type Stable = Vec<(Vec<u8>, u64)>;

fn cache_and_stable() -> (ModelAv, AddressCache<ModelAv>, Stable) {
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, CAPACITY);
    let cache = AddressCache::with_backend(av.clone());
    let stable = (0..STABLE)
        .map(|client| {
            let address = sockaddr(client as u32);
            let fi_addr = cache
                .pin()
                .resolve(client, &address)
                .expect("a stable client")
                .fi_addr();
            (address, fi_addr)
        })
        .collect();
    (av, cache, stable)
}

/// Register [`PER_ROUND`] clients on the stable addresses, then release them all: the table
/// grows past the AV's capacity and empties back to the stable clients, an eighth of it or less.
fn grow_and_empty(cache: &AddressCache<ModelAv>, stable: &[(Vec<u8>, u64)], round: u64) {
    let first = 1_000_000 * (round + 1);
    let requests: Vec<(u64, &[u8])> = (0..PER_ROUND)
        .map(|n| (first + n, stable[(n % STABLE) as usize].0.as_slice()))
        .collect();
    for (n, result) in cache.pin().resolve_all(&requests).into_iter().enumerate() {
        let peer = result.expect("a client joining a stable entry");
        assert_eq!(stable[n % STABLE as usize].1, peer.fi_addr());
    }
    for n in 0..PER_ROUND {
        cache.release(first + n);
    }
}

#[test]
fn readers_hit_the_right_entries_while_the_writer_replaces_the_table_under_them() {
    const ROUNDS: u64 = 12;
    let (av, cache, stable) = cache_and_stable();
    let misses = cache.stats().misses;
    let stop = AtomicBool::new(false);
    // Batches of probes the readers have finished: each round waits for one more, so the readers
    // run alongside every round however the machine schedules them (before, a loaded machine
    // could run all the rounds before either reader had probed once).
    let batches = AtomicU64::new(0);
    let hits = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..2)
            .map(|reader| {
                let (cache, stable, stop, batches) = (&cache, &stable, &stop, &batches);
                scope.spawn(move || {
                    let mut hits = 0_u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Short pins and long ones: a long pin moves to the new table in the middle
                        // of its probes.
                        let pinned = cache.pin();
                        let probes = if reader == 0 { 8 } else { 4_096 };
                        for probe in 0..probes {
                            let client = probe % STABLE;
                            let (address, fi_addr) = &stable[client as usize];
                            let peer = pinned.resolve(client, address).expect("a hit");
                            assert_eq!(*fi_addr, peer.fi_addr(), "client {client}");
                            hits += 1;
                        }
                        batches.fetch_add(1, Ordering::Relaxed);
                    }
                    hits
                })
            })
            .collect();
        for round in 0..ROUNDS {
            let before = batches.load(Ordering::Relaxed);
            grow_and_empty(&cache, &stable, round);
            testkit::wait_until(&format!("a reader's batch during round {round}"), || {
                before < batches.load(Ordering::Relaxed)
            });
        }
        stop.store(true, Ordering::Relaxed);
        readers
            .into_iter()
            .map(|reader| reader.join().unwrap())
            .sum::<u64>()
    });
    cache.quiesce();
    assert!(hits > 0, "the readers ran alongside");
    assert!(
        cache.index_replacements() >= 1,
        "{ROUNDS} rounds that grew the table 16-fold and emptied it replaced it {} times",
        cache.index_replacements()
    );
    assert_eq!(
        misses + ROUNDS * PER_ROUND,
        cache.stats().misses,
        "every miss is a round's; a stable client's probe never missed, whichever table it read"
    );
    assert_eq!(STABLE, cache.stats().clients);
    assert_eq!(STABLE as usize, cache.indexed());
    for (address, fi_addr) in &stable {
        assert_eq!(Some(address.clone()), av.lookup(*fi_addr));
    }
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn a_pin_that_probed_the_old_table_keeps_it_and_holds_back_the_next_replacement() {
    let (av, cache, stable) = cache_and_stable();
    let pinned = cache.pin();
    let (address, fi_addr) = &stable[0];
    assert_eq!(*fi_addr, pinned.resolve(0, address).unwrap().fi_addr());
    std::thread::scope(|scope| {
        scope
            .spawn(|| grow_and_empty(&cache, &stable, 0))
            .join()
            .unwrap();
    });
    // `release` queues: the writer (a caller's round or the background thread) applies the
    // releases, and replaces the emptied table, when it gets to them.
    testkit::wait_until("the first round's releases applied", || {
        STABLE == cache.stats().clients && 0 < cache.index_replacements()
    });
    assert_eq!(
        1,
        cache.index_replacements(),
        "the first round replaced the table"
    );
    // The pin moves to the new table at its next probe, and still holds the old one's memory.
    assert_eq!(*fi_addr, pinned.resolve(0, address).unwrap().fi_addr());
    std::thread::scope(|scope| {
        scope
            .spawn(|| grow_and_empty(&cache, &stable, 1))
            .join()
            .unwrap();
    });
    testkit::wait_until("the second round's releases applied", || {
        STABLE == cache.stats().clients
    });
    assert_eq!(
        1,
        cache.index_replacements(),
        "a replaced table still held by a pin holds back the next replacement"
    );
    for (client, (address, fi_addr)) in stable.iter().enumerate() {
        assert_eq!(
            *fi_addr,
            pinned.resolve(client as u64, address).unwrap().fi_addr()
        );
    }
    drop(pinned);
    cache.quiesce();
    // The second round's releases may still be in the inbox when the pin's drop frees the old
    // table: the grown table is then replaced by one sized for what was left at that moment, and
    // that one again once the rest are gone. Two replacements or three, by timing; never a loop.
    let replaced = cache.index_replacements();
    assert!(
        (2..=3).contains(&replaced),
        "once the pin is gone the old table is freed, and the grown one replaced in turn: {replaced}"
    );
    cache.quiesce();
    assert_eq!(
        replaced,
        cache.index_replacements(),
        "a table sized for what it holds is not replaced again"
    );
    assert_eq!(STABLE as usize, cache.indexed());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn a_table_that_never_outgrew_the_capacity_is_never_replaced() {
    let (_av, cache, stable) = cache_and_stable();
    for client in STABLE..CAPACITY as u64 {
        cache
            .pin()
            .resolve(client, &stable[0].0)
            .expect("a client on a stable entry");
    }
    for client in STABLE..CAPACITY as u64 {
        cache.release(client);
    }
    cache.quiesce();
    assert_eq!(0, cache.index_replacements());
}
