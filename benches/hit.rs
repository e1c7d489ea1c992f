//! The hit path on one thread: `pinned.resolve` on a warm cache of 1,000 and 100,000 live
//! entries, efa (32-byte addresses, model AV) and tcp (16-byte, real AV), in batch mode (one pin,
//! many resolves) and single-shot mode (pin, resolve, unpin), next to the baselines probing the
//! same keys in the same order with the same hasher; and what a lease adds to a round.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use common::{Keys, Kind, Reference, Subject};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use dma_libfabric::sys::fi_addr_t;

/// A baseline's bench: one probe an iteration through `probe`, in the same loop shape as ours
/// and every other baseline, continuing the shared walk through the keys at `step`.
fn probes<F>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    keys: &Keys,
    step: &mut usize,
    name: &str,
    probe: F,
) where
    F: Fn(u64, &[u8]) -> fi_addr_t,
{
    group.bench_function(name, |b| {
        b.iter(|| {
            *step += 1;
            let (client, address) = keys.probe(*step);
            black_box(probe(client, address))
        })
    });
}

fn hit(criterion: &mut Criterion) {
    for kind in [Kind::Efa, Kind::Tcp] {
        for n in [1_000, 100_000] {
            let keys = Keys::new(kind, n);
            let identity_len = kind.identity_len();
            let subject = Subject::new(kind, n.max(4096));
            subject.warm(&keys);
            let plain = common::plain(&keys);
            let reference = Mutex::new(Reference::warmed(kind, &keys));
            let rwlock = common::rwlock(&keys);
            let dashmap = common::dashmap(&keys);

            let mut group = criterion.benchmark_group(format!("hit_{}_{n}", kind.name()));
            group.throughput(Throughput::Elements(1));
            let mut step = 0_usize;
            macro_rules! ours {
                ($cache:expr) => {{
                    let cache = $cache;
                    group.bench_function("ours_batch", |b| {
                        let pinned = cache.pin();
                        b.iter(|| {
                            step += 1;
                            let (client, address) = keys.probe(step);
                            black_box(pinned.resolve(client, address).unwrap().fi_addr())
                        })
                    });
                    group.bench_function("ours_single", |b| {
                        b.iter(|| {
                            step += 1;
                            let (client, address) = keys.probe(step);
                            let pinned = cache.pin();
                            black_box(pinned.resolve(client, address).unwrap().fi_addr())
                        })
                    });
                }};
            }
            match &subject {
                Subject::Tcp(endpoint) => ours!(endpoint.peers()),
                Subject::Efa(cache) => ours!(cache),
            }
            probes(
                &mut group,
                &keys,
                &mut step,
                "hashmap",
                |client, address| common::probe(&plain, identity_len, client, address).unwrap(),
            );
            probes(
                &mut group,
                &keys,
                &mut step,
                "mutex_reference",
                |client, address| common::probe_reference(&reference, client, address),
            );
            probes(
                &mut group,
                &keys,
                &mut step,
                "rwlock_hashmap",
                |client, address| {
                    common::probe_rwlock(&rwlock, identity_len, client, address).unwrap()
                },
            );
            probes(
                &mut group,
                &keys,
                &mut step,
                "dashmap",
                |client, address| {
                    common::probe_dashmap(&dashmap, identity_len, client, address).unwrap()
                },
            );
            group.finish();
            let misses = match &subject {
                Subject::Tcp(endpoint) => endpoint.peers().stats().misses,
                Subject::Efa(cache) => cache.stats().misses,
            };
            assert_eq!(n as u64, misses, "every probe after warming must have hit");
        }
    }
}

/// What a lease costs: a `pin → resolve → lease → drop` round next to `pin → resolve → drop`, on
/// one thread and on two, and the same round with an `Arc` clone and drop added, which is what a
/// `'static` lease holding its cache by `Arc` would cost on top (one shared counter for every
/// posting thread, where the borrowed lease touches a counter of its entry's own).
fn lease(criterion: &mut Criterion) {
    let keys = Keys::new(Kind::Tcp, 1_000);
    let endpoint = common::tcp_endpoint(4096);
    let cache = endpoint.peers();
    {
        let pinned = cache.pin();
        for step in 0..keys.len() {
            let (client, address) = keys.probe(step);
            pinned.resolve(client, address).unwrap();
        }
    }
    let shared = Arc::new(());
    let mut group = criterion.benchmark_group("lease_tcp_1000");
    group.throughput(Throughput::Elements(1));
    let round = |step: usize, arc: Option<&Arc<()>>| {
        let (client, address) = keys.probe(step);
        let pinned = cache.pin();
        let peer = pinned.resolve(client, address).unwrap();
        let lease = pinned.lease(peer).unwrap();
        let held = arc.map(Arc::clone);
        drop(pinned);
        black_box(lease.fi_addr());
        drop(held);
        drop(lease);
    };
    for threads in [1_usize, 2] {
        for (name, arc) in [("lease_round", None), ("lease_round_arc", Some(&shared))] {
            group.bench_function(format!("{name}_t{threads}"), |b| {
                b.iter_custom(|iterations| {
                    let barrier = Barrier::new(threads);
                    let started = Instant::now();
                    std::thread::scope(|scope| {
                        for thread in 0..threads {
                            let (barrier, round) = (&barrier, &round);
                            scope.spawn(move || {
                                barrier.wait();
                                for step in 0..iterations as usize {
                                    round(step * threads + thread, arc);
                                }
                            });
                        }
                    });
                    started.elapsed()
                })
            });
        }
    }
    group.bench_function("pin_resolve_t1", |b| {
        let mut step = 0_usize;
        b.iter(|| {
            step += 1;
            let (client, address) = keys.probe(step);
            let pinned = cache.pin();
            black_box(pinned.resolve(client, address).unwrap().fi_addr())
        })
    });
    group.finish();
    assert_eq!(0, cache.stats().leases, "every lease was dropped");
}

fn main() {
    let mut criterion = common::criterion();
    hit(&mut criterion);
    lease(&mut criterion);
    criterion.final_summary();
}
