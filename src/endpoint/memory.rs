//! Registered memory: buffers a peer may write into or read from, and the descriptor it needs
//! to do so.
//!
//! [`LibfabricEndpoint::register`](crate::LibfabricEndpoint::register) allocates a buffer,
//! registers it with `fi_mr_reg` for local and remote reads and writes, and returns a
//! [`MemoryRegion`]. Its [`RemoteRegion`] (address, key, length) is what a peer needs to post
//! `fi_write` or `fi_read` against it; it converts to and from a fixed 24-byte little-endian
//! layout to be advertised.
//!
//! # The provider's memory-registration mode
//!
//! Providers differ in what they ask (`domain_attr.mr_mode`); each bit is read from the
//! `fi_info` the endpoint was opened with, never assumed:
//!
//! - `FI_MR_VIRT_ADDR`: a peer addresses the region by its virtual address; otherwise by its
//!   offset from 0. [`MemoryRegion::remote`] gives whichever the provider wants.
//! - `FI_MR_PROV_KEY`: the provider chooses the key (read back with `fi_mr_key`); otherwise the
//!   endpoint requests one of its own, unique within the domain.
//! - `FI_MR_LOCAL`: local buffers of an operation need their descriptor (`fi_mr_desc`). Every
//!   local buffer of an RMA operation here is a registered region, and its descriptor is always
//!   passed, so the bit is honoured whether or not it is set.
//! - `FI_MR_ALLOCATED`: only allocated memory may be registered. The region allocates its own.
//! - `FI_MR_ENDPOINT`: the region is bound to the endpoint (`fi_mr_bind`) and enabled
//!   (`fi_mr_enable`) before use.
//! - `FI_MR_RAW` (keys wider than 64 bits) is not supported: registering fails with a clear
//!   error.
//!
//! # Lifetime
//!
//! A [`MemoryRegion`] borrows its endpoint, or (made by
//! [`register_shared`](crate::LibfabricEndpoint::register_shared)) holds an `Arc` of it, so it
//! cannot outlive the domain it is registered in.
//! Its memory and registration are shared (an `Arc`) with every operation in flight on it:
//! dropping the `MemoryRegion` while a write or read is in flight leaves both alive until the
//! operation's completion has been read, and only then closes the registration and frees the
//! memory. No API path frees a buffer an operation may still touch.
//!
//! # Contents
//!
//! A registered buffer is written by peers, and by the provider on behalf of local reads, at
//! times this process does not choose. So its bytes are only ever copied in and out
//! ([`MemoryRegion::write_bytes`], [`MemoryRegion::read_bytes`]), never lent out as a slice:
//! a copy taken while a transfer lands may mix old and new bytes, and the application tells a
//! complete record from a torn one (a checksum, a sequence written last), as it must on any RDMA
//! NIC.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::error::DmaError;
use crate::sys;

/// A registration and the memory it covers, shared by the [`MemoryRegion`] handle and every
/// operation in flight on it. Dropping the last holder closes the registration and frees the
/// memory.
pub(crate) struct Registration {
    /// The registration; null once closed.
    mr: AtomicPtr<sys::fid_mr>,
    /// `fi_mr_desc`, passed with every local buffer.
    desc: *mut c_void,
    /// The key a peer uses.
    key: u64,
    /// What a peer adds an offset to: the virtual address under `FI_MR_VIRT_ADDR`, else 0.
    remote_base: u64,
    /// The memory, from `Box::<[u8]>::into_raw`; freed in `Drop`.
    buffer: *mut u8,
    len: usize,
    /// The domain it is registered in, so an endpoint refuses another endpoint's region.
    domain: *mut sys::fid_domain,
}

// SAFETY: the registration is an object of an `FI_THREAD_SAFE` domain, usable from any thread;
// the memory is only touched through raw copies (module docs: its bytes are plain `u8`, for which
// any value is valid) and freed once, by whichever holder drops last.
unsafe impl Send for Registration {}
// SAFETY: as for `Send`; shared access is copies of plain bytes and reads of fields that never
// change after registration, and `mr` is an atomic.
unsafe impl Sync for Registration {}

