//! Registered memory: buffers a peer may write into or read from, and the descriptor it needs
//! to do so.
//!
//! [`LibfabricEndpoint::register`](crate::endpoint::LibfabricEndpoint::register) allocates a buffer,
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
//!   endpoint requests a random one of its own (see "Keys"), drawing again while the domain
//!   answers that it is in use.
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
//! [`register_shared`](crate::endpoint::LibfabricEndpoint::register_shared)) holds an `Arc` of it, so it
//! cannot outlive the domain it is registered in.
//! Its memory and registration are shared (an `Arc`) with every operation in flight on it:
//! dropping the `MemoryRegion` while this endpoint's own write or read is in flight leaves both
//! alive until the operation's completion has been read, and only then closes the registration.
//! Its memory is then *parked* by the endpoint (next section), never freed while the endpoint is
//! open.
//!
//! # Memory a peer may still reach: parking
//!
//! A peer's `fi_write` into a region, or `fi_read` from it, completes only at the peer: this
//! endpoint never sees a completion for it, so no order of drops in this process can wait for
//! it. What happens to such a transfer when the region's registration is closed is the
//! provider's:
//!
//! - **Software providers** (tcp, sockets, and rxm over either; libfabric 1.17 and 2.6.0) check a
//!   peer's transfer once, when its header arrives (`ofi_mr_verify`, in
//!   `prov/tcp/src/xnet_progress.c`'s `xnet_handle_write` and `xnet_handle_read_req`), and keep
//!   the buffer's address in the transfer (`rx_entry->iov`, the read response's `iov`). The data
//!   then moves through those raw pointers over later progress calls, for as long as the peer
//!   keeps sending or receiving. `fi_close` of the registration removes the key from the
//!   domain's map, which refuses *new* transfers, but touches no transfer already admitted.
//!   Measured on 1.17 (`tests/rma_edges.rs`, before parking): 8 MiB written by a peer landed in
//!   an unrelated `Vec` allocated after the region was dropped, and a peer's read was answered
//!   with unrelated memory.
//! - **fi_mr(3)** (2.6.0 `man/fi_mr.3.md`, "fi_close") promises no more for any provider:
//!   "Active or queued operations that reference a memory region being closed may attempt to
//!   access an invalid memory region and fail [...] Applications are responsible for ensuring
//!   that a MR is no longer needed prior to closing it." Only *new* accesses from a remote peer
//!   are promised to fail.
//! - **Hardware registration** (verbs, efa) would stop the NIC: `ibv_dereg_mr` destroys the
//!   device's memory key before the kernel unpins the pages. But libfabric puts `fi_mr_reg`
//!   behind its registration cache on both (2.6.0 `prov/verbs/src/verbs_mr.c`,
//!   `vrb_mr_cache_reg`; its `fi_close` is `ofi_mr_cache_delete`, which may keep the device
//!   registration, and so the old key, alive), efa emulates some RMA protocols in software
//!   through its own copies, and `fi_efa(7)`'s `FI_EFA_TRACK_MR` only *warns* when an MR is
//!   closed while operations still reference it. No libfabric document guarantees, for any
//!   provider, that a closed registration's memory is no longer accessed.
//!
//! So on every provider the endpoint parks a dropped region's memory: the registration is
//! closed at once (new transfers under its key fail at the peer), and the buffer goes to the
//! endpoint's pool, which frees it only when the endpoint itself drops, after its `fid_ep`,
//! queues, address vector, domain and fabric have been closed (the pool is owned by the
//! endpoint's operations, a field declared after its handles): with the domain closed, no
//! transfer of the provider's remains. There is no provider for which the endpoint frees at
//! once, because none documents that it may.
//!
//! ## Reuse, and what it risks
//!
//! A server that registers and drops regions in a loop must not grow without bound, so a parked
//! buffer is reused by a later registration of the same endpoint whose length falls in the
//! same size class (buffers are allocated at a class's capacity: the length rounded up to a
//! quarter of its power of two, so at most 25% larger, and at least 64 bytes). The new region
//! gets the buffer zeroed, registered under a new random key (see "Keys").
//!
//! Reuse is sound for *memory*: a transfer admitted under the old registration can reach only
//! bytes inside that buffer (the provider checked it against the old region, whose length is at
//! most the capacity; libfabric's unchecked `addr + len`, in the README, is the one exception and
//! needs a valid key), which the pool owns for as long as the provider may run, and which this
//! crate only ever touches through byte copies (see "Contents"; the zeroing for the new region is
//! one more), never through a reference. No allocation outside the pool can be written or
//! leaked, which is what freeing the buffer at the drop allowed.
//!
//! Reuse cannot be argued sound for the *contents* while the endpoint is open: no condition this
//! process can observe proves that a peer's transfer admitted before the drop has finished (it
//! finishes when the peer has sent, or drained, all its bytes, which a stalled peer never does).
//! A stale transfer that is still moving bytes when its buffer is reused writes into, or reads
//! from, the new region, although its key is not the new region's. As a mitigation, a parked
//! buffer is reused only after [`QUARANTINE`] more buffers of its class have been parked after
//! it (a quarantine by count, which needs no progress and no clock), so a drop followed at once
//! by a registration of the same size never gets the buffer just dropped. That narrows the
//! window; it does not close it. An application that needs the guarantee keeps a region
//! registered until its peers have confirmed (on their own messages) that they are done with it.
//!
//! What parking costs: [`parked_memory`](crate::endpoint::LibfabricEndpoint::parked_memory) bytes, until
//! reused or until the endpoint drops. A buffer is allocated only while its class has at most
//! [`QUARANTINE`] parked, so a class never holds more buffers (alive and parked together) than
//! the most regions of that class ever alive at once, plus [`QUARANTINE`]: parked memory is
//! bounded by the peak of registered memory, plus the quarantine, plus 25% for the classes.
//!
//! # Keys
//!
//! Where the endpoint chooses the key (no `FI_MR_PROV_KEY`), each registration requests a fresh
//! random 64-bit key (retrying `-FI_ENOKEY`, a key already in use, up to [`KEY_ATTEMPTS`]
//! times): one endpoint's descriptor is not valid at another whose regions have the same shape,
//! and a peer cannot guess a key it was not given. The source is one `std` `RandomState` per
//! endpoint hashing a counter: a SipHash under a 128-bit key that `std` draws from the operating
//! system's random source (`getrandom(2)`, once per thread, then stepped for each new
//! `RandomState`). No new dependency, no file descriptor, no failure path, a few nanoseconds per
//! key, and the outputs are unpredictable to anyone who does not hold that key, which never
//! leaves the process. It is a keyed hash (SipHash-1-3 today), not a CSPRNG: the defence it gives
//! is against guessing, which is what a key is for here. (Reading `/dev/urandom` per key would
//! cost a file descriptor or three system calls per registration, and can fail; `getrandom(2)`
//! through `libc` would be a new dependency.)
//!
//! # Contents
//!
//! A registered buffer is written by peers, and by the provider on behalf of local reads, at
//! times this process does not choose. So the bytes of a region peers may reach (every region of
//! `register`, and the application's buffers registered [`Exposure::Remote`]) are only ever
//! copied in and out ([`MemoryRegion::write_bytes`], [`MemoryRegion::read_bytes`]), never lent
//! out as a slice in safe code: a copy taken while a transfer lands may mix old and new bytes, and
//! the application tells a complete record from a torn one (a checksum, a sequence written last),
//! as it must on any RDMA NIC. A buffer registered [`Exposure::Local`] is reached by no peer, and
//! lends slices while no operation of this endpoint holds it (see [`buffer`](super::buffer)).

