//! Zero copy on the real tcp provider: the application's own buffer registered in place
//! (`register_buffer`), its bytes reached by peers and by this endpoint's operations without a
//! copy, and the buffer handed back only when nothing can touch it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use testkit::resident;

use dma_libfabric::{
    DmaError, Exposure, LibfabricEndpoint, MemoryInterface, Operation, RailSet, StableBuffer,
};
use testkit::{PATIENCE, in_child_process, rma_rails, rma_tcp, wait_for_bytes, with_progress};

/// A `Vec` that says when it is dropped, and may claim to live on another interface.
#[derive(Debug)]
struct Tracked {
    bytes: Vec<u8>,
    dropped: Arc<AtomicBool>,
    interface: MemoryInterface,
}

impl Tracked {
    fn new(len: usize, fill: u8) -> (Self, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let tracked = Self {
            bytes: vec![fill; len],
            dropped: Arc::clone(&dropped),
            interface: MemoryInterface::Host,
        };
        (tracked, dropped)
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

// SAFETY: the bytes are the `Vec`'s heap allocation, which nothing resizes while it is owned.
unsafe impl StableBuffer for Tracked {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.bytes.as_mut_ptr()
    }

    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn interface(&self) -> MemoryInterface {
        self.interface
    }
}

/// The registration is the `Vec` itself: a `Local` region's slice is the `Vec`'s bytes, and what
/// the application writes there is what this endpoint's write puts in a peer's memory; a peer's
/// read of a `Remote` region sees bytes written through the `Vec`'s own pointer after
/// registering. Fails if `register_buffer` registered (or copied into) any other memory.
#[test]
fn the_registered_memory_is_the_applications_buffer() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");

    let pages = vec![0_u8; 4096];
    let start = pages.as_ptr() as usize;
    let mut local = server
        .register_buffer(pages, Exposure::Local)
        .expect("registered");
    assert_eq!(start, local.as_slice().expect("idle").as_ptr() as usize);
    local.as_mut_slice().expect("idle")[100..116].copy_from_slice(b"written in place");

    let mut remote_pages = vec![0_u8; 4096];
    let remote_start = remote_pages.as_mut_ptr();
    let remote = server
        .register_buffer(remote_pages, Exposure::Remote)
        .expect("registered");
    // SAFETY: the Vec's heap bytes are the region's (the test's claim), alive while `remote`
    // is, and no transfer touches them yet.
    unsafe {
        remote_start
            .add(8)
            .copy_from(b"through the Vec".as_ptr(), 15)
    };

    with_progress(&client, || {
        let lease = client.cache().lease(2, &server.local_address().unwrap());
        let lease = lease.expect("a lease");
        let landing = client.register(64).expect("landing");
        // The client reads the server's Remote region: it sees the bytes written through the
        // Vec's pointer, so the registration covers the Vec's own memory.
        with_progress(&server, || {
            client
                .read(
                    lease,
                    landing.segment(0, 15).unwrap(),
                    remote.remote().slice(8, 15).unwrap(),
                    1,
                )
                .expect("posted");
            assert_eq!(
                Ok(()),
                client.wait_for(1, PATIENCE).expect("completed").result
            );
        });
        wait_for_bytes(&landing, 0, b"through the Vec");

        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(
                lease,
                local.segment(100, 16).unwrap(),
                target.remote().slice(0, 16).unwrap(),
                2,
            )
            .expect("posted");
        assert_eq!(
            Ok(()),
            server.wait_for(2, PATIENCE).expect("completed").result
        );
        wait_for_bytes(&target, 0, b"written in place");
    });
    let pages = local
        .into_buffer()
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(start, pages.as_ptr() as usize, "the same Vec, never moved");
    assert_eq!(b"written in place", &pages[100..116]);
}

