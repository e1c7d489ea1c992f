//! The first message of a fresh pair of endpoints: how long after the first `send` to a new peer
//! the peer's blocking `receive` returns it, and the first round trip, over fresh pairs on
//! 127.0.0.1 (tcp;ofi_rxm), against a second round trip on the same, now connected, pair.
//!
//! ```sh
//! cargo run --release --example first_message -- 20
//! ```
//!
//! Each round opens two endpoints; the receiver's thread is already blocked in `receive` when
//! the sender resolves it and sends, so both faces' first waits are measured: the sender's
//! `send` (which the provider answers "retry" while it connects) and the receiver's `receive`.
//! Figures in `docs/benchmarks.md`, "Connection setup".
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, LibfabricEndpoint};

/// How long any one wait may take before the round fails.
const PATIENCE: Duration = Duration::from_secs(20);

/// One round's figures: the first send's call, the first message's arrival, the first round
/// trip, and a second round trip on the connected pair.
struct Round {
    send: Duration,
    arrival: Duration,
    first_trip: Duration,
    second_trip: Duration,
}

fn round() -> Round {
    let open = || LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).unwrap();
    let (client, server) = (open(), open());
    let (client_address, server_address) = (
        client.local_address().unwrap(),
        server.local_address().unwrap(),
    );
    std::thread::scope(|scope| {
        let echo = scope.spawn(|| {
            let pinned = server.cache().pin();
            let peer = pinned.resolve(1, &client_address).unwrap();
            let mut arrivals = Vec::new();
            for _ in 0..2 {
                let message = server.receive(PATIENCE).unwrap().expect("a ping");
                arrivals.push(Instant::now());
                server.send(peer, &message).unwrap();
            }
            arrivals
        });
        let pinned = client.cache().pin();
        let peer = pinned.resolve(1, &server_address).unwrap();
        let start = Instant::now();
        client.send(peer, b"first").unwrap();
        let send = start.elapsed();
        assert_eq!(
            b"first".as_slice(),
            client.receive(PATIENCE).unwrap().unwrap()
        );
        let first_trip = start.elapsed();
        let again = Instant::now();
        client.send(peer, b"second").unwrap();
        assert_eq!(
            b"second".as_slice(),
            client.receive(PATIENCE).unwrap().unwrap()
        );
        let second_trip = again.elapsed();
        let arrivals = echo.join().unwrap();
        Round {
            send,
            arrival: arrivals[0] - start,
            first_trip,
            second_trip,
        }
    })
}

/// `(p50, max)` of `samples`, in milliseconds.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "p50 {:8.3} ms  max {:8.3} ms",
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    )
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a live timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// A first send to a peer that never progresses (open, never read: rxm never accepts), so the
/// provider asks to retry for the send's whole timeout: the sending thread's CPU time over it.
fn refused_send_cpu(timeout: Duration) -> (Duration, Duration) {
    let open = || LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1")).unwrap();
    let (client, silent) = (open(), open());
    let pinned = client.cache().pin();
    let peer = pinned.resolve(1, &silent.local_address().unwrap()).unwrap();
    let (wall, cpu) = (Instant::now(), thread_cpu());
    let sent = client.send_within(peer, b"unanswered", timeout);
    let (wall, cpu) = (wall.elapsed(), thread_cpu() - cpu);
    assert!(
        sent.is_err(),
        "a peer that never progresses accepted a send"
    );
    (cpu, wall)
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(20, |rounds| rounds.parse().expect("a number of rounds"));
    let rounds: Vec<Round> = (0..rounds.max(1)).map(|_| round()).collect();
    let over_50_ms = rounds
        .iter()
        .filter(|round| round.arrival > Duration::from_millis(50))
        .count();
    println!("{} fresh pairs (tcp;ofi_rxm, 127.0.0.1):", rounds.len());
    println!(
        "  first send returns      {}",
        summary(rounds.iter().map(|r| r.send).collect())
    );
    println!(
        "  first message arrives   {}",
        summary(rounds.iter().map(|r| r.arrival).collect())
    );
    println!(
        "  first round trip        {}",
        summary(rounds.iter().map(|r| r.first_trip).collect())
    );
    println!(
        "  second round trip       {}",
        summary(rounds.iter().map(|r| r.second_trip).collect())
    );
    println!(
        "  first messages past 50 ms: {over_50_ms} of {}",
        rounds.len()
    );
    let (cpu, wall) = refused_send_cpu(Duration::from_secs(2));
    println!(
        "a first send to a peer that never progresses: {cpu:?} of CPU over {wall:?} ({:.2}% of a core)",
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
}
