//! A safe libfabric reliable-datagram endpoint.
//!
//! [`LibfabricEndpoint::open`] walks the configured providers in order and opens, for the first
//! that offers an `FI_EP_RDM` endpoint: the fabric, a domain with `FI_THREAD_SAFE` threading (so
//! many threads post on one endpoint), an `FI_AV_TABLE` address vector sized to
//! `Configuration::av_capacity`, one completion queue for transmits and one for receives, and
//! the enabled endpoint. It owns an [`AddressCache`] over that address vector, which posting
//! threads use to turn peer addresses into `fi_addr_t`s.
//!
//! Guarantees:
//! - Dropping the endpoint first drops its cache, which runs every pending `fi_av_remove`, and
//!   only then closes the endpoint, the queues, the address vector, the domain and the fabric,
//!   in that order. Nothing is leaked, file descriptors included.
//! - Receive buffers are owned by the endpoint and outlive its libfabric objects.
//! - A failure part-way through `open` closes what was opened and reports which call failed.
//! - RMA operations in flight (see [`rma`]) hold their lease and local memory until their
//!   completion has been read; dropping the endpoint drains them, or abandons them after closing
//!   the endpoint, before the cache and the domain close.

mod av;
mod handles;
pub mod memory;
mod receive;
pub mod rma;

use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::time::{Duration, Instant};

pub use self::av::FabricAv;
use self::handles::Handles;
pub use self::memory::{MemoryRegion, RemoteRegion, Segment};
use self::receive::ReceiveSlots;
pub use self::rma::{Completion, MAX_OPERATIONS, Operation};
use crate::cache::AddressCache;
use crate::configuration::{Configuration, Provider};
use crate::error::DmaError;
use crate::sys;

/// What `fi_getinfo` chose, as [`LibfabricEndpoint::describe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The provider name, e.g. `tcp;ofi_rxm`.
    pub provider: String,
    /// The fabric name, e.g. `127.0.0.1/32`.
    pub fabric: String,
    /// The domain name, e.g. `lo`.
    pub domain: String,
    /// `fi_info.addr_format` (`FI_SOCKADDR_IN`, `FI_ADDR_EFA`, ...).
    pub addr_format: u32,
    /// The provider's address length in bytes: what `fi_av_insert` reads per address.
    pub address_len: usize,
    /// The domain's threading model (`FI_THREAD_SAFE` here).
    pub threading: u32,
    /// The address vector type (`FI_AV_TABLE` here).
    pub av_type: u32,
    /// The largest message [`LibfabricEndpoint::send`] takes (`tx_attr.inject_size`).
    pub inject_size: usize,
}

/// A reliable-datagram endpoint with its address vector, completion queues and address cache.
///
/// ```
/// use dma_libfabric::{Configuration, LibfabricEndpoint};
///
/// let endpoint = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
/// assert_eq!("tcp;ofi_rxm", endpoint.describe().provider);
/// assert_eq!(16, endpoint.local_address()?.len()); // a sockaddr_in
/// # Ok::<(), dma_libfabric::DmaError>(())
/// ```
pub struct LibfabricEndpoint {
    /// Dropped by hand, first, in `Drop`: its writer removes every entry before the AV closes.
    peers: ManuallyDrop<AddressCache>,
    handles: Handles,
    /// Declared after `handles` so it is dropped after the endpoint has been closed.
    receives: ReceiveSlots,
    description: Description,
    /// RMA operations in flight (see `rma`): drained in `Drop` before the cache goes, and
    /// declared after `handles` so their contexts outlive the endpoint.
    operations: Box<rma::Operations>,
}

// SAFETY: the domain is opened with FI_THREAD_SAFE, so libfabric serialises concurrent calls on
// the endpoint, its queues and its address vector itself. Receive slots are handed between
// threads only through completions (see `receive`), and every other field is immutable after
// `open`.
unsafe impl Send for LibfabricEndpoint {}
// SAFETY: as for `Send`.
unsafe impl Sync for LibfabricEndpoint {}

