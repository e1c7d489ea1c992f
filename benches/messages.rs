//! One-way message latency on tcp;ofi_rxm over 127.0.0.1, against libfabric's own fabtests
//! `fi_pingpong -e rdm` on the same provider (Debian's libfabric-bin has `fi_pingpong`, not
//! `fi_rdm_pingpong`; its `usec/xfer` is the one-way latency: elapsed time over two transfers per
//! iteration).
//!
//! Ours: two endpoints in this process, a pinger thread and a ponger thread, each `send` (a copy
//! into a send slot, `fi_send` with a completion; on tcp `FI_TRANSMIT_COMPLETE`, which the peer's
//! provider acknowledges with a message of its own) then waits for the other's message (the
//! endpoint's own buffers, one copy out): asleep in `receive`, or spinning on `try_receive` as
//! fabtests spins on its queues; the ratio is the spinning one's. One-way latency is the round trip over two; the median of `ROUNDS` rounds of
//! `ITERATIONS` round trips is printed, then fabtests' figure with the same iterations, and the
//! ratio. `cargo bench --bench messages` (a plain `main`, no criterion: a round trip is a
//! syscall-bound microsecond affair, and criterion's sampling would add nothing but time).
//! `MESSAGES_BUSY_POLL=1` opens both endpoints with `Configuration::busy_poll` (`FI_WAIT_NONE`
//! queues, as fabtests opens its own), to see what the queues' wait objects cost.
//! `MESSAGES_PROFILE=64` runs only ours, spinning, at that size (no fabtests, no table), for
//! `perf record`, `perf stat` or `strace -c` to look at one path (`MESSAGES_INJECT=1` with it:
//! through `inject_within`; `MESSAGES_LOCAL_SENDS=1`: endpoints opened with
//! `SendCompletion::Local`).
//!
//! Two more columns open both endpoints with `SendCompletion::Local`: sends complete once in the
//! socket, with no acknowledgement from the peer's provider, as fabtests' own sends do.
//!
//! Another column posts with `inject_within` instead of `send` (sizes within the inject size
//! only, 64 B on tcp;ofi_rxm): no send slot, no completion, and on tcp no acknowledgement from
//! the peer's provider, at the price `inject_within`'s docs state (a failure is not reported).
//! Note that `fi_pingpong` injects only messages strictly under the inject size: at 64 B it
//! posts `fi_send` with a completion (but without `FI_TRANSMIT_COMPLETE`, so no acknowledgement).
//!
//! `MESSAGES_PINGPONG` names the baseline's program instead of `fi_pingpong` on `PATH`: fabtests'
//! `fi_rdm_pingpong` of a libfabric build (for example 2.6.0's, with the bench built against the
//! same build through `PKG_CONFIG_PATH`), and `MESSAGES_PINGPONG_ARGS` adds arguments to both of
//! its processes (`-E` for `fi_rdm_pingpong`, which on loopback waits for ever without its
//! out-of-band address exchange). Its one-way latency is read from the column its header names
//! `usec/xfer`, in either program's table.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dma_libfabric::{Configuration, LibfabricEndpoint, SendCompletion};

const ITERATIONS: usize = 2_000;
const ROUNDS: usize = 5;
const SIZES: [usize; 2] = [64, 4096];
const PATIENCE: Duration = Duration::from_secs(20);

fn endpoint(sends: SendCompletion) -> LibfabricEndpoint {
    let busy_poll = std::env::var_os("MESSAGES_BUSY_POLL").is_some();
    let configuration = Configuration {
        busy_poll,
        send_completion: sends,
        ..Configuration::default()
    };
    LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("tcp endpoint")
}

/// Wait for the next message on `endpoint`: asleep in `receive`, or spinning on `try_receive`
/// (as fabtests does, its queues opened with `FI_WAIT_NONE`).
fn next_message(endpoint: &LibfabricEndpoint, spin: bool) -> Vec<u8> {
    if !spin {
        return endpoint
            .receive(PATIENCE)
            .expect("receive")
            .expect("a message");
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(message) = endpoint.try_receive().expect("try_receive") {
            return message;
        }
        assert!(Instant::now() < deadline, "no message within {PATIENCE:?}");
    }
}

/// How each side posts its message: `send` (a send slot, a completion) or `inject_within`
/// (no slot, no completion: at most the inject size).
#[derive(Clone, Copy, PartialEq)]
enum Post {
    Send,
    Inject,
}

/// Post `message` to `peer` from `endpoint` the way `post` says.
fn post(endpoint: &LibfabricEndpoint, peer: dma_libfabric::Peer<'_>, message: &[u8], post: Post) {
    match post {
        Post::Send => endpoint.send_within(peer, message, PATIENCE),
        Post::Inject => endpoint.inject_within(peer, message, PATIENCE),
    }
    .expect("posted");
}

