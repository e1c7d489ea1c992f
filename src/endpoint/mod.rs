//! A safe libfabric reliable-datagram endpoint.
//!
//! [`LibfabricEndpoint::open`] walks the configured providers in order and opens, for the first
//! that offers an `FI_EP_RDM` endpoint: the fabric, a domain with `FI_THREAD_SAFE` threading (so
//! many threads post on one endpoint), an `FI_AV_TABLE` address vector sized to
//! `Configuration::av_capacity`, one completion queue for transmits and one for receives, and
//! the enabled endpoint. It owns an [`AddressCache`] over that address vector, which posting
//! threads use to turn peer addresses into `fi_addr_t`s.
//!
//! # What the types enforce
//!
//! - **Posting takes a [`Peer`], never a raw index.** [`send`](LibfabricEndpoint::send),
//!   [`send_within`](LibfabricEndpoint::send_within) and [`try_send`](LibfabricEndpoint::try_send)
//!   take a `Peer<'_>`, which only a [`Pinned`](crate::Pinned) resolve makes and which borrows
//!   that pin: the borrow checker refuses a post after the pin is dropped, so safe code cannot
//!   post to an index the cache has since removed or handed to another peer (the `compile_fail`
//!   example on `send` shows it). A peer resolved by another endpoint's cache is refused with
//!   [`DmaError::InvalidArgument`] before libfabric sees it: its index means nothing in this AV.
//!   So is a peer of a second cache built with `FabricAv::from_raw` on this endpoint's AV: the
//!   check is by cache, not by AV. Posting to a raw `fi_addr_t` is `unsafe`
//!   ([`send_raw`](LibfabricEndpoint::send_raw) and friends), with the caller's promises
//!   written down. Sends are `fi_inject`s, which copy the message before returning, so no
//!   operation is left in flight against the index once the pin drops.
//! - **`lookup` reads only indices this AV has handed out.** [`lookup`](LibfabricEndpoint::lookup)
//!   answers `None`, without calling libfabric, for an index at or past the AV's capacity or
//!   past the highest index a [`FabricAv`] on this AV has been given by `fi_av_insert` (the
//!   endpoint's own cache, and `FabricAv::from_raw` backends on its AV). libfabric 1.17 crashes
//!   on the others.
//! - **Nothing waits for ever.** `open` refuses more receive buffers than the provider's
//!   receive queue holds (`rx_attr.size`), posting them at `open` gives up after
//!   [`POST_PATIENCE`] of `-FI_EAGAIN`, a send gives up after its timeout, and `receive`
//!   returns `None` after its own. A receive buffer
//!   whose re-post fails is kept and posted again by a later
//!   [`try_receive`](LibfabricEndpoint::try_receive) or [`progress`](LibfabricEndpoint::progress);
//!   the message it held is returned all the same. Every timeout takes any `Duration`: one too
//!   long for an `Instant` (`Duration::MAX`) is no deadline, and the call waits as long as its
//!   own completion takes, rather than panic on the overflow.
//! - **Every size is checked before libfabric or the allocator sees it**
//!   ([`Configuration::validate`], then the provider's own limits once `fi_getinfo` has
//!   answered), with a [`DmaError::InvalidArgument`] naming the value and the bound: libfabric
//!   rounds queue and AV sizes up to a power of two and multiplies them without an overflow
//!   check, so a size past the bound opened an endpoint that corrupted the heap, or crashed.
//! - **Providers whose demands the endpoint cannot meet are refused at `open`**, with the reason
//!   in [`DmaError::NoProvider`]: threading other than `FI_THREAD_SAFE` (the endpoint is `Sync`,
//!   and the cache's writer thread inserts into the AV while other threads post; efa-direct is
//!   `FI_THREAD_DOMAIN`), `FI_MR_LOCAL` (the crate registers no memory yet, so receive buffers
//!   have no descriptors; efa-direct requires it), and `FI_ADDR_STR` addresses (shm: strings that
//!   `fi_av_insert` reads up to their NUL, whatever length the cache checked).
//!
//! # Guarantees
//!
//! - Dropping the endpoint first drops its cache, which runs every pending `fi_av_remove`, and
//!   only then closes the endpoint, the queues, the address vector, the domain and the fabric,
//!   in that order. Nothing is leaked, file descriptors included.
//! - Receive buffers are owned by the endpoint and outlive its libfabric objects.
//! - A failure part-way through `open` closes what was opened and reports which call failed.
//! - RMA operations in flight (see [`rma`]) hold their lease and local memory until their
//!   completion has been read; dropping the endpoint drains them, or abandons them after closing
//!   the endpoint, before the cache and the domain close.

mod deadline;
mod handles;
pub mod in_flight;
pub mod memory;
mod receive;
pub mod rma;

use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

use self::deadline::Deadline;
use self::handles::Handles;
pub use self::in_flight::OverdueOperation;
pub use self::memory::{MemoryRegion, RemoteRegion, Segment};
use self::receive::ReceiveSlots;
pub use self::rma::{Completion, MAX_OPERATIONS, Operation};
/// The endpoint's AV backend lives in [`crate::av`]; re-exported here, where it always was.
pub use crate::av::FabricAv;
use crate::av::fabric::{self as av, HandedOut};
use crate::cache::{AddressCache, Peer};
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

/// How long `open` keeps posting a receive buffer the provider answers `-FI_EAGAIN` for, driving
/// progress meanwhile, before it gives up with [`DmaError::Fabric`].
pub const POST_PATIENCE: Duration = Duration::from_secs(1);

/// The bytes of provider-specific error data [`LibfabricEndpoint`] asks `fi_cq_readerr` to copy
/// into a buffer of its own for each error completion.
const ERR_DATA_LEN: usize = 256;

