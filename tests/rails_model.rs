//! The rail rules over the model AV, with efa's address rules: all or nothing, the mapping, one
//! incarnation on every rail, and readers striping over two rails while the client's slot on one
//! rail is recycled. `RailCaches` runs the same code as `RailSet`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv, RailCaches};
use testkit::efa;

fn rails(count: usize) -> (Vec<ModelAv>, RailCaches<ModelAv>) {
    let avs: Vec<ModelAv> = (0..count)
        .map(|_| ModelAv::new(AddressFormat::Efa))
        .collect();
    let caches = avs
        .iter()
        .map(|av| AddressCache::with_backend(av.clone()))
        .collect();
    (avs, RailCaches::new(caches).expect("rails"))
}

fn slices(addresses: &[Vec<u8>]) -> Vec<&[u8]> {
    addresses.iter().map(Vec::as_slice).collect()
}

/// Client `client`'s incarnation `incarnation`: one address per rail, every rail's QKEY the
/// incarnation. Rail 0 always has the same GID and QPN (its slot is recycled by each restart);
/// the other rails get a new QPN now and then.
fn incarnation(rails: usize, client: u8, incarnation: u32) -> Vec<Vec<u8>> {
    (0..rails)
        .map(|rail| {
            let qpn = if 0 == rail {
                7
            } else {
                100 + (incarnation % 5) as u16
            };
            efa(client * 16 + rail as u8 + 1, qpn, incarnation)
        })
        .collect()
}

/// The QKEY of an efa address: its incarnation.
fn qkey(address: &[u8]) -> u32 {
    u32::from_ne_bytes(address[20..24].try_into().unwrap())
}

fn assert_clean(avs: &[ModelAv]) {
    for (rail, av) in avs.iter().enumerate() {
        assert!(
            av.violations().is_empty(),
            "rail {rail}: {:?}",
            av.violations()
        );
    }
}

#[test]
fn every_rail_resolves_its_own_address_and_a_peer_with_fewer_rails_is_shared() {
    let (avs, rails) = rails(3);
    let pinned = rails.pin();
    let same = incarnation(3, 1, 1);
    let peers = pinned.resolve(1, &slices(&same)).expect("three to three");
    for rail in 0..3 {
        assert_eq!(
            Some(same[rail].clone()),
            avs[rail].lookup(peers.rail(rail).fi_addr())
        );
    }
    // Two remote rails for three local ones: local rail 2 uses the peer's rail 0.
    let fewer = incarnation(2, 2, 1);
    let peers = pinned.resolve(2, &slices(&fewer)).expect("three to two");
    assert_eq!(2, peers.remote_rails());
    assert_eq!(
        Some(fewer[0].clone()),
        avs[2].lookup(peers.rail(2).fi_addr())
    );
    assert_eq!(
        Some(fewer[1].clone()),
        avs[1].lookup(peers.rail(1).fi_addr())
    );
    // Four remote rails for three: the fourth is unused.
    let more = incarnation(4, 3, 1);
    let peers = pinned.resolve(3, &slices(&more)).expect("three to four");
    for rail in 0..3 {
        assert_eq!(
            Some(more[rail].clone()),
            avs[rail].lookup(peers.rail(rail).fi_addr())
        );
    }
    assert!(
        avs.iter().all(|av| 3 == av.len()),
        "one entry per client a rail"
    );
}

#[test]
fn bad_input_is_refused_before_any_rail_changes() {
    let (avs, rails) = rails(2);
    let pinned = rails.pin();
    assert!(matches!(
        pinned.resolve(1, &[]),
        Err(DmaError::InvalidArgument(_))
    ));
    let nine = vec![efa(1, 1, 1); 9];
    assert!(matches!(
        pinned.resolve(1, &slices(&nine)),
        Err(DmaError::InvalidArgument(_))
    ));
    // Rail 0's address is fine; rail 1's is short: rail 0 must not have been asked.
    let short = vec![efa(1, 1, 1), vec![2; 31]];
    assert!(matches!(
        pinned.resolve(1, &slices(&short)),
        Err(DmaError::InvalidAddress(_))
    ));
    let unset = vec![efa(1, 1, 1), vec![0; 32]];
    assert!(matches!(
        pinned.resolve(1, &slices(&unset)),
        Err(DmaError::InvalidAddress(_))
    ));
    drop(pinned);
    assert!(matches!(
        rails.lease(1, &slices(&short)),
        Err(DmaError::InvalidAddress(_))
    ));
    rails.quiesce();
    for av in &avs {
        assert!(av.events().is_empty(), "{:?}", av.events());
    }
    assert!((0..2).all(|rail| 0 == rails.rail(rail).stats().misses));
}

