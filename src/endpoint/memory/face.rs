//! The endpoint's memory face: every public method of [`LibfabricEndpoint`] about registered
//! memory, in one place. [`register`](LibfabricEndpoint::register) and
//! [`register_shared`](LibfabricEndpoint::register_shared) the endpoint's own pooled memory,
//! [`register_buffer`](LibfabricEndpoint::register_buffer) the application's buffer in place,
//! [`rekey`](LibfabricEndpoint::rekey) a `Remote` region's key renewed on its own buffer, and
//! [`parked_memory`](LibfabricEndpoint::parked_memory) what dropped regions left parked.
//!
//! Each method checks what only the endpoint knows (that it was opened for RMA, the provider's
//! capabilities and `mr_mode`) and hands its own open domain, endpoint, pool and keys to the
//! memory types, which do the rest; nothing here touches a registration's memory. This is the one
//! file of the memory rooms that sees both the memory types and [`StableBuffer`] (`buffer.rs`).

use std::sync::Arc;

use super::registration::{Exposure, Registration};
#[cfg(doc)] // for the docs' links
use super::{MAX_REGION_LEN, PooledBuffer, REGION_KEY_ATTEMPTS};
use super::{MemoryRegion, RemoteRegion};
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::buffer::StableBuffer;
use crate::error::DmaError;

