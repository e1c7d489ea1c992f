//! A connect storm: a burst of new clients, every resolve a miss that reaches the real tcp
//! `fi_av_insert`, from 1, 2 and 4 posting threads (groups `storm_tcp_t1`, `_t2`, `_t4`). Ours blocking (`resolve`), ours queued (`try_resolve`, a
//! `Busy` answer retried until the miss is queued, then one `quiesce` for the round, timed, so
//! the row counts only requests that were queued), ours batched (`lease_all` of each thread's
//! share: 64 misses a writer request), and the seed's design under one lock
//! (`Mutex<reference model>`) doing the insert inline, each on an AV of its own endpoint.
//! Clean-up between rounds (releases and removals) is untimed for all three.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Kind, RefAv, Reference, parallel, sockaddr, tcp_endpoint};
use criterion::{Criterion, Throughput};
use dma_libfabric::DmaError;

/// New clients per round, split between the threads (below every AV's capacity).
const ROUND: u32 = 2_000;
/// Posting threads, one group each.
const THREADS: [usize; 3] = [1, 2, 4];

/// Misses timed since the last [`report_misses`]: what a profile of one contestant (`perf stat`,
/// callgrind, with criterion's `--profile-time`) divides its counts by.
static TIMED_MISSES: AtomicU64 = AtomicU64::new(0);

/// Print how many misses `name` timed, and start counting again.
fn report_misses(name: &str) {
    eprintln!(
        "{name}: {} misses timed",
        TIMED_MISSES.swap(0, Ordering::Relaxed)
    );
}

/// Time `iters` misses in rounds: `storm(first, count)` runs on each of `threads` threads with its
/// own clients (timed, with `finish()` after them, timed too), then `clean(first, total)`
/// (untimed).
fn rounds(
    threads: usize,
    iters: u64,
    next: &mut u32,
    storm: &(dyn Fn(u32, u32) + Sync),
    finish: &dyn Fn(),
    clean: &dyn Fn(u32, u32),
) -> Duration {
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let per_thread = (ROUND as u64).min(iters - done).div_ceil(threads as u64) as u32;
        let base = *next;
        let started = Instant::now();
        parallel(threads, u64::from(per_thread), &|thread, _| {
            storm(base + thread as u32 * per_thread, per_thread)
        });
        finish();
        timed += started.elapsed();
        let total = per_thread * threads as u32;
        clean(base, total);
        *next = (next.wrapping_add(total)) % 8_000_000;
        done += u64::from(total);
        TIMED_MISSES.fetch_add(u64::from(total), Ordering::Relaxed);
    }
    timed
}

fn storm(criterion: &mut Criterion) {
    let capacity = 4 * ROUND as usize;
    let ours = tcp_endpoint(capacity);
    let queued = tcp_endpoint(capacity);
    let batched = tcp_endpoint(capacity);
    let reference_endpoint = tcp_endpoint(capacity);
    let reference = Mutex::new(Reference::new(
        Kind::Tcp,
        RefAv::Raw(reference_endpoint.address_vector()),
        capacity,
    ));
    let mut next = 0_u32;
    for threads in THREADS {
        storm_on(
            criterion,
            threads,
            &mut next,
            [&ours, &queued, &batched],
            &reference,
        );
    }
}

/// The storm's four contestants on `threads` posting threads.
fn storm_on(
    criterion: &mut Criterion,
    threads: usize,
    next: &mut u32,
    [ours, queued, batched]: [&dma_libfabric::LibfabricEndpoint; 3],
    reference: &Mutex<Reference>,
) {
    let mut group = criterion.benchmark_group(format!("storm_tcp_t{threads}"));
    group.throughput(Throughput::Elements(1));

    let release = |cache: &dma_libfabric::AddressCache, first: u32, total: u32| {
        for n in first..first + total {
            cache.release(u64::from(n));
        }
        cache.quiesce();
        assert_eq!(0, cache.stats().entries);
    };

    group.bench_function("ours_blocking", |b| {
        let cache = ours.cache();
        b.iter_custom(|iters| {
            rounds(
                threads,
                iters,
                &mut *next,
                &|first, count| {
                    for n in first..first + count {
                        let pinned = cache.pin();
                        black_box(pinned.resolve(u64::from(n), &sockaddr(n)).unwrap());
                    }
                },
                &|| {},
                &|first, total| release(cache, first, total),
            )
        })
    });
    report_misses(&format!("storm_tcp_t{threads}/ours_blocking"));
    // How many answers were Busy (a full inbox, nothing queued) and retried.
    let busy = AtomicU64::new(0);
    let queued_misses = AtomicU64::new(0);
    group.bench_function("ours_queued", |b| {
        let cache = queued.cache();
        b.iter_custom(|iters| {
            rounds(
                threads,
                iters,
                &mut *next,
                &|first, count| {
                    for n in first..first + count {
                        // WouldBlock means queued; Busy queued nothing, so ask again.
                        loop {
                            let pinned = cache.pin();
                            match pinned.try_resolve(u64::from(n), &sockaddr(n)) {
                                Err(DmaError::WouldBlock) => break,
                                Err(DmaError::Busy) => {
                                    busy.fetch_add(1, Ordering::Relaxed);
                                    drop(pinned);
                                    std::thread::yield_now();
                                }
                                other => panic!("a new client's try_resolve: {other:?}"),
                            }
                        }
                    }
                    queued_misses.fetch_add(u64::from(count), Ordering::Relaxed);
                },
                // The round ends when every queued miss is in the AV.
                &|| cache.quiesce(),
                &|first, total| {
                    assert_eq!(u64::from(total), cache.stats().clients);
                    release(cache, first, total);
                },
            )
        })
    });
    report_misses(&format!("storm_tcp_t{threads}/ours_queued"));
    eprintln!(
        "storm_tcp_t{threads}/ours_queued: {} misses queued, {} Busy answers retried",
        queued_misses.load(Ordering::Relaxed),
        busy.load(Ordering::Relaxed)
    );
    // One call a thread for its whole share: the misses go to the writer 64 to a request.
    group.bench_function("ours_lease_all", |b| {
        let cache = batched.cache();
        b.iter_custom(|iters| {
            rounds(
                threads,
                iters,
                &mut *next,
                &|first, count| {
                    let addresses: Vec<Vec<u8>> = (first..first + count).map(sockaddr).collect();
                    let requests: Vec<(u64, &[u8])> = addresses
                        .iter()
                        .zip(first..)
                        .map(|(address, n)| (u64::from(n), &address[..]))
                        .collect();
                    for lease in cache.lease_all(&requests) {
                        black_box(lease.unwrap().fi_addr());
                    }
                },
                &|| {},
                &|first, total| {
                    assert_eq!(u64::from(total), cache.stats().clients);
                    release(cache, first, total);
                },
            )
        })
    });
    report_misses(&format!("storm_tcp_t{threads}/ours_lease_all"));
    group.bench_function("mutex_reference", |b| {
        b.iter_custom(|iters| {
            rounds(
                threads,
                iters,
                &mut *next,
                &|first, count| {
                    for n in first..first + count {
                        let entry = reference
                            .lock()
                            .unwrap()
                            .handle(u64::from(n), &sockaddr(n))
                            .unwrap();
                        black_box(entry.fi_addr());
                    }
                },
                &|| {},
                &|_, _| reference.lock().unwrap().clear(),
            )
        })
    });
    report_misses(&format!("storm_tcp_t{threads}/mutex_reference"));
    group.finish();
}

fn main() {
    let mut criterion = common::criterion();
    storm(&mut criterion);
    criterion.final_summary();
}
