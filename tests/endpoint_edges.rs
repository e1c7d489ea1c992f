//! Issue 19, items 3 and 4: the endpoint at the edges of its sizes and timeouts, on the real tcp
//! provider on 127.0.0.1.
//!
//! - Every size is checked before it reaches libfabric or the allocator: a value above its bound
//!   is refused with [`DmaError::InvalidArgument`] naming the value and the bound, and a
//!   configuration at the bound still opens and works.
//! - Every timeout takes any `Duration`: `Duration::MAX` waits as long as the call needs and
//!   returns normally.
//!
//! What used to crash (the heap corrupted, a segfault, an abort on allocation failure, or the
//! panic "overflow when adding duration to instant") runs in a child process (see
//! `common::in_child_process`), so it fails its test rather than end the test binary.
//!
//! The bounds are written out as numbers here, not read from the crate's constants, so the
//! refusals are checked against what the documentation promises.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint, Operation};

use common::{in_child_process, tcp};
use testkit::{PATIENCE, rma_tcp, wait_for_bytes, with_progress};

/// `Configuration::MAX_CQ_SIZE`.
const MAX_CQ_SIZE: usize = 1 << 22;
/// `Configuration::MAX_AV_CAPACITY`.
const MAX_AV_CAPACITY: usize = 1 << 20;
/// `Configuration::MAX_RECEIVE_SIZE`.
const MAX_RECEIVE_SIZE: usize = 1 << 30;
/// The deepest transmit queue tcp;ofi_rxm accepts in `fi_getinfo`'s hints (`tx_attr.size`;
/// rxm's `RXM_TX_SIZE` in libfabric 1.17 and 2.6.0). Without a hint it reports its default,
/// 2,048.
const RXM_TX_BOUND: usize = 16_384;
/// The deepest receive queue tcp;ofi_rxm accepts (`rx_attr.size`; `RXM_RX_SIZE`).
const RXM_RX_BOUND: usize = 65_536;

/// Sizes that crashed one way or another before they were checked: beyond any bound.
const OVERSIZED: [usize; 4] = [usize::MAX, (1 << 63) + 1, 1 << 60, 1 << 40];

/// For each of `values`, open `configure(value)` and expect a refusal naming it and `bound`.
fn refuses_each(values: &[usize], bound: usize, configure: impl Fn(usize) -> Configuration) {
    for &value in values {
        refused(&configure(value), value, bound);
    }
}

/// Open `configuration` on loopback and expect a refusal naming `value` and `bound`.
fn refused(configuration: &Configuration, value: usize, bound: usize) {
    match LibfabricEndpoint::open(configuration, Some("127.0.0.1")) {
        Err(DmaError::InvalidArgument(reason)) => {
            assert!(reason.contains(&value.to_string()), "{value} in {reason}");
            assert!(reason.contains(&bound.to_string()), "{bound} in {reason}");
        }
        other => panic!("expected InvalidArgument for {value}, got {other:?}"),
    }
}

/// Open `configuration` on loopback, and show the endpoint works: a message from another
/// endpoint arrives.
fn opens_and_receives(configuration: &Configuration) {
    let receiver =
        LibfabricEndpoint::open(configuration, Some("127.0.0.1")).expect("opens at the bound");
    let received = exchange(&receiver, PATIENCE, PATIENCE);
    assert_eq!(Some(b"at the edge".to_vec()), received.expect("receive"));
}

/// Send one message to `receiver` from a fresh endpoint (its own thread, `send_timeout`), and
/// receive it with `receive_timeout`.
fn exchange(
    receiver: &LibfabricEndpoint,
    send_timeout: Duration,
    receive_timeout: Duration,
) -> Result<Option<Vec<u8>>, DmaError> {
    let sender = tcp();
    let address = receiver.local_address().expect("address");
    let received = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sending = scope.spawn(|| {
            let pinned = sender.cache().pin();
            let peer = pinned.resolve(1, &address).expect("resolve");
            let sent = sender.send_within(peer, b"at the edge", send_timeout);
            // tcp progresses manually: keep the sender's side moving until the message is in.
            while !received.load(Ordering::Acquire) {
                sender.progress();
                std::thread::yield_now();
            }
            sent
        });
        let message = {
            // Set even if `receive` panics (as it did for `Duration::MAX`), so the scope ends.
            let _received = SetOnDrop(&received);
            receiver.receive(receive_timeout)
        };
        sending.join().expect("the sending thread").expect("sent");
        message
    })
}

/// Sets its flag when dropped, unwinding included: what tells a helper thread to stop.
struct SetOnDrop<'flag>(&'flag AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A server, a client whose memory it writes into or reads from, and a lease on the client.
struct Rma {
    server: LibfabricEndpoint,
    client: LibfabricEndpoint,
    address: Vec<u8>,
}

impl Rma {
    fn new() -> Self {
        let server = rma_tcp();
        let client = rma_tcp();
        let address = client.local_address().expect("address");
        Self {
            server,
            client,
            address,
        }
    }

