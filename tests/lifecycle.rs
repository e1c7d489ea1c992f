//! Shutdown, and a writer that dies.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::{Arc, Mutex};

use common::{efa, sockaddr, tcp};
use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressCache, AddressFormat, DmaError, FabricAv, ModelAv};
use testkit::{Observed, Observer};

/// Counts what reaches the real AV under a second cache.
struct Counted {
    calls: Arc<Mutex<(u64, u64)>>,
}

impl Observer for Counted {
    fn after_insert(&mut self, result: &Result<fi_addr_t, DmaError>) {
        if result.is_ok() {
            self.calls.lock().expect("counts").0 += 1;
        }
    }
    fn after_remove(&mut self, _: fi_addr_t, result: &Result<(), DmaError>) {
        if result.is_ok() {
            self.calls.lock().expect("counts").1 += 1;
        }
    }
}

/// Dropping a cache with entries still held, and removals still pending, runs every removal:
/// the real AV hands out index 0 again afterwards.
#[test]
fn dropping_the_cache_removes_everything_from_the_real_av() {
    let endpoint = tcp();
    let calls = Arc::new(Mutex::new((0, 0)));
    {
        // SAFETY: the endpoint's AV stays open until after this cache drops, at the end of this
        // block, and only this cache inserts into it.
        let av = unsafe {
            FabricAv::from_raw(
                endpoint.address_vector(),
                endpoint.describe().addr_format,
                16,
                64,
            )
        };
        let cache = AddressCache::with_backend(Observed {
            av,
            observer: Counted {
                calls: Arc::clone(&calls),
            },
        });
        for client in 0..10 {
            cache
                .pin()
                .resolve(client, &sockaddr(client as u32))
                .expect("resolve");
        }
        let reader = cache.pin();
        reader.resolve(0, &sockaddr(0)).expect("a hit");
        cache.release(0);
        cache.quiesce();
        assert_eq!(1, cache.stats().pending_removals, "held back by the reader");
        drop(reader);
    }
    assert_eq!(
        (10, 10),
        *calls.lock().expect("counts"),
        "every insert matched by one remove"
    );
    let pinned = endpoint.cache().pin();
    let fresh = pinned.resolve(1, &sockaddr(100)).expect("fresh").fi_addr();
    assert_eq!(0, fresh, "the real AV is empty again");
}

/// The endpoint's own cache is dropped before the endpoint closes its AV; dropping an endpoint
/// with entries held and pending is clean (and would crash or leak otherwise).
#[test]
fn dropping_an_endpoint_with_entries_held_is_clean() {
    for _ in 0..20 {
        let endpoint = tcp();
        let cache = endpoint.cache();
        for client in 0..20 {
            cache
                .pin()
                .resolve(client, &sockaddr(client as u32))
                .expect("resolve");
        }
        for client in 0..10 {
            cache.release(client);
        }
    }
}

#[test]
fn dropping_a_model_cache_removes_live_and_pending_entries() {
    let av = ModelAv::new(AddressFormat::Efa);
    {
        let cache = AddressCache::with_backend(av.clone());
        cache.pin().resolve(1, &efa(1, 1, 1)).expect("one");
        cache.pin().resolve(2, &efa(1, 2, 1)).expect("two");
        // An eviction with the new incarnation parked behind it.
        let reader = cache.pin();
        assert_eq!(
            Err(DmaError::WouldBlock),
            reader.resolve(3, &efa(1, 2, 2)).map(|peer| peer.fi_addr())
        );
        drop(reader);
    }
    assert!(av.is_empty(), "{:?}", av.events());
    assert_eq!(av.inserts(), av.removes());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

/// A writer that dies leaves callers with `Closed`, never a hang.
#[test]
fn a_dead_writer_is_closed_not_a_hang() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let held = cache
        .pin()
        .resolve(1, &sockaddr(1))
        .expect("before")
        .fi_addr();

    av.panic_on_next_call();
    let pinned = cache.pin();
    assert_eq!(
        Err(DmaError::Closed),
        pinned.resolve(2, &sockaddr(2)).map(|peer| peer.fi_addr())
    );
    assert_eq!(
        Err(DmaError::Closed),
        pinned.resolve(3, &sockaddr(3)).map(|peer| peer.fi_addr())
    );
    assert_eq!(
        Err(DmaError::Closed),
        pinned
            .try_resolve(3, &sockaddr(3))
            .map(|peer| peer.fi_addr())
    );
    // What was published stays usable: its entry is still in the AV.
    assert_eq!(
        held,
        pinned.resolve(1, &sockaddr(1)).expect("a hit").fi_addr()
    );
    drop(pinned);
    cache.release(1);
    cache.quiesce();
    assert!(DmaError::Closed.to_string().contains("closed"));
}

/// An insert the AV refuses after a parked wait is logged, its clients miss again, and the cache
/// carries on.
#[test]
fn the_cache_carries_on_after_a_failed_insert_of_a_parked_incarnation() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    cache.pin().resolve(1, &efa(1, 1, 1)).expect("old");
    cache.pin().resolve(2, &efa(1, 1, 1)).expect("old, shared");
    av.fail_next_insert(DmaError::Fabric {
        call: "fi_av_insert",
        code: -12,
        message: "injected".into(),
    });
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .resolve(3, &efa(1, 1, 2))
            .map(|peer| peer.fi_addr())
    );
    cache.quiesce();
    // The parked insert failed; client 3 simply misses again and gets in this time.
    assert_eq!(0, cache.stats().entries);
    let peer = cache.pin().resolve(3, &efa(1, 1, 2)).expect("in").fi_addr();
    assert_eq!(Some(efa(1, 1, 2)), av.lookup(peer));
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}