#[test]
fn a_failure_on_one_rail_leaves_the_client_registered_on_none() {
    let (avs, rails) = rails(3);
    let addresses = incarnation(3, 1, 1);
    avs[2].fail_next_insert(DmaError::Fabric {
        call: "fi_av_insert",
        code: -12,
        message: "no memory".into(),
    });
    let failed = rails.pin().resolve(1, &slices(&addresses)).map(|_| ());
    assert!(matches!(failed, Err(DmaError::Fabric { .. })), "{failed:?}");
    rails.quiesce();
    for (rail, av) in avs.iter().enumerate() {
        assert!(
            av.is_empty(),
            "rail {rail} still holds the client: {:?}",
            av.events()
        );
        assert_eq!(0, rails.rail(rail).stats().clients);
    }
    // Nothing is stuck: the next resolve registers it on every rail.
    let pinned = rails.pin();
    pinned.resolve(1, &slices(&addresses)).expect("registered");
    assert!(avs.iter().all(|av| 1 == av.len()));
    assert_clean(&avs);
}

#[test]
fn a_full_rail_fails_the_lease_and_leaves_the_others_empty() {
    let avs = [
        ModelAv::new(AddressFormat::Efa),
        ModelAv::with_layout(AddressFormat::Efa, 32, 1),
    ];
    let rails = RailCaches::new(
        avs.iter()
            .map(|av| AddressCache::with_backend(av.clone()))
            .collect(),
    )
    .unwrap();
    let first = rails
        .lease(1, &slices(&incarnation(2, 1, 1)))
        .expect("fits");
    let refused = rails.lease(2, &slices(&incarnation(2, 2, 1))).map(|_| ());
    assert!(
        matches!(refused, Err(DmaError::Capacity { .. })),
        "{refused:?}"
    );
    rails.quiesce();
    assert_eq!(
        (1, 1),
        (avs[0].len(), avs[1].len()),
        "client 2 is on no rail; client 1 on both"
    );
    drop(first);
}

/// An efa eviction on one rail (another client's new incarnation took the slot) means the
/// client's process is gone: it is released on every rail, and comes back on all of them.
#[test]
fn an_eviction_on_one_rail_evicts_the_client_on_every_rail() {
    let (avs, rails) = rails(2);
    let old = incarnation(2, 1, 1);
    rails.pin().resolve(1, &slices(&old)).expect("client 1");
    // Client 2 advertises a new incarnation of client 1's rail-0 slot, on a rail-1 slot of its
    // own: client 1 is evicted on rail 0, and client 2's insert waits for the old entry's removal.
    let usurper = vec![efa(17, 7, 99), efa(40, 9, 99)];
    let parked = rails.pin().resolve(2, &slices(&usurper)).map(|_| ());
    assert_eq!(Err(DmaError::WouldBlock), parked);
    rails.quiesce();
    assert_eq!(1, rails.evictions_propagated());
    assert_eq!(1, rails.rail(0).stats().evictions);
    let rail1: Vec<Vec<u8>> = (0..4).filter_map(|at| avs[1].lookup(at)).collect();
    assert!(
        !rail1.contains(&old[1]),
        "client 1's rail-1 entry was released and removed: {rail1:?}"
    );
    assert_eq!(1, rails.rail(1).stats().clients, "client 2 alone on rail 1");
    let pinned = rails.pin();
    let peers = pinned
        .resolve(2, &slices(&usurper))
        .expect("client 2 got in");
    assert_eq!(
        Some(usurper[0].clone()),
        avs[0].lookup(peers.rail(0).fi_addr())
    );
    drop(pinned);
    // Client 1 restarts on another slot: a miss on every rail, registered anew on all.
    let restarted = vec![efa(17, 8, 2), efa(18, 101, 2)];
    let misses: Vec<u64> = (0..2).map(|rail| rails.rail(rail).stats().misses).collect();
    let lease = rails.lease(1, &slices(&restarted)).expect("client 1 again");
    for rail in 0..2 {
        assert_eq!(
            misses[rail] + 1,
            rails.rail(rail).stats().misses,
            "rail {rail}"
        );
        assert_eq!(
            Some(restarted[rail].clone()),
            avs[rail].lookup(lease.rail(rail).fi_addr())
        );
    }
    drop(lease);
    rails.release(1);
    rails.release(2);
    rails.quiesce();
    assert!(avs.iter().all(ModelAv::is_empty));
    assert_clean(&avs);
}