    /// Write `bytes` from the server into fresh client memory as operation `id`, posted with
    /// `post_timeout` and waited for with `wait_timeout`, while the client progresses; the
    /// completion, once the bytes have landed.
    fn write(
        &self,
        bytes: &[u8; 8],
        id: u64,
        post_timeout: Duration,
        wait_timeout: Duration,
    ) -> dma_libfabric::Completion {
        let source = self.server.register(8).expect("server memory");
        source.write_bytes(0, bytes).expect("fits");
        let target = self.client.register(8).expect("client memory");
        with_progress(&self.client, || {
            let lease = self
                .server
                .cache()
                .lease(1, &self.address)
                .expect("a lease");
            self.server
                .write_within(
                    lease,
                    source.segment(0, 8).expect("segment"),
                    target.remote(),
                    id,
                    post_timeout,
                )
                .expect("posted");
            let completion = self.server.wait_for(id, wait_timeout).expect("completed");
            wait_for_bytes(&target, 0, bytes);
            completion
        })
    }
}

// Item 3: sizes.

/// `cq_size` above 2^22 is refused, naming the size and the bound: `usize::MAX` and 2^63 + 1
/// used to open an endpoint that then corrupted the heap (libfabric rounds the size up to a
/// power of two, which wraps to 0), and 2^60 and 2^63 segfaulted (the queue's allocation size
/// wraps). A queue of 2^22 opens and delivers.
#[test]
fn a_cq_size_above_the_bound_is_refused_and_one_at_the_bound_opens() {
    if !in_child_process("a_cq_size_above_the_bound_is_refused_and_one_at_the_bound_opens") {
        return;
    }
    let values = [&OVERSIZED[..], &[1 << 63, MAX_CQ_SIZE + 1]].concat();
    refuses_each(&values, MAX_CQ_SIZE, |cq_size| Configuration {
        cq_size,
        ..Configuration::default()
    });
    opens_and_receives(&Configuration {
        cq_size: MAX_CQ_SIZE,
        ..Configuration::default()
    });
}

/// `av_capacity` above 2^20 is refused, naming it and the bound: `usize::MAX` panicked inside
/// the cache's index, 2^40 aborted on its allocation. 2^20 opens and takes a peer.
#[test]
fn an_av_capacity_above_the_bound_is_refused_and_one_at_the_bound_opens() {
    if !in_child_process("an_av_capacity_above_the_bound_is_refused_and_one_at_the_bound_opens") {
        return;
    }
    let values = [&OVERSIZED[..], &[MAX_AV_CAPACITY + 1]].concat();
    refuses_each(&values, MAX_AV_CAPACITY, |av_capacity| Configuration {
        av_capacity,
        ..Configuration::default()
    });
    let endpoint = LibfabricEndpoint::open(
        &Configuration {
            av_capacity: MAX_AV_CAPACITY,
            ..Configuration::default()
        },
        Some("127.0.0.1"),
    )
    .expect("opens at the bound");
    let peer = tcp().local_address().expect("address");
    let pinned = endpoint.cache().pin();
    assert_eq!(0, pinned.resolve(1, &peer).expect("a peer").fi_addr());
}

/// `receive_size` above 2^30 is refused, naming it and the bound (2^40 aborted when the receive
/// buffers were allocated, `usize::MAX` panicked), and so is 0. One buffer of 2^30 bytes opens
/// and receives.
#[test]
fn a_receive_size_above_the_bound_or_zero_is_refused_and_one_at_the_bound_opens() {
    if !in_child_process(
        "a_receive_size_above_the_bound_or_zero_is_refused_and_one_at_the_bound_opens",
    ) {
        return;
    }
    let values = [&OVERSIZED[..], &[MAX_RECEIVE_SIZE + 1]].concat();
    refuses_each(&values, MAX_RECEIVE_SIZE, |receive_size| Configuration {
        receive_size,
        ..Configuration::default()
    });
    refused(
        &Configuration {
            receive_size: 0,
            ..Configuration::default()
        },
        0,
        1,
    );
    opens_and_receives(&Configuration {
        receive_buffers: 1,
        receive_size: MAX_RECEIVE_SIZE,
        ..Configuration::default()
    });
}

/// `receive_buffers` as large as the queues asked for is refused by the first bound it crosses,
/// the queue's, before anything is allocated for it.
#[test]
fn receive_buffers_beyond_every_queue_are_refused_by_the_queues_bound() {
    if !in_child_process("receive_buffers_beyond_every_queue_are_refused_by_the_queues_bound") {
        return;
    }
    refuses_each(&OVERSIZED, MAX_CQ_SIZE, |receive_buffers| Configuration {
        receive_buffers,
        cq_size: receive_buffers,
        rx_size: Some(receive_buffers),
        ..Configuration::default()
    });
}

