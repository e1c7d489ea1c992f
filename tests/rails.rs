//! Multi-rail on real tcp rails bound to 127.0.0.1, 127.0.0.2, ...: opening, resolving and
//! leasing on every rail, memory on every rail, striped RMA with one completion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, MIN_STRIPE, Operation, RailRemoteRegion, RailSet};
use testkit::{PATIENCE, rma_rails, wait_for_rail_bytes, with_rails_progress};

fn addresses(rails: &RailSet) -> Vec<Vec<u8>> {
    rails.local_addresses()
}

fn slices(addresses: &[Vec<u8>]) -> Vec<&[u8]> {
    addresses.iter().map(Vec::as_slice).collect()
}

/// A pattern that differs at every offset of a stripe, so a stripe landing at the wrong place
/// shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|at| (at as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

#[test]
fn a_striped_write_lands_whole_and_completes_once() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    let len = 4 * MIN_STRIPE + 300;
    let target = client.register(len).expect("client memory");
    let source = server.register(len).expect("server memory");
    let data = pattern(len, 1);
    source.write_bytes(0, &data).unwrap();
    let addresses = addresses(&client);
    with_rails_progress(&client, || {
        let lease = server
            .lease(1, &slices(&addresses))
            .expect("leased on both rails");
        server
            .write(lease, source.segment(0, len).unwrap(), target.remote(), 7)
            .expect("posted");
        let done = server.wait_for(7, PATIENCE).expect("completed");
        assert_eq!(
            (7, Operation::Write, len, Ok(())),
            (done.id, done.operation, done.len, done.result)
        );
        wait_for_rail_bytes(&target, 0, &data);
    });
    let bytes = server.bytes_per_rail();
    assert_eq!(len as u64, bytes.iter().sum::<u64>());
    assert!(
        bytes.iter().all(|&rail| rail >= MIN_STRIPE as u64),
        "{bytes:?}"
    );
    assert_eq!(1, server.striped_transfers());
    assert_eq!(0, server.transfers_in_flight());
    let mut more = Vec::new();
    server.poll_completions(&mut more).unwrap();
    assert!(more.is_empty(), "one completion per transfer: {more:?}");
}
