//! The endpoint against the real tcp provider on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::time::Duration;

use dma_libfabric::sys;
use dma_libfabric::{AvBackend, Configuration, DmaError, FabricAv, LibfabricEndpoint, Provider};

fn tcp() -> LibfabricEndpoint {
    LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))
        .expect("a tcp endpoint on loopback")
}

/// Insert `address` straight into `endpoint`'s AV, bypassing the cache, as these tests are about
/// libfabric's own behaviour. Through a `FabricAv` on the endpoint's AV, which is `fi_av_insert`
/// and nothing more, except that it records the index so `lookup` may read it.
fn insert(endpoint: &LibfabricEndpoint, address: &[u8]) -> sys::fi_addr_t {
    raw_av(endpoint).insert(address).expect("fi_av_insert")
}

fn remove(endpoint: &LibfabricEndpoint, fi_addr: sys::fi_addr_t) {
    raw_av(endpoint).remove(fi_addr).expect("fi_av_remove");
}

/// A backend on `endpoint`'s AV, used for one call.
fn raw_av(endpoint: &LibfabricEndpoint) -> FabricAv {
    let description = endpoint.describe();
    // SAFETY: the AV is open for as long as `endpoint` lives, which outlasts the one call made
    // through this backend; each test removes exactly what it inserted.
    unsafe {
        FabricAv::from_raw(
            endpoint.address_vector(),
            description.addr_format,
            description.address_len,
            Configuration::default().av_capacity,
        )
    }
}

#[test]
fn an_endpoint_describes_tcp_and_has_a_sockaddr_in() {
    let endpoint = tcp();
    let description = endpoint.describe();
    assert_eq!("tcp;ofi_rxm", description.provider);
    assert_eq!(sys::FI_SOCKADDR_IN, description.addr_format);
    assert_eq!(sys::FI_THREAD_SAFE, description.threading);
    assert_eq!(sys::FI_AV_TABLE, description.av_type);
    let address = endpoint.local_address().expect("local address");
    assert_eq!(16 + dma_libfabric::SEAL_LEN, address.len(), "sealed");
    assert_eq!(16, description.address_len);
    // AF_INET, a port the provider bound, and 127.0.0.1.
    assert_eq!(libc_af_inet(), u16::from_ne_bytes([address[0], address[1]]));
    assert_ne!(
        0,
        u16::from_be_bytes([address[2], address[3]]),
        "a bound port"
    );
    assert_eq!([127, 0, 0, 1], address[4..8]);
}

fn libc_af_inet() -> u16 {
    2
}

/// tcp progresses manually: a connection is accepted only while the receiver reads its queue, so
/// each side runs on its own thread, as a server and a client would.
#[test]
fn two_endpoints_exchange_messages_both_ways() {
    const MESSAGES: u32 = 200; // more than there are receive buffers, so re-posting is exercised
    let one = tcp();
    let other = tcp();
    let to_other = insert(&one, &other.local_address().expect("address"));
    let to_one = insert(&other, &one.local_address().expect("address"));

    let received = std::thread::scope(|scope| {
        let receiver = scope.spawn(|| {
            let mut received = Vec::new();
            while received.len() < MESSAGES as usize + 1 {
                match other.receive(Duration::from_secs(20)).expect("receive") {
                    Some(message) => received.push(message),
                    None => break,
                }
            }
            // SAFETY: `to_one` was inserted into `other`'s AV above and is removed only at the end.
            unsafe { other.send_raw(to_one, b"and back") }.expect("send other -> one");
            received
        });
        // SAFETY: `to_other` was inserted into `one`'s AV above and is removed only at the end.
        unsafe { one.send_raw(to_other, b"from one") }.expect("send one -> other");
        for sequence in 0..MESSAGES {
            // SAFETY: as above.
            unsafe { one.send_raw(to_other, &sequence.to_le_bytes()) }.expect("send");
        }
        assert_eq!(
            Some(b"and back".to_vec()),
            one.receive(Duration::from_secs(20)).expect("receive")
        );
        receiver.join().expect("receiver thread")
    });

    assert_eq!(b"from one".to_vec(), received[0]);
    let sequences: Vec<Vec<u8>> = (0..MESSAGES)
        .map(|sequence| sequence.to_le_bytes().to_vec())
        .collect();
    assert_eq!(
        sequences,
        received[1..],
        "every message, intact and in order"
    );
    remove(&one, to_other);
    remove(&other, to_one);
}

#[test]
fn an_oversized_message_is_refused_before_libfabric_sees_it() {
    let endpoint = tcp();
    let peer = insert(&endpoint, &endpoint.local_address().expect("address"));
    let too_big = vec![0; endpoint.describe().max_send_size + 1];
    assert!(matches!(
        // SAFETY: `peer` was inserted into `endpoint`'s AV above and is removed only at the end.
        unsafe { endpoint.send_raw(peer, &too_big) },
        Err(DmaError::InvalidArgument(_))
    ));
    remove(&endpoint, peer);
}