/// A reliable-datagram endpoint with its address vector, completion queues and address cache.
///
/// `Send` and `Sync`: many threads post, receive and drive progress on one endpoint at once,
/// while its cache's writer thread inserts into and removes from the address vector. That is
/// sound only because `open` accepts nothing but an `FI_THREAD_SAFE` domain, in which libfabric
/// serialises those calls itself. An `FI_THREAD_DOMAIN` domain (efa-direct's) leaves every call
/// on the domain, its endpoints, queues and AV, to be serialised by the application; the endpoint
/// has no such lock yet, so it refuses that provider rather than be `Sync` over it.
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
    /// The indices `FabricAv` backends on this AV have been handed, and the AV's capacity: what
    /// `lookup` may read.
    handed_out: Arc<HandedOut>,
    /// Test-only fault injection: how many of the next receive posts fail without reaching
    /// `fi_recv`, with `-FI_EIO`, or with `-FI_EAGAIN` while `posts_ask_to_retry` is set.
    #[cfg(test)]
    failing_posts: std::sync::atomic::AtomicUsize,
    #[cfg(test)]
    posts_ask_to_retry: std::sync::atomic::AtomicBool,
    /// RMA operations in flight (see `rma`): drained in `Drop` before the cache goes, and
    /// declared after `handles` so their contexts outlive the endpoint.
    operations: Box<rma::Operations>,
}

