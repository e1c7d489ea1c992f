//! A blocking lease whose new efa incarnation is parked behind an old one's lease, with a
//! patience of zero, racing the drop of that lease on another thread: the waiter gets exactly
//! one answer, either the lease on the new incarnation or `OutOfPatience`, and the error is only
//! ever given while the old incarnation is still held (the writer tries the removal once more
//! before it gives up on a waiter). Either way the waiter can retry once the lease is gone and
//! get in (the patience rule of `AddressCache::lease`).
#![cfg(dma_loom)]

use std::time::Duration;

use dma_libfabric::{AddressFormat, DmaError};
use loom_tests::efa;

loom_tests::static_world!(WORLD, AddressFormat::Efa, 32, Duration::ZERO);

#[test]
fn a_lease_drop_racing_the_patience_gives_the_waiter_exactly_one_answer() {
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("DMA_LOOM_FULL").is_none() {
        builder.preemption_bound = Some(builder.preemption_bound.map_or(1, |bound| bound.min(1)));
    }
    builder.check(|| {
        let (av, cache) = &*WORLD;
        let (old, new) = (efa(1, 7, 1), efa(1, 7, 2));
        let lease = cache.lease(1, &old).expect("the old incarnation");
        cache.release(1);
        // The readers are gone; only the lease holds the old incarnation.
        cache.quiesce();
        assert_eq!(
            1,
            cache.stats().removals_awaiting_leases,
            "{:?}",
            cache.stats()
        );

        // The completion thread drops the lease while the waiter's patience runs out.
        let completion = loom::thread::spawn(move || drop(lease));
        let waited = cache.lease(2, &new).map(|lease| lease.fi_addr());
        match waited {
            Ok(fi_addr) => assert_eq!(Some(new.clone()), av.lookup(fi_addr), "admitted"),
            Err(DmaError::OutOfPatience { client, leases, .. }) => {
                assert_eq!(2, client);
                assert!(
                    leases >= 1,
                    "the error was given for a wait that could end now: {:?}",
                    av.events()
                );
            }
            Err(error) => panic!("neither the lease nor the patience's error: {error:?}"),
        }
        completion.join().expect("completion");

        // The lease is gone: a retry gets in, whichever answer came first.
        let lease = cache
            .lease(2, &new)
            .expect("admitted once the lease is gone");
        assert_eq!(Some(new), av.lookup(lease.fi_addr()));
        drop(lease);
        cache.release(2);
        cache.quiesce();
        assert!(av.is_empty(), "{:?}", av.events());
        assert!(av.violations().is_empty(), "{:?}", av.violations());
    });
}
