//! Endpoints leak nothing. Its own test binary, so no other test opens descriptors meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, LibfabricEndpoint};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

#[test]
fn opening_and_dropping_endpoints_leaks_no_descriptors() {
    let open = || {
        LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).expect("tcp endpoint")
    };
    // Warm up: libfabric opens some process-wide descriptors on first use.
    drop(open());
    let before = open_descriptors();
    for _ in 0..100 {
        let endpoint = open();
        let pinned = endpoint.cache().pin();
        pinned
            .resolve(1, &endpoint.local_address().expect("address"))
            .expect("resolve");
    }
    let after = open_descriptors();
    assert!(
        after <= before,
        "{before} descriptors before, {after} after 100 endpoints"
    );
}