/// The heart of the rail set: readers resolve a client on two rails, lease both and check that
/// both leased entries hold one incarnation, as a striped transfer posts, while the client
/// restarts again and again (a new QKEY on the same rail-0 slot each time) and another client
/// takes its rail-0 slot now and then (an eviction on that rail alone). No reader ever holds a
/// lease pair of two incarnations, and the AVs never break efa's rules.
#[test]
fn readers_striping_over_two_rails_never_see_two_incarnations_while_a_slot_is_recycled() {
    const RESTARTS: u32 = 300;
    let (avs, rails) = rails(2);
    let current = AtomicU32::new(1);
    let stop = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    rails
        .lease(1, &slices(&incarnation(2, 0, 1)))
        .expect("the first incarnation");
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    let k = current.load(Ordering::Acquire);
                    let addresses = incarnation(2, 0, k);
                    let pinned = rails.pin();
                    let peers = match pinned.resolve(1, &slices(&addresses)) {
                        Ok(peers) => peers,
                        Err(DmaError::WouldBlock) => continue,
                        Err(error) => panic!("{error}"),
                    };
                    let lease = pinned.lease(&peers).expect("leased");
                    drop(pinned);
                    // What each stripe would be posted to, read twice: once at once and once
                    // after the others have had a chance to churn.
                    for _ in 0..2 {
                        let seen: Vec<Vec<u8>> = (0..2)
                            .map(|rail| {
                                avs[rail]
                                    .lookup(lease.rail(rail).fi_addr())
                                    .expect("a leased entry is in its AV")
                            })
                            .collect();
                        assert_eq!(addresses, seen, "each rail holds what it was resolved for");
                        assert_eq!(qkey(&seen[0]), qkey(&seen[1]), "one incarnation");
                        std::thread::yield_now();
                    }
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        scope.spawn(|| {
            for k in 2..=RESTARTS {
                // The readers check each incarnation before the next restart, so they run
                // alongside every one of them however the machine schedules the threads (before,
                // a loaded machine could run the restarts before any reader had checked once).
                let before = checked.load(Ordering::Relaxed);
                testkit::wait_until(
                    &format!("a reader's check of incarnation {}", k - 1),
                    || before < checked.load(Ordering::Relaxed),
                );
                current.store(k, Ordering::Release);
                // The restart: registered on every rail, waiting for each old entry to go.
                drop(
                    rails
                        .lease(1, &slices(&incarnation(2, 0, k)))
                        .expect("restarted"),
                );
                if 0 == k % 4 {
                    // Another client takes the client's rail-0 slot with a new QKEY: queued,
                    // not waited for (the readers' client wins it back at once).
                    let usurper = vec![efa(1, 7, k | 1 << 31), efa(60, 9, k)];
                    let _ = rails.pin().resolve(2, &slices(&usurper));
                    rails.release(2);
                }
            }
            stop.store(true, Ordering::Release);
        });
    });
    assert!(0 < checked.load(Ordering::Relaxed));
    assert!(
        0 < rails.evictions_propagated(),
        "the usurper's evictions on rail 0 reached rail 1"
    );
    rails.release(1);
    rails.release(2);
    rails.quiesce();
    for (rail, av) in avs.iter().enumerate() {
        assert!(
            av.is_empty(),
            "rail {rail}: {:?}",
            (0..8).map(|at| av.lookup(at)).collect::<Vec<_>>()
        );
        assert_eq!(av.inserts(), av.removes(), "rail {rail}");
    }
    assert_clean(&avs);
}

/// `RailSet::lease` (here `RailCaches::lease`) waits, holding no lease of its own, while a rail's
/// new incarnation waits for the old one's removal, which another thread's lease holds back; once
/// that lease is dropped it returns the new incarnation on every rail.
#[test]
fn a_blocking_lease_waits_for_an_old_incarnation_held_by_another_thread() {
    let (avs, rails) = rails(2);
    let old = incarnation(2, 1, 1);
    let new = incarnation(2, 1, 2);
    let held = rails.lease(1, &slices(&old)).expect("the old incarnation");
    let old_rail0 = held.rail(0).fi_addr();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let lease = rails.lease(1, &slices(&new)).expect("the new incarnation");
            (0..2)
                .map(|rail| avs[rail].lookup(lease.rail(rail).fi_addr()))
                .collect::<Vec<_>>()
        });
        // Drop the old lease only once the new incarnation is parked behind it (the old entry
        // has been unlinked and awaits this lease), so the waiter really waited.
        let deadline = std::time::Instant::now() + testkit::PATIENCE;
        while 0 == rails.rail(0).stats().removals_awaiting_leases {
            assert!(std::time::Instant::now() < deadline, "never parked");
            std::thread::yield_now();
        }
        assert_eq!(
            Some(old[0].clone()),
            avs[0].lookup(old_rail0),
            "held by the lease"
        );
        drop(held);
        let seen = waiter.join().expect("the waiter");
        assert_eq!(vec![Some(new[0].clone()), Some(new[1].clone())], seen);
    });
    rails.release(1);
    rails.quiesce();
    assert!(avs.iter().all(ModelAv::is_empty));
    assert_clean(&avs);
}
