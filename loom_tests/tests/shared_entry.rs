//! Two clients on one entry, one releasing (and quiescing, so the epoch moves on) while the other
//! resolves and holds it: the entry survives, stays in the AV under the holder's pin, and is never
//! removed twice.
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use loom_tests::opaque;

#[test]
fn a_release_never_takes_an_entry_another_client_holds() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        let shared = cache
            .pin()
            .resolve(1, &opaque(1))
            .expect("client 1")
            .fi_addr();
        cache.pin().resolve(2, &opaque(1)).expect("client 2");

        let leaving = {
            let cache = cache.clone();
            loom::thread::spawn(move || {
                cache.release(1);
                // Moves the epoch on while client 2's reader may hold the entry.
                cache.quiesce();
            })
        };
        {
            let pinned = cache.pin();
            let peer = pinned
                .resolve(2, &opaque(1))
                .expect("client 2 still holds it");
            assert_eq!(shared, peer.fi_addr());
            loom::thread::yield_now();
            assert_eq!(
                Some(opaque(1)),
                av.lookup(peer.fi_addr()),
                "removed under client 2's pin"
            );
        }
        leaving.join().expect("release");

        cache.quiesce();
        assert_eq!(
            (1, 0),
            (av.len(), av.removes()),
            "client 2 still holds the entry"
        );
        cache.release(2);
        cache.quiesce();
        assert_eq!((1, 1), (av.inserts(), av.removes()), "removed once");
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
