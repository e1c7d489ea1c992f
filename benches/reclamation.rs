//! Reclamation delay: the time from a client's last `release` to its entry's `fi_av_remove`, on
//! a real tcp AV, while a reader thread pins, resolves and unpins continuously. The AV is wrapped
//! in a backend that stamps each removal, so the delay is measured where it ends: in the writer,
//! at the moment `fi_av_remove` returns.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{sockaddr, tcp_endpoint};
use criterion::Criterion;
use dma_libfabric::sys::fi_addr_t;
use dma_libfabric::{AddressCache, DmaError, FabricAv};
use testkit::{Observed, Observer};

/// Stamps every removal on the real AV.
struct Stamped {
    base: Instant,
    removes: Arc<AtomicU64>,
    removed_at: Arc<AtomicU64>,
}

impl Observer for Stamped {
    fn after_remove(&mut self, _: fi_addr_t, _: &Result<(), DmaError>) {
        self.removed_at
            .store(self.base.elapsed().as_nanos() as u64, Ordering::Release);
        self.removes.fetch_add(1, Ordering::Release);
    }
}

fn reclamation(criterion: &mut Criterion) {
    let host = tcp_endpoint(4096);
    let base = Instant::now();
    let removes = Arc::new(AtomicU64::new(0));
    let removed_at = Arc::new(AtomicU64::new(0));
    // SAFETY: `host`'s AV is open, of a FI_THREAD_SAFE domain, with 16-byte addresses, and stays
    // open until `cache` is dropped (declared after `host`, so dropped first); nothing else
    // inserts into or removes from it (the host's own cache is never used).
    let inner =
        unsafe { FabricAv::from_raw(host.address_vector(), host.describe().addr_format, 16, 4096) };
    let cache = AddressCache::with_backend(Observed {
        av: inner,
        observer: Stamped {
            base,
            removes: Arc::clone(&removes),
            removed_at: Arc::clone(&removed_at),
        },
    });
    let reader_address = sockaddr(1);
    cache.pin().resolve(1, &reader_address).unwrap();
    let stop = AtomicBool::new(false);
    let mut delays: Vec<u64> = Vec::new();
    let target = sockaddr(2);

    std::thread::scope(|scope| {
        scope.spawn(|| {
            // The readers' traffic: pin, resolve, unpin, as posting threads do.
            while !stop.load(Ordering::Relaxed) {
                let pinned = cache.pin();
                black_box(pinned.resolve(1, &reader_address).unwrap().fi_addr());
            }
        });
        let mut group = criterion.benchmark_group("reclamation_tcp");
        group.sample_size(10);
        group.bench_function("release_to_fi_av_remove", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    cache.pin().resolve(2, &target).unwrap();
                    let before = removes.load(Ordering::Acquire);
                    let released = base.elapsed().as_nanos() as u64;
                    cache.release(2);
                    while removes.load(Ordering::Acquire) == before {
                        std::thread::yield_now();
                    }
                    let delay = removed_at.load(Ordering::Acquire).saturating_sub(released);
                    delays.push(delay);
                    total += Duration::from_nanos(delay);
                }
                total
            })
        });
        group.finish();
        stop.store(true, Ordering::Relaxed);
    });

    delays.sort_unstable();
    let at = |fraction: f64| delays[((delays.len() - 1) as f64 * fraction) as usize] as f64;
    common::record("reclamation", "samples", delays.len() as f64);
    common::record("reclamation", "median_ns", at(0.5));
    common::record("reclamation", "p99_ns", at(0.99));
    common::record("reclamation", "max_ns", at(1.0));
    cache.release(1);
    cache.quiesce();
    assert_eq!(0, cache.stats().entries);
}

fn main() {
    common::reset("reclamation");
    let mut criterion = common::criterion();
    reclamation(&mut criterion);
    criterion.final_summary();
}
