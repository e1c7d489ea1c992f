//! Two clients on one entry, one releasing while the other resolves: the entry survives, and is
//! never removed twice.
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
            loom::thread::spawn(move || cache.release(1))
        };
        {
            let pinned = cache.pin();
            let peer = pinned
                .resolve(2, &opaque(1))
                .expect("client 2 still holds it");
            assert_eq!(shared, peer.fi_addr());
            assert_eq!(Some(opaque(1)), av.lookup(peer.fi_addr()));
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
