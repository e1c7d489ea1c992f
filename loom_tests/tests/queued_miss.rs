//! `try_resolve`'s queued miss racing a release of the same client: whichever the writer applies
//! last wins, and the accounting holds either way.
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use loom_tests::opaque;

#[test]
fn a_queued_miss_and_a_release_leave_consistent_accounting() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));

        let resolver = {
            let cache = cache.clone();
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                let result = pinned.try_resolve(1, &opaque(1)).map(|peer| peer.fi_addr());
                assert_eq!(
                    Err(DmaError::WouldBlock),
                    result,
                    "a first resolve is a miss"
                );
            })
        };
        cache.release(1);
        resolver.join().expect("resolver");
        cache.quiesce();

        let stats = cache.stats();
        assert_eq!(stats.entries, av.len() as u64, "the cache and the AV agree");
        assert_eq!(stats.clients, stats.entries, "client 1 at most once");
        assert_eq!(av.inserts() - av.removes(), stats.entries);
        if 1 == stats.entries {
            let pinned = cache.pin();
            let peer = pinned
                .try_resolve(1, &opaque(1))
                .expect("registered, so a hit");
            assert_eq!(Some(opaque(1)), av.lookup(peer.fi_addr()));
        }
        cache.release(1);
        cache.quiesce();
        assert!(av.is_empty(), "{:?}", av.events());
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
