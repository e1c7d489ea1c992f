//! Zero copy: the application's own memory, registered in place.
//!
//! [`LibfabricEndpoint::register_buffer`] takes a buffer the application owns (a
//! [`StableBuffer`]: a `Vec<u8>`, a `Box<[u8]>`, a `memmap2::MmapMut` with the `memmap2`
//! feature, or the application's own hugepage or device allocation), and registers *its* bytes
//! with `fi_mr_reg` (`fi_mr_regattr` for device memory): the address the provider gets is the
//! buffer's, and nothing is copied.
//!
//! Who may touch the bytes and when, why that is sound, and the bounds are on [`StableBuffer`],
//! where a user reads them. The access word that counts a `Local` region's slices and operations
//! is `access.rs`'s; `register_buffer` itself is `memory/face.rs`'s, with the endpoint's other
//! memory methods.

use std::ops::Deref;
use std::sync::Arc;

#[cfg(doc)] // for the docs' links
use super::LibfabricEndpoint;
use super::memory::MemoryRegion;
use super::memory::registration::{Exposure, MemoryInterface, Registration};
use crate::error::DmaError;

/// A buffer whose bytes stay at one address, with one length, for as long as it is owned: what
/// [`LibfabricEndpoint::register_buffer`] registers in place.
///
/// [`register_buffer`](LibfabricEndpoint::register_buffer) registers *its* bytes with `fi_mr_reg`
/// (`fi_mr_regattr` for device memory): the address the provider gets is the buffer's, and
/// nothing is copied. The region owns the buffer from then on, and the types say who may touch
/// its bytes, and when:
///
/// | | [`Exposure::Local`] | [`Exposure::Remote`] |
/// |---|---|---|
/// | access flags | `FI_READ`, `FI_WRITE` (not `FI_SEND`/`FI_RECV`: rxm's rendezvous turns them into remote access) | those and `FI_REMOTE_READ`, `FI_REMOTE_WRITE` |
/// | [`remote`](MemoryRegion::remote)'s key | none (`FI_KEY_NOTAVAIL`, `u64::MAX`) | the registration's |
/// | a peer's transfer under its key | refused by the provider | admitted |
/// | [`as_slice`](MemoryRegion::as_slice), [`as_mut_slice`](MemoryRegion::as_mut_slice) | when no operation holds it and no post waits for it, else [`DmaError::Busy`] | refused: copies only, or the `unsafe` [`as_slice_unchecked`](MemoryRegion::as_slice_unchecked) |
/// | [`read_bytes`](MemoryRegion::read_bytes) | copies when no operation holds it, else [`DmaError::Busy`]; never torn | copies with atomic byte loads at any time; torn if a transfer lands meanwhile |
/// | [`write_bytes`](MemoryRegion::write_bytes) | refused (write through `as_mut_slice`) | copies (atomic byte stores) |
/// | reading in place | `as_slice` | [`view`](MemoryRegion::view): atomic loads where the bytes lie, never a `&[u8]` |
/// | the buffer back | [`into_buffer`](MemoryRegion::into_buffer) once no operation holds it | parked on drop until the endpoint closes; `unsafe` [`reclaim`](MemoryRegion::reclaim); kept, its key renewed, by [`rekey`](LibfabricEndpoint::rekey) |
///
/// Device memory ([`MemoryInterface`] other than host) lends no slices and takes no copies.
///
/// # Why it is sound
///
/// - **A `Local` region's bytes are touched by this endpoint's operations only.** No peer can
///   reach them (the provider checks the access flags when a transfer arrives: `-FI_EACCES`),
///   and every operation holds the memory (`OperationHold`) until its completion has been read.
///   The region counts its slices lent and its operations held in one atomic word: a slice is
///   lent only while no operation holds the memory, and an operation is posted only while no
///   slice is lent; of two that start at once, the later sees the earlier and backs out: a slice
///   answers [`DmaError::Busy`], a post waits for the slices within its patience (refusing new
///   ones meanwhile) and answers `Busy` only if one outlives it. A `&mut` slice borrows the region mutably, so no
///   [`segment`](MemoryRegion::segment) (and so no operation) can be taken while it lives, and
///   the borrow checker refuses the program that tries:
///
///   ```compile_fail,E0502
///   # use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
///   # let configuration = Configuration { rma: true, ..Configuration::default() };
///   # let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
///   let mut region = endpoint.register_buffer(vec![0_u8; 64], Exposure::Local).unwrap();
///   let bytes = region.as_mut_slice().unwrap();
///   let destination = region.segment(0, 8).unwrap(); // a read into memory borrowed mutably
///   bytes[0] = 1;
///   # drop(destination);
///   ```
///
///   A shared slice ([`RegionSlice`]) is counted while it lives, so a read posted into the
///   region meanwhile waits for it (within its patience, then `Busy`) rather than write under
///   it.
/// - **The buffer comes back only when nothing can touch it.**
///   [`into_buffer`](MemoryRegion::into_buffer) consumes the region, so no segment of it can be
///   alive, and succeeds only when it is the registration's last holder (no operation, no rail's
///   registration of it), after closing the registration. Nor can a slice outlive it:
///
///   ```compile_fail,E0505
///   # use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
///   # let configuration = Configuration { rma: true, ..Configuration::default() };
///   # let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
///   let region = endpoint.register_buffer(vec![0_u8; 64], Exposure::Local).unwrap();
///   let bytes = region.as_slice().unwrap();
///   let vec = region.into_buffer().unwrap(); // the region moves while its slice is lent
///   assert_eq!(0, bytes[0]);
///   ```
///
///   A `Remote` region's buffer is parked on drop, in the endpoint's pool, and dropped (its own
///   `Drop` run) only when the endpoint drops, after its domain has closed: a peer's transfer
///   admitted before the drop may still be moving bytes (see [`MemoryRegion`], "Parking").
/// - **The buffer cannot move or be freed under the registration:** it is owned by the region,
///   in a box of its own, and `StableBuffer`'s contract says its bytes stay where they are while
///   it is owned. `'static` keeps borrowed memory out (a stack array, a `&mut [u8]`):
///
///   ```compile_fail,E0277
///   # use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
///   # let configuration = Configuration { rma: true, ..Configuration::default() };
///   # let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).unwrap();
///   let mut local = [0_u8; 64];
///   let region = endpoint.register_buffer(&mut local[..], Exposure::Local); // not 'static
///   ```
///
/// # File mappings
///
/// A `memmap2::MmapMut` of a file (the `memmap2` feature) registers the file's page-cache pages
/// in place. Touching a page of a shared file mapping that lies wholly past the file's end raises
/// `SIGBUS`, which kills the process: so
/// [`register_buffer`](LibfabricEndpoint::register_buffer) refuses a mapping any of whose bytes
/// lie past its file's end at registration (read from `/proc/self/maps` and the file's length;
/// anonymous and hugepage mappings have no file and are not checked). It cannot watch the file
/// afterwards. The application must guarantee that **nothing truncates the file** (no process:
/// `ftruncate`, `set_len`, `O_TRUNC`, a replacing write by another program) while the region is
/// registered and, for an [`Exposure::Remote`] region, until the endpoint drops (its buffer is
/// parked, and a peer's transfer admitted earlier may still reach it: see [`MemoryRegion`],
/// "Parking"). Otherwise a peer's RMA write or read landing past the new end, this endpoint's own
/// operation, or a [`read_bytes`](MemoryRegion::read_bytes) of those bytes, touches a page with
/// no file behind it: `SIGBUS` in whichever thread of this process copies (the thread driving
/// the provider's progress, for a peer's transfer), or a failed transfer where the kernel copies.
/// Ways to keep the promise: a file only this process can open for writing, or a `memfd` sealed
/// against shrinking (`F_SEAL_SHRINK`). Your own [`StableBuffer`] over a file mapping is not
/// checked: check its length yourself before registering.
///
/// # Bounds
///
/// A region holds one buffer; a parked `Remote` buffer is counted in
/// [`parked_memory`](LibfabricEndpoint::parked_memory), at its [`capacity`](Self::capacity),
/// until the endpoint drops (never reused:
/// it is the application's), so parked memory is bounded by the `Remote` buffers registered over
/// the endpoint's life. A region is 1 to [`MAX_REGION_LEN`](super::memory::MAX_REGION_LEN) bytes.
///
/// # Safety
/// An implementation promises that, from the first call to [`as_mut_ptr`](Self::as_mut_ptr) until
/// the value is dropped, and as long as no method of the buffer's own is called on it (the region
/// calls none but these three, and the value's `Drop`):
/// - `as_mut_ptr` returns the same pointer every time, to [`len`](Self::len) bytes (the same
///   length every time) that this value owns alone, valid for reads and writes by this process
///   (host memory) or by the device of [`interface`](Self::interface), and by the provider;
/// - moving the value does not move those bytes (they are on the heap, a mapping, or a device);
/// - they stay valid until the value is dropped (its `Drop` may free them).
///
/// ```
/// use dma_libfabric::{MemoryInterface, StableBuffer};
///
/// /// A page-aligned allocation, as a hugepage pool would hand out.
/// struct Pages { start: std::ptr::NonNull<u8>, layout: std::alloc::Layout }
///
/// // SAFETY: the pages are this value's alone, allocated in `new`, freed only in `Drop`.
/// unsafe impl Send for Pages {}
/// // SAFETY: as `Send` says; the pointer and length never change, and moving `Pages` moves
/// // only the pointer.
/// unsafe impl StableBuffer for Pages {
///     fn as_mut_ptr(&mut self) -> *mut u8 { self.start.as_ptr() }
///     fn len(&self) -> usize { self.layout.size() }
/// }
/// impl Drop for Pages {
///     fn drop(&mut self) {
///         // SAFETY: allocated with this layout, freed once.
///         unsafe { std::alloc::dealloc(self.start.as_ptr(), self.layout) }
///     }
/// }
///
/// let layout = std::alloc::Layout::from_size_align(1 << 16, 4096).unwrap();
/// // SAFETY: a non-zero size.
/// let start = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) }).unwrap();
/// let mut pages = Pages { start, layout };
/// assert_eq!(0, pages.as_mut_ptr() as usize % 4096);
/// assert_eq!(MemoryInterface::Host, pages.interface());
/// ```
pub unsafe trait StableBuffer: Send + 'static {
    /// The first byte.
    fn as_mut_ptr(&mut self) -> *mut u8;

    /// How many bytes from [`as_mut_ptr`](Self::as_mut_ptr) are registered.
    fn len(&self) -> usize;

    /// Whether [`len`](Self::len) is 0 (such a buffer cannot be registered).
    fn is_empty(&self) -> bool {
        0 == self.len()
    }

    /// Where the bytes live: host memory unless said otherwise.
    fn interface(&self) -> MemoryInterface {
        MemoryInterface::Host
    }

    /// How many bytes the buffer holds, registered or not: what
    /// [`parked_memory`](LibfabricEndpoint::parked_memory) counts while a dropped
    /// [`Exposure::Remote`] region parks it. [`len`](Self::len) unless said otherwise; a `Vec`'s
    /// capacity (a `Vec` of length 16 KiB and capacity 256 MiB holds 256 MiB). A value below
    /// `len` counts as `len`.
    fn capacity(&self) -> usize {
        self.len()
    }
}

