//! The address cache over a real tcp address vector on 127.0.0.1.
//!
//! tcp's `fi_av_lookup` cannot show a removal (a removed index reads back its old bytes), so a
//! removal is seen the way DESIGN.md says: the table hands the lowest free index to the next
//! fresh address.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use common::{Random, sockaddr, tcp, tcp_with_capacity};
use dma_libfabric::{CacheStats, DmaError};

#[test]
fn clients_sharing_an_address_share_one_entry_and_one_insert() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let address = sockaddr(1);
    let pinned = cache.pin();
    let first = pinned.resolve(1, &address).expect("client 1");
    let second = pinned.resolve(2, &address).expect("client 2");
    assert_eq!(first.fi_addr(), second.fi_addr(), "one entry");
    assert_eq!(
        (1, 2),
        (first.client(), second.client()),
        "each names its client"
    );
    let stats = cache.stats();
    assert_eq!((1, 2, 1), (stats.entries, stats.clients, stats.inserts));
    assert_eq!(
        Some(address),
        endpoint.lookup(first.fi_addr()).expect("lookup")
    );
}

#[test]
fn the_last_client_out_removes_the_entry_and_gives_the_index_back() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let shared = cache
        .pin()
        .resolve(1, &sockaddr(1))
        .expect("client 1")
        .fi_addr();
    cache.pin().resolve(2, &sockaddr(1)).expect("client 2");
    let other = cache
        .pin()
        .resolve(3, &sockaddr(2))
        .expect("client 3")
        .fi_addr();

    cache.release(1);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (2, 2, 0),
        (stats.entries, stats.clients, stats.removes),
        "client 2 still holds it"
    );
    assert_eq!(Some(sockaddr(1)), endpoint.lookup(shared).expect("lookup"));

    cache.release(2);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (1, 1, 1, 0),
        (
            stats.entries,
            stats.clients,
            stats.removes,
            stats.pending_removals
        )
    );
    let fresh = cache
        .pin()
        .resolve(4, &sockaddr(3))
        .expect("client 4")
        .fi_addr();
    assert_eq!(
        shared, fresh,
        "the real AV gave the index back, and hands it out first"
    );
    assert_ne!(other, fresh);
}

#[test]
fn releasing_twice_or_releasing_a_stranger_changes_nothing() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    cache.pin().resolve(1, &sockaddr(1)).expect("client 1");
    cache.pin().resolve(2, &sockaddr(1)).expect("client 2");
    cache.release(1);
    cache.quiesce();
    let before = cache.stats();

    cache.release(1);
    cache.release(99);
    cache.quiesce();

    assert_eq!(before, cache.stats());
    assert_eq!(1, cache.indexed());
}

#[test]
fn resolving_the_same_address_again_holds_one_registration() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let pinned = cache.pin();
    let first = pinned.resolve(1, &sockaddr(1)).expect("first");
    for _ in 0..10 {
        assert_eq!(first, pinned.resolve(1, &sockaddr(1)).expect("again"));
    }
    drop(pinned);
    let stats = cache.stats();
    assert_eq!(
        (1, 1, 1),
        (stats.clients, stats.misses, stats.inserts),
        "one miss, then hits"
    );

    cache.release(1);
    cache.quiesce();
    assert_eq!(
        (0, 1),
        (cache.stats().entries, cache.stats().removes),
        "one release is enough"
    );
}

#[test]
fn re_advertising_lets_go_of_the_old_entry() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    // Client 1 alone on A: moving to B removes A.
    let a = cache.pin().resolve(1, &sockaddr(1)).expect("A").fi_addr();
    let b = cache.pin().resolve(1, &sockaddr(2)).expect("B").fi_addr();
    assert_ne!(a, b);
    cache.quiesce();
    assert_eq!(
        (1, 1, 1),
        (
            cache.stats().entries,
            cache.stats().clients,
            cache.stats().removes
        )
    );
    assert_eq!(
        a,
        cache
            .pin()
            .resolve(9, &sockaddr(9))
            .expect("fresh")
            .fi_addr(),
        "A's index came back"
    );
    cache.release(9);

    // Clients 2 and 3 on C: client 2 moving to D keeps C for client 3.
    let c = cache.pin().resolve(2, &sockaddr(3)).expect("C").fi_addr();
    cache.pin().resolve(3, &sockaddr(3)).expect("C again");
    cache.pin().resolve(2, &sockaddr(4)).expect("D");
    cache.quiesce();
    let pinned = cache.pin();
    assert_eq!(
        c,
        pinned.resolve(3, &sockaddr(3)).expect("still C").fi_addr()
    );
    assert_eq!(Some(sockaddr(3)), endpoint.lookup(c).expect("lookup"));
    assert_eq!(
        2,
        cache.stats().removes,
        "A and the fresh one only; C stays"
    );
}

