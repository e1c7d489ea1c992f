//! Zero copy against copy-then-write, on loopback tcp (`cargo bench --bench zero_copy`):
//!
//! - `zero_copy_write/<size>/in_place`: an `fi_write` of the application's `Vec`, registered once
//!   in place with `register_buffer`, from the post until its completion has been read;
//! - `zero_copy_write/<size>/copy_then_write`: what the application did before: `write_bytes` of
//!   the same `Vec` into a region of `register(len)`, then the same write.
//!
//! Sizes: 4 KiB (a KV page: latency) and 64 MiB (a model shard: throughput). The target drives
//! progress on another thread. Criterion's time per iteration is the latency; its throughput is
//! bytes per second. Then, once, the resident memory each way costs for a 64 MiB buffer the
//! application already holds: registering it in place adds no pages, a region to copy it into
//! adds the buffer's size again. Figures go to `target/bench-results/zero_copy.tsv` too.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};

const PATIENCE: Duration = Duration::from_secs(120);

fn endpoint() -> LibfabricEndpoint {
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("tcp on loopback")
}

/// Resident memory of this process, in bytes.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("zero_copy_write");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for (label, len) in [("4 KiB", 4096_usize), ("64 MiB", 64 << 20)] {
        group.throughput(Throughput::Bytes(len as u64));
        let source = endpoint();
        let target = endpoint();
        let landing = target.register(len).expect("target memory");
        let address = target.local_address().unwrap();
        let data: Vec<u8> = (0..len).map(|at| at as u8).collect();
        let in_place = source
            .register_buffer(data.clone(), Exposure::Local)
            .expect("registered in place");
        let staging = source.register(len).expect("a region to copy into");
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    target.progress();
                }
            });
            let mut id = 0;
            let mut write = |segment| {
                id += 1;
                let lease = source.cache().lease(1, &address).expect("leased");
                source
                    .write(lease, segment, landing.remote(), id)
                    .expect("posted");
                let done = source.wait_for(id, PATIENCE).expect("completed");
                assert_eq!(Ok(()), done.result);
            };
            group.bench_function(format!("{label}/in_place"), |b| {
                b.iter_custom(|iterations| {
                    let started = Instant::now();
                    for _ in 0..iterations {
                        write(in_place.segment(0, len).unwrap());
                    }
                    started.elapsed()
                });
            });
            group.bench_function(format!("{label}/copy_then_write"), |b| {
                b.iter_custom(|iterations| {
                    let started = Instant::now();
                    for _ in 0..iterations {
                        staging.write_bytes(0, &data).unwrap();
                        write(staging.segment(0, len).unwrap());
                    }
                    started.elapsed()
                });
            });
            stop.store(true, Ordering::Relaxed);
        });
    }
    group.finish();
}

/// Resident memory added by making 64 MiB the application holds (written, so resident) ready to
/// write: in place, and by copying it into a region.
fn resident_memory() {
    const LEN: usize = 64 << 20;
    common::reset("zero_copy");
    let endpoint = endpoint();
    let data = vec![0x5a_u8; LEN];
    let before = resident();
    let in_place = endpoint
        .register_buffer(data, Exposure::Local)
        .expect("registered");
    let added_in_place = resident().saturating_sub(before);
    let before = resident();
    let region = endpoint.register(LEN).expect("a region");
    region
        .write_bytes(0, &in_place.as_slice().expect("idle"))
        .expect("fits");
    let added_by_copy = resident().saturating_sub(before);
    common::record(
        "zero_copy",
        "rss_added_in_place_mib",
        added_in_place as f64 / f64::from(1 << 20),
    );
    common::record(
        "zero_copy",
        "rss_added_by_copy_mib",
        added_by_copy as f64 / f64::from(1 << 20),
    );
}

fn main() {
    resident_memory();
    let mut criterion = Criterion::default().configure_from_args();
    writes(&mut criterion);
    criterion.final_summary();
}