// SAFETY: a `Vec`'s bytes are on the heap, owned by it alone; they move only when the `Vec`
// grows or shrinks, through its own methods, which the region never calls.
unsafe impl StableBuffer for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
}

// SAFETY: a boxed slice's bytes are on the heap, owned by it alone, and never move.
unsafe impl StableBuffer for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }

    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

#[cfg(feature = "memmap2")]
// SAFETY: a mapping's bytes stay at their address until it is unmapped, in its `Drop`; the
// region never calls its methods that remap (there are none on `MmapMut` but `Drop`). A shared
// file mapping may also be written by other processes: the bytes stay valid all the same. A
// file truncated under the mapping leaves its pages past the new end unbacked (`SIGBUS` when
// touched): `register_buffer` refuses a mapping past its file's end, and the application keeps
// the file whole afterwards (`StableBuffer`'s docs, "File mappings").
unsafe impl StableBuffer for memmap2::MmapMut {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }

    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A shared slice of a [`Exposure::Local`] region's bytes, from
/// [`MemoryRegion::as_slice`]. While it lives, no operation can be posted on the region: a post
/// waits for it within its patience, refusing new slices meanwhile, and answers
/// [`DmaError::Busy`] if it is still lent then.
pub struct RegionSlice<'region> {
    bytes: &'region [u8],
    registration: &'region Registration,
}