/// Registering a large buffer does not copy it: resident memory grows by far less than its
/// size. Its own process, so no other test's memory counts. Fails if `register_buffer` copied
/// the bytes (into the pool, as `register` + `write_bytes` does).
#[test]
fn registering_a_large_buffer_does_not_double_resident_memory() {
    if !in_child_process("registering_a_large_buffer_does_not_double_resident_memory") {
        return;
    }
    const LEN: usize = 128 << 20;
    let endpoint = rma_tcp();
    let pages = vec![0x5a_u8; LEN]; // written, so resident
    let before = resident();
    let region = endpoint
        .register_buffer(pages, Exposure::Remote)
        .expect("registered");
    let mut last = [0; 1];
    region.read_bytes(LEN - 1, &mut last).expect("in range");
    let grown = resident().saturating_sub(before);
    assert_eq!([0x5a], last);
    assert!(
        grown < LEN / 4,
        "resident memory grew by {grown} bytes registering {LEN}"
    );
}

/// Mutating the source of a write in flight: `as_mut_slice` answers `Busy` until the write's
/// completion has been read, and the bytes the peer gets are the ones written before the post.
/// Fails if `as_mut_slice` stops checking the operations holding the region.
#[test]
fn the_source_of_a_write_in_flight_cannot_be_mutated() {
    let server = rma_tcp();
    let client = rma_tcp();
    let target = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");
    let mut source = server
        .register_buffer(b"before the post".to_vec(), Exposure::Local)
        .expect("registered");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(lease, source.segment(0, 15).unwrap(), target.remote(), 5)
            .expect("posted");
        // Nothing has read the completion yet (nothing progresses the server), so the write
        // holds the region.
        assert!(matches!(source.as_mut_slice(), Err(DmaError::Busy)));
        assert!(matches!(source.as_slice(), Err(DmaError::Busy)));
        assert_eq!(
            Ok(()),
            server.wait_for(5, PATIENCE).expect("completed").result
        );
        wait_for_bytes(&target, 0, b"before the post");
    });
    source.as_mut_slice().expect("idle once read")[0] = b'B';
    assert_eq!(b'B', source.as_slice().expect("idle")[0]);
}

/// Reading into a region while a slice of it is lent out: the read waits its patience (a second)
/// for the slice, which this thread keeps, then answers `Busy`, and nothing is posted (the
/// `compile_fail` example in `endpoint::buffer` shows the `&mut` case). Fails if posting stops
/// checking the slices lent.
#[test]
fn a_read_into_a_region_whose_slice_is_lent_is_refused() {
    let server = rma_tcp();
    let client = rma_tcp();
    let exposed = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");
    let landing = server
        .register_buffer(vec![0_u8; 64], Exposure::Local)
        .expect("registered");
    let slice = landing.as_slice().expect("idle");
    let lease = server.cache().lease(1, &address).expect("a lease");
    assert!(matches!(
        server.read(lease, landing.segment(0, 8).unwrap(), exposed.remote(), 3),
        Err(DmaError::Busy)
    ));
    assert_eq!(0, server.operations_in_flight(), "nothing posted");
    assert_eq!(0, server.cache().stats().leases, "the lease went back");
    assert!(slice.iter().all(|&byte| 0 == byte));
    drop(slice);
    exposed.write_bytes(0, b"the peer").expect("fits");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .read(lease, landing.segment(0, 8).unwrap(), exposed.remote(), 3)
            .expect("posted once the slice is gone");
        assert_eq!(
            Ok(()),
            server.wait_for(3, PATIENCE).expect("completed").result
        );
    });
    assert_eq!(b"the peer", &landing.as_slice().expect("idle")[..8]);
}

/// `into_buffer` with a read in flight hands the region back with `Busy`; once the completion
/// has been read it hands out the buffer, holding the bytes read. Fails if `into_buffer` stops
/// refusing while an operation holds the registration.
#[test]
fn into_buffer_with_a_read_in_flight_gives_the_region_back() {
    let server = rma_tcp();
    let client = rma_tcp();
    let exposed = client.register(64).expect("client memory");
    exposed.write_bytes(0, b"fetched").expect("fits");
    let address = client.local_address().expect("address");
    let landing = server
        .register_buffer(vec![0_u8; 64], Exposure::Local)
        .expect("registered");
    let landing = with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .read(lease, landing.segment(0, 7).unwrap(), exposed.remote(), 9)
            .expect("posted");
        // Nothing has read the completion yet (nothing progresses the server).
        let (landing, error) = landing.into_buffer().expect_err("a read holds it");
        assert!(matches!(error, DmaError::Busy), "{error:?}");
        assert_eq!(
            (Operation::Read, Ok(())),
            server
                .wait_for(9, PATIENCE)
                .map(|completion| (completion.operation, completion.result))
                .expect("completed")
        );
        landing
    });
    let bytes = landing
        .into_buffer()
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(b"fetched", &bytes[..7]);
}

