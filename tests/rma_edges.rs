//! RMA at the edges (issue 19), on the real tcp provider: a peer's transfer racing the drop of
//! the region it targets, registering and dropping in a loop, keys one endpoint's descriptor
//! cannot share with another's, and lengths the allocator cannot give. Each test that crashed or
//! corrupted memory before runs in a child process (`testkit::in_child_process`), so a crash
//! fails the test instead of ending the test binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use testkit::resident;

use dma_libfabric::{
    DmaError, LibfabricEndpoint, MAX_REGION_LEN, MemoryRegion, REGION_REUSE_QUARANTINE,
    RemoteRegion,
};
use testkit::{PATIENCE, rma_tcp, wait_for_bytes, with_progress};
use testkit::{Random, in_child_process};

/// The size of the racing transfers: large enough that tcp moves it over many progress calls.
const LARGE: usize = 8 << 20;

/// How many times a racing test sets up the race before it gives up on hitting it.
const ATTEMPTS: usize = 5;

/// One round of the target's progress: the transmit queue and the receive queue.
fn progress(endpoint: &LibfabricEndpoint) {
    endpoint.progress();
    let _ = endpoint.try_receive();
}

fn byte_at(region: &MemoryRegion<'_>, offset: usize) -> u8 {
    let mut byte = [0];
    region.read_bytes(offset, &mut byte).expect("in range");
    byte[0]
}

/// Drive `target`'s progress until `done` holds, for at most `PATIENCE`.
fn progress_until(target: &LibfabricEndpoint, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        progress(target);
        std::thread::yield_now();
    }
}

/// Connect `server` to `client` (id 1) with one small write that completes and lands, so the
/// racing transfer starts on an open connection.
fn connect(server: &LibfabricEndpoint, client: &LibfabricEndpoint) {
    let address = client.local_address().expect("address");
    let source = server.register(8).expect("server memory");
    source.write_bytes(0, &[0xee; 8]).expect("fits");
    let target = client.register(8).expect("client memory");
    with_progress(client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(
                lease,
                source.segment(0, 8).expect("segment"),
                target.remote(),
                u64::MAX,
            )
            .expect("posted");
        let completion = server.wait_for(u64::MAX, PATIENCE).expect("completed");
        assert_eq!(Ok(()), completion.result);
        wait_for_bytes(&target, 0, &[0xee; 8]);
    });
}

/// Issue 19, item 1: a peer writes 8 MiB into a region; the target drops the region once part
/// of it has landed and allocates an unrelated zeroed buffer of the same size. The write goes on
/// landing (tcp checked it once, when its header arrived), but into the endpoint's parked
/// memory: the unrelated buffer stays all zeros. A marker written after it on the same
/// connection shows the write has been consumed in full before the check.
///
/// Before: the freed buffer was handed to the unrelated allocation, and ~8 MiB of it became the
/// peer's bytes.
#[test]
fn a_peers_write_racing_the_drop_never_lands_in_unrelated_memory() {
    if !in_child_process("a_peers_write_racing_the_drop_never_lands_in_unrelated_memory") {
        return;
    }
    let mut raced = 0;
    for _ in 0..ATTEMPTS {
        let server = rma_tcp();
        let client = rma_tcp();
        connect(&server, &client);
        let address = client.local_address().expect("address");
        let source = server.register(LARGE).expect("server memory");
        source.write_bytes(0, &vec![0xab; LARGE]).expect("fits");
        let marker_source = server.register(8).expect("server memory");
        marker_source.write_bytes(0, &[0xcd; 8]).expect("fits");
        let target = client.register(LARGE).expect("client memory");
        let marker = client.register(8).expect("client memory");
        let (target_remote, marker_remote) = (target.remote(), marker.remote());

        let unrelated = std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                let lease = server.cache().lease(1, &address).expect("a lease");
                server
                    .write(
                        lease.clone(),
                        source.segment(0, LARGE).expect("segment"),
                        target_remote,
                        1,
                    )
                    .expect("posted");
                let large = server
                    .wait_for(1, PATIENCE)
                    .expect("the large write completed");
                server
                    .write(
                        lease,
                        marker_source.segment(0, 8).expect("segment"),
                        marker_remote,
                        2,
                    )
                    .expect("posted");
                let marker = server.wait_for(2, PATIENCE).expect("the marker completed");
                (large.result, marker.result)
            });
            // The target progresses until part of the write has landed, then drops the region.
            progress_until(&client, "the first bytes landed", || {
                0xab == byte_at(&target, 0)
            });
            let partial = 0 == byte_at(&target, LARGE - 1);
            drop(target);
            assert!(client.parked_memory() >= LARGE, "parked, not freed");
            let unrelated = vec![0_u8; LARGE];
            progress_until(&client, "the marker landed", || 0xcd == byte_at(&marker, 7));
            let (large, marker) = writer.join().expect("the writing thread");
            assert_eq!((Ok(()), Ok(())), (large, marker));
            raced += usize::from(partial);
            unrelated
        });
        let touched = unrelated.iter().filter(|&&byte| 0 != byte).count();
        assert_eq!(
            0, touched,
            "bytes of the unrelated allocation the peer's write changed"
        );
        if 0 < raced {
            break;
        }
    }
    assert!(
        0 < raced,
        "the region was never dropped mid-transfer in {ATTEMPTS} attempts"
    );
}

