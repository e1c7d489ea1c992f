//! What the credit protocol costs (issue 40, item 6): one-way message latency and message
//! throughput, 64 B and 4 KiB, on tcp;ofi_rxm over 127.0.0.1, with credits
//! (`PeerProtocol::Credited`, the default) against the same without (`PeerProtocol::Plain`), in
//! one run, interleaved round by round so the machine's load falls on both alike.
//!
//! - Latency: a pinger and a ponger thread, each `send` then `receive`; the median over `ROUNDS`
//!   rounds of `ITERATIONS` round trips, halved.
//! - Throughput: one sender thread `send`s `STREAM` messages as fast as its credit (or its send
//!   slots) allows, one receiver thread reads them as they come; messages a second, the median of
//!   the rounds.
//!
//! `cargo bench --bench credits` (a plain `main`: each figure is a median of whole runs, and
//! criterion's sampling would add nothing but time). Prints each figure, the ratio credited ÷
//! plain (latency: ≤ 1.10 is the goal; throughput: ≥ 0.90), and the load average.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, LibfabricEndpoint, PeerProtocol};

const ITERATIONS: usize = 2_000;
const STREAM: usize = 20_000;
const ROUNDS: usize = 5;
const SIZES: [usize; 2] = [64, 4096];
const PATIENCE: Duration = Duration::from_secs(20);

fn endpoint(protocol: PeerProtocol) -> LibfabricEndpoint {
    let configuration = Configuration {
        peer_protocol: protocol,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("tcp endpoint")
}

/// One round's one-way latency, in microseconds, of `ITERATIONS` round trips of `size` bytes
/// (after as many unmeasured to warm the connection and its credit up).
fn latency(protocol: PeerProtocol, size: usize) -> f64 {
    let (ping, pong) = (endpoint(protocol), endpoint(protocol));
    let (ping_address, pong_address) = (
        ping.local_address().expect("address"),
        pong.local_address().expect("address"),
    );
    let message = vec![3_u8; size];
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let pinned = pong.cache().pin();
            let peer = pinned.resolve(1, &ping_address).expect("resolve");
            for _ in 0..2 * ITERATIONS {
                let received = pong.receive(PATIENCE).expect("receive").expect("a ping");
                pong.send_within(peer, &received, PATIENCE).expect("pong");
            }
            let deadline = Instant::now() + PATIENCE;
            while 0 < pong.sends_in_flight() && Instant::now() < deadline {
                let _ = pong.receive(Duration::from_millis(1));
            }
        });
        let pinned = ping.cache().pin();
        let peer = pinned.resolve(1, &pong_address).expect("resolve");
        let mut started = Instant::now();
        for iteration in 0..2 * ITERATIONS {
            if ITERATIONS == iteration {
                started = Instant::now();
            }
            ping.send_within(peer, &message, PATIENCE).expect("ping");
            let answer = ping.receive(PATIENCE).expect("receive").expect("a pong");
            assert_eq!(size, answer.len());
        }
        started.elapsed().as_secs_f64() * 1e6 / (2 * ITERATIONS) as f64
    })
}

/// One round's throughput, messages a second, of `STREAM` messages of `size` bytes from one
/// sender to one receiver reading as they come.
fn throughput(protocol: PeerProtocol, size: usize) -> f64 {
    let (sender, receiver) = (endpoint(protocol), endpoint(protocol));
    let address = receiver.local_address().expect("address");
    let message = vec![5_u8; size];
    std::thread::scope(|scope| {
        let reading = scope.spawn(|| {
            let mut started = None;
            for _ in 0..STREAM {
                receiver
                    .receive(PATIENCE)
                    .expect("receive")
                    .expect("a message");
                started.get_or_insert_with(Instant::now);
            }
            started.expect("a first message").elapsed()
        });
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        for _ in 0..STREAM {
            sender.send_within(peer, &message, PATIENCE).expect("send");
        }
        let deadline = Instant::now() + PATIENCE;
        while 0 < sender.sends_in_flight() && Instant::now() < deadline {
            sender.progress();
        }
        let elapsed = reading.join().expect("the receiving thread");
        (STREAM - 1) as f64 / elapsed.as_secs_f64()
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    if std::env::args().any(|argument| "--list" == argument) {
        return;
    }
    println!("credits: load before {}", load());
    println!(
        "{:>6} {:>22} {:>12} {:>12} {:>8}",
        "size", "measure", "credited", "plain", "ratio"
    );
    for size in SIZES {
        let (mut credited, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            credited.push(latency(PeerProtocol::Credited, size));
            plain.push(latency(PeerProtocol::Plain, size));
        }
        let (credited, plain) = (median(credited), median(plain));
        println!(
            "{size:>6} {:>22} {credited:>12.2} {plain:>12.2} {:>8.3}",
            "one-way latency (µs)",
            credited / plain
        );
        let (mut credited, mut plain) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            credited.push(throughput(PeerProtocol::Credited, size));
            plain.push(throughput(PeerProtocol::Plain, size));
        }
        let (credited, plain) = (median(credited), median(plain));
        println!(
            "{size:>6} {:>22} {credited:>12.0} {plain:>12.0} {:>8.3}",
            "messages a second",
            credited / plain
        );
    }
    println!("credits: load after {}", load());
}