/// Dropping a `Remote` region while a peer's write into it is still arriving: the buffer is
/// parked, its `Drop` not run, while the write lands, and dropped only with the endpoint. Fails
/// if a dropped `Remote` region drops its buffer at once.
#[test]
fn a_dropped_remote_buffer_outlives_a_peers_write_until_the_endpoint_closes() {
    const LEN: usize = 8 << 20;
    let server = rma_tcp();
    let client = rma_tcp();
    let (buffer, dropped) = Tracked::new(LEN, 0);
    let region = server
        .register_buffer(buffer, Exposure::Remote)
        .expect("registered");
    let remote = region.remote();
    let source = client.register(LEN).expect("client memory");
    source.write_bytes(LEN - 4, b"tail").expect("fits");
    let lease = client
        .cache()
        .lease(1, &server.local_address().unwrap())
        .expect("a lease");
    // Connect first (the server progresses), so that the large write is then posted while the
    // server does not progress.
    with_progress(&server, || {
        client
            .write(lease.clone(), source.segment(0, 4).unwrap(), remote, 0)
            .expect("posted");
        assert_eq!(
            Ok(()),
            client.wait_for(0, PATIENCE).expect("completed").result
        );
    });
    client
        .write(lease, source.segment(0, LEN).unwrap(), remote, 1)
        .expect("posted");
    // The server has not progressed since: the write's header may be admitted, its bytes have
    // not all landed.
    drop(region);
    assert!(!dropped.load(Ordering::Acquire), "parked, not dropped");
    assert!(LEN <= server.parked_memory());
    with_progress(&server, || {
        let completion = client.wait_for(1, PATIENCE).expect("completed");
        // Admitted before or after the drop, the write either landed in the parked buffer or
        // was refused under the closed key: never in freed memory.
        let _ = completion.result;
        assert!(!dropped.load(Ordering::Acquire), "still parked");
    });
    drop(server);
    assert!(dropped.load(Ordering::Acquire), "dropped with the endpoint");
}

/// A `Local` region has no remote access and no key: a peer's read under what `remote()` gives
/// is refused by the provider and fetches none of its bytes. Fails if `Local` registers with
/// remote access and advertises its key.
#[test]
fn a_peer_cannot_reach_a_local_region() {
    let server = rma_tcp();
    let client = rma_tcp();
    let local = server
        .register_buffer(b"private bytes".to_vec(), Exposure::Local)
        .expect("registered");
    assert_eq!(u64::MAX, local.remote().key, "FI_KEY_NOTAVAIL");
    let landing = client.register(64).expect("client memory");
    let lease = client
        .cache()
        .lease(1, &server.local_address().unwrap())
        .expect("a lease");
    let completion = with_progress(&server, || {
        client
            .read(lease, landing.segment(0, 13).unwrap(), local.remote(), 1)
            .expect("posted");
        client.wait_for(1, PATIENCE).expect("completed")
    });
    assert!(completion.result.is_err(), "{completion:?}");
    let mut fetched = [0; 13];
    landing.read_bytes(0, &mut fetched).expect("in range");
    assert_eq!([0; 13], fetched, "none of the Local region's bytes");
}