impl Registration {
    /// Register `len` bytes of fresh zeroed memory in `domain`, honouring `mr_mode`.
    ///
    /// # Safety
    /// `domain` and `ep` are open and belong together; they stay open until the returned
    /// registration has been dropped (the endpoint guarantees it: see `rma`).
    pub(crate) unsafe fn new(
        domain: *mut sys::fid_domain,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        requested_key: u64,
        len: usize,
    ) -> Result<Self, DmaError> {
        if 0 == len {
            return Err(DmaError::InvalidArgument(
                "a memory region must be at least one byte long".into(),
            ));
        }
        if 0 != mr_mode & sys::FI_MR_RAW as i32 {
            return Err(DmaError::InvalidArgument(
                "the provider asks for FI_MR_RAW (keys wider than 64 bits), which this crate does \
                 not support"
                    .into(),
            ));
        }
        let buffer = Box::into_raw(vec![0_u8; len].into_boxed_slice()).cast::<u8>();
        let mut registration = Self {
            mr: AtomicPtr::new(ptr::null_mut()),
            desc: ptr::null_mut(),
            key: 0,
            remote_base: 0,
            buffer,
            len,
            domain,
        };
        let access =
            u64::from(sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE);
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is open (the caller's promise); `buffer` holds `len` bytes that live
        // until `registration` drops, which closes the registration first; `mr` receives one
        // object, owned by `registration` from here on (its `Drop` closes it).
        let code = unsafe {
            sys::fi_mr_reg(
                domain,
                buffer.cast_const().cast(),
                len,
                access,
                0,
                requested_key,
                0,
                &raw mut mr,
                ptr::null_mut(),
            )
        };
        if 0 != code {
            return Err(DmaError::fabric("fi_mr_reg", code.into()));
        }
        registration.mr = AtomicPtr::new(mr);
        if 0 != mr_mode & sys::FI_MR_ENDPOINT as i32 {
            // SAFETY: `mr` was just registered and `ep` is open in the same domain (the caller's
            // promise); binding and enabling take no pointers beyond them.
            unsafe {
                check("fi_mr_bind", sys::fi_mr_bind(mr, &raw mut (*ep).fid, 0))?;
                check("fi_mr_enable", sys::fi_mr_enable(mr))?;
            }
        }
        // SAFETY: `mr` is open; both calls read fields of it.
        let (desc, key) = unsafe { (sys::fi_mr_desc(mr), sys::fi_mr_key(mr)) };
        registration.desc = desc;
        registration.key = if 0 != mr_mode & sys::FI_MR_PROV_KEY as i32 {
            key
        } else {
            requested_key
        };
        // FI_KEY_NOTAVAIL is `(uint64_t) -1`, a cast bindgen does not evaluate.
        if u64::MAX == registration.key {
            return Err(DmaError::InvalidArgument(
                "the provider gave no 64-bit key for the region (FI_KEY_NOTAVAIL)".into(),
            ));
        }
        registration.remote_base = if 0 != mr_mode & sys::FI_MR_VIRT_ADDR as i32 {
            buffer as u64
        } else {
            0
        };
        Ok(registration)
    }

    /// Close the registration now, leaving the memory allocated: for an endpoint that must close
    /// every registration before itself (`FI_MR_ENDPOINT`) while the provider may still touch the
    /// memory of an abandoned operation.
    pub(crate) fn close_registration(&self) {
        let mr = self.mr.swap(ptr::null_mut(), Ordering::AcqRel);
        if mr.is_null() {
            return;
        }
        // SAFETY: `mr` was open and the swap above handed it to this call alone, so it is closed
        // once; its domain is still open (`Registration::new`'s contract).
        let code = unsafe { sys::fi_close(&raw mut (*mr).fid) };
        if 0 != code {
            tracing::warn!(error = %DmaError::fabric("fi_close", code.into()), "closing a memory registration failed");
        }
    }

    pub(crate) fn desc(&self) -> *mut c_void {
        self.desc
    }

    pub(crate) fn domain(&self) -> *mut sys::fid_domain {
        self.domain
    }

    /// The address of byte `offset`, which the caller checked is inside the buffer.
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        self.buffer.wrapping_add(offset)
    }

    /// `offset..offset + len` as a checked range of this buffer.
    fn check_range(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaError::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit a {}-byte region",
                self.len
            ))),
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.close_registration();
        // SAFETY: `buffer` and `len` came from `Box::<[u8]>::into_raw` of exactly `len` bytes in
        // `new` and are freed only here; the registration is closed, and no operation is in
        // flight on it (each holds a clone of the `Arc` this was inside).
        drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(self.buffer, self.len)) });
    }
}