/// `tx_size` and `rx_size` above what tcp;ofi_rxm accepts (16,384 and 65,536) are refused,
/// naming the size and the provider's bound (they were `NoProvider`, "offers no thread-safe
/// reliable-datagram endpoint", with no word of the size); at the bounds the endpoint opens and
/// receives.
#[test]
fn queue_depths_above_what_the_provider_accepts_are_refused_naming_its_bound() {
    let tx_values = [&OVERSIZED[..], &[RXM_TX_BOUND + 1]].concat();
    refuses_each(&tx_values, RXM_TX_BOUND, |size| Configuration {
        tx_size: Some(size),
        ..Configuration::default()
    });
    let rx_values = [&OVERSIZED[..], &[RXM_RX_BOUND + 1]].concat();
    refuses_each(&rx_values, RXM_RX_BOUND, |size| Configuration {
        rx_size: Some(size),
        ..Configuration::default()
    });
    opens_and_receives(&Configuration {
        tx_size: Some(RXM_TX_BOUND),
        rx_size: Some(RXM_RX_BOUND),
        ..Configuration::default()
    });
}

// Item 4: timeouts.

/// `wait_for` with `Duration::MAX` returns the completion of a write that completes (it panicked
/// computing its deadline).
#[test]
fn wait_for_with_duration_max_returns_the_completion() {
    if !in_child_process("wait_for_with_duration_max_returns_the_completion") {
        return;
    }
    let completion = Rma::new().write(b"waited!!", 1, PATIENCE, Duration::MAX);
    assert_eq!((1, Ok(())), (completion.id, completion.result));
}

/// `write_within` with `Duration::MAX` posts, and the write lands (it panicked computing its
/// deadline).
#[test]
fn write_within_with_duration_max_posts() {
    if !in_child_process("write_within_with_duration_max_posts") {
        return;
    }
    let completion = Rma::new().write(b"written!", 2, Duration::MAX, PATIENCE);
    assert_eq!(
        (Operation::Write, Ok(())),
        (completion.operation, completion.result)
    );
}

/// `read_within` with `Duration::MAX` posts, and the read fetches the peer's bytes (by reading
/// the code, it panicked as `write_within` did).
#[test]
fn read_within_with_duration_max_posts() {
    if !in_child_process("read_within_with_duration_max_posts") {
        return;
    }
    let rma = Rma::new();
    let exposed = rma.client.register(8).expect("client memory");
    exposed.write_bytes(0, b"fetched!").expect("fits");
    let landing = rma.server.register(8).expect("server memory");
    let completion = with_progress(&rma.client, || {
        let lease = rma.server.cache().lease(1, &rma.address).expect("a lease");
        rma.server
            .read_within(
                lease,
                landing.segment(0, 8).expect("segment"),
                exposed.remote(),
                3,
                Duration::MAX,
            )
            .expect("posted");
        rma.server.wait_for(3, PATIENCE).expect("completed")
    });
    assert_eq!(
        (Operation::Read, Ok(())),
        (completion.operation, completion.result)
    );
    let mut fetched = [0; 8];
    landing.read_bytes(0, &mut fetched).expect("in range");
    assert_eq!(b"fetched!", &fetched);
}

/// `drain_operations` with `Duration::MAX` and a write in flight drives progress until it has
/// completed, and returns 0 (by reading the code, it panicked computing its deadline whenever
/// an operation was in flight).
#[test]
fn drain_operations_with_duration_max_returns_once_nothing_is_in_flight() {
    if !in_child_process("drain_operations_with_duration_max_returns_once_nothing_is_in_flight") {
        return;
    }
    let rma = Rma::new();
    let source = rma.server.register(8).expect("server memory");
    source.write_bytes(0, b"drained!").expect("fits");
    let target = rma.client.register(8).expect("client memory");
    with_progress(&rma.client, || {
        let lease = rma.server.cache().lease(1, &rma.address).expect("a lease");
        rma.server
            .write_within(
                lease,
                source.segment(0, 8).expect("segment"),
                target.remote(),
                4,
                PATIENCE,
            )
            .expect("posted");
        // Nothing reaps the server's queue but the drain: the write is in flight until then.
        assert_eq!(1, rma.server.operations_in_flight());
        assert_eq!(0, rma.server.drain_operations(Duration::MAX));
        wait_for_bytes(&target, 0, b"drained!");
    });
    let mut completions = Vec::new();
    rma.server.poll_completions(&mut completions).expect("poll");
    assert_eq!(
        vec![(4, Ok(()))],
        completions
            .into_iter()
            .map(|completion| (completion.id, completion.result))
            .collect::<Vec<_>>()
    );
}

/// `receive` with `Duration::MAX` returns the message that arrives (it panicked computing its
/// deadline).
#[test]
fn receive_with_duration_max_returns_the_message() {
    if !in_child_process("receive_with_duration_max_returns_the_message") {
        return;
    }
    let receiver = tcp();
    let received = exchange(&receiver, PATIENCE, Duration::MAX);
    assert_eq!(Some(b"at the edge".to_vec()), received.expect("receive"));
}

/// `send_within` with `Duration::MAX` sends, and the message arrives (by reading the code, it
/// panicked computing its deadline).
#[test]
fn send_within_with_duration_max_sends() {
    if !in_child_process("send_within_with_duration_max_sends") {
        return;
    }
    let receiver = tcp();
    let received = exchange(&receiver, Duration::MAX, PATIENCE);
    assert_eq!(Some(b"at the edge".to_vec()), received.expect("receive"));
}
