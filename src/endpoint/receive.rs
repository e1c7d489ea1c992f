//! Posted receive buffers.
//!
//! The endpoint keeps a fixed slab of buffers posted with `fi_recv`. Each buffer's operation
//! context is the slot itself, so a completion names the slot it filled. Between the completion
//! and the re-post, the one thread that read that completion owns the slot: the provider does not
//! touch a buffer it has completed and nobody else is handed its context. The slab lives as long
//! as the endpoint's libfabric objects (it is declared after them and so dropped after the
//! endpoint is closed), so the provider never writes into freed memory.
//!
//! A slot whose re-post failed is not lost: its index waits in the slab's list of unposted
//! slots, owned by nobody else, until a later `try_receive` or `progress` posts it again.

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// One receive buffer and the context libfabric may use while it is posted.
///
/// `repr(C)` with the context first, so the context pointer handed to `fi_recv` is also a pointer
/// to the slot.
#[repr(C)]
pub(super) struct ReceiveSlot {
    context: UnsafeCell<sys::fi_context2>,
    buffer: UnsafeCell<Box<[u8]>>,
}

/// The slab of receive slots.
pub(super) struct ReceiveSlots {
    slots: Box<[ReceiveSlot]>,
    /// Slots whose completion `progress` read while `receive_into`s were posted, with their
    /// length or error and their sender, owned by this list until `try_receive` takes them: at
    /// most one entry per slot, so bounded by the slab.
    arrived: Box<Arrived>,
    /// Boxed: touched only when a re-post fails, and an endpoint is moved around by value.
    unposted: Box<Unposted>,
    /// Held while the receive queue is read and what it gave is set aside or taken, so arrivals
    /// reach the application in the queue's order whichever threads read it.
    order: Box<Mutex<()>>,
}

/// A receive buffer's completion as it was read: the slot's index, its length or error, and the
/// sender the provider named (`None`: `FI_ADDR_NOTAVAIL`, see `senders`).
pub(super) type SlotArrival = (usize, Result<usize, DmaError>, Option<sys::fi_addr_t>);

/// Completed slots set aside for `try_receive`.
struct Arrived {
    slots: Mutex<std::collections::VecDeque<SlotArrival>>,
    /// `slots.len()`, readable without the lock.
    count: AtomicUsize,
}

/// Slots whose completion was read but whose re-post failed: not posted, owned by this list.
struct Unposted {
    slots: Mutex<Vec<usize>>,
    /// `slots.len()`, readable without the lock, so the common path never takes it.
    count: AtomicUsize,
}

impl ReceiveSlots {
    /// `count` slots of `size` zeroed bytes each, allocated fallibly.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] naming the sizes when the memory cannot be had (the
    /// allocator refused it, or it is more than an allocation may be); nothing stays allocated.
    pub(super) fn new(count: usize, size: usize) -> Result<Self, DmaError> {
        let too_much = || {
            DmaError::InvalidArgument(format!(
                "{count} receive buffers of {size} bytes cannot be allocated: lower \
                 Configuration::receive_buffers or Configuration::receive_size"
            ))
        };
        let mut slots = Vec::new();
        slots.try_reserve_exact(count).map_err(|_| too_much())?;
        for _ in 0..count {
            slots.push(ReceiveSlot {
                context: UnsafeCell::new(sys::fi_context2::default()),
                buffer: UnsafeCell::new(zeroed(size).ok_or_else(too_much)?),
            });
        }
        Ok(Self {
            slots: slots.into_boxed_slice(),
            arrived: Box::new(Arrived {
                slots: Mutex::new(std::collections::VecDeque::new()),
                count: AtomicUsize::new(0),
            }),
            unposted: Box::new(Unposted {
                slots: Mutex::new(Vec::new()),
                count: AtomicUsize::new(0),
            }),
            order: Box::new(Mutex::new(())),
        })
    }

    /// Keep slot `index`, whose re-post failed, for a later attempt. The caller owned it (it read
    /// its completion, or took it from this list) and hands it over.
    pub(super) fn defer_post(&self, index: usize) {
        let mut unposted = crate::sync::lock(&self.unposted.slots);
        unposted.push(index);
        self.unposted.count.store(unposted.len(), Ordering::Release);
    }

    /// Take every slot waiting for a re-post; the caller owns them until it posts or defers each.
    pub(super) fn take_unposted(&self) -> Vec<usize> {
        if 0 == self.unposted.count.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut unposted = crate::sync::lock(&self.unposted.slots);
        self.unposted.count.store(0, Ordering::Release);
        std::mem::take(&mut *unposted)
    }

    /// Keep the slot of `arrival`, whose completion the caller read, for the next
    /// [`take_arrived`](Self::take_arrived). The caller hands the slot over.
    pub(super) fn set_aside(&self, arrival: SlotArrival) {
        let mut arrived = crate::sync::lock(&self.arrived.slots);
        arrived.push_back(arrival);
        self.arrived.count.store(arrived.len(), Ordering::Release);
    }

    /// The oldest slot set aside, if any; the caller owns it.
    pub(super) fn take_arrived(&self) -> Option<SlotArrival> {
        if 0 == self.arrived.count.load(Ordering::Acquire) {
            return None;
        }
        let mut arrived = crate::sync::lock(&self.arrived.slots);
        let taken = arrived.pop_front();
        self.arrived.count.store(arrived.len(), Ordering::Release);
        taken
    }

