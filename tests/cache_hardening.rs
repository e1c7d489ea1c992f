//! The cache's side of hardening: a bounded inbox, `quiesce` under a flood, the outcome of a
//! queued miss, and a failing `fi_av_remove`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use common::{efa, sockaddr, tcp_with_capacity};
use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use testkit::Gate;
use testkit::Observed;

#[test]
fn a_flood_of_queued_misses_is_bounded_by_the_inbox() {
    let (open, gate) = mpsc::channel();
    let (entered, inside) = mpsc::sync_channel(1);
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 100_000);
    let cache = AddressCache::with_backend(Observed {
        av,
        observer: Gate {
            go: Some(gate),
            entered,
        },
    });
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            cache
                .pin()
                .resolve(0, &[0xa5; 16])
                .map(|peer| peer.fi_addr())
        });
        inside
            .recv()
            .expect("the writer is held inside its first insert");
        // The writer takes nothing more: every try_resolve below queues, until the inbox is
        // full; then each answers Busy, queuing nothing.
        let bound = AddressCache::<ModelAv>::INBOX_BOUND;
        let flood = 3 * bound;
        for client in 1..=flood as u64 {
            let mut address = [0_u8; 16];
            address[..8].copy_from_slice(&client.to_ne_bytes());
            let expected = if client as usize <= bound {
                DmaError::WouldBlock
            } else {
                DmaError::Busy
            };
            assert_eq!(
                Err(expected),
                cache
                    .pin()
                    .try_resolve(client, &address)
                    .map(|peer| peer.fi_addr())
            );
        }
        open.send(()).expect("the writer");
        first.join().expect("first").expect("the first miss");
    });
    cache.quiesce();
    assert_eq!(
        1 + AddressCache::<ModelAv>::INBOX_BOUND as u64,
        cache.stats().misses,
        "only what fitted in the inbox was queued"
    );
}

#[test]
fn quiesce_answers_while_another_thread_floods_the_writer() {
    let endpoint = tcp_with_capacity(8);
    let cache = endpoint.cache();
    for client in 0..8 {
        cache
            .pin()
            .resolve(client, &sockaddr(client as u32))
            .expect("room");
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        // Against a full AV every one of these is a miss the writer must answer.
        scope.spawn(|| {
            let mut client = 100;
            while !stop.load(Ordering::Relaxed) {
                client += 1;
                let _ = cache.pin().try_resolve(client, &sockaddr(client as u32));
            }
        });
        cache.release(3);
        let (done, answered) = mpsc::channel();
        scope.spawn(move || {
            cache.quiesce();
            let _ = done.send(cache.stats());
        });
        // A generous bound that only a starved quiesce reaches; the flood goes on meanwhile.
        let stats = answered.recv_timeout(Duration::from_secs(60));
        stop.store(true, Ordering::Relaxed);
        let stats = stats.expect("quiesce answered while the flood went on");
        assert_eq!(
            0, stats.pending_removals,
            "client 3's entry was removed: {stats:?}"
        );
        assert_eq!(1, stats.removes, "{stats:?}");
    });
}

#[test]
fn a_queued_miss_against_a_full_av_reports_capacity() {
    let endpoint = tcp_with_capacity(2);
    let cache = endpoint.cache();
    cache.pin().resolve(1, &sockaddr(1)).expect("room");
    cache.pin().resolve(2, &sockaddr(2)).expect("room");
    let third = || {
        cache
            .pin()
            .try_resolve(3, &sockaddr(3))
            .map(|peer| peer.fi_addr())
    };
    assert_eq!(Err(DmaError::WouldBlock), third(), "queued");
    cache.quiesce();
    assert_eq!(
        Err(DmaError::Capacity { capacity: 2 }),
        third(),
        "the writer's verdict"
    );
    // Room again: the next attempt goes through.
    cache.release(1);
    cache.quiesce();
    assert_eq!(Err(DmaError::WouldBlock), third(), "queued again");
    cache.quiesce();
    assert!(third().is_ok(), "{:?}", third());
}