/// A registered buffer of this process, which peers may write into and read from with RMA.
///
/// Made by [`LibfabricEndpoint::register`](crate::LibfabricEndpoint::register); it borrows that
/// endpoint. Dropping it while an operation on it is in flight is safe: the memory and the
/// registration live until the operation's completion has been read. See the
/// [module docs](self).
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint, RemoteRegion};
///
/// let configuration = Configuration { rma: true, ..Configuration::default() };
/// let endpoint = LibfabricEndpoint::open(&configuration, Some("127.0.0.1"))?;
/// let region = endpoint.register(64)?;
/// region.write_bytes(8, b"hello")?;
/// let mut out = [0; 5];
/// region.read_bytes(8, &mut out)?;
/// assert_eq!(b"hello", &out);
///
/// let advertised = region.remote().to_bytes(); // what a peer is told
/// assert_eq!(region.remote(), RemoteRegion::from_bytes(&advertised)?);
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct MemoryRegion<'ep> {
    pub(crate) inner: Arc<Registration>,
    /// The endpoint, for a region made by
    /// [`register_shared`](crate::LibfabricEndpoint::register_shared): declared after `inner`, so
    /// the registration goes before the endpoint can. Held for its `Drop`.
    #[allow(dead_code)]
    owner: Option<Arc<crate::LibfabricEndpoint>>,
    endpoint: PhantomData<&'ep ()>,
}

impl std::fmt::Debug for MemoryRegion<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryRegion")
            .field("len", &self.inner.len)
            .field("remote", &self.remote())
            .finish_non_exhaustive()
    }
}

impl MemoryRegion<'_> {
    pub(crate) fn new(registration: Registration) -> Self {
        Self {
            inner: Arc::new(registration),
            owner: None,
            endpoint: PhantomData,
        }
    }

    /// The same region, keeping `owner` (its endpoint) alive instead of borrowing it.
    pub(crate) fn owned_by(self, owner: Arc<crate::LibfabricEndpoint>) -> MemoryRegion<'static> {
        MemoryRegion {
            inner: self.inner,
            owner: Some(owner),
            endpoint: PhantomData,
        }
    }

    /// The region's length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always `false`: an empty region cannot be registered.
    pub fn is_empty(&self) -> bool {
        0 == self.inner.len
    }

    /// What a peer needs to write into or read from this whole region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            address: self.inner.remote_base,
            key: self.inner.key,
            len: self.inner.len as u64,
        }
    }

    /// `len` bytes at `offset`, as the local side of a [`write`](crate::LibfabricEndpoint::write)
    /// (the source) or a [`read`](crate::LibfabricEndpoint::read) (the destination).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an empty segment or one that does not fit the region.
    pub fn segment(&self, offset: usize, len: usize) -> Result<Segment<'_>, DmaError> {
        if 0 == len {
            return Err(DmaError::InvalidArgument("an empty segment".into()));
        }
        self.inner.check_range(offset, len)?;
        Ok(Segment {
            region: &self.inner,
            offset,
            len,
        })
    }

    /// Copy `data` into the region at `offset`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when it does not fit; nothing is copied.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        self.inner.check_range(offset, data.len())?;
        // SAFETY: the range is inside the buffer (checked), which lives as long as `self`; the
        // bytes are plain `u8`, and a transfer landing meanwhile may only tear them (module
        // docs), which a copy of bytes tolerates.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.inner.at(offset), data.len()) };
        Ok(())
    }

    /// Copy the region's bytes at `offset` into `out`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the range does not fit; nothing is copied.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.inner.check_range(offset, out.len())?;
        // SAFETY: as in `write_bytes`, in the other direction.
        unsafe { ptr::copy_nonoverlapping(self.inner.at(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// How many operations in flight hold this region now.
    pub fn in_flight(&self) -> usize {
        Arc::strong_count(&self.inner).saturating_sub(1)
    }
}

/// A checked range of a [`MemoryRegion`]: the local side of an RMA operation.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'region> {
    pub(crate) region: &'region Arc<Registration>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl Segment<'_> {
    /// Its length in bytes (never 0).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: segments are never empty.
    pub fn is_empty(&self) -> bool {
        0 == self.len
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Registration")
            .field("len", &self.len)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// What a peer advertises so that others may write into or read from its memory: the address to
/// post against (the virtual address under `FI_MR_VIRT_ADDR`, else an offset from 0), the key,
/// and the length.
///
/// Encoded as 24 bytes, little-endian: address, key, length.
///
/// ```
/// use dma_libfabric::{DmaError, RemoteRegion};
///
/// let remote = RemoteRegion { address: 0x1000, key: 7, len: 64 };
/// let bytes = remote.to_bytes();
/// assert_eq!(remote, RemoteRegion::from_bytes(&bytes)?);
/// assert!(matches!(RemoteRegion::from_bytes(&bytes[..23]), Err(DmaError::InvalidArgument(_))));
///
/// let tail = remote.slice(60, 4)?; // the last four bytes
/// assert_eq!((0x1000 + 60, 4), (tail.address, tail.len));
/// assert!(remote.slice(61, 4).is_err());
/// # Ok::<(), DmaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The address of the first byte, as RMA calls take it.
    pub address: u64,
    /// The registration's key.
    pub key: u64,
    /// How many bytes may be written or read from `address`.
    pub len: u64,
}

impl RemoteRegion {
    /// The length of [`to_bytes`](Self::to_bytes).
    pub const ENCODED_LEN: usize = 24;

    /// The fixed little-endian layout: address, key, length.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut bytes = [0; Self::ENCODED_LEN];
        bytes[0..8].copy_from_slice(&self.address.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.key.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.len.to_le_bytes());
        bytes
    }

    /// Parse [`to_bytes`](Self::to_bytes)'s layout.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for anything but exactly
    /// [`ENCODED_LEN`](Self::ENCODED_LEN) bytes, an empty region, or one whose end overflows.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DmaError> {
        let Ok(bytes) = <&[u8; Self::ENCODED_LEN]>::try_from(bytes) else {
            return Err(DmaError::InvalidArgument(format!(
                "a remote region is {} bytes, not {}",
                Self::ENCODED_LEN,
                bytes.len()
            )));
        };
        let word = |at: usize| {
            let mut word = [0; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        let remote = Self {
            address: word(0),
            key: word(8),
            len: word(16),
        };
        if 0 == remote.len || remote.address.checked_add(remote.len).is_none() {
            return Err(DmaError::InvalidArgument(format!(
                "a remote region of {} bytes at {:#x} is empty or overflows",
                remote.len, remote.address
            )));
        }
        Ok(remote)
    }

    /// `len` bytes at `offset` of this region.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an empty range or one that does not fit.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self, DmaError> {
        match offset.checked_add(len) {
            Some(end) if 0 < len && end <= self.len => Ok(Self {
                address: self.address.wrapping_add(offset),
                key: self.key,
                len,
            }),
            _ => Err(DmaError::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit a {}-byte remote region",
                self.len
            ))),
        }
    }
}

