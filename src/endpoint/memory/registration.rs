//! A registration's life: `fi_mr_reg` (or `fi_mr_regattr`) of a region's memory under the
//! provider's `mr_mode`, the keys it is requested under, the holds of the operations in flight
//! on it, and its close, after which its memory is parked.
//!
//! What each `mr_mode` bit asks and why a closed registration's memory is parked rather than
//! freed are on [`MemoryRegion`](super::MemoryRegion) ("Registration mode", "Parking"); why keys
//! are random and how they are drawn on [`register`](crate::endpoint::LibfabricEndpoint::register)
//! ("Keys").
//!
//! # Bounds
//!
//! A registration covers 1 to [`MAX_REGION_LEN`] bytes; one registration tries at most
//! [`REGION_KEY_ATTEMPTS`] keys. [`Keys`] holds one hasher and one counter per endpoint.
//!
//! Below it: `opening` opens a registration (and renews its key), `keys` draws the keys, and
//! `exposure` says what a registration is of ([`Exposure`], [`MemoryInterface`]).

use std::any::Any;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

#[cfg(doc)] // for the docs' links
use super::MemoryRegion;
use super::pool::{Buffer, Pool};
#[cfg(doc)]
use crate::endpoint::LibfabricEndpoint;
use crate::endpoint::access::AccessWord;
use crate::error::DmaError;
use dma_libfabric_sys as sys;

mod exposure;
mod keys;
mod opening;

pub use self::exposure::{Exposure, MemoryInterface};
pub(crate) use self::keys::Keys;
pub use self::keys::REGION_KEY_ATTEMPTS;

/// The longest region [`register`](crate::endpoint::LibfabricEndpoint::register) accepts: 1 TiB.
///
/// libfabric's `fi_info` gives no limit on a registration's length: `domain_attr.mr_iov_limit`
/// counts the pieces of one registration (1 on tcp), and `ep_attr.max_msg_size` bounds one
/// transfer, not a region (`SIZE_MAX` on tcp;ofi_rxm; a larger region is still used in slices).
/// So the bound is this documented ceiling, far above any buffer a data-transfer server
/// registers and far below the sizes whose arithmetic overflows; a length under it that the
/// system cannot allocate is an error too, never an abort.
pub const MAX_REGION_LEN: usize = 1 << 40;

/// The memory a registration covers.
enum Memory {
    /// The endpoint's own, from its pool: parked there again on drop.
    Pooled(Buffer),
    /// The application's buffer (a `Box<B>` of the `StableBuffer` it handed in), registered in
    /// place: its bytes never moved, and the box only keeps it, and its `Drop`, alive. `held`
    /// is what it holds (its `StableBuffer::capacity`, at least the registered length): what
    /// parking it counts.
    Owned {
        buffer: Box<dyn Any + Send>,
        held: usize,
    },
    /// Another registration's memory (`shares`), or none any more (inside `Drop`).
    None,
}

/// A registration and the memory it covers, shared by the [`MemoryRegion`] handle and every
/// operation in flight on it. Dropping the last holder closes the registration and parks the
/// memory in the endpoint's pool.
pub(crate) struct Registration {
    /// The registration; null once closed.
    mr: AtomicPtr<sys::fid_mr>,
    /// `fi_mr_desc`, passed with every local buffer.
    desc: *mut c_void,
    /// The key a peer uses.
    pub(super) key: u64,
    /// What a peer adds an offset to: the virtual address under `FI_MR_VIRT_ADDR`, else 0.
    pub(super) remote_base: u64,
    /// The first byte of `memory`.
    pub(super) buffer: *mut u8,
    /// The registered length, at most `memory`'s capacity.
    pub(super) len: usize,
    /// The memory: the pool's, handed back to `pool` in `Drop`, or the application's (see
    /// `buffer`); `None` inside `Drop`, and for a registration of another's memory (`shares`).
    memory: Memory,
    /// Whether peers may reach the memory (`Remote`), or only this endpoint's own operations.
    pub(super) exposure: Exposure,
    /// Where the memory lives: host, or a device.
    pub(super) interface: MemoryInterface,
    /// For memory that lends slices (`Local` host memory): the slices and copies lent, the
    /// posters waiting for them and the operations holding the memory, in one word so that
    /// neither loans nor operations can start while the other is there (see `access`). Kept by the registration that owns the memory, and reached through `shares`
    /// from one that registers it again.
    pub(super) access: AccessWord,
    /// The registration whose memory this one registers again in another domain (a rail set's
    /// region), held for as long as this one lives.
    shares: Option<Arc<Registration>>,
    /// The endpoint's pool.
    pool: Arc<Pool>,
    /// The domain it is registered in, so an endpoint refuses another endpoint's region.
    domain: *mut sys::fid_domain,
}

