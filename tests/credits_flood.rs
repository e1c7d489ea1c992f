//! Credits on the receive side (issue 40, item 2), on real tcp;ofi_rxm endpoints in separate
//! processes: four sender processes send 4 KiB messages as fast as they can to a receiver process
//! that reads one message a millisecond. The receiver grants each sender its window
//! (`Configuration::receive_window`) and grants again only as it reads, so:
//!
//! - the receiver grows at most 64 MiB, and so does each sender;
//! - nothing is lost: the receiver reads, per sender, exactly what that sender's sends accepted;
//! - every sender meets `WouldBlock`, and each gets its share: none below half of an even split;
//! - once the backlog is read, the receiver is within 16 MiB of where it started.
//!
//! Before credits (main at `5303d52`), the same receiver passed 1 GiB in 10.6-11.4 s, one sender
//! got 233,000-247,000 sends accepted while the other three stayed near 128. With grants
//! extended past what was granted rather than what was read (a window that never closes), a 5 s
//! run failed: the receiver grew 346 MB and one sender got 77,826 sends while the others got 8.
//!
//! The flood lasts `DMA_LIBFABRIC_CREDITS_SECONDS` (default 20) seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::io::{BufReader, Read, Write};
use std::process::ChildStdout;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dma_libfabric::DmaError;
use testkit::{PATIENCE, PeerProcess, hex, line_after, resident, unhex};

/// Marks a child and its role.
const ROLE: &str = "DMA_LIBFABRIC_CREDITS_ROLE";
/// The receiver's address (hex), for the senders.
const RECEIVER: &str = "DMA_LIBFABRIC_CREDITS_RECEIVER";
/// Which sender a child is (0..SENDERS): the first byte of each of its messages.
const SENDER: &str = "DMA_LIBFABRIC_CREDITS_SENDER";
const SENDERS: usize = 4;
const MESSAGE: usize = 4096;
const NAME: &str = "four_senders_flooding_a_slow_reader_are_bounded_and_served_evenly";
/// The most either side may grow, and how close the drained receiver must come back.
const GROWTH: usize = 64 << 20;
const RETURN: usize = 16 << 20;

/// This binary as a child in `role`, under the configuration's rxm sizing and `envs`.
fn spawn(role: &str, envs: &[(&str, String)]) -> (PeerProcess, BufReader<ChildStdout>) {
    let mut all: Vec<(&str, String)> = dma_libfabric::Configuration::default()
        .rxm_environment()
        .into_iter()
        .collect();
    all.extend(envs.iter().cloned());
    testkit::spawn_role(NAME, ROLE, role, &all)
}

fn numbers(line: &str) -> Vec<usize> {
    line.split_whitespace()
        .map(|number| number.parse().expect("a number"))
        .collect()
}

fn say(line: &str) {
    println!("{line}");
    std::io::stdout().flush().expect("flush");
}

