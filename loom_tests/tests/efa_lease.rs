//! A recycled efa slot whose old incarnation is leased: the new QKEY evicts the old incarnation
//! and parks, and enters the AV only after the lease, dropped on another thread, lets the old
//! one's removal run (invariants 1 to 3 for leases).
#![cfg(dma_loom)]

use dma_libfabric::{AddressFormat, AvEvent, DmaError};
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom_tests::efa;

loom_tests::static_world!(WORLD, AddressFormat::Efa, 32);

#[test]
fn a_new_incarnation_waits_for_the_old_ones_lease() {
    loom::model(|| {
        let (av, cache) = &*WORLD;
        let (old, new) = (efa(1, 7, 1), efa(1, 7, 2));
        let lease = {
            let pinned = cache.pin();
            let peer = pinned.resolve(1, &old).expect("old incarnation");
            pinned.lease(peer).expect("lease")
        };

        // The completion thread: reads the operation's completion, then drops the lease.
        let completed = Arc::new(AtomicBool::new(false));
        let completion = {
            let completed = completed.clone();
            loom::thread::spawn(move || {
                let (av, _) = &*WORLD;
                assert_eq!(
                    Some(efa(1, 7, 1)),
                    av.lookup(lease.fi_addr()),
                    "the old incarnation left the AV under its lease: {:?}",
                    av.events()
                );
                // Relaxed: the lease's drop is what must publish it.
                completed.store(true, Ordering::Relaxed);
                drop(lease);
            })
        };

        let result = cache.pin().resolve(2, &new).map(|peer| peer.fi_addr());
        assert_eq!(
            Err(DmaError::WouldBlock),
            result,
            "parked behind the old incarnation"
        );
        // Moves the epoch on while the lease may still be out.
        cache.quiesce();
        let events = av.events();
        let removed = events
            .iter()
            .position(|event| matches!(event, AvEvent::Removed { address, .. } if *address == old));
        let inserted = events.iter().position(
            |event| matches!(event, AvEvent::Inserted { address, .. } if *address == new),
        );
        if let Some(inserted) = inserted {
            assert!(
                matches!(removed, Some(removed) if removed < inserted),
                "{events:?}"
            );
        }
        if removed.is_some() {
            assert!(
                completed.load(Ordering::Relaxed),
                "fi_av_remove does not happen after the lease holder's work: {events:?}"
            );
        }
        assert!(av.violations().is_empty(), "{:?}", av.violations());
        completion.join().expect("completion");

        // The lease is gone and nobody is pinned: the new incarnation gets in.
        cache.quiesce();
        let lease = cache.lease(2, &new).expect("admitted");
        assert_eq!(Some(new), av.lookup(lease.fi_addr()));
        drop(lease);
        cache.release(2);
        cache.quiesce();
        let stats = cache.stats();
        assert!(av.is_empty(), "{:?} {stats:?}", av.events());
        assert_eq!(av.inserts(), av.removes());
        assert_eq!((0, 0), (stats.leases, stats.pending_removals));
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
