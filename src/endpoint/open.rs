//! Opening an endpoint, in named steps: ask `fi_getinfo` (with the hints of `getinfo`) and check
//! what the provider it chose demands and allows ([`choose`], in `choosing`: the refusals and
//! size checks made before any libfabric object opens); open the fabric, domain and address
//! vector, the completion queues, and the endpoint, bound and enabled (`objects`); put the
//! endpoint together; post its receives. Beside `open`, what an open endpoint tells about itself
//! (its cache, its description, its own address, what its AV holds at an index: the helpers in
//! `lookup`) and its credit protocol's counts.
//!
//! Every check here runs before the first object opens, and a failure part-way through the
//! opening closes what was opened (the [`Handles`] own it) and names the call that failed.

mod choosing;
mod getinfo;
mod objects;

use super::credits::flow;
use super::receiving;
use std::ffi::{CStr, CString};
use std::mem::ManuallyDrop;
use std::sync::Arc;

use self::choosing::{choose, control_receives};
use self::objects::{
    CompletionQueues, open_completion_queues, open_endpoint, open_fabric_domain_and_av, wait_source,
};
#[cfg(doc)] // for the docs' links
use super::RECEIVE_POST_PATIENCE;
use super::credits::wire::CONTROL_SIZE;
use super::handles::Handles;
use super::lookup::sized_name;
use super::receive::ReceiveSlots;
use super::sends::Sends;
use super::{Description, LibfabricEndpoint, check, credits};
use crate::av::FabricAv;
use crate::av::fabric as av;
use crate::cache::AddressCache;
use crate::configuration::{Configuration, PeerProtocol, Provider};
use crate::error::DmaError;
use dma_libfabric_sys as sys;

impl LibfabricEndpoint {
    /// Open an endpoint with the first of `configuration.providers` that gives a
    /// reliable-datagram endpoint, on `node` (or `configuration.bind` when `node` is `None`).
    ///
    /// # Errors
    /// [`DmaError::NoProvider`], naming each provider tried and why it was turned down, when none
    /// works: no such provider here, or one that asks for what the endpoint cannot honour yet
    /// (efa-direct and shm are refused: see [`LibfabricEndpoint`]); [`DmaError::Fabric`] when a later
    /// libfabric call fails, or a receive buffer still cannot be posted after
    /// [`RECEIVE_POST_PATIENCE`]; [`DmaError::InvalidArgument`] for a configuration
    /// [`Configuration::validate`] refuses (an empty provider list, a size out of its bounds, a
    /// `cq_size` or `rx_size` below `receive_buffers`), a node with a NUL byte, a `tx_size` or
    /// `rx_size` deeper than the provider accepts (16,384 and 65,536 on tcp;ofi_rxm), more
    /// `receive_buffers` than the provider's receive queue holds (`rx_attr.size`; 2048 on
    /// tcp;ofi_rxm by default), a `receive_size` above its `ep_attr.max_msg_size`, or receive
    /// buffers that cannot be allocated; each names the value and the bound, and each is found
    /// before any libfabric object opens.
    ///
    /// Memory: the configuration's rxm buffer sizes cost an endpoint a fraction of what rxm's own
    /// do (`docs/providers.md`, "Endpoint sizing"); a process's first open applies them only if
    /// it has one thread, and warns otherwise (see
    /// [`apply_rxm_environment`](Configuration::apply_rxm_environment)).
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

    /// Open an endpoint with `provider` alone, step by step: ask `fi_getinfo` and check what it
    /// offers ([`choose`]), open the fabric, domain and address vector, the completion queues and
    /// the endpoint, put the endpoint together ([`Self::assemble`]), and post its receives.
    ///
    /// Every check runs before the first object opens; `handles` owns each object as it opens,
    /// so an error part-way closes exactly what was opened.
    fn open_with(
        configuration: &Configuration,
        provider: Provider,
        node: Option<&CStr>,
    ) -> Result<Self, DmaError> {
        let mut handles = Handles::new();
        let description = choose(&mut handles, configuration, provider, node)?;
        // Before any libfabric object opens: memory that cannot be had is an error, not an abort.
        let receives =
            ReceiveSlots::new(configuration.receive_buffers, configuration.receive_size)?;
        let controls = ReceiveSlots::new(control_receives(configuration), CONTROL_SIZE)?;
        // SAFETY: `choose` left in `handles.info` the non-null list fi_getinfo returned, and
        // nothing is open yet; each step opens, into `handles`, what the next one needs.
        let queues = unsafe {
            open_fabric_domain_and_av(&mut handles, configuration)?;
            let queues =
                open_completion_queues(&mut handles, configuration, &description.provider)?;
            open_endpoint(&mut handles)?;
            queues
        };
        // SAFETY: the three steps above opened every object in `handles`.
        let mut endpoint =
            unsafe { Self::assemble(configuration, handles, description, receives, queues) }?;
        endpoint.controls = controls;
        // rxm refuses connections between processes of other eager limits: the seal says this
        // one's, and the AV refuses a sealed address of another (`av::fabric`).
        let eager_limit = if endpoint.description.provider.ends_with("ofi_rxm") {
            crate::configuration::rxm_eager_limit()
        } else {
            0
        };
        endpoint.handed_out.expect_eager_limit(eager_limit);
        endpoint.credits = endpoint.open_credits(configuration, eager_limit)?;
        endpoint.post_receives()?;
        tracing::debug!(provider = %endpoint.description.provider, fabric = %endpoint.description.fabric, "endpoint open");
        Ok(endpoint)
    }