// SAFETY: `open` refuses any domain whose threading is not FI_THREAD_SAFE (see `refusal`), so
// libfabric serialises concurrent calls on the endpoint, its queues and its address vector
// itself; FI_THREAD_DOMAIN, which would leave that serialisation to the caller, is refused
// rather than honoured. Receive slots are handed between threads only through completions and the
// slab's locked list of unposted slots (see `receive`), the record of handed-out indices is
// atomic, and every other field is immutable after `open`.
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
    /// works: no such provider here, or one that asks for what the endpoint cannot honour yet
    /// (see the module docs: efa-direct and shm are refused); [`DmaError::Fabric`] when a later
    /// libfabric call fails, or a receive buffer still cannot be posted after
    /// [`POST_PATIENCE`]; [`DmaError::InvalidArgument`] for a configuration
    /// [`Configuration::validate`] refuses (an empty provider list, a size out of its bounds, a
    /// `cq_size` or `rx_size` below `receive_buffers`), a node with a NUL byte, a `tx_size` or
    /// `rx_size` deeper than the provider accepts (16,384 and 65,536 on tcp;ofi_rxm), more
    /// `receive_buffers` than the provider's receive queue holds (`rx_attr.size`; 2048 on
    /// tcp;ofi_rxm by default), a `receive_size` above its `ep_attr.max_msg_size`, or receive
    /// buffers that cannot be allocated; each names the value and the bound, and each is found
    /// before any libfabric object opens.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let too_many = Configuration { receive_buffers: 1 << 20, ..Configuration::default() };
    /// let Err(DmaError::InvalidArgument(reason)) = LibfabricEndpoint::open(&too_many, None) else {
    ///     panic!("more buffers than the receive queue holds");
    /// };
    /// assert!(reason.contains("1048576"), "{reason}");
    /// ```
    pub fn open(configuration: &Configuration, node: Option<&str>) -> Result<Self, DmaError> {
        configuration.validate()?;
        let node = node.or(configuration.bind.as_deref());
        let node = node
            .map(CString::new)
            .transpose()
            .map_err(|_| DmaError::InvalidArgument("the node has a NUL byte".into()))?;

        let mut tried = Vec::new();
        let mut misfit = None;
        for &provider in &configuration.providers {
            match Self::open_with(configuration, provider, node.as_deref()) {
                Ok(endpoint) => return Ok(endpoint),
                Err(error) => {
                    tracing::debug!(%provider, %error, "provider turned down");
                    tried.push(format!("{provider}: {error}"));
                    if let DmaError::InvalidArgument(reason) = error {
                        misfit.get_or_insert(reason);
                    }
                }
            }
        }
        match misfit {
            // The configuration, not the machine, is what to fix.
            Some(reason) => Err(DmaError::InvalidArgument(reason)),
            None => Err(DmaError::NoProvider {
                tried: tried.join("; "),
            }),
        }
    }

    fn open_with(
        configuration: &Configuration,
        provider: Provider,
        node: Option<&CStr>,
    ) -> Result<Self, DmaError> {
        let mut handles = Handles::new();
        let Some(info) =
            getinfo_sized(configuration, provider, node, QueueSizes::of(configuration))?
        else {
            return Err(size_misfit(configuration, provider, node)
                .unwrap_or_else(|| crate::configuration::no_data(provider)));
        };
        handles.info = info;

        // SAFETY: `info` is the non-null list head fi_getinfo returned; its attribute pointers
        // are filled in by the provider for every entry.
        let (description, demands, limits) =
            unsafe { (describe(info), Demands::of(info), Limits::of(info)) };
        if let Some(reason) = limits.misfit(configuration, &description.provider) {
            return Err(DmaError::InvalidArgument(reason));
        }
        if let Some(reason) = refusal(provider, &demands) {
            return Err(DmaError::Unsupported(reason));
        }
        crate::configuration::check_chosen(provider, &description.provider)?;
        // Before any libfabric object opens: memory that cannot be had is an error, not an abort.
        let receives =
            ReceiveSlots::new(configuration.receive_buffers, configuration.receive_size)?;

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
                size: configuration.cq_size,
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
        // Unregistered in `Drop`, before `handles` closes the AV.
        let handed_out = av::register(handles.av, configuration.av_capacity);
        let backend = FabricAv::new(
            handles.av,
            description.addr_format,
            description.address_len,
            configuration.av_capacity,
            Arc::clone(&handed_out),
        );
        let endpoint = Self {
            peers: ManuallyDrop::new(AddressCache::with_backend(backend)),
            handles,
            receives,
            description,
            handed_out,
            #[cfg(test)]
            failing_posts: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            posts_ask_to_retry: std::sync::atomic::AtomicBool::new(false),
            operations,
        };
        for index in 0..endpoint.receives.len() {
            endpoint.post_patiently(index)?;
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
    /// The buffer is sized from what `fi_getname` reports: a provider whose name is longer than
    /// `fi_info.src_addrlen` answers `-FI_ETOOSMALL` with the length it needs, and the call is
    /// made once more with that much room.
    ///
    /// # Errors
    /// [`DmaError::Fabric`] if `fi_getname` fails, or still finds its buffer too small the second
    /// time.
    pub fn local_address(&self) -> Result<Vec<u8>, DmaError> {
        sized_name(self.description.address_len, |buffer, len| {
            // SAFETY: the endpoint is open; `buffer` has room for `*len` bytes (`sized_name`
            // hands a slice of exactly that length) and fi_getname writes at most that many,
            // updating `*len` to the real length (also when it answers -FI_ETOOSMALL, having
            // written nothing).
            unsafe {
                sys::fi_getname(
                    &raw mut (*self.handles.ep).fid,
                    buffer.as_mut_ptr().cast(),
                    len,
                )
            }
        })
    }

    /// The address the real address vector holds at `fi_addr`, through `fi_av_lookup`, or `None`
    /// when the index is not one this AV has handed out.
    ///
    /// `None`, without a libfabric call, for an index at or past the AV's capacity
    /// (`Configuration::av_capacity`) or past the highest index `fi_av_insert` has given a
    /// [`FabricAv`] on this AV: the endpoint's own cache, or a [`FabricAv::from_raw`] backend on
    /// [`address_vector`](Self::address_vector). libfabric 1.17 crashes looking up any other
    /// index (its entry pool may have no memory there yet). Indices inserted by calling
    /// `fi_av_insert` on the raw AV directly are not recorded: insert through a `FabricAv` to
    /// look them up. Also `None` when the provider itself answers `-FI_EINVAL`.
    ///
    /// This is how tests see what libfabric itself holds, but it cannot show a removal on its
    /// own: on libfabric 1.17's tcp provider a removed index still reads back its old bytes, and
    /// a never-used index inside the table reads back zeros, both with success. A removal shows
    /// through reuse instead: the table hands out the lowest free index first.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// assert_eq!(None, endpoint.lookup(5)?, "nothing handed out yet");
    /// assert_eq!(None, endpoint.lookup(1 << 40)?, "far outside the table");
    /// let address = endpoint.local_address()?;
    /// let pinned = endpoint.peers().pin();
    /// let peer = pinned.resolve(1, &address)?;
    /// assert_eq!(Some(address), endpoint.lookup(peer.fi_addr())?);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for any failure other than an index outside the table.
    pub fn lookup(&self, fi_addr: sys::fi_addr_t) -> Result<Option<Vec<u8>>, DmaError> {
        if !self.handed_out.contains(fi_addr) {
            return Ok(None);
        }
        let mut address = vec![0_u8; self.description.address_len.max(1)];
        let mut len = address.len();
        // SAFETY: the AV is open; `fi_addr` is below an index fi_av_insert handed out on it, so
        // it lies in table memory the AV allocated and keeps until it closes; `address` has room
        // for `len` bytes and fi_av_lookup copies at most that many, reporting the full length in
        // `len`.
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
        address.truncate(len.min(address.len()));
        Ok(Some(address))
    }

    /// The raw address vector, for code that calls libfabric directly (benches of the bare
    /// `fi_av_insert`, for one). Nothing here stops such code from breaking the cache's
    /// accounting: it must remove exactly what it inserted. Indices it inserts directly are not
    /// recorded for [`lookup`](Self::lookup); a [`FabricAv::from_raw`] backend's are.
    pub fn address_vector(&self) -> *mut sys::fid_av {
        self.handles.av
    }

    /// Send `message` to `peer` with `fi_inject`, retrying while the provider asks for progress,
    /// for at most a second. See [`send_within`](Self::send_within) to choose the bound.
    ///
    /// `peer` borrows the [`Pinned`](crate::Pinned) it was resolved under, so it cannot be used
    /// once that pin is dropped, when its index may have been removed and handed to another
    /// peer:
    ///
    /// ```compile_fail,E0505
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let client = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let pinned = server.peers().pin();
    /// let peer = pinned.resolve(1, &client.local_address()?)?;
    /// drop(pinned);
    /// server.peers().release(1);
    /// server.send(peer, b"stale")?; // error: `pinned` was dropped while `peer` borrowed it
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// Nor does a raw index stand in for a peer:
    ///
    /// ```compile_fail,E0308
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let server = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// server.send(5, b"x")?; // error: expected `Peer<'_>`, found integer
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// As `send_within`.
    pub fn send(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.send_within(peer, message, Duration::from_secs(1))
    }

    /// Send `message` to `peer` with `fi_inject`, retrying while the provider asks for progress,
    /// for at most `timeout` (a peer that has gone never accepts the connection, and a posting
    /// thread should not wait long for it). Any `Duration` is accepted: one too long for a
    /// deadline (`Duration::MAX`) retries until the provider takes the message.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] when `peer` was resolved by another endpoint's cache, or the
    /// message exceeds the provider's inject size; [`DmaError::WouldBlock`] when the provider
    /// still asked to retry after `timeout`; [`DmaError::Fabric`] for any other failure.
    ///
    /// ```
    /// use std::time::Duration;
    /// use dma_libfabric::{Configuration, DmaError, LibfabricEndpoint};
    ///
    /// let one = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let two = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// let pinned = two.peers().pin();
    /// let peer_of_two = pinned.resolve(1, &one.local_address()?)?;
    /// assert!(matches!(
    ///     one.send_within(peer_of_two, b"x", Duration::from_millis(10)),
    ///     Err(DmaError::InvalidArgument(_)) // resolved by `two`'s cache, not `one`'s
    /// ));
    /// # Ok::<(), DmaError>(())
    /// ```
    pub fn send_within(
        &self,
        peer: Peer<'_>,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        // SAFETY: `peer` came from this endpoint's cache (checked above) under a pin that is
        // still alive (it borrows it), so its index is in this AV, mapped to the peer it was
        // resolved for, and not removed before the pin drops, which is after this call.
        unsafe { self.send_raw_within(peer.fi_addr(), message, timeout) }
    }

    /// One `fi_inject` of `message` to `peer`: [`DmaError::WouldBlock`] when the provider asks
    /// to retry after progress.
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), without the retrying.
    pub fn try_send(&self, peer: Peer<'_>, message: &[u8]) -> Result<(), DmaError> {
        self.check_peer(peer)?;
        // SAFETY: as in `send_within`.
        unsafe { self.try_send_raw(peer.fi_addr(), message) }
    }

    /// [`send`](Self::send) to a raw `fi_addr_t`, for code that inserts into
    /// [`address_vector`](Self::address_vector) itself.
    ///
    /// # Safety
    /// `fi_addr` was returned by `fi_av_insert` on this endpoint's address vector (directly, or
    /// through a [`FabricAv`] on it) and is not removed until this call has returned: an index
    /// the AV never handed out, or one already removed, makes libfabric dereference a cleared or
    /// missing entry (a crash on tcp;ofi_rxm and efa). It must also still name the peer meant:
    /// `FI_AV_TABLE` hands a removed index to the next insert at once, and a send to it goes to
    /// that newcomer. An index from this endpoint's own cache meets this only while the
    /// [`Pinned`](crate::Pinned) it was resolved under lives; use [`send`](Self::send) for those.
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), except that no peer is checked.
    pub unsafe fn send_raw(&self, fi_addr: sys::fi_addr_t, message: &[u8]) -> Result<(), DmaError> {
        // SAFETY: the caller's promise is this function's.
        unsafe { self.send_raw_within(fi_addr, message, Duration::from_secs(1)) }
    }

    /// [`send_within`](Self::send_within) to a raw `fi_addr_t`.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw).
    ///
    /// # Errors
    /// As [`send_within`](Self::send_within), except that no peer is checked.
    pub unsafe fn send_raw_within(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
        timeout: Duration,
    ) -> Result<(), DmaError> {
        let deadline = Deadline::after(timeout);
        loop {
            // SAFETY: the caller's promise is this function's.
            match unsafe { self.try_send_raw(fi_addr, message) } {
                Err(DmaError::WouldBlock) if !deadline.passed() => {
                    self.progress();
                    std::thread::yield_now();
                }
                result => return result,
            }
        }
    }

    /// [`try_send`](Self::try_send) to a raw `fi_addr_t`.
    ///
    /// # Safety
    /// As [`send_raw`](Self::send_raw).
    ///
    /// # Errors
    /// As [`try_send`](Self::try_send), except that no peer is checked.
    pub unsafe fn try_send_raw(
        &self,
        fi_addr: sys::fi_addr_t,
        message: &[u8],
    ) -> Result<(), DmaError> {
        if message.len() > self.description.inject_size {
            return Err(DmaError::InvalidArgument(format!(
                "a {}-byte message exceeds the provider's inject size of {}",
                message.len(),
                self.description.inject_size
            )));
        }
        // SAFETY: the endpoint is open; the caller promises `fi_addr` is a live entry of this AV;
        // fi_inject copies `message` before returning, so the buffer need not outlive the call.
        let code = unsafe {
            sys::fi_inject(
                self.handles.ep,
                message.as_ptr().cast(),
                message.len(),
                fi_addr,
            )
        };
        match code {
            0 => Ok(()),
            code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
            code => Err(DmaError::fabric("fi_inject", code as i64)),
        }
    }

    /// Refuse a peer another cache resolved: its index means nothing in this AV.
    fn check_peer(&self, peer: Peer<'_>) -> Result<(), DmaError> {
        if self.peers.owns(peer) {
            Ok(())
        } else {
            Err(DmaError::InvalidArgument(format!(
                "peer {} was resolved by another cache than this endpoint's: its index means \
                 nothing in this endpoint's address vector",
                peer.fi_addr()
            )))
        }
    }

    /// Drive the provider's progress on the transmit side, reporting any transmit error, and
    /// post again any receive buffer whose earlier re-post failed.
    ///
    /// Injected sends complete silently, so the transmit queue holds only errors; reading it is
    /// what makes a manual-progress provider such as tcp move data.
    ///
    /// RMA operations complete into the same queue: their completions are handed to them (and
    /// their leases dropped) here too, ready for [`poll_completions`](Self::poll_completions).
    pub fn progress(&self) {
        self.repost_unposted();
        self.operations.reap(self.handles.tx_cq);
    }

    /// Take one received message, if one has arrived. Its buffer is posted again before this
    /// returns; if that post fails, the message is returned all the same and the buffer is kept
    /// for the next `try_receive` or [`progress`](Self::progress) to post (see
    /// [`unposted_receives`](Self::unposted_receives)).
    ///
    /// # Errors
    /// [`DmaError::Fabric`] for an error completion (its buffer is posted again too) or a failed
    /// read.
    pub fn try_receive(&self) -> Result<Option<Vec<u8>>, DmaError> {
        self.repost_unposted();
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
        self.repost(index);
        Ok(Some(message))
    }

    /// Wait up to `timeout` for one received message, driving progress meanwhile. Any `Duration`
    /// is accepted: one too long for a deadline (`Duration::MAX`) waits until a message arrives.
    ///
    /// # Errors
    /// As [`try_receive`](Self::try_receive).
    pub fn receive(&self, timeout: Duration) -> Result<Option<Vec<u8>>, DmaError> {
        let deadline = Deadline::after(timeout);
        loop {
            if let Some(message) = self.try_receive()? {
                return Ok(Some(message));
            }
            if deadline.passed() {
                return Ok(None);
            }
            self.progress();
            std::thread::yield_now();
        }
    }

    /// How many receive buffers are not posted now because their re-post failed; the next
    /// [`try_receive`](Self::try_receive) or [`progress`](Self::progress) tries them again.
    /// Zero in normal operation.
    pub fn unposted_receives(&self) -> usize {
        self.receives.unposted()
    }

    /// Post slot `index` at `open`, retrying `-FI_EAGAIN` with progress for at most
    /// [`POST_PATIENCE`].
    fn post_patiently(&self, index: usize) -> Result<(), DmaError> {
        let deadline = Deadline::after(POST_PATIENCE);
        loop {
            match self.post_receive(index) {
                Err(DmaError::WouldBlock) if !deadline.passed() => {
                    self.progress();
                    std::thread::yield_now();
                }
                Err(DmaError::WouldBlock) => {
                    return Err(DmaError::Fabric {
                        call: "fi_recv",
                        code: -i64::from(sys::FI_EAGAIN),
                        message: format!(
                            "the provider still asked to retry after {POST_PATIENCE:?}, with \
                             {index} of {} receive buffers posted",
                            self.receives.len()
                        ),
                    });
                }
                result => return result,
            }
        }
    }

    /// Post slot `index` again after its completion was read, once; if that fails, keep it for a
    /// later [`repost_unposted`](Self::repost_unposted). The caller owns the slot and hands it on.
    fn repost(&self, index: usize) {
        match self.post_receive(index) {
            Ok(()) => {}
            Err(error) => {
                if DmaError::WouldBlock != error {
                    tracing::warn!(%error, index, "could not re-post a receive buffer; will retry");
                }
                self.receives.defer_post(index);
            }
        }
    }

    /// Try once more to post every slot whose re-post failed.
    fn repost_unposted(&self) {
        for index in self.receives.take_unposted() {
            self.repost(index);
        }
    }

    /// One `fi_recv` of slot `index`: [`DmaError::WouldBlock`] for `-FI_EAGAIN`.
    fn post_receive(&self, index: usize) -> Result<(), DmaError> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering;
            let fail = self
                .failing_posts
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if fail.is_ok() {
                if self.posts_ask_to_retry.load(Ordering::Relaxed) {
                    return Err(DmaError::WouldBlock);
                }
                return Err(DmaError::fabric("fi_recv", -i64::from(sys::FI_EIO)));
            }
        }
        let Some(slot) = self.receives.get(index) else {
            return Ok(());
        };
        let (buffer, len) = slot.buffer();
        // SAFETY: the endpoint is open, and the slot's buffer and context live in the slab, which
        // outlives the endpoint's libfabric objects; this slot is not posted (it is new, its
        // completion was just read by this thread, or this thread took it from the unposted
        // list).
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
            0 => Ok(()),
            code if code == -(sys::FI_EAGAIN as isize) => Err(DmaError::WouldBlock),
            code => Err(DmaError::fabric("fi_recv", code as i64)),
        }
    }

    /// Read the error entry an `FI_EAVAIL` announced, re-posting its buffer if it was a receive
    /// (or keeping it for a later re-post, as `try_receive` does).
    ///
    /// The provider's error data is copied into a buffer of this call's own (`err_data_size` > 0,
    /// API 1.5 and later): left at zero, libfabric hands back a buffer it shares per queue and
    /// frees at the next `fi_cq_readerr`, which another thread may call at any time.
    fn read_error(&self, cq: *mut sys::fid_cq) -> DmaError {
        let entry = match read_error_entry(cq) {
            Ok(Some(entry)) => entry,
            Ok(None) => return DmaError::fabric("fi_cq_readerr", -i64::from(sys::FI_EAGAIN)),
            Err(error) => return error,
        };
        if let Some(index) = self.receives.index_of(entry.op_context) {
            // This thread read the slot's (error) completion, so it owns the slot.
            self.repost(index);
        }
        entry.error("fi_cq_read")
    }
}

