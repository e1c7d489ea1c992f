//! Leases: an entry's `fi_av_remove` waits for every lease on it, not only for pins.
//!
//! On the real tcp AV a removal shows through reuse: the table hands the lowest free index to the
//! next fresh address (DESIGN.md). efa's parked incarnations are shown on the model AV.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{efa, sockaddr, tcp};
use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};

#[test]
fn a_lease_keeps_its_index_from_reuse_until_it_is_dropped_on_another_thread() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let lease = {
        let pinned = cache.pin();
        let peer = pinned.resolve(1, &sockaddr(1)).expect("client 1");
        pinned.lease(peer).expect("a lease")
    };
    let leased = lease.fi_addr();
    cache.release(1);
    cache.quiesce_with_patience(Duration::ZERO);
    let stats = cache.stats();
    assert_eq!(
        (0, 1, 1, 1),
        (
            stats.entries,
            stats.pending_removals,
            stats.removals_awaiting_leases,
            stats.leases
        ),
        "the removal waits for the lease: {stats:?}"
    );

    // Held by the lease alone: a new address gets another index.
    let other = cache
        .pin()
        .resolve(2, &sockaddr(2))
        .expect("client 2")
        .fi_addr();
    assert_ne!(leased, other, "the leased index was handed out again");
    assert_eq!(
        Some(sockaddr(1)),
        endpoint.lookup(leased).expect("lookup"),
        "the leased index still holds its address"
    );

    // A completion thread drops it.
    std::thread::scope(|scope| {
        scope.spawn(move || drop(lease));
    });
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0),
        (
            stats.pending_removals,
            stats.removals_awaiting_leases,
            stats.leases
        )
    );
    let next = cache
        .pin()
        .resolve(3, &sockaddr(3))
        .expect("client 3")
        .fi_addr();
    assert_eq!(
        leased, next,
        "the lowest free index, given back by the removal"
    );
}

#[test]
fn quiesce_waits_for_leases_as_it_waits_for_pins() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let lease = cache.lease(1, &[1; 16]).expect("a lease");
    let second = lease.clone();
    cache.release(1);
    cache.quiesce_with_patience(Duration::ZERO);
    assert_eq!(1, av.len(), "two leases out");
    drop(lease);
    cache.quiesce_with_patience(Duration::ZERO);
    assert_eq!(1, av.len(), "one lease out");
    assert_eq!(1, cache.stats().leases);
    drop(second);
    cache.quiesce();
    assert!(av.is_empty(), "{:?}", av.events());
    assert_eq!(av.inserts(), av.removes());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn a_revived_entry_keeps_its_leases() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let lease = cache.lease(1, &[1; 16]).expect("a lease");
    cache.release(1);
    cache.quiesce_with_patience(Duration::ZERO);
    // The same address again: the pending entry comes back to life at the same index.
    let back = cache.lease(1, &[1; 16]).expect("revived");
    assert_eq!(lease.fi_addr(), back.fi_addr());
    assert_eq!(1, av.inserts(), "revived, not inserted again");
    drop(lease);
    cache.release(1);
    cache.quiesce_with_patience(Duration::ZERO);
    assert_eq!(1, av.len(), "the second lease still holds it");
    drop(back);
    cache.quiesce();
    assert!(av.is_empty(), "{:?}", av.events());
}

#[test]
fn a_new_efa_incarnation_waits_for_the_old_ones_leases() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let old = efa(1, 7, 1);
    let new = efa(1, 7, 2);
    // A completion thread takes the old incarnation's lease and holds it until told to drop it:
    // the blocking `lease` below waits for its drop (see `AddressCache::lease`).
    let (leased, taken) = mpsc::channel();
    let (dropped, drop_now) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let (cache, old) = (&cache, &old);
        scope.spawn(move || {
            let lease = cache.lease(1, old).expect("the old incarnation");
            leased.send(lease.fi_addr()).expect("the test");
            drop_now.recv().expect("the signal");
            drop(lease);
        });
        let old_index = taken.recv().expect("the lease");

        // A new QKEY on the same GID and QPN: the old incarnation is evicted, the new one parked.
        assert_eq!(
            Err(DmaError::WouldBlock),
            cache.pin().resolve(2, &new).map(|peer| peer.fi_addr())
        );
        cache.quiesce_with_patience(Duration::ZERO);
        assert_eq!(Some(old.clone()), av.lookup(old_index), "held by the lease");
        assert_eq!(1, av.len(), "the new incarnation is not in beside it");
        // A timeout of its own, which the held lease makes it wait out. The error names the
        // lease when the writer answers at the deadline before the caller's own bound, a timeout
        // (at least 100 ms) later: 1 s, so that a loaded machine keeping the background thread
        // off a core does not turn `leases: 1` into `leases: 0`, as 1 ms could.
        let parked = cache
            .lease_within(2, &new, Duration::from_secs(1))
            .map(|lease| lease.fi_addr());
        assert!(
            matches!(
                parked,
                Err(DmaError::OutOfPatience {
                    client: 2,
                    leases: 1,
                    ..
                })
            ),
            "still parked behind the lease: {parked:?}"
        );

        // The blocking lease waits for the drop instead of answering WouldBlock.
        dropped.send(()).expect("the dropper");
        let fresh = cache
            .lease(2, &new)
            .expect("the new incarnation, once admitted");
        assert_eq!(Some(new.clone()), av.lookup(fresh.fi_addr()));
    });
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn the_blocking_lease_waits_out_a_reader_pinned_on_the_old_incarnation() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let old = efa(2, 9, 1);
    let new = efa(2, 9, 2);
    cache.pin().resolve(1, &old).expect("the old incarnation");
    let (pinned_tx, pinned_rx) = mpsc::channel::<()>();
    let (unpin_tx, unpin_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let (cache, old) = (&cache, &old);
        scope.spawn(move || {
            let pinned = cache.pin();
            pinned.resolve(1, old).expect("a hit");
            pinned_tx.send(()).expect("main");
            // Hold the pin until the writer has parked the new incarnation behind it.
            unpin_rx.recv().expect("main");
            drop(pinned);
        });
        pinned_rx.recv().expect("the reader");
        // Park it from here, then let the reader go while `lease` waits.
        assert_eq!(
            Err(DmaError::WouldBlock),
            cache.pin().try_resolve(2, &new).map(|peer| peer.fi_addr())
        );
        cache.quiesce_with_patience(Duration::ZERO);
        assert_eq!(1, cache.stats().evictions);
        unpin_tx.send(()).expect("the reader");
        let lease = cache
            .lease(2, &new)
            .expect("admitted once the reader unpinned");
        assert_eq!(Some(new.clone()), av.lookup(lease.fi_addr()));
    });
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn a_lease_from_a_pinned_thread_or_of_another_cache_is_refused() {
    let one = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    let two = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    let pinned = one.pin();
    assert!(matches!(
        one.lease(1, &[1; 16]),
        Err(DmaError::InvalidArgument(_))
    ));
    let peer = pinned.resolve(1, &[1; 16]).expect("client 1");
    let foreign = two.pin();
    assert!(matches!(
        foreign.lease(peer),
        Err(DmaError::InvalidArgument(_))
    ));
    assert_eq!(0, two.stats().leases);
    assert!(matches!(
        one.lease(1, &[1; 3]),
        Err(DmaError::InvalidArgument(_))
    ));
    drop(pinned);
    assert!(matches!(
        one.lease(1, &[1; 3]),
        Err(DmaError::InvalidAddress(_))
    ));
}
