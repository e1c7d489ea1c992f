//! An efa stale incarnation evicted while a reader still holds the old one, and another entry
//! retired meanwhile, so the epoch moves on twice under the reader: the new insert waits for the
//! old removal, and the AV never holds two entries for one (GID, QPN).
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, AvEvent, DmaError, ModelAv};
use loom_tests::efa;

#[test]
fn a_recycled_slot_waits_for_the_old_incarnations_readers() {
    // One preemption: the second retirement under the reader's pin multiplies the interleavings,
    // and at two this model alone runs for many minutes (see the README). DMA_LOOM_FULL=1 lifts
    // the cap.
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("DMA_LOOM_FULL").is_none() {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(1, |bound| bound.min(1)));
    }
    builder.check(|| {
        let av = ModelAv::with_layout(AddressFormat::Efa, 32, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        let old = efa(1, 7, 1);
        let new = efa(1, 7, 2);
        cache.pin().resolve(1, &old).expect("old incarnation");
        cache.pin().resolve(3, &efa(2, 9, 1)).expect("another peer");

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
        // The eviction's retirement moved the epoch on; this one moves it on again while the
        // reader may hold the old incarnation.
        cache.release(3);
        assert!(av.violations().is_empty(), "{:?}", av.violations());
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