/// tcp hands out the lowest free index first. What a removed index reads back depends on the
/// libfabric that runs (the runtime `fi_version()`, not the headers built against): 1.x reads back
/// the old bytes, 2.x reads back nothing.
#[test]
fn lookup_shows_the_inserted_address_and_reuse_after_removal() {
    // SAFETY: fi_version takes nothing and returns a number.
    let runtime = unsafe { sys::fi_version() };
    let endpoint = tcp();
    let peers: Vec<LibfabricEndpoint> = (0..3).map(|_| tcp()).collect();
    let addresses: Vec<Vec<u8>> = peers
        .iter()
        .map(|peer| peer.local_address().expect("address"))
        .collect();
    let indexes: Vec<_> = addresses
        .iter()
        .map(|address| insert(&endpoint, address))
        .collect();
    assert_eq!(vec![0, 1, 2], indexes);
    for (index, address) in indexes.iter().zip(&addresses) {
        assert_eq!(
            Some(address[..16].to_vec()),
            endpoint.lookup(*index).expect("lookup"),
            "the provider's address, without the seal"
        );
    }

    remove(&endpoint, indexes[1]);
    let after_removal = endpoint.lookup(indexes[1]).expect("lookup");
    if runtime >= sys::FI_VERSION(2, 0) {
        // 2.x: the removed slot is cleared and fi_av_lookup fails with -FI_EINVAL.
        assert_eq!(
            None, after_removal,
            "libfabric 2.x reads a removed index back as nothing"
        );
    } else {
        // The documented 1.17 quirk: the removed index still reads back its old bytes.
        assert_eq!(
            Some(addresses[1][..16].to_vec()),
            after_removal,
            "libfabric 1.x reads a removed index back with its old bytes"
        );
    }

    let newcomer = tcp();
    let new_address = newcomer.local_address().expect("address");
    let reused = insert(&endpoint, &new_address);
    assert_eq!(indexes[1], reused, "the lowest free index goes first");
    assert_eq!(
        Some(new_address[..16].to_vec()),
        endpoint.lookup(reused).expect("lookup")
    );

    for index in [indexes[0], reused, indexes[2]] {
        remove(&endpoint, index);
    }
}

#[test]
fn a_provider_missing_from_this_machine_is_an_error_naming_it() {
    let configuration = Configuration {
        providers: vec![Provider::Efa],
        bind: None,
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&configuration, None) {
        Err(DmaError::NoProvider { tried }) => assert!(tried.contains("efa"), "{tried}"),
        Err(other) => panic!("expected NoProvider, got {other}"),
        Ok(endpoint) => {
            // Only on a host with an efa device; then the endpoint is efa's.
            assert_eq!("efa", endpoint.describe().provider);
        }
    }
}

#[test]
fn providers_are_tried_in_order() {
    let configuration = Configuration {
        providers: vec![Provider::Efa, Provider::Tcp],
        ..Configuration::default()
    };
    let endpoint =
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("tcp after efa");
    assert!(["efa", "tcp;ofi_rxm"].contains(&endpoint.describe().provider.as_str()));
}

#[test]
fn bad_configuration_is_an_error() {
    let empty = Configuration {
        providers: Vec::new(),
        ..Configuration::default()
    };
    assert!(matches!(
        LibfabricEndpoint::open(&empty, None),
        Err(DmaError::InvalidArgument(_))
    ));
    let no_room = Configuration {
        av_capacity: 0,
        ..Configuration::default()
    };
    assert!(matches!(
        LibfabricEndpoint::open(&no_room, None),
        Err(DmaError::InvalidArgument(_))
    ));
    assert!(matches!(
        LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1\0")),
        Err(DmaError::InvalidArgument(_))
    ));
}

/// A peer that never accepts the connection costs a bounded wait, not a hang.
#[test]
fn a_send_to_a_silent_peer_gives_up_within_its_bound() {
    let endpoint = tcp();
    let silent = tcp(); // never polls, so never accepts
    let peer = insert(&endpoint, &silent.local_address().expect("address"));
    let mut outcome = Ok(());
    for _ in 0..100 {
        // SAFETY: `peer` was inserted into `endpoint`'s AV above and is removed only at the end.
        outcome = unsafe { endpoint.send_raw_within(peer, b"anyone?", Duration::from_millis(1)) };
        if outcome.is_err() {
            break;
        }
    }
    assert!(matches!(outcome, Err(DmaError::WouldBlock)), "{outcome:?}");
    // The sends it did post stay counted until their completions are read. Let the peer accept
    // them before the drop: an endpoint dropped with sends in flight drives progress for them,
    // and a connection request that progress accepts and the close then abandons is leaked inside
    // libfabric (64 B on 2.6.0, 376 B on 1.17: AddressSanitizer runs this file). Dropping with
    // sends queued is `discarded_sends`'s business, tested in `messages_bounded`.
    testkit::with_progress(&silent, || {
        let deadline = std::time::Instant::now() + testkit::PATIENCE;
        while 0 < endpoint.sends_in_flight() && std::time::Instant::now() < deadline {
            endpoint.progress_sleeping(Duration::from_millis(10));
        }
    });
    assert_eq!(
        0,
        endpoint.sends_in_flight(),
        "the queued sends were delivered"
    );
    remove(&endpoint, peer);
}
