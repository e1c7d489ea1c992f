//! Multi-rail on loopback tcp rails (127.0.0.1, 127.0.0.2, ...):
//!
//! - `rails_transfer/<size>/<n> rails`: the time to move 64 MiB and 1 GiB from one rail set's
//!   memory into another's with one striped `RailSet::write`, over 1, 2 and 4 rails, from the
//!   post until the write's one completion has been read (the target drives progress on another
//!   thread; tcp moves bytes only while both sides call libfabric). On a 2-core machine the rails
//!   share two cores, so this measures the rail set's overhead and the loopback stack, not NIC
//!   scaling.
//! - `rails_hit`: the cost a rail set adds to a hit: pin and resolve one client on four rails
//!   (`RailSet::pin` + `RailPinned::resolve`) against four separate pin-and-resolves, one per
//!   rail's cache, and one rail alone for scale.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dma_libfabric::{Configuration, RailSet};

const PATIENCE: Duration = Duration::from_secs(120);

fn rails(count: usize) -> RailSet {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    let nodes: Vec<String> = (1..=count).map(|rail| format!("127.0.0.{rail}")).collect();
    let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
    RailSet::open(&configuration, &nodes).expect("tcp rails on loopback")
}

fn transfer(c: &mut Criterion) {
    let mut group = c.benchmark_group("rails_transfer");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    for (label, len) in [("64 MiB", 64_usize << 20), ("1 GiB", 1 << 30)] {
        group.throughput(Throughput::Bytes(len as u64));
        if len > 64 << 20 {
            // Ten samples of a gigabyte each already take many seconds on loopback.
            group.measurement_time(Duration::from_secs(20));
        } else {
            group.measurement_time(Duration::from_secs(5));
        }
        for count in [1, 2, 4] {
            let source = rails(count);
            let target = rails(count);
            let from = source.register(len).expect("source memory");
            let to = target.register(len).expect("target memory");
            from.write_bytes(0, &vec![0x5a; 4096]).unwrap();
            let addresses = target.local_addresses();
            let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        target.progress();
                    }
                });
                let mut id = 0;
                group.bench_function(format!("{label}/{count} rails"), |b| {
                    b.iter_custom(|iterations| {
                        let started = Instant::now();
                        for _ in 0..iterations {
                            id += 1;
                            let lease = source.lease(1, &addresses).expect("leased");
                            source
                                .write(lease, from.segment(0, len).unwrap(), to.remote(), id)
                                .expect("posted");
                            let done = source.wait_for(id, PATIENCE).expect("completed");
                            assert_eq!(Ok(()), done.result);
                        }
                        started.elapsed()
                    });
                });
                stop.store(true, Ordering::Relaxed);
            });
        }
    }
    group.finish();
}

fn hit(c: &mut Criterion) {
    let mut group = c.benchmark_group("rails_hit");
    let server = rails(4);
    let client = rails(4);
    let addresses = client.local_addresses();
    let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
    server.pin().resolve(1, &addresses).expect("registered");
    group.bench_function("rail set: pin + resolve, 4 rails", |b| {
        b.iter(|| {
            let pinned = server.pin();
            let peers = pinned.resolve(1, black_box(&addresses)).unwrap();
            black_box(peers.rail(3).fi_addr());
        })
    });
    group.bench_function("rail set: pin alone, 4 rails", |b| {
        b.iter(|| black_box(server.pin()))
    });
    group.bench_function("4 caches: pin + resolve each", |b| {
        b.iter(|| {
            for (rail, address) in addresses.iter().enumerate() {
                let pinned = server.rail(rail).cache().pin();
                black_box(pinned.resolve(1, black_box(address)).unwrap().fi_addr());
            }
        })
    });
    group.bench_function("4 caches: 4 pins held, then 4 resolves", |b| {
        b.iter(|| {
            let pins: Vec<_> = (0..4).map(|rail| server.rail(rail).cache().pin()).collect();
            for (pinned, address) in pins.iter().zip(&addresses) {
                black_box(pinned.resolve(1, black_box(address)).unwrap().fi_addr());
            }
        })
    });
    group.bench_function("1 cache: pin + resolve", |b| {
        b.iter(|| {
            let pinned = server.rail(0).cache().pin();
            black_box(
                pinned
                    .resolve(1, black_box(addresses[0]))
                    .unwrap()
                    .fi_addr(),
            );
        })
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    hit(&mut criterion);
    transfer(&mut criterion);
    criterion.final_summary();
}
