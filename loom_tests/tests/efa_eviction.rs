//! An efa stale incarnation evicted while a reader still holds the old one: the new insert waits
//! for the old removal, and the AV never holds two entries for one (GID, QPN).
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, AvEvent, DmaError, ModelAv};
use loom_tests::efa;

#[test]
fn a_recycled_slot_waits_for_the_old_incarnations_readers() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Efa, 32, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        let old = efa(1, 7, 1);
        let new = efa(1, 7, 2);
        cache.pin().resolve(1, &old).expect("old incarnation");

        let reader = {
            let (cache, av, old) = (cache.clone(), av.clone(), old.clone());
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                if let Ok(peer) = pinned.try_resolve(1, &old) {
                    loom::thread::yield_now();
                    assert_eq!(
                        Some(old),
                        av.lookup(peer.fi_addr()),
                        "the old entry left under a pin"
                    );
                }
            })
        };

        let result = cache.pin().resolve(2, &new).map(|peer| peer.fi_addr());
        assert_eq!(
            Err(DmaError::WouldBlock),
            result,
            "parked behind the old removal"
        );
        reader.join().expect("reader");
        cache.quiesce();

        let events = av.events();
        let removed = events
            .iter()
            .position(|event| matches!(event, AvEvent::Removed { address, .. } if *address == old));
        let inserted = events.iter().position(
            |event| matches!(event, AvEvent::Inserted { address, .. } if *address == new),
        );
        // If the reader's hit came after the eviction, its miss re-advertised the old
        // incarnation after the new one, and the last word wins: the old one is revived and the
        // new one never enters. Otherwise the new one enters, strictly after the old one left.
        if let Some(inserted) = inserted {
            assert!(
                matches!(removed, Some(removed) if removed < inserted),
                "{events:?} {:?}",
                cache.stats()
            );
        }
        assert!(av.violations().is_empty(), "{:?}", av.violations());
        cache.release(1);
        cache.release(2);
        cache.quiesce();
        assert!(av.is_empty(), "{:?}", av.events());
    });
}