#[test]
fn a_queued_miss_whose_insert_failed_reports_the_error_once() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let injected = DmaError::Fabric {
        call: "fi_av_insert",
        code: -12,
        message: "injected".into(),
    };
    let try_resolve = |client: u64| {
        cache
            .pin()
            .try_resolve(client, &[1; 16])
            .map(|peer| peer.fi_addr())
    };
    av.fail_next_insert(injected.clone());
    assert_eq!(Err(DmaError::WouldBlock), try_resolve(1), "queued");
    cache.quiesce();
    // Another client's miss neither takes client 1's outcome nor clears it.
    assert_eq!(Err(DmaError::WouldBlock), try_resolve(2));
    cache.quiesce();
    assert_eq!(Err(injected.clone()), try_resolve(1), "the writer's error");
    assert_eq!(
        Err(DmaError::WouldBlock),
        try_resolve(1),
        "reported once; queued again"
    );
    cache.quiesce();
    assert_eq!(
        try_resolve(2),
        try_resolve(1),
        "in, and sharing client 2's entry"
    );
    assert_eq!(1, av.len());

    // A release clears an outcome nobody read.
    av.fail_next_insert(injected);
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .try_resolve(3, &[3; 16])
            .map(|peer| peer.fi_addr())
    );
    cache.quiesce();
    cache.release(3);
    cache.quiesce();
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache
            .pin()
            .try_resolve(3, &[3; 16])
            .map(|peer| peer.fi_addr()),
        "nothing to report after the release"
    );
}

#[test]
fn a_failing_remove_keeps_its_entry_counted_and_is_retried() {
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 1);
    let cache = AddressCache::with_backend(av.clone());
    cache.pin().resolve(1, &[1; 16]).expect("room");
    av.fail_removes(Some(DmaError::Fabric {
        call: "fi_av_remove",
        code: -22,
        message: "injected".into(),
    }));
    cache.release(1);
    cache.quiesce_with_patience(Duration::ZERO);
    let stats = cache.stats();
    assert!(1 <= stats.failed_removes, "{stats:?}");
    assert_eq!((0, 1), (stats.entries, stats.pending_removals), "{stats:?}");
    assert_eq!(1, av.len(), "still in the AV");
    assert_eq!(
        Err(DmaError::Capacity { capacity: 1 }),
        cache.pin().resolve(2, &[2; 16]).map(|peer| peer.fi_addr()),
        "the entry still counts against the capacity"
    );

    av.fail_removes(None);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(0, stats.pending_removals, "retried: {stats:?}");
    assert!(av.is_empty());
    assert!(cache.pin().resolve(2, &[2; 16]).is_ok(), "room again");
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn a_failing_remove_on_efa_keeps_the_identity_blocked() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let old = efa(1, 7, 1);
    let new = efa(1, 7, 2);
    cache.pin().resolve(1, &old).expect("the old incarnation");
    av.fail_removes(Some(DmaError::Fabric {
        call: "fi_av_remove",
        code: -22,
        message: "injected".into(),
    }));
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache.pin().resolve(2, &new).map(|peer| peer.fi_addr()),
        "parked behind the old one's removal"
    );
    cache.quiesce_with_patience(Duration::ZERO);
    assert!(1 <= cache.stats().failed_removes);
    assert_eq!(
        vec![old.clone()],
        (0..4).filter_map(|i| av.lookup(i)).collect::<Vec<_>>()
    );
    assert_eq!(
        Err(DmaError::WouldBlock),
        cache.pin().resolve(2, &new).map(|peer| peer.fi_addr()),
        "still parked: no second entry for one (GID, QPN)"
    );

    av.fail_removes(None);
    cache.quiesce();
    let pinned = cache.pin();
    let peer = pinned.resolve(2, &new).expect("admitted after the retry");
    assert_eq!(Some(new.clone()), av.lookup(peer.fi_addr()));
    assert_eq!(1, av.len());
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}
