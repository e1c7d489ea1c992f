//! The cache at the edges of its API (issue 18): what `try_resolve`'s answers promise when the
//! writer cannot keep up, and the refusal of an all-zero address on every path and format.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::mpsc;
use std::time::Duration;

use common::{sockaddr, tcp};
use dma_libfabric::{AddressCache, AddressFormat, AvBackend, DmaError, ModelAv};
use testkit::Gate;
use testkit::{Observed, Observer, efa_numbered};

/// A writer that cannot keep up: every insert waits for a token from the test, until the test
/// drops its sender (then they all go through).
struct Trickle {
    tokens: mpsc::Receiver<()>,
}

impl Observer for Trickle {
    fn before_insert(&mut self, _: &[u8]) {
        let _ = self.tokens.recv();
    }
}

/// A distinct, non-zero 16-byte address per client.
fn address(client: u64) -> [u8; 16] {
    let mut address = [0xa5; 16];
    address[..8].copy_from_slice(&client.to_ne_bytes());
    address
}

/// `try_resolve`'s answer, without the peer's lifetime.
fn try_resolve<B: AvBackend>(cache: &AddressCache<B>, client: u64) -> Result<u64, DmaError> {
    cache
        .pin()
        .try_resolve(client, &address(client))
        .map(|peer| peer.fi_addr())
}

