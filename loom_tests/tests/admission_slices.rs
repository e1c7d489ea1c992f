//! An admission published a slice a round (one registration a round under loom), racing the
//! release of one of its clients: the index never names an entry for a client that no longer
//! holds it, and every client that still holds it is published by the time `quiesce` returns.
#![cfg(dma_loom)]

use dma_libfabric::{AddressFormat, DmaError};
use loom_tests::efa;

loom_tests::static_world!(WORLD, AddressFormat::Efa, 32);

#[test]
fn a_client_released_during_its_admission_is_never_published() {
    // Four parked clients and three releases make long executions: more branches than loom's
    // default allows.
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(|| {
        let (av, cache) = &*WORLD;
        let (old, new) = (efa(1, 7, 1), efa(1, 7, 2));
        let lease = cache.lease(1, &old).expect("the old incarnation");
        // Four clients park behind it (none waits: all are published by slices, one a round; the
        // admission's round publishes two, so two are left for later rounds whatever the order).
        for client in [2, 3, 4, 5] {
            assert_eq!(
                Err(DmaError::WouldBlock),
                cache.pin().resolve(client, &new).map(|peer| peer.fi_addr()),
                "parked behind the leased incarnation"
            );
        }
        let completion = loom::thread::spawn(move || drop(lease));
        for client in [3, 4, 5] {
            cache.release(client);
        }
        completion.join().expect("completion");
        cache.quiesce();
        assert_eq!(
            1,
            cache.stats().clients,
            "client 2 alone holds the new incarnation"
        );
        // Client 2's registration is published: a hit, no miss.
        let misses = cache.stats().misses;
        let peer = cache
            .pin()
            .try_resolve(2, &new)
            .map(|peer| peer.fi_addr())
            .expect("client 2's registration is published");
        assert_eq!(Some(new.clone()), av.lookup(peer));
        assert_eq!(misses, cache.stats().misses, "client 2 hit");
        // Clients 3 to 5 were released: no hit may find them.
        for client in [3, 4, 5] {
            assert!(
                matches!(
                    cache.pin().try_resolve(client, &new),
                    Err(DmaError::WouldBlock | DmaError::Busy)
                ),
                "client {client} was released, and found by a hit"
            );
        }
        for client in [2, 3, 4, 5] {
            cache.release(client);
        }
        cache.quiesce();
        assert!(av.is_empty(), "{:?}", av.events());
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