#[test]
fn an_address_of_the_wrong_length_is_refused_before_the_av() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    cache.pin().resolve(1, &sockaddr(1)).expect("a good one");
    let before = cache.stats();
    let pinned = cache.pin();
    for address in [vec![], vec![2; 15], vec![2; 17], vec![0; 32]] {
        match pinned.resolve(2, &address) {
            Err(DmaError::InvalidAddress(why)) => {
                assert!(why.contains("16") || why.contains("empty"), "{why}")
            }
            other => panic!("{} bytes: {other:?}", address.len()),
        }
        assert!(matches!(
            pinned.try_resolve(2, &address),
            Err(DmaError::InvalidAddress(_))
        ));
    }
    drop(pinned);
    cache.quiesce();
    assert_eq!(before, cache.stats(), "no miss, no insert, nothing changed");
}

/// The real AV rejects a malformed `sockaddr_in`; the caller gets its error and nothing changes.
#[test]
fn a_failed_insert_reaches_the_caller_and_changes_nothing() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let held = cache
        .pin()
        .resolve(1, &sockaddr(1))
        .expect("client 1")
        .fi_addr();
    let before = cache.stats();

    // Refused by libfabric itself.
    let mut zero_port = sockaddr(3);
    zero_port[2..4].fill(0);
    let error = cache
        .pin()
        .resolve(1, &zero_port)
        .expect_err("libfabric refuses it");
    assert!(
        matches!(
            error,
            DmaError::Fabric {
                call: "fi_av_insert",
                ..
            }
        ),
        "{error}"
    );
    // Refused before libfabric sees it: a wrong family would break 1.17's AV for good.
    let mut bad_family = sockaddr(2);
    bad_family[0..2].copy_from_slice(&0xffff_u16.to_ne_bytes());
    // Family 0 (AF_UNSPEC) with a port and a host: a sockaddr, not an all-zero address, which
    // the cache refuses before even the writer sees it (tests/cache_edges.rs).
    let unspec = testkit::sockaddr_parts(0, 7, [127, 0, 0, 1]);
    for bad in [bad_family, unspec] {
        let error = cache
            .pin()
            .resolve(1, &bad)
            .expect_err("the cache refuses it");
        assert!(matches!(error, DmaError::InvalidAddress(_)), "{error}");
    }
    cache.quiesce();
    let after = cache.stats();
    assert_eq!(
        CacheStats {
            misses: before.misses + 3,
            ..before
        },
        after,
        "only the misses were counted"
    );
    let pinned = cache.pin();
    assert_eq!(
        held,
        pinned
            .resolve(1, &sockaddr(1))
            .expect("client 1 kept its entry")
            .fi_addr()
    );
}

#[test]
fn a_full_av_refuses_a_new_entry_until_a_release_makes_room() {
    let endpoint = tcp_with_capacity(4);
    let cache = endpoint.cache();
    for client in 0..4 {
        cache
            .pin()
            .resolve(client, &sockaddr(client as u32))
            .expect("room");
    }
    // Sharing an entry needs no room.
    cache
        .pin()
        .resolve(10, &sockaddr(0))
        .expect("a shared entry");
    let before = cache.stats();
    match cache.pin().resolve(4, &sockaddr(4)) {
        Err(DmaError::Capacity { capacity }) => assert_eq!(4, capacity),
        other => panic!("expected Capacity, got {other:?}"),
    }
    assert!(DmaError::Capacity { capacity: 4 }.to_string().contains('4'));
    cache.quiesce();
    assert_eq!(
        CacheStats {
            misses: before.misses + 1,
            ..before
        },
        cache.stats()
    );

    // An entry awaiting its deferred removal still occupies its slot.
    let reader = cache.pin();
    reader.resolve(1, &sockaddr(1)).expect("a hit");
    cache.release(1);
    cache.quiesce();
    assert_eq!(1, cache.stats().pending_removals, "held back by the reader");
    assert!(matches!(
        cache.pin().resolve(4, &sockaddr(4)),
        Err(DmaError::Capacity { .. })
    ));
    drop(reader);
    cache.quiesce();
    assert_eq!(0, cache.stats().pending_removals);
    cache.pin().resolve(4, &sockaddr(4)).expect("room again");
}

