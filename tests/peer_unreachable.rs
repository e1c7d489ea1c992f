//! A peer whose connection the provider reports reset or refused is `DmaError::PeerUnreachable`,
//! naming the peer, in the operation's completion, as soon as the provider reports it: real
//! tcp;ofi_rxm endpoints on 127.0.0.1, the peer closed with writes in flight to it. The peer is
//! then marked, and later RMA posts to it are refused at once, until its index is inserted anew.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::io::Write;
use std::time::Duration;

use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
use testkit::{PATIENCE, rma_tcp, with_progress};

#[test]
fn writes_to_a_peer_that_closed_complete_with_peer_unreachable() {
    // 128 writes in flight to one peer: past the default budget of 32, which would refuse them.
    let server = LibfabricEndpoint::open(
        &Configuration {
            rma: true,
            max_operations_per_peer: 128,
            ..Configuration::default()
        },
        Some("127.0.0.1"),
    )
    .unwrap();
    // 127 writes of 256 KiB (32 MB) posted while the client reads nothing: more than loopback's
    // socket buffers hold, so some are still queued in the provider when the client closes.
    let len = 256 << 10;
    let source = server.register(len).unwrap();
    let client = rma_tcp();
    let target = client.register(128 * len).unwrap();
    let address = client.local_address().unwrap();
    let remote = target.remote();
    let fi_addr = with_progress(&client, || {
        let lease = server.cache().lease(1, &address).unwrap();
        let fi_addr = lease.fi_addr();
        server
            .write(
                lease,
                source.segment(0, len).unwrap(),
                remote.slice(0, len as u64).unwrap(),
                0,
            )
            .unwrap();
        server
            .wait_for(0, PATIENCE)
            .expect("connected")
            .result
            .unwrap();
        fi_addr
    });
    // Posted once the client has stopped reading (a write completes when sent, not when
    // landed): more than the socket buffers hold, so some are in flight at the close.
    for id in 1..128 {
        let lease = server.cache().lease(1, &address).unwrap();
        let slot = remote.slice(id * len as u64, len as u64).unwrap();
        server
            .write(lease, source.segment(0, len).unwrap(), slot, id)
            .unwrap();
    }
    drop(target);
    drop(client);
    let mut unreachable = 0;
    for id in 1..128 {
        let done = server.wait_for(id, PATIENCE).expect("every write resolves");
        match done.result {
            Ok(()) => {}
            Err(DmaError::PeerUnreachable {
                peer,
                client,
                reason,
            }) => {
                assert_eq!(
                    (fi_addr, Some(1)),
                    (peer, client),
                    "the peer and its client"
                );
                assert!(reason.starts_with("fi_write"), "{reason}");
                unreachable += 1;
            }
            // libfabric 2.6.0 may cancel a write still queued on the closed connection with a
            // bare FI_ECANCELED, no provider error to say why: not mapped, and allowed here.
            Err(DmaError::Fabric {
                call: "fi_write",
                code: -125,
                message,
            }) if !message.contains("provider error") => {}
            Err(other) => panic!("write {id}: expected PeerUnreachable, got {other}"),
        }
    }
    eprintln!("{unreachable} of 127 writes answered PeerUnreachable");
    assert!(unreachable > 0, "no write was in flight at the close");
    assert_eq!(0, server.operations_in_flight());
    assert_eq!(0, server.cache().stats().leases);
}

/// Issue 31, item 4, the case the provider does not report: the *first* post to a peer whose
/// process has gone before any operation to it completed (its port refuses connections). rxm
/// reads the refusal from its own event queue, logs it and frees the connection; the next post
/// connects again and answers `-FI_EAGAIN` (libfabric 1.17 and 2.6.0, `rxm_process_reject`,
/// `rxm_get_conn`), and no completion, error entry or code reaches the application. So the post is
/// `WouldBlock` after its timeout, with nothing posted and the lease given back, and the error's
/// text says so, the refused connection included; the peer is not marked (nothing said it is
/// gone), so the next post tries again. Fails if a refusal were reported as something else, or if
/// the failed post left a slot, a lease or a mark behind.
#[test]
fn a_first_post_to_a_peer_that_refuses_connections_is_would_block_saying_so() {
    let server = rma_tcp();
    let source = server.register(8).expect("server memory");
    let (address, region) = {
        let gone = rma_tcp();
        let target = gone.register(8).expect("peer memory");
        (gone.local_address().expect("address"), target.remote())
    }; // closed: its port now refuses connections
    for id in 1..=2 {
        let lease = server.cache().lease(1, &address).expect("a lease");
        let refused = server.write_within(
            lease,
            source.segment(0, 8).expect("segment"),
            region.slice(0, 8).expect("slice"),
            id,
            Duration::from_millis(200),
        );
        let Err(error) = refused else {
            panic!("a write to a closed port was posted: {refused:?}");
        };
        assert!(matches!(error, DmaError::WouldBlock), "{error:?}");
        let text = error.to_string();
        for needle in ["was not posted", "refuses connections"] {
            assert!(text.contains(needle), "{needle:?} is not in {text:?}");
        }
        assert_eq!(0, server.operations_in_flight(), "nothing was posted");
        assert_eq!(0, server.cache().stats().leases, "the lease came back");
    }
}

/// Aborts the test binary, naming the wait, if it is not dropped within [`PATIENCE`]: a wait
/// without a deadline that hangs fails the run instead of stalling it.
struct Watchdog(Option<std::sync::mpsc::Sender<()>>);

