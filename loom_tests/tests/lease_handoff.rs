//! A lease taken under a pin on one thread, racing the release of its client, and dropped on
//! another thread after the pin has gone: the entry's removal waits for the drop, however often
//! the epoch moves on meanwhile (invariants 1 and 2 for leases).
#![cfg(dma_loom)]

use dma_libfabric::{AddressFormat, Lease};
use loom_tests::opaque;

loom_tests::static_world!(WORLD, AddressFormat::Opaque, 16);

#[test]
fn a_lease_handed_to_another_thread_holds_the_removal_back() {
    loom::model(|| {
        let (av, cache) = &*WORLD;
        cache.pin().resolve(1, &opaque(1)).expect("X");

        // The posting thread: leases X under its pin if it still finds it, unpins, and hands the
        // lease over.
        let (handoff, handed) = loom::sync::mpsc::channel::<Option<Lease<'static>>>();
        let poster = loom::thread::spawn(move || {
            let (_, cache) = &*WORLD;
            let pinned = cache.pin();
            let lease = match pinned.try_resolve(1, &opaque(1)) {
                Ok(peer) => Some(pinned.lease(peer).expect("lease")),
                // The release came first; the miss is queued and registers client 1 again.
                Err(_) => None,
            };
            drop(pinned);
            handoff.send(lease).expect("handoff");
        });

        cache.release(1);
        // Moves the epoch on while the poster may be pinned or hold the lease.
        cache.quiesce();

        // The completion thread: holds the lease across more epoch moves, then drops it.
        if let Some(lease) = handed.recv().expect("poster") {
            cache.quiesce();
            assert_eq!(
                Some(opaque(1)),
                av.lookup(lease.fi_addr()),
                "X left the AV under a lease: {:?}",
                av.events()
            );
            assert_eq!(0, av.removes(), "removed under a lease");
            let stats = cache.stats();
            assert_eq!(
                (1, 1, 1),
                (
                    stats.leases,
                    stats.pending_removals,
                    stats.removals_awaiting_leases
                ),
                "the readers are gone; only the lease holds X: {stats:?}"
            );
            drop(lease);
        }
        poster.join().expect("poster");

        cache.release(1);
        cache.quiesce();
        let stats = cache.stats();
        assert!(av.is_empty(), "{:?} {stats:?}", av.events());
        assert_eq!(av.inserts(), av.removes());
        assert_eq!((0, 0), (stats.leases, stats.pending_removals));
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