    /// The order lock (see the field): held while reading the receive queue.
    pub(super) fn order(&self) -> std::sync::MutexGuard<'_, ()> {
        crate::sync::lock(&self.order)
    }

    /// How many slots wait for a re-post now.
    pub(super) fn unposted(&self) -> usize {
        self.unposted.count.load(Ordering::Acquire)
    }

    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The index of the slot whose context is `context`, if it is one of ours. Computed from
    /// addresses alone: nothing is dereferenced, so a foreign context is simply `None`.
    pub(super) fn index_of(&self, context: *mut std::ffi::c_void) -> Option<usize> {
        let start = self.slots.as_ptr() as usize;
        let offset = (context as usize).checked_sub(start)?;
        let size = std::mem::size_of::<ReceiveSlot>();
        let index = offset / size;
        (0 == offset % size && index < self.slots.len()).then_some(index)
    }

    pub(super) fn get(&self, index: usize) -> Option<&ReceiveSlot> {
        self.slots.get(index)
    }
}

impl ReceiveSlot {
    /// The context pointer to post this slot with.
    pub(super) fn context(&self) -> *mut std::ffi::c_void {
        self.context.get().cast()
    }

    /// The buffer and its length, for `fi_recv`.
    pub(super) fn buffer(&self) -> (*mut std::ffi::c_void, usize) {
        // SAFETY: only the pointer and length are read; the box itself is never replaced, so
        // reading it while the provider writes into the bytes it points at is fine.
        let buffer = unsafe { &mut *self.buffer.get() };
        (buffer.as_mut_ptr().cast(), buffer.len())
    }

    /// The first `len` received bytes; a truncation error (`-FI_ETRUNC`) when the completion
    /// reports more bytes than the buffer holds. A provider that reports a message's full length
    /// in a successful completion (udp;ofi_rxd was seen to deliver a cut message as a success)
    /// has truncated it: it is never cut short silently.
    ///
    /// # Safety
    /// The caller read this slot's completion and has not re-posted it, so the provider is done
    /// with the buffer and no other thread owns it.
    pub(super) unsafe fn received(&self, len: usize) -> Result<Vec<u8>, DmaError> {
        // SAFETY: as the caller promises, nothing writes to the buffer now.
        let buffer = unsafe { &*self.buffer.get() };
        match buffer.get(..len) {
            Some(bytes) => Ok(bytes.to_vec()),
            None => Err(DmaError::Fabric {
                call: "fi_cq_readfrom",
                code: -i64::from(sys::FI_ETRUNC),
                message: format!(
                    "{}: the provider reported a {len}-byte message, and the receive buffer \
                     holds {} (Configuration::receive_size)",
                    crate::error::strerror(sys::FI_ETRUNC.into()),
                    buffer.len()
                ),
            }),
        }
    }
}

/// `len` zeroed bytes on the heap, or `None` when the allocator cannot give them: zeroed by the
/// allocator (`calloc`'s fresh pages), not written here, so a large buffer costs no resident
/// memory until the provider fills it.
pub(super) fn zeroed(len: usize) -> Option<Box<[u8]>> {
    if 0 == len {
        return Some(Box::default());
    }
    let layout = Layout::array::<u8>(len).ok()?;
    // SAFETY: `layout` has a non-zero size (`len` > 0).
    let start = unsafe { std::alloc::alloc_zeroed(layout) };
    if start.is_null() {
        return None;
    }
    // SAFETY: `start` is a fresh allocation of the global allocator with the layout of `len`
    // bytes, all initialised (zero), owned by nothing else: exactly what `Box<[u8]>` of that
    // length frees with, so the box owns it.
    Some(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(start, len)) })
}

// SAFETY: a slot is shared between threads only through libfabric's completion hand-off, which
// gives it to exactly one thread at a time (see the module comment); the cells are never accessed
// by two threads at once.
unsafe impl Sync for ReceiveSlots {}
// SAFETY: the slab owns plain memory; moving it between threads moves nothing thread-bound.
unsafe impl Send for ReceiveSlots {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use super::*;

    /// Buffers no allocator can give (more than an allocation may be, more than any address
    /// space) are an error naming the sizes, not an abort.
    #[test]
    fn buffers_that_cannot_be_allocated_are_an_error() {
        for size in [usize::MAX, 1 << 63, 1 << 62] {
            match ReceiveSlots::new(2, size) {
                Err(DmaError::InvalidArgument(reason)) => {
                    assert!(reason.contains(&size.to_string()), "{reason}");
                }
                Err(other) => panic!("expected InvalidArgument, got {other}"),
                Ok(_) => panic!("{size} bytes allocated"),
            }
        }
        assert!(ReceiveSlots::new(usize::MAX, 1).is_err());
    }

    #[test]
    fn buffers_are_zeroed_and_of_the_size_asked() {
        let slots = ReceiveSlots::new(3, 100).expect("allocated");
        assert_eq!(3, slots.len());
        let slot = slots.get(2).expect("a slot");
        // SAFETY: never posted, and this thread owns the slab.
        assert_eq!(Ok(vec![0; 100]), unsafe { slot.received(100) });
        // SAFETY: as above.
        let truncated = unsafe { slot.received(101) };
        assert!(
            matches!(&truncated, Err(DmaError::Fabric { code, message, .. })
                if *code == -i64::from(sys::FI_ETRUNC) && message.contains("101-byte")),
            "{truncated:?}"
        );
        assert_eq!(100, slot.buffer().1);
        assert_eq!(
            0,
            ReceiveSlots::new(1, 0)
                .expect("empty")
                .get(0)
                .expect("a slot")
                .buffer()
                .1
        );
    }
}