/// The most bytes two loopback tcp sockets can hold between a sender and a receiver that does
/// not read: the sender's send buffer and the receiver's receive buffer at their largest
/// (`tcp_wmem` and `tcp_rmem`'s third fields).
fn socket_buffers() -> usize {
    let largest = |path: &str| -> usize {
        std::fs::read_to_string(path)
            .expect(path)
            .split_whitespace()
            .nth(2)
            .expect("three fields")
            .parse()
            .expect("a number")
    };
    largest("/proc/sys/net/ipv4/tcp_wmem") + largest("/proc/sys/net/ipv4/tcp_rmem")
}

/// Issue 19, item 1, the mirror: a peer reads a region; the target drops it while it is still
/// answering, and fills an unrelated allocation of the same size with a pattern. The initiator
/// must get the region's old bytes (or an error), never the pattern, and its read must complete.
///
/// The drop is mid-answer by construction: the initiator does not progress (does not read its
/// socket) until after the drop, so at most what the two sockets hold has left the region by
/// then, and the region is twice that. An `Ok` read was admitted before the drop (one arriving
/// after it finds no key), so the rest of its answer left the region after the drop.
///
/// Before: the answer went on from freed memory, and the initiator received the unrelated
/// allocation's bytes, or (memory unmapped) never completed.
#[test]
fn a_peers_read_racing_the_drop_never_returns_unrelated_memory() {
    if !in_child_process("a_peers_read_racing_the_drop_never_returns_unrelated_memory") {
        return;
    }
    const OLD: u8 = 0x5a;
    const UNRELATED: u8 = 0x33;
    let len = (2 * socket_buffers()).max(LARGE);
    let mut raced = 0;
    for _ in 0..ATTEMPTS {
        let server = rma_tcp();
        let client = rma_tcp();
        connect(&server, &client);
        let address = client.local_address().expect("address");
        let landing = server.register(len).expect("server memory");
        let exposed = client.register(len).expect("client memory");
        exposed.write_bytes(0, &vec![OLD; len]).expect("fits");
        let exposed_remote = exposed.remote();
        let (posted, dropped) = (AtomicBool::new(false), AtomicBool::new(false));

        let (result, unrelated) = std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let lease = server.cache().lease(1, &address).expect("a lease");
                server
                    .read(
                        lease,
                        landing.segment(0, len).expect("segment"),
                        exposed_remote,
                        3,
                    )
                    .expect("posted");
                posted.store(true, Ordering::Release);
                // No progress (so no reading of the socket) until the target has dropped.
                let deadline = Instant::now() + PATIENCE;
                while !dropped.load(Ordering::Acquire) && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                server.wait_for(3, PATIENCE)
            });
            progress_until(&client, "the read was posted", || {
                posted.load(Ordering::Acquire)
            });
            // The target takes the request and answers until the sockets are full.
            for _ in 0..1000 {
                progress(&client);
            }
            drop(exposed);
            assert!(client.parked_memory() >= len, "parked, not freed");
            let unrelated = vec![UNRELATED; len];
            dropped.store(true, Ordering::Release);
            let deadline = Instant::now() + PATIENCE;
            while !reader.is_finished() {
                assert!(Instant::now() < deadline, "the read hangs");
                progress(&client);
                std::thread::yield_now();
            }
            let completion = reader
                .join()
                .expect("the reading thread")
                .expect("the read completed: nothing hangs");
            (completion.result, unrelated)
        });
        assert_eq!(len, unrelated.len());
        let mut fetched = vec![0; len];
        landing.read_bytes(0, &mut fetched).expect("in range");
        let leaked = fetched.iter().filter(|&&byte| UNRELATED == byte).count();
        assert_eq!(
            0, leaked,
            "bytes of unrelated memory the initiator received"
        );
        if result.is_ok() {
            let other = fetched.iter().filter(|&&byte| OLD != byte).count();
            assert_eq!(0, other, "an Ok read returns the region's old bytes");
            raced += 1;
            break;
        }
    }
    assert!(
        0 < raced,
        "no read was admitted before the drop in {ATTEMPTS} attempts"
    );
}