#[test]
fn would_block_means_queued_and_a_full_inbox_answers_busy() {
    let bound = AddressCache::<ModelAv>::INBOX_BOUND;
    let (open, gate) = mpsc::channel();
    let (entered, inside) = mpsc::sync_channel(1);
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 2 * bound);
    // `quiesce` waits for the writer to apply the backlog at most the cache's patience (5 s by
    // default, which a loaded machine took, leaving 2,560 of 4,097 misses applied): a bound only a
    // hang reaches instead.
    let cache = AddressCache::with_backend(Observed {
        av: av.clone(),
        observer: Gate {
            go: Some(gate),
            entered,
        },
    })
    .with_patience(testkit::FAILSAFE);
    // Two threads flood the held writer with new clients: more than the inbox holds.
    let per_thread = bound as u64 / 2 + 300;
    let answers: Vec<(u64, Result<u64, DmaError>)> = std::thread::scope(|scope| {
        let first = scope.spawn(|| cache.pin().resolve(0, &address(0)).map(|p| p.fi_addr()));
        inside
            .recv()
            .expect("the writer is held inside its first insert");
        let floods: Vec<_> = (0..2_u64)
            .map(|thread| {
                let cache = &cache;
                scope.spawn(move || {
                    let clients = 1 + thread * per_thread..1 + (thread + 1) * per_thread;
                    clients
                        .map(|client| (client, try_resolve(cache, client)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let answers = floods
            .into_iter()
            .flat_map(|flood| flood.join().expect("a flooding thread"))
            .collect();
        open.send(()).expect("the writer");
        first.join().expect("first").expect("the first miss");
        answers
    });
    cache.quiesce();
    let queued: Vec<u64> = answers
        .iter()
        .filter(|(_, answer)| *answer == Err(DmaError::WouldBlock))
        .map(|&(client, _)| client)
        .collect();
    let busy: Vec<u64> = answers
        .iter()
        .filter(|(_, answer)| *answer == Err(DmaError::Busy))
        .map(|&(client, _)| client)
        .collect();
    assert_eq!(
        answers.len(),
        queued.len() + busy.len(),
        "nothing but WouldBlock and Busy: {:?}",
        answers
            .iter()
            .find(|(_, answer)| !matches!(answer, Err(DmaError::WouldBlock | DmaError::Busy)))
    );
    assert_eq!(
        bound,
        queued.len(),
        "the held writer's inbox took exactly its bound"
    );
    assert!(!busy.is_empty(), "the flood outran the inbox");
    assert_eq!(
        1 + bound as u64,
        cache.stats().misses,
        "the writer applied exactly the queued misses"
    );
    // WouldBlock meant queued: under a later pin, each is a hit.
    for &client in &queued {
        let fi_addr = try_resolve(&cache, client)
            .unwrap_or_else(|error| panic!("client {client} answered WouldBlock: {error:?}"));
        assert_eq!(Some(address(client).to_vec()), av.lookup(fi_addr));
    }
    // Busy meant nothing was queued: none of them is in the index.
    let indexed = cache.indexed();
    assert_eq!(1 + bound, indexed, "only the queued clients are registered");
    for &client in &busy {
        assert_eq!(
            Err(DmaError::WouldBlock),
            try_resolve(&cache, client),
            "client {client} answered Busy, so it was not queued (and is queued now)"
        );
    }
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

#[test]
fn retrying_busy_until_queued_makes_every_client_a_hit() {
    let bound = AddressCache::<ModelAv>::INBOX_BOUND;
    let (tokens, trickle) = mpsc::channel();
    let av = ModelAv::with_layout(AddressFormat::Opaque, 16, 2 * bound);
    // As above: the patience bounds `quiesce`'s wait for the backlog, so only a hang reaches it.
    let cache = AddressCache::with_backend(Observed {
        av: av.clone(),
        observer: Trickle { tokens: trickle },
    })
    .with_patience(testkit::FAILSAFE);
    let clients = bound as u64 + 200;
    let mut busy = 0_u64;
    for client in 1..=clients {
        loop {
            match try_resolve(&cache, client) {
                Err(DmaError::WouldBlock) => break,
                // Nothing was queued: let the writer take one more insert, and ask again.
                Err(DmaError::Busy) => {
                    busy += 1;
                    tokens.send(()).expect("the writer");
                    std::thread::yield_now();
                }
                other => panic!("client {client}: {other:?}"),
            }
        }
    }
    drop(tokens);
    cache.quiesce();
    assert!(
        busy > 0,
        "the writer could not keep up, so the inbox filled"
    );
    assert_eq!(clients, cache.stats().misses, "each client queued once");
    for client in 1..=clients {
        let fi_addr = try_resolve(&cache, client)
            .unwrap_or_else(|error| panic!("client {client} was queued: {error:?}"));
        assert_eq!(Some(address(client).to_vec()), av.lookup(fi_addr));
    }
    assert!(av.violations().is_empty(), "{:?}", av.violations());
}

/// Every way into the cache refuses `zero` with `InvalidAddress`, and changes nothing: `holder`
/// keeps its entry on `good`, and nothing reaches the AV.
fn refuses_zero<B: AvBackend>(cache: &AddressCache<B>, good: &[u8], inserts: &dyn Fn() -> u64) {
    let zero = vec![0_u8; cache.address_len()];
    let holder = 1;
    let fi_addr = cache
        .pin()
        .resolve(holder, good)
        .expect("a good address")
        .fi_addr();
    let before = inserts();
    let misses = cache.stats().misses;
    let invalid = |what: &str, result: Result<u64, DmaError>| match result {
        Err(DmaError::InvalidAddress(why)) => assert!(why.contains("zero"), "{what}: {why}"),
        other => panic!("{what} of {} zero bytes: {other:?}", zero.len()),
    };
    for client in [holder, 2] {
        let pinned = cache.pin();
        // Twice under one pin: a refusal is never remembered as an entry.
        for _ in 0..2 {
            invalid(
                "resolve",
                pinned.resolve(client, &zero).map(|p| p.fi_addr()),
            );
            invalid(
                "try_resolve",
                pinned.try_resolve(client, &zero).map(|p| p.fi_addr()),
            );
        }
        drop(pinned);
        invalid(
            "lease",
            cache.lease(client, &zero).map(|lease| lease.fi_addr()),
        );
        invalid(
            "lease_within",
            cache
                .lease_within(client, &zero, Duration::from_secs(60))
                .map(|lease| lease.fi_addr()),
        );
    }
    cache.quiesce();
    assert_eq!(before, inserts(), "no insert of the zero address");
    assert_eq!(
        misses,
        cache.stats().misses,
        "not even a request to the writer"
    );
    let stats = cache.stats();
    assert_eq!(
        (1, 1, 0),
        (stats.entries, stats.clients, stats.leases),
        "{stats:?}"
    );
    assert_eq!(1, cache.indexed());
    assert_eq!(
        Ok(fi_addr),
        cache.pin().try_resolve(holder, good).map(|p| p.fi_addr()),
        "the holder keeps its entry"
    );
    // And the AV still takes real addresses.
    cache
        .pin()
        .resolve(3, good)
        .expect("another client on the good address");
}

#[test]
fn an_all_zero_address_is_refused_on_every_format_before_the_av() {
    for (format, len, good) in [
        (AddressFormat::Efa, 32, efa_numbered(7)),
        (AddressFormat::Opaque, 16, sockaddr(7)),
        (AddressFormat::Opaque, 28, vec![6; 28]),
        (AddressFormat::Opaque, 1, vec![1]),
    ] {
        let av = ModelAv::with_layout(format, len, 8);
        let cache = AddressCache::with_backend(av.clone());
        refuses_zero(&cache, &good, &|| av.inserts());
        assert!(
            av.violations().is_empty(),
            "{format:?}/{len}: {:?}",
            av.violations()
        );
    }
}

#[test]
fn an_all_zero_address_never_reaches_the_real_tcp_av() {
    let endpoint = tcp();
    let cache = endpoint.cache();
    let good = sockaddr(9);
    // The real AV has no insert counter: a zero address in it would be found by lookup.
    refuses_zero(cache, &good, &|| cache.stats().inserts);
    let pinned = cache.pin();
    let fi_addr = pinned.resolve(1, &good).expect("a hit").fi_addr();
    assert_eq!(
        Some(good.clone()),
        endpoint.lookup(fi_addr).expect("lookup")
    );
    drop(pinned);
    for client in [1, 3] {
        cache.release(client);
    }
    cache.quiesce();
    assert_eq!(0, cache.stats().entries);
}
