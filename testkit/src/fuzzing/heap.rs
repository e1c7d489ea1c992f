//! The heap bound the `cache_ops` target checks after every step of every input: a counting
//! global allocator, and the bound itself.
//!
//! A binary that wants the check installs [`Counting`] as its global allocator (the `cache_ops`
//! fuzz target and `tests/fuzz_corpus.rs` do); without it, [`Baseline::take`] answers `None` and
//! nothing is checked. The count is the whole process's, so a binary that runs inputs on several
//! threads at once must take turns (`tests/fuzz_corpus.rs` does).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use dma_libfabric::{AddressCache, ModelAv};

/// Bytes live on the heap, every thread's.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// The most [`LIVE`] has been since the last [`Baseline::take`].
static PEAK: AtomicIsize = AtomicIsize::new(0);
/// Whether [`Counting`] is the global allocator (it has allocated once).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes live, and their peak, and forwards every call to
/// the system allocator.
///
/// ```
/// #[global_allocator]
/// static HEAP: testkit::fuzzing::heap::Counting = testkit::fuzzing::heap::Counting;
///
/// fn main() {
///     let baseline = testkit::fuzzing::heap::Baseline::take(8).expect("installed");
///     let grown = vec![0_u8; 1 << 10];
///     assert_eq!(None, baseline.exceeded(), "1 KiB is within the bound");
///     drop(grown);
/// }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

fn grew(bytes: isize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are atomics,
// which neither allocate nor re-enter the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        grew(layout.size() as isize);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `pointer` came from `alloc` with this layout.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        INSTALLED.store(true, Ordering::Relaxed);
        grew(layout.size() as isize);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        grew(size as isize - layout.size() as isize);
        // SAFETY: `pointer` came from `alloc` with `layout`; `size` is the caller's.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

/// The cache's own heap bound for an AV of `capacity` entries, as the writer's module docs state
/// it: 384 B per entry and 64 B per inbox slot above the empty cache.
pub fn cache_bound(capacity: usize) -> isize {
    (capacity * 384 + AddressCache::<ModelAv>::INBOX_BOUND * 64) as isize
}

/// What the fuzz driver checks after every step: [`cache_bound`] plus 1 MiB for what is not the
/// cache's (this thread's epoch handle and reply channel, the harness's log and the model AV's
/// event list).
pub fn bound(capacity: usize) -> isize {
    cache_bound(capacity) + (1 << 20)
}

/// Bytes live on the heap now, every thread's (0 unless [`Counting`] is the global allocator).
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The heap as an input starts, once its cache is built.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    empty: isize,
    bound: isize,
}

impl Baseline {
    /// The heap now, with the bound for a cache of `capacity` entries; `None` unless
    /// [`Counting`] is the global allocator. The peak starts again from here.
    pub fn take(capacity: usize) -> Option<Self> {
        if !INSTALLED.load(Ordering::Relaxed) {
            return None;
        }
        let empty = LIVE.load(Ordering::Relaxed);
        PEAK.store(empty, Ordering::Relaxed);
        Some(Self {
            empty,
            bound: bound(capacity),
        })
    }

    /// How many bytes the heap has grown above the baseline at most, if that is more than the
    /// bound.
    pub fn exceeded(&self) -> Option<isize> {
        let grown = self.peak();
        (grown > self.bound).then_some(grown)
    }

    /// The most the heap has grown above the baseline since it was taken.
    pub fn peak(&self) -> isize {
        PEAK.load(Ordering::Relaxed) - self.empty
    }

    /// How far the heap is above the baseline now.
    pub fn now(&self) -> isize {
        live() - self.empty
    }

    /// The bound, in bytes above the baseline.
    pub fn bound(&self) -> isize {
        self.bound
    }
}