/// The median one-way latency, in microseconds, of `ITERATIONS` round trips of `size` bytes,
/// each side posting as `how` says (its sends completing as `sends` says) and waiting for the
/// other's message asleep or spinning.
fn ours(size: usize, spin: bool, how: Post, sends: SendCompletion) -> f64 {
    let (ping, pong) = (endpoint(sends), endpoint(sends));
    let (ping_address, pong_address) = (
        ping.local_address().expect("address"),
        pong.local_address().expect("address"),
    );
    let message = vec![3_u8; size];
    let total = ITERATIONS * (ROUNDS + 1);
    let mut rounds = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let pinned = pong.cache().pin();
            let peer = pinned.resolve(1, &ping_address).expect("resolve");
            for _ in 0..total {
                let received = next_message(&pong, spin);
                post(&pong, peer, &received, how);
            }
            // Let the last pong's completion arrive before the endpoint goes.
            let deadline = Instant::now() + PATIENCE;
            while 0 < pong.sends_in_flight() && Instant::now() < deadline {
                let _ = pong.receive(Duration::from_millis(1));
            }
        });
        let pinned = ping.cache().pin();
        let peer = pinned.resolve(1, &pong_address).expect("resolve");
        // The first round warms the connection up and is not counted.
        for round in 0..=ROUNDS {
            let started = Instant::now();
            for _ in 0..ITERATIONS {
                post(&ping, peer, &message, how);
                let answer = next_message(&ping, spin);
                assert_eq!(size, answer.len());
            }
            let one_way = started.elapsed().as_secs_f64() * 1e6 / (2 * ITERATIONS) as f64;
            if 0 < round {
                rounds.push(one_way);
            }
        }
    });
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

/// The baseline's program: `MESSAGES_PINGPONG`, else `fi_pingpong` on `PATH`.
fn pingpong() -> std::ffi::OsString {
    std::env::var_os("MESSAGES_PINGPONG").unwrap_or_else(|| "fi_pingpong".into())
}

/// The one-way latency in a pingpong's output: the last line's value in the column the header
/// names `usec/xfer` (`fi_pingpong`: bytes, #sent, #ack, total, time, MB/sec, usec/xfer,
/// Mxfers/sec; fabtests' `fi_rdm_pingpong`: bytes, iters, total, time, MB/sec, usec/xfer,
/// Mxfers/sec).
fn one_way(text: &str) -> Option<f64> {
    let column = text
        .lines()
        .find_map(|line| line.split_whitespace().position(|word| word == "usec/xfer"))?;
    let line = text.lines().rev().find(|line| !line.trim().is_empty())?;
    line.split_whitespace().nth(column)?.parse().ok()
}

/// fabtests' `fi_pingpong` (or [`pingpong`]'s) one-way latency for `size` bytes, if it is
/// installed and runs.
fn fabtests(size: usize) -> Option<f64> {
    let args = |extra: &[&str]| {
        let mut args = vec![
            "-p".to_string(),
            "tcp;ofi_rxm".into(),
            "-e".into(),
            "rdm".into(),
            "-I".into(),
            ITERATIONS.to_string(),
            "-S".into(),
            size.to_string(),
        ];
        let added = std::env::var("MESSAGES_PINGPONG_ARGS").unwrap_or_default();
        args.extend(added.split_whitespace().map(str::to_string));
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    };
    let mut server = Command::new(pingpong())
        .args(args(&[]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // The server listens on its control port once started; the client retries until it does.
    let mut output = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let run = Command::new(pingpong())
            .args(args(&["127.0.0.1"]))
            .output()
            .ok()?;
        if run.status.success() {
            output = Some(run);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    one_way(&String::from_utf8_lossy(&output?.stdout))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` (and `--list`) do not: a test run
    // of a bench target measures nothing.
    if !std::env::args().any(|arg| arg == "--bench") {
        return;
    }
    if let Some(size) = std::env::var("MESSAGES_PROFILE")
        .ok()
        .and_then(|size| size.parse().ok())
    {
        // Ours alone, spinning, for `perf` or `strace` to look at: no fabtests, no table.
        let how = if std::env::var_os("MESSAGES_INJECT").is_some() {
            Post::Inject
        } else {
            Post::Send
        };
        let sends = if std::env::var_os("MESSAGES_LOCAL_SENDS").is_some() {
            SendCompletion::Local
        } else {
            SendCompletion::Acknowledged
        };
        println!("{size} B, spinning: {:.2} µs", ours(size, true, how, sends));
        return;
    }
    println!(
        "one-way latency, tcp;ofi_rxm on 127.0.0.1, median of {ROUNDS} rounds of {ITERATIONS} \
         round trips; load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "| size | ours, asleep in receive (µs) | ours, spinning on try_receive (µs) | local sends, asleep (µs) | local sends, spinning (µs) | ours, injecting, spinning (µs) | fi_pingpong (µs) | spinning ÷ fi_pingpong | local sends, spinning ÷ fi_pingpong | injecting ÷ fi_pingpong |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let inject_limit = {
        let description = endpoint(SendCompletion::default()).describe().clone();
        description.inject_size.min(description.max_send_size)
    };
    let (acknowledged, local) = (SendCompletion::Acknowledged, SendCompletion::Local);
    for size in SIZES {
        let asleep = ours(size, false, Post::Send, acknowledged);
        let spinning = ours(size, true, Post::Send, acknowledged);
        let local_asleep = ours(size, false, Post::Send, local);
        let local_spinning = ours(size, true, Post::Send, local);
        let injecting =
            (size <= inject_limit).then(|| ours(size, true, Post::Inject, acknowledged));
        let baseline = fabtests(size);
        let text =
            |value: Option<f64>| value.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
        let ratio = |ours: Option<f64>| text(ours.zip(baseline).map(|(ours, base)| ours / base));
        println!(
            "| {size} B | {asleep:.2} | {spinning:.2} | {local_asleep:.2} | {local_spinning:.2} | {} | {} | {} | {} | {} |",
            text(injecting),
            text(baseline),
            ratio(Some(spinning)),
            ratio(Some(local_spinning)),
            ratio(injecting)
        );
    }
}