/// An error completion, read into a buffer of the reader's own.
pub(super) struct ErrorEntry {
    /// The operation's context, as it was posted.
    pub(super) op_context: *mut std::ffi::c_void,
    /// `fi_cq_err_entry.err`: a positive `FI_E*` code.
    err: i32,
    /// `fi_strerror`'s text, and the provider's where it gave one.
    message: String,
}

impl ErrorEntry {
    /// The error, as `call`'s failure.
    pub(super) fn error(&self, call: &'static str) -> DmaError {
        DmaError::Fabric {
            call,
            code: (-self.err).into(),
            message: self.message.clone(),
        }
    }
}

/// Read one error entry of `cq` with `fi_cq_readerr`, into an `err_data` buffer of this call's
/// own (libfabric's shared one is overwritten, or freed, by the next read on any thread), and
/// describe it with `fi_cq_strerror`. `None` when there was none (another thread took it).
pub(super) fn read_error_entry(cq: *mut sys::fid_cq) -> Result<Option<ErrorEntry>, DmaError> {
    let mut err_data = [0_u8; ERR_DATA_LEN];
    let mut entry = sys::fi_cq_err_entry {
        err_data: err_data.as_mut_ptr().cast(),
        err_data_size: err_data.len(),
        ..Default::default()
    };
    // SAFETY: the queue is open, `entry` is a valid error entry to fill, and its `err_data`
    // points at `err_data_size` writable bytes that live across the call.
    let read = unsafe { sys::fi_cq_readerr(cq, &raw mut entry, 0) };
    if 0 == read || -(sys::FI_EAGAIN as isize) == read {
        return Ok(None);
    }
    if read < 0 {
        return Err(DmaError::fabric("fi_cq_readerr", read as i64));
    }
    let mut text = [0 as std::ffi::c_char; 256];
    // SAFETY: the queue is open; `err_data` is this call's own buffer, which the provider
    // filled (nobody else can touch it), and `text` has room for `text.len()` bytes. The
    // returned pointer is to `text` or to a static string, read before either goes away.
    let message = unsafe {
        let provider_text = sys::fi_cq_strerror(
            cq,
            entry.prov_errno,
            err_data.as_ptr().cast(),
            text.as_mut_ptr(),
            text.len(),
        );
        let text = crate::error::strerror(entry.err.into());
        if provider_text.is_null() || 0 == entry.prov_errno {
            text
        } else {
            let provider_text = CStr::from_ptr(provider_text).to_string_lossy();
            format!(
                "{text} (provider error {}: {provider_text})",
                entry.prov_errno
            )
        }
    };
    Ok(Some(ErrorEntry {
        op_context: entry.op_context,
        err: entry.err,
        message,
    }))
}