// SAFETY: the registration is an object of an `FI_THREAD_SAFE` domain, usable from any thread;
// the memory is only touched through raw copies (`MemoryRegion`'s docs, "Contents": its bytes
// are plain `u8`, for which any value is valid) and handed to the pool once, by whichever holder
// drops last.
unsafe impl Send for Registration {}
// SAFETY: as for `Send`; shared access is copies of plain bytes and reads of fields that never
// change after registration, and `mr` is an atomic.
unsafe impl Sync for Registration {}

impl Registration {
    /// Register `len` bytes of zeroed memory from `pool` in `domain`, honouring `mr_mode`, under
    /// a key from `keys` (unless the provider chooses it), drawing another while the provider
    /// answers `-FI_ENOKEY`, up to [`REGION_KEY_ATTEMPTS`] keys.
    ///
    /// # Safety
    /// `domain` and `ep` are open and belong together; they stay open until the returned
    /// registration has been dropped, and `pool` frees nothing before they close (the endpoint
    /// guarantees both: see `rma`).
    pub(crate) unsafe fn new(
        domain: *mut sys::fid_domain,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        len: usize,
        pool: &Arc<Pool>,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        if 0 == len {
            return Err(DmaError::InvalidArgument(format!(
                "register(0) asks for an empty region: a region is 1 to {MAX_REGION_LEN} bytes \
                 (MAX_REGION_LEN); ask for at least one byte"
            )));
        }
        if len > MAX_REGION_LEN {
            return Err(DmaError::InvalidArgument(format!(
                "a memory region of {len} bytes is longer than the {MAX_REGION_LEN}-byte bound \
                 (MAX_REGION_LEN): register it as several regions of at most that length"
            )));
        }
        refuse_raw_keys(mr_mode)?;
        let memory = pool.take(len)?;
        let buffer = memory.start();
        let registration = Self {
            mr: AtomicPtr::new(ptr::null_mut()),
            desc: ptr::null_mut(),
            key: 0,
            remote_base: 0,
            buffer,
            len,
            memory: Memory::Pooled(memory),
            exposure: Exposure::Remote,
            interface: MemoryInterface::Host,
            access: AccessWord::new(),
            shares: None,
            pool: Arc::clone(pool),
            domain,
        };
        // SAFETY: the caller's promise, and `registration` owns the `len` bytes at `buffer`.
        unsafe { registration.register(ep, mr_mode, keys) }
    }

    /// Register the application's `buffer` (a `Box` of its `StableBuffer`) in place: `len` bytes
    /// at `start` of the `held` bytes it holds (counted when it is parked), with `exposure`'s access flags, through `fi_mr_regattr` when `interface` is
    /// not plain host memory. Otherwise as [`new`](Self::new).
    ///
    /// # Safety
    /// As [`new`](Self::new); and the `len` bytes at `start` are `buffer`'s, valid for as long
    /// as `buffer` is neither dropped nor touched (a `StableBuffer`'s promise), and `buffer`
    /// gives nobody else access to them.
    #[allow(clippy::too_many_arguments)] // one registration's facts, each needed
    pub(crate) unsafe fn owned(
        domain: *mut sys::fid_domain,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        buffer: Box<dyn Any + Send>,
        (start, len, held): (*mut u8, usize, usize),
        (exposure, interface): (Exposure, MemoryInterface),
        pool: &Arc<Pool>,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        if 0 == len || len > MAX_REGION_LEN {
            return Err(DmaError::InvalidArgument(format!(
                "a buffer of {len} bytes cannot be registered: a region is 1 to {MAX_REGION_LEN} \
                 bytes (MAX_REGION_LEN); register a non-empty buffer, or a longer one as several \
                 buffers"
            )));
        }
        if start.is_null() {
            return Err(DmaError::InvalidArgument(format!(
                "StableBuffer::as_mut_ptr returned null for a buffer of {len} bytes: the \
                 implementation breaks the trait's contract (a pointer to its bytes); fix it"
            )));
        }
        refuse_raw_keys(mr_mode)?;
        let registration = Self {
            mr: AtomicPtr::new(ptr::null_mut()),
            desc: ptr::null_mut(),
            key: 0,
            remote_base: 0,
            buffer: start,
            len,
            memory: Memory::Owned {
                buffer,
                held: held.max(len),
            },
            exposure,
            interface,
            access: AccessWord::new(),
            shares: None,
            pool: Arc::clone(pool),
            domain,
        };
        // SAFETY: the caller's promise; `registration` owns `buffer`, so the bytes live until
        // it drops, which closes the registration first.
        unsafe { registration.register(ep, mr_mode, keys) }
    }