/// The ABA hazard: while a reader's pin lives, its index is neither removed nor reused.
#[test]
fn a_pinned_peer_keeps_its_index_until_the_pin_drops() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let a = sockaddr(1);
    let reader = cache.pin();
    let x = reader.resolve(1, &a).expect("A").fi_addr();

    cache.release(1);
    cache.quiesce();
    let b = cache.pin().resolve(2, &sockaddr(2)).expect("B").fi_addr();
    assert_ne!(
        x, b,
        "B must not get the index a pinned reader may still post to"
    );
    assert_eq!(
        Some(a.clone()),
        endpoint.lookup(x).expect("lookup"),
        "X still holds A"
    );
    assert_eq!(1, cache.stats().pending_removals);

    drop(reader);
    cache.quiesce();
    assert_eq!(0, cache.stats().pending_removals);
    let c = cache.pin().resolve(3, &sockaddr(3)).expect("C").fi_addr();
    assert_eq!(
        x, c,
        "after the unpin X was removed, and is handed out first"
    );
}

/// A client that releases and comes straight back, before the removal ran, gets its old entry
/// back: no second insert, no removal.
#[test]
fn coming_back_before_the_removal_revives_the_entry() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let reader = cache.pin();
    let x = reader.resolve(1, &sockaddr(1)).expect("A").fi_addr();
    cache.release(1);
    cache.quiesce();
    assert_eq!(1, cache.stats().pending_removals);
    let again = cache
        .pin()
        .resolve(1, &sockaddr(1))
        .expect("A again")
        .fi_addr();
    assert_eq!(x, again);
    drop(reader);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (1, 1, 0, 0),
        (
            stats.entries,
            stats.inserts,
            stats.removes,
            stats.pending_removals
        )
    );
}

#[test]
fn ten_thousand_addresses_come_and_go_and_leave_nothing() {
    const ADDRESSES: u32 = 10_000;
    let endpoint = tcp();
    let cache = endpoint.cache();
    for n in 0..ADDRESSES {
        cache
            .pin()
            .resolve(u64::from(n), &sockaddr(n))
            .expect("resolve");
        cache.release(u64::from(n));
        if 0 == n % 1000 {
            cache.quiesce();
        }
    }
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0),
        (stats.entries, stats.clients, stats.pending_removals)
    );
    assert_eq!(
        (u64::from(ADDRESSES), u64::from(ADDRESSES)),
        (stats.inserts, stats.removes)
    );
    assert_eq!(0, cache.indexed(), "the index holds nothing");

    let pinned = cache.pin();
    for n in 0..8_u32 {
        let fi_addr = pinned
            .resolve(1_000_000 + u64::from(n), &sockaddr(ADDRESSES + n))
            .expect("fresh");
        assert_eq!(
            u64::from(n),
            fi_addr.fi_addr(),
            "the real AV is empty: fresh addresses take 0..N"
        );
    }
}