    /// Put the endpoint together around its open objects: the completion queues' wait source,
    /// the send slots (as many as the transmit queue and its completion queue hold), the RMA
    /// operations, and the address cache over the address vector.
    ///
    /// # Safety
    /// `handles` holds the list `fi_getinfo` returned and every object open, as
    /// [`open_fabric_domain_and_av`], [`open_completion_queues`] (which returned `queues`) and
    /// [`open_endpoint`] leave them.
    unsafe fn assemble(
        configuration: &Configuration,
        handles: Handles,
        mut description: Description,
        receives: ReceiveSlots,
        queues: CompletionQueues,
    ) -> Result<Self, DmaError> {
        let info = handles.info;
        // SAFETY: the fabric and both queues are open, with the wait object asked, and stay
        // open for as long as the slab that keeps the source (the slab is dropped after the
        // handles close, and used only while the endpoint lives).
        let source = unsafe { wait_source(&handles, queues.wait_obj) };
        // Unregistered in `Drop`, before `handles` closes the AV.
        let handed_out = av::register(handles.av, configuration.av_capacity);
        // As many sends in flight as the transmit queue and its completion queue hold.
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let tx_size = unsafe { (*(*info).tx_attr).size };
        let sends = Sends::new(
            tx_size.min(queues.size),
            configuration.receive_size,
            configuration.av_capacity,
            configuration.max_operations_per_peer,
            Arc::clone(&handed_out),
        )?;
        description.max_send_size = sends.size();
        description.max_sends_in_flight = sends.capacity();
        description.max_sends_in_flight_per_peer = sends.peer_limit();
        description.max_operations_per_peer = sends.budget.limit();
        // SAFETY: `info` is the list head fi_getinfo returned, alive as long as `handles`.
        let mut operations = Box::new(unsafe {
            super::engine::Operations::new(
                info,
                configuration.rma,
                queues.size,
                source,
                sends,
                Arc::clone(&handed_out),
            )
        });
        operations.write_flags = configuration.write_completion.flags();
        operations.spin_before_sleep = configuration.spin_before_sleep;
        let backend = FabricAv::new(
            handles.av,
            description.addr_format,
            description.address_len,
            configuration.av_capacity,
            Arc::clone(&handed_out),
        );
        Ok(Self {
            peers: ManuallyDrop::new(
                AddressCache::with_backend(backend).with_patience(configuration.cache_patience),
            ),
            handles,
            receives,
            controls: ReceiveSlots::new(0, 0)?,
            credits: None,
            description: Box::new(description),
            handed_out,
            #[cfg(test)]
            failing_posts: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            posts_ask_to_retry: std::sync::atomic::AtomicBool::new(false),
            operations,
        })
    }

    /// Post every receive slot, each retried with progress for at most [`POST_PATIENCE`].
    fn post_receives(&self) -> Result<(), DmaError> {
        for index in 0..self.receives.len() {
            receiving::post_patiently(self, index)?;
        }
        for index in 0..self.controls.len() {
            flow::post_control(self, index)?;
        }
        Ok(())
    }

    /// The credit protocol's state for a credited endpoint (a fresh secret, the endpoint's own
    /// address for its introductions, sealed with the secret and `eager_limit`, the process's
    /// rxm eager limit or 0), `None` for a plain one.
    ///
    /// # Errors
    /// [`DmaError::InvalidArgument`] for an address longer than an introduction carries;
    /// what [`local_address`](Self::local_address) answers.
    fn open_credits(
        &self,
        configuration: &Configuration,
        eager_limit: u32,
    ) -> Result<Option<Box<credits::Credits>>, DmaError> {
        if PeerProtocol::Plain == configuration.peer_protocol {
            return Ok(None);
        }
        let secret = fresh_secret();
        let seal = crate::address::Seal {
            secret,
            eager_limit,
        };
        let address = crate::address::seal(&self.provider_name()?, seal);
        if address.len() > credits::wire::MAX_ADDRESS {
            return Err(DmaError::InvalidArgument(format!(
                "the provider's addresses are {} bytes, longer than the {} an introduction of \
                 the credit protocol carries: open with PeerProtocol::Plain",
                address.len(),
                credits::wire::MAX_ADDRESS
            )));
        }
        Ok(Some(Box::new(credits::Credits::new(
            secret & crate::address::SEALED_SECRET_MASK,
            address,
            configuration.receive_window,
            configuration.receive_memory_limit,
            configuration.cq_size,
        ))))
    }

