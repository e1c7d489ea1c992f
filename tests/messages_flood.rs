//! Four sender endpoints flood a peer process that only drives progress, for a second: each side
//! grows at most 128 MiB and the excess is answered `WouldBlock` (issue 33, item 2; before, in the
//! same second, 2,318,414 sends answered `Ok`, the senders grew 919 MiB and the peer 745 MiB). The
//! peer runs under an address-space cap (`ulimit -v`), so a regression fails the test instead of
//! taking the machine (issue 33 saw a receiver killed at 20.6 GB).
//!
//! What bounds it: each sender keeps at most `tx_size` sends in flight, and tcp completes a send
//! only once the peer's provider acknowledges it (`FI_TRANSMIT_COMPLETE`), so the senders' memory
//! is bounded by construction. The peer's is bounded per message, not in time: rxm takes every
//! message no posted receive matches into a bounce buffer of `FI_OFI_RXM_BUFFER_SIZE` bytes, from
//! a pool without a maximum (`rxm_ep_create_pools` sets no `max_cnt`, and `rxm_replace_rx_buf`
//! posts a fresh buffer for each one kept; libfabric 1.17 and 2.6.0), whatever the message's own
//! size. No rxm or tcp setting caps that pool or the unexpected-message queue. So the rule this
//! test holds: the peer grows by at most one bounce buffer (plus 1 KiB) per message it has not
//! read, beyond a fixed 16 MiB, and the senders' acknowledged rate paces it. Measured
//! (`DMA_LIBFABRIC_FLOOD_SECONDS=N cargo test --test messages_flood -- --nocapture`, 2 shared
//! cores under load): 4 KiB buffers (the crate's rxm sizing), 1 s: 3,008 sends and 9.4 MiB
//! (3.2 KiB a message) on 1.17 and 2.6.0; 3 s: 9,856 sends and 44 MiB (4.7 KiB) on 1.17, 9,032
//! and 37 MiB (4.3 KiB) on 2.6.0; rxm's default 16 KiB buffers, 3 s on 1.17: 7,197 sends and
//! 99 MiB (14.1 KiB). A receiver that must stay bounded in time reads, or its application
//! bounds what its peers send (a request/response window).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::io::{BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use testkit::{hex, line_after, unhex};

use dma_libfabric::{DmaError, LibfabricEndpoint};

/// Marks the child, which plays the flooded peer.
const CHILD: &str = "DMA_LIBFABRIC_FLOOD_CHILD";
/// The peer's address-space cap, in KiB (`ulimit -v`): far above what a bounded peer maps (a
/// debug test binary with libfabric maps a few hundred MiB), far below the machine.
const CAP_KIB: u64 = 3 << 20;
/// How much either side may grow.
const BOUND: usize = 128 << 20;
/// What the peer may grow by besides its unread messages' bounce buffers.
const PEER_FIXED: usize = 16 << 20;
/// What one unread message may cost the peer beyond its bounce buffer.
const PER_MESSAGE_EXTRA: usize = 1 << 10;
const SENDERS: usize = 4;

fn resident_of(pid: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .expect("VmRSS");
    kib << 10
}

/// Kills the peer when dropped, so a failing test leaves nothing behind.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run this test's binary as `role` (the peer, or the flooder of `peer_address`) under the
/// address-space cap, with rxm sized as the crate recommends (4 KiB bounce buffers, as a server
/// runs; both sides must agree on it).
fn spawn(role: &str, peer_address: Option<&str>) -> Child {
    const NAME: &str = "a_flood_of_four_senders_is_bounded_on_both_sides";
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -v {CAP_KIB} && exec \"$0\" \"$@\""))
        .arg(std::env::current_exe().expect("this binary"))
        .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, role)
        .envs(dma_libfabric::Configuration::default().rxm_environment())
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(address) = peer_address {
        command.env(PEER_ADDRESS, address);
    }
    command.spawn().expect("a child")
}

/// Where the flooder finds the peer's address (hex).
const PEER_ADDRESS: &str = "DMA_LIBFABRIC_FLOOD_PEER";

/// The flooded peer: announce, then only drive progress, until the parent closes stdin; then
/// time its drop.
fn be_the_peer() {
    let peer = testkit::tcp();
    println!("PEER {}", hex(&peer.local_address().expect("address")));
    std::io::stdout().flush().expect("flush");
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut byte = [0; 1];
            while let Ok(1) = std::io::stdin().read(&mut byte) {}
            stop.store(true, Ordering::Release);
        });
        while !stop.load(Ordering::Acquire) {
            peer.progress();
            std::thread::yield_now();
        }
    });
    let started = Instant::now();
    drop(peer);
    println!("DROPPED {}", started.elapsed().as_millis());
}