impl std::fmt::Debug for LibfabricEndpoint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("LibfabricEndpoint")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl LibfabricEndpoint {
    /// Open an endpoint with the first of `configuration.providers` that gives a
    /// reliable-datagram endpoint, on `node` (or `configuration.bind` when `node` is `None`).
    ///
    /// # Errors
    /// [`DmaError::NoProvider`], naming each provider tried and why it was turned down, when none
    /// works; [`DmaError::Fabric`] when a later libfabric call fails;
    /// [`DmaError::InvalidArgument`] for an empty provider list, a zero capacity or a node with a
    /// NUL byte.
    pub fn open(configuration: &Configuration, node: Option<&str>) -> Result<Self, DmaError> {
        if configuration.providers.is_empty() {
            return Err(DmaError::InvalidArgument("no providers configured".into()));
        }
        if 0 == configuration.av_capacity || 0 == configuration.receive_buffers {
            return Err(DmaError::InvalidArgument(
                "av_capacity and receive_buffers must be at least 1".into(),
            ));
        }
        let node = node.or(configuration.bind.as_deref());
        let node = node
            .map(CString::new)
            .transpose()
            .map_err(|_| DmaError::InvalidArgument("the node has a NUL byte".into()))?;

        let mut tried = Vec::new();
        for &provider in &configuration.providers {
            match Self::open_with(configuration, provider, node.as_deref()) {
                Ok(endpoint) => return Ok(endpoint),
                Err(error) => {
                    tracing::debug!(%provider, %error, "provider turned down");
                    tried.push(format!("{provider}: {error}"));
                }
            }
        }
        Err(DmaError::NoProvider {
            tried: tried.join("; "),
        })
    }

    fn open_with(
        configuration: &Configuration,
        provider: Provider,
        node: Option<&CStr>,
    ) -> Result<Self, DmaError> {
        let mut handles = Handles::new();
        let info = getinfo(configuration, provider, node)?;
        handles.info = info;

        // SAFETY: `info` is the non-null list head fi_getinfo returned; its attribute pointers
        // are filled in by the provider for every entry.
        let description = unsafe { describe(info) };

        // SAFETY: every call below receives objects opened just above and still open (owned by
        // `handles`, which closes them on any early return), out-pointers to fields of
        // `handles`, and attribute structs that live across the call. `info` stays alive until
        // `handles` drops.
        let tx_cq_size = unsafe {
            check(
                "fi_fabric",
                sys::fi_fabric(
                    (*info).fabric_attr,
                    &raw mut handles.fabric,
                    ptr::null_mut(),
                ),
            )?;
            check(
                "fi_domain",
                sys::fi_domain(
                    handles.fabric,
                    info,
                    &raw mut handles.domain,
                    ptr::null_mut(),
                ),
            )?;

            let mut av_attr = sys::fi_av_attr {
                type_: sys::FI_AV_TABLE,
                count: configuration.av_capacity,
                ..Default::default()
            };
            check(
                "fi_av_open",
                sys::fi_av_open(
                    handles.domain,
                    &raw mut av_attr,
                    &raw mut handles.av,
                    ptr::null_mut(),
                ),
            )?;

            let mut cq_attr = sys::fi_cq_attr {
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: sys::FI_WAIT_NONE,
                size: configuration.receive_buffers.max(64) * 2,
                ..Default::default()
            };
            check(
                "fi_cq_open",
                sys::fi_cq_open(
                    handles.domain,
                    &raw mut cq_attr,
                    &raw mut handles.tx_cq,
                    ptr::null_mut(),
                ),
            )?;
            check(
                "fi_cq_open",
                sys::fi_cq_open(
                    handles.domain,
                    &raw mut cq_attr,
                    &raw mut handles.rx_cq,
                    ptr::null_mut(),
                ),
            )?;

            check(
                "fi_endpoint",
                sys::fi_endpoint(handles.domain, info, &raw mut handles.ep, ptr::null_mut()),
            )?;
            check(
                "fi_ep_bind",
                sys::fi_ep_bind(handles.ep, &raw mut (*handles.av).fid, 0),
            )?;
            check(
                "fi_ep_bind",
                sys::fi_ep_bind(
                    handles.ep,
                    &raw mut (*handles.tx_cq).fid,
                    sys::FI_TRANSMIT.into(),
                ),
            )?;
            check(
                "fi_ep_bind",
                sys::fi_ep_bind(
                    handles.ep,
                    &raw mut (*handles.rx_cq).fid,
                    sys::FI_RECV.into(),
                ),
            )?;
            check("fi_enable", sys::fi_enable(handles.ep))?;
            cq_attr.size
        };

        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let operations =
            Box::new(unsafe { rma::Operations::new(info, configuration.rma, tx_cq_size) });
        let receives = ReceiveSlots::new(configuration.receive_buffers, configuration.receive_size);
        let backend = FabricAv::new(
            handles.av,
            description.addr_format,
            description.address_len,
            configuration.av_capacity,
        );
        let endpoint = Self {
            peers: ManuallyDrop::new(AddressCache::with_backend(backend)),
            handles,
            receives,
            description,
            operations,
        };
        for index in 0..endpoint.receives.len() {
            endpoint.post_receive(index)?;
        }
        tracing::debug!(provider = %endpoint.description.provider, fabric = %endpoint.description.fabric, "endpoint open");
        Ok(endpoint)
    }