/// A server that registers and drops regions of mixed sizes in a loop, a few alive at a time,
/// parks a bounded amount of memory and stays bounded in resident memory: parked buffers are
/// reused. Its own process, so no other test's memory counts.
#[test]
fn a_register_drop_loop_stays_bounded_in_parked_and_resident_memory() {
    if !in_child_process("a_register_drop_loop_stays_bounded_in_parked_and_resident_memory") {
        return;
    }
    const SIZES: [usize; 7] = [1, 100, 4096, 5000, 65_536, 100_000, 1 << 20];
    const ALIVE: usize = 4;
    let endpoint = rma_tcp();
    let mut random = Random::new(19);
    // Each class holds at most ALIVE live regions plus REGION_REUSE_QUARANTINE parked ones;
    // classes are at most 25% above the length, and at least 64 bytes.
    let bound: usize = SIZES
        .iter()
        .map(|&len| (ALIVE + REGION_REUSE_QUARANTINE) * (len + len / 4).max(64))
        .sum();
    let mut alive = std::collections::VecDeque::new();
    let mut warm = 0;
    let mut most = 0;
    for cycle in 0..10_000 {
        if 1000 == cycle {
            warm = resident();
        }
        let len = SIZES[random.below(SIZES.len() as u64) as usize];
        let region = endpoint.register(len).expect("registered");
        region.write_bytes(len - 1, &[1]).expect("fits");
        alive.push_back(region);
        if alive.len() > ALIVE {
            alive.pop_front();
        }
        most = most.max(endpoint.parked_memory());
    }
    assert!(most <= bound, "parked {most} bytes, bound {bound}");
    assert!(0 < most, "dropped regions are parked");
    let grown = resident().saturating_sub(warm);
    assert!(
        grown <= 16 << 20,
        "resident memory grew by {grown} bytes over 9,000 cycles after the warm-up of 1,000"
    );
    drop(alive);
}

