//! A completed write is a delivered write, by default (`Configuration::write_completion`,
//! issue 42 item 9), on real tcp;ofi_rxm endpoints.
//!
//! Before, writes were posted with `FI_COMPLETION` alone: on tcp a 64 MiB write completed once
//! its bytes were in the local socket, and a target that stopped progressing at that moment read
//! 3,674,141 of 67,108,864 bytes still wrong. Now a write completes once the target's provider
//! has placed the last byte and acknowledged it, so whatever the target does after the
//! completion, its region holds every byte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};

use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint, WriteCompletion};
use testkit::PATIENCE;

const LEN: usize = 64 << 20;

fn open(write_completion: WriteCompletion) -> LibfabricEndpoint {
    let configuration = Configuration {
        rma: true,
        write_completion,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("an RMA endpoint")
}

/// The pattern byte at `at` for round `round`: every byte differs from the region's zeros.
fn pattern(round: u8, at: usize) -> u8 {
    ((at % 251) as u8).wrapping_add(round) | 1
}

/// Write `LEN` bytes from a registered `Vec` into the target's region; the moment the write's
/// completion is read, the target stops progressing (its progress thread is told to stop before
/// anything else happens); then count the target's bytes that are not the ones written.
fn wrong_bytes_once_the_target_stops(write_completion: WriteCompletion, round: u8) -> usize {
    let server = open(write_completion);
    let client = open(WriteCompletion::default());
    let target = client.register(LEN).expect("the target's region");
    let source: Vec<u8> = (0..LEN).map(|at| pattern(round, at)).collect();
    let source = server
        .register_buffer(source, Exposure::Local)
        .expect("the source, in place");
    let address = client.local_address().expect("address");
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Acquire) {
                client.progress();
                let _ = client.try_receive();
            }
        });
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write_within(
                lease,
                source.segment(0, LEN).expect("segment"),
                target.remote(),
                7,
                PATIENCE,
            )
            .expect("posted");
        let completion = server.wait_for(7, PATIENCE).expect("completed");
        stop.store(true, Ordering::Release);
        assert_eq!(Ok(()), completion.result);
    });
    let mut landed = vec![0_u8; LEN];
    target.read_bytes(0, &mut landed).expect("read the region");
    landed
        .iter()
        .enumerate()
        .filter(|&(at, &byte)| byte != pattern(round, at))
        .count()
}

#[test]
fn a_completed_write_has_every_byte_at_the_target_by_default() {
    assert_eq!(
        WriteCompletion::Delivered,
        Configuration::default().write_completion
    );
    for round in 0..3 {
        assert_eq!(
            0,
            wrong_bytes_once_the_target_stops(WriteCompletion::Delivered, round),
            "round {round}: bytes missing at the target after the write completed"
        );
    }
}

/// The local completion stays available, and still completes and lands (given progress); whether
/// its bytes are all there at the completion is what it does not promise, so that is printed,
/// not asserted.
#[test]
fn a_local_completion_is_still_a_write() {
    let wrong = wrong_bytes_once_the_target_stops(WriteCompletion::Local, 9);
    eprintln!("WriteCompletion::Local: {wrong} of {LEN} bytes not yet there at the completion");
    assert!(wrong <= LEN);
}
