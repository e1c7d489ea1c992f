//! The cache core at its edges: a lease counter at its bound, a lease call that waits on the
//! caller's own lease (ended by the patience), removals held by leases reported by the last drop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use testkit::{efa, opaque, tcp};

#[test]
fn a_lease_past_the_bound_is_refused_and_changes_nothing() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let address = endpoint.local_address().expect("an address");
    let pinned = cache.pin();
    let peer = pinned.resolve(1, &address).expect("a miss");
    let lease = pinned.lease(peer).expect("a lease");
    let limit = AddressCache::<dma_libfabric::FabricAv>::LEASE_LIMIT;
    cache.force_lease_count(peer.fi_addr(), limit);

    let refused = pinned.lease(peer);
    assert!(
        matches!(&refused, Err(DmaError::InvalidArgument(why)) if why.contains("leases are out")),
        "{refused:?}"
    );
    assert_eq!(
        u64::from(limit),
        cache.stats().leases,
        "the refusal took nothing"
    );

    // At the bound the entry is still held: released and quiesced, it stays in the AV.
    drop(pinned);
    cache.release(1);
    cache.quiesce_with_patience(std::time::Duration::ZERO);
    assert_eq!(1, cache.stats().removals_awaiting_leases);
    assert_eq!(
        Some(address[..cache.address_len()].to_vec()),
        endpoint.lookup(lease.fi_addr()).expect("lookup"),
        "the provider's address: the seal is not the AV's"
    );

    // Back to the one real lease, whose drop lets the removal run.
    cache.force_lease_count(lease.fi_addr(), 1);
    drop(lease);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 1),
        (stats.leases, stats.pending_removals, stats.removes)
    );
}

#[test]
fn a_clone_past_the_bound_aborts_instead_of_wrapping() {
    let Some(output) = testkit::child_output("a_clone_past_the_bound_aborts_instead_of_wrapping")
    else {
        let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
        let lease = cache.lease(1, &opaque(1)).expect("a lease");
        cache.force_lease_count(lease.fi_addr(), AddressCache::<ModelAv>::LEASE_LIMIT);
        // Leaked clones got the counter here; one more must not carry on.
        let clone = lease.clone();
        std::mem::forget(clone);
        println!("the clone returned");
        return;
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stdout.contains("the clone returned"),
        "the clone past the bound returned:\n{stdout}"
    );
    // SIGABRT, or libfabric's own signal handler (installed in this binary by the tests that
    // open endpoints) reporting it and exiting with status 1.
    let signal = std::os::unix::process::ExitStatusExt::signal(&output.status);
    assert!(
        signal == Some(SIGABRT) || stderr.contains(&format!("terminated with signal {SIGABRT}")),
        "the child aborts: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
}

/// The signal `std::process::abort` raises.
const SIGABRT: i32 = 6;

#[test]
fn clones_below_the_bound_count_and_keep_the_entry() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let lease = cache.lease(1, &opaque(1)).expect("a lease");
    let fi_addr = lease.fi_addr();
    let clones: Vec<_> = (0..1_000).map(|_| lease.clone()).collect();
    assert_eq!(1_001, cache.stats().leases);
    drop(lease);
    cache.release(1);
    cache.quiesce_with_patience(std::time::Duration::ZERO);
    assert_eq!(Some(opaque(1)), av.lookup(fi_addr), "the clones hold it");
    drop(clones);
    cache.quiesce();
    assert!(av.is_empty(), "the last clone's drop let the removal run");
}

/// The patience of the tests whose wait is meant to end at it, on a lease or pin the test holds.
/// The answer is the writer's, which names the leases (or, for `quiesce`, comes once the writer
/// has applied what came before), when it comes before the caller's own bound one patience
/// later: this is also how long a loaded machine may keep the background thread off a core
/// before the verdict changes. 100 ms was a time slice or two beside two builds on two cores.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

