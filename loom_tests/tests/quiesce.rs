//! `quiesce` racing a reader that holds the entry and a release: it never deadlocks, never removes
//! the entry under the reader (whose pin it keeps moving the epoch against), and once the reader
//! has gone it returns only with nothing removable pending.
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
            let (cache, av) = (cache.clone(), av.clone());
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                if let Ok(peer) = pinned.try_resolve(1, &opaque(1)) {
                    loom::thread::yield_now();
                    assert_eq!(
                        Some(opaque(1)),
                        av.lookup(peer.fi_addr()),
                        "removed under the pin"
                    );
                }
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