/// The receiver: announce, then read one message a millisecond, counting each sender's and
/// keeping the peak resident size, until the parent says how many to expect; then read the
/// rest without pausing, and report.
fn be_the_receiver() {
    let receiver = testkit::tcp();
    let base = resident();
    say(&format!(
        "RECEIVER {} {base}",
        hex(&receiver.local_address().expect("address"))
    ));
    let expected = AtomicU64::new(u64::MAX);
    let mut counts = [0_usize; SENDERS];
    let mut peak = base;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).expect("stdin");
            expected.store(line.trim().parse().expect("a count"), Ordering::Release);
        });
        let mut read = 0_usize;
        loop {
            let draining = u64::MAX != expected.load(Ordering::Acquire);
            if draining && read as u64 >= expected.load(Ordering::Acquire) {
                break;
            }
            let wait = if draining { PATIENCE } else { Duration::ZERO };
            if let Some(message) = receiver.receive(wait).expect("receive") {
                assert_eq!(MESSAGE, message.len());
                counts[usize::from(message[0])] += 1;
                read += 1;
                if 0 == read % 256 {
                    peak = peak.max(resident());
                }
            } else {
                assert!(!draining, "the backlog stopped short after {read} messages");
            }
            if !draining {
                // The slow reader this test is about: one message a millisecond.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    peak = peak.max(resident());
    let counts: Vec<String> = counts.iter().map(ToString::to_string).collect();
    say(&format!(
        "COUNTS {} {peak} {}",
        counts.join(" "),
        resident()
    ));
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

/// A sender: connect, flood for the test's seconds, wait until every accepted send completed,
/// report, and keep progressing until the parent closes stdin.
fn be_a_sender() {
    let address = unhex(&std::env::var(RECEIVER).expect("the receiver's address"));
    let me: u8 = std::env::var(SENDER)
        .expect("which sender")
        .parse()
        .expect("a number");
    let sender = testkit::tcp();
    let seconds: u64 = std::env::var("DMA_LIBFABRIC_CREDITS_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20);
    let message = vec![me; MESSAGE];
    let pinned = sender.cache().pin();
    let peer = pinned.resolve(1, &address).expect("resolve");
    let before = resident();
    let (mut accepted, mut refused) = (0_usize, 0_usize);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        match sender.try_send(peer, &message) {
            Ok(()) => accepted += 1,
            Err(DmaError::WouldBlock) => {
                refused += 1;
                sender.progress();
            }
            Err(error) => panic!("{error}"),
        }
    }
    let grown = resident().saturating_sub(before);
    let drained = Instant::now() + PATIENCE;
    while 0 < sender.sends_in_flight() {
        assert!(Instant::now() < drained, "the sends never completed");
        sender.progress();
        std::thread::yield_now();
    }
    say(&format!("SENT {accepted} {refused} {grown}"));
    let stop = AtomicU64::new(0);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut rest = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut rest);
            stop.store(1, Ordering::Release);
        });
        while 0 == stop.load(Ordering::Acquire) {
            sender.progress();
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

#[test]
fn four_senders_flooding_a_slow_reader_are_bounded_and_served_evenly() {
    match std::env::var(ROLE).as_deref() {
        Ok("receiver") => return be_the_receiver(),
        Ok("sender") => return be_a_sender(),
        _ => {}
    }
    let (mut receiver, mut receiver_out) = spawn("receiver", &[]);
    let announced = line_after(&mut receiver_out, "RECEIVER ");
    let (address, base) = announced.split_once(' ').expect("address and size");
    let base: usize = base.parse().expect("a size");
    let senders: Vec<_> = (0..SENDERS)
        .map(|me| {
            spawn(
                "sender",
                &[(RECEIVER, address.to_string()), (SENDER, me.to_string())],
            )
        })
        .collect();
    let mut senders = senders;
    let mut sent = Vec::new();
    for (_, stdout) in &mut senders {
        sent.push(numbers(&line_after(stdout, "SENT ")));
    }
    let total: usize = sent.iter().map(|numbers| numbers[0]).sum();
    let stdin = receiver.0.stdin.as_mut().expect("piped");
    writeln!(stdin, "{total}").expect("to the receiver");
    stdin.flush().expect("flush");
    let report = numbers(&line_after(&mut receiver_out, "COUNTS "));
    let (counts, peak, after) = (&report[..SENDERS], report[SENDERS], report[SENDERS + 1]);
    println!(
        "sent (accepted, refused, grown): {sent:?}; received {counts:?}; receiver base {base}, \
         peak {peak}, after {after}"
    );
    for (me, numbers) in sent.iter().enumerate() {
        assert_eq!(
            numbers[0], counts[me],
            "sender {me}: every accepted message read"
        );
        assert!(0 < numbers[1], "sender {me} never met WouldBlock");
        assert!(
            numbers[2] <= GROWTH,
            "sender {me} grew {} bytes",
            numbers[2]
        );
        assert!(
            numbers[0] * SENDERS * 2 >= total,
            "sender {me} got {} of {total}: below half of an even split",
            numbers[0]
        );
    }
    assert!(
        peak.saturating_sub(base) <= GROWTH,
        "the receiver grew {} bytes",
        peak - base
    );
    assert!(
        after.saturating_sub(base) <= RETURN,
        "the drained receiver holds {} bytes more than at its start",
        after - base
    );
    drop(senders);
}
