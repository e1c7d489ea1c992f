//! `Pinned::resolve_all` and `AddressCache::lease_all`: a connect storm in one round trip per
//! chunk of 64 misses, results in request order, a bad address failing its own entry only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{AddressCache, AddressFormat, DmaError, ModelAv};
use testkit::{Observed, Observer, efa, sockaddr, tcp};

/// Counts the writer's AV inserts: every miss of every chunk is inserted once.
#[derive(Default)]
struct Inserts(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Observer for Inserts {
    fn before_insert(&mut self, _: &[u8]) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `(client, address)` requests, client `n` for the `n`th address.
fn numbered<A: AsRef<[u8]>>(addresses: &[A]) -> Vec<(u64, &[u8])> {
    addresses
        .iter()
        .enumerate()
        .map(|(client, address)| (client as u64, address.as_ref()))
        .collect()
}

#[test]
fn hits_and_misses_come_back_in_request_order_on_the_real_av() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let addresses: Vec<Vec<u8>> = (0..200).map(sockaddr).collect();
    // Every other client is already in: a mix of hits and misses, across four chunks.
    {
        let pinned = cache.pin();
        for client in (0..200).step_by(2) {
            pinned
                .resolve(client, &addresses[client as usize])
                .expect("in");
        }
    }
    let requests = numbered(&addresses);
    let misses_before = cache.stats().misses;
    let pinned = cache.pin();
    let peers = pinned.resolve_all(&requests);
    assert_eq!(200, peers.len());
    for (client, peer) in peers.iter().enumerate() {
        let peer = peer.as_ref().expect("every entry resolves");
        assert_eq!(client as u64, peer.client(), "hit or miss, its own client");
        let fi_addr = peer.fi_addr();
        assert_eq!(
            Some(addresses[client].clone()),
            endpoint.lookup(fi_addr).expect("lookup"),
            "entry {client} in its place"
        );
        assert_eq!(
            fi_addr,
            pinned
                .resolve(client as u64, &addresses[client])
                .expect("a hit")
                .fi_addr()
        );
    }
    assert_eq!(
        100,
        cache.stats().misses - misses_before,
        "only the misses went"
    );
}

#[test]
fn a_bad_address_fails_its_own_entry_only() {
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(av.clone());
    let zero = [0_u8; 16];
    let requests: Vec<(u64, &[u8])> = vec![
        (1, &[1; 16]),
        (2, &[2; 3]),
        (3, &zero),
        (4, &[4; 16]),
        (5, &[]),
    ];
    let pinned = cache.pin();
    let peers = pinned.resolve_all(&requests);
    assert!(peers[0].is_ok() && peers[3].is_ok(), "{peers:?}");
    for bad in [1, 2, 4] {
        assert!(
            matches!(peers[bad], Err(DmaError::InvalidAddress(_))),
            "{bad}: {:?}",
            peers[bad]
        );
    }
    assert_eq!(2, av.len(), "nothing of the bad ones reached the AV");
}

#[test]
fn a_full_av_fails_the_entries_past_its_capacity() {
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 8);
    let cache = AddressCache::with_backend(av.clone());
    let addresses: Vec<[u8; 16]> = (1..=10).map(|n| [n; 16]).collect();
    let requests = numbered(&addresses);
    let leases = cache.lease_all(&requests);
    assert_eq!(8, leases.iter().filter(|lease| lease.is_ok()).count());
    for lease in &leases[8..] {
        assert!(
            matches!(lease, Err(DmaError::Capacity { capacity: 8 })),
            "{lease:?}"
        );
    }
    assert_eq!(8, cache.stats().leases);
}

#[test]
fn a_storm_of_a_thousand_misses_across_sixteen_chunks_is_leased_in_full() {
    let inserts = Inserts::default();
    let counted = std::sync::Arc::clone(&inserts.0);
    let av = ModelAv::new(AddressFormat::Opaque);
    let cache = AddressCache::with_backend(Observed {
        av: av.clone(),
        observer: inserts,
    });
    let addresses: Vec<Vec<u8>> = (0..1_000).map(sockaddr).collect();
    let requests = numbered(&addresses);
    let leases = cache.lease_all(&requests);
    for (client, lease) in leases.iter().enumerate() {
        let lease = lease.as_ref().expect("leased");
        assert_eq!(client as u64, lease.client(), "each lease its own client");
        assert_eq!(client as u64, lease.peer().client());
    }
    assert_eq!(1_000, counted.load(std::sync::atomic::Ordering::Relaxed));
    assert_eq!(1_000, cache.stats().leases);
    drop(leases);
    for client in 0..1_000 {
        cache.release(client);
    }
    cache.quiesce();
    assert!(av.is_empty());
}

#[test]
fn lease_all_waits_for_a_parked_incarnation_as_lease_does() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    std::thread::scope(|scope| {
        let (leased, taken) = std::sync::mpsc::channel();
        let (drop_now, signal) = std::sync::mpsc::channel::<()>();
        let cache = &cache;
        scope.spawn(move || {
            let old = cache.lease(1, &efa(1, 7, 1)).expect("the old incarnation");
            leased.send(()).expect("the test");
            signal.recv().expect("the signal");
            drop(old);
        });
        taken.recv().expect("the old lease");
        // The new incarnation parks behind the old one's lease; the other entry is leased at once.
        assert_eq!(
            Err(DmaError::WouldBlock),
            cache
                .pin()
                .resolve(2, &efa(1, 7, 2))
                .map(|peer| peer.fi_addr())
        );
        drop_now.send(()).expect("the holder");
        let (new, other) = (efa(1, 7, 2), efa(2, 3, 1));
        let leases = cache.lease_all(&[(2, &new[..]), (3, &other[..])]);
        let leased: Vec<_> = leases
            .iter()
            .map(|lease| av.lookup(lease.as_ref().expect("leased").fi_addr()))
            .collect();
        assert_eq!(vec![Some(new.clone()), Some(other.clone())], leased);
    });
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn lease_all_from_a_pinned_thread_is_refused_per_entry() {
    let cache = AddressCache::with_backend(ModelAv::new(AddressFormat::Opaque));
    let pinned = cache.pin();
    let leases = cache.lease_all(&[(1, &[1; 16]), (2, &[2; 16])]);
    assert!(
        leases
            .iter()
            .all(|lease| matches!(lease, Err(DmaError::InvalidArgument(_))))
    );
    drop(pinned);
    assert_eq!(0, cache.stats().entries, "nothing was asked for");
}

#[test]
fn two_incarnations_of_one_slot_in_one_call_answer_without_hanging() {
    let av = ModelAv::new(AddressFormat::Efa);
    let cache = AddressCache::with_backend(av.clone());
    let (old, new) = (efa(4, 2, 1), efa(4, 2, 2));
    // A contradictory list: the second evicts the first. Whatever each entry answers, the call
    // returns, and the AV never holds both.
    let leases = cache.lease_all(&[(1, &old[..]), (2, &new[..])]);
    assert_eq!(2, leases.len());
    assert!(leases.iter().any(Result::is_ok), "{leases:?}");
    assert!(av.violations().is_empty(), "{:?}", av.violations());
    drop(leases);
    for client in [1, 2] {
        cache.release(client);
    }
    cache.quiesce();
    assert!(av.is_empty(), "{:?}", av.events());
}