impl Drop for LibfabricEndpoint {
    fn drop(&mut self) {
        // RMA operations hold leases on the cache and registrations in the domain: first.
        self.shut_down_operations();
        // SAFETY: dropped exactly once, here, before `handles` closes the address vector it
        // removes from; `peers` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.peers) };
        av::unregister(self.handles.av);
    }
}

/// Call `getname` (`fi_getname`'s contract: fill the buffer, set the length) with a buffer of
/// `first_guess` bytes; when it answers `-FI_ETOOSMALL` with the length it needs, once more with
/// that many.
fn sized_name(
    first_guess: usize,
    mut getname: impl FnMut(&mut [u8], &mut usize) -> i32,
) -> Result<Vec<u8>, DmaError> {
    let mut address = vec![0_u8; first_guess.max(1)];
    for _ in 0..2 {
        let mut len = address.len();
        let code = getname(&mut address, &mut len);
        if -(sys::FI_ETOOSMALL as i32) == code && len > address.len() {
            address.resize(len, 0);
            continue;
        }
        check("fi_getname", code)?;
        address.truncate(len);
        return Ok(address);
    }
    Err(DmaError::fabric(
        "fi_getname",
        -i64::from(sys::FI_ETOOSMALL),
    ))
}

/// What the hints offer a provider: the modes, threading and memory-registration modes the
/// endpoint asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hints {
    /// `fi_info.mode`: what the application is prepared to do for the provider.
    mode: u64,
    /// `domain_attr.threading`.
    threading: u32,
    /// `domain_attr.mr_mode`.
    mr_mode: i32,
}

