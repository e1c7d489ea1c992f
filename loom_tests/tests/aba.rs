//! A reader pinned on entry X while the last holder releases, another client inserts, and a
//! second retirement moves the epoch on again: the new address never gets X while the pin lives,
//! and X's removal runs only after the unpin (invariants 1 and 2).
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use loom_tests::opaque;

#[test]
fn a_pinned_reader_keeps_its_index_from_reuse() {
    // One preemption: the second retirement under the reader's pin multiplies the interleavings,
    // and at two this model alone runs for many minutes (see the README). DMA_LOOM_FULL=1 lifts
    // the cap.
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("DMA_LOOM_FULL").is_none() {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(1, |bound| bound.min(1)));
    }
    builder.check(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        let x = cache.pin().resolve(1, &opaque(1)).expect("A").fi_addr();

        let reader = {
            let (cache, av) = (cache.clone(), av.clone());
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                if let Ok(peer) = pinned.try_resolve(1, &opaque(1)) {
                    loom::thread::yield_now();
                    assert_eq!(
                        Some(opaque(1)),
                        av.lookup(peer.fi_addr()),
                        "X was reused under the pin"
                    );
                }
            })
        };

        // Each retirement flushes and tries to move the epoch on, and so does the pin of the
        // resolve: three times while the reader may hold X.
        cache.release(1);
        let y = cache.pin().resolve(2, &opaque(2)).expect("B").fi_addr();
        assert_eq!(Some(opaque(2)), av.lookup(y));
        cache.release(2);
        reader.join().expect("reader");

        cache.release(1);
        cache.release(2);
        cache.quiesce();
        assert!(av.is_empty(), "{:?} {:?}", av.events(), cache.stats());
        assert_eq!(av.inserts(), av.removes());
        assert!(av.violations().is_empty(), "{:?}", av.violations());
        let _ = x;
    });
}