    /// The cache of address-vector entries that posting threads resolve peers through.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// assert_eq!(0, endpoint.cache().stats().entries);
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    pub fn cache(&self) -> &AddressCache {
        &self.peers
    }

    /// The endpoint's [`cache`](Self::cache), under its old name: it returns an
    /// [`AddressCache`], not a list of peers.
    #[deprecated(since = "0.2.0", note = "renamed to `cache()`")]
    pub fn peers(&self) -> &AddressCache {
        self.cache()
    }

    /// What the provider chose.
    pub fn describe(&self) -> &Description {
        &self.description
    }

    /// This endpoint's own address, to advertise to peers, which resolve it through their
    /// caches.
    ///
    /// On a credited endpoint (the default,
    /// [`PeerProtocol::Credited`](crate::configuration::PeerProtocol::Credited)) the address is
    /// *sealed*: the provider's name followed by [`SEAL_LEN`](crate::address::SEAL_LEN) bytes
    /// carrying the secret this endpoint drew at `open`. A peer that resolves it takes nothing
    /// from whoever answers at the provider's address until that one proves the secret (see
    /// `docs/guarantees.md`: a peer is who its address says). On a plain endpoint it is the provider's name, as
    /// `fi_getname` gives it.
    ///
    /// ```
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, PeerProtocol, SEAL_LEN};
    ///
    /// let credited = LibfabricEndpoint::open(&Configuration::default(), Some("127.0.0.1"))?;
    /// let plain = LibfabricEndpoint::open(
    ///     &Configuration { peer_protocol: PeerProtocol::Plain, ..Configuration::default() },
    ///     Some("127.0.0.1"),
    /// )?;
    /// let sealed = credited.local_address()?;
    /// assert_eq!(plain.local_address()?.len() + SEAL_LEN, sealed.len());
    /// assert_eq!(sealed, credited.local_address()?, "drawn once, at open");
    /// # Ok::<(), dma_libfabric::DmaError>(())
    /// ```
    ///
    /// # Errors
    /// [`DmaError::Fabric`] if `fi_getname` fails, or still finds its buffer too small the second
    /// time.
    pub fn local_address(&self) -> Result<Vec<u8>, DmaError> {
        match self.credits.as_deref() {
            Some(credits) => Ok(credits.address().to_vec()),
            None => self.provider_name(),
        }
    }

    /// The provider's name for this endpoint (`fi_getname`).
    ///
    /// The buffer is sized from what `fi_getname` reports: a provider whose name is longer than
    /// `fi_info.src_addrlen` answers `-FI_ETOOSMALL` with the length it needs, and the call is
    /// made once more with that much room.
    pub(super) fn provider_name(&self) -> Result<Vec<u8>, DmaError> {
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
    /// use dma_libfabric::{Configuration, LibfabricEndpoint, SEAL_LEN};
    ///
    /// let endpoint = LibfabricEndpoint::open(&Configuration::default(), None)?;
    /// assert_eq!(None, endpoint.lookup(5)?, "nothing handed out yet");
    /// assert_eq!(None, endpoint.lookup(1 << 40)?, "far outside the table");
    /// let address = endpoint.local_address()?;
    /// let pinned = endpoint.cache().pin();
    /// let peer = pinned.resolve(1, &address)?;
    /// // The AV holds the provider's name; the seal after it stays with the cache.
    /// let provider_part = &address[..address.len() - SEAL_LEN];
    /// assert_eq!(Some(provider_part), endpoint.lookup(peer.fi_addr())?.as_deref());
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

    /// What this endpoint's receiving side holds of the credit protocol: the senders introduced
    /// to it, what its pool has granted and not been paid back, the notifications granted and
    /// not polled. All zero for a plain endpoint
    /// ([`PeerProtocol::Plain`](crate::configuration::PeerProtocol::Plain)).
    pub fn credit_stats(&self) -> super::CreditStats {
        self.credits
            .as_deref()
            .map(super::credits::Credits::stats)
            .unwrap_or_default()
    }
}

/// A secret for a new endpoint: `std`'s `RandomState` (keys drawn from the operating system's
/// random source) hashing the time and the process, so two endpoints, in one process or two,
/// draw different ones.
fn fresh_secret() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now().hash(&mut hasher);
    std::process::id().hash(&mut hasher);
    hasher.finish()
}
