//! Faults under the async API (issue 31, item 5), on real tcp;ofi_rxm endpoints: two peer
//! processes with `AsyncEndpoint` write futures pending to each, one SIGKILLed and the other
//! SIGSTOPped mid-transfer. Every future, wrapped in `tokio::time::timeout` of a deadline (the
//! futures have no deadline of their own: see `asynchronous`, "Timeouts"), resolves: the killed
//! peer's with their completions or errors, the stopped peer's with a completion or the
//! timeout; none stays pending and no task panics. The timed-out writes stay in flight, held by
//! the endpoint and listed by `overdue_operations`, until the peer's fate is known.
#![cfg(feature = "tokio")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::io::Write;
use std::process::{Child, ChildStdin, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dma_libfabric::asynchronous::AsyncEndpoint;
use dma_libfabric::{Completion, Configuration, DmaError, LibfabricEndpoint, RemoteRegion};
use testkit::PATIENCE;

/// More than loopback's socket buffers hold: a peer that stops reading cannot take them all.
const CHUNK: usize = 16 << 20;
/// Writes pending to each peer.
const WRITES: usize = 3;
/// The deadline each write future is given (what a server's `--write-deadline` would be). The
/// killed peer's writes must resolve on their own before it, counted from their spawn, so it is
/// long enough that only a hang reaches it on a loaded machine (2 s was a few time slices of
/// the driver and the kill's reset beside two builds on two cores); the stopped peer's writes
/// wait it out.
const DEADLINE: Duration = Duration::from_secs(10);

/// A peer process: continued and killed when dropped, so a failing test leaves no stopped
/// process behind.
struct PeerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    address: Vec<u8>,
    region: RemoteRegion,
}

