//! `send_from`: messages of any size from registered memory, completing like a write, on real
//! tcp;ofi_rxm endpoints (before, `send` refused anything past the 64-byte inject size).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Operation};
use testkit::PATIENCE;

fn rma_endpoint(receive_size: usize) -> LibfabricEndpoint {
    let configuration = Configuration {
        rma: true,
        receive_size,
        receive_buffers: 4,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("an RMA endpoint")
}

/// 4 KiB and 1 MiB messages arrive intact; each holds its lease until its completion is read.
#[test]
fn messages_of_any_size_go_from_registered_memory_and_hold_their_lease_until_completed() {
    const LARGE: usize = 1 << 20;
    let sender = rma_endpoint(64);
    let receiver = rma_endpoint(LARGE);
    let region = sender.register(LARGE).expect("registered");
    let pattern: Vec<u8> = (0..LARGE).map(|at| (at % 251) as u8).collect();
    region.write_bytes(0, &pattern).expect("written");
    let address = receiver.local_address().expect("address");
    for (id, len) in [(1_u64, 4096_usize), (2, LARGE)] {
        // The receiver drives its progress in `receive`: rxm connects on the first send.
        let received = std::thread::scope(|scope| {
            let receiving = scope.spawn(|| receiver.receive(PATIENCE));
            let lease = sender.peers().lease(1, &address).expect("a lease");
            sender
                .send_from_within(
                    lease,
                    region.segment(0, len).expect("segment"),
                    id,
                    PATIENCE,
                )
                .expect("posted");
            let completion = sender.wait_for(id, PATIENCE).expect("completed");
            assert_eq!(
                (id, Operation::Send, len, Ok(())),
                (
                    completion.id,
                    completion.operation,
                    completion.len,
                    completion.result
                )
            );
            receiving.join().expect("the receiving thread")
        });
        assert_eq!(Some(pattern[..len].to_vec()), received.expect("received"));
        assert_eq!(
            0,
            sender.peers().stats().leases,
            "dropped with the completion"
        );
    }
}

/// A lease of another endpoint's cache, memory of another endpoint and an endpoint without RMA
/// are refused before anything is posted.
#[test]
fn send_from_refuses_what_is_not_this_endpoints() {
    let sender = rma_endpoint(64);
    let other = rma_endpoint(64);
    let address = other.local_address().expect("address");
    let region = sender.register(64).expect("registered");
    let foreign_region = other.register(64).expect("registered");

    let foreign_lease = other.peers().lease(1, &address).expect("a lease");
    assert!(matches!(
        sender.send_from(foreign_lease, region.segment(0, 8).expect("segment"), 1),
        Err(DmaError::InvalidArgument(_))
    ));
    let lease = sender.peers().lease(1, &address).expect("a lease");
    assert!(matches!(
        sender.send_from(lease, foreign_region.segment(0, 8).expect("segment"), 2),
        Err(DmaError::InvalidArgument(_))
    ));
    assert_eq!(0, sender.operations_in_flight());
    assert_eq!(
        0,
        sender.peers().stats().leases,
        "the refused leases were dropped"
    );

    let plain = testkit::tcp();
    let lease = plain.peers().lease(1, &address).expect("a lease");
    assert!(matches!(
        plain.send_from(lease, region.segment(0, 8).expect("segment"), 3),
        Err(DmaError::InvalidArgument(_))
    ));
}