/// Posting threads check, while pinned, that each peer maps in the real AV to the address it was
/// resolved for, while a churn thread re-advertises and releases clients.
#[test]
fn stress_peers_always_map_to_their_address() {
    const CLIENTS: u64 = 64;
    const ROUNDS: usize = 20_000;
    const CHURNS: usize = 2_000;
    let endpoint = tcp();
    let cache = endpoint.cache();
    // The address each client advertises now; a plain lock, because this is the test's own
    // bookkeeping, not the cache.
    let current: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new((0..CLIENTS as u32).collect());
    let mismatches = std::sync::atomic::AtomicUsize::new(0);

    std::thread::scope(|scope| {
        for seed in 1..=2_u64 {
            let (current, mismatches, endpoint) = (&current, &mismatches, &endpoint);
            scope.spawn(move || {
                let mut random = Random::new(seed);
                for _ in 0..ROUNDS {
                    let client = random.below(CLIENTS);
                    let address = sockaddr(current.lock().expect("bookkeeping")[client as usize]);
                    let pinned = cache.pin();
                    let peer = match pinned.resolve(client, &address) {
                        Ok(peer) => peer,
                        Err(error) => panic!("resolve: {error}"),
                    };
                    if endpoint.lookup(peer.fi_addr()).expect("lookup") != Some(address) {
                        mismatches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        let current = &current;
        scope.spawn(move || {
            let mut random = Random::new(99);
            let mut next = CLIENTS as u32;
            for _ in 0..CHURNS {
                let client = random.below(CLIENTS);
                if 0 == random.below(2) {
                    cache.release(client);
                } else {
                    // Re-advertise: a new address for the client.
                    let mut table = current.lock().expect("bookkeeping");
                    table[client as usize] = next;
                    next += 1;
                    drop(table);
                    let address = sockaddr(next - 1);
                    cache.pin().resolve(client, &address).expect("re-advertise");
                }
            }
        });
    });

    assert_eq!(
        0,
        mismatches.into_inner(),
        "a peer mapped to another address"
    );
    for client in 0..CLIENTS {
        cache.release(client);
    }
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0),
        (stats.entries, stats.clients, stats.pending_removals)
    );
    assert_eq!(stats.inserts, stats.removes);
    let pinned = cache.pin();
    for n in 0..4_u32 {
        let peer = pinned
            .resolve(500 + u64::from(n), &sockaddr(1_000_000 + n))
            .expect("fresh");
        assert_eq!(u64::from(n), peer.fi_addr(), "the AV is empty again");
    }
}

#[test]
fn try_resolve_queues_a_miss_and_never_blocks() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let pinned = cache.pin();
    assert!(matches!(
        pinned.try_resolve(1, &sockaddr(1)),
        Err(DmaError::WouldBlock)
    ));
    drop(pinned);
    cache.quiesce();
    let pinned = cache.pin();
    let peer = pinned
        .try_resolve(1, &sockaddr(1))
        .expect("queued, so now a hit");
    assert_eq!(
        Some(sockaddr(1)),
        endpoint.lookup(peer.fi_addr()).expect("lookup")
    );
    assert_eq!(1, cache.stats().inserts);
}

/// `probe` is the hit alone: a miss, a bad address and a released client are `None` and queue
/// nothing, and a registered client is the very peer `resolve` gave.
#[test]
fn probe_is_the_hit_alone_and_queues_nothing() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let pinned = cache.pin();
    assert_eq!(None, pinned.probe(1, &sockaddr(1)), "a miss");
    assert_eq!(
        None,
        pinned.probe(1, &[0; 16]),
        "an address the cache would refuse"
    );
    assert_eq!(
        None,
        pinned.probe(1, &[7; 3]),
        "an address of the wrong length"
    );
    assert_eq!(None, pinned.probe(u64::MAX, &[]), "nothing at all");
    drop(pinned);
    cache.quiesce();
    let stats = cache.stats();
    assert_eq!(
        (0, 0, 0),
        (stats.entries, stats.clients, stats.inserts),
        "nothing was queued"
    );

    let pinned = cache.pin();
    let peer = pinned.resolve(1, &sockaddr(1)).expect("client 1");
    assert_eq!(Some(peer), pinned.probe(1, &sockaddr(1)));
    assert_eq!(
        None,
        pinned.probe(2, &sockaddr(1)),
        "another client, not registered"
    );
    assert_eq!(
        None,
        pinned.probe(1, &sockaddr(2)),
        "client 1 at another address"
    );
    drop(pinned);
    cache.release(1);
    cache.quiesce();
    assert_eq!(None, cache.pin().probe(1, &sockaddr(1)), "released");
    assert_eq!(1, cache.stats().inserts, "and the probes inserted nothing");
}

/// One cache serves every posting thread; a pin belongs to the thread that took it.
#[test]
fn the_cache_is_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<dma_libfabric::AddressCache>();
    shared::<dma_libfabric::LibfabricEndpoint>();
    fn copied<T: Copy>() {}
    copied::<dma_libfabric::Peer<'static>>();
}