    /// The cache of address-vector entries that posting threads resolve peers through.
    pub fn peers(&self) -> &AddressCache {
        &self.peers
    }

    /// What the provider chose.
    pub fn describe(&self) -> &Description {
        &self.description
    }

    /// This endpoint's own address, as a peer would pass it to `fi_av_insert`.
    ///
    /// # Errors
    /// [`DmaError::Fabric`] if `fi_getname` fails.
    pub fn local_address(&self) -> Result<Vec<u8>, DmaError> {
        let mut address = vec![0_u8; self.description.address_len.max(1)];
        let mut len = address.len();
        // SAFETY: the endpoint is open; `address` has room for `len` bytes and fi_getname writes
        // at most that many, updating `len` to the real length.
        let code = unsafe {
            sys::fi_getname(
                &raw mut (*self.handles.ep).fid,
                address.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        check("fi_getname", code)?;
        address.truncate(len);
        Ok(address)
    }

    /// The address the real address vector holds at `fi_addr`, through `fi_av_lookup`, or `None`
    /// when the index is outside the table.
    ///
    /// This is how tests see what libfabric itself holds, but it cannot show a removal on its
    /// own: on libfabric 1.17's tcp provider a removed index still reads back its old bytes, and
    /// a never-used index inside the table reads back zeros, both with success. A removal shows
    /// through reuse instead: the table hands out the lowest free index first.
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for any failure other than an index outside the table.
    pub fn lookup(&self, fi_addr: sys::fi_addr_t) -> Result<Option<Vec<u8>>, DmaError> {
        let mut address = vec![0_u8; self.description.address_len.max(1)];
        let mut len = address.len();
        // SAFETY: the AV is open; `address` has room for `len` bytes and fi_av_lookup copies at
        // most that many, reporting the full length in `len`.
        let code = unsafe {
            sys::fi_av_lookup(
                self.handles.av,
                fi_addr,
                address.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        if -(sys::FI_EINVAL as i32) == code {
            return Ok(None);
        }
        check("fi_av_lookup", code)?;
        address.truncate(len);
        Ok(Some(address))
    }

    /// The raw address vector, for code that calls libfabric directly (benches of the bare
    /// `fi_av_insert`, for one). Nothing here stops such code from breaking the cache's
    /// accounting: it must remove exactly what it inserted.
    pub fn address_vector(&self) -> *mut sys::fid_av {
        self.handles.av
    }

    /// Send `message` to `peer` with `fi_inject`, retrying while the provider asks for progress,
    /// for at most a second. See [`send_within`](Self::send_within) to choose the bound.
    ///
    /// # Errors
    /// As `send_within`.
    pub fn send(&self, peer: sys::fi_addr_t, message: &[u8]) -> Result<(), DmaError> {
        self.send_within(peer, message, Duration::from_secs(1))
    }

    /// Send `message` to `peer` with `fi_inject`, retrying while the provider asks for progress,
    /// for at most `timeout` (a peer that has gone never accepts the connection, and a posting
    /// thread should not wait long for it).
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when the message exceeds the provider's inject size;
    /// [`DmaError::WouldBlock`] when the provider still asked to retry after `timeout`;
    /// [`DmaError::Fabric`] for any other failure.
    pub fn send_within(
        &self,
        peer: sys::fi_addr_t,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_send(peer, message) {
                Err(DmaError::WouldBlock) if Instant::now() < deadline => {
                    self.progress();
                    std::thread::yield_now();
                }
                result => return result,
            }
        }
    }

    /// One `fi_inject` of `message` to `peer`: [`DmaError::WouldBlock`] when the provider asks
    /// to retry after progress.
    ///
    /// # Errors
    /// As [`send`](Self::send), without the retrying.
    pub fn try_send(&self, peer: sys::fi_addr_t, message: &[u8]) -> Result<(), DmaError> {
        if message.len() > self.description.inject_size {
            return Err(DmaError::InvalidArgument(format!(
                "a {}-byte message exceeds the provider's inject size of {}",
                message.len(),
                self.description.inject_size
            )));
        }
        // SAFETY: the endpoint is open; fi_inject copies `message` before returning, so the
        // buffer need not outlive the call.
        let code = unsafe {
            sys::fi_inject(
                self.handles.ep,
                message.as_ptr().cast(),
                message.len(),
                peer,
            )
        };
        match code {
            0 => Ok(()),
            code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
            code => Err(DmaError::fabric("fi_inject", code as i64)),
        }
    }

    /// Drive the provider's progress on the transmit side, reporting any transmit error.
    ///
    /// Injected sends complete silently, so the transmit queue holds only errors; reading it is
    /// what makes a manual-progress provider such as tcp move data.
    ///
    /// RMA operations complete into the same queue: their completions are handed to them (and
    /// their leases dropped) here too, ready for [`poll_completions`](Self::poll_completions).
    pub fn progress(&self) {
        self.operations.reap(self.handles.tx_cq);
    }

    /// Take one received message, if one has arrived. The buffer is posted again before this
    /// returns.
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for an error completion (its buffer is posted again too) or a failed
    /// read or re-post.
    pub fn try_receive(&self) -> Result<Option<Vec<u8>>, DmaError> {
        let mut entry = sys::fi_cq_data_entry::default();
        // SAFETY: the queue is open and `entry` has room for the one entry asked for.
        let read = unsafe { sys::fi_cq_read(self.handles.rx_cq, (&raw mut entry).cast(), 1) };
        if read == -(sys::FI_EAGAIN as isize) {
            return Ok(None);
        }
        if read == -(sys::FI_EAVAIL as isize) {
            return Err(self.read_error(self.handles.rx_cq));
        }
        if read < 0 {
            return Err(DmaError::fabric("fi_cq_read", read as i64));
        }
        let Some(index) = self.receives.index_of(entry.op_context) else {
            return Err(DmaError::InvalidArgument(
                "a receive completion named a context this endpoint never posted".into(),
            ));
        };
        let Some(slot) = self.receives.get(index) else {
            return Ok(None);
        };
        // SAFETY: this thread read the slot's completion and has not re-posted it.
        let message = unsafe { slot.received(entry.len) };
        self.post_receive(index)?;
        Ok(Some(message))
    }

    /// Wait up to `timeout` for one received message, driving progress meanwhile.
    ///
    /// # Errors
    /// As [`try_receive`](Self::try_receive).
    pub fn receive(&self, timeout: Duration) -> Result<Option<Vec<u8>>, DmaError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(message) = self.try_receive()? {
                return Ok(Some(message));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            self.progress();
            std::thread::yield_now();
        }
    }

    fn post_receive(&self, index: usize) -> Result<(), DmaError> {
        let Some(slot) = self.receives.get(index) else {
            return Ok(());
        };
        let (buffer, len) = slot.buffer();
        loop {
            // SAFETY: the endpoint is open, and the slot's buffer and context live in the slab,
            // which outlives the endpoint's libfabric objects; this slot is not posted (it is new,
            // or its completion was just read by this thread).
            let code = unsafe {
                sys::fi_recv(
                    self.handles.ep,
                    buffer,
                    len,
                    ptr::null_mut(),
                    sys::FI_ADDR_UNSPEC,
                    slot.context(),
                )
            };
            match code {
                0 => return Ok(()),
                code if code == -(sys::FI_EAGAIN as isize) => self.progress(),
                code => return Err(DmaError::fabric("fi_recv", code as i64)),
            }
        }
    }

    /// Read the error entry an `FI_EAVAIL` announced, re-posting its buffer if it was a receive.
    fn read_error(&self, cq: *mut sys::fid_cq) -> DmaError {
        let mut entry = sys::fi_cq_err_entry::default();
        // SAFETY: the queue is open and `entry` is a valid error entry to fill.
        let read = unsafe { sys::fi_cq_readerr(cq, &raw mut entry, 0) };
        if read < 0 {
            return DmaError::fabric("fi_cq_readerr", read as i64);
        }
        let mut text = [0 as std::ffi::c_char; 256];
        // SAFETY: the queue is open, `err_data` is valid until the next read of this queue (none
        // happens before the copy below), and `text` has room for `text.len()` bytes.
        let message = unsafe {
            let provider_text = sys::fi_cq_strerror(
                cq,
                entry.prov_errno,
                entry.err_data,
                text.as_mut_ptr(),
                text.len(),
            );
            if provider_text.is_null() {
                crate::error::strerror(entry.err.into())
            } else {
                CStr::from_ptr(provider_text).to_string_lossy().into_owned()
            }
        };
        if let Some(index) = self.receives.index_of(entry.op_context) {
            if let Err(error) = self.post_receive(index) {
                tracing::warn!(%error, "could not re-post a receive buffer after an error");
            }
        }
        DmaError::Fabric {
            call: "fi_cq_read",
            code: (-entry.err).into(),
            message,
        }
    }
}

impl Drop for LibfabricEndpoint {
    fn drop(&mut self) {
        // RMA operations hold leases on the cache and registrations in the domain: first.
        self.shut_down_operations();
        // SAFETY: dropped exactly once, here, before `handles` closes the address vector it
        // removes from; `peers` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.peers) };
    }
}

/// `fi_getinfo` for a reliable-datagram, thread-safe, table-AV endpoint of `provider`.
fn getinfo(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
) -> Result<*mut sys::fi_info, DmaError> {
    // SAFETY: fi_allocinfo returns a zeroed info with its attribute structs allocated, or null.
    let hints = unsafe { sys::fi_allocinfo() };
    if hints.is_null() {
        return Err(DmaError::fabric("fi_allocinfo", -(sys::FI_ENOMEM as i64)));
    }
    let mut info = ptr::null_mut();
    let name = CString::new(provider.name())
        .map_err(|_| DmaError::InvalidArgument("provider name".into()))?;
    let fabric = provider
        .fabric()
        .map(CString::new)
        .transpose()
        .map_err(|_| DmaError::InvalidArgument("fabric name".into()))?;
    // SAFETY: `hints` is a fresh info whose attribute pointers fi_allocinfo filled in; the names
    // are copied onto the C heap by the shim (fi_freeinfo frees them); fi_getinfo writes one list
    // head into `info`; `hints` is freed once, after the call.
    let code = unsafe {
        (*hints).caps = u64::from(sys::FI_MSG);
        (*hints).mode = sys::FI_CONTEXT;
        (*(*hints).ep_attr).type_ = sys::FI_EP_RDM;
        (*(*hints).domain_attr).threading = sys::FI_THREAD_SAFE;
        (*(*hints).domain_attr).av_type = sys::FI_AV_TABLE;
        (*(*hints).domain_attr).mr_mode =
            (sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY) as i32;
        if configuration.rma {
            // RMA: registered memory honours FI_MR_ENDPOINT too (see `memory`); FI_MR_LOCAL is
            // not offered, because receive buffers are not registered.
            (*hints).caps |= u64::from(sys::FI_RMA);
            (*(*hints).domain_attr).mr_mode |= sys::FI_MR_ENDPOINT as i32;
        }
        let mut code = sys::dmafab_set_provider_name(hints, name.as_ptr());
        if 0 == code {
            if let Some(fabric) = &fabric {
                code = sys::dmafab_set_fabric_name(hints, fabric.as_ptr());
            }
        }
        if 0 == code {
            let flags = if node.is_some() { sys::FI_SOURCE } else { 0 };
            code = sys::fi_getinfo(
                sys::dmafab_version(),
                node.map_or(ptr::null(), CStr::as_ptr),
                ptr::null(),
                flags,
                hints,
                &raw mut info,
            );
        }
        sys::fi_freeinfo(hints);
        code
    };
    check("fi_getinfo", code)?;
    if info.is_null() {
        return Err(DmaError::fabric("fi_getinfo", -(sys::FI_ENODATA as i64)));
    }
    Ok(info)
}

/// Copy what the first entry of `info` says into owned strings.
///
/// # Safety
/// `info` is a non-null `fi_info` returned by `fi_getinfo`.
unsafe fn describe(info: *const sys::fi_info) -> Description {
    // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns, and its name
    // strings are NUL-terminated or null.
    unsafe {
        let text = |raw: *const std::ffi::c_char| {
            if raw.is_null() {
                String::new()
            } else {
                CStr::from_ptr(raw).to_string_lossy().into_owned()
            }
        };
        let fabric = &*(*info).fabric_attr;
        let domain = &*(*info).domain_attr;
        Description {
            provider: text(fabric.prov_name),
            fabric: text(fabric.name),
            domain: text(domain.name),
            addr_format: (*info).addr_format,
            address_len: (*info).src_addrlen,
            threading: domain.threading,
            av_type: domain.av_type,
            inject_size: (*(*info).tx_attr).inject_size,
        }
    }
}

/// A libfabric return code as a result.
fn check(call: &'static str, code: impl Into<i64>) -> Result<(), DmaError> {
    let code = code.into();
    if 0 == code {
        Ok(())
    } else {
        Err(DmaError::fabric(call, code))
    }
}
