//! Issue 13, the endpoint half: safe code cannot crash the process, post to a stale index, hang,
//! or lose track of a receive buffer. Against the real tcp provider on 127.0.0.1 wherever it can
//! show it; calls that used to crash run in a child process (see `common::in_child_process`).
//!
//! Proved elsewhere: that safe code cannot post to a raw or stale index is the `compile_fail`
//! examples on `LibfabricEndpoint::send`; re-posting after a failed re-post, and efa-direct's
//! hints and refusal, are unit tests in `src/endpoint` (they inject a failure tcp never gives, or
//! read hints no device here answers).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::time::Duration;

use dma_libfabric::{AvBackend, Configuration, DmaError, FabricAv, LibfabricEndpoint, Provider};

use common::{in_child_process, sockaddr, tcp, tcp_with_capacity};

/// Item 1: a peer resolved by another endpoint's cache is refused by every posting call, before
/// libfabric sees its index; the endpoint's own cache is untouched.
#[test]
fn a_peer_of_another_endpoints_cache_is_refused() {
    let server = tcp();
    let other = tcp();
    let client = tcp();
    let address = client.local_address().expect("address");
    let pinned = other.cache().pin();
    let foreign = pinned.resolve(1, &address).expect("resolve");
    assert!(!server.cache().owns(foreign));
    for outcome in [
        server.send(foreign, b"x"),
        server.send_within(foreign, b"x", Duration::from_millis(1)),
        server.try_send(foreign, b"x"),
    ] {
        match outcome {
            Err(DmaError::InvalidArgument(reason)) => {
                assert!(reason.contains("another cache"), "{reason}");
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    assert_eq!(0, server.cache().stats().inserts, "nothing changed");
}

/// Item 1: the endpoint's own peer, used under its pin, is what posting takes, and it delivers.
#[test]
fn a_peer_under_its_pin_delivers() {
    let server = tcp();
    let client = tcp();
    let address = client.local_address().expect("address");
    let received = std::thread::scope(|scope| {
        let receiver = scope.spawn(|| client.receive(Duration::from_secs(20)));
        let pinned = server.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        server.send(peer, b"hello").expect("send");
        receiver.join().expect("receiver")
    });
    assert_eq!(Some(b"hello".to_vec()), received.expect("receive"));
}

/// Item 2: `lookup` of indices the AV never handed out is `None` (it was a SIGSEGV inside
/// fi_av_lookup): on an empty AV, far outside the table, just past the last handed out, and at
/// the capacity.
#[test]
fn lookup_of_an_index_never_handed_out_is_none_not_a_crash() {
    if !in_child_process("lookup_of_an_index_never_handed_out_is_none_not_a_crash") {
        return;
    }
    let endpoint = tcp_with_capacity(8);
    for index in [0, 5, 7, 8, 1 << 40, u64::MAX] {
        assert_eq!(None, endpoint.lookup(index).expect("lookup"), "{index}");
    }
    let pinned = endpoint.cache().pin();
    let peer = pinned.resolve(1, &sockaddr(1)).expect("resolve");
    assert_eq!(0, peer.fi_addr());
    assert_eq!(Some(sockaddr(1)), endpoint.lookup(0).expect("lookup"));
    for index in [1, 7, 8, 1 << 40] {
        assert_eq!(None, endpoint.lookup(index).expect("lookup"), "{index}");
    }
}

/// Item 2: a removed index stays readable (1.17 reads its old bytes), since the AV keeps its
/// slot; indices a `FabricAv::from_raw` backend on the endpoint's AV inserts count too.
#[test]
fn lookup_reads_what_any_fabric_av_on_the_endpoint_handed_out() {
    if !in_child_process("lookup_reads_what_any_fabric_av_on_the_endpoint_handed_out") {
        return;
    }
    let endpoint = tcp_with_capacity(8);
    let description = endpoint.describe().clone();
    // SAFETY: the endpoint's AV outlives `raw`, and the test removes exactly what it inserted.
    let mut raw = unsafe {
        FabricAv::from_raw(
            endpoint.address_vector(),
            description.addr_format,
            description.address_len,
            8,
        )
    };
    let first = raw.insert(&sockaddr(1)).expect("insert");
    let second = raw.insert(&sockaddr(2)).expect("insert");
    assert_eq!((0, 1), (first, second));
    assert_eq!(Some(sockaddr(2)), endpoint.lookup(1).expect("lookup"));
    raw.remove(second).expect("remove");
    // A removed slot is still memory, so the lookup is safe; what it reads back differs by
    // version (DESIGN.md): the old bytes on 1.x, nothing on 2.x.
    let removed = endpoint.lookup(1).expect("lookup");
    match dma_libfabric::runtime_version() {
        (1, _) => assert_eq!(Some(sockaddr(2)), removed, "1.x reads back the old bytes"),
        _ => assert_eq!(None, removed, "2.x reads back nothing"),
    }
    assert_eq!(None, endpoint.lookup(2).expect("lookup"));
    raw.remove(first).expect("remove");
}

/// Item 3: more receive buffers than tcp;ofi_rxm's receive queue holds (rx_attr.size, 2048) is
/// refused at open, naming both numbers (it was an endless -FI_EAGAIN loop at 100% CPU); as
/// many as it holds opens.
#[test]
fn more_receive_buffers_than_the_receive_queue_holds_is_refused_at_open() {
    // The queues asked for are deep enough; the provider's receive queue is what does not fit.
    let too_many = Configuration {
        receive_buffers: 4096,
        rx_size: None,
        cq_size: 4096,
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&too_many, Some("127.0.0.1")) {
        Err(DmaError::InvalidArgument(reason)) => {
            assert!(reason.contains("4096"), "{reason}");
            assert!(reason.contains("2048"), "{reason}");
            assert!(reason.contains("rx_attr.size"), "{reason}");
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A credited endpoint keeps 8 control receives posted besides its buffers.
    let just_enough = Configuration {
        receive_buffers: 2040,
        receive_size: 64,
        rx_size: None,
        cq_size: 2048,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&just_enough, Some("127.0.0.1")).expect("2040 fit");
    assert_eq!(0, endpoint.unposted_receives());
}

/// Item 3: with another provider first in the list, the misfit is still the error reported.
#[test]
fn the_receive_buffer_misfit_is_reported_after_a_missing_provider() {
    let too_many = Configuration {
        providers: vec![Provider::EfaDirect, Provider::Tcp],
        receive_buffers: 100_000,
        rx_size: None,
        cq_size: 100_000,
        ..Configuration::default()
    };
    assert!(matches!(
        LibfabricEndpoint::open(&too_many, Some("127.0.0.1")),
        Err(DmaError::InvalidArgument(reason)) if reason.contains("100000")
    ));
}

/// Item 5: shm's FI_ADDR_STR addresses are refused at open, saying why (the demo used to fail
/// at once in fi_getname; its addresses are strings fi_av_insert reads up to a NUL).
#[test]
fn shm_is_refused_at_open_saying_why() {
    let shm = Configuration {
        providers: vec![Provider::Shm],
        bind: None,
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&shm, None) {
        Err(DmaError::NoProvider { tried }) => {
            assert!(tried.contains("shm"), "{tried}");
            assert!(tried.contains("FI_ADDR_STR"), "{tried}");
        }
        other => panic!("expected NoProvider, got {other:?}"),
    }
}

/// Item 6: efa-direct never opens here; the error names it. (On a host with an efa device the
/// reason is FI_MR_LOCAL and FI_THREAD_DOMAIN; the unit tests in `src/endpoint` check that text.)
#[test]
fn efa_direct_is_refused_naming_it() {
    let efa_direct = Configuration {
        providers: vec![Provider::EfaDirect],
        bind: None,
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&efa_direct, None) {
        Err(DmaError::NoProvider { tried }) => assert!(tried.contains("efa-direct"), "{tried}"),
        other => panic!("expected NoProvider, got {other:?}"),
    }
}

/// Item 7: an error completion is read into a buffer of the call's own and reported with
/// libfabric's text and the provider's (a message too long for the receive buffer).
#[test]
fn an_error_completion_is_reported_with_its_text() {
    let receiver = LibfabricEndpoint::open(
        &Configuration {
            receive_buffers: 1,
            receive_size: 8,
            ..Configuration::default()
        },
        Some("127.0.0.1"),
    )
    .expect("open");
    let sender = tcp();
    let address = receiver.local_address().expect("address");
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let error = std::thread::scope(|scope| {
        scope.spawn(move || {
            let pinned = sender.cache().pin();
            let peer = pinned.resolve(1, &address).expect("resolve");
            sender
                .send_within(peer, &[7; 64], Duration::from_secs(20))
                .expect("send");
            while finished.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
                sender.progress();
                std::thread::yield_now();
            }
        });
        let error = receiver.receive(Duration::from_secs(20));
        drop(done);
        error
    });
    match error {
        Err(DmaError::Fabric { code, message, .. }) => {
            assert_eq!(-265, code, "FI_ETRUNC: {message}");
            assert!(message.contains("Truncation"), "{message}");
        }
        other => panic!("expected a truncation error, got {other:?}"),
    }
    assert_eq!(
        0,
        receiver.unposted_receives(),
        "its buffer is posted again"
    );
}

/// Queues asked for shallower than the posted receives are refused before any libfabric call.
#[test]
fn queues_smaller_than_the_receive_buffers_are_refused() {
    for configuration in [
        Configuration {
            cq_size: 8,
            ..Configuration::default()
        },
        Configuration {
            rx_size: Some(8),
            ..Configuration::default()
        },
    ] {
        assert!(matches!(
            LibfabricEndpoint::open(&configuration, Some("127.0.0.1")),
            Err(DmaError::InvalidArgument(_))
        ));
    }
}