impl Deref for RegionSlice<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for RegionSlice<'_> {
    fn drop(&mut self) {
        self.registration.return_slice();
    }
}

impl std::fmt::Debug for RegionSlice<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RegionSlice")
            .field("len", &self.bytes.len())
            .finish_non_exhaustive()
    }
}

impl<B> MemoryRegion<'_, B> {
    /// The region's bytes, shared: for a [`Exposure::Local`] region of host memory. While the
    /// returned slice lives, no operation is posted on the region: a post waits for it (and for
    /// every other slice and copy lent) within its patience, and answers [`DmaError::Busy`] if
    /// it is still lent then. Drop slices before posting from the thread that holds them: a post
    /// there waits its whole patience for its own slice.
    ///
    /// # Errors
    /// [`DmaError::Busy`], at once, while an operation of this endpoint holds the region
    /// (posted, its completion not yet read) or a post waits for the slices and copies lent to
    /// be returned (fairness: borrowers that arrive after a waiting poster never keep it out); [`DmaError::InvalidArgument`] for a `Remote` region (a peer may
    /// write it at any moment: copy with [`read_bytes`](Self::read_bytes), or see
    /// [`as_slice_unchecked`](Self::as_slice_unchecked)) and for device memory.
    pub fn as_slice(&self) -> Result<RegionSlice<'_>, DmaError> {
        self.check_lends_slices()?;
        self.inner.lend_slice()?;
        // SAFETY: the region is `Local` host memory (checked): no peer reaches it, no operation
        // holds it (`lend_slice`, whose Acquire makes every completed operation's bytes
        // visible), none can start while the slice is lent (it counts), and nothing else writes
        // it (`write_bytes` is refused on lending regions; `as_mut_slice` needs `&mut self`).
        // The `len` bytes live as long as `self`.
        let bytes = unsafe { std::slice::from_raw_parts(self.inner.at(0), self.inner.len()) };
        Ok(RegionSlice {
            bytes,
            registration: &self.inner,
        })
    }

    /// The region's bytes, to write in place: for a [`Exposure::Local`] region of host memory.
    /// While the slice lives the region is borrowed mutably, so no segment of it can be taken,
    /// and nothing posted on it.
    ///
    /// # Errors
    /// As [`as_slice`](Self::as_slice).
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], DmaError> {
        self.check_lends_slices()?;
        if self.inner.operations_hold() {
            return Err(DmaError::Busy);
        }
        // SAFETY: as in `as_slice`; `&mut self` excludes every slice and segment of this region
        // (each borrows it), so no operation can start while the slice lives, and none holds it
        // now (checked with Acquire).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.inner.at(0), self.inner.len()) })
    }

    /// Slices are lent by `Local` host memory only.
    fn check_lends_slices(&self) -> Result<(), DmaError> {
        if !self.interface().is_host() {
            return Err(DmaError::InvalidArgument(format!(
                "a slice was asked of device memory ({:?}), which host code cannot read: it has \
                 no slices; move its bytes with an RMA operation or the device's own copy",
                self.interface()
            )));
        }
        match self.exposure() {
            Exposure::Local if self.inner.lends_slices() => Ok(()),
            _ => Err(DmaError::InvalidArgument(
                "a slice was asked of a Remote region, which a peer may write at any moment: \
                 copy with read_bytes or write_bytes (or, where the application's protocol has \
                 stopped every peer, as_slice_unchecked), or register it Exposure::Local"
                    .into(),
            )),
        }
    }

    /// The bytes of a host-memory region of any exposure, shared, with no check of who may be
    /// writing them.
    ///
    /// # Safety
    /// While the slice lives, nothing writes the region's bytes: the application's own protocol
    /// has stopped every peer that was given its key (they have said they are done, and will
    /// not write again), and no operation of this endpoint that writes them (a read into the
    /// region) is in flight or posted.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for device memory.
    pub unsafe fn as_slice_unchecked(&self) -> Result<&[u8], DmaError> {
        self.check_host()?;
        // SAFETY: host memory (checked) that lives as long as `self`; nothing writes it while
        // the slice lives (the caller's promise).
        Ok(unsafe { std::slice::from_raw_parts(self.inner.at(0), self.inner.len()) })
    }

    /// The bytes of a host-memory region of any exposure, to write in place, with no check of
    /// who may be touching them.
    ///
    /// # Safety
    /// While the slice lives, nothing else reads or writes the region's bytes: the application's
    /// own protocol has stopped every peer that was given its key, and no operation of this
    /// endpoint on it is in flight (`&mut self` keeps new ones out).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for device memory.
    pub unsafe fn as_mut_slice_unchecked(&mut self) -> Result<&mut [u8], DmaError> {
        self.check_host()?;
        // SAFETY: as in `as_slice_unchecked`, exclusively (the caller's promise and `&mut`).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.inner.at(0), self.inner.len()) })
    }

    fn check_host(&self) -> Result<(), DmaError> {
        if self.interface().is_host() {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "a slice was asked of device memory ({:?}), which host code cannot read: it has \
                 no slices; move its bytes with an RMA operation or the device's own copy",
                self.interface()
            )))
        }
    }
}