/// Issue 19, item 2: two clients' first regions have the same shape (length, and with
/// `mr_mode` 0 the same address, 0). A server that writes to client B, on B's lease, with client
/// A's descriptor must not land in B's memory: B's key is its own random key, so B refuses the
/// write. A read of B's own region after it, on the same connection, shows that B has handled
/// the write (it completes after everything before it, or fails because B dropped the
/// connection over the bad key).
///
/// Before: every endpoint requested keys 1, 2, 3, ..., so A's descriptor was valid at B and
/// the write landed.
#[test]
fn a_write_with_another_clients_descriptor_does_not_land() {
    let server = rma_tcp();
    let client_a = rma_tcp();
    let client_b = rma_tcp();
    let region_a = client_a.register(4096).expect("A's first region");
    let region_b = client_b.register(4096).expect("B's first region");
    assert_eq!(
        (region_a.remote().address, region_a.remote().len),
        (region_b.remote().address, region_b.remote().len),
        "the same shape"
    );
    assert_ne!(region_a.remote().key, region_b.remote().key, "random keys");
    let source = server.register(4096).expect("server memory");
    source.write_bytes(0, &[0x77; 4096]).expect("fits");
    let landing = server.register(64).expect("server memory");
    let address_b = client_b.local_address().expect("B's address");

    let (write, read) = with_progress(&client_b, || {
        let lease = server.cache().lease(2, &address_b).expect("B's lease");
        server
            .write(
                lease.clone(),
                source.segment(0, 4096).expect("segment"),
                region_a.remote(),
                1,
            )
            .expect("posted");
        let write = server.wait_for(1, PATIENCE).expect("the write completed");
        let read = match server.read(
            lease,
            landing.segment(0, 64).expect("segment"),
            region_b.remote().slice(0, 64).expect("slice"),
            2,
        ) {
            Ok(()) => {
                server
                    .wait_for(2, PATIENCE)
                    .expect("the read completed")
                    .result
            }
            Err(error) => Err(error),
        };
        (write.result, read)
    });
    let mut seen = vec![0xff; 4096];
    region_b.read_bytes(0, &mut seen).expect("in range");
    let landed = seen.iter().filter(|&&byte| 0 != byte).count();
    assert_eq!(
        0, landed,
        "bytes of B's memory the misdirected write changed (write {write:?}, read {read:?})"
    );
    let mut a = vec![0xff; 4096];
    region_a.read_bytes(0, &mut a).expect("in range");
    assert!(a.iter().all(|&byte| 0 == byte), "A was never written");
}

/// Issue 19, item 2: a descriptor whose address plus length overflows is refused by
/// `from_bytes` and by `slice` (libfabric's `ofi_mr_map_verify` adds them unchecked).
///
/// Before: `slice` wrapped the address of a descriptor built by hand.
#[test]
fn descriptors_whose_end_overflows_are_refused() {
    let wrapping = RemoteRegion {
        address: u64::MAX - 15,
        key: 1,
        len: 64,
    };
    assert!(matches!(
        RemoteRegion::from_bytes(&wrapping.to_bytes()),
        Err(DmaError::InvalidArgument(_))
    ));
    assert_eq!(
        Ok(RemoteRegion {
            address: u64::MAX - 15,
            key: 1,
            len: 8
        }),
        wrapping.slice(0, 8)
    );
    for (offset, len) in [(8, 8), (15, 1), (16, 1), (32, 8), (0, 16)] {
        assert!(
            matches!(
                wrapping.slice(offset, len),
                Err(DmaError::InvalidArgument(_))
            ),
            "{len} bytes at {offset}: {:?}",
            wrapping.slice(offset, len)
        );
    }
    let end = RemoteRegion {
        address: u64::MAX - 64,
        key: 1,
        len: 64,
    };
    assert_eq!(
        Ok(end),
        RemoteRegion::from_bytes(&end.to_bytes()),
        "ends at 2^64 - 1"
    );
    assert!(end.slice(0, 64).is_ok());
}

/// Issue 19, item 3: lengths above the bound are refused, naming the number and the bound, and
/// change nothing; a length under the bound that the system cannot allocate is an error or a
/// region, never an abort.
///
/// Before: `register(usize::MAX)` panicked ("capacity overflow") and `register(1 << 44)` aborted
/// on the failed allocation.
#[test]
fn lengths_the_allocator_cannot_give_are_errors_not_aborts() {
    if !in_child_process("lengths_the_allocator_cannot_give_are_errors_not_aborts") {
        return;
    }
    let endpoint = rma_tcp();
    for len in [usize::MAX, 1 << 44, MAX_REGION_LEN + 1] {
        match endpoint.register(len) {
            Err(DmaError::InvalidArgument(reason)) => {
                assert!(reason.contains(&len.to_string()), "{reason}");
                assert!(reason.contains(&MAX_REGION_LEN.to_string()), "{reason}");
            }
            other => panic!("{len} bytes: {other:?}"),
        }
    }
    assert_eq!(0, endpoint.parked_memory(), "nothing was allocated");
    // At the bound: a terabyte is more than this machine may give (then an error), or, under
    // memory overcommit, address space that is never touched (then a region).
    match endpoint.register(MAX_REGION_LEN) {
        Ok(region) => assert_eq!(MAX_REGION_LEN, region.len()),
        Err(DmaError::InvalidArgument(reason)) => {
            assert!(reason.contains(&MAX_REGION_LEN.to_string()), "{reason}");
        }
        Err(other) => panic!("{other}"),
    }
    let region = endpoint.register(64).expect("registration still works");
    region.write_bytes(0, b"fine").expect("fits");
}

