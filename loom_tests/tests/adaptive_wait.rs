//! A blocking miss's waiter deciding whether to spin for its answer while the writer parks: the
//! waiter reads the writer's state (awake or parked) between its polls, and the writer publishes
//! `PARKED` before it blocks on its inbox, at any point of the waiter's spin. Two blocking misses
//! from two threads, so the writer goes from applying to parked and back while a waiter spins.
//! Whatever the waiter reads, each miss gets its own answer, and nothing is lost or doubled.
#![cfg(dma_loom)]

use dma_libfabric::{AddressCache, AddressFormat, ModelAv};
use loom_tests::opaque;

#[test]
fn a_waiter_that_decides_to_spin_while_the_writer_parks_still_gets_its_answer() {
    loom::model(|| {
        let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 4);
        let cache = loom::sync::Arc::new(AddressCache::with_backend(av.clone()));

        let other = {
            let cache = cache.clone();
            loom::thread::spawn(move || {
                let pinned = cache.pin();
                pinned
                    .resolve(2, &opaque(2))
                    .map(|peer| peer.fi_addr())
                    .expect("client 2's miss is answered")
            })
        };
        let mine = {
            let pinned = cache.pin();
            pinned
                .resolve(1, &opaque(1))
                .map(|peer| peer.fi_addr())
                .expect("client 1's miss is answered")
        };
        let theirs = other.join().expect("the other waiter");

        assert_ne!(mine, theirs, "two clients, two entries");
        assert_eq!(Some(opaque(1)), av.lookup(mine), "client 1's own answer");
        assert_eq!(Some(opaque(2)), av.lookup(theirs), "client 2's own answer");
        let stats = cache.stats();
        assert_eq!((2, 2), (stats.entries, stats.clients));
        assert_eq!(2, av.inserts(), "each miss inserted once");
    });
}