fn check(call: &'static str, code: i32) -> Result<(), DmaError> {
    if 0 == code {
        Ok(())
    } else {
        Err(DmaError::fabric(call, code.into()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // tests assert by panicking

    use super::*;
    use crate::{Configuration, LibfabricEndpoint};

    fn endpoint() -> LibfabricEndpoint {
        let configuration = Configuration {
            rma: true,
            ..Configuration::default()
        };
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
    }

    /// Register in `endpoint`'s domain as if the provider had asked for `mr_mode`.
    fn register(
        endpoint: &LibfabricEndpoint,
        mr_mode: i32,
        key: u64,
    ) -> Result<Registration, DmaError> {
        // SAFETY: the endpoint's domain and endpoint are open, and outlive the registration,
        // which the caller drops before the endpoint.
        unsafe {
            Registration::new(
                endpoint.handles.domain,
                endpoint.handles.ep,
                mr_mode,
                key,
                64,
            )
        }
    }

    // tcp asks for none of these bits (mr_mode 0), so the branches for the providers that do
    // (efa: VIRT_ADDR, PROV_KEY) are checked here against tcp's registration bookkeeping.
    #[test]
    fn virt_addr_and_prov_key_follow_the_mode_bits() {
        let endpoint = endpoint();
        let both = register(
            &endpoint,
            (sys::FI_MR_VIRT_ADDR | sys::FI_MR_PROV_KEY) as i32,
            1 << 40,
        )
        .expect("registered");
        assert_eq!(
            both.buffer as u64, both.remote_base,
            "VIRT_ADDR: the virtual address"
        );
        // SAFETY: the registration is open.
        let provider_key = unsafe { sys::fi_mr_key(both.mr.load(Ordering::Acquire)) };
        assert_eq!(provider_key, both.key, "PROV_KEY: the key fi_mr_key gives");

        let neither = register(&endpoint, 0, (1 << 40) + 1).expect("registered");
        assert_eq!(0, neither.remote_base, "offsets from 0");
        assert_eq!((1 << 40) + 1, neither.key, "the requested key");
    }

    #[test]
    fn raw_keys_and_empty_regions_are_refused_before_registering() {
        let endpoint = endpoint();
        assert!(matches!(
            register(&endpoint, sys::FI_MR_RAW as i32, 1 << 41),
            Err(DmaError::InvalidArgument(_))
        ));
        // SAFETY: as in `register`.
        let empty = unsafe {
            Registration::new(endpoint.handles.domain, endpoint.handles.ep, 0, 1 << 41, 0)
        };
        assert!(matches!(empty, Err(DmaError::InvalidArgument(_))));
        // Nothing was registered under the key: it is still free.
        register(&endpoint, 0, 1 << 41).expect("the key is free");
    }
}
