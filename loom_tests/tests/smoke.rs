//! The smallest model: one client in and out, no concurrency but the writer's.
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use loom_tests::opaque;

#[test]
fn a_release_is_removed_by_quiesce() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = AddressCache::with_backend(av.clone());
        cache.pin().resolve(1, &opaque(1)).expect("A");
        cache.release(1);
        cache.quiesce();
        assert!(av.is_empty(), "{:?} {:?}", av.events(), cache.stats());
    });
}

#[test]
fn a_reader_that_pinned_once_does_not_hold_back_removal() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));
        cache.pin().resolve(1, &opaque(1)).expect("A");
        let reader = {
            let cache = cache.clone();
            loom::thread::spawn(move || drop(cache.pin()))
        };
        reader.join().expect("reader");
        cache.release(1);
        cache.quiesce();
        let first = cache.stats();
        cache.quiesce();
        assert!(
            av.is_empty(),
            "{:?} {:?} {:?}",
            av.events(),
            first,
            cache.stats()
        );
    });
}