impl Hints {
    /// The hints for `provider`: exactly what it asks for where that is known, so `fi_getinfo`
    /// finds it and [`refusal`] can then say what the endpoint cannot honour.
    ///
    /// efa-direct (libfabric 2.6.0, `prov/efa/src/efa_prov_info.c`) requires `FI_CONTEXT2`
    /// (line 475) and `FI_MR_LOCAL` (line 49), and its domain is `FI_THREAD_DOMAIN` (line 45);
    /// hints without them never match it. The receive slots' contexts are `fi_context2`, so
    /// `FI_CONTEXT2` is honoured; the other two are refused at `open`.
    fn for_provider(provider: Provider) -> Self {
        let mr_mode = (sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY) as i32;
        match provider {
            Provider::EfaDirect => Self {
                mode: sys::FI_CONTEXT | sys::FI_CONTEXT2,
                threading: sys::FI_THREAD_DOMAIN,
                mr_mode: mr_mode | sys::FI_MR_LOCAL as i32,
            },
            _ => Self {
                mode: sys::FI_CONTEXT,
                threading: sys::FI_THREAD_SAFE,
                mr_mode,
            },
        }
    }
}

/// What the provider `fi_getinfo` chose demands of the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Demands {
    /// `domain_attr.threading`.
    threading: u32,
    /// `domain_attr.mr_mode`.
    mr_mode: i32,
    /// `fi_info.addr_format`.
    addr_format: u32,
}

impl Demands {
    /// What the first entry of `info` demands.
    ///
    /// # Safety
    /// `info` is a non-null `fi_info` returned by `fi_getinfo`.
    unsafe fn of(info: *const sys::fi_info) -> Self {
        // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns.
        unsafe {
            Self {
                threading: (*(*info).domain_attr).threading,
                mr_mode: (*(*info).domain_attr).mr_mode,
                addr_format: (*info).addr_format,
            }
        }
    }
}

/// The provider's limits on what the configuration sizes, as the first entry of an `fi_info`
/// gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Limits {
    /// `rx_attr.size`: the receive queue's depth, and so the most receives posted at once.
    rx_size: usize,
    /// `ep_attr.max_msg_size`: the largest message.
    max_msg_size: usize,
}

impl Limits {
    /// What the first entry of `info` allows.
    ///
    /// # Safety
    /// `info` is a non-null `fi_info` returned by `fi_getinfo`.
    unsafe fn of(info: *const sys::fi_info) -> Self {
        // SAFETY: fi_getinfo fills every attribute pointer of each entry it returns.
        unsafe {
            Self {
                rx_size: (*(*info).rx_attr).size,
                max_msg_size: (*(*info).ep_attr).max_msg_size,
            }
        }
    }

    /// What of `configuration` does not fit these limits of `provider`, naming the value and the
    /// limit, if anything.
    fn misfit(&self, configuration: &Configuration, provider: &str) -> Option<String> {
        if configuration.receive_buffers > self.rx_size {
            return Some(format!(
                "receive_buffers is {}, and {provider} posts at most {} receives (rx_attr.size): \
                 lower Configuration::receive_buffers to {} or less",
                configuration.receive_buffers, self.rx_size, self.rx_size
            ));
        }
        if configuration.receive_size > self.max_msg_size {
            return Some(format!(
                "receive_size is {}, above the bound of {} that {provider} offers \
                 (ep_attr.max_msg_size): lower Configuration::receive_size to {} or less",
                configuration.receive_size, self.max_msg_size, self.max_msg_size
            ));
        }
        None
    }
}

/// Why the endpoint refuses `provider` with these demands, if it does: what it cannot honour
/// yet, rather than pretend to.
fn refusal(provider: Provider, demands: &Demands) -> Option<String> {
    let mut reasons = Vec::new();
    if sys::FI_THREAD_SAFE != demands.threading {
        reasons.push(format!(
            "its domain is threading model {} (FI_THREAD_DOMAIN is {}), not FI_THREAD_SAFE: that \
             leaves serialising every call on the domain to the application, and this endpoint is \
             Sync, many threads post on it at once, and its cache's writer thread calls \
             fi_av_insert and fi_av_remove meanwhile, with no domain lock",
            demands.threading,
            sys::FI_THREAD_DOMAIN
        ));
    }
    if 0 != demands.mr_mode & sys::FI_MR_LOCAL as i32 {
        reasons.push(
            "it requires FI_MR_LOCAL (every posted buffer registered, with its descriptor), and \
             this crate registers no memory yet: its receive buffers have no descriptors"
                .to_string(),
        );
    }
    if sys::FI_ADDR_STR == demands.addr_format {
        reasons.push(
            "its addresses are FI_ADDR_STR strings, of varying length, which fi_av_insert reads \
             up to their NUL byte: the cache checks every address against one fixed length, \
             which cannot keep that read inside the caller's buffer"
                .to_string(),
        );
    }
    (!reasons.is_empty()).then(|| format!("{provider} is refused: {}", reasons.join("; and ")))
}

/// Queue depths to ask `fi_getinfo` for (`tx_attr.size`, `rx_attr.size`); 0 takes the
/// provider's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueueSizes {
    tx: usize,
    rx: usize,
}

impl QueueSizes {
    /// What `configuration` asks for.
    fn of(configuration: &Configuration) -> Self {
        Self {
            tx: configuration.tx_size.unwrap_or(0),
            rx: configuration.rx_size.unwrap_or(0),
        }
    }
}

/// One of an endpoint's two queues whose depth the configuration may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Transmit,
    Receive,
}

impl Queue {
    /// The configuration's depth for this queue, if it asks for one.
    fn asked(self, configuration: &Configuration) -> Option<usize> {
        match self {
            Self::Transmit => configuration.tx_size,
            Self::Receive => configuration.rx_size,
        }
        .filter(|&size| size > 0)
    }

    /// Hints that ask `size` of this queue and the provider's default of the other.
    fn sizes(self, size: usize) -> QueueSizes {
        match self {
            Self::Transmit => QueueSizes { tx: size, rx: 0 },
            Self::Receive => QueueSizes { tx: 0, rx: size },
        }
    }

    /// The configuration field and the `fi_info` attribute.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::Transmit => ("tx_size", "tx_attr.size"),
            Self::Receive => ("rx_size", "rx_attr.size"),
        }
    }
}

