//! Memory: bytes per live entry at 100,000 entries, counted by a counting global allocator (what
//! Rust allocates; libfabric's own table is C heap and not counted, for ours or the baselines).
//! Ours is the whole cache: the index pre-sized to the AV's capacity of 100,000, the writer's
//! state, its thread and channels. The baselines hold the same keys.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};

use common::{Keys, Kind, Reference, tcp_endpoint};
use dma_libfabric::{AddressCache, FabricAv};

/// Counts live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counter is a side
// effect only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: `ptr` came from `alloc` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const N: usize = 100_000;

fn per_entry(name: &str, bytes: isize) -> f64 {
    let value = bytes as f64 / N as f64;
    common::record("memory", name, value);
    value
}

fn main() {
    common::reset("memory");
    let kind = Kind::Tcp;
    let keys = Keys::new(kind, N);

    // Ours: a cache over a real tcp AV opened for exactly N entries.
    let host = tcp_endpoint(N);
    let before = live();
    {
        // SAFETY: `host`'s AV is open, FI_THREAD_SAFE, 16-byte addresses, and outlives the cache
        // (dropped at the end of this block); its own cache is never used.
        let av = unsafe {
            FabricAv::from_raw(host.address_vector(), host.describe().addr_format, 16, N)
        };
        let cache = AddressCache::with_backend(av);
        let empty = live();
        common::warm(&cache, &keys);
        cache.quiesce();
        let full = live();
        per_entry("ours_presized_empty", empty - before);
        per_entry("ours_added_by_entries", full - empty);
        per_entry("ours", full - before);
        for client in 0..N as u64 {
            cache.release(client);
        }
        cache.quiesce();
        assert_eq!(0, cache.stats().entries);
        per_entry("ours_after_release", live() - before);
    }

    let before = live();
    let plain = common::plain(&keys);
    per_entry("hashmap", live() - before);
    drop(plain);

    let before = live();
    let reference = Mutex::new(Reference::warmed(kind, &keys));
    per_entry("mutex_reference", live() - before);
    drop(reference);

    let before = live();
    let dashmap = common::dashmap(&keys);
    per_entry("dashmap", live() - before);
    drop(dashmap);
}
