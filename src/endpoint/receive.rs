//! Posted receive buffers.
//!
//! The endpoint keeps a fixed slab of buffers posted with `fi_recv`. Each buffer's operation
//! context is the slot itself, so a completion names the slot it filled. Between the completion
//! and the re-post, the one thread that read that completion owns the slot: the provider does not
//! touch a buffer it has completed and nobody else is handed its context. The slab lives as long
//! as the endpoint's libfabric objects (it is declared after them and so dropped after the
//! endpoint is closed), so the provider never writes into freed memory.

use std::cell::UnsafeCell;

use crate::sys;

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
}

impl ReceiveSlots {
    pub(super) fn new(count: usize, size: usize) -> Self {
        let slots = (0..count)
            .map(|_| ReceiveSlot {
                context: UnsafeCell::new(sys::fi_context2::default()),
                buffer: UnsafeCell::new(vec![0; size].into_boxed_slice()),
            })
            .collect();
        Self { slots }
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

    /// The first `len` received bytes.
    ///
    /// # Safety
    /// The caller read this slot's completion and has not re-posted it, so the provider is done
    /// with the buffer and no other thread owns it.
    pub(super) unsafe fn received(&self, len: usize) -> Vec<u8> {
        // SAFETY: as the caller promises, nothing writes to the buffer now.
        let buffer = unsafe { &*self.buffer.get() };
        buffer[..len.min(buffer.len())].to_vec()
    }
}

// SAFETY: a slot is shared between threads only through libfabric's completion hand-off, which
// gives it to exactly one thread at a time (see the module comment); the cells are never accessed
// by two threads at once.
unsafe impl Sync for ReceiveSlots {}
// SAFETY: the slab owns plain memory; moving it between threads moves nothing thread-bound.
unsafe impl Send for ReceiveSlots {}