/// A dropped `Local` region that no operation holds drops its buffer at once (no peer could
/// reach it); `into_buffer` of a `Remote` region is refused with the region back, and `reclaim`
/// (the application's promise that every peer is done) hands it out.
#[test]
fn local_buffers_drop_at_once_and_remote_ones_come_back_only_through_reclaim() {
    let endpoint = rma_tcp();
    let (buffer, dropped) = Tracked::new(64, 0);
    drop(
        endpoint
            .register_buffer(buffer, Exposure::Local)
            .expect("registered"),
    );
    assert!(dropped.load(Ordering::Acquire));
    assert_eq!(0, endpoint.parked_memory());

    let (buffer, dropped) = Tracked::new(64, 3);
    let remote = endpoint
        .register_buffer(buffer, Exposure::Remote)
        .expect("registered");
    let (remote, error) = remote.into_buffer().expect_err("Remote");
    assert!(matches!(error, DmaError::InvalidArgument(_)), "{error:?}");
    assert!(matches!(
        remote.as_slice(),
        Err(DmaError::InvalidArgument(_))
    ));
    // SAFETY: no peer was given the key.
    let buffer = unsafe { remote.reclaim() }
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(vec![3; 64], buffer.bytes);
    assert!(!dropped.load(Ordering::Acquire));
    assert_eq!(0, endpoint.parked_memory());
}

/// Bad input: an empty buffer, a write_bytes on a Local region, device memory on a provider
/// without FI_HMEM (named in the error), an endpoint without RMA.
#[test]
fn bad_buffers_are_clear_errors() {
    let endpoint = rma_tcp();
    assert!(matches!(
        endpoint.register_buffer(Vec::new(), Exposure::Local),
        Err(DmaError::InvalidArgument(_))
    ));
    let local = endpoint
        .register_buffer(vec![0_u8; 16], Exposure::Local)
        .expect("registered");
    assert!(matches!(
        local.write_bytes(0, b"x"),
        Err(DmaError::InvalidArgument(_))
    ));
    let (mut device, _) = Tracked::new(64, 0);
    device.interface = MemoryInterface::Cuda { device: 0 };
    match endpoint.register_buffer(device, Exposure::Remote) {
        Err(DmaError::Unsupported(reason)) => {
            assert!(
                reason.contains("FI_HMEM") && reason.contains("tcp"),
                "{reason}"
            );
        }
        other => panic!("CUDA memory on tcp: {other:?}"),
    }
    let plain =
        LibfabricEndpoint::open(&dma_libfabric::Configuration::default(), Some("127.0.0.1"))
            .expect("a plain endpoint");
    assert!(matches!(
        plain.register_buffer(vec![0_u8; 16], Exposure::Local),
        Err(DmaError::InvalidArgument(_))
    ));
}

/// Host memory through libfabric's heterogeneous-memory path (`fi_mr_regattr`,
/// `FI_HMEM_SYSTEM`): registered in place, and a peer's read sees its bytes.
#[test]
fn host_memory_registers_through_fi_hmem_system() {
    let server = rma_tcp();
    let client = rma_tcp();
    let (mut buffer, _) = Tracked::new(64, 0);
    buffer.bytes[..6].copy_from_slice(b"system");
    buffer.interface = MemoryInterface::System;
    let region = server
        .register_buffer(buffer, Exposure::Remote)
        .expect("registered through fi_mr_regattr");
    assert_eq!(MemoryInterface::System, region.interface());
    let landing = client.register(64).expect("landing");
    let lease = client
        .cache()
        .lease(1, &server.local_address().unwrap())
        .expect("a lease");
    with_progress(&server, || {
        client
            .read(lease, landing.segment(0, 6).unwrap(), region.remote(), 1)
            .expect("posted");
        assert_eq!(
            Ok(()),
            client.wait_for(1, PATIENCE).expect("completed").result
        );
    });
    wait_for_bytes(&landing, 0, b"system");
}