impl PeerProcess {
    fn announced(mut child: Child) -> Self {
        let (address, region) = testkit::announced_peer(&mut child);
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            address,
            region,
        }
    }

    fn hold(&mut self) {
        let stdin = self.stdin.as_mut().expect("piped");
        stdin.write_all(b"h").expect("tell the peer to hold");
        stdin.flush().expect("flush");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([name, &self.child.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success(), "kill {name}");
    }

    fn kill(&mut self) {
        self.child.kill().expect("kill the peer");
        self.child.wait().expect("reap the peer");
        self.stdin = None;
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return; // reaped: its pid may be another process's now
        }
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one write task saw: its completion, its post's error, or the deadline.
type Outcome = Result<Result<Completion, DmaError>, tokio::time::error::Elapsed>;

/// `WRITES` write futures of `CHUNK` bytes to `peer` (as client `client`), each in its own task
/// under `DEADLINE`.
fn spawn_writes(
    server: &AsyncEndpoint,
    client: u64,
    peer: &PeerProcess,
) -> Vec<tokio::task::JoinHandle<Outcome>> {
    let source = Arc::new(server.endpoint().register_shared(CHUNK).unwrap());
    (0..WRITES)
        .map(|_| {
            let server = server.clone();
            let source = Arc::clone(&source);
            let address = peer.address.clone();
            let remote = peer.region;
            tokio::spawn(async move {
                tokio::time::timeout(DEADLINE, async {
                    let lease = server.lease(client, &address).await?;
                    server
                        .write(lease.lease(), source.segment(0, CHUNK)?, remote)
                        .await
                })
                .await
            })
        })
        .collect()
}

/// Connect `server` to `peer` (client `client`) with one small write, while the peer progresses.
async fn connect(server: &AsyncEndpoint, client: u64, peer: &PeerProcess) -> u64 {
    let source = server.endpoint().register(8).unwrap();
    let lease = server.lease(client, &peer.address).await.unwrap();
    let fi_addr = lease.fi_addr();
    let done = tokio::time::timeout(
        PATIENCE,
        server.write(
            lease.lease(),
            source.segment(0, 8).unwrap(),
            peer.region.slice(0, 8).unwrap(),
        ),
    )
    .await
    .expect("connected in time")
    .unwrap();
    assert_eq!(Ok(()), done.result);
    fi_addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_future_resolves_when_one_peer_is_killed_and_another_stopped() {
    const NAME: &str = "every_write_future_resolves_when_one_peer_is_killed_and_another_stopped";
    let (Some(killed), Some(stopped)) = (testkit::spawn_child(NAME), testkit::spawn_child(NAME))
    else {
        testkit::be_an_rma_peer(CHUNK);
    };
    let mut killed = PeerProcess::announced(killed);
    let mut stopped = PeerProcess::announced(stopped);
    let configuration = Configuration {
        rma: true,
        ..Configuration::default()
    };
    let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
    let server = AsyncEndpoint::new(Arc::new(endpoint)).unwrap();
    // Client 1 is the peer to kill, client 2 the one to stop: both connected while they
    // progress, then told to hold, and the second stopped.
    let killed_addr = connect(&server, 1, &killed).await;
    connect(&server, 2, &stopped).await;
    killed.hold();
    stopped.hold();
    stopped.signal("-STOP");

    let to_killed = spawn_writes(&server, 1, &killed);
    let to_stopped = spawn_writes(&server, 2, &stopped);
    // Mid-transfer: once some write is in flight.
    let patience = Instant::now() + PATIENCE;
    while 0 == server.endpoint().operations_in_flight() {
        assert!(Instant::now() < patience, "nothing was posted");
        tokio::task::yield_now().await;
    }
    killed.kill();

    // Every future resolves, and no task panics. The outer timeout only turns a hang into a
    // failure: each task's own deadline is `DEADLINE`.
    let mut unreachable = 0;
    for task in to_killed {
        let outcome = tokio::time::timeout(PATIENCE, task)
            .await
            .expect("a write future to the killed peer stayed pending")
            .expect("no task panics");
        // The kill resets the connection: each write completes (it was in the socket) or fails
        // on its own, long before the deadline.
        let resolved = outcome.expect("the killed peer's write resolved by itself");
        match resolved.and_then(|done| done.result) {
            Ok(()) => {}
            Err(DmaError::PeerUnreachable { peer, .. }) => {
                assert_eq!(killed_addr, peer);
                unreachable += 1;
            }
            // 2.6.0 cancels some writes queued on the closed connection with no provider error;
            // a post that met the reset before any completion said so is WouldBlock.
            Err(DmaError::Fabric { code: -125, .. } | DmaError::WouldBlock) => {}
            Err(other) => panic!("a write to the killed peer: {other}"),
        }
    }
    let (mut completed, mut timed_out) = (0, 0);
    for task in to_stopped {
        let outcome = tokio::time::timeout(PATIENCE, task)
            .await
            .expect("a write future to the stopped peer stayed pending")
            .expect("no task panics");
        match outcome {
            Ok(Ok(done)) => {
                assert_eq!(Ok(()), done.result);
                completed += 1;
            }
            Ok(Err(error)) => panic!("a write to the stopped peer: {error}"),
            Err(_elapsed) => timed_out += 1,
        }
    }
    eprintln!(
        "killed peer: {unreachable} of {WRITES} PeerUnreachable; stopped peer: {completed} \
         completed, {timed_out} timed out"
    );
    assert!(
        0 < timed_out,
        "a stopped peer took {WRITES} × {CHUNK} bytes"
    );
    // A timed-out future was dropped; its write is still in flight, holding its lease, and the
    // endpoint's overdue-operation machinery lists it.
    let mut overdue = Vec::new();
    assert!(
        timed_out
            <= server
                .endpoint()
                .overdue_operations(Duration::ZERO, &mut overdue),
        "{overdue:?}"
    );
    assert!(0 < server.endpoint().cache().stats().leases);
    if 0 < unreachable {
        // The killed peer is marked: a new write to it is refused at once (item 4).
        let source = server.endpoint().register(8).unwrap();
        let lease = server.lease(1, &killed.address).await.unwrap();
        let refused = server
            .write(
                lease.lease(),
                source.segment(0, 8).unwrap(),
                killed.region.slice(0, 8).unwrap(),
            )
            .await;
        assert!(
            matches!(refused, Err(DmaError::PeerUnreachable { .. })),
            "{refused:?}"
        );
    }

    // Once the stopped peer's fate is known (here: killed), its writes complete, the driver
    // reaps them, and their leases come back.
    stopped.kill();
    let patience = Instant::now() + PATIENCE;
    while 0 < server.endpoint().operations_in_flight() {
        assert!(
            Instant::now() < patience,
            "{} writes never completed after the kill",
            server.endpoint().operations_in_flight()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(0, server.endpoint().cache().stats().leases);
}