impl LibfabricEndpoint {
    /// Register `len` bytes of fresh zeroed memory for RMA, honouring the provider's
    /// memory-registration mode (see [`MemoryRegion`]). Where the provider does not choose keys,
    /// the key is a fresh random 64-bit number (below). The memory comes from the endpoint's
    /// parked memory when a buffer of its size class is past its quarantine (see
    /// [`PooledBuffer`]), else from the allocator.
    ///
    /// # Keys
    ///
    /// Where the endpoint chooses the key (no `FI_MR_PROV_KEY`), each registration requests a fresh
    /// random 64-bit key (retrying `-FI_ENOKEY`, a key already in use, up to
    /// [`REGION_KEY_ATTEMPTS`] times): one endpoint's descriptor is not valid at another whose
    /// regions have the same shape, and a peer cannot guess a key it was not given. The source is
    /// one `std` `RandomState` per endpoint hashing a counter: a SipHash under a 128-bit key that
    /// `std` draws from the operating system's random source (`getrandom(2)`, once per thread, then
    /// stepped for each new `RandomState`). No new dependency, no file descriptor, no failure path,
    /// a few nanoseconds per key, and the outputs are unpredictable to anyone who does not hold
    /// that key, which never leaves the process. It is a keyed hash (SipHash-1-3 today), not a
    /// CSPRNG: the defence it gives is against guessing, which is what a key is for here. (Reading
    /// `/dev/urandom` per key would cost a file descriptor or three system calls per registration,
    /// and can fail; `getrandom(2)` through `libc` would be a new dependency.)
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the endpoint was opened without
    /// [`Configuration::rma`](crate::configuration::Configuration::rma), for `len` 0 or above
    /// [`MAX_REGION_LEN`] (naming both), when the
    /// system cannot allocate `len` bytes, or for a provider that asks for `FI_MR_RAW`;
    /// [`DmaError::Fabric`] when `fi_mr_reg` (after
    /// [`REGION_KEY_ATTEMPTS`] keys already in use),
    /// `fi_mr_bind` or `fi_mr_enable` fails. Nothing is left registered on an error.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let Err(DmaError::InvalidArgument(reason)) = endpoint.register(1 << 44) else {
    ///     panic!("16 TiB is above the bound");
    /// };
    /// assert!(reason.contains("17592186044416"), "{reason}");
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn register(&self, len: usize) -> Result<MemoryRegion<'_>, DmaError> {
        self.check_rma()?;
        // SAFETY: the domain and the endpoint are open, and stay open until every registration
        // is dropped: a `MemoryRegion` borrows this endpoint (or holds an `Arc` of it), and the
        // clones held by operations are dropped by `Drop` before the handles close. The pool is
        // the slab's, which is dropped after the handles close.
        let registration = unsafe {
            Registration::new(
                self.handles.domain,
                self.handles.ep,
                self.mr_mode(),
                len,
                &self.operations.pool,
                &mut || self.operations.keys.draw(),
            )
        }?;
        Ok(MemoryRegion::new(registration))
    }

    /// `primary`'s memory (a region of another endpoint) registered in this endpoint's domain
    /// too: for a rail set, whose region is one buffer registered on every rail. The new region
    /// holds `primary`'s registration, so the memory lives until both are dropped (and is parked
    /// by `primary`'s endpoint).
    ///
    /// # Safety
    /// `primary`'s endpoint outlives this one: its pool frees the memory only once it has closed,
    /// and a peer's transfer admitted under the new registration may reach the memory until this
    /// endpoint's domain closes.
    pub(crate) unsafe fn register_alias(
        &self,
        primary: &MemoryRegion<'_>,
    ) -> Result<MemoryRegion<'_>, DmaError> {
        self.check_rma()?;
        // SAFETY: this endpoint's domain and endpoint are open and stay open until every
        // registration of theirs is dropped (as in `register`); `primary`'s endpoint outlives
        // this one (the caller's promise).
        let registration = unsafe {
            Registration::alias(
                &primary.inner,
                self.handles.domain,
                self.handles.ep,
                self.mr_mode(),
                &self.operations.pool,
                &mut || self.operations.keys.draw(),
            )
        }?;
        Ok(MemoryRegion::new(registration))
    }

    /// How many bytes of dropped regions' memory the endpoint holds now, counted as allocated
    /// (a pooled buffer's size class; an application's buffer's
    /// [`StableBuffer::capacity`](StableBuffer::capacity), so a `Vec`'s capacity,
    /// not its length): memory a peer's
    /// transfer admitted before the drop may still reach, so it is freed only when the endpoint
    /// drops, and reused meanwhile by later registrations of the same size class (see
    /// [`MemoryRegion`], "Parking"). Bounded by the peak of registered memory, plus the
    /// quarantine of each size class ([`PooledBuffer`]).
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// assert_eq!(0, endpoint.parked_memory());
    /// drop(endpoint.register(1 << 20)?);
    /// assert_eq!(1 << 20, endpoint.parked_memory(), "parked, not freed");
    /// for _ in 0..100 {
    ///     drop(endpoint.register(1 << 20)?); // reuses parked memory past the quarantine
    /// }
    /// assert!(endpoint.parked_memory() <= 4 << 20, "{}", endpoint.parked_memory());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn parked_memory(&self) -> usize {
        self.operations.pool.parked()
    }

    /// [`register`](Self::register) for an endpoint shared through an `Arc`: the region keeps
    /// the endpoint alive rather than borrowing it, so it can be stored beside it (a client that
    /// advertises its memory for as long as it lives).
    ///
    /// # Errors
    /// As `register`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, MemoryRegion};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = Arc::new(LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?);
    /// let region: MemoryRegion<'static> = endpoint.register_shared(64)?;
    /// drop(endpoint); // the region still holds it
    /// assert_eq!(64, region.len());
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register_shared(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<MemoryRegion<'static>, DmaError> {
        Ok(self.register(len)?.owned_by(Arc::clone(self)))
    }

    /// Revoke `region`'s key and register its memory again under a fresh one, keeping the
    /// buffer: the new [`RemoteRegion`] to advertise. For an [`Exposure::Remote`] region of this
    /// endpoint that no operation holds.
    ///
    /// # What it promises
    ///
    /// - **Nothing is parked, nothing is allocated**: the buffer stays the region's. A server
    ///   that hands a region to a peer per round and rekeys it between rounds stays flat
    ///   (10,000 rounds of a 4 KiB buffer: `parked_memory` 0, the heap +0 B,
    ///   `tests/parking_bounded.rs`), where dropping each region and registering a new buffer
    ///   parks every old one until the endpoint closes (4 KiB a round; see [`MemoryRegion`],
    ///   "Parking", for why that cannot be freed sooner).
    /// - **The old key admits no new transfer**: once `rekey` returns, a peer's write or read
    ///   under it is refused by the provider (on tcp the target also drops that connection, so
    ///   the peer's write completes with an error, and its later posts may find it gone). A
    ///   transfer the provider admitted *before* (its header arrived under the old key) may
    ///   still move bytes into or out of the buffer: the region gives safe code only atomic accesses ([`read_bytes`](
    ///   MemoryRegion::read_bytes), [`view`](MemoryRegion::view)), so that is a torn record, never
    ///   undefined behaviour. A peer whose write's notification (or whose own "done" message) has
    ///   been read has no such transfer.
    /// - **The new key is fresh** (random, as [`register`](Self::register)'s), so a peer that
    ///   kept the old descriptor cannot reach the region under the new one.
    ///
    /// # Errors
    /// [`DmaError::Busy`] while an operation of this endpoint holds the region (try again once
    /// its completion has been read) or a rail set's registration shares it;
    /// [`DmaError::InvalidArgument`] for an [`Exposure::Local`] region (it has no key) or a region
    /// of another endpoint; [`DmaError::Fabric`] when `fi_mr_reg` (or `fi_mr_bind`,
    /// `fi_mr_enable`) fails: the region is then unchanged, under its old key.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let mut region = endpoint.register_buffer(vec![0_u8; 4096], Exposure::Remote)?;
    /// let first = region.remote(); // advertised to a peer for one round
    /// let second = endpoint.rekey(&mut region)?; // the round is over: `first` is revoked
    /// assert_ne!(first.key, second.key);
    /// assert_eq!(second, region.remote());
    /// assert_eq!(0, endpoint.parked_memory(), "the buffer stayed the region's");
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn rekey<B>(&self, region: &mut MemoryRegion<'_, B>) -> Result<RemoteRegion, DmaError> {
        self.check_rma()?;
        // SAFETY: the domain and the endpoint are this endpoint's, open and belonging together,
        // and open for as long as any region registered in the domain lives (a region borrows or
        // holds its endpoint, and `self` is borrowed meanwhile).
        unsafe {
            region.renew(
                self.handles.domain,
                self.handles.ep,
                self.mr_mode(),
                &mut || self.operations.keys.draw(),
            )
        }
    }

    /// Register the application's `buffer` in place, for RMA and as the local side of this
    /// endpoint's operations: the provider gets the buffer's own address, and nothing is copied.
    /// The region owns the buffer; see [`StableBuffer`] for who may touch its bytes and when,
    /// and how it comes back. Device memory (an [`interface`](
    /// StableBuffer::interface) other than host) goes through `fi_mr_regattr`, and needs a
    /// provider that offers `FI_HMEM`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the endpoint was opened without
    /// [`Configuration::rma`](crate::configuration::Configuration::rma), for an empty buffer or one
    /// longer than [`MAX_REGION_LEN`](super::MAX_REGION_LEN), for a `memmap2::MmapMut`
    /// that maps a file past its end (see [`StableBuffer`], "File mappings"), or for a provider that asks
    /// for `FI_MR_RAW`; [`DmaError::Unsupported`] for device memory on a provider that does not
    /// offer `FI_HMEM` (naming the capabilities `fi_getinfo` answered); [`DmaError::Fabric`] when
    /// `fi_mr_reg`, `fi_mr_regattr`, `fi_mr_bind` or `fi_mr_enable` fails. The buffer is dropped on
    /// an error, and nothing is left registered.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, Exposure, LibfabricEndpoint};
    ///
    /// let configuration = Configuration { rma: true, ..Configuration::default() };
    /// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
    /// let pages = vec![7_u8; 4096];
    /// let address = pages.as_ptr() as usize;
    /// let mut region = endpoint.register_buffer(pages, Exposure::Local)?;
    /// assert_eq!(address, region.as_slice()?.as_ptr() as usize, "the Vec's own bytes");
    /// region.as_mut_slice()?[0] = 1; // no copy: the application writes the registered memory
    /// let pages = region.into_buffer().map_err(|(_, error)| error)?; // and gets it back
    /// assert_eq!((1, 7, address), (pages[0], pages[1], pages.as_ptr() as usize));
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn register_buffer<B: StableBuffer>(
        &self,
        buffer: B,
        exposure: Exposure,
    ) -> Result<MemoryRegion<'_, B>, DmaError> {
        self.check_rma()?;
        let interface = buffer.interface();
        // SAFETY: the endpoint was opened from `info`, which it frees only when it drops.
        let caps = unsafe { (*self.handles.info).caps };
        interface.check_offered(caps, &self.describe().provider)?;
        // The buffer goes to its resting place first, and its pointer is taken there: nothing
        // moves it again until it is handed back.
        let mut buffer = Box::new(buffer);
        let start = buffer.as_mut_ptr();
        let len = StableBuffer::len(&*buffer);
        let held = StableBuffer::capacity(&*buffer);
        #[cfg(feature = "memmap2")]
        if std::any::TypeId::of::<B>() == std::any::TypeId::of::<memmap2::MmapMut>() {
            super::mapping::check_file_backing(start as usize, len)?;
        }
        // SAFETY: the domain and the endpoint are open and stay open until every registration
        // is dropped (as for `register`: a region borrows this endpoint, and operations' holds
        // are dropped before the handles close); the pool is the slab's, dropped after the
        // handles close. The `len` bytes at `start` are `buffer`'s (its `StableBuffer`
        // promise), which the registration owns, calling nothing on it but its `Drop`.
        let registration = unsafe {
            Registration::owned(
                self.handles.domain,
                self.handles.ep,
                self.mr_mode(),
                buffer,
                (start, len, held),
                (exposure, interface),
                &self.operations.pool,
                &mut || self.operations.keys.draw(),
            )
        }?;
        Ok(MemoryRegion::new(registration))
    }
}