use std::alloc::{self, Layout};
use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::access::AccessWord;
pub use super::buffer::{Exposure, MemoryInterface, PooledBuffer, RegionSlice, StableBuffer};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

/// The longest region [`register`](crate::endpoint::LibfabricEndpoint::register) accepts: 1 TiB.
///
/// libfabric's `fi_info` gives no limit on a registration's length: `domain_attr.mr_iov_limit`
/// counts the pieces of one registration (1 on tcp), and `ep_attr.max_msg_size` bounds one
/// transfer, not a region (`SIZE_MAX` on tcp;ofi_rxm; a larger region is still used in slices).
/// So the bound is this documented ceiling, far above any buffer a data-transfer server
/// registers and far below the sizes whose arithmetic overflows; a length under it that the
/// system cannot allocate is an error too, never an abort.
pub const MAX_REGION_LEN: usize = 1 << 40;

/// How many more buffers of a size class are parked after a dropped region's before its memory
/// is reused (see the module docs, "Reuse, and what it risks").
pub const QUARANTINE: usize = 2;

/// How many random keys registration tries when the provider answers `-FI_ENOKEY` (the key is
/// in use in the domain) before it gives up with that error.
pub const KEY_ATTEMPTS: usize = 8;

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
struct Buffer {
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
                "could not allocate {capacity} bytes for a memory region: the system refused"
            ))
        };
        let layout = Layout::from_size_align(capacity, align).map_err(|_| refused())?;
        // SAFETY: `layout` has a non-zero size (`capacity` is at least `MIN_CAPACITY`).
        let start = unsafe { alloc::alloc_zeroed(layout) };
        let start = NonNull::new(start).ok_or_else(refused)?;
        Ok(Self { start, layout })
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
/// the endpoint, its queues and its domain have closed. See the module docs.
#[derive(Default)]
pub(crate) struct Pool {
    classes: Mutex<BTreeMap<usize, VecDeque<Buffer>>>,
    /// Buffers the application handed in (`register_buffer`, `Exposure::Remote`), parked when
    /// their region dropped: never reused, dropped (their own `Drop` run) with the pool.
    owned: Mutex<Vec<Box<dyn Any + Send>>>,
    /// The bytes parked now: the capacities of every buffer in `classes`.
    parked: AtomicUsize,
}