#[test]
fn lease_on_a_thread_that_holds_the_old_incarnations_lease_ends_at_the_patience() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone()).with_patience(PATIENCE);
    let old = cache.lease(1, &efa(1, 7, 1)).expect("the old incarnation");

    // The same slot advertised with a new QKEY: its entry waits for the old one's removal, which
    // waits for `old`, which this thread holds. The wait ends at the patience.
    let refused = cache.lease(2, &efa(1, 7, 2));
    assert!(
        matches!(
            &refused,
            Err(DmaError::OutOfPatience {
                client: 2,
                leases: 1,
                ..
            })
        ),
        "{refused:?}"
    );

    // Once this thread lets go, the queued request gets in and the same call answers (again
    // while the removal, no longer held, is still on its way on a loaded machine).
    drop(old);
    let new = testkit::once_admitted("the retry", || cache.lease(2, &efa(1, 7, 2)))
        .expect("the new incarnation");
    assert_eq!(Some(efa(1, 7, 2)), av.lookup(new.fi_addr()));
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn lease_waits_for_an_old_incarnations_lease_held_on_another_thread() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let evicted = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (leased, held) = std::sync::mpsc::channel();
        let cache = &cache;
        let evicted = &evicted;
        scope.spawn(move || {
            let old = cache.lease(1, &efa(1, 7, 1)).expect("the old incarnation");
            leased.send(old.fi_addr()).expect("the test waits");
            // A completion thread: it drops its lease once the new incarnation is parked
            // behind it, which the writer counts as an eviction.
            while cache.stats().evictions == 0 {
                std::thread::yield_now();
            }
            evicted.store(true, Ordering::Relaxed);
            drop(old);
        });
        let old = held.recv().expect("the old lease");
        let new = cache
            .lease(2, &efa(1, 7, 2))
            .expect("waited for the other thread");
        assert!(evicted.load(Ordering::Relaxed), "it waited for the drop");
        assert_eq!(
            old,
            new.fi_addr(),
            "the new incarnation took the old index back"
        );
        assert_eq!(Some(efa(1, 7, 2)), av.lookup(new.fi_addr()));
    });
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn many_removals_held_by_leases_are_each_reported_by_their_last_drop() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let leases: Vec<_> = (0..2_000u32)
        .map(|client| {
            let lease = cache
                .lease(u64::from(client), &testkit::sockaddr(client))
                .expect("a lease");
            (lease.clone(), lease)
        })
        .collect();
    for client in 0..2_000 {
        cache.release(client);
    }
    cache.quiesce_with_patience(std::time::Duration::ZERO);
    assert_eq!(2_000, cache.stats().removals_awaiting_leases);
    assert_eq!(2_000, cache.stats().pending_removals);

    // Dropping one of each pair reports nothing: the other still holds.
    let (firsts, seconds): (Vec<_>, Vec<_>) = leases.into_iter().unzip();
    drop(firsts);
    cache.quiesce_with_patience(std::time::Duration::ZERO);
    assert_eq!(2_000, cache.stats().removals_awaiting_leases);

    drop(seconds);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0, 2_000),
        (
            stats.removals_awaiting_leases,
            stats.pending_removals,
            stats.leases,
            stats.removes
        )
    );
    assert!(av.is_empty());
}

#[test]
fn a_lease_taken_here_and_dropped_on_another_thread_does_not_refuse_a_wait_here() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let old = cache.lease(1, &efa(3, 5, 1)).expect("the old incarnation");
    std::thread::scope(|scope| {
        let (drop_now, signal) = std::sync::mpsc::channel::<()>();
        let completion = scope.spawn(move || {
            signal.recv().expect("the signal");
            drop(old);
        });
        // Taken here, dropped there, before or while this thread waits: the wait ends at that
        // drop, with the new incarnation (no refusal for a lease that merely was taken here).
        drop_now.send(()).expect("the completion thread");
        let new = cache.lease(2, &efa(3, 5, 2)).expect("admitted");
        assert_eq!(Some(efa(3, 5, 2)), av.lookup(new.fi_addr()));
        completion.join().expect("dropped");
    });
}

#[test]
fn a_backend_with_an_absurd_capacity_is_used_up_to_the_bound() {
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, usize::MAX);
    let cache = AddressCache::with_backend(av.clone());
    let peer = cache
        .pin()
        .resolve(1, &opaque(1))
        .expect("a miss")
        .fi_addr();
    assert_eq!(Some(opaque(1)), av.lookup(peer));
}

#[test]
fn quiesce_with_endless_patience_never_waits_on_the_callers_own_pin_or_lease() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone()).with_patience(PATIENCE);

    // A pin of this thread holds a removal back: endless patience would wait for ever.
    let pinned = cache.pin();
    pinned.resolve(1, &opaque(1)).expect("a miss");
    cache.release(1);
    cache.quiesce_with_patience(std::time::Duration::MAX);
    assert_eq!(
        1,
        cache.stats().pending_removals,
        "held back by this thread's pin"
    );
    drop(pinned);
    cache.quiesce();
    assert_eq!(0, cache.stats().pending_removals);

    // A lease this thread took holds a removal back: the wait ends at the cache's patience.
    let lease = cache.lease(2, &opaque(2)).expect("a lease");
    cache.release(2);
    cache.quiesce_with_patience(std::time::Duration::MAX);
    assert_eq!(
        1,
        cache.stats().removals_awaiting_leases,
        "held by this thread's lease"
    );
    drop(lease);
    cache.quiesce();
    assert!(av.is_empty());
}

#[test]
fn lease_within_endless_timeout_waits_no_longer_than_the_patience() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone()).with_patience(PATIENCE);
    let old = cache.lease(1, &efa(5, 1, 1)).expect("the old incarnation");
    // `Duration::MAX` is the patience, and the wait is on `old`.
    let refused = cache.lease_within(2, &efa(5, 1, 2), std::time::Duration::MAX);
    assert!(
        matches!(&refused, Err(DmaError::OutOfPatience { client: 2, .. })),
        "{refused:?}"
    );
    drop(old);
    let new = testkit::once_admitted("the retry", || {
        cache.lease_within(2, &efa(5, 1, 2), std::time::Duration::MAX)
    })
    .expect("admitted once the old lease is gone");
    assert_eq!(Some(efa(5, 1, 2)), av.lookup(new.fi_addr()));
}
