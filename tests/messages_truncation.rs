//! A message longer than the receive buffer is an error on every provider this host has, never a
//! message cut short: tcp;ofi_rxm reports `FI_ETRUNC` in an error completion, and a provider that
//! reports the full length in a successful completion is caught by the length check
//! (udp;ofi_rxd delivered a 32-byte message into a 16-byte buffer as `Ok(16 bytes)`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Provider, sys};
use testkit::PATIENCE;

fn endpoint(provider: Provider, receive_size: usize) -> Option<LibfabricEndpoint> {
    let configuration = Configuration {
        providers: vec![provider],
        receive_size,
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&configuration, Some("127.0.0.1")) {
        Ok(endpoint) => Some(endpoint),
        Err(error) => {
            eprintln!("{provider} does not open here: {error}");
            None
        }
    }
}

/// Send each of `messages` from a fresh endpoint on another thread to `receiver`, and hand back
/// what `receive` answered, one answer a message, in order.
fn exchange(
    provider: Provider,
    receiver: &LibfabricEndpoint,
    messages: &[Vec<u8>],
) -> Vec<Result<Option<Vec<u8>>, DmaError>> {
    let sender = endpoint(provider, 4096).expect("the sender opens where the receiver did");
    let address = receiver.local_address().expect("address");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let pinned = sender.cache().pin();
            let peer = pinned.resolve(1, &address).expect("resolve");
            for message in messages {
                sender.send_within(peer, message, PATIENCE).expect("sent");
            }
            // The receiver's progress acknowledges the sends; keep driving ours until it is done.
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                sender.progress();
                std::thread::yield_now();
            }
        });
        let answers = messages
            .iter()
            .map(|_| receiver.receive(PATIENCE))
            .collect();
        done.store(true, std::sync::atomic::Ordering::Release);
        answers
    })
}

fn is_truncation(answer: &Result<Option<Vec<u8>>, DmaError>) -> bool {
    matches!(answer, Err(DmaError::Fabric { code, .. }) if *code == -i64::from(sys::FI_ETRUNC))
}

#[test]
fn a_message_longer_than_the_receive_buffer_is_a_truncation_error_on_tcp() {
    let receiver = endpoint(Provider::Tcp, 16).expect("tcp on loopback");
    let answers = exchange(Provider::Tcp, &receiver, &[vec![1; 16], vec![2; 32]]);
    assert_eq!(Ok(Some(vec![1; 16])), answers[0], "a message that fits");
    assert!(is_truncation(&answers[1]), "{:?}", answers[1]);
}

/// udp;ofi_rxd delivers a longer message cut short as a success (libfabric 1.17 and 2.6.0), and
/// its `max_msg_size` is `SIZE_MAX`, so no buffer holds every message: it is refused at `open`,
/// saying why, rather than cut messages silently.
#[test]
fn udp_which_cannot_report_truncation_is_refused_at_open_saying_so() {
    let configuration = Configuration {
        providers: vec![Provider::Udp],
        ..Configuration::default()
    };
    match LibfabricEndpoint::open(&configuration, Some("127.0.0.1")) {
        Err(DmaError::NoProvider { tried }) => {
            assert!(tried.contains("udp;ofi_rxd"), "{tried}");
            // Where udp is compiled in and offers an endpoint, the reason is truncation.
            if !tried.contains("No data available") {
                assert!(tried.contains("truncation"), "{tried}");
            }
        }
        other => panic!("udp must be refused, got {other:?}"),
    }
}