/// When `fi_getinfo` offered nothing for the configuration's queue depths, whether a depth is
/// why, as an error naming the depth and the provider's bound: the largest depth its
/// `fi_getinfo` accepts, found by bisection (at most 64 calls, on this error path only).
///
/// The provider's bound is not in any `fi_info` it returns: without a size hint rxm reports its
/// default (2,048, or `FI_OFI_RXM_TX_SIZE`/`FI_OFI_RXM_RX_SIZE`), and accepts hints up to its
/// maximum (16,384 for transmits and 65,536 for receives in libfabric 1.17 and 2.6.0, `RXM_TX_SIZE`
/// and `RXM_RX_SIZE`), answering `-FI_ENODATA` past it rather than a shallower queue. `None`
/// when neither depth is why (the provider offers nothing here at all, or offers each depth
/// alone).
fn size_misfit(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
) -> Option<DmaError> {
    let offers = |sizes| {
        getinfo_sized(configuration, provider, node, sizes)
            .ok()
            .flatten()
            .is_some_and(|info| {
                // SAFETY: the list fi_getinfo returned, freed once, here; nothing else holds it.
                unsafe { sys::fi_freeinfo(info) };
                true
            })
    };
    for queue in [Queue::Transmit, Queue::Receive] {
        let Some(asked) = queue.asked(configuration) else {
            continue;
        };
        if offers(queue.sizes(asked)) {
            continue;
        }
        if !offers(queue.sizes(0)) {
            return None;
        }
        let (mut accepted, mut refused) = (0, asked);
        while refused - accepted > 1 {
            let middle = accepted + (refused - accepted) / 2;
            if offers(queue.sizes(middle)) {
                accepted = middle;
            } else {
                refused = middle;
            }
        }
        let (field, attribute) = queue.names();
        return Some(DmaError::InvalidArgument(format!(
            "{field} is {asked}, above the bound of {accepted} that {} offers (the deepest \
             {attribute} its fi_getinfo accepts): lower Configuration::{field} to {accepted} or \
             less, or None for the provider's default",
            provider.name()
        )));
    }
    None
}