/// A region made by `register_shared` (which holds an `Arc` of its endpoint) is parked on drop
/// like any other, and its memory is reused by a later registration of the same size class.
#[test]
fn a_shared_region_is_parked_like_any_other() {
    let endpoint = std::sync::Arc::new(rma_tcp());
    for _ in 0..=REGION_REUSE_QUARANTINE {
        drop(endpoint.register_shared(4096).expect("registered"));
    }
    assert_eq!(
        (REGION_REUSE_QUARANTINE + 1) * 4096,
        endpoint.parked_memory()
    );
    let reused = endpoint.register_shared(4096).expect("registered");
    assert_eq!(
        REGION_REUSE_QUARANTINE * 4096,
        endpoint.parked_memory(),
        "one reused"
    );
    drop(endpoint); // the region still holds it
    assert_eq!(4096, reused.len());
}

/// A descriptor built by hand (its fields are public) whose end wraps past 2^64 is refused at the
/// post, before libfabric sees it: the wrap is what libfabric's `ofi_mr_map_verify` lets through.
#[test]
fn a_write_to_a_hand_built_descriptor_that_wraps_is_refused_at_the_post() {
    let server = rma_tcp();
    let client = rma_tcp();
    let address = client.local_address().expect("address");
    let source = server.register(8).expect("server memory");
    let lease = server.cache().lease(1, &address).expect("a lease");
    let wrapping = RemoteRegion {
        address: u64::MAX - 3,
        key: 1,
        len: 8,
    };
    let refused = server.write(lease, source.segment(0, 8).expect("segment"), wrapping, 1);
    assert!(
        matches!(&refused, Err(DmaError::InvalidArgument(why)) if why.contains("2^64")),
        "{refused:?}"
    );
    assert_eq!(0, server.operations_in_flight());
    assert_eq!(0, server.cache().stats().leases, "the lease went back");
}

/// `wait_for` of a completion an earlier read already set aside answers it at once and once:
/// with a zero timeout, after the target has stopped progressing (so no read now could bring
/// it), and a second `wait_for` of the same id finds nothing.
#[test]
fn a_completion_already_set_aside_is_answered_at_once_and_once() {
    let (server, client) = (rma_tcp(), rma_tcp());
    connect(&server, &client);
    let address = client.local_address().expect("address");
    let source = server.register(64).expect("server memory");
    let target = client.register(2 * 64).expect("client memory");
    with_progress(&client, || {
        for id in [1_u64, 2] {
            let lease = server.cache().lease(1, &address).expect("a lease");
            let remote = target.remote().slice((id - 1) * 64, 64).expect("in range");
            server
                .write(lease, source.segment(0, 64).expect("segment"), remote, id)
                .expect("posted");
        }
        let second = server.wait_for(2, PATIENCE).expect("completed");
        assert_eq!(Ok(()), second.result);
        // Write 1's completion is read by now or by these passes, and set aside: `wait_for(2)`
        // took only its own.
        progress_until(&server, "write 1's completion read", || {
            0 == server.operations_in_flight()
        });
    });
    let first = server
        .wait_for(1, std::time::Duration::ZERO)
        .expect("set aside, answered without waiting");
    assert_eq!((1, Ok(())), (first.id, first.result));
    assert!(matches!(
        server.wait_for(1, std::time::Duration::ZERO),
        Err(DmaError::WouldBlock)
    ));
}
