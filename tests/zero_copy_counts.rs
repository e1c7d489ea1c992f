//! `parked_memory` against what the allocator really holds (issue 42, item 2): a binary of its
//! own, for its global allocator counts every thread's live bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dma_libfabric::{Exposure, StableBuffer};
use testkit::rma_tcp;

/// The system allocator, counting the bytes live now (Rust's allocations; libfabric's `malloc`s
/// are not Rust's and are not counted).
struct LiveBytes;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a static
// atomic, which never allocates.
unsafe impl GlobalAlloc for LiveBytes {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        pointer
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        pointer
    }
    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `pointer` came from `System` with this layout.
        unsafe { System.dealloc(pointer, layout) }
    }
    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `size` is the caller's.
        let moved = unsafe { System.realloc(pointer, layout, size) };
        if !moved.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(size, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static GLOBAL: LiveBytes = LiveBytes;

const HELD: usize = 256 << 20;
const LEN: usize = 16 << 10;
/// What a region's own bookkeeping may add on top of its buffer: far below the capacity.
const BOOKKEEPING: usize = 1 << 20;

/// A `Vec` of length 16 KiB and capacity 256 MiB, registered `Remote` and dropped, is parked:
/// `parked_memory` reports at least its 256 MiB, and no more than the allocator says the drop
/// left held (within the bookkeeping). Fails if parking counts the length (16,384 B, issue 42).
#[test]
fn a_parked_vec_counts_its_capacity() {
    let endpoint = rma_tcp();
    let mut pages = Vec::with_capacity(HELD);
    pages.resize(LEN, 7_u8);
    assert_eq!((LEN, HELD), (pages.len(), StableBuffer::capacity(&pages)));
    let before = LIVE.load(Ordering::Relaxed);
    let parked_before = endpoint.parked_memory();

    let region = endpoint
        .register_buffer(pages, Exposure::Remote)
        .expect("registered");
    assert_eq!(LEN, region.len(), "only the length is registered");
    drop(region);

    let parked = endpoint.parked_memory() - parked_before;
    // `pages` was counted in `before` already; what the drop left is its allocation, parked,
    // plus the region's bookkeeping.
    let held = LIVE.load(Ordering::Relaxed) + HELD - before;
    assert!(parked >= HELD, "parked {parked} B, the Vec holds {HELD} B");
    assert!(
        parked <= held && held - parked <= BOOKKEEPING,
        "parked {parked} B; the allocator holds {held} B for it"
    );
    drop(endpoint);
    assert!(
        LIVE.load(Ordering::Relaxed) + HELD <= before + BOOKKEEPING,
        "the endpoint's drop freed the parked Vec"
    );
}