/// `fi_getinfo` for a reliable-datagram, table-AV endpoint of `provider`, with the
/// [`Hints`] it asks for and queue depths `sizes`; `None` when it offers nothing
/// (`-FI_ENODATA`).
fn getinfo_sized(
    configuration: &Configuration,
    provider: Provider,
    node: Option<&CStr>,
    sizes: QueueSizes,
) -> Result<Option<*mut sys::fi_info>, DmaError> {
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
    let wanted = Hints::for_provider(provider);
    // SAFETY: `hints` is a fresh info whose attribute pointers fi_allocinfo filled in; the names
    // are copied onto the C heap by the shim (fi_freeinfo frees them); fi_getinfo writes one list
    // head into `info`; `hints` is freed once, after the call.
    let code = unsafe {
        (*hints).caps = u64::from(sys::FI_MSG);
        (*hints).mode = wanted.mode;
        (*(*hints).ep_attr).type_ = sys::FI_EP_RDM;
        (*(*hints).domain_attr).threading = wanted.threading;
        (*(*hints).domain_attr).av_type = sys::FI_AV_TABLE;
        (*(*hints).domain_attr).mr_mode = wanted.mr_mode;
        (*(*hints).tx_attr).size = sizes.tx;
        (*(*hints).rx_attr).size = sizes.rx;
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
            crate::configuration::note_libfabric_initialised();
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
    if code == -(sys::FI_ENODATA as i32) {
        return Ok(None);
    }
    check("fi_getinfo", code)?;
    if info.is_null() {
        return Err(DmaError::fabric("fi_getinfo", -(sys::FI_ENODATA as i64)));
    }
    Ok(Some(info))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests assert by panicking

    use std::sync::atomic::Ordering;
    use std::sync::mpsc;

    use super::*;

    /// A tcp endpoint on loopback with `receive_buffers` buffers of `receive_size` bytes.
    fn tcp(receive_buffers: usize, receive_size: usize) -> LibfabricEndpoint {
        let configuration = Configuration {
            receive_buffers,
            receive_size,
            ..Configuration::default()
        };
        LibfabricEndpoint::open(&configuration, Some("127.0.0.1")).expect("a tcp endpoint")
    }

    /// Run `body` while a fresh endpoint on its own thread sends `receiver` each message `body`
    /// hands it, driving its own progress in between (tcp progresses manually). The receiver
    /// accepts the connection while `body` polls it.
    fn sending_to<R>(
        receiver: &LibfabricEndpoint,
        body: impl FnOnce(&mpsc::Sender<Vec<u8>>) -> R,
    ) -> R {
        let sender = tcp(8, 4096);
        let address = receiver.local_address().expect("address");
        let (outbox, inbox) = mpsc::channel::<Vec<u8>>();
        std::thread::scope(|scope| {
            let sending = scope.spawn(move || {
                let pinned = sender.peers().pin();
                let peer = pinned.resolve(1, &address).expect("resolve");
                loop {
                    match inbox.try_recv() {
                        Ok(message) => sender
                            .send_within(peer, &message, Duration::from_secs(20))
                            .expect("send"),
                        Err(mpsc::TryRecvError::Empty) => {
                            sender.progress();
                            std::thread::yield_now();
                        }
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    }
                }
            });
            let result = body(&outbox);
            drop(outbox);
            sending.join().expect("the sending thread");
            result
        })
    }

    /// A re-post that fails after a message was copied out loses neither the message nor the
    /// buffer: the next `try_receive` posts it again. With one buffer, a lost one would leave the
    /// second message undeliverable. (The failure is injected: tcp does not refuse a re-post.)
    #[test]
    fn a_failed_re_post_returns_the_message_and_posts_the_buffer_later() {
        let receiver = tcp(1, 4096);
        sending_to(&receiver, |outbox| {
            outbox.send(b"one".to_vec()).expect("to the sender");
            receiver.failing_posts.store(1, Ordering::Relaxed);
            assert_eq!(
                Some(b"one".to_vec()),
                receiver
                    .receive(Duration::from_secs(20))
                    .expect("the message, not the error")
            );
            assert_eq!(1, receiver.unposted_receives(), "kept for a later re-post");
            outbox.send(b"two".to_vec()).expect("to the sender");
            assert_eq!(
                Some(b"two".to_vec()),
                receiver.receive(Duration::from_secs(20)).expect("receive")
            );
            assert_eq!(0, receiver.unposted_receives());
        });
    }

    /// An error completion's buffer is re-posted too, later if the first re-post fails. The
    /// error carries libfabric's text for the code and the provider's, read from a buffer of the
    /// call's own. (tcp;ofi_rxm 1.17 delivers nothing more on a connection after it truncated a
    /// message, so the re-post shows in the count of unposted buffers, not in later traffic.)
    #[test]
    fn an_error_completions_buffer_is_posted_again_even_if_the_first_re_post_fails() {
        let receiver = tcp(1, 8);
        sending_to(&receiver, |outbox| {
            outbox.send(vec![7; 64]).expect("to the sender");
            receiver.failing_posts.store(1, Ordering::Relaxed);
            let error = match receiver.receive(Duration::from_secs(20)) {
                Err(error) => error,
                Ok(other) => panic!("expected a truncation error, got {other:?}"),
            };
            let DmaError::Fabric { code, message, .. } = &error else {
                panic!("expected a fabric error, got {error}");
            };
            assert_eq!(-i64::from(sys::FI_ETRUNC), *code, "{error}");
            assert!(message.contains("Truncation"), "{error}");
            assert_eq!(1, receiver.unposted_receives(), "kept for a later re-post");
            receiver.progress();
            assert_eq!(0, receiver.unposted_receives(), "posted again");
        });
    }

    /// A provider that answers `-FI_EAGAIN` for ever costs `open` a bounded wait and a clear
    /// error, not a spin at 100% CPU. (Injected: tcp accepts every post up to `rx_attr.size`,
    /// which `open` checks first.)
    #[test]
    fn posting_gives_up_on_a_provider_that_always_asks_to_retry() {
        let endpoint = tcp(1, 64);
        endpoint.posts_ask_to_retry.store(true, Ordering::Relaxed);
        endpoint.failing_posts.store(usize::MAX, Ordering::Relaxed);
        match endpoint.post_patiently(0) {
            Err(DmaError::Fabric {
                call,
                code,
                message,
            }) => {
                assert_eq!("fi_recv", call);
                assert_eq!(-i64::from(sys::FI_EAGAIN), code);
                assert!(message.contains("still asked to retry"), "{message}");
            }
            other => panic!("expected a fabric error, got {other:?}"),
        }
        endpoint.failing_posts.store(0, Ordering::Relaxed);
    }

    /// A name longer than `src_addrlen` (shm's was, and `local_address` failed with -257) is
    /// read in full with the length `fi_getname` asked for; a provider that keeps asking for more
    /// is an error, not a loop.
    #[test]
    fn a_name_longer_than_the_first_guess_is_read_with_the_length_asked_for() {
        let name = b"fi_shm://4242_000000001\0";
        let mut calls = 0;
        let read = sized_name(15, |buffer, len| {
            calls += 1;
            if buffer.len() < name.len() {
                *len = name.len();
                return -(sys::FI_ETOOSMALL as i32);
            }
            buffer[..name.len()].copy_from_slice(name);
            *len = name.len();
            0
        });
        assert_eq!(Ok(name.to_vec()), read);
        assert_eq!(2, calls);

        let greedy = sized_name(16, |buffer, len| {
            *len = buffer.len() + 1;
            -(sys::FI_ETOOSMALL as i32)
        });
        assert!(
            matches!(
                greedy,
                Err(DmaError::Fabric {
                    call: "fi_getname",
                    code: -257,
                    ..
                })
            ),
            "{greedy:?}"
        );
    }

    /// What efa-direct demands (libfabric 2.6.0 `prov/efa/src/efa_prov_info.c`), which no device
    /// here can show: the hints ask for it, and `open` refuses it, naming it and why.
    #[test]
    fn efa_direct_is_asked_for_what_it_requires_and_refused_with_reasons() {
        let hints = Hints::for_provider(Provider::EfaDirect);
        assert_eq!(sys::FI_CONTEXT2, hints.mode & sys::FI_CONTEXT2);
        assert_eq!(
            sys::FI_MR_LOCAL as i32,
            hints.mr_mode & sys::FI_MR_LOCAL as i32
        );
        assert_eq!(sys::FI_THREAD_DOMAIN, hints.threading);

        let efa_direct = Demands {
            threading: sys::FI_THREAD_DOMAIN,
            mr_mode: (sys::FI_MR_LOCAL | sys::FI_MR_ALLOCATED) as i32,
            addr_format: sys::FI_ADDR_EFA,
        };
        let reason = refusal(Provider::EfaDirect, &efa_direct).expect("refused");
        for needle in ["efa-direct", "FI_MR_LOCAL", "FI_THREAD_SAFE", "Sync"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
    }

    /// A receive buffer larger than the provider's largest message (`ep_attr.max_msg_size`; tcp's
    /// is `SIZE_MAX`, so this is shown here rather than on tcp) is refused, naming both numbers,
    /// as are more buffers than its receive queue holds.
    #[test]
    fn sizes_past_the_providers_limits_are_refused_naming_them() {
        let limits = Limits {
            rx_size: 2048,
            max_msg_size: 8192,
        };
        let fits = Configuration {
            receive_size: 8192,
            receive_buffers: 2048,
            ..Configuration::default()
        };
        assert_eq!(None, limits.misfit(&fits, "efa"));
        let too_large = Configuration {
            receive_size: 8193,
            ..fits.clone()
        };
        let reason = limits.misfit(&too_large, "efa").expect("refused");
        for needle in ["8193", "8192", "max_msg_size", "efa"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
        let too_many = Configuration {
            receive_buffers: 2049,
            ..fits
        };
        let reason = limits.misfit(&too_many, "efa").expect("refused");
        for needle in ["2049", "2048", "rx_attr.size"] {
            assert!(reason.contains(needle), "{needle} in {reason}");
        }
    }

    #[test]
    fn tcp_is_asked_for_thread_safety_and_not_refused() {
        let hints = Hints::for_provider(Provider::Tcp);
        assert_eq!(sys::FI_THREAD_SAFE, hints.threading);
        assert_eq!(0, hints.mr_mode & sys::FI_MR_LOCAL as i32);
        let tcp = Demands {
            threading: sys::FI_THREAD_SAFE,
            mr_mode: 0,
            addr_format: sys::FI_SOCKADDR_IN,
        };
        assert_eq!(None, refusal(Provider::Tcp, &tcp));
    }
}
