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
            let lease = sender.cache().lease(1, &address).expect("a lease");
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
            sender.cache().stats().leases,
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

    let foreign_lease = other.cache().lease(1, &address).expect("a lease");
    assert!(matches!(
        sender.send_from(foreign_lease, region.segment(0, 8).expect("segment"), 1),
        Err(DmaError::InvalidArgument(_))
    ));
    let lease = sender.cache().lease(1, &address).expect("a lease");
    assert!(matches!(
        sender.send_from(lease, foreign_region.segment(0, 8).expect("segment"), 2),
        Err(DmaError::InvalidArgument(_))
    ));
    assert_eq!(0, sender.operations_in_flight());
    assert_eq!(
        0,
        sender.cache().stats().leases,
        "the refused leases were dropped"
    );

    let plain = testkit::tcp();
    let lease = plain.cache().lease(1, &address).expect("a lease");
    assert!(matches!(
        plain.send_from(lease, region.segment(0, 8).expect("segment"), 3),
        Err(DmaError::InvalidArgument(_))
    ));
}

/// `receive_into` lands a message in registered memory with its length; one longer than the
/// destination completes with `FI_ETRUNC`; memory of another endpoint is refused; and an
/// endpoint dropped with a `receive_into` still posted cancels it rather than wait.
#[test]
fn receive_into_lands_messages_in_registered_memory_and_reports_truncation() {
    let configuration = Configuration {
        rma: true,
        receive_buffers: 1,
        ..Configuration::default()
    };
    let receiver = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("receiver");
    let sender = rma_endpoint(64);
    let landing = receiver.register(4096).expect("registered");
    let foreign = sender.register(64).expect("registered");
    assert!(matches!(
        receiver.receive_into(foreign.segment(0, 64).expect("segment"), 1),
        Err(DmaError::InvalidArgument(_))
    ));
    // Posted after the endpoint's one buffer: the first message goes there, the second here,
    // the third (too long for 16 bytes) to the second `receive_into`.
    receiver
        .receive_into(landing.segment(0, 64).expect("segment"), 10)
        .expect("posted");
    receiver
        .receive_into(landing.segment(1024, 16).expect("segment"), 11)
        .expect("posted");
    let address = receiver.local_address().expect("address");
    std::thread::scope(|scope| {
        let receiving = scope.spawn(|| {
            let first = receiver.receive(PATIENCE).expect("receive");
            let landed = receiver.wait_for(10, PATIENCE).expect("completed");
            let truncated = receiver.wait_for(11, PATIENCE).expect("completed");
            (first, landed, truncated)
        });
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        for message in [&b"first"[..], &[8; 40][..], &[9; 60][..]] {
            sender.send_within(peer, message, PATIENCE).expect("sent");
        }
        let (first, landed, truncated) = receiving.join().expect("the receiving thread");
        assert_eq!(Some(b"first".to_vec()), first);
        assert_eq!(
            (Operation::Receive, 40, Ok(())),
            (landed.operation, landed.len, landed.result)
        );
        let mut bytes = [0; 40];
        landing.read_bytes(0, &mut bytes).expect("read");
        assert_eq!([8; 40], bytes);
        assert_eq!(Operation::Receive, truncated.operation);
        assert!(
            matches!(&truncated.result, Err(DmaError::Fabric { code, .. })
                if *code == -i64::from(dma_libfabric::sys::FI_ETRUNC)),
            "{:?}",
            truncated.result
        );
    });
    receiver
        .receive_into(landing.segment(2048, 64).expect("segment"), 12)
        .expect("posted");
    assert_eq!(1, receiver.operations_in_flight());
    drop(receiver); // cancels it: no message will come
}

/// `receive_into` has no patience: once every operation slot holds a posted receive that no
/// message has taken, the next answers `WouldBlock` at once, posting nothing and holding nothing
/// more; the receives already posted stay in flight, and the endpoint's drop cancels them.
#[test]
fn receive_into_past_a_full_slab_answers_would_block_and_posts_nothing() {
    let configuration = Configuration {
        rma: true,
        tx_size: Some(16),
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let landing = endpoint.register(4096).unwrap();
    let mut posted = 0_u64;
    let refused = loop {
        match endpoint.receive_into(landing.segment(0, 4096).unwrap(), posted) {
            Ok(()) => posted += 1,
            Err(error) => break error,
        }
        assert!(posted <= 4096, "more receives posted than any slab holds");
    };
    assert_eq!(DmaError::WouldBlock, refused);
    assert!(0 < posted, "no receive was posted at all");
    let in_flight = endpoint.operations_in_flight();
    assert_eq!(
        posted as usize, in_flight,
        "one operation per posted receive"
    );
    // Refused again, still at once, and still nothing more in flight.
    assert_eq!(
        Err(DmaError::WouldBlock),
        endpoint.receive_into(landing.segment(0, 4096).unwrap(), posted)
    );
    assert_eq!(in_flight, endpoint.operations_in_flight());
}
