//! The endpoint's parked memory: buffers of dropped regions, kept until the endpoint closes and
//! reused by later registrations of the same size class past a quarantine.
//!
//! Why memory is parked rather than freed, and what reuse risks, is on
//! [`MemoryRegion`](super::MemoryRegion) ("Parking", "Reuse, and what it risks"); the size
//! classes, the quarantine and the bound on parked memory on
//! [`PooledBuffer`](super::PooledBuffer), for a user to read. `capacity_for` draws the classes,
//! `Pool::take` applies the quarantine.

use std::alloc::{self, Layout};
use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::DmaError;

/// How many more buffers of a size class are parked after a dropped region's before its memory
/// is reused by [`register`](crate::endpoint::LibfabricEndpoint::register): a quarantine by
/// count, which narrows the window in which a peer's transfer admitted before the drop can reach
/// the new region (see [`MemoryRegion`](super::MemoryRegion), "Reuse, and what it risks"; the
/// bound it sets on parked memory is on [`PooledBuffer`](super::PooledBuffer)).
pub const REGION_REUSE_QUARANTINE: usize = 2;

/// The smallest buffer the pool allocates.
const MIN_CAPACITY: usize = 64;

/// The capacity of the size class of `len`: `len` rounded up to a quarter of its power of two
/// (at least [`MIN_CAPACITY`]), so at most 25% more; `None` on overflow.
fn capacity_for(len: usize) -> Option<usize> {
    if len <= MIN_CAPACITY {
        return Some(MIN_CAPACITY);
    }
    let top = usize::BITS - 1 - len.leading_zeros();
    let step = 1_usize << top.saturating_sub(2);
    len.checked_next_multiple_of(step)
}

/// Memory the pool owns: `capacity` bytes from `alloc::alloc_zeroed`, freed in `Drop`.
pub(super) struct Buffer {
    start: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a buffer is plain bytes owned by one holder at a time (a registration, or the pool).
unsafe impl Send for Buffer {}

impl Buffer {
    /// `capacity` fresh zeroed bytes, or an error when the system refuses them.
    fn allocate(capacity: usize) -> Result<Self, DmaError> {
        // Word alignment, no more: up to the allocator's own minimum, `std` answers
        // `alloc_zeroed` with `calloc`, whose large blocks are fresh mappings, zero and untouched
        // until used; a larger alignment would `memset` the whole capacity at once.
        let align = std::mem::align_of::<u64>();
        let refused = || {
            DmaError::InvalidArgument(format!(
                "could not allocate {capacity} bytes for a memory region (its size class): the \
                 system refused; register a shorter region, or free memory first"
            ))
        };
        let layout = Layout::from_size_align(capacity, align).map_err(|_| refused())?;
        // SAFETY: `layout` has a non-zero size (`capacity` is at least `MIN_CAPACITY`).
        let start = unsafe { alloc::alloc_zeroed(layout) };
        let start = NonNull::new(start).ok_or_else(refused)?;
        Ok(Self { start, layout })
    }

    /// The first byte.
    pub(super) fn start(&self) -> *mut u8 {
        self.start.as_ptr()
    }

    fn capacity(&self) -> usize {
        self.layout.size()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `start` came from `alloc_zeroed` with exactly `layout`, and is freed only here.
        unsafe { alloc::dealloc(self.start.as_ptr(), self.layout) };
    }
}

/// The endpoint's parked memory: buffers of dropped regions, by capacity, oldest first. Owned by
/// the endpoint's operations (declared after its handles), so the buffers are freed only after
/// the endpoint, its queues and its domain have closed. See [`MemoryRegion`](super::MemoryRegion),
/// "Parking".
#[derive(Default)]
pub(crate) struct Pool {
    classes: Mutex<BTreeMap<usize, VecDeque<Buffer>>>,
    /// Buffers the application handed in (`register_buffer`, `Exposure::Remote`), parked when
    /// their region dropped: never reused, dropped (their own `Drop` run) with the pool.
    owned: Mutex<Vec<Box<dyn Any + Send>>>,
    /// The bytes parked now: the capacities of every buffer in `classes` and in `owned`.
    parked: AtomicUsize,
}

impl Pool {
    /// Bytes parked now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::Acquire)
    }

    /// A buffer for a region of `len` bytes: a parked one of its class past the quarantine,
    /// with its first `len` bytes zeroed, else a fresh one.
    pub(super) fn take(&self, len: usize) -> Result<Buffer, DmaError> {
        let capacity = capacity_for(len).ok_or_else(|| {
            DmaError::InvalidArgument(format!(
                "a region of {len} bytes overflows its size class (rounded up past usize::MAX): \
                 register at most MAX_REGION_LEN bytes"
            ))
        })?;
        let reused = {
            let mut classes = crate::sync::lock(&self.classes);
            let reused = match classes.get_mut(&capacity) {
                Some(parked) if parked.len() > REGION_REUSE_QUARANTINE => parked.pop_front(),
                _ => None,
            };
            if reused.is_some() {
                // Under the lock, as `park`'s increment is, so the count never dips below 0.
                self.parked.fetch_sub(capacity, Ordering::AcqRel);
            }
            reused
        };
        let Some(buffer) = reused else {
            return Buffer::allocate(capacity);
        };
        // SAFETY: `len` is at most the buffer's capacity (its class's), which the pool owns and
        // no Rust reference points into; a stale transfer writing them meanwhile is the
        // provider's, outside Rust, and the zeroing is atomic (`shared_bytes`), so it only tears
        // them (`MemoryRegion`, "Contents").
        unsafe {
            let span = super::shared_bytes::Span {
                start: buffer.start.as_ptr(),
                len,
            };
            super::shared_bytes::zero(span, 0, len);
        };
        Ok(buffer)
    }

    /// Keep the application's `buffer`, which holds `held` bytes (its capacity, not only the
    /// registered length), until the endpoint closes.
    pub(super) fn park_owned(&self, buffer: Box<dyn Any + Send>, held: usize) {
        let mut owned = crate::sync::lock(&self.owned);
        owned.push(buffer);
        self.parked.fetch_add(held, Ordering::AcqRel);
    }

    /// Keep `buffer` until the endpoint closes, or until a later registration reuses it.
    pub(super) fn park(&self, buffer: Buffer) {
        let capacity = buffer.capacity();
        let mut classes = crate::sync::lock(&self.classes);
        classes.entry(capacity).or_default().push_back(buffer);
        self.parked.fetch_add(capacity, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(Some(64), capacity_for(1));
        assert_eq!(Some(64), capacity_for(64));
        assert_eq!(Some(80), capacity_for(65));
        assert_eq!(Some(4096), capacity_for(4096));
        assert_eq!(Some(5120), capacity_for(4097));
        assert_eq!(Some(8 << 20), capacity_for(8 << 20));
        assert_eq!(None, capacity_for(usize::MAX));
        for len in [65, 100, 1000, 4097, 12_345, 1 << 20, (1 << 20) + 1, 3 << 30] {
            let capacity = capacity_for(len).expect("no overflow");
            assert!(
                len <= capacity && capacity <= len + len / 4,
                "{len} -> {capacity}"
            );
        }
    }
}