    /// `primary`'s memory registered again, in `domain` (another endpoint's): one buffer that
    /// peers reach through either domain, as a rail set's region is. The new registration holds
    /// `primary`, so the memory lives (and is parked by `primary`'s endpoint) until both are
    /// dropped; its own drop closes only its own registration.
    ///
    /// # Safety
    /// As [`new`](Self::new) for `domain`, `ep` and `pool`; and `primary`'s endpoint outlives
    /// `domain` (its pool frees the memory only once that endpoint has closed, and a transfer
    /// admitted under this registration may still reach the memory until `domain` closes).
    pub(crate) unsafe fn alias(
        primary: &Arc<Registration>,
        domain: *mut sys::fid_domain,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        pool: &Arc<Pool>,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        refuse_raw_keys(mr_mode)?;
        let registration = Self {
            mr: AtomicPtr::new(ptr::null_mut()),
            desc: ptr::null_mut(),
            key: 0,
            remote_base: 0,
            buffer: primary.buffer,
            len: primary.len,
            memory: Memory::None,
            exposure: primary.exposure,
            interface: primary.interface,
            access: AccessWord::new(),
            shares: Some(Arc::clone(primary)),
            pool: Arc::clone(pool),
            domain,
        };
        // SAFETY: the caller's promise; the `len` bytes at `buffer` are `primary`'s, which
        // `registration` holds until it drops, closing its registration first.
        unsafe { registration.register(ep, mr_mode, keys) }
    }

    /// `fi_mr_reg` of this registration's `len` bytes at `buffer` in its domain, and the rest of
    /// what `mr_mode` asks.
    ///
    /// # Safety
    /// `self.domain` and `ep` are open and belong together, and stay open until `self` drops;
    /// `self` keeps the `len` bytes at `self.buffer` alive until it drops.
    unsafe fn register(
        mut self,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        // SAFETY: the caller's promise.
        let opened = unsafe { self.open(ep, mr_mode, keys) }?;
        self.install(opened, mr_mode);
        Ok(self)
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

    /// The registration that owns the memory, and so keeps its `access` word.
    pub(super) fn keeper(&self) -> &Registration {
        self.shares.as_deref().unwrap_or(self)
    }

    /// Whether the memory lends slices (`Local` host memory the application handed in), and so
    /// counts its operations.
    pub(crate) fn lends_slices(&self) -> bool {
        let keeper = self.keeper();
        Exposure::Local == keeper.exposure
            && keeper.interface.is_host()
            && matches!(keeper.memory, Memory::Owned { .. })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Close the registration and hand out the application's buffer, if it is a `B`: for the
    /// last holder only. Anything else comes back unchanged, registration open.
    #[allow(clippy::result_large_err)] // the registration itself comes back, once a region
    pub(crate) fn into_owned<B: 'static>(mut self) -> Result<B, Self> {
        match std::mem::replace(&mut self.memory, Memory::None) {
            Memory::Owned { buffer, held } => match buffer.downcast::<B>() {
                Ok(buffer) => {
                    self.close_registration();
                    Ok(*buffer)
                }
                Err(buffer) => {
                    self.memory = Memory::Owned { buffer, held };
                    Err(self)
                }
            },
            other => {
                self.memory = other;
                Err(self)
            }
        }
    }

    pub(crate) fn domain(&self) -> *mut sys::fid_domain {
        self.domain
    }

    /// The address of byte `offset`, which the caller checked is inside the buffer.
    pub(crate) fn at(&self, offset: usize) -> *mut u8 {
        self.buffer.wrapping_add(offset)
    }

    /// `offset..offset + len` as a checked range of this buffer.
    pub(crate) fn check_range(&self, offset: usize, len: usize) -> Result<(), DmaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DmaError::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit a {}-byte region: the range must end \
                 at or before the region's length",
                self.len
            ))),
        }
    }
}