/// The flooder: four connected senders, then a flood of `try_send`s for the test's seconds;
/// prints what was accepted and refused and how much this process grew meanwhile.
fn flood() {
    let address = unhex(&std::env::var(PEER_ADDRESS).expect("the peer's address"));
    let senders: Vec<LibfabricEndpoint> = (0..SENDERS).map(|_| testkit::tcp()).collect();
    // Connect each first: what a connection costs (rxm's buffers for it) is not the flood's.
    for sender in &senders {
        let pinned = sender.cache().pin();
        let peer = pinned.resolve(1, &address).expect("resolve");
        sender
            .send_within(peer, b"hello", testkit::PATIENCE)
            .expect("sent");
        let deadline = Instant::now() + testkit::PATIENCE;
        while 0 < sender.sends_in_flight() {
            assert!(Instant::now() < deadline, "the first send never completed");
            sender.progress();
        }
    }
    let seconds = std::env::var("DMA_LIBFABRIC_FLOOD_SECONDS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    let before = resident_of("self");
    let (accepted, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|scope| {
        for sender in &senders {
            let (address, accepted, refused) = (&address, &accepted, &refused);
            scope.spawn(move || {
                let pinned = sender.cache().pin();
                let peer = pinned.resolve(1, address).expect("resolve");
                while Instant::now() < deadline {
                    match sender.try_send(peer, &[5; 64]) {
                        Ok(()) => accepted.fetch_add(1, Ordering::Relaxed),
                        Err(DmaError::WouldBlock) => refused.fetch_add(1, Ordering::Relaxed),
                        Err(error) => panic!("{error}"),
                    };
                    sender.progress();
                }
            });
        }
    });
    let grown = resident_of("self").saturating_sub(before);
    println!(
        "FLOODED {} {} {grown}",
        accepted.into_inner(),
        refused.into_inner()
    );
    std::io::stdout().flush().expect("flush");
}

#[test]
fn a_flood_of_four_senders_is_bounded_on_both_sides() {
    match std::env::var(CHILD).as_deref() {
        Ok("peer") => return be_the_peer(),
        Ok("flooder") => return flood(),
        _ => {}
    }
    let mut peer = Peer(spawn("peer", None));
    let pid = peer.0.id().to_string();
    let mut peer_out = BufReader::new(peer.0.stdout.take().expect("piped"));
    let address = line_after(&mut peer_out, "PEER ");
    let peer_before = resident_of(&pid);
    let mut flooder = Peer(spawn("flooder", Some(&address)));
    let mut flooder_out = BufReader::new(flooder.0.stdout.take().expect("piped"));
    let flooded = line_after(&mut flooder_out, "FLOODED ");
    let peer_grown = resident_of(&pid).saturating_sub(peer_before);
    let numbers: Vec<usize> = flooded
        .split_whitespace()
        .map(|number| number.parse().expect("a number"))
        .collect();
    let [accepted, refused, grown] = numbers[..] else {
        panic!("the flooder said {flooded}");
    };
    eprintln!(
        "{accepted} sends Ok, {refused} WouldBlock; the senders grew {} KiB, the peer {} KiB ({} B per message)",
        grown >> 10,
        peer_grown >> 10,
        peer_grown / accepted.max(1)
    );
    assert!(grown <= BOUND, "the senders grew {grown} bytes");
    // The rule: one bounce buffer per unread message (every accepted send, and the four
    // connecting ones), beyond a fixed amount.
    let buffer = dma_libfabric::Configuration::default()
        .rxm
        .buffer_size
        .expect("the crate sizes rxm's buffers");
    let per_message_bound = PEER_FIXED + (accepted + SENDERS) * (buffer + PER_MESSAGE_EXTRA);
    assert!(
        peer_grown <= per_message_bound,
        "the flooded peer grew {peer_grown} bytes for {accepted} unread messages: more than \
         {per_message_bound}, one {buffer}-byte bounce buffer each"
    );
    assert!(
        peer_grown <= BOUND,
        "the flooded peer grew {peer_grown} bytes"
    );
    assert!(0 < refused, "the excess is answered WouldBlock");
    assert!(flooder.0.wait().expect("the flooder").success());
    drop(peer.0.stdin.take());
    let dropped = line_after(&mut peer_out, "DROPPED ");
    eprintln!("the peer dropped its endpoint in {dropped} ms");
    assert!(peer.0.wait().expect("the peer").success());
}