impl Pool {
    /// Bytes parked now.
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::Acquire)
    }

    /// A buffer for a region of `len` bytes: a parked one of its class past the quarantine,
    /// with its first `len` bytes zeroed, else a fresh one.
    fn take(&self, len: usize) -> Result<Buffer, DmaError> {
        let capacity = capacity_for(len).ok_or_else(|| {
            DmaError::InvalidArgument(format!("a region of {len} bytes overflows its size class"))
        })?;
        let reused = {
            let mut classes = crate::sync::lock(&self.classes);
            let reused = match classes.get_mut(&capacity) {
                Some(parked) if parked.len() > QUARANTINE => parked.pop_front(),
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
        // SAFETY: `len` is at most the buffer's capacity (its class's); the pool owns the bytes,
        // and a stale transfer writing them meanwhile only tears them (module docs).
        unsafe { ptr::write_bytes(buffer.start.as_ptr(), 0, len) };
        Ok(buffer)
    }

    /// Keep the application's `buffer` of `len` bytes until the endpoint closes.
    fn park_owned(&self, buffer: Box<dyn Any + Send>, len: usize) {
        let mut owned = crate::sync::lock(&self.owned);
        owned.push(buffer);
        self.parked.fetch_add(len, Ordering::AcqRel);
    }

    /// Keep `buffer` until the endpoint closes, or until a later registration reuses it.
    fn park(&self, buffer: Buffer) {
        let capacity = buffer.capacity();
        let mut classes = crate::sync::lock(&self.classes);
        classes.entry(capacity).or_default().push_back(buffer);
        self.parked.fetch_add(capacity, Ordering::AcqRel);
    }
}

/// The memory a registration covers.
enum Memory {
    /// The endpoint's own, from its pool: parked there again on drop.
    Pooled(Buffer),
    /// The application's buffer (a `Box<B>` of the `StableBuffer` it handed in), registered in
    /// place: its bytes never moved, and the box only keeps it, and its `Drop`, alive.
    Owned(Box<dyn Any + Send>),
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
    key: u64,
    /// What a peer adds an offset to: the virtual address under `FI_MR_VIRT_ADDR`, else 0.
    remote_base: u64,
    /// The first byte of `memory`.
    buffer: *mut u8,
    /// The registered length, at most `memory`'s capacity.
    len: usize,
    /// The memory: the pool's, handed back to `pool` in `Drop`, or the application's (see
    /// `buffer`); `None` inside `Drop`, and for a registration of another's memory (`shares`).
    memory: Memory,
    /// Whether peers may reach the memory (`Remote`), or only this endpoint's own operations.
    exposure: Exposure,
    /// Where the memory lives: host, or a device.
    interface: MemoryInterface,
    /// For memory that lends slices (`Local` host memory): the slices lent and the operations
    /// holding the memory, in one word so that neither can start while the other is there (see
    /// `access`). Kept by the registration that owns the memory, and reached through `shares`
    /// from one that registers it again.
    access: AccessWord,
    /// The registration whose memory this one registers again in another domain (a rail set's
    /// region), held for as long as this one lives.
    shares: Option<Arc<Registration>>,
    /// The endpoint's pool.
    pool: Arc<Pool>,
    /// The domain it is registered in, so an endpoint refuses another endpoint's region.
    domain: *mut sys::fid_domain,
}

// SAFETY: the registration is an object of an `FI_THREAD_SAFE` domain, usable from any thread;
// the memory is only touched through raw copies (module docs: its bytes are plain `u8`, for which
// any value is valid) and handed to the pool once, by whichever holder drops last.
unsafe impl Send for Registration {}
// SAFETY: as for `Send`; shared access is copies of plain bytes and reads of fields that never
// change after registration, and `mr` is an atomic.
unsafe impl Sync for Registration {}

impl Registration {
    /// Register `len` bytes of zeroed memory from `pool` in `domain`, honouring `mr_mode`, under
    /// a key from `keys` (unless the provider chooses it), drawing another while the provider
    /// answers `-FI_ENOKEY`, up to [`KEY_ATTEMPTS`] keys.
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
            return Err(DmaError::InvalidArgument(
                "a memory region must be at least one byte long".into(),
            ));
        }
        if len > MAX_REGION_LEN {
            return Err(DmaError::InvalidArgument(format!(
                "a memory region of {len} bytes is longer than the {MAX_REGION_LEN}-byte bound \
                 (MAX_REGION_LEN)"
            )));
        }
        refuse_raw_keys(mr_mode)?;
        let memory = pool.take(len)?;
        let buffer = memory.start.as_ptr();
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
    /// at `start`, with `exposure`'s access flags, through `fi_mr_regattr` when `interface` is
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
        (start, len): (*mut u8, usize),
        (exposure, interface): (Exposure, MemoryInterface),
        pool: &Arc<Pool>,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        if 0 == len || len > MAX_REGION_LEN {
            return Err(DmaError::InvalidArgument(format!(
                "a buffer of {len} bytes cannot be registered: a region is 1 to {MAX_REGION_LEN} \
                 bytes (MAX_REGION_LEN)"
            )));
        }
        if start.is_null() {
            return Err(DmaError::InvalidArgument(
                "the buffer's pointer is null".into(),
            ));
        }
        refuse_raw_keys(mr_mode)?;
        let registration = Self {
            mr: AtomicPtr::new(ptr::null_mut()),
            desc: ptr::null_mut(),
            key: 0,
            remote_base: 0,
            buffer: start,
            len,
            memory: Memory::Owned(buffer),
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
        self,
        ep: *mut sys::fid_ep,
        mr_mode: i32,
        keys: &mut dyn FnMut() -> u64,
    ) -> Result<Self, DmaError> {
        let (domain, buffer, len) = (self.domain, self.buffer, self.len);
        let (exposure, interface) = (self.exposure, self.interface);
        let mut registration = self;
        let access = match exposure {
            Exposure::Remote => {
                u64::from(sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE)
            }
            // The local side of this endpoint's own RMA only: no flag a peer's transfer needs,
            // so the provider admits none (`-FI_EACCES`). Not FI_SEND or FI_RECV either: rxm
            // turns them into FI_REMOTE_READ and FI_REMOTE_WRITE, for its rendezvous protocol,
            // in which the peer reads or writes the buffer.
            Exposure::Local => u64::from(sys::FI_READ | sys::FI_WRITE),
        };
        let provider_keys = 0 != mr_mode & sys::FI_MR_PROV_KEY as i32;
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let mut requested_key = 0;
        for attempt in 1..=KEY_ATTEMPTS {
            requested_key = if provider_keys { 0 } else { keys() };
            // SAFETY: the domain is open (the caller's promise); `buffer` holds at least `len`
            // bytes, owned by `registration` until it drops, which closes the registration
            // first and then only parks them; `mr` receives one object, owned by `registration`
            // from here on (its `Drop` closes it).
            let code = unsafe {
                match interface.hmem() {
                    None => sys::fi_mr_reg(
                        domain,
                        buffer.cast_const().cast(),
                        len,
                        access,
                        0,
                        requested_key,
                        0,
                        &raw mut mr,
                        ptr::null_mut(),
                    ),
                    // `fi_mr_regattr` through the shim, which builds the `fi_mr_attr` (its
                    // layout differs between libfabric 1.x and 2.x).
                    Some((iface, device)) => sys::fi_mr_reg_iface(
                        domain,
                        buffer.cast_const().cast(),
                        len,
                        access,
                        requested_key,
                        iface,
                        device,
                        &raw mut mr,
                    ),
                }
            };
            if 0 == code {
                break;
            }
            if code != -(sys::FI_ENOKEY as i32) || provider_keys || KEY_ATTEMPTS == attempt {
                let call = match interface.hmem() {
                    None => "fi_mr_reg",
                    Some(_) => "fi_mr_regattr",
                };
                return Err(DmaError::fabric(call, code.into()));
            }
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
        registration.key = if provider_keys { key } else { requested_key };
        if Exposure::Local == exposure {
            // No key a peer could use: libfabric's own software registration gives none
            // (FI_KEY_NOTAVAIL) to a registration without remote access.
            registration.key = u64::MAX;
        } else if u64::MAX == registration.key {
            // FI_KEY_NOTAVAIL is `(uint64_t) -1`, a cast bindgen does not evaluate.
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

    /// The registration that owns the memory, and so keeps its `access` word.
    fn keeper(&self) -> &Registration {
        self.shares.as_deref().unwrap_or(self)
    }

    /// Whether the memory lends slices (`Local` host memory the application handed in), and so
    /// counts its operations.
    pub(crate) fn lends_slices(&self) -> bool {
        let keeper = self.keeper();
        Exposure::Local == keeper.exposure
            && keeper.interface.is_host()
            && matches!(keeper.memory, Memory::Owned(_))
    }

    /// Hold the memory for one operation, until the returned hold drops (when the operation's
    /// completion has been read).
    ///
    /// # Errors
    /// [`DmaError::Busy`] while a slice of the memory is lent out ([`MemoryRegion::as_slice`]):
    /// nothing is held then.
    pub(crate) fn hold(self: &Arc<Self>) -> Result<OperationHold, DmaError> {
        let counted = self.lends_slices();
        if counted && !self.keeper().access.try_hold() {
            return Err(DmaError::Busy);
        }
        Ok(OperationHold {
            region: Arc::clone(self),
            counted,
        })
    }

    /// Lend one shared slice: [`DmaError::Busy`] while an operation holds the memory.
    pub(crate) fn lend_slice(&self) -> Result<(), DmaError> {
        if self.keeper().access.try_lend() {
            Ok(())
        } else {
            Err(DmaError::Busy)
        }
    }

    /// Give back a slice lent by [`lend_slice`](Self::lend_slice).
    pub(crate) fn return_slice(&self) {
        self.keeper().access.return_lend();
    }

    /// Whether an operation holds the memory now (Acquire: when not, every completed
    /// operation's bytes are visible).
    pub(crate) fn operations_hold(&self) -> bool {
        self.keeper().access.held()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Close the registration and hand out the application's buffer, if it is a `B`: for the
    /// last holder only. Anything else comes back unchanged, registration open.
    pub(crate) fn into_owned<B: 'static>(mut self) -> Result<B, Self> {
        match std::mem::replace(&mut self.memory, Memory::None) {
            Memory::Owned(buffer) => match buffer.downcast::<B>() {
                Ok(buffer) => {
                    self.close_registration();
                    Ok(*buffer)
                }
                Err(buffer) => {
                    self.memory = Memory::Owned(buffer);
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
                "{len} bytes at offset {offset} do not fit a {}-byte region",
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
             support"
                .into(),
        ));
    }
    Ok(())
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.close_registration();
        // Parked, not freed: a peer's transfer admitted before the close may still move bytes
        // through it (module docs); the pool frees it after the endpoint has closed.
        match std::mem::replace(&mut self.memory, Memory::None) {
            Memory::Pooled(memory) => self.pool.park(memory),
            // A peer may still move bytes through it: parked until the endpoint closes.
            Memory::Owned(buffer) if Exposure::Remote == self.exposure => {
                self.pool.park_owned(buffer, self.len);
            }
            // No peer could reach it (no remote access), and no operation holds it (this is the
            // last holder): the application's `Drop` runs now.
            Memory::Owned(buffer) => drop(buffer),
            Memory::None => {}
        }
    }
}

/// The memory of one operation in flight, held until its completion has been read: the
/// registration (and so the memory) lives at least that long, and, for memory that lends slices,
/// no slice can be lent meanwhile.
pub(crate) struct OperationHold {
    region: Arc<Registration>,
    /// Whether the hold is counted in the memory's `access` word.
    counted: bool,
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

/// A registered buffer of this process: the local side of this endpoint's RMA operations and,
/// unless registered [`Exposure::Local`], memory peers may write into and read from.
///
/// Made by [`LibfabricEndpoint::register`](crate::endpoint::LibfabricEndpoint::register) (the endpoint's
/// own memory, `B` = [`PooledBuffer`]) or
/// [`register_buffer`](crate::endpoint::LibfabricEndpoint::register_buffer) (the application's buffer `B`,
/// registered in place); it borrows that endpoint. Dropping it while an operation on it is in
/// flight is safe: the memory and the registration live until the operation's completion has
/// been read. Memory a peer may reach is then parked by the endpoint, not freed, since a peer's
/// transfer may still reach it ([`parked_memory`](crate::endpoint::LibfabricEndpoint::parked_memory)). See
/// the [module docs](self) and [`buffer`](super::buffer) for the application's memory.
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
pub struct MemoryRegion<'ep, B = PooledBuffer> {
    pub(crate) inner: Arc<Registration>,
    /// The endpoint, for a region made by
    /// [`register_shared`](crate::endpoint::LibfabricEndpoint::register_shared): declared after `inner`, so
    /// the registration goes before the endpoint can. Held for its `Drop`.
    #[allow(dead_code)]
    owner: Option<Arc<crate::endpoint::LibfabricEndpoint>>,
    endpoint: PhantomData<&'ep ()>,
    /// The type of the memory, for [`into_buffer`](Self::into_buffer); `fn() -> B` so that the
    /// region is `Sync` whatever `B` is (no `&B` is ever lent).
    buffer: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for MemoryRegion<'_, B> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("MemoryRegion")
            .field("len", &self.inner.len)
            .field("exposure", &self.inner.exposure)
            .field("interface", &self.inner.interface)
            .field("remote", &self.remote())
            .finish_non_exhaustive()
    }
}

impl MemoryRegion<'_> {
    /// The same region, keeping `owner` (its endpoint) alive instead of borrowing it.
    pub(crate) fn owned_by(
        self,
        owner: Arc<crate::endpoint::LibfabricEndpoint>,
    ) -> MemoryRegion<'static> {
        MemoryRegion {
            inner: self.inner,
            owner: Some(owner),
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }
}

impl<'ep, B> MemoryRegion<'ep, B> {
    pub(crate) fn new(registration: Registration) -> Self {
        Self {
            inner: Arc::new(registration),
            owner: None,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region, its buffer type forgotten: for a rail set, which keeps every rail's
    /// registration as the library's own type.
    pub(crate) fn erase(self) -> MemoryRegion<'ep> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region, typed again as holding a `C` (checked when the buffer is handed out).
    pub(crate) fn retype<C>(self) -> MemoryRegion<'ep, C> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// Its parts, for [`into_buffer`](Self::into_buffer) and friends.
    pub(crate) fn into_parts(
        self,
    ) -> (
        Arc<Registration>,
        Option<Arc<crate::endpoint::LibfabricEndpoint>>,
    ) {
        (self.inner, self.owner)
    }

    /// A region from [`into_parts`](Self::into_parts)' parts.
    pub(crate) fn from_parts(
        inner: Arc<Registration>,
        owner: Option<Arc<crate::endpoint::LibfabricEndpoint>>,
    ) -> Self {
        Self {
            inner,
            owner,
            endpoint: PhantomData,
            buffer: PhantomData,
        }
    }

    /// The same region with its borrow of the endpoint erased: for a rail set's region that keeps
    /// its rail set alive through an `Arc` instead.
    ///
    /// # Safety
    /// The endpoint this region is registered with outlives the returned region.
    pub(crate) unsafe fn unbind(self) -> MemoryRegion<'static, B> {
        MemoryRegion {
            inner: self.inner,
            owner: self.owner,
            endpoint: PhantomData,
            buffer: PhantomData,
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

    /// Whether peers may reach it ([`Exposure::Remote`]; every region of
    /// [`register`](crate::endpoint::LibfabricEndpoint::register)) or only this endpoint's own operations.
    pub fn exposure(&self) -> Exposure {
        self.inner.exposure
    }

    /// Where its memory lives: host memory, or a device's.
    pub fn interface(&self) -> MemoryInterface {
        self.inner.interface
    }

    /// What a peer needs to write into or read from this whole region. A region registered
    /// [`Exposure::Local`] has no remote access and no key: its key here is `FI_KEY_NOTAVAIL`
    /// (`u64::MAX`), and the provider refuses a peer's transfer under it.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            address: self.inner.remote_base,
            key: self.inner.key,
            len: self.inner.len as u64,
        }
    }

    /// `len` bytes at `offset`, as the local side of a [`write`](crate::endpoint::LibfabricEndpoint::write)
    /// (the source) or a [`read`](crate::endpoint::LibfabricEndpoint::read) (the destination).
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
    /// [`DmaError::InvalidArgument`] when it does not fit, for device memory (host code cannot
    /// copy into it), and for a region registered [`Exposure::Local`] (written through
    /// [`as_mut_slice`](Self::as_mut_slice), which the borrow checker and the region keep apart
    /// from slices lent out); nothing is copied.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), DmaError> {
        self.check_copy()?;
        if self.inner.lends_slices() {
            return Err(DmaError::InvalidArgument(
                "a Local region is written through as_mut_slice, not write_bytes".into(),
            ));
        }
        self.inner.check_range(offset, data.len())?;
        // SAFETY: the range is inside the buffer (checked), which lives as long as `self`; the
        // bytes are plain `u8` in host memory (checked), a region that lends no slices has none
        // lent, and a transfer landing meanwhile may only tear them (module docs), which a copy
        // of bytes tolerates.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.inner.at(offset), data.len()) };
        Ok(())
    }

    /// Copy the region's bytes at `offset` into `out`.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the range does not fit, and for device memory; nothing
    /// is copied.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), DmaError> {
        self.check_copy()?;
        self.inner.check_range(offset, out.len())?;
        // SAFETY: as in `write_bytes`, in the other direction (reading while slices are lent is
        // reading shared bytes).
        unsafe { ptr::copy_nonoverlapping(self.inner.at(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Host code copies only host memory.
    fn check_copy(&self) -> Result<(), DmaError> {
        if self.inner.interface.is_host() {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "the region is device memory ({:?}): host code cannot copy it",
                self.inner.interface
            )))
        }
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
    /// [`DmaError::InvalidArgument`] for an empty range, one that does not fit, or one whose
    /// address plus length overflows (libfabric's `ofi_mr_map_verify` adds them unchecked; see
    /// the README's RMA section).
    ///
    /// ```
    /// use dma_libfabric::RemoteRegion;
    ///
    /// // Built by hand (the fields are public), so `from_bytes` never checked it.
    /// let wrapping = RemoteRegion { address: u64::MAX - 15, key: 1, len: 64 };
    /// assert!(wrapping.slice(0, 8).is_ok(), "ends below 2^64");
    /// assert!(wrapping.slice(8, 8).is_err(), "ends at 2^64: address + len overflows");
    /// assert!(wrapping.slice(16, 8).is_err(), "starts past the end of the address space");
    /// ```
    pub fn slice(&self, offset: u64, len: u64) -> Result<Self, DmaError> {
        let end = offset.checked_add(len);
        let address = self.address.checked_add(offset);
        match (end, address) {
            (Some(end), Some(address))
                if 0 < len && end <= self.len && address.checked_add(len).is_some() =>
            {
                Ok(Self {
                    address,
                    key: self.key,
                    len,
                })
            }
            _ => Err(DmaError::InvalidArgument(format!(
                "{len} bytes at offset {offset} do not fit a {}-byte remote region at {:#x}, or \
                 their end overflows",
                self.len, self.address
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
    /// another; it gives up after `KEY_ATTEMPTS`.
    #[test]
    fn a_key_in_use_is_retried_with_another() {
        let endpoint = endpoint();
        let taken = register(&endpoint, 0, 77).expect("registered");
        endpoint
            .operations
            .forced_keys
            .lock()
            .expect("not poisoned")
            .extend([77, 77, 78]);
        let region = endpoint.register(64).expect("registered on the third key");
        assert_eq!(78, region.remote().key);

        endpoint
            .operations
            .forced_keys
            .lock()
            .expect("not poisoned")
            .extend([77; KEY_ATTEMPTS]);
        match endpoint.register(64) {
            Err(DmaError::Fabric { call, code, .. }) => {
                assert_eq!("fi_mr_reg", call);
                assert_eq!(-i64::from(sys::FI_ENOKEY), code);
            }
            other => panic!("expected -FI_ENOKEY after {KEY_ATTEMPTS} keys: {other:?}"),
        }
        drop(taken);
    }

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

    /// A dropped region's memory is parked, reused only past the quarantine, and zeroed.
    #[test]
    fn dropped_memory_is_parked_then_reused_zeroed_past_the_quarantine() {
        let endpoint = endpoint();
        let mut starts = Vec::new();
        for _ in 0..=QUARANTINE {
            let region = endpoint.register(4096).expect("registered");
            region.write_bytes(0, &[0xab; 4096]).expect("fits");
            starts.push(region.inner.buffer as usize);
            drop(region);
        }
        assert_eq!((QUARANTINE + 1) * 4096, endpoint.parked_memory());
        let mut sorted = starts.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            starts.len(),
            sorted.len(),
            "none reused inside the quarantine"
        );

        let reused = endpoint.register(4000).expect("registered");
        assert_eq!(
            starts[0], reused.inner.buffer as usize,
            "the oldest is reused"
        );
        assert_eq!(QUARANTINE * 4096, endpoint.parked_memory());
        let mut seen = vec![0xff; 4000];
        reused.read_bytes(0, &mut seen).expect("in range");
        assert!(
            seen.iter().all(|&byte| 0 == byte),
            "zeroed for its new owner"
        );
    }
}