impl<'ep, B: StableBuffer> MemoryRegion<'ep, B> {
    /// The buffer back, registration closed: for a [`Exposure::Local`] region that no operation
    /// holds (every completion read), and no rail's registration shares.
    ///
    /// # Errors
    /// The region itself, unchanged, with [`DmaError::Busy`] while an operation (or another
    /// rail's registration) holds it, or [`DmaError::InvalidArgument`] for a `Remote` region
    /// (parked on drop; see [`reclaim`](Self::reclaim)).
    #[allow(clippy::result_large_err)] // the region comes back with the error
    pub fn into_buffer(self) -> Result<B, (Self, DmaError)> {
        if Exposure::Local != self.exposure() {
            return Err((
                self,
                DmaError::InvalidArgument(
                    "a Remote region's buffer may still be reached by a peer: it is parked on \
                     drop (see MemoryRegion::reclaim)"
                        .into(),
                ),
            ));
        }
        self.take_buffer()
    }

    /// The buffer back, registration closed, whatever its exposure: for an application whose
    /// protocol proves that every peer is done with the region.
    ///
    /// # Safety
    /// No peer's transfer under the region's key is in progress or will start: each peer given
    /// [`remote`](Self::remote) has said (on its own messages) that it is done, after its last
    /// transfer completed. (Closing the registration refuses new transfers; one a software
    /// provider admitted earlier may still move bytes: see
    /// [`parked_memory`](LibfabricEndpoint::parked_memory).)
    ///
    /// # Errors
    /// As [`into_buffer`](Self::into_buffer), without the `Remote` refusal.
    #[allow(clippy::result_large_err)] // the region comes back with the error
    pub unsafe fn reclaim(self) -> Result<B, (Self, DmaError)> {
        self.take_buffer()
    }

    #[allow(clippy::result_large_err)]
    fn take_buffer(self) -> Result<B, (Self, DmaError)> {
        let (inner, owner) = self.into_parts();
        let registration = match Arc::try_unwrap(inner) {
            Ok(registration) => registration,
            Err(inner) => return Err((Self::from_parts(inner, owner), DmaError::Busy)),
        };
        match registration.into_owned::<B>() {
            Ok(buffer) => Ok(buffer),
            Err(registration) => Err((
                Self::from_parts(Arc::new(registration), owner),
                DmaError::InvalidArgument(format!(
                    "the buffer was asked back as a {}, which is not the type the region holds \
                     (a rail set's region, or one retyped): ask for the type that was registered",
                    std::any::type_name::<B>()
                )),
            )),
        }
    }
}
