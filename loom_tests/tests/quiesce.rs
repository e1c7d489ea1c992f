//! `quiesce` racing a reader and a release: it never deadlocks, and once the reader has gone it
//! returns only with nothing removable pending.
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use loom_tests::opaque;

#[test]
fn quiesce_returns_and_leaves_nothing_removable() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        cache.pin().resolve(1, &opaque(1)).expect("A");

        let reader = {
            let cache = cache.clone();
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                let _ = pinned.try_resolve(1, &opaque(1));
            })
        };
        cache.release(1);
        // Racing the reader: may return with the removal still held back, never hang.
        cache.quiesce();
        reader.join().expect("reader");

        // The reader may have re-registered client 1 (its miss was queued); let it go too.
        cache.release(1);
        cache.quiesce();
        assert_eq!(
            0,
            cache.stats().pending_removals,
            "nothing held back any more"
        );
        assert!(av.is_empty(), "{:?}", av.events());
        assert_eq!(av.inserts(), av.removes());
    });
}
