//! An admission overtaken while its slices are still being published: 200,000 clients parked
//! behind a leased incarnation are admitted (the parked set taken over as the entry's holders in
//! one step, their places read as holding it until a slice publishes them), and then evicted, or
//! their old index reused, before the last slice is out.
//!
//! In a binary of their own: their O(n) steps (evicting 200,000 holders, publishing every
//! admission at once, dropping a cache of 200,000 clients) may run on the process's one background
//! thread, and meanwhile another cache's waiter with a 100 ms patience is answered by its own
//! fallback instead (`OutOfPatience` without the lease count), which the patience tests assert.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use testkit::efa;

/// Enough clients that their admission's slices (256 a round) are still going out when the next
/// request comes.
const CLIENTS: u64 = 200_000;

/// A cache over an efa model AV, whose patience only a hang outlasts, and the AV.
fn efa_cache() -> (AddressCache<ModelAv>, ModelAv) {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone()).with_patience(testkit::FAILSAFE);
    (cache, av)
}

/// Parks `clients` clients on `new` behind the leased `old`, drops the lease, and returns once the
/// writer has admitted them all (its counters say so), while most of their registrations are
/// still to be published, a slice a round.
fn admit_many(cache: &AddressCache<ModelAv>, old: &[u8], new: &[u8], clients: u64) {
    let lease = testkit::park_behind_lease(cache, old, new, clients);
    drop(lease);
    // Not a sleep: the admission's counters are published before its first slice goes out.
    let deadline = std::time::Instant::now() + testkit::FAILSAFE;
    while cache.stats().clients != clients {
        assert!(std::time::Instant::now() < deadline, "never admitted");
        std::thread::yield_now();
    }
}

/// 200,000 admitted clients, taken over as the entry's holders at once, are each evicted when a
/// newer incarnation of their slot comes during the slices that publish them: none stays
/// registered, none is counted twice, and the newcomer parked behind the same index (the AV
/// reused the old one for the admitted entry) gets in.
#[test]
fn an_admission_evicted_before_its_slices_are_out_evicts_every_client_once() {
    let (cache, av) = efa_cache();
    let (old, new, newer) = (efa(1, 7, 1), efa(1, 7, 2), efa(1, 7, 3));
    admit_many(&cache, &old, &new, CLIENTS);
    let evicted = cache.stats().evicted_clients;
    assert!(matches!(
        cache.pin().try_resolve(CLIENTS + 1, &newer),
        Err(DmaError::WouldBlock)
    ));
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        CLIENTS,
        stats.evicted_clients - evicted,
        "each evicted once"
    );
    assert_eq!((1, 1), (stats.entries, stats.clients), "the newcomer alone");
    let fi_addr = cache
        .pin()
        .try_resolve(CLIENTS + 1, &newer)
        .unwrap()
        .fi_addr();
    assert_eq!(Some(newer.clone()), av.lookup(fi_addr));
    let pinned = cache.pin();
    for client in 1..=CLIENTS {
        assert!(
            pinned.probe(client, &new).is_none(),
            "client {client} still registered"
        );
    }
}

/// While an admission's slices are out, its clients' places still name the index the old
/// incarnation had. When the AV hands that index to another address and a newer incarnation of
/// that one parks behind it, the admitted clients must still hold what they were admitted to,
/// not the newcomer's entry.
#[test]
fn an_admission_whose_old_index_is_reused_mid_publication_keeps_its_clients_on_their_entry() {
    let (cache, av) = efa_cache();
    let (old, new) = (efa(1, 7, 1), efa(1, 7, 2));
    let (other, other_newer) = (efa(5, 5, 1), efa(5, 5, 2));
    // Index 0 is taken first and freed before the admission, which therefore gets index 0
    // while the old incarnation had index 1.
    let first = cache
        .pin()
        .resolve(u64::MAX, &efa(9, 9, 1))
        .unwrap()
        .fi_addr();
    assert_eq!(0, first);
    let lease = cache.lease(0, &old).unwrap();
    assert_eq!(1, lease.fi_addr());
    drop(lease);
    cache.release(u64::MAX);
    cache.quiesce();
    assert_eq!(None, av.lookup(0));
    admit_many(&cache, &old, &new, CLIENTS);
    let pinned = cache.pin();
    let admitted = pinned.resolve(1, &new).unwrap().fi_addr();
    drop(pinned);
    assert_eq!(0, admitted, "the admitted entry took the free index 0");
    // Index 1 goes to another address; a newer incarnation of it parks behind index 1.
    let reused = cache.pin().resolve(CLIENTS + 1, &other).unwrap().fi_addr();
    assert_eq!(1, reused, "the old incarnation's index, reused");
    assert!(matches!(
        cache.pin().try_resolve(CLIENTS + 2, &other_newer),
        Err(DmaError::WouldBlock)
    ));
    cache.quiesce();
    let pinned = cache.pin();
    for client in 1..=CLIENTS {
        let peer = pinned.probe(client, &new);
        assert_eq!(
            Some(admitted),
            peer.map(|peer| peer.fi_addr()),
            "client {client} lost its admitted entry"
        );
    }
    drop(pinned);
    let stats = cache.stats();
    assert_eq!((2, CLIENTS + 1), (stats.entries, stats.clients));
    assert_eq!(Some(new.clone()), av.lookup(admitted));
}
