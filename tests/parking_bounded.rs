//! Parking bounded by what is registered (issue 42 item 3), on real tcp endpoints.
//!
//! A `Remote` buffer dropped is parked until the endpoint closes: after `fi_close` of its
//! registration, a transfer the provider admitted earlier may still land (see `MemoryRegion`,
//! "Parking"), so no drop can free it. What is bounded: a region handed to peers round after round
//! and rekeyed between rounds (`LibfabricEndpoint::rekey`) parks nothing and allocates nothing;
//! register/drop cycles park exactly the buffers registered, no more; `Local` ones park nothing.
//!
//! Memory is counted two ways: the Rust heap's live bytes (a counting global allocator, every
//! thread) and the process's resident memory. The tests of this file take one lock, so no other
//! test's memory blurs a figure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};

use dma_libfabric::{DmaError, Exposure, LibfabricEndpoint, RemoteRegion};
use testkit::{PATIENCE, resident, rma_tcp, with_progress};

/// Counts the live bytes of the Rust heap, every thread together.
struct LiveBytes;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a static
// atomic, so counting never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `pointer` came from `System` with this layout.
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        LIVE.fetch_add(size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and `size` is the caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

/// One test at a time, so each figure is its own.
static SERIAL: Mutex<()> = Mutex::new(());

const CYCLES: usize = 10_000;
const LEN: usize = 4096;
/// The bound on 10,000 cycles: 4 MiB in total.
const BOUND: usize = 4 << 20;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Write `byte` over `remote` from `client` into `server` and answer the completion's result.
fn write_from(
    client: &LibfabricEndpoint,
    server: &LibfabricEndpoint,
    remote: RemoteRegion,
    byte: u8,
    id: u64,
) -> Result<(), DmaError> {
    let source = client.register(LEN).expect("client memory");
    source.write_bytes(0, &[byte; LEN]).expect("fits");
    let lease = client
        .cache()
        .lease(1, &server.local_address().expect("an address"))
        .expect("a lease");
    with_progress(server, || {
        client.write(lease, source.segment(0, LEN).expect("segment"), remote, id)?;
        client.wait_for(id, PATIENCE).expect("completed").result
    })
}

/// 10,000 rounds of one 4 KiB `Remote` buffer rekeyed between rounds: nothing parked, the heap
/// and resident memory flat within the 4 MiB, the old key refused and the new one
/// written. Fails if rekeying parks or allocates per round, or leaves the old key open (checked
/// by hand: the same loop dropping and registering a fresh buffer instead grows both by 40 MiB;
/// `rekey` without its close lets the old key's write land).
#[test]
fn rekeying_a_remote_buffer_for_10000_rounds_stays_bounded() {
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    let server = rma_tcp();
    let mut region = server
        .register_buffer(vec![0_u8; LEN], Exposure::Remote)
        .expect("registered");
    let first = region.remote();
    let writer = rma_tcp();
    assert_eq!(Ok(()), write_from(&writer, &server, first, 1, 1));
    assert!(region.view(0, LEN).expect("in range").matches(&[1; LEN]));
    for _ in 0..100 {
        server.rekey(&mut region).expect("rekeyed"); // warm-up: the key map's first nodes
    }
    let (heap, rss) = (live(), resident());
    let mut previous = region.remote();
    for _ in 0..CYCLES {
        let next = server.rekey(&mut region).expect("rekeyed");
        assert_ne!(previous.key, next.key);
        previous = next;
    }
    let heap_growth = live() - heap;
    let rss_growth = resident().saturating_sub(rss);
    println!(
        "{CYCLES} rekeys of a {LEN}-byte Remote buffer: heap {heap_growth:+} B, resident \
         +{rss_growth} B, parked {} B",
        server.parked_memory()
    );
    assert_eq!(0, server.parked_memory(), "nothing parked");
    assert!(heap_growth <= BOUND as isize, "heap {heap_growth:+} B");
    assert!(rss_growth <= BOUND, "resident +{rss_growth} B");

    // The first key, revoked 10,100 rekeys ago, admits nothing; the newest does.
    let stale = write_from(&writer, &server, first, 2, 2);
    assert!(stale.is_err(), "a write under a revoked key: {stale:?}");
    assert!(region.view(0, LEN).expect("in range").matches(&[1; LEN]));
    let fresh = rma_tcp();
    assert_eq!(Ok(()), write_from(&fresh, &server, region.remote(), 3, 3));
    assert!(region.view(0, LEN).expect("in range").matches(&[3; LEN]));
}

/// Register/drop cycles of a 4 KiB `Remote` buffer park exactly the buffers registered (the bound
/// the docs state: each is kept until the endpoint closes, since a transfer admitted before its
/// close may still land), and of a `Local` buffer nothing: the heap grows by what is parked plus
/// at most 4 MiB. Fails if a drop parks more than its buffer, frees a `Remote` one, or parks a
/// `Local` one.
#[test]
fn register_drop_cycles_park_exactly_the_remote_buffers() {
    let _serial = SERIAL.lock().unwrap_or_else(|poison| poison.into_inner());
    const REMOTE_CYCLES: usize = 1_000;
    let endpoint = rma_tcp();
    drop(
        endpoint
            .register_buffer(vec![0_u8; LEN], Exposure::Local)
            .expect("registered"),
    );
    let heap = live();
    for _ in 0..CYCLES {
        drop(
            endpoint
                .register_buffer(vec![0_u8; LEN], Exposure::Local)
                .expect("registered"),
        );
    }
    let local_growth = live() - heap;
    assert_eq!(0, endpoint.parked_memory());
    assert!(local_growth <= BOUND as isize, "Local: {local_growth:+} B");

    let heap = live();
    for _ in 0..REMOTE_CYCLES {
        drop(
            endpoint
                .register_buffer(vec![0_u8; LEN], Exposure::Remote)
                .expect("registered"),
        );
    }
    let remote_growth = live() - heap;
    println!(
        "{CYCLES} Local cycles: heap {local_growth:+} B; {REMOTE_CYCLES} Remote cycles: heap \
         {remote_growth:+} B, parked {} B",
        endpoint.parked_memory()
    );
    assert_eq!(REMOTE_CYCLES * LEN, endpoint.parked_memory(), "each buffer");
    let parked = endpoint.parked_memory() as isize;
    assert!(
        parked <= remote_growth && remote_growth <= parked + BOUND as isize,
        "Remote: {remote_growth:+} B for {parked} B parked"
    );
    drop(endpoint);
    assert!(live() - heap < BOUND as isize, "freed with the endpoint");
}
