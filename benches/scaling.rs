//! Scaling: aggregate hit throughput on 1, 2, 4 and 8 threads, ours (batch mode: a pin per 256
//! resolves) next to each baseline, on warm tcp caches of 1,000 and 100,000 live entries. Every
//! thread probes the same keys, each from its own offset into the same random order.
//!
//! `papaya_floor` is papaya's own `get` of the same `(client, identity)` keys on the same threads,
//! one guard per 256 probes as ours holds one pin per 256: its ratio of 2 threads to 1 says what
//! the machine allows a papaya probe (issue 43, item 2).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::Mutex;

use common::{Keys, Kind, Reference, parallel, tcp_endpoint};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use dma_libfabric::sys::fi_addr_t;

/// Resolves per pin in batch mode.
const BATCH: u64 = 256;

fn offset(thread: usize) -> usize {
    thread * 7_919
}

/// A baseline's bench: `threads` threads, each walking the keys from its own offset with its own
/// cursor, as ours does, and probing through `probe`, in the same loop shape for every baseline.
fn probes<F>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    threads: usize,
    keys: &Keys,
    name: &str,
    probe: F,
) where
    F: Fn(u64, &[u8]) -> fi_addr_t + Sync,
{
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            parallel(threads, iters, &|thread, iters| {
                let mut cursor = keys.cursor(offset(thread));
                for _ in 0..iters {
                    let (client, address) = cursor.next_probe();
                    black_box(probe(client, address));
                }
            })
        })
    });
}

fn scaling(criterion: &mut Criterion) {
    let kind = Kind::Tcp;
    let identity_len = kind.identity_len();
    for n in [1_000, 100_000] {
        let keys = Keys::new(kind, n);
        let endpoint = tcp_endpoint(n.max(4096));
        common::warm(endpoint.cache(), &keys);
        let cache = endpoint.cache();
        let plain = common::plain(&keys);
        let reference = Mutex::new(Reference::warmed(kind, &keys));
        let rwlock = common::rwlock(&keys);
        let dashmap = common::dashmap(&keys);
        let floor = common::floor(&keys, n.max(4096));
        for threads in [1, 2, 4, 8] {
            let mut group = criterion.benchmark_group(format!("scaling_tcp_{n}_t{threads}"));
            group.throughput(Throughput::Elements(threads as u64));
            group.bench_function("ours", |b| {
                b.iter_custom(|iters| {
                    parallel(threads, iters, &|thread, iters| {
                        let mut cursor = keys.cursor(offset(thread));
                        let mut done = 0;
                        while done < iters {
                            let pinned = cache.pin();
                            for _ in 0..BATCH.min(iters - done) {
                                let (client, address) = cursor.next_probe();
                                black_box(pinned.resolve(client, address).unwrap().fi_addr());
                            }
                            done += BATCH;
                        }
                    })
                })
            });
            group.bench_function("papaya_floor", |b| {
                b.iter_custom(|iters| {
                    parallel(threads, iters, &|thread, iters| {
                        let mut cursor = keys.cursor(offset(thread));
                        let mut done = 0;
                        while done < iters {
                            let guard = floor.guard();
                            for _ in 0..BATCH.min(iters - done) {
                                let (client, address) = cursor.next_probe();
                                let found = common::probe_floor(
                                    &floor,
                                    &guard,
                                    identity_len,
                                    client,
                                    address,
                                );
                                black_box(found.unwrap());
                            }
                            done += BATCH;
                        }
                    })
                })
            });
            probes(&mut group, threads, &keys, "hashmap", |client, address| {
                common::probe(&plain, identity_len, client, address).unwrap()
            });
            probes(
                &mut group,
                threads,
                &keys,
                "mutex_reference",
                |client, address| common::probe_reference(&reference, client, address),
            );
            probes(
                &mut group,
                threads,
                &keys,
                "rwlock_hashmap",
                |client, address| {
                    common::probe_rwlock(&rwlock, identity_len, client, address).unwrap()
                },
            );
            probes(&mut group, threads, &keys, "dashmap", |client, address| {
                common::probe_dashmap(&dashmap, identity_len, client, address).unwrap()
            });
            group.finish();
        }
        assert_eq!(n as u64, cache.stats().misses, "every probe must have hit");
    }
}

fn main() {
    let mut criterion = common::criterion();
    scaling(&mut criterion);
    criterion.final_summary();
}