/// A rail set registers one buffer on every rail: each rail's key reaches the same bytes.
#[test]
fn a_rail_set_registers_one_buffer_on_every_rail() {
    let server: RailSet = rma_rails(2);
    let client = rma_tcp();
    let mut pages = vec![0_u8; 4096];
    pages[..8].copy_from_slice(b"railpage");
    let start = pages.as_ptr() as usize;
    let region = server
        .register_buffer(pages, Exposure::Remote)
        .expect("registered");
    assert_eq!(2, region.rails());
    let remote = region.remote();
    let landing = client.register(16).expect("landing");
    for rail in 0..2 {
        let lease = client
            .cache()
            .lease(1 + rail as u64, &server.rail(rail).local_address().unwrap())
            .expect("a lease");
        testkit::with_rails_progress(&server, || {
            client
                .read(lease, landing.segment(0, 8).unwrap(), remote.rail(rail), 7)
                .expect("posted");
            assert_eq!(
                Ok(()),
                client.wait_for(7, PATIENCE).expect("completed").result
            );
        });
        wait_for_bytes(&landing, 0, b"railpage");
        landing.write_bytes(0, &[0; 8]).expect("fits");
    }
    let local = server
        .register_buffer(vec![0_u8; 64], Exposure::Local)
        .expect("registered");
    let pages = local
        .into_buffer()
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(64, pages.len());
    drop(region);
    let _ = start;
}

/// A memory mapping (the `memmap2` feature) registers in place like a `Vec`: a peer's read sees
/// bytes written through the mapping's own pointer.
#[test]
fn a_memory_mapping_registers_in_place() {
    let server = rma_tcp();
    let client = rma_tcp();
    let mut mapping = memmap2::MmapMut::map_anon(1 << 16).expect("an anonymous mapping");
    mapping[4096..4100].copy_from_slice(b"mmap");
    let start = mapping.as_ptr() as usize;
    let region = server
        .register_buffer(mapping, Exposure::Local)
        .expect("registered");
    assert_eq!(start, region.as_slice().expect("idle").as_ptr() as usize);
    let target = client.register(64).expect("client memory");
    let address = client.local_address().expect("address");
    with_progress(&client, || {
        let lease = server.cache().lease(1, &address).expect("a lease");
        server
            .write(lease, region.segment(4096, 4).unwrap(), target.remote(), 1)
            .expect("posted");
        assert_eq!(
            Ok(()),
            server.wait_for(1, PATIENCE).expect("completed").result
        );
        wait_for_bytes(&target, 0, b"mmap");
    });
    let mapping = region
        .into_buffer()
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(start, mapping.as_ptr() as usize);
}

/// A rail set's `Local` buffer, written from on both rails (a striped write): `into_buffer` and
/// `as_mut_slice` answer `Busy` until the write's one completion has been read, whichever rail
/// still holds it, and the region comes back unchanged; then the buffer comes back, at its
/// address. Fails if `RailRegion::into_buffer` stops checking every rail's holders before it
/// closes the other rails' registrations (`let idle = true;`: the region comes back on one
/// rail).
#[test]
fn a_rail_buffer_comes_back_only_when_no_rail_holds_it() {
    let server = rma_rails(2);
    let client = rma_rails(2);
    const LEN: usize = 1 << 20;
    let data: Vec<u8> = (0..LEN).map(|at| (at % 253) as u8).collect();
    let start = data.as_ptr() as usize;
    let mut region = server
        .register_buffer(data, Exposure::Local)
        .expect("registered");
    let target = client.register(LEN).expect("client memory");
    let addresses = client.local_addresses();
    let addresses: Vec<&[u8]> = addresses.iter().map(Vec::as_slice).collect();
    let region = testkit::with_rails_progress(&client, || {
        let lease = server.lease(1, &addresses).expect("leased");
        server
            .write(lease, region.segment(0, LEN).unwrap(), target.remote(), 3)
            .expect("posted");
        // Nothing has read the completions yet (nothing progresses the server's rails).
        assert!(matches!(region.as_mut_slice(), Err(DmaError::Busy)));
        let (region, error) = region.into_buffer().expect_err("the stripes hold it");
        assert!(matches!(error, DmaError::Busy), "{error:?}");
        assert_eq!(2, region.rails(), "given back unchanged");
        assert_eq!(
            Ok(()),
            server.wait_for(3, PATIENCE).expect("completed").result
        );
        region
    });
    let data = region
        .into_buffer()
        .map_err(|(_, error)| error)
        .expect("idle");
    assert_eq!(start, data.as_ptr() as usize);
}