impl Watchdog {
    fn start(what: &'static str) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(PATIENCE)
            {
                eprintln!("{what}: still waiting after {PATIENCE:?}, a hang: aborting");
                std::process::abort();
            }
        });
        Self(Some(stop))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Dropping the sender disconnects the channel: the watchdog thread ends.
        self.0.take();
    }
}

/// Issue 31, item 4: an RMA write to a peer process that had been SIGKILLed was posted again
/// and again, each answering `WouldBlock` after its whole timeout. Now the first completion that
/// says the connection is gone marks the peer, and the next write and read to it answer
/// `PeerUnreachable` without posting; once the index is released and handed to a live peer (a
/// new incarnation), writes to it are not refused.
#[test]
fn rma_to_a_killed_peer_is_refused_after_its_first_failed_completion() {
    const NAME: &str = "rma_to_a_killed_peer_is_refused_after_its_first_failed_completion";
    /// More than loopback's socket buffers hold: some writes are in flight at the kill.
    const CHUNK: usize = 16 << 20;
    const WRITES: u64 = 4;
    let Some(mut child) = testkit::spawn_child(NAME) else {
        // The peer: progresses until the parent says "hold", then never again, until killed.
        testkit::be_an_rma_peer(CHUNK)
    };
    let (address, region) = testkit::announced_peer(&mut child);

    let server = rma_tcp();
    let source = server.register(CHUNK).expect("server memory");
    let lease = server.cache().lease(1, &address).expect("a lease");
    let dead_index = lease.fi_addr();
    server
        .write(
            lease,
            source.segment(0, 8).expect("segment"),
            region.slice(0, 8).expect("slice"),
            100,
        )
        .expect("posted");
    let connected = server.wait_for(100, PATIENCE).expect("completed");
    assert_eq!(Ok(()), connected.result);
    let mut stdin = child.stdin.take().expect("piped");
    stdin.write_all(b"h").expect("tell the peer to hold");
    for id in 1..=WRITES {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write_within(
                lease,
                source.segment(0, CHUNK).expect("segment"),
                region.slice(0, CHUNK as u64).expect("slice"),
                id,
                PATIENCE,
            )
            .expect("posted before the kill");
    }
    child.kill().expect("kill the peer");
    child.wait().expect("reap the peer");
    drop(stdin);

    // No deadline at all (issue 31, hostile timeouts): the waits end because the kill is
    // reported, with at least one error; a wait that hung would be stopped by the watchdog.
    let watchdog = Watchdog::start("wait_for(Duration::MAX) on writes to a killed peer");
    let mut unreachable = 0;
    for id in 1..=WRITES {
        match server.wait_for(id, Duration::MAX).expect("resolved").result {
            Err(DmaError::PeerUnreachable { peer, .. }) => {
                assert_eq!(dead_index, peer);
                unreachable += 1;
            }
            // In the socket before the kill, or (2.6.0) cancelled with no provider error.
            Ok(()) | Err(DmaError::Fabric { code: -125, .. }) => {}
            Err(other) => panic!("write {id}: {other}"),
        }
    }
    assert!(0 < unreachable, "no write was in flight at the kill");
    drop(watchdog);

    // The next write and read are refused at once, with nothing posted and the lease given back.
    let lease = server
        .cache()
        .lease(1, &address)
        .expect("the entry is still there");
    let refused = server.write(
        lease,
        source.segment(0, 8).expect("segment"),
        region.slice(0, 8).expect("slice"),
        200,
    );
    let Err(DmaError::PeerUnreachable {
        peer,
        client,
        reason,
    }) = &refused
    else {
        panic!("expected PeerUnreachable, got {refused:?}");
    };
    assert_eq!((dead_index, Some(1)), (*peer, *client));
    let text = refused.as_ref().unwrap_err().to_string();
    assert!(
        text.contains("(client 1)"),
        "the error names the client: {text}"
    );
    eprintln!("refused: {reason}");
    let lease = server
        .cache()
        .lease(1, &address)
        .expect("the entry is still there");
    let refused = server.read(
        lease,
        source.segment(0, 8).expect("segment"),
        region.slice(0, 8).expect("slice"),
        201,
    );
    assert!(
        matches!(refused, Err(DmaError::PeerUnreachable { .. })),
        "{refused:?}"
    );
    assert_eq!(0, server.operations_in_flight(), "nothing was posted");
    assert_eq!(
        0,
        server.cache().stats().leases,
        "the refused posts' leases came back"
    );

    // Released and removed, its index goes to the next peer resolved (FI_AV_TABLE hands out the
    // lowest free index): a live peer there is not refused for the dead one's sake.
    server.cache().release(1);
    server.cache().quiesce_with_patience(PATIENCE);
    let live = rma_tcp();
    let landing = live.register(8).expect("live memory");
    source.write_bytes(0, &[5; 8]).expect("source bytes");
    with_progress(&live, || {
        let lease = server
            .cache()
            .lease(2, &live.local_address().expect("address"))
            .expect("a lease");
        assert_eq!(dead_index, lease.fi_addr(), "the index was reused");
        server
            .write_within(
                lease,
                source.segment(0, 8).expect("segment"),
                landing.remote(),
                300,
                PATIENCE,
            )
            .expect("a new incarnation of the index is not refused");
        let done = server.wait_for(300, PATIENCE).expect("completed");
        assert_eq!(Ok(()), done.result);
        // Inside `with_progress`: a write's completion means sent, not landed (no
        // acknowledgement is asked), and the bytes land only while the target reads its queues.
        // Waiting for them after the progress thread stopped failed about one run in ten.
        testkit::wait_for_bytes(&landing, 0, &[5; 8]);
    });
}