/// Refuse a provider that asks for `FI_MR_RAW`, before any registration.
fn refuse_raw_keys(mr_mode: i32) -> Result<(), DmaError> {
    if 0 != mr_mode & sys::FI_MR_RAW as i32 {
        return Err(DmaError::InvalidArgument(
            "the provider asks for FI_MR_RAW (keys wider than 64 bits), which this crate does not \
             support: open the endpoint with a provider that does not (tcp, verbs, efa)"
                .into(),
        ));
    }
    Ok(())
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.close_registration();
        // Parked, not freed: a peer's transfer admitted before the close may still move bytes
        // through it (`MemoryRegion`'s docs, "Parking"); the pool frees it after the endpoint has closed.
        match std::mem::replace(&mut self.memory, Memory::None) {
            Memory::Pooled(memory) => self.pool.park(memory),
            // A peer may still move bytes through it: parked until the endpoint closes.
            Memory::Owned { buffer, held } if Exposure::Remote == self.exposure => {
                self.pool.park_owned(buffer, held);
            }
            // No peer could reach it (no remote access), and no operation holds it (this is the
            // last holder): the application's `Drop` runs now.
            Memory::Owned { buffer, .. } => drop(buffer),
            Memory::None => {}
        }
    }
}

/// The memory of one operation in flight, held until its completion has been read: the
/// registration (and so the memory) lives at least that long, and, for memory that lends slices,
/// no slice can be lent meanwhile.
pub(crate) struct OperationHold {
    pub(super) region: Arc<Registration>,
    /// Whether the hold is counted in the memory's `access` word.
    pub(super) counted: bool,
}

impl OperationHold {
    /// One more hold of the same memory, for another part of the same transfer: it cannot be
    /// refused, since this hold already keeps slices from being lent.
    pub(crate) fn another(&self) -> Self {
        if self.counted {
            self.region.keeper().access.add_hold();
        }
        Self {
            region: Arc::clone(&self.region),
            counted: self.counted,
        }
    }
}

impl std::ops::Deref for OperationHold {
    type Target = Registration;

    fn deref(&self) -> &Registration {
        &self.region
    }
}

impl Drop for OperationHold {
    fn drop(&mut self) {
        if self.counted {
            // Release: the operation's bytes (the completion has been read) happen before a
            // slice lent after this.
            self.region.keeper().access.release_hold();
        }
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
    use crate::endpoint::LibfabricEndpoint;
    use crate::endpoint::memory::tests::endpoint;

    /// Register 64 bytes in `endpoint`'s domain as if the provider had asked for `mr_mode`,
    /// requesting `key`.
    fn register(
        endpoint: &LibfabricEndpoint,
        mr_mode: i32,
        key: u64,
    ) -> Result<Registration, DmaError> {
        register_len(endpoint, mr_mode, key, 64)
    }

    fn register_len(
        endpoint: &LibfabricEndpoint,
        mr_mode: i32,
        key: u64,
        len: usize,
    ) -> Result<Registration, DmaError> {
        // SAFETY: the endpoint's domain and endpoint are open, and outlive the registration,
        // which the caller drops before the endpoint; the pool is the endpoint's.
        unsafe {
            Registration::new(
                endpoint.handles.domain,
                endpoint.handles.ep,
                mr_mode,
                len,
                &endpoint.operations.pool,
                &mut || key,
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
    fn raw_keys_empty_and_oversized_regions_are_refused_before_registering() {
        let endpoint = endpoint();
        assert!(matches!(
            register(&endpoint, sys::FI_MR_RAW as i32, 1 << 41),
            Err(DmaError::InvalidArgument(_))
        ));
        for len in [0, MAX_REGION_LEN + 1, usize::MAX] {
            assert!(matches!(
                register_len(&endpoint, 0, 1 << 41, len),
                Err(DmaError::InvalidArgument(_))
            ));
        }
        assert_eq!(0, endpoint.parked_memory(), "nothing was allocated");
        // Nothing was registered under the key: it is still free.
        register(&endpoint, 0, 1 << 41).expect("the key is free");
    }

    /// A requested key already in use in the domain is `-FI_ENOKEY`, and registration draws
    /// another; it gives up after `REGION_KEY_ATTEMPTS`.
    #[test]
    fn a_key_in_use_is_retried_with_another() {
        let endpoint = endpoint();
        let taken = register(&endpoint, 0, 77).expect("registered");
        endpoint
            .operations
            .keys
            .forced
            .lock()
            .expect("not poisoned")
            .extend([77, 77, 78]);
        let region = endpoint.register(64).expect("registered on the third key");
        assert_eq!(78, region.remote().key);

        endpoint
            .operations
            .keys
            .forced
            .lock()
            .expect("not poisoned")
            .extend([77; REGION_KEY_ATTEMPTS]);
        match endpoint.register(64) {
            Err(DmaError::Fabric { call, code, .. }) => {
                assert_eq!("fi_mr_reg", call);
                assert_eq!(-i64::from(sys::FI_ENOKEY), code);
            }
            other => panic!("expected -FI_ENOKEY after {REGION_KEY_ATTEMPTS} keys: {other:?}"),
        }
        drop(taken);
    }
}
