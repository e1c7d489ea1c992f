//! The miss path: resolving a new address (the writer round trip plus the real tcp
//! `fi_av_insert`), next to a bare `fi_av_insert` on the same kind of AV; and the "no cache"
//! baseline: `fi_av_insert` + `fi_av_remove` around every transfer.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{av_insert, av_remove, sockaddr, tcp_endpoint};
use criterion::{Criterion, Throughput};

/// New addresses per round before the untimed clean-up (below the AV's capacity).
const ROUND: u64 = 1_000;

fn miss(criterion: &mut Criterion) {
    let ours = tcp_endpoint(4 * ROUND as usize);
    let bare = tcp_endpoint(4 * ROUND as usize);
    let av = bare.address_vector();
    let mut group = criterion.benchmark_group("miss_tcp");
    group.throughput(Throughput::Elements(1));
    let mut next = 0_u32;

    group.bench_function("ours_miss", |b| {
        b.iter_custom(|iters| timed_misses(ours.cache(), iters, &mut next))
    });
    assert_eq!(0, ours.cache().stats().entries);

    // The same misses with 10,000 live entries in the AV: what a bigger AV costs by itself, for
    // the next row to be read against.
    let live = tcp_endpoint(4 * ROUND as usize + HELD);
    {
        let pinned = live.cache().pin();
        for client in 0..HELD as u64 {
            pinned
                .resolve(1_000_000 + client, &sockaddr(2_000_000 + client as u32))
                .unwrap();
        }
    }
    group.bench_function("ours_miss_10k_live_entries", |b| {
        b.iter_custom(|iters| timed_misses(live.cache(), iters, &mut next))
    });

    // The same misses while 10,000 removals wait for their leases: the writer learns of a lease's
    // last drop when it happens, so those removals cost a miss nothing (they used to be rescanned
    // on every round).
    let held = tcp_endpoint(4 * ROUND as usize + HELD);
    let leases: Vec<_> = (0..HELD as u64)
        .map(|client| {
            held.cache()
                .lease(1_000_000 + client, &sockaddr(2_000_000 + client as u32))
                .unwrap()
        })
        .collect();
    for client in 0..HELD as u64 {
        held.cache().release(1_000_000 + client);
    }
    held.cache().quiesce_with_patience(Duration::ZERO);
    assert_eq!(HELD as u64, held.cache().stats().removals_awaiting_leases);
    group.bench_function("ours_miss_10k_removals_awaiting_leases", |b| {
        b.iter_custom(|iters| timed_misses(held.cache(), iters, &mut next))
    });
    drop(leases);

    group.bench_function("bare_fi_av_insert", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut inserted = Vec::with_capacity(ROUND as usize);
            let mut done = 0;
            while done < iters {
                let round = ROUND.min(iters - done);
                for _ in 0..round {
                    next = next.wrapping_add(1) % 1_000_000;
                    let address = sockaddr(next);
                    let started = Instant::now();
                    let fi_addr = av_insert(av, &address).unwrap();
                    timed += started.elapsed();
                    inserted.push(fi_addr);
                }
                for fi_addr in inserted.drain(..) {
                    av_remove(av, fi_addr);
                }
                done += round;
            }
            timed
        })
    });

    group.bench_function("no_cache_insert_remove", |b| {
        b.iter(|| {
            next = next.wrapping_add(1) % 1_000_000;
            let address = sockaddr(next);
            let fi_addr = av_insert(av, &address).unwrap();
            black_box(fi_addr);
            av_remove(av, fi_addr);
        })
    });

    group.bench_function("bare_fi_av_remove", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            let mut inserted = Vec::with_capacity(ROUND as usize);
            let mut done = 0;
            while done < iters {
                let round = ROUND.min(iters - done);
                for _ in 0..round {
                    next = next.wrapping_add(1) % 1_000_000;
                    inserted.push(av_insert(av, &sockaddr(next)).unwrap());
                }
                for fi_addr in inserted.drain(..) {
                    let started = Instant::now();
                    av_remove(av, fi_addr);
                    timed += started.elapsed();
                }
                done += round;
            }
            timed
        })
    });
    group.finish();
}

/// Removals held by leases in the second miss row.
const HELD: usize = 10_000;

/// `iters` misses on `cache`, timed one by one, in rounds of [`ROUND`] new clients each released
/// and quiesced (untimed) after the round.
fn timed_misses(cache: &dma_libfabric::AddressCache, iters: u64, next: &mut u32) -> Duration {
    let mut timed = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let round = ROUND.min(iters - done);
        for client in 0..round {
            *next = next.wrapping_add(1) % 1_000_000;
            let address = sockaddr(*next);
            let pinned = cache.pin();
            let started = Instant::now();
            let peer = pinned.resolve(client, &address).unwrap();
            timed += started.elapsed();
            black_box(peer.fi_addr());
        }
        // Untimed: let every entry go and wait for the removals. Without patience for what
        // pinned readers hold back: nothing is pinned, and the removals that wait for leases in
        // the third row would otherwise hold each quiesce for its whole patience.
        for client in 0..round {
            cache.release(client);
        }
        cache.quiesce_with_patience(Duration::ZERO);
        done += round;
    }
    timed
}

fn main() {
    let mut criterion = common::criterion();
    miss(&mut criterion);
    criterion.final_summary();
}
