//! efa's address rules, on the model AV: this machine has no efa device.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use common::efa;
use dma_libfabric::{AddressCache, AddressFormat, AvEvent, DmaError, ModelAv};

fn cache() -> (ModelAv, AddressCache<ModelAv>) {
    let av = ModelAv::new(AddressFormat::Efa);
    (av.clone(), AddressCache::with_backend(av))
}

#[test]
fn addresses_differing_only_in_qkey_are_one_slot() {
    let (av, cache) = cache();
    let pinned = cache.pin();
    let one = pinned.resolve(1, &efa(1, 7, 0x9bce_1061)).expect("first");
    let two = pinned
        .resolve(2, &efa(1, 7, 0x9bce_1061))
        .expect("same bytes, shared");
    assert_eq!(one.fi_addr(), two.fi_addr());
    assert_eq!(1, av.inserts());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn different_qpns_are_different_slots() {
    let (av, cache) = cache();
    let pinned = cache.pin();
    let one = pinned.resolve(1, &efa(1, 7, 5)).expect("qpn 7");
    let two = pinned.resolve(2, &efa(1, 8, 5)).expect("qpn 8");
    assert_ne!(one, two);
    assert_eq!(2, av.len());
}

/// The crash the design exists to prevent: a new QKEY on a known (GID, QPN) evicts the old
/// incarnation and every client on it, and the old entry leaves the AV before the new one enters.
#[test]
fn a_new_qkey_evicts_the_old_incarnation_before_inserting_the_new() {
    let (av, cache) = cache();
    let old = efa(1, 7, 0x9bce_1061);
    let new = efa(1, 7, 0x961f_0203);
    let stale = cache.pin().resolve(1, &old).expect("client 1").fi_addr();
    cache.pin().resolve(2, &old).expect("client 2");

    {
        let reader = cache.pin();
        // The caller's own pin holds the old entry in place, so the new one must wait.
        assert_eq!(
            Err(DmaError::WouldBlock),
            reader.resolve(3, &new).map(|peer| peer.fi_addr())
        );
        cache.quiesce();
        assert_eq!(
            Some(old.clone()),
            av.lookup(stale),
            "not removed while a reader is pinned"
        );
        let stats = cache.stats();
        assert_eq!(
            (1, 2, 1),
            (
                stats.evictions,
                stats.evicted_clients,
                stats.pending_removals
            )
        );
    }
    cache.quiesce();

    let events = av.events();
    let removed = events
        .iter()
        .position(|event| matches!(event, AvEvent::Removed { address, .. } if *address == old))
        .expect("the old incarnation was removed");
    let inserted = events
        .iter()
        .position(|event| matches!(event, AvEvent::Inserted { address, .. } if *address == new))
        .expect("the new incarnation was inserted");
    assert!(removed < inserted, "remove before insert: {events:?}");
    assert!(av.violations().is_empty(), "{:?}", av.violations());

    let pinned = cache.pin();
    let misses = cache.stats().misses;
    let peer = pinned.resolve(3, &new).expect("client 3 is in");
    assert_eq!(
        misses,
        cache.stats().misses,
        "a hit: the parked insert was published"
    );
    assert_eq!(Some(new.clone()), av.lookup(peer.fi_addr()));
    assert_eq!(1, cache.stats().clients, "only client 3 is registered");

    // Clients 1 and 2 were evicted: their next resolve is a miss that goes to the writer. The
    // queued miss re-advertises the old incarnation, and the last word wins: the writer evicts
    // client 3 in the background, so the stats are read only once that has settled.
    assert!(matches!(
        pinned.try_resolve(1, &old),
        Err(DmaError::WouldBlock)
    ));
    drop(pinned);
    cache.quiesce();
    let back = cache
        .pin()
        .resolve(1, &old)
        .expect("client 1 is back")
        .fi_addr();
    assert_eq!(Some(old.clone()), av.lookup(back));
    let stats = cache.stats();
    assert_eq!(
        (2, 3, 1, 1),
        (
            stats.evictions,
            stats.evicted_clients,
            stats.clients,
            stats.entries
        ),
        "client 3 evicted in turn; client 1 alone on the old incarnation"
    );
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

/// While the new incarnation is parked, the writer keeps serving everyone else.
#[test]
fn a_parked_insert_does_not_stall_the_queue() {
    let (av, cache) = cache();
    cache.pin().resolve(1, &efa(1, 7, 1)).expect("old");
    let reader = cache.pin();
    assert_eq!(
        Err(DmaError::WouldBlock),
        reader.resolve(2, &efa(1, 7, 2)).map(|peer| peer.fi_addr())
    );
    let other = reader
        .resolve(3, &efa(2, 9, 1))
        .expect("another peer goes straight in");
    assert_eq!(Some(efa(2, 9, 1)), av.lookup(other.fi_addr()));
    drop(reader);
    cache.quiesce();
    assert_eq!(2, cache.stats().entries);
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

/// A client re-advertising its own new incarnation, alone on the slot, is a release and a
/// parked insert, not an eviction of anyone.
#[test]
fn a_client_moving_to_its_own_new_incarnation_evicts_nobody() {
    let (av, cache) = cache();
    cache.pin().resolve(1, &efa(1, 7, 1)).expect("old");
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .resolve(1, &efa(1, 7, 2))
            .map(|peer| peer.fi_addr())
    );
    cache.quiesce();
    let peer = cache.pin().resolve(1, &efa(1, 7, 2)).expect("in").fi_addr();
    assert_eq!(Some(efa(1, 7, 2)), av.lookup(peer));
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 1, 1),
        (
            stats.evictions,
            stats.evicted_clients,
            stats.entries,
            stats.removes
        )
    );
}

#[test]
fn any_length_but_32_is_invalid_and_reaches_no_av_call() {
    let (av, cache) = cache();
    let pinned = cache.pin();
    for len in [0, 16, 18, 31, 33, 64] {
        let result = pinned.resolve(1, &vec![1; len]);
        assert!(
            matches!(result, Err(DmaError::InvalidAddress(_))),
            "{len}: {result:?}"
        );
    }
    drop(pinned);
    cache.quiesce();
    assert!(av.events().is_empty());
    assert_eq!(0, cache.stats().misses);
}

#[test]
fn everything_released_and_quiesced_leaves_the_av_empty() {
    let (av, cache) = cache();
    for client in 0..50_u64 {
        let qkey = (client % 3) as u32;
        let _ = cache
            .pin()
            .resolve(client, &efa(1, (client % 5) as u16, qkey));
    }
    cache.quiesce();
    for client in 0..50 {
        cache.release(client);
    }
    cache.quiesce();
    assert!(av.is_empty(), "{:?}", av.events());
    assert_eq!(av.inserts(), av.removes());
    assert_eq!(0, cache.indexed());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}
