//! RMA endpoints dropped with operations in flight leak no descriptors and do not crash. Its own
//! test binary, so no other test opens descriptors meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use testkit::rma_tcp;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// A server connects to a client, then posts reads to it while it no longer progresses, so
/// none completes, and is dropped with them in flight (abandoned after `DRAIN_PATIENCE`).
fn abandon_reads() {
    let client = rma_tcp();
    let target = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");
    let server = rma_tcp();
    let source = server.register(64).expect("server memory");
    source.write_bytes(0, &[0xab; 8]).expect("fits");
    let lease = server.cache().lease(1, &address).expect("a lease");
    // Connect: tcp connects on the first transfer, while the target progresses.
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                client.progress();
                std::thread::yield_now();
            }
        });
        server
            .write(
                lease.clone(),
                source.segment(0, 8).expect("segment"),
                target.remote(),
                99,
            )
            .expect("posted");
        server
            .wait_for(99, Duration::from_secs(20))
            .expect("connected");
        // tcp completes a write once sent: let it land before the client stops progressing.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut landed = [0; 8];
        while landed != [0xab; 8] && std::time::Instant::now() < deadline {
            target.read_bytes(0, &mut landed).expect("in range");
        }
        stop.store(true, Ordering::Relaxed);
    });
    for id in 0..8 {
        server
            .read(
                lease.clone(),
                source.segment(0, 8).expect("segment"),
                target.remote(),
                id,
            )
            .expect("posted");
    }
    drop(lease);
    drop(source);
    assert_eq!(8, server.operations_in_flight());
    drop(server);
}

#[test]
fn endpoints_dropped_with_reads_in_flight_leak_no_descriptors() {
    // Warm up: libfabric opens some process-wide descriptors on first use.
    abandon_reads();
    let before = open_descriptors();
    for _ in 0..3 {
        abandon_reads();
    }
    let after = open_descriptors();
    assert!(
        after <= before,
        "{before} descriptors before, {after} after"
    );
}
